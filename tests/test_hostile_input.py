"""Issue 30: input as an attacker or a careless user writes it. Every row ends in one line on
stderr and exit code 2, or (rows marked `ok`) in the right behaviour; no row writes outside the
folder it runs in, except into `--out`.

A row is (id, argv, the text the error must contain, files to write first). Files are written
under `{tmp}/in`; a command's output goes to `{tmp}/o`; after the row, every file under `{tmp}`
must lie in one of the two (a name that escaped `--out` would leave one elsewhere). `{model}` is
the stories260K folder. File contents name a kind (see `materialise`) or are the text itself.
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import STORIES, one_line_error

from sodaray.cli import main

pytestmark = pytest.mark.skipif(not STORIES.is_dir(), reason="stories260K not present")

IN = "{tmp}/in"
RUN = ["sweep", "run", f"{IN}/s.yaml", "--out", "{tmp}/o"]
PLAN = ["sweep", "plan", f"{IN}/s.yaml", "--no-calibrate"]
TUNE = ["tune", f"{IN}/t.yaml", "--out", "{tmp}/o"]
INV = ["invert", "--model", "{model}", "--max-steps", "5"]


def sweep_text(
    name: str = "s",
    model: str = '{id: "{model}", num_cpus: 1}',
    dataset: str = '{name: random, build: {dataset: random, lengths: "1", per_length: 2}}',
    algorithm: str = "{name: soda}",
    extra: str = "",
) -> str:
    return (
        f"name: {name}\nmodels: [{model}]\ndatasets: [{dataset}]\nalgorithms: [{algorithm}]\n"
        f"max_steps: 5\n{extra}"
    )


def tune_text(name: str = "t", space: str = "{learning_rate: {low: 0.01, high: 0.1}}", extra=""):
    return (
        f'name: {name}\nmodel: {{id: "{{model}}"}}\n'
        'data: {build: {dataset: random, lengths: "1", per_length: 2, seed: 0}}\n'
        f"space: {space}\nmax_steps: 5\ntrials: 1\n{extra}"
    )


# Nested aliases: each level ten times the last (a "billion laughs" document).
LAUGHS = (
    "a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
    "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
    "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\n"
)
JOB = "s/.sodaray/jobs/j"  # a job's meta folder under a results folder


def job_json(**fields) -> str:
    info = {"sweep": "s", "job": "j", "shards": 1, "shard_size": 2, "samples": 2}
    info.update(fields)
    return json.dumps({k: v for k, v in info.items() if v is not None})


CASES: list[tuple[str, list[str], str, dict[str, str]]] = [
    # ---- 1. names that would write outside --out (the 8 path escapes)
    ("sweep-name-dotdot", RUN, "name: must be a plain name", {"s.yaml": sweep_text(name="..")}),
    ("sweep-name-dot", RUN, "name: must be a plain name", {"s.yaml": sweep_text(name=".")}),
    ("tune-name-dotdot", TUNE, "name: must be a plain name", {"t.yaml": tune_text(name="..")}),
    (
        "model-name-absolute",
        RUN,
        "models[0].name: must be a plain name",
        {"s.yaml": sweep_text(model='{id: "{model}", name: "{tmp}/outside/m"}')},
    ),
    (
        "model-name-dotdot-slash",
        RUN,
        "models[0].name: must be a plain name",
        {"s.yaml": sweep_text(model='{id: "{model}", name: "../../m"}')},
    ),
    (
        "dataset-name-dotdot-slash",
        RUN,
        "datasets[0].name: must be a plain name",
        {"s.yaml": sweep_text(dataset='{name: ../../d, build: {dataset: random, lengths: "1"}}')},
    ),
    (
        "tune-data-name-absolute",
        TUNE,
        "data.name: must be a plain name",
        {"t.yaml": tune_text().replace("data: {build:", 'data: {name: "{tmp}/outside/d", build:')},
    ),
    (
        "status-job-dotdot",
        ["sweep", "status", "{tmp}/in/r"],
        "not its folder's name",
        {f"r/{JOB}/job.json": job_json(job="../../../../etc")},
    ),
    # ---- 2. input that would exhaust memory or time
    (
        "alias-bomb-description",
        PLAN,
        "aliases expand it",
        {"s.yaml": LAUGHS + sweep_text(extra="description: *e\n")},
    ),
    (
        "alias-bomb-grid",
        PLAN,
        "aliases expand it",
        {"s.yaml": LAUGHS + sweep_text(algorithm="{name: soda, grid: {temperature: *e}}")},
    ),
    (
        "alias-bomb-preset",
        PLAN,
        "aliases expand it",
        {
            "p.yaml": LAUGHS + "soda: {temperature: 0.1, note: *e}\n",
            "s.yaml": sweep_text(model='{id: "{model}", preset_file: "{tmp}/in/p.yaml"}'),
        },
    ),
    (
        "grid-millions-of-variants",
        PLAN,
        "grid of 10,000,000,000 variants",
        {
            "s.yaml": sweep_text(
                algorithm="{name: soda, grid: {"
                + ", ".join(
                    f"{k}: [{', '.join(str(0.1 + i / 100) for i in range(10))}]"
                    for k in (
                        "learning_rate",
                        "temperature",
                        "decay",
                        "beta1",
                        "beta2",
                        "eps",
                        "reinit_std",
                    )
                )
                + ", reset_period: [1,2,3,4,5,6,7,8,9,10], reinit_period: [1,2,3,4,5,6,7,8,9,10]"
                + ", max_batch_size: [1,2,3,4,5,6,7,8,9,10]}}"
            )
        },
    ),
    (
        "alias-grid-variants",  # 400 bytes of aliases: few nodes, ten million variants
        PLAN,
        "variants",
        {
            "s.yaml": sweep_text(
                algorithm="{name: soda, grid: {learning_rate: &v [0.1, 0.2, 0.3, 0.4, 0.5, "
                "0.6, 0.7, 0.8, 0.9, 0.95], temperature: *v, decay: *v, beta1: *v, beta2: *v, "
                "eps: *v, reinit_std: *v}}"
            )
        },
    ),
    (
        "tune-grid-int-range-huge",
        TUNE,
        "grid of 1,000,000,000,000 values",
        {
            "t.yaml": tune_text(
                space="{reset_period: {type: int, low: 1, high: 1000000000000, step: 1}}",
                extra="sampler: grid\n",
            )
        },
    ),
    (
        "tune-grid-float-step-tiny",
        TUNE,
        "grid of",
        {
            "t.yaml": tune_text(
                space="{learning_rate: {low: 0.01, high: 0.1, step: 1e-12}}",
                extra="sampler: grid\n",
            )
        },
    ),
    (
        "status-job-claims-1e12-shards",
        ["sweep", "status", "{tmp}/in/r"],
        "do not hold",
        {f"r/{JOB}/job.json": job_json(shards=10**12)},
    ),
    # ---- 3. what used to end in a traceback
    (
        "model-is-a-file",
        [*INV[:1], "--model", "{model}/config.json", "--tokens", "172"],
        "is a file, not a model folder",
        {},
    ),
    (
        "model-pickled-weights",
        ["invert", "--model", f"{IN}/m", "--tokens", "1"],
        "cannot load model",
        {"m": "pickled-model"},
    ),
    (
        "dataset-name-int",
        RUN,
        "datasets[0].name: must be a string",
        {
            "s.yaml": sweep_text(
                dataset='{name: 123, build: {dataset: random, lengths: "1", per_length: 2}}'
            )
        },
    ),
    (
        "dataset-name-list",
        RUN,
        "datasets[0].name: must be a string",
        {
            "s.yaml": sweep_text(
                dataset='{name: [a, b], build: {dataset: random, lengths: "1", per_length: 2}}'
            )
        },
    ),
    (
        "status-job-json-without-job",
        ["sweep", "status", "{tmp}/in/r"],
        "not its folder's name",
        {f"r/{JOB}/job.json": job_json(job=None)},
    ),
    # ---- 4. what used to pass in silence
    (
        "yaml-duplicate-key",
        PLAN,
        "found duplicate key 'max_steps'",
        {"s.yaml": sweep_text(extra="max_steps: 500\n")},
    ),
    ("seeds-repeat", PLAN, "seeds: repeat", {"s.yaml": sweep_text(extra="seeds: [0, 0]\n")}),
    (
        "logits-boolean",
        [*INV, "--logits-file", f"{IN}/b.npy"],
        "booleans",
        {"b.npy": "bool-logits"},
    ),
    ("invert-out-empty", [*INV, "--tokens", "172", "--out", ""], "--out: empty path", {}),
    (
        "jsonl-text-not-a-string",
        [
            "data",
            "build",
            "--model",
            "{model}",
            "--dataset",
            "nl-id",
            "--source",
            f"{IN}/d.jsonl",
            "--out",
            "{tmp}/o/d.parquet",
        ],
        "line 1: text must be a string",
        {"d.jsonl": '{"text": 12345}\n'},
    ),
    (
        "dataset-no-rows",
        RUN,
        "holds no samples",
        {
            "d.parquet": "dataset-empty",
            "s.yaml": sweep_text(dataset='{name: d, path: "{tmp}/in/d.parquet"}'),
        },
    ),
    (
        "dataset-sample-ids-repeat",
        RUN,
        "sample_id 0 repeats",
        {
            "d.parquet": "dataset-same-ids",
            "s.yaml": sweep_text(dataset='{name: d, path: "{tmp}/in/d.parquet"}'),
        },
    ),
    (
        "report-missing-found-column",
        ["report", f"{IN}/rows.parquet", "--out", "{tmp}/o"],
        "lacks the column found",
        {"rows.parquet": "rows-without-found"},
    ),
    (
        "plan-rate-inf",
        ["sweep", "plan", f"{IN}/s.yaml", "--rate", "inf"],
        "--rate",
        {"s.yaml": sweep_text()},
    ),
    # ---- 5. one line, but not the one a user needs
    (
        "logits-strings",
        [*INV, "--logits-file", f"{IN}/s.npy"],
        "holds str",
        {"s.npy": "string-logits"},
    ),
    (
        "logits-directory",
        [*INV, "--logits-file", f"{IN}/dir.npy"],
        "is a directory",
        {"dir.npy/x": "x"},
    ),
    (
        "model-id-a-file-not-a-path",
        ["invert", "--model", "README.md", "--tokens", "1"],
        "is a file, not a model folder",
        {},
    ),
    (
        "plan-dataset-wrong-schema",
        PLAN,
        "not a sodaray dataset",
        {
            "d.parquet": "parquet-other",
            "s.yaml": sweep_text(dataset='{name: d, path: "{tmp}/in/d.parquet"}'),
        },
    ),
    (
        "plan-dataset-empty",
        PLAN,
        "holds no samples",
        {
            "d.parquet": "dataset-empty",
            "s.yaml": sweep_text(dataset='{name: d, path: "{tmp}/in/d.parquet"}'),
        },
    ),
    ("sweep-file-utf16", PLAN, "s.yaml: not UTF-8 text", {"s.yaml": "utf16:" + sweep_text()}),
    (
        "costs-alias-bomb",
        [*PLAN, "--costs", f"{IN}/c.yaml"],
        "aliases expand it",
        {"s.yaml": sweep_text(), "c.yaml": LAUGHS + "device: d\nkind: gpu\nsource: *e\n"},
    ),
    (
        "costs-a-directory",
        [*PLAN, "--costs", f"{IN}/c"],
        "no such costs file",
        {"s.yaml": sweep_text(), "c/x": "x"},
    ),
    (
        "costs-huge-file",
        [*PLAN, "--costs", f"{IN}/c.yaml"],
        "is not a costs file",
        {"s.yaml": sweep_text(), "c.yaml": "# " + "x" * (5 << 20) + "\n"},
    ),
    (
        "status-job-json-garbled",
        ["sweep", "status", "{tmp}/in/r"],
        "job.json: not a readable job file",
        {f"r/{JOB}/job.json": '{"sweep": "s", "job": '},
    ),
    (
        "report-bad-version",
        ["report", f"{IN}/rows.parquet", "--out", "{tmp}/o"],
        "result schema",
        {"rows.parquet": "rows-bad-version"},
    ),
    (
        "report-version-not-a-number",
        ["report", f"{IN}/rows.parquet", "--out", "{tmp}/o"],
        "is not a number",
        {"rows.parquet": "rows-version-text"},
    ),
    (
        "report-string-sample-ids",
        ["report", f"{IN}/rows.parquet", "--out", "{tmp}/o"],
        "sample_id",
        {"rows.parquet": "rows-string-ids"},
    ),
    (
        "report-embedding-model-missing",
        ["report", f"{IN}/rows.parquet", "--out", "{tmp}/o", "--embedding-model", "{tmp}/none"],
        "--embedding-model",
        {"rows.parquet": "rows"},
    ),
    # ---- and the rows a report must refuse
    (
        "report-duplicate-rows",
        ["report", f"{IN}/rows.parquet", f"{IN}/again.parquet", "--out", "{tmp}/o"],
        "repeat",
        {"rows.parquet": "rows", "again.parquet": "rows"},
    ),
]


def materialise(tmp: Path, files: dict[str, str]) -> None:
    """Write each file under `tmp/in`; a content naming a kind below is built, not written."""
    for name, content in files.items():
        path = tmp / "in" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        text = content.replace("{model}", str(STORIES)).replace("{tmp}", str(tmp))
        if content == "bool-logits":
            np.save(path, np.zeros((1, 512), dtype=bool))
        elif content == "string-logits":
            np.save(path, np.array([["a"] * 512]))
        elif content == "pickled-model":
            path.mkdir()
            shutil.copy(STORIES / "config.json", path / "config.json")
            with (path / "pytorch_model.bin").open("wb") as f:
                pickle.dump({"not": "weights"}, f)
        elif content.startswith("dataset-"):
            write_dataset(path, content)
        elif content == "parquet-other":
            pq.write_table(pa.table({"a": [1, 2]}), path)
        elif content.startswith("rows"):
            write_rows(path, content)
        elif content.startswith("utf16:"):
            path.write_text(text.removeprefix("utf16:"), encoding="utf-16")
        else:
            path.write_text(text)


def write_dataset(path: Path, kind: str) -> None:
    """A dataset file as `sodaray data build` writes one, or a bad one as `kind` says (written
    with pyarrow, as a careless script would: `write_dataset` itself refuses them)."""
    from sodaray.data.store import SCHEMA, VERSION_KEY, content_hash

    ids = [0, 0] if kind == "dataset-same-ids" else [0, 1]
    oov = 100_000 if kind == "dataset-oov" else 7  # stories260K has 512 tokens
    rows = {
        "sample_id": ids,
        "dataset": ["mine"] * 2,
        "tokenizer": ["t"] * 2,
        "vocab_size": [512] * 2,
        "length": [1, 1],
        "tokens": [[5], [oov]],
        "text": ["a", "b"],
        "pii_labels": [None, None],
        "document_id": [None, None],
    }
    if kind == "dataset-empty":
        rows = {k: v[:0] for k, v in rows.items()}
    table = pa.Table.from_pydict(rows, schema=SCHEMA)
    meta = {VERSION_KEY: b"1", b"sodaray.dataset.hash": content_hash(table).encode()}
    pq.write_table(table.replace_schema_metadata(meta), path)


_ROWS: dict[str, pa.Table] = {}


def write_rows(path: Path, kind: str) -> None:
    """Real result rows (a 5-step inversion of stories260K), then altered as `kind` says."""
    if "rows" not in _ROWS:
        out = path.parent / "made.parquet"
        argv = [a.replace("{model}", str(STORIES)) for a in INV]
        assert main([*argv, "--tokens", "172,3", "--out", str(out), "--json"]) == 0
        _ROWS["rows"] = pq.read_table(out)
        out.unlink()
    table = _ROWS["rows"]
    if kind == "rows-without-found":
        table = table.drop_columns(["found"])
    elif kind == "rows-bad-version":
        meta = dict(table.schema.metadata)
        meta = {k: (b"999" if b"version" in k else v) for k, v in meta.items()}
        table = table.replace_schema_metadata(meta)
    elif kind == "rows-version-text":
        meta = dict(table.schema.metadata)
        meta = {k: (b"three" if b"version" in k else v) for k, v in meta.items()}
        table = table.replace_schema_metadata(meta)
    elif kind == "rows-string-ids":
        index = table.schema.get_field_index("sample_id")
        table = table.set_column(index, "sample_id", pa.array(["a"] * len(table)))
    pq.write_table(table, path)


def files_outside(tmp: Path) -> list[str]:
    return sorted(
        str(p.relative_to(tmp))
        for p in tmp.rglob("*")
        if p.is_file() and p.relative_to(tmp).parts[0] not in ("in", "o")
    )


@pytest.mark.parametrize("argv,message,files", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_input_is_one_line_exit_2(capsys, tmp_path, argv, message, files, monkeypatch):
    materialise(tmp_path, files)
    (tmp_path / "in").mkdir(exist_ok=True)
    monkeypatch.chdir(tmp_path / "in")  # a relative path a command makes lands in `in`
    args = [a.replace("{tmp}", str(tmp_path)).replace("{model}", str(STORIES)) for a in argv]
    if args[:2] == ["invert", "--model"] and args[2] == "README.md":
        args[2] = str(Path(__file__).resolve().parents[1] / "README.md")
    err = one_line_error(args, capsys)
    assert message in err, err
    assert files_outside(tmp_path) == []


def test_the_table_holds_every_case_of_issue_30():
    assert len(CASES) == len({c[0] for c in CASES}) >= 42


def test_an_interrupted_invert_keeps_every_result_it_found(tmp_path):
    """Issue 30, case 7: results print as each target finishes, so Ctrl-C after the first keeps
    it: printed, and in `--out` (exit 130, one line saying how many finished)."""
    import select
    import signal
    import subprocess
    import sys

    out = tmp_path / "rows.parquet"
    hard = ",".join(str(t) for t in (311, 45, 402, 99, 250, 17, 388, 461))  # not found soon
    cmd = [sys.executable, "-m", "sodaray", "invert", "--model", str(STORIES), "--tokens", "172"]
    cmd += ["--tokens", hard, "--max-steps", "1000000", "--json", "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # The easy target's row comes long before the hard one ends; printed only at the end
        # (as before), nothing would come at all.
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        assert ready, "no result printed while the run went on"
        first = proc.stdout.readline()
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    rows = [json.loads(line) for line in (first + rest).splitlines()]
    assert proc.returncode == 130, err
    assert [r["tokens"] for r in rows] == [[172]] and rows[0]["found"]
    assert "interrupted: 1 of 2 targets finished" in err and "Traceback" not in err
    assert pq.read_table(out)["tokens"].to_pylist() == [[172]]


def test_a_ctrl_c_dropped_inside_a_c_callback_still_stops_invert(capsys, monkeypatch):
    """A KeyboardInterrupt raised while the main thread runs the denormal flush's OpenMP
    callback was printed and dropped by ctypes ("Exception ignored on calling ctypes callback
    function"), and the run went on (found in a fresh-clone run: the interrupted-invert test
    above hung after its Ctrl-C). `invert` now stops at the end of that step, quietly."""
    import ctypes
    import os
    import signal

    from sodaray.search import denormals

    calls = []

    def interrupt_once(_data):
        calls.append(1)
        if len(calls) == 5:
            os.kill(os.getpid(), signal.SIGINT)  # its handler runs inside this callback

    callback = denormals._Callback(interrupt_once)
    monkeypatch.setitem(denormals._CALLBACKS, True, callback)
    assert isinstance(callback, ctypes._CFuncPtr)
    tokens = ",".join(str(t) for t in (311, 45, 402, 99, 250, 17, 388, 461))  # not found soon
    code = main(["invert", "--model", str(STORIES), "--tokens", tokens, "--max-steps", "3000"])
    err = capsys.readouterr().err
    assert len(calls) >= 5  # the flush ran through the OpenMP runtime's callback
    assert code == 130, err
    assert "interrupted: 0 of 1 targets finished" in err
    assert "Traceback" not in err and "ignored" not in err, err
    assert len(calls) < 3000  # stopped within steps of the Ctrl-C, not after the whole budget


def test_a_bad_job_fails_alone_once_with_its_reason(tmp_path, local_ray):
    """Issue 30, case 6: a dataset holding a token id the model does not have fails its own
    shards at once (one try each, the reason given) while the job beside it finishes."""
    from sodaray.runner import load_sweep, run_sweep

    write_dataset(tmp_path / "oov.parquet", "dataset-oov")
    text = sweep_text(
        model=f'{{id: "{STORIES}", num_cpus: 1}}',
        dataset='{name: good, build: {dataset: random, lengths: "1", per_length: 2}}, '
        f'{{name: bad, path: "{tmp_path / "oov.parquet"}"}}',
    )
    (tmp_path / "s.yaml").write_text(text)
    run = run_sweep(load_sweep(tmp_path / "s.yaml"), tmp_path / "o")
    [failed] = run.failed
    assert failed.job.startswith("stories260K_bad") and failed.attempts == 1
    assert "vocabulary" in failed.error
    assert len(run.done) == 1 and run.done[0].job.startswith("stories260K_good")
