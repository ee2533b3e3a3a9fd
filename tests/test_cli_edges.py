"""The command line's edges: no input reaches a traceback, every error names the file it is
about, no empty option value is read as "unset", `--json` is strict JSON, and a value given
two ways is refused (or a note says which is used).

A row of `CASES` is (id, argv, files to write first, the exit code, text the one stderr line
must contain). `{tmp}` is the test's folder, `{model}` the stories260K folder. A file's content
is text, bytes, or a kind `materialise` makes: ("gguf", N) the first N bytes of the real
SmolLM2 GGUF file (N = "half": half of it), ("model", {name: content}) a copy of stories260K
with those files replaced (content ("cut", fraction): that share of the original file).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import SMOLLM, STORIES, one_line_error
from safetensors.numpy import save_file

from sodaray.cli import build_parser, main
from sodaray.io.jsontext import dumps, finite

pytestmark = pytest.mark.skipif(not STORIES.is_dir(), reason="stories260K not present")

GGUF = SMOLLM / "SmolLM2-135M-Instruct.Q4_1.gguf"
INV = ["invert", "--device", "cpu", "--max-steps", "1"]
INV_M = [*INV, "--model", "{model}"]  # on stories260K
DATA = ["data", "build", "--dataset", "random", "--out", "{tmp}/o/d.parquet"]


def npy_header(shape: tuple[int, ...], descr: str = "<f4") -> bytes:
    """A .npy header alone (no data after it), as numpy writes one."""
    import io

    from numpy.lib import format as npy

    buf = io.BytesIO()
    npy.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue()


TUNE = (
    'name: t\nmodel: {id: "{model}"}\n'
    'data: {build: {dataset: random, lengths: "1", per_length: 2, seed: 0}}\n'
    "space: {learning_rate: {low: 0.01, high: 0.1}}\nmax_steps: 5\ntrials: 1\n"
)


def logits(kind: str) -> bytes | tuple:
    """A logits file's bytes (`.npy`) or a ("safetensors", tensors) pair."""
    import io

    buf = io.BytesIO()
    if kind == "bool":
        np.save(buf, np.ones((1, 1, 512), dtype=bool))
    elif kind == "4d":
        np.save(buf, np.zeros((1, 1, 1, 512), dtype=np.float32))
    elif kind == "empty":
        np.save(buf, np.zeros((0, 1, 512), dtype=np.float32))
    elif kind == "wrong-vocab":
        np.save(buf, np.zeros((1, 1, 7), dtype=np.float32))
    elif kind == "cut":
        np.save(buf, np.zeros((1, 1, 512), dtype=np.float32))
        return buf.getvalue()[:-100]
    elif kind == "objects":
        np.save(buf, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    elif kind == "top3":
        values = np.array([[[3.0, 2.0, 1.0]]], dtype=np.float32)
        return ("safetensors", {"values": values, "indices": np.array([[[5, 6, 7]]])})
    elif kind == "no-values":
        return ("safetensors", {"other": np.zeros((1, 1, 512), dtype=np.float32)})
    return buf.getvalue()


CASES: list[tuple[str, list[str], dict[str, Any], int, str]] = [
    # ---- a GGUF file cut short (an interrupted download), or not a GGUF file at all
    (
        "gguf-0-bytes",
        [*INV, "--model", "{tmp}/m.gguf", "--tokens", "5"],
        {"m.gguf": ("gguf", 0)},
        2,
        "m.gguf: 0 bytes, not a GGUF model file",
    ),
    (
        "gguf-3-bytes",
        [*INV, "--model", "{tmp}/m.gguf", "--tokens", "5"],
        {"m.gguf": ("gguf", 3)},
        2,
        "m.gguf: 3 bytes",
    ),
    (
        "gguf-100-bytes",
        [*INV, "--model", "{tmp}/m.gguf", "--tokens", "5"],
        {"m.gguf": ("gguf", 100)},
        2,
        "m.gguf: GGUF file cut short",
    ),
    (
        "gguf-10k-in-folder",
        [*INV, "--model", "{tmp}", "--gguf-file", "m.gguf", "--tokens", "5"],
        {"m.gguf": ("gguf", 10_000)},
        2,
        "m.gguf: GGUF file cut short",
    ),
    (
        "gguf-half",
        [*INV, "--model", "{tmp}/m.gguf", "--tokens", "5"],
        {"m.gguf": ("gguf", "half")},
        2,
        "m.gguf: GGUF file truncated",
    ),
    (
        "gguf-text",
        [*INV, "--model", "{tmp}/m.gguf", "--tokens", "5"],
        {"m.gguf": "not a model\n"},
        2,
        "m.gguf: not a GGUF model file",
    ),
    (
        "data-gguf-0-bytes",
        [*DATA, "--model", "{tmp}/m.gguf"],
        {"m.gguf": ("gguf", 0)},
        2,
        "m.gguf: 0 bytes",
    ),
    (
        "data-gguf-100-bytes",
        [*DATA, "--model", "{tmp}/m.gguf"],
        {"m.gguf": ("gguf", 100)},
        2,
        "m.gguf: GGUF file cut short",
    ),
    (
        "data-gguf-10k-in-folder",
        [*DATA, "--model", "{tmp}", "--gguf-file", "m.gguf"],
        {"m.gguf": ("gguf", 10_000)},
        2,
        "m.gguf: GGUF file cut short",
    ),
    (
        "data-gguf-half",
        [*DATA, "--model", "{tmp}/m.gguf"],
        {"m.gguf": ("gguf", "half")},
        2,
        "m.gguf: GGUF file truncated",
    ),
    (
        "gguf-given-twice",
        [*INV, "--model", "{tmp}/m.gguf", "--gguf-file", "n.gguf", "--tokens", "5"],
        {"m.gguf": ("gguf", 100)},
        2,
        "is a GGUF file and --gguf-file names another",
    ),
    (
        "data-gguf-given-twice",
        [*DATA, "--model", "{tmp}/m.gguf", "--gguf-file", "n.gguf"],
        {"m.gguf": ("gguf", 100)},
        2,
        "m.gguf is a GGUF file and a GGUF file name",
    ),
    # ---- a model folder of the wrong kind, or with a damaged file
    (
        "safetensors-garbage",
        [*INV, "--model", "{tmp}/m", "--tokens", "5"],
        {"m": ("model", {"model.safetensors": b"\xff" * 1000})},
        2,
        "m/model.safetensors: not a readable safetensors file",
    ),
    (
        "safetensors-cut",
        [*INV, "--model", "{tmp}/m", "--tokens", "5"],
        {"m": ("model", {"model.safetensors": ("cut", 0.5)})},
        2,
        "m/model.safetensors: not a readable safetensors file",
    ),
    (
        "bin-cut",
        [*INV, "--model", "{tmp}/m", "--tokens", "5"],
        {"m": ("model", {"model.safetensors": None, "pytorch_model.bin": "zip-cut"})},
        2,
        "m/pytorch_model.bin: not a readable torch weight file",
    ),
    (
        "unknown-architecture",
        [*INV, "--model", "{tmp}/m", "--tokens", "5"],
        {"m": ("model", {"config.json": '{"model_type": "nosucharch", "vocab_size": 512}'})},
        2,
        "m/config.json: ",
    ),
    (
        "config-not-json",
        [*INV, "--model", "{tmp}/m", "--tokens", "5"],
        {"m": ("model", {"config.json": "{not json"})},
        2,
        "m/config.json",
    ),
    (
        "no-weights",
        [*INV, "--model", "{tmp}/m", "--tokens", "5"],
        {"m": ("model", {"model.safetensors": None})},
        2,
        "m holds no weights",
    ),
    (
        "tokenizer-damaged",
        [*INV, "--model", "{tmp}/m", "--prompt", "Once"],
        {"m": ("model", {"tokenizer.json": "{broken"})},
        2,
        "m/tokenizer.json",
    ),
    (
        "data-config-not-json",
        [*DATA, "--model", "{tmp}/m"],
        {"m": ("model", {"config.json": "{not json"})},
        2,
        "m/config.json",
    ),
    (
        "data-tokenizer-damaged",
        [*DATA, "--model", "{tmp}/m"],
        {"m": ("model", {"tokenizer.json": "{broken"})},
        2,
        "m/tokenizer.json",
    ),
    # ---- a value given two ways, or a flag the inputs never read
    (
        "option-twice",
        [*INV_M, "--tokens", "5", "--max-steps", "3"],
        {},
        2,
        "--max-steps given twice (1, then 3)",
    ),
    (
        "data-out-twice",
        [*DATA, "--model", "{model}", "--out", "{tmp}/o/e.parquet"],
        {},
        2,
        "--out given twice",
    ),
    (
        "tokenizer-a-fifo",
        [*INV, "--model", "{tmp}/m", "--tokens", "5"],
        {"m": ("model", {"tokenizer.json": "fifo"})},
        2,
        "m/tokenizer.json is a FIFO (named pipe), not a tokenizer file",
    ),
    (
        "data-tokenizer-a-fifo",
        [*DATA, "--model", "{tmp}/m"],
        {"m": ("model", {"tokenizer.json": "fifo"})},
        2,
        "m/tokenizer.json is a FIFO (named pipe), not a tokenizer file",
    ),
    (
        "weights-of-another-shape",
        [*INV, "--model", "{tmp}/m", "--tokens", "5"],
        {"m": ("model", {"config.json": "vocab-64"})},
        2,
        "m/model.safetensors: its tensors' shapes are not the ones its config.json describes",
    ),
    (
        "preset-and-preset-file",
        [*INV_M, "--tokens", "5", "--preset", "tinystories-33m", "--preset-file", "{tmp}/p.yaml"],
        {"p.yaml": "soda: {temperature: 0.1}\n"},
        2,
        "--preset and --preset-file both given",
    ),
    (
        "max-steps-twice",
        [*INV_M, "--tokens", "5", "--param", "max_steps=9"],
        {},
        2,
        "--max-steps and --param max_steps=... both given",
    ),
    (
        "param-twice",
        [*INV_M, "--tokens", "5", "--param", "temperature=0.1", "--param", "temperature=0.2"],
        {},
        2,
        "--param temperature given twice",
    ),
    (
        "seed-twice",
        [*INV_M, "--tokens", "5", "--seed", "1", "--param", "seed=2"],
        {},
        2,
        "--seed and --param seed=... both given",
    ),
    (
        "batch-twice",
        [*INV_M, "--tokens", "5", "--max-batch-size", "4", "--param", "max_batch_size=8"],
        {},
        2,
        "--max-batch-size and --param max_batch_size",
    ),
    (
        "output-text-logits",
        [*INV_M, "--output-text", "hi", "--objective", "logits"],
        {},
        2,
        "--output-text observes text",
    ),
    (
        "logits-file-text",
        [*INV_M, "--logits-file", "{tmp}/x.npy", "--objective", "text"],
        {"x.npy": logits("4d")},
        2,
        "--logits-file observes logits",
    ),
    (
        "output-tokens-ignored",
        [*INV_M, "--output-text", "hi", "--output-tokens", "2"],
        {},
        2,
        "--output-tokens counts the observed positions",
    ),
    (
        "max-length-ignored",
        [*INV_M, "--tokens", "5", "--max-length", "3"],
        {},
        2,
        "--max-length bounds --length auto",
    ),
    (
        "text-loss-ignored",
        [*INV_M, "--tokens", "5", "--text-loss", "prob"],
        {},
        2,
        "--text-loss is for the text objective",
    ),
    (
        "top-k-vs-file",
        [*INV_M, "--logits-file", "{tmp}/x.safetensors", "--top-k", "5"],
        {"x.safetensors": logits("top3")},
        2,
        "x.safetensors holds the top 3 logits",
    ),
    (
        "data-records-ignored",
        [*DATA, "--model", "{model}", "--records", "prefix"],
        {},
        2,
        "--records is for the privacy dataset",
    ),
    (
        "data-vocab-ignored",
        [*DATA[:3], "nl-id", *DATA[4:], "--model", "{model}", "--vocab", "model"],
        {},
        2,
        "--vocab is for the random dataset",
    ),
    # ---- damaged files, each named
    (
        "logits-garbage",
        [*INV_M, "--logits-file", "{tmp}/x.npy"],
        {"x.npy": b"garbage" * 20},
        2,
        "x.npy: not a .npy file",
    ),
    (
        "logits-cut",
        [*INV_M, "--logits-file", "{tmp}/x.npy"],
        {"x.npy": logits("cut")},
        2,
        "x.npy: its header describes an array of shape (1, 1, 512)",
    ),
    (
        "logits-huge-header",
        [*INV_M, "--logits-file", "{tmp}/x.npy"],
        {"x.npy": npy_header((10**6, 10**6))},
        2,
        "the file has 128 bytes: cut short",
    ),
    (
        "logits-objects",
        [*INV_M, "--logits-file", "{tmp}/x.npy"],
        {"x.npy": logits("objects")},
        2,
        "x.npy: holds Python objects",
    ),
    (
        "logits-bad-header",
        [*INV_M, "--logits-file", "{tmp}/x.npy"],
        {"x.npy": b"\x93NUMPY\x01\x00\x10\x00{'descr': <f4}  \n"},
        2,
        "x.npy: damaged .npy header",
    ),
    (
        "logits-bool",
        [*INV_M, "--logits-file", "{tmp}/x.npy"],
        {"x.npy": logits("bool")},
        2,
        "x.npy: the logits file holds booleans",
    ),
    (
        "logits-4d",
        [*INV_M, "--logits-file", "{tmp}/x.npy"],
        {"x.npy": logits("4d")},
        2,
        "x.npy: logits must have 1 to 3 dimensions",
    ),
    (
        "logits-empty",
        [*INV_M, "--logits-file", "{tmp}/x.npy"],
        {"x.npy": logits("empty")},
        2,
        "x.npy: observed logits are empty",
    ),
    (
        "logits-wrong-vocab",
        [*INV_M, "--logits-file", "{tmp}/x.npy"],
        {"x.npy": logits("wrong-vocab")},
        2,
        "x.npy: ",
    ),
    (
        "logits-no-values",
        [*INV_M, "--logits-file", "{tmp}/x.safetensors"],
        {"x.safetensors": logits("no-values")},
        2,
        "x.safetensors: expected a tensor named",
    ),
    (
        "preset-bad-yaml",
        [*INV_M, "--tokens", "5", "--preset-file", "{tmp}/p.yaml"],
        {"p.yaml": "a: [1, 2\n"},
        2,
        "p.yaml",
    ),
    (
        "preset-a-list",
        [*INV_M, "--tokens", "5", "--preset-file", "{tmp}/p.yaml"],
        {"p.yaml": "- 1\n- 2\n"},
        2,
        "p.yaml",
    ),
    (
        "preset-not-utf8",
        [*INV_M, "--tokens", "5", "--preset-file", "{tmp}/p.yaml"],
        {"p.yaml": b"temperature: \xff\xfe\n"},
        2,
        "p.yaml",
    ),
    (
        "tune-bad-yaml",
        ["tune", "{tmp}/t.yaml", "--out", "{tmp}/o"],
        {"t.yaml": "a: [1\n"},
        2,
        "t.yaml",
    ),
    (
        "tune-not-a-mapping",
        ["tune", "{tmp}/t.yaml", "--out", "{tmp}/o"],
        {"t.yaml": "just text\n"},
        2,
        "t.yaml",
    ),
    (
        "tune-costs-bad-yaml",
        ["tune", "{tmp}/t.yaml", "--out", "{tmp}/o", "--costs", "{tmp}/c.yaml"],
        {"t.yaml": TUNE, "c.yaml": "a: [1\n"},
        2,
        "c.yaml",
    ),
    (
        "sweep-bad-yaml",
        ["sweep", "plan", "{tmp}/s.yaml", "--no-calibrate"],
        {"s.yaml": "name: [\n"},
        2,
        "s.yaml",
    ),
    (
        "report-damaged-parquet",
        ["report", "{tmp}/r.parquet", "--out", "{tmp}/o"],
        {"r.parquet": b"PAR1 not really"},
        2,
        "r.parquet",
    ),
    (
        "data-source-not-jsonl",
        [*DATA[:3], "nl-id", *DATA[4:], "--model", "{model}", "--source", "{tmp}/src.jsonl"],
        {"src.jsonl": "{broken\n"},
        2,
        "src.jsonl",
    ),
    ("invert-out-a-folder", [*INV_M, "--tokens", "5", "--out", "{tmp}/o"], {"o/x": "x"}, 2, "/o"),
    (
        "train-state-damaged",
        ["train-inverter", "--model", "{model}", "--out", "{tmp}/ck", "--epochs", "1"],
        {"ck/state.json": "{broken", "ck/train_config.json": "{broken"},
        2,
        "ck/",
    ),
    (
        "inverter-checkpoint-damaged",
        [*INV_M, "--tokens", "5", "--algorithm", "inverter", "--param", "checkpoint={tmp}/ck"],
        {"ck/inverter.json": "{broken"},
        2,
        "ck/inverter.json",
    ),
]


def materialise(tmp: Path, files: dict[str, Any]) -> None:
    for name, content in files.items():
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            path.write_text(content)
        elif isinstance(content, bytes):
            path.write_bytes(content)
        elif content[0] == "gguf":
            if not GGUF.is_file():
                pytest.skip("the SmolLM2 GGUF file is not present")
            size = GGUF.stat().st_size // 2 if content[1] == "half" else content[1]
            with GGUF.open("rb") as src, path.open("wb") as dst:
                dst.write(src.read(size))
        elif content[0] == "safetensors":
            save_file(content[1], str(path))
        elif content[0] == "model":
            shutil.copytree(STORIES, path)
            for file in path.iterdir():
                file.chmod(0o644)
            for part, text in content[1].items():
                target = path / part
                if text is None:
                    target.unlink()
                elif text == "vocab-64":  # a config for 64 tokens beside 512-token weights
                    config = json.loads(target.read_text())
                    target.write_text(json.dumps({**config, "vocab_size": 64}))
                elif text == "fifo":
                    target.unlink()
                    os.mkfifo(target)
                elif text == "zip-cut":
                    import torch
                    from safetensors.torch import load_file

                    torch.save(load_file(STORIES / "model.safetensors"), target)
                    data = target.read_bytes()
                    target.write_bytes(data[: len(data) // 2])
                elif isinstance(text, bytes):
                    target.write_bytes(text)
                elif isinstance(text, tuple):
                    data = (STORIES / part).read_bytes()
                    target.write_bytes(data[: int(len(data) * text[1])])
                else:
                    target.write_text(text)


def fill(argv: list[str], tmp: Path) -> list[str]:
    return [a.replace("{tmp}", str(tmp)).replace("{model}", str(STORIES)) for a in argv]


@pytest.mark.parametrize(
    "argv,files,code,message", [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_an_edge_ends_in_one_line_naming_what_it_is_about(
    capsys, tmp_path, monkeypatch, argv, files, code, message
):
    materialise(tmp_path, files)
    monkeypatch.chdir(tmp_path)
    assert code == 2
    err = one_line_error(fill(argv, tmp_path), capsys)
    assert err.startswith("sodaray"), err
    assert message.replace("{tmp}", str(tmp_path)) in err, err


def test_the_table_holds_the_cases():
    assert len(CASES) == len({c[0] for c in CASES}) >= 30


# ---- an empty value is never read as "unset" ----------------------------------------------
def _value_actions() -> list[tuple[list[str], str]]:
    """(subcommand words, option) for every option of every subcommand that takes a value."""
    found: list[tuple[list[str], str]] = []

    def walk(parser: argparse.ArgumentParser, words: list[str]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, [*words, name])
            elif action.option_strings and action.nargs != 0:
                found.append((words, action.option_strings[-1]))

    walk(build_parser(), [])
    return found


VALUE_OPTIONS = _value_actions()


def test_every_subcommand_has_value_options_to_walk():
    commands = {" ".join(words) for words, _ in VALUE_OPTIONS}
    assert {"invert", "report", "sweep run", "sweep plan", "tune", "data build"} <= commands
    assert ("tune", "--storage") in [(" ".join(w), o) for w, o in VALUE_OPTIONS]
    assert len(VALUE_OPTIONS) >= 60


@pytest.mark.parametrize(
    "words,option", VALUE_OPTIONS, ids=[f"{' '.join(w)} {o}" for w, o in VALUE_OPTIONS]
)
def test_an_empty_option_value_is_refused(capsys, words, option):
    for argv in ([*words, option, ""], [*words, f"{option}="]):
        err = one_line_error(argv, capsys)
        assert f"{option}: empty value" in err, err


@pytest.mark.parametrize(
    "argv",
    [["report", ""], ["sweep", "run", ""], ["sweep", "status", ""], ["tune", ""]],
    ids=["report", "sweep-run", "sweep-status", "tune"],
)
def test_an_empty_positional_is_refused(capsys, argv):
    assert "empty value" in one_line_error(argv, capsys)


# ---- --json is JSON -----------------------------------------------------------------------
def _strict(text: str) -> Any:
    def refuse(token: str) -> Any:
        raise ValueError(f"not JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def test_the_json_helper_writes_null_for_every_non_finite_float():
    value = {"a": math.nan, "b": [1.5, math.inf, (-math.inf, np.float32("nan"))], "c": "NaN"}
    text = dumps(value)
    assert _strict(text) == {"a": None, "b": [1.5, None, [None, None]], "c": "NaN"}
    assert finite(np.array([1.0, np.nan])) == [1.0, None]
    with pytest.raises(ValueError):  # what plain json.dumps writes, strict JSON refuses
        _strict(json.dumps(value["b"][:2]))


def test_invert_json_is_json_when_the_loss_diverges(tmp_path, capsys):
    out = tmp_path / "r.parquet"
    argv = ["invert", "--model", str(STORIES), "--device", "cpu", "--max-steps", "3"]
    argv += ["--tokens", "5,6", "--json"]
    assert main([*argv, "--out", str(out), "--param", "learning_rate=1e38"]) == 0
    text = capsys.readouterr().out
    rows = [_strict(line) for line in text.splitlines()]
    assert len(rows) == 1 and rows[0]["final_loss"] is None
    # The run's loss really was not finite: the row on disk keeps it, the JSON line says null.
    assert math.isnan(pq.read_table(out).column("final_loss")[0].as_py())


# ---- a --param over a named preset: used, and said so ---------------------------------------
def test_a_param_over_a_preset_is_used_and_a_note_says_so(capsys):
    argv = [*fill(INV_M, Path(".")), "--tokens", "5", "--json", "--preset", "tinystories-33m"]
    assert main([*argv, "--param", "temperature=0.5"]) == 0
    captured = capsys.readouterr()
    notes = captured.err.strip().splitlines()
    assert notes == [n for n in notes if n.startswith("sodaray: note: temperature: --param's 0.5")]
    assert len(notes) == 1, captured.err
    assert _strict(captured.out.splitlines()[0])["params"]["temperature"] == 0.5


def test_train_inverter_json_of_a_diverged_run_is_json_with_no_best_epoch(tmp_path):
    from sodaray.cli.train import outcome

    history = [
        {"epoch": 1, "train_loss": math.nan, "val_loss": math.nan, "val_exact": 0.0},
        {"epoch": 2, "train_loss": math.inf, "val_loss": None, "val_exact": 0.0},  # read back
    ]
    summary = outcome({"epoch": 2, "history": history, "seconds": 1.0}, 3, tmp_path)
    assert summary["best_epoch"] is None and summary["best"] is None  # best/ never written
    shown = _strict(dumps(summary))
    assert shown["history"][0]["val_loss"] is None and shown["last_epoch"]["train_loss"] is None
    history.append({"epoch": 3, "train_loss": 1.0, "val_loss": 2.0, "val_exact": 0.5})
    best = outcome({"epoch": 3, "history": history}, 3, tmp_path)["best_epoch"]
    assert best is not None and best["epoch"] == 3
