"""Bad input, every command: one line on stderr naming the problem, exit code 2, no traceback.

One table (`CASES`) so that a new command or option inherits the check: add a row. A row is
(id, argv, the text the error must contain, files to write first). `{tmp}` in argv and files is
the test's temporary folder, `{model}` the stories260K model folder.
"""

from __future__ import annotations

import argparse
import errno
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import STORIES, one_line_error

from sodaray.cli import build_parser, main

pytestmark = pytest.mark.skipif(not STORIES.is_dir(), reason="stories260K not present")

INV = ["invert", "--model", "{model}", "--tokens", "172", "--max-steps", "5"]

SWEEP = """name: bad
models: [{{id: "{model}", num_cpus: 1{resources}}}]
datasets: [{{name: random, build: {{dataset: random, lengths: "1", per_length: 2}}}}]
algorithms: [{{name: soda, params: {params}}}]
objectives: [{objective}]
max_steps: 5
"""

TUNE = """name: badtune
model: {{id: "{model}"}}
data: {{build: {{dataset: random, lengths: "1", per_length: 2, seed: 0}}}}
space: {space}
max_steps: 5
trials: 1
"""


def sweep(
    params: str = "{}", objective: str = "{kind: logits}", resources: str = ""
) -> dict[str, str]:
    text = SWEEP.format(model="{model}", params=params, objective=objective, resources=resources)
    return {"s.yaml": text}


def tuning(space: str = "{learning_rate: {low: 0.01, high: 0.1}}") -> dict[str, str]:
    return {"t.yaml": TUNE.format(model="{model}", space=space)}


FLOAT32 = "{pass_seconds: 0.003, layer_seconds: 0.003, flops_per_second: 2.0e+13}"


def costs(top: str = "device: d\nkind: gpu\n", float32: str = FLOAT32, more: str = "") -> dict:
    """A sweep and a costs file (`--costs {tmp}/c.yaml`), its pieces as given."""
    return {**sweep(), "c.yaml": f"{top}precisions:\n  float32: {float32}\n{more}"}


PLAN_COSTS = ["sweep", "plan", "{tmp}/s.yaml", "--no-calibrate", "--costs", "{tmp}/c.yaml"]


CASES: list[tuple[str, list[str], str, dict[str, str]]] = [
    # ---- invert: values that used to pass or escape as tracebacks
    (
        "param-not-a-number",
        [*INV, "--param", "temperature=abc"],
        "temperature must be a number",
        {},
    ),
    ("param-nan", [*INV, "--param", "learning_rate=.nan"], "learning_rate must be a finite", {}),
    ("param-inf", [*INV, "--param", "decay=.inf"], "decay must be a finite", {}),
    ("param-yaml-tag", [*INV, "--param", "eps=!!python/name:os.system"], "--param eps", {}),
    ("param-int-field-float", [*INV, "--param", "reset_period=2.5"], "must be an integer", {}),
    ("param-bool-field", [*INV, "--param", "use_decay=maybe"], "true or false", {}),
    ("atol-negative", [*INV, "--atol", "-1"], "atol must be non-negative", {}),
    ("rtol-nan", [*INV, "--rtol", "nan"], "rtol must be a finite", {}),
    ("fluency-inf", [*INV, "--fluency-weight", "inf"], "fluency_weight must be a finite", {}),
    ("max-steps-overflow", [*INV[:-2], "--max-steps", "9" * 23], "max_steps must be at most", {}),
    ("seed-negative", [*INV, "--seed", "-1"], "seed must be in", {}),
    ("seed-overflow", [*INV, "--seed", "9" * 23], "seed must be in", {}),
    (
        "preset-objective-not-a-setting",
        [*INV, "--preset-file", "{tmp}/p.yaml"],
        "objective.top_k is not a preset setting",
        {"p.yaml": "soda: {learning_rate: 0.03}\nobjective: {top_k: 5}\n"},
    ),
    (
        "preset-objective-clashes-with-flag",
        [*INV, "--preset-file", "{tmp}/p.yaml", "--top-k", "1"],
        "centred top-1 logits are always 0",
        {"p.yaml": "soda: {learning_rate: 0.03}\nobjective: {space: centred}\n"},
    ),
    ("device-tpu", [*INV, "--device", "tpu"], "--device tpu", {}),
    ("device-nonsense", [*INV, "--device", "gpu0"], "--device gpu0", {}),
    # ---- invert: sizes the model or the machine cannot take
    ("length-over-context", [*INV, "--length", "1000"], "exceed the model's context of 512", {}),
    ("length-huge", [*INV, "--length", "100000"], "exceed the model's context", {}),
    ("output-tokens-huge", [*INV, "--output-tokens", "100000"], "exceed the model's context", {}),
    (
        "auto-length-over-context",
        [*INV[:3], "--logits-file", "{tmp}/ok.npy", "--max-length", "600"],
        "exceed the model's context",
        {"ok.npy": "logits"},
    ),
    (
        "auto-max-length-huge",
        [*INV[:3], "--logits-file", "{tmp}/ok.npy", "--max-length", "1000000000"],
        "exceed the model's context",
        {"ok.npy": "logits"},
    ),
    # ---- invert: output paths
    ("out-is-directory", [*INV, "--out", "{tmp}"], "is a directory", {}),
    (
        "out-parent-is-file",
        [*INV, "--out", "{tmp}/f.txt/rows.parquet"],
        "is a file",
        {"f.txt": "x"},
    ),
    # ---- invert: observed logits files
    ("logits-complex", [*INV[:3], "--logits-file", "{tmp}/c.npy"], "complex", {"c.npy": "complex"}),
    (
        "logits-float-indices",
        [*INV[:3], "--logits-file", "{tmp}/f.safetensors"],
        "integers",
        {"f.safetensors": "float-indices"},
    ),
    (
        "logits-duplicate-indices",
        [*INV[:3], "--logits-file", "{tmp}/d.safetensors"],
        "repeat",
        {"d.safetensors": "duplicate-indices"},
    ),
    ("logits-empty", [*INV[:3], "--logits-file", "{tmp}/e.npy"], "empty", {"e.npy": "empty"}),
    # ---- a corrupt or truncated model
    (
        "model-truncated-weights",
        ["invert", "--model", "{tmp}/m", "--tokens", "1"],
        "cannot load model",
        {"m": "truncated-model"},
    ),
    (
        "model-empty-weights",
        ["invert", "--model", "{tmp}/m", "--tokens", "1"],
        "cannot load model",
        {"m": "empty-model"},
    ),
    # ---- report
    ("report-format-comma", ["report", "{tmp}/r.parquet", "--format", ","], "names no format", {}),
    (
        "report-extrapolate-zero",
        ["report", "{tmp}/r.parquet", "--extrapolate", "0"],
        "--extrapolate takes a number of steps",
        {},
    ),
    ("report-format-unknown", ["report", "{tmp}", "--format", "pdf"], "pdf", {}),
    (
        "report-out-is-file",
        ["report", "{tmp}", "--out", "{tmp}/f.txt"],
        "not a folder",
        {"f.txt": "x"},
    ),
    # ---- data build
    (
        "data-per-length-huge",
        [
            "data",
            "build",
            "--model",
            "{model}",
            "--dataset",
            "random",
            "--per-length",
            "1000000000",
            "--out",
            "{tmp}/d.parquet",
        ],
        "needs about",
        {},
    ),
    (
        "data-out-is-directory",
        [
            "data",
            "build",
            "--model",
            "{model}",
            "--dataset",
            "random",
            "--out",
            "{tmp}/dir.parquet",
        ],
        "is a directory",
        {"dir.parquet/x": "x"},
    ),
    (
        "data-out-parent-is-file",
        [
            "data",
            "build",
            "--model",
            "{model}",
            "--dataset",
            "random",
            "--out",
            "{tmp}/f.txt/d.parquet",
        ],
        "is a file",
        {"f.txt": "x"},
    ),
    # ---- sweep files and sweep run
    (
        "sweep-nan",
        ["sweep", "run", "{tmp}/s.yaml", "--out", "{tmp}/o"],
        "finite",
        sweep(params="{learning_rate: .nan}"),
    ),
    (
        "sweep-string-number",
        ["sweep", "run", "{tmp}/s.yaml", "--out", "{tmp}/o"],
        "temperature must be a number",
        sweep(params="{temperature: fast}"),
    ),
    (
        "sweep-objective-atol",
        ["sweep", "run", "{tmp}/s.yaml", "--out", "{tmp}/o"],
        "atol must be non-negative",
        sweep(objective="{kind: logits, atol: -1}"),
    ),
    (
        "sweep-objective-nan",
        ["sweep", "run", "{tmp}/s.yaml", "--out", "{tmp}/o"],
        "fluency_weight must be a finite",
        sweep(objective="{kind: logits, fluency_weight: .nan}"),
    ),
    (
        "sweep-objective-confirm-unknown",
        ["sweep", "run", "{tmp}/s.yaml", "--out", "{tmp}/o"],
        "confirm must be one of space, both, not '../raw'",
        sweep(objective="{kind: logits, space: centred, confirm: ../raw}"),
    ),
    (
        "sweep-objective-confirm-not-a-string",
        ["sweep", "run", "{tmp}/s.yaml", "--out", "{tmp}/o"],
        "confirm",
        sweep(objective="{kind: logits, space: centred, confirm: [both]}"),
    ),
    (
        "sweep-scan-positions-not-a-bool",
        ["sweep", "run", "{tmp}/s.yaml", "--out", "{tmp}/o"],
        "true or false",
        sweep(params="{scan_positions: maybe}"),
    ),
    (
        "sweep-yaml-tag",
        ["sweep", "run", "{tmp}/s.yaml", "--out", "{tmp}/o"],
        "not valid YAML",
        {"s.yaml": "name: !!python/name:os.system x\n"},
    ),
    (
        "sweep-out-is-file",
        ["sweep", "run", "{tmp}/s.yaml", "--out", "{tmp}/f.txt"],
        "not a folder",
        {**sweep(), "f.txt": "x"},
    ),
    (
        "data-lengths-huge",
        [
            "data",
            "build",
            "--model",
            "{model}",
            "--dataset",
            "random",
            "--lengths",
            "1-99999999999",
            "--out",
            "{tmp}/d.parquet",
        ],
        "at most 1048576 tokens",
        {},
    ),
    (
        "sweep-address-refused",
        ["sweep", "run", "{tmp}/s.yaml", "--out", "{tmp}/o", "--address", "127.0.0.1:1"],
        "cannot reach a Ray cluster",
        sweep(),
    ),
    (
        "sweep-address-ray-client-refused",
        ["sweep", "run", "{tmp}/s.yaml", "--out", "{tmp}/o", "--address", "ray://127.0.0.1:1"],
        "cannot reach a Ray cluster",
        sweep(),
    ),
    (
        "sweep-wait-for-nodes-negative",
        ["sweep", "run", "{tmp}/s.yaml", "--out", "{tmp}/o", "--wait-for-nodes", "-1"],
        "--wait-for-nodes must be a number of seconds",
        sweep(),
    ),
    (
        "tune-wait-for-nodes-nan",
        ["tune", "{tmp}/t.yaml", "--out", "{tmp}/o", "--wait-for-nodes", "nan"],
        "--wait-for-nodes must be a number of seconds",
        tuning(),
    ),
    (
        "tune-address-bad-scheme",
        ["tune", "{tmp}/t.yaml", "--out", "{tmp}/o", "--address", "http://127.0.0.1:1"],
        "use auto, HOST:PORT or ray://HOST:PORT",
        tuning(),
    ),
    (
        "sweep-num-gpus-nan",
        ["sweep", "run", "{tmp}/s.yaml", "--out", "{tmp}/o"],
        "models[0].num_gpus: must be a finite number",
        sweep(resources=", num_gpus: .nan"),
    ),
    (
        "tune-trials-fraction",
        ["tune", "{tmp}/t.yaml", "--out", "{tmp}/o"],
        "trials: must be an integer, not 2.5",
        {"t.yaml": tuning()["t.yaml"].replace("trials: 1", "trials: 2.5")},
    ),
    (
        "sweep-gpus-this-machine-lacks",
        ["sweep", "run", "{tmp}/s.yaml", "--out", "{tmp}/o"],
        "GPU per replica but the machine has",
        sweep(resources=", num_gpus: 64"),
    ),
    ("sweep-status-missing", ["sweep", "status", "{tmp}/nothing"], "no such results folder", {}),
    # ---- tuning files and tune
    (
        "tune-nan-low",
        ["tune", "{tmp}/t.yaml", "--out", "{tmp}/o"],
        "space.learning_rate.low: must be a finite number",
        tuning("{learning_rate: {low: .nan, high: 0.1}}"),
    ),
    (
        "tune-inf-high",
        ["tune", "{tmp}/t.yaml", "--out", "{tmp}/o"],
        "finite",
        tuning("{learning_rate: {low: 0.01, high: .inf}}"),
    ),
    (
        "tune-out-is-file",
        ["tune", "{tmp}/t.yaml", "--out", "{tmp}/f.txt"],
        "not a folder",
        {**tuning(), "f.txt": "x"},
    ),
    (
        "tune-storage-unknown-scheme",
        ["tune", "{tmp}/t.yaml", "--out", "{tmp}/o", "--storage", "foo://bar"],
        "storage foo://bar: Can't load plugin",
        tuning(),
    ),
    (
        "tune-mlflow-experiment-a-path",
        ["tune", "{tmp}/t.yaml", "--out", "{tmp}/o", "--mlflow", "sqlite:///{tmp}/m.db"]
        + ["--mlflow-experiment", "../elsewhere"],
        "--mlflow-experiment must be a plain name",
        tuning(),
    ),
    (
        "sweep-mlflow-experiment-empty",
        ["sweep", "run", "{tmp}/s.yaml", "--out", "{tmp}/o", "--mlflow", "sqlite:///{tmp}/m.db"]
        + ["--mlflow-experiment", ""],
        "--mlflow-experiment: empty value",
        sweep(),
    ),
    # ---- sweep plan, train-inverter
    ("plan-missing-file", ["sweep", "plan", "{tmp}/none.yaml"], "no such sweep file", {}),
    (  # issue 38: no preset, so the family's defaults, which need the model's config
        "plan-family-config-unreadable",
        ["sweep", "plan", "{tmp}/s.yaml", "--no-calibrate"],
        "models/m/config.json: not valid JSON",
        {
            "models/m": "bad-config-model",
            "s.yaml": SWEEP.replace('"{model}"', "models/m").format(
                params="{}", objective="{kind: logits}", resources=""
            ),
        },
    ),
    (
        "tune-family-config-too-large",
        ["tune", "{tmp}/t.yaml", "--dry-run"],
        "bytes is not a model's config file (at most 4,194,304)",
        {
            "models/m": "huge-config-model",
            "t.yaml": tuning()["t.yaml"].replace('"{model}"', "models/m"),
        },
    ),
    (  # issue 39: the error names the rule for relative paths and where it looked
        "plan-relative-model-missing",
        ["sweep", "plan", "{tmp}/sub/s.yaml", "--no-calibrate"],
        "(looked for ",
        {
            "sub/s.yaml": SWEEP.replace('"{model}"', "../models/none").format(
                params="{}", objective="{kind: logits}", resources=""
            )
        },
    ),
    (
        "plan-build-source-not-a-file-name",
        ["sweep", "plan", "{tmp}/s.yaml", "--no-calibrate"],
        "build.source: a file, hf or synthetic, not 5",
        {"s.yaml": sweep()["s.yaml"].replace("dataset: random,", "dataset: nl-id, source: 5,")},
    ),
    (
        "tune-start-from-missing-file",
        ["tune", "{tmp}/t.yaml", "--dry-run"],
        "start_from: no such preset: presets/none.yaml (looked for ",
        {"t.yaml": tuning()["t.yaml"] + "start_from: presets/none.yaml\n"},
    ),
    (
        "tune-dry-run-negative-rate",
        ["tune", "{tmp}/t.yaml", "--dry-run", "--rate", "-1"],
        "--rate must be a positive finite number",
        tuning(),
    ),
    (
        "plan-negative-rate",
        ["sweep", "plan", "{tmp}/s.yaml", "--rate", "-5"],
        "--rate must be a positive finite number",
        sweep(),
    ),
    (
        "plan-costs-missing",
        ["sweep", "plan", "{tmp}/s.yaml", "--costs", "{tmp}/none.yaml"],
        "no such costs file, nor built-in costs (built in: h100, h200)",
        sweep(),
    ),
    (
        "run-costs-missing",
        ["sweep", "run", "{tmp}/s.yaml", "--out", "{tmp}/o", "--costs", "a100"],
        "--costs a100: no such costs file",
        sweep(),
    ),
    (
        "tune-dry-run-costs-missing",
        ["tune", "{tmp}/t.yaml", "--dry-run", "--costs", "a100"],
        "--costs a100: no such costs file",
        tuning(),
    ),
    (
        "tune-dry-run-costs-kind",
        ["tune", "{tmp}/t.yaml", "--dry-run", "--costs", "{tmp}/c.yaml"],
        "kind must be one of gpu, cpu",
        {**tuning(), "c.yaml": f"device: d\nkind: tpu\nprecisions:\n  float32: {FLOAT32}\n"},
    ),
    ("plan-costs-a-list", PLAN_COSTS, "a costs file is a mapping", {**sweep(), "c.yaml": "[1]"}),
    (
        "plan-costs-kind",
        PLAN_COSTS,
        "kind must be one of gpu, cpu",
        costs("device: d\nkind: tpu\n"),
    ),
    ("plan-costs-unknown-key", PLAN_COSTS, "unknown key 'peak'", costs(more="peak: 1\n")),
    ("plan-costs-no-device", PLAN_COSTS, "device must be a name", costs("kind: gpu\n")),
    (
        "plan-costs-no-float32",
        PLAN_COSTS,
        "with float32 among them",
        {**sweep(), "c.yaml": f"device: d\nkind: gpu\nprecisions: {{bfloat16: {FLOAT32}}}\n"},
    ),
    (
        "plan-costs-unknown-precision",
        PLAN_COSTS,
        "precision 'fp8' is not one of",
        costs(more=f"  fp8: {FLOAT32}\n"),
    ),
    (
        "plan-costs-negative-floor",
        PLAN_COSTS,
        "pass_seconds must be a finite number >= 0",
        costs(float32=FLOAT32.replace("0.003,", "-1,", 1)),
    ),
    (
        "plan-costs-nan-floor",
        PLAN_COSTS,
        "layer_seconds must be a finite number",
        costs(float32=FLOAT32.replace("layer_seconds: 0.003", "layer_seconds: .nan")),
    ),
    (
        "plan-costs-rate-a-string",
        PLAN_COSTS,
        "flops_per_second must be a finite number",
        costs(float32=FLOAT32.replace("2.0e+13", '"fast"')),
    ),
    (
        "plan-costs-zero-rate",
        PLAN_COSTS,
        "flops_per_second must be at least 1000",
        costs(float32=FLOAT32.replace("2.0e+13", "0")),
    ),
    (
        "plan-costs-missing-constant",
        PLAN_COSTS,
        "must give exactly pass_seconds, layer_seconds, flops_per_second",
        costs(float32="{pass_seconds: 0.003, flops_per_second: 2.0e+13}"),
    ),
    (
        "plan-costs-floor-of-a-day",
        PLAN_COSTS,
        "a pass's floor above an hour",
        costs(float32=FLOAT32.replace("0.003,", "86400,", 1)),
    ),
    (
        "plan-costs-startup-huge",
        PLAN_COSTS,
        "startup_seconds must be a number of seconds",
        costs(more="startup_seconds: 1.0e+400\n"),
    ),
    (
        "plan-costs-startup-a-string",
        PLAN_COSTS,
        "startup_seconds must be a number of seconds",
        costs(more="startup_seconds: ../35\n"),
    ),
    (
        "train-inverter-missing-model",
        ["train-inverter", "--model", "{tmp}/none", "--out", "{tmp}/inv"],
        "no such model folder or file",
        {},
    ),
    (
        "train-inverter-negative-epochs",
        ["train-inverter", "--model", "{model}", "--out", "{tmp}/inv", "--epochs", "-1"],
        "epochs must be at least 1",
        {},
    ),
]


def _materialise(tmp: Path, files: dict[str, str]) -> None:
    for name, content in files.items():
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if content == "logits":
            np.save(path, np.zeros((1, 512), dtype=np.float32))
        elif content == "complex":
            np.save(path, np.zeros((1, 512), dtype=np.complex64) + 1j)
        elif content == "empty":
            np.save(path, np.zeros((0,), dtype=np.float32))
        elif content in ("float-indices", "duplicate-indices"):
            from safetensors.numpy import save_file

            indices = np.array([[3, 3, 5]]) if content == "duplicate-indices" else np.ones((1, 3))
            values = np.array([[3.0, 2.0, 1.0]], dtype=np.float32)
            save_file({"values": values, "indices": indices}, str(path))
        elif content in ("bad-config-model", "huge-config-model"):
            shutil.copytree(STORIES, path)
            config = "{not json" if content == "bad-config-model" else " " * (5 << 20) + "{}"
            (path / "config.json").write_text(config)
        elif content in ("truncated-model", "empty-model"):
            shutil.copytree(STORIES, path)
            weights = (STORIES / "model.safetensors").read_bytes()
            (path / "model.safetensors").write_bytes(
                weights[:1000] if content == "truncated-model" else b""
            )
        else:
            path.write_text(content.replace("{model}", str(STORIES)))


@pytest.mark.parametrize("argv,message,files", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2(capsys, tmp_path, argv, message, files):
    _materialise(tmp_path, files)
    args = [a.replace("{tmp}", str(tmp_path)).replace("{model}", str(STORIES)) for a in argv]
    err = one_line_error(args, capsys)
    assert message in err, err


def cli_commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> set[str]:
    """Every command the CLI has, read from its parser ("sweep run", "tune", ...)."""
    found: set[str] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found |= cli_commands(sub, (*prefix, name)) or {" ".join((*prefix, name))}
    return found


def test_the_table_covers_every_command():
    """A command added to the CLI fails this test until the table has a row for it."""
    commands = {c[1][0] if c[1][0] not in ("sweep", "data") else " ".join(c[1][:2]) for c in CASES}
    everything = cli_commands(build_parser())
    assert {"invert", "sweep run", "train-inverter", "tune"} <= everything  # the parser is read
    assert everything - commands == set()


# ---- numbers by the field's type: what YAML 1.1 reads as strings --------------------------------
@pytest.mark.parametrize(
    "text,value", [("1e-3", 1e-3), ("1E-3", 1e-3), (".5", 0.5), ("5.", 5.0), ("3e-6", 3e-6)]
)
def test_numbers_are_floats_in_yaml_and_param(text, value):
    from sodaray.cli.invert import _parse_param
    from sodaray.config.yamltext import yaml_load
    from sodaray.runner.spec import parse_sweep

    assert _parse_param(f"learning_rate={text}") == ("learning_rate", value)
    data = yaml_load(
        SWEEP.format(
            resources="",
            model=STORIES,
            params=f"{{learning_rate: {text}}}",
            objective=(f"{{kind: logits, fluency_weight: {text}}}"),
        )
    )
    sweep_ = parse_sweep(data, Path("s.yaml"))
    (job,) = sweep_.jobs()
    assert job.search.learning_rate == value
    assert job.objective.fluency_weight == value
    assert isinstance(job.search.learning_rate, float)


def test_tuning_ranges_accept_exponent_floats(tmp_path):
    from sodaray.tuner.spec import load_tuning

    (tmp_path / "t.yaml").write_text(
        TUNE.format(model=STORIES, space="{learning_rate: {low: 1e-3, high: 1E-1, log: true}}")
    )
    spec = load_tuning(tmp_path / "t.yaml")
    assert (spec.space[0].low, spec.space[0].high) == (1e-3, 1e-1)


def test_string_numbers_coerced_by_field_type():
    from sodaray.api import make_config

    config = make_config("soda", {"learning_rate": "1e-3", "reset_period": 50.0, "eps": 1})
    assert config.learning_rate == 1e-3 and isinstance(config.eps, float)
    assert config.reset_period == 50 and isinstance(config.reset_period, int)


# ---- memory and writes, where the real condition cannot be made in a test -----------------------
def test_search_state_larger_than_memory_is_refused_before_allocating(capsys, monkeypatch):
    import sodaray.config.capacity as capacity

    monkeypatch.setattr(capacity, "available_memory", lambda: 1000)
    code = main([a.replace("{model}", str(STORIES)) for a in INV])
    err = capsys.readouterr().err
    assert code == 2 and "search state" in err and "needs about" in err
    assert len(err.strip().splitlines()) == 1


def test_invert_out_on_a_full_disk_prints_the_results_first(capsys, tmp_path, monkeypatch):
    """ENOSPC is simulated at Parquet's write (the edge: temporary file, rename, error line);
    a 64 KiB tmpfs gave the same output by hand."""
    import pyarrow.parquet as pq

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(pq, "write_table", full)
    argv = [a.replace("{model}", str(STORIES)) for a in INV]
    code = main([*argv, "--json", "--out", str(tmp_path / "rows.parquet")])
    captured = capsys.readouterr()
    assert code == 2
    assert '"tokens"' in captured.out  # the computed result was printed
    assert "No space left on device" in captured.err
    assert len(captured.err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []  # no partial or temporary file left


def test_invert_out_in_a_read_only_folder(capsys, tmp_path, monkeypatch):
    """EACCES simulated at the write: tests run as root here, for whom chmod does not bite."""
    import pyarrow.parquet as pq

    def denied(*args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(pq, "write_table", denied)
    argv = [a.replace("{model}", str(STORIES)) for a in INV]
    code = main([*argv, "--out", str(tmp_path / "rows.parquet")])
    err = capsys.readouterr().err
    assert code == 2 and "Permission denied" in err and len(err.strip().splitlines()) == 1


def test_an_unreachable_hub_is_one_line(tmp_path):
    """A hub id with no connection (or no such repository): the hub's retries print nothing,
    the error is one line. A fresh process, since the hub reads its verbosity at import."""
    import subprocess
    import sys

    env = {
        **os.environ,
        "HF_HOME": str(tmp_path / "hf"),
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
    }
    env.pop("HF_HUB_OFFLINE", None)
    env.pop("HF_HUB_VERBOSITY", None)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sodaray",
            "invert",
            "--model",
            "nobody/no-such-model-x",
            "--tokens",
            "1",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()], proc.stderr
    assert "cannot load model" in proc.stderr


def test_data_build_on_a_full_disk(capsys, tmp_path, monkeypatch):
    """ENOSPC simulated at Parquet's write: one line, and no temporary file left behind."""
    import pyarrow.parquet as pq

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(pq, "write_table", full)
    argv = ["data", "build", "--model", str(STORIES), "--dataset", "random", "--lengths", "1"]
    code = main([*argv, "--per-length", "2", "--out", str(tmp_path / "d.parquet")])
    err = capsys.readouterr().err
    assert code == 2 and "No space left on device" in err and len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_resources_the_machine_lacks():
    """Before a local Ray starts, a replica asking more than this machine has is an error
    (Ray would wait forever); what fits passes. A cluster's nodes are counted once it is joined
    (tests/test_cluster.py, on a real head)."""
    from sodaray.experiment.cluster import check_resources

    cores = os.cpu_count() or 1
    with pytest.raises(ValueError, match=f"1000 CPU per replica but the machine has {cores}"):
        check_resources([("model m", 1000.0, 0.0)])
    check_resources([("model m", float(cores), 0.0)])  # what fits passes silently


def test_integral_numbers_in_integer_fields(tmp_path):
    from sodaray.config.yamltext import yaml_load
    from sodaray.runner.spec import parse_sweep

    text = SWEEP.format(model=STORIES, params="{}", objective="{kind: logits}", resources="")
    text = text.replace("max_steps: 5", "max_steps: 1e2").replace("params: {}", "max_steps: 3e1")
    sweep_ = parse_sweep(yaml_load(text), Path("s.yaml"))
    assert sweep_.max_steps == 100 and isinstance(sweep_.max_steps, int)
    # An algorithm entry's own step budget by the same rule.
    (entry,) = sweep_.algorithms
    assert entry.max_steps == 30 and isinstance(entry.max_steps, int)
    assert [job.search.max_steps for job in sweep_.jobs()] == [30]
