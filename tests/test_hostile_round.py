"""A fourth round of hostile input, as a new user and a cluster operator would write it, on every
command: names no filesystem takes (NUL, 300 bytes, a loop of links), damaged files of each kind
the commands read (model configs and weights, tokenizers, logits in `.npy` and `.safetensors`,
datasets, result rows, study journals and databases, inverter checkpoints), wrong-kind files,
numbers out of range, overrides with odd keys, options that contradict each other, and outputs
of an earlier run left where a new one writes; then signals and two commands on one folder.

A row is (id, argv, the text the error must contain, files to write first), as in
test_hostile_input.py: each ends in exit 2 with one line on stderr naming what is wrong, or
(`OK`) in exit 0; files are written under `{tmp}/in`, output goes to `{tmp}/o`, and after the
row no file lies outside the two. Every row fails before any Ray process starts.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import STORIES, cli_outcome
from test_hostile_input import (
    IN,
    TUNE_FILE,
    files_outside,
    job_json,
    materialise,
    sweep_text,
    tune_text,
    write_rows,
)

pytestmark = pytest.mark.skipif(not STORIES.is_dir(), reason="stories260K not present")

OK = None  # the row's command must succeed (exit 0)
SWEEP_FILE = {"s.yaml": sweep_text()}
PLAN = ["sweep", "plan", f"{IN}/s.yaml", "--no-calibrate"]
RUN = ["sweep", "run", f"{IN}/s.yaml", "--out", "{tmp}/o"]
STATUS = ["sweep", "status", f"{IN}/r"]
TUNE = ["tune", f"{IN}/t.yaml", "--out", "{tmp}/o"]
DRY = [*TUNE, "--dry-run"]
INV = ["invert", "--model", "{model}", "--max-steps", "3"]
INV_TOK = [*INV, "--tokens", "172"]
MINV = ["invert", "--model", f"{IN}/m", "--tokens", "1", "--max-steps", "3"]
DATA = ["data", "build", "--model", "{model}", "--dataset", "random", "--lengths", "1"]
DATA_O = [*DATA, "--per-length", "2", "--out", "{tmp}/o/d.parquet"]
NL = ["data", "build", "--model", "{model}", "--dataset", "nl-id", "--lengths", "1"]
NL_O = [*NL, "--per-length", "1", "--out", "{tmp}/o/d.parquet"]
REPORT = ["report", f"{IN}/rows.parquet", "--out", "{tmp}/o", "--no-figures"]
TRAIN = ["train-inverter", "--model", "{model}", "--out", "{tmp}/o/inv", "--shape", "tiny"]
TRAIN_Q = [*TRAIN, "--lengths", "1", "--per-length", "2", "--epochs", "1", "--batch-size", "2"]
ROWS = {"rows.parquet": "rows"}
LONG = "n" * 300  # longer than any file name a Linux filesystem takes (255 bytes)


STATE = '{"epoch": 1, "best_val": 1.0, "history": [], "seconds": 1.0}'


def costs_text(flops: str = "1e12") -> str:
    return (
        "device: d\nkind: cpu\nsource: s\nprecisions:\n"
        f"  float32: {{pass_seconds: 0.001, layer_seconds: 0.0, flops_per_second: {flops}}}\n"
    )


def with_dataset(kind: str) -> dict[str, str]:
    """A sweep over the dataset file `d.parquet`, written as `kind` says."""
    return {
        "d.parquet": kind,
        "s.yaml": sweep_text(dataset='{name: d, path: "{tmp}/in/d.parquet"}'),
    }


def with_model(kind: str, key: str = "m") -> dict[str, str]:
    return {key: kind}


CASES: list[tuple[str, list[str], str | None, dict[str, str]]] = [
    # ---- names no filesystem takes: NUL bytes, 300-byte names, links that loop
    (
        "sweep-model-id-nul",
        PLAN,
        "models[0].id",
        {"s.yaml": sweep_text(model='{id: "{model}\\0x"}')},
    ),
    (
        "sweep-dataset-path-nul",
        PLAN,
        "datasets[0].path",
        {"s.yaml": sweep_text(dataset='{name: d, path: "{tmp}/in/d\\0.parquet"}')},
    ),
    (
        "sweep-preset-file-nul",
        PLAN,
        "preset_file",
        {"s.yaml": sweep_text(model='{id: "{model}", preset_file: "p\\0.yaml"}')},
    ),
    ("sweep-include-nul", PLAN, "include", {"s.yaml": 'include: ["b\\0.yaml"]\n' + sweep_text()}),
    (
        "tune-model-id-nul",
        DRY,
        "model.id",
        {"t.yaml": tune_text().replace("{model}", "{model}\\0")},
    ),
    ("invert-model-nul", ["invert", "--model", "m\0x", "--tokens", "1"], "cannot load model", {}),
    (
        "invert-out-nul",
        [*INV_TOK, "--out", "{tmp}/o/r\0.parquet"],
        "a path cannot hold a NUL byte",
        {},
    ),
    (
        "report-results-nul",
        ["report", "{tmp}/in/r\0.parquet", "--out", "{tmp}/o"],
        "no such result file",
        {},
    ),
    ("sweep-name-300-bytes", RUN, "name", {"s.yaml": sweep_text(name=LONG)}),
    (
        "sweep-model-name-300-bytes",
        RUN,
        "models[0].name",
        {"s.yaml": sweep_text(model='{id: "{model}", name: "' + LONG + '"}')},
    ),
    (
        "sweep-dataset-name-300-bytes",
        RUN,
        "datasets[0].name",
        {
            "s.yaml": sweep_text(
                dataset="{name: " + LONG + ', build: {dataset: random, lengths: "1"}}'
            )
        },
    ),
    ("tune-name-300-bytes", TUNE, "name", {"t.yaml": tune_text(name=LONG)}),
    (
        "invert-out-300-bytes",
        [*INV_TOK, "--out", "{tmp}/o/" + LONG + ".parquet"],
        "is 308 bytes; a file or folder name is at most 255",
        {},
    ),
    (
        "data-out-300-bytes",
        [*DATA, "--out", "{tmp}/o/" + LONG + ".parquet"],
        "is 308 bytes; a file or folder name is at most 255",
        {},
    ),
    (
        "report-out-300-bytes",
        [*REPORT[:2], "--out", "{tmp}/o/" + LONG],
        "is 300 bytes; a file or folder name is at most 255",
        ROWS,
    ),
    ("sweep-name-leading-dash", PLAN, OK, {"s.yaml": sweep_text(name="-rf")}),
    (
        "invert-model-link-loop",
        ["invert", "--model", f"{IN}/m", "--tokens", "1"],
        "m",
        {"m": "loop"},
    ),
    ("sweep-file-link-loop", ["sweep", "plan", f"{IN}/s.yaml"], "s.yaml", {"s.yaml": "loop"}),
    ("tune-file-link-loop", TUNE, "t.yaml", {"t.yaml": "loop"}),
    ("logits-link-loop", [*INV, "--logits-file", f"{IN}/l.npy"], "l.npy", {"l.npy": "loop"}),
    (
        "preset-file-link-loop",
        [*INV_TOK, "--preset-file", f"{IN}/p.yaml"],
        "p.yaml",
        {"p.yaml": "loop"},
    ),
    ("report-link-loop", REPORT, "rows.parquet", {"rows.parquet": "loop"}),
    ("status-link-loop", STATUS, "r", {"r": "loop"}),
    (
        "costs-link-loop",
        [*PLAN, "--costs", f"{IN}/c.yaml"],
        "c.yaml",
        {**SWEEP_FILE, "c.yaml": "loop"},
    ),
    (
        "data-source-link-loop",
        [*NL_O, "--source", f"{IN}/src.jsonl"],
        "src.jsonl",
        {"src.jsonl": "loop"},
    ),
    ("dataset-path-link-loop", PLAN, "d.parquet", with_dataset("loop")),
    (
        "journal-link-loop",
        [*TUNE, "--storage", f"{IN}/j.journal"],
        "j.journal",
        {**TUNE_FILE, "j.journal": "loop"},
    ),
    ("out-link-loop", [*INV_TOK, "--out", f"{IN}/o.parquet"], "o.parquet", {"o.parquet": "loop"}),
    (
        "train-out-link-loop",
        [*TRAIN_Q[:3], "--out", f"{IN}/ck", *TRAIN_Q[5:]],
        "ck",
        {"ck": "loop"},
    ),
    # ---- damaged model folders: config, weights, tokenizer
    ("model-config-not-json", MINV, "config.json", {"m": "model-config:{not json"}),
    ("model-config-a-list", MINV, "config.json", {"m": "model-config:[1, 2]"}),
    ("model-config-nested", MINV, "config.json", {"m": "model-config:" + "[" * 100_000}),
    ("model-config-a-fifo", MINV, "config.json", {"m": "model-config:fifo"}),
    ("model-config-a-directory", MINV, "config.json", {"m": "model-config:dir"}),
    (
        "model-config-unknown-type",
        MINV,
        "nosuchfamily",
        {"m": 'model-config:{"model_type": "nosuchfamily"}'},
    ),
    (
        "model-config-vocab-negative",
        MINV,
        "config.json: vocab_size must be a whole number from 1",
        {"m": "model-patch:vocab_size=-5"},
    ),
    ("model-config-vocab-a-string", MINV, "m", {"m": 'model-patch:vocab_size="many"'}),
    ("model-config-hidden-zero", MINV, "m", {"m": "model-patch:hidden_size=0"}),
    (
        "model-config-layers-huge",
        MINV,
        "num_hidden_layers must be a whole number from 1 to 10,000",
        {"m": "model-patch:num_hidden_layers=1000000000"},
    ),
    ("model-config-context-zero", MINV, "m", {"m": "model-patch:max_position_embeddings=0"}),
    ("model-config-utf16", MINV, "config.json", {"m": "model-config:utf16"}),
    ("weights-header-claims-exabytes", MINV, "model.safetensors", {"m": "model-st:huge-header"}),
    ("weights-header-not-json", MINV, "model.safetensors", {"m": "model-st:garbage-header"}),
    ("weights-header-nested", MINV, "model.safetensors", {"m": "model-st:nested-header"}),
    ("weights-offsets-past-end", MINV, "model.safetensors", {"m": "model-st:offsets"}),
    ("weights-zero-bytes", MINV, "model.safetensors", {"m": "model-st:empty"}),
    ("weights-a-fifo", MINV, "holds no weights", {"m": "model-st:fifo"}),
    ("weights-a-directory", MINV, "holds no weights", {"m": "model-st:dir"}),
    ("weights-another-shape", MINV, "model.safetensors", {"m": "model-st:other-shape"}),
    ("tokenizer-json-garbage", MINV, "tokenizer.json", {"m": "model-tok:{not json"}),
    ("tokenizer-json-a-list", MINV, "tokenizer.json", {"m": "model-tok:[]"}),
    ("tokenizer-json-a-fifo", MINV, "tokenizer.json", {"m": "model-tok:fifo"}),
    (
        "data-build-tokenizer-garbage",
        [*DATA_O[:3], f"{IN}/m", *DATA_O[4:]],
        "tokenizer",
        {"m": "model-tok:{not json"},
    ),
    (
        "plan-model-config-garbage",
        PLAN,
        "config.json",
        {"m": "model-config:{", "s.yaml": sweep_text(model='{id: "{tmp}/in/m"}')},
    ),
    (
        "gguf-wrong-magic",
        ["invert", "--model", f"{IN}/m.gguf", "--tokens", "1"],
        "m.gguf",
        {"m.gguf": "not a gguf file at all\n" * 10},
    ),
    (
        "gguf-file-escapes-folder",
        ["invert", "--model", "{model}", "--gguf-file", "../" * 40 + "etc/passwd", "--tokens", "1"],
        "not a GGUF model file",
        {},
    ),
    # ---- damaged and wrong observed logits
    (
        "logits-wrong-vocab",
        [*INV, "--logits-file", f"{IN}/l.npy"],
        "l.npy",
        {"l.npy": "npy:vocab-511"},
    ),
    ("logits-nan", [*INV, "--logits-file", f"{IN}/l.npy"], "l.npy", {"l.npy": "npy:nan"}),
    ("logits-inf", [*INV, "--logits-file", f"{IN}/l.npy"], "l.npy", {"l.npy": "npy:inf"}),
    (
        "logits-pickled-objects",
        [*INV, "--logits-file", f"{IN}/l.npy"],
        "l.npy",
        {"l.npy": "npy:object"},
    ),
    (
        "logits-header-claims-terabytes",
        [*INV, "--logits-file", f"{IN}/l.npy"],
        "l.npy",
        {"l.npy": "npy:huge"},
    ),
    (
        "logits-truncated",
        [*INV, "--logits-file", f"{IN}/l.npy"],
        "l.npy",
        {"l.npy": "npy:truncated"},
    ),
    ("logits-not-npy", [*INV, "--logits-file", f"{IN}/l.npy"], "l.npy", {"l.npy": "just text\n"}),
    ("logits-zip-named-npy", [*INV, "--logits-file", f"{IN}/l.npy"], "l.npy", {"l.npy": "npy:npz"}),
    (
        "logits-zero-positions",
        [*INV, "--logits-file", f"{IN}/l.npy"],
        "l.npy",
        {"l.npy": "npy:zero-rows"},
    ),
    (
        "logits-unknown-suffix",
        [*INV, "--logits-file", f"{IN}/l.txt"],
        "not '.txt'",
        {"l.txt": "1 2 3\n"},
    ),
    (
        "safetensors-logits-two-tensors",
        [*INV, "--logits-file", f"{IN}/l.safetensors"],
        "l.safetensors",
        {"l.safetensors": "stl:two"},
    ),
    (
        "safetensors-logits-none",
        [*INV, "--logits-file", f"{IN}/l.safetensors"],
        "l.safetensors",
        {"l.safetensors": "stl:none"},
    ),
    (
        "safetensors-logits-huge-header",
        [*INV, "--logits-file", f"{IN}/l.safetensors"],
        "l.safetensors",
        {"l.safetensors": "model-st-file:huge-header"},
    ),
    (
        "safetensors-logits-truncated",
        [*INV, "--logits-file", f"{IN}/l.safetensors"],
        "l.safetensors",
        {"l.safetensors": "stl:truncated"},
    ),
    # ---- invert: numbers out of range, options that contradict each other
    ("tokens-out-of-vocab", [*INV, "--tokens", "512"], "512", {}),
    (
        "tokens-huge-id",
        [*INV, "--tokens", "9" * 30],
        "token id 999999999999999999999999999999 is outside",
        {},
    ),
    ("tokens-over-context", [*INV, "--tokens", ",".join(["5"] * 600)], "context", {}),
    ("top-k-zero", [*INV_TOK, "--top-k", "0"], "top", {}),
    ("top-k-over-vocab", [*INV_TOK, "--top-k", "100000"], "top", {}),
    ("output-tokens-zero", [*INV_TOK, "--output-tokens", "0"], "output", {}),
    ("output-tokens-negative", [*INV_TOK, "--output-tokens", "-2"], "output", {}),
    ("max-batch-size-zero", [*INV_TOK, "--max-batch-size", "0"], "batch", {}),
    ("max-steps-zero", [*INV_TOK[:4], "0", *INV_TOK[5:]], "max", {}),
    ("length-zero", [*INV_TOK, "--length", "0"], "length", {}),
    ("length-negative", [*INV_TOK, "--length", "-3"], "length", {}),
    ("max-length-zero", [*INV_TOK, "--length", "auto", "--max-length", "0"], "length", {}),
    ("max-length-without-auto", [*INV_TOK, "--max-length", "4"], "--max-length", {}),
    (
        "top-k-with-text-objective",
        [*INV, "--output-text", "hi", "--objective", "text", "--top-k", "5"],
        "top",
        {},
    ),
    (
        "output-text-with-logits-objective",
        [*INV, "--output-text", "hi", "--objective", "logits"],
        "output",
        {},
    ),
    (
        "logits-file-and-tokens",
        [*INV_TOK, "--logits-file", f"{IN}/l.npy"],
        "logits",
        {"l.npy": "npy:ok"},
    ),
    (
        "preset-and-preset-file",
        [*INV_TOK, "--preset", "tinystories-33m", "--preset-file", f"{IN}/p.yaml"],
        "preset",
        {"p.yaml": "soda: {temperature: 0.1}\n"},
    ),
    ("preset-unknown", [*INV_TOK, "--preset", "no-such-preset"], "no-such-preset", {}),
    ("preset-a-path-escape", [*INV_TOK, "--preset", "../../etc/passwd"], "preset", {}),
    ("algorithm-unknown", [*INV_TOK, "--algorithm", "bogo"], "bogo", {}),
    ("inverter-no-checkpoint", [*INV_TOK, "--algorithm", "inverter"], "checkpoint", {}),
    (
        "inverter-checkpoint-missing",
        [*INV_TOK, "--algorithm", "inverter", "--param", "checkpoint={tmp}/none"],
        "none",
        {},
    ),
    (
        "inverter-checkpoint-garbage-config",
        [
            *INV,
            "--tokens",
            "1",
            "--objective",
            "text",
            "--algorithm",
            "inverter",
            "--param",
            "checkpoint={tmp}/in/ck",
        ],
        "ck",
        {"ck/inverter.json": "{garbage"},
    ),
    ("param-no-equals", [*INV_TOK, "--param", "temperature"], "--param", {}),
    ("param-empty-key", [*INV_TOK, "--param", "=0.1"], "unknown soda parameter ''", {}),
    ("param-dunder-key", [*INV_TOK, "--param", "__class__=1"], "__class__", {}),
    ("param-dotted-key", [*INV_TOK, "--param", "soda.temperature=0.1"], "soda.temperature", {}),
    (
        "param-for-another-algorithm",
        [*INV_TOK, "--algorithm", "gcg", "--param", "temperature=0.1"],
        "temperature",
        {},
    ),
    (
        "param-given-twice",
        [*INV_TOK, "--param", "temperature=0.1", "--param", "temperature=0.2"],
        "temperature",
        {},
    ),
    ("dataset-label-newline", [*INV_TOK, "--dataset-label", "a\nb"], "--dataset-label", {}),
    ("device-cuda-without-gpu", [*INV_TOK, "--device", "cuda:7"], "cuda", {}),
    ("prompt-nul", [*INV, "--prompt", "a\0b"], OK, {}),
    # ---- data build
    ("data-dataset-unknown", [*DATA_O[:5], "bogus", *DATA_O[6:]], "bogus", {}),
    ("data-per-length-zero", [*DATA, "--per-length", "0", "--out", "{tmp}/o/d.parquet"], "per", {}),
    (
        "data-per-length-negative",
        [*DATA, "--per-length", "-4", "--out", "{tmp}/o/d.parquet"],
        "per",
        {},
    ),
    ("data-lengths-reversed", [*DATA_O[:6], "--lengths", "5-1", *DATA_O[8:]], "5-1", {}),
    ("data-lengths-zero", [*DATA_O[:6], "--lengths", "0", *DATA_O[8:]], "0", {}),
    ("data-seed-negative", [*DATA_O, "--seed", "-1"], "seed", {}),
    ("data-seed-huge", [*DATA_O, "--seed", "9" * 30], "seed", {}),
    ("data-records-for-random", [*DATA_O, "--records", "prefix"], "--records", {}),
    (
        "data-source-for-random",
        [*DATA_O, "--source", f"{IN}/d.jsonl"],
        "--source",
        {"d.jsonl": '{"text": "a b"}\n'},
    ),
    ("data-synthetic-for-nl", [*NL_O, "--source", "synthetic"], "synthetic", {}),
    (
        "data-jsonl-invalid-utf8",
        [*NL_O, "--source", f"{IN}/d.jsonl"],
        "d.jsonl: not UTF-8 text",
        {"d.jsonl": "bytes:\xff\xfe{\n"},
    ),
    ("data-jsonl-empty", [*NL_O, "--source", f"{IN}/d.jsonl"], "d.jsonl", {"d.jsonl": ""}),
    (
        "data-jsonl-no-text-key",
        [*NL_O, "--source", f"{IN}/d.jsonl"],
        "d.jsonl",
        {"d.jsonl": '{"body": "a b c"}\n'},
    ),
    (
        "data-jsonl-a-list-line",
        [*NL_O, "--source", f"{IN}/d.jsonl"],
        "d.jsonl",
        {"d.jsonl": "[1, 2]\n"},
    ),
    (
        "data-csv-no-text-column",
        [*NL_O, "--source", f"{IN}/d.csv"],
        OK,
        {"d.csv": "a,b\n1,2\n"},
    ),
    (
        "data-csv-binary",
        [*NL_O, "--source", f"{IN}/d.csv"],
        "holds NUL bytes",
        {"d.csv": "bytes:\x00\x01\x02text\n\x00"},
    ),
    (
        "data-source-a-parquet",
        [*NL_O, "--source", f"{IN}/d.parquet"],
        "d.parquet: not UTF-8 text",
        {"d.parquet": "parquet-other"},
    ),
    (
        "data-source-blank-lines",
        [*NL_O, "--source", f"{IN}/d.txt"],
        "d.txt",
        {"d.txt": "\n\n   \n"},
    ),
    ("data-out-not-parquet", [*DATA, "--out", "{tmp}/o/d.csv"], "--out", {}),
    # ---- sweep files: shapes, numbers, names, includes, overrides
    ("sweep-top-level-list", PLAN, "s.yaml", {"s.yaml": "- a\n- b\n"}),
    ("sweep-empty-file", PLAN, "s.yaml", {"s.yaml": ""}),
    ("sweep-only-comments", PLAN, "s.yaml", {"s.yaml": "# nothing\n"}),
    (
        "sweep-no-models",
        PLAN,
        "models",
        {"s.yaml": sweep_text().replace("models: [", "models: [] #")},
    ),
    (
        "sweep-max-steps-zero",
        PLAN,
        "max_steps",
        {"s.yaml": sweep_text().replace("max_steps: 5", "max_steps: 0")},
    ),
    (
        "sweep-max-steps-bool",
        PLAN,
        "max_steps",
        {"s.yaml": sweep_text().replace("max_steps: 5", "max_steps: true")},
    ),
    (
        "sweep-max-steps-1e30",
        PLAN,
        "max_steps",
        {"s.yaml": sweep_text().replace("max_steps: 5", "max_steps: 1e30")},
    ),
    ("sweep-shard-size-zero", PLAN, "shard_size", {"s.yaml": sweep_text(extra="shard_size: 0\n")}),
    ("sweep-seeds-negative", PLAN, "seeds", {"s.yaml": sweep_text(extra="seeds: [-1]\n")}),
    ("sweep-seeds-huge", PLAN, "seeds", {"s.yaml": sweep_text(extra="seeds: [1e30]\n")}),
    (
        "sweep-num-cpus-zero",
        PLAN,
        "num_cpus",
        {"s.yaml": sweep_text(model='{id: "{model}", num_cpus: 0}')},
    ),
    (
        "sweep-replicas-zero",
        PLAN,
        "replicas",
        {"s.yaml": sweep_text(model='{id: "{model}", replicas: 0}')},
    ),
    ("sweep-algorithm-unknown", PLAN, "bogo", {"s.yaml": sweep_text(algorithm="{name: bogo}")}),
    (
        "sweep-grid-empty-list",
        PLAN,
        "temperature",
        {"s.yaml": sweep_text(algorithm="{name: soda, grid: {temperature: []}}")},
    ),
    (
        "sweep-grid-unknown-param",
        PLAN,
        "colour",
        {"s.yaml": sweep_text(algorithm="{name: soda, grid: {colour: [1]}}")},
    ),
    ("sweep-unknown-top-key", PLAN, "colour", {"s.yaml": sweep_text(extra="colour: blue\n")}),
    ("sweep-include-itself", PLAN, "s.yaml", {"s.yaml": "include: [s.yaml]\n" + sweep_text()}),
    (
        "sweep-include-cycle",
        PLAN,
        "yaml",
        {"s.yaml": "include: [b.yaml]\n" + sweep_text(), "b.yaml": "include: [s.yaml]\n"},
    ),
    (
        "sweep-include-dev-zero",
        PLAN,
        "/dev/zero",
        {"s.yaml": "include: [/dev/zero]\n" + sweep_text()},
    ),
    (
        "sweep-dataset-two-sources",
        PLAN,
        "datasets[0]",
        {
            "s.yaml": sweep_text(
                dataset='{name: d, path: "{tmp}/in/d.parquet", '
                'build: {dataset: random, lengths: "1"}}'
            ),
            "d.parquet": "dataset-ok",
        },
    ),
    (
        "sweep-two-datasets-one-name",
        PLAN,
        "datasets",
        {
            "s.yaml": sweep_text(
                dataset='{name: r, build: {dataset: random, lengths: "1"}}, '
                '{name: r, build: {dataset: random, lengths: "2"}}'
            )
        },
    ),
    (
        "sweep-two-models-one-name",
        PLAN,
        "models",
        {"s.yaml": sweep_text(model='{id: "{model}", name: m}, {id: "{model}", name: m}')},
    ),
    ("override-no-equals", [*PLAN, "max_steps"], "max_steps", SWEEP_FILE),
    ("override-empty-key", [*PLAN, "=5"], "=5", SWEEP_FILE),
    ("override-key-double-dot", [*PLAN, "models..bos=true"], "models..bos", SWEEP_FILE),
    ("override-unknown-model", [*PLAN, "models.nosuch.bos=true"], "nosuch", SWEEP_FILE),
    ("override-max-steps-1e400", [*PLAN, "max_steps=1e400"], "max_steps", SWEEP_FILE),
    ("override-models-null", [*PLAN, "models=null"], "models", SWEEP_FILE),
    (
        "override-yaml-tag",
        [*PLAN, "description=!!python/object/apply:os.system [id]"],
        "description",
        SWEEP_FILE,
    ),
    ("override-unknown-key", [*PLAN, "colour=blue"], "colour", SWEEP_FILE),
    ("plan-limit-zero", [*PLAN, "--limit", "0"], "--limit", SWEEP_FILE),
    ("plan-limit-negative", [*PLAN, "--limit", "-1"], "--limit", SWEEP_FILE),
    ("plan-max-steps-zero", [*PLAN, "--max-steps", "0"], "--max-steps", SWEEP_FILE),
    ("plan-rate-zero", ["sweep", "plan", f"{IN}/s.yaml", "--rate", "0"], "--rate", SWEEP_FILE),
    ("plan-rate-and-no-calibrate", [*PLAN, "--rate", "5"], "--rate", SWEEP_FILE),
    ("plan-model-missing", [*PLAN, "--model", "{tmp}/none"], "none", SWEEP_FILE),
    ("run-max-attempts-zero", [*RUN, "--max-attempts", "0"], "--max-attempts", SWEEP_FILE),
    ("run-limit-negative", [*RUN, "--limit", "-3"], "--limit", SWEEP_FILE),
    ("run-max-steps-negative", [*RUN, "--max-steps", "-3"], "--max-steps", SWEEP_FILE),
    (
        "run-wait-for-nodes-inf",
        [*RUN, "--wait-for-nodes", "inf", "--address", "127.0.0.1:1"],
        "--wait-for-nodes",
        SWEEP_FILE,
    ),
    ("run-out-is-dev-null", [*RUN[:3], "--out", "/dev/null"], "/dev/null", SWEEP_FILE),
    (
        "run-mlflow-experiment-newline",
        [*RUN, "--mlflow", "sqlite:///{tmp}/o/m.db", "--mlflow-experiment", "a\nb"],
        "--mlflow-experiment",
        SWEEP_FILE,
    ),
    # ---- datasets a sweep reads: damaged, of another model, tampered
    ("dataset-zero-bytes", PLAN, "d.parquet", with_dataset("")),
    ("dataset-text-named-parquet", PLAN, "d.parquet", with_dataset("name,tokens\na,1\n")),
    ("dataset-negative-token", RUN, "token id -7 is negative", with_dataset("dataset-negative")),
    ("dataset-other-vocab", PLAN, "vocab", with_dataset("dataset-vocab-50000")),
    (
        "dataset-length-disagrees",
        RUN,
        "sample_id 0 has length 3 but 1 tokens",
        with_dataset("dataset-length-wrong"),
    ),
    ("dataset-tokens-null", RUN, "tokens is null in a row", with_dataset("dataset-null-tokens")),
    ("dataset-hash-tampered", RUN, "d.parquet", with_dataset("dataset-tampered")),
    ("dataset-no-version", PLAN, "d.parquet", with_dataset("dataset-no-version")),
    # ---- sweep status on damaged results folders
    ("status-empty-folder", STATUS, "r", {"r": "dir"}),
    ("status-job-json-a-list", STATUS, "job.json", {"r/s/.sodaray/jobs/j/job.json": "[1]"}),
    (
        "status-shards-negative",
        STATUS,
        "job.json",
        {"r/s/.sodaray/jobs/j/job.json": job_json(shards=-1)},
    ),
    (
        "status-shard-size-zero",
        STATUS,
        "job.json",
        {"r/s/.sodaray/jobs/j/job.json": job_json(shard_size=0)},
    ),
    (
        "status-samples-a-string",
        STATUS,
        "job.json",
        {"r/s/.sodaray/jobs/j/job.json": job_json(samples="x")},
    ),
    ("status-job-json-a-fifo", STATUS, "job.json", {"r/s/.sodaray/jobs/j/job.json": "fifo"}),
    (
        "status-job-json-nul",
        STATUS,
        "job.json",
        {"r/s/.sodaray/jobs/j/job.json": "bytes:\x00\x00\x00"},
    ),
    # ---- tune: spaces, numbers, studies and databases
    ("tune-space-empty", DRY, "space", {"t.yaml": tune_text(space="{}")}),
    (
        "tune-space-unknown-param",
        DRY,
        "colour",
        {"t.yaml": tune_text(space="{colour: {low: 1, high: 2}}")},
    ),
    (
        "tune-low-above-high",
        DRY,
        "learning_rate",
        {"t.yaml": tune_text(space="{learning_rate: {low: 0.5, high: 0.1}}")},
    ),
    (
        "tune-log-low-zero",
        DRY,
        "learning_rate",
        {"t.yaml": tune_text(space="{learning_rate: {low: 0, high: 0.1, log: true}}")},
    ),
    (
        "tune-categorical-empty",
        DRY,
        "temperature",
        {"t.yaml": tune_text(space="{temperature: {choices: []}}")},
    ),
    (
        "tune-type-unknown",
        DRY,
        "temperature",
        {"t.yaml": tune_text(space="{temperature: {type: complex, low: 1, high: 2}}")},
    ),
    ("tune-trials-zero", DRY, "trials", {"t.yaml": tune_text().replace("trials: 1", "trials: 0")}),
    ("tune-cli-trials-negative", [*DRY, "--trials", "-2"], "--trials", TUNE_FILE),
    ("tune-workers-zero", [*DRY, "--workers", "0"], "--workers", TUNE_FILE),
    ("tune-sampler-unknown", DRY, "sampler", {"t.yaml": tune_text(extra="sampler: magic\n")}),
    ("tune-metric-unknown", DRY, "metric", {"t.yaml": tune_text(extra="metric: happiness\n")}),
    ("tune-evaluate-and-dry-run", [*TUNE, "--evaluate", "--dry-run"], "--dry-run", TUNE_FILE),
    ("tune-evaluate-no-study", [*TUNE, "--evaluate"], "study", TUNE_FILE),
    (
        "tune-rate-without-dry-run",
        [*TUNE, "--rate", "5", "--address", "127.0.0.1:1"],
        "--rate",
        TUNE_FILE,
    ),
    ("tune-override-odd-key", [*DRY, "space..x=1"], "space..x", TUNE_FILE),
    (
        "tune-start-from-garbage",
        DRY,
        "p.yaml",
        {
            "t.yaml": tune_text(extra='start_from: "{tmp}/in/p.yaml"\n'),
            "p.yaml": "soda: [not, a, mapping]\n",
        },
    ),
    (
        "tune-journal-garbage",
        [*TUNE, "--storage", f"{IN}/j.journal"],
        "j.journal",
        {**TUNE_FILE, "j.journal": "this is not a journal\n"},
    ),
    (
        "tune-journal-binary",
        [*TUNE, "--storage", f"{IN}/j.journal"],
        "j.journal",
        {**TUNE_FILE, "j.journal": "bytes:\x00\xff\x00\xfe"},
    ),
    (
        "tune-journal-truncated-line",
        [*TUNE, "--storage", f"{IN}/j.journal"],
        "j.journal",
        {
            **TUNE_FILE,
            "j.journal": '{"op_code": 0, "worker_id": "w", "study_name": "t", "directions": [1]}\n'
            '{"op_code": 4, "wor',
        },
    ),
    (
        "tune-sqlite-not-a-database",
        [*TUNE, "--storage", "sqlite:///{tmp}/in/s.db"],
        "s.db",
        {**TUNE_FILE, "s.db": "this is not sqlite\n" * 20},
    ),
    (
        "tune-sqlite-a-directory",
        [*TUNE, "--storage", "sqlite:///{tmp}/in/s.db"],
        "s.db",
        {**TUNE_FILE, "s.db": "dir"},
    ),
    ("tune-out-dev-null", ["tune", f"{IN}/t.yaml", "--out", "/dev/null"], "/dev/null", TUNE_FILE),
    # ---- report: damaged rows, wrong-kind inputs, numbers
    ("report-zero-byte-parquet", REPORT, "rows.parquet", {"rows.parquet": ""}),
    ("report-csv-named-parquet", REPORT, "rows.parquet", {"rows.parquet": "a,b\n1,2\n"}),
    ("report-empty-folder", ["report", f"{IN}/r", "--out", "{tmp}/o"], "r", {"r": "dir"}),
    ("report-a-dataset-file", REPORT, "rows.parquet", {"rows.parquet": "dataset-ok"}),
    ("report-nan-seconds", [*REPORT, "--json"], OK, {"rows.parquet": "rows-nan-seconds"}),
    ("report-found-null", REPORT, "found", {"rows.parquet": "rows-found-null"}),
    ("report-extrapolate-nan", [*REPORT, "--extrapolate", "nan"], "--extrapolate", ROWS),
    ("report-extrapolate-huge", [*REPORT, "--extrapolate", "1e300"], "--extrapolate", ROWS),
    ("report-format-repeated", [*REPORT, "--format", "md,md"], OK, ROWS),
    (
        "report-out-is-the-rows-file",
        ["report", f"{IN}/rows.parquet", "--out", f"{IN}/rows.parquet"],
        "rows.parquet",
        ROWS,
    ),
    ("report-out-dev-null", [*REPORT[:2], "--out", "/dev/null"], "/dev/null", ROWS),
    # ---- train-inverter: numbers, conflicts, a damaged checkpoint left by an earlier run
    ("train-shape-unknown", [*TRAIN_Q[:-2], "--shape", "huge"], "huge", {}),
    ("train-batch-size-zero", [*TRAIN_Q[:-2], "--batch-size", "0"], "batch", {}),
    ("train-lr-nan", [*TRAIN_Q, "--lr", "nan"], "lr", {}),
    ("train-lr-negative", [*TRAIN_Q, "--lr", "-0.1"], "lr", {}),
    ("train-weight-decay-inf", [*TRAIN_Q, "--weight-decay", "inf"], "weight", {}),
    ("train-warmup-negative", [*TRAIN_Q, "--warmup-steps", "-1"], "warmup", {}),
    (
        "train-max-seconds-nan",
        [*TRAIN_Q, "--max-seconds", "nan"],
        "max_seconds must be a finite number",
        {},
    ),
    ("train-threads-zero", [*TRAIN_Q, "--threads", "0"], "threads", {}),
    ("train-per-length-zero", [*TRAIN_Q[:9], "--per-length", "0", *TRAIN_Q[11:]], "per", {}),
    ("train-output-tokens-zero", [*TRAIN_Q, "--output-tokens", "0"], "output", {}),
    (
        "train-mlp-hidden-for-text",
        [*TRAIN_Q, "--observation", "text", "--mlp-hidden", "64"],
        "--mlp-hidden",
        {},
    ),
    (
        "train-mlp-hidden-zero",
        [*TRAIN_Q, "--observation", "logits", "--mlp-hidden", "0"],
        "mlp",
        {},
    ),
    ("train-device-unknown", [*TRAIN_Q, "--device", "tpu"], "tpu", {}),
    (
        "train-lengths-over-context",
        [*TRAIN_Q[:7], "--lengths", "600", *TRAIN_Q[9:]],
        "context",
        {},
    ),
    ("train-out-is-a-file", [*TRAIN_Q[:3], "--out", f"{IN}/f", *TRAIN_Q[5:]], "f", {"f": "x"}),
    # ---- files of the wrong kind, each given where another is expected
    ("status-on-a-report-folder", STATUS, "no sweep jobs", {"r/model.md": "| a |\n"}),
    (
        "report-on-a-sweep-file",
        ["report", f"{IN}/s.yaml", "--out", "{tmp}/o"],
        "s.yaml",
        SWEEP_FILE,
    ),
    ("plan-on-a-tuning-file", ["sweep", "plan", f"{IN}/t.yaml"], "t.yaml", TUNE_FILE),
    ("tune-on-a-sweep-file", ["tune", f"{IN}/s.yaml", "--out", "{tmp}/o"], "s.yaml", SWEEP_FILE),
    ("preset-file-is-a-sweep", [*INV_TOK, "--preset-file", f"{IN}/s.yaml"], "s.yaml", SWEEP_FILE),
    ("costs-file-is-a-sweep", [*PLAN, "--costs", f"{IN}/s.yaml"], "s.yaml", SWEEP_FILE),
    (
        "data-model-is-a-dataset",
        [*DATA_O[:3], f"{IN}/d.parquet", *DATA_O[4:]],
        "d.parquet",
        {"d.parquet": "dataset-ok"},
    ),
    (
        "model-is-a-results-folder",
        PLAN,
        "holds no config.json",
        {"m/rows.parquet": "rows", "s.yaml": sweep_text(model='{id: "{tmp}/in/m"}')},
    ),
    (
        "logits-file-is-a-dataset",
        [*INV, "--logits-file", f"{IN}/d.parquet"],
        "not '.parquet'",
        {"d.parquet": "dataset-ok"},
    ),
    (
        "dataset-path-is-result-rows",
        PLAN,
        "d.parquet",
        {
            "d.parquet": "rows",
            "s.yaml": sweep_text(dataset='{name: d, path: "{tmp}/in/d.parquet"}'),
        },
    ),
    (
        "inverter-checkpoint-is-a-model",
        [
            *INV,
            "--tokens",
            "1",
            "--objective",
            "text",
            "--algorithm",
            "inverter",
            "--param",
            "checkpoint={model}",
        ],
        "inverter",
        {},
    ),
    # ---- names a filesystem takes that the code may not: wide characters, a leading dash
    (
        "invert-out-wide-unicode-name",
        [*INV_TOK, "--out", "{tmp}/o/" + "日" * 82 + ".parquet"],
        OK,
        {},
    ),
    ("data-out-leading-dash", [*DATA_O[:-1], "{tmp}/o/-d.parquet"], OK, {}),
    # ---- result rows that contradict themselves
    ("report-steps-negative", REPORT, "steps", {"rows.parquet": "rows-set:steps=-5"}),
    (
        "report-exact-but-not-found",  # a find the match check turned down: a result, reported
        [*REPORT, "--json"],
        OK,
        {"rows.parquet": "rows-set:found=false;exact=true"},
    ),
    (
        "report-extrapolate-steps-negative",
        [*REPORT, "--extrapolate", "1000"],
        "rows.parquet",
        {"rows.parquet": "rows-set:steps=-5"},
    ),
    (
        "report-extrapolate-steps-over-budget",
        [*REPORT, "--extrapolate", "1000"],
        "rows.parquet",
        {"rows.parquet": "rows-set:steps=1000000000000"},
    ),
    (
        "report-seconds-infinite-json",
        [*REPORT, "--extrapolate", "1000", "--json"],
        OK,
        {"rows.parquet": "rows-set:seconds=1e400"},
    ),
    ("plan-rate-1e-300", [*PLAN[:3], "--rate", "1e-300"], "--rate", SWEEP_FILE),
    # ---- a costs file's numbers past what a float holds
    (
        "costs-flops-400-digits",
        [*PLAN, "--costs", f"{IN}/c.yaml"],
        "c.yaml: precisions.float32.flops_per_second must be a finite number",
        {**SWEEP_FILE, "c.yaml": costs_text(flops="1" + "0" * 400)},
    ),
    (
        "costs-startup-400-digits",
        [*PLAN, "--costs", f"{IN}/c.yaml"],
        "c.yaml: startup_seconds must be a number of seconds",
        {**SWEEP_FILE, "c.yaml": costs_text() + "startup_seconds: 1" + "0" * 400 + "\n"},
    ),
    # ---- objective fields found late or that cannot change the run
    (
        "plan-objective-top-k-over-vocab",
        [*PLAN, "objectives=[{kind: logits, top_k: 100000}]"],
        "top_k",
        SWEEP_FILE,
    ),
    (
        "plan-objective-huber-delta-under-mse",
        [*PLAN, "objectives=[{kind: logits, loss: mse, huber_delta: 2}]"],
        "huber_delta",
        SWEEP_FILE,
    ),
    # ---- a checkpoint folder an earlier, broken run left where a new one resumes
    (
        "train-resume-state-garbage",
        [*TRAIN_Q[:3], "--out", f"{IN}/ck", *TRAIN_Q[5:]],
        "state.json",
        {"ck/train_config.json": "{}", "ck/state.json": "{garbage"},
    ),
    (
        "train-resume-without-last",
        [*TRAIN_Q[:3], "--out", f"{IN}/ck", *TRAIN_Q[5:]],
        "last",
        {"ck/train_config.json": "{}", "ck/state.json": STATE},
    ),
    (
        "train-resume-config-a-list",
        [*TRAIN_Q[:3], "--out", f"{IN}/ck", *TRAIN_Q[5:]],
        "train_config.json",
        {"ck/train_config.json": "[1]", "ck/state.json": STATE},
    ),
    (
        "train-resume-last-garbage",
        [*TRAIN_Q[:3], "--out", f"{IN}/ck", *TRAIN_Q[5:]],
        "last",
        {
            "ck/train_config.json": "{}",
            "ck/state.json": STATE,
            "ck/last/inverter.json": "{garbage",
            "ck/last/model.safetensors": "garbage",
        },
    ),
]


def _safetensors(header: bytes, body: bytes = b"") -> bytes:
    return struct.pack("<Q", len(header)) + header + body


def weights_file(kind: str) -> bytes:
    """A `.safetensors` file damaged as `kind` says."""
    if kind == "huge-header":  # the 8-byte length claims 2**62 bytes of header
        return struct.pack("<Q", 1 << 62) + b"{}"
    if kind == "garbage-header":
        return _safetensors(b"\xff\xfenot json at all")
    if kind == "nested-header":
        return _safetensors(b"[" * 100_000 + b"]" * 100_000)
    if kind == "offsets":  # a tensor said to lie far past the end of the file
        head = {"x": {"dtype": "F32", "shape": [1 << 20], "data_offsets": [0, 4 << 20]}}
        return _safetensors(json.dumps(head).encode(), b"\0" * 16)
    if kind == "empty":
        return b""
    raise AssertionError(kind)


def logits_file(path: Path, kind: str) -> None:
    """An observed-logits file (`.npy` or `.safetensors`) as `kind` says."""
    good = np.random.default_rng(0).standard_normal((1, 512)).astype(np.float32)
    if kind == "ok":
        np.save(path, good)
    elif kind == "3d":
        np.save(path, good[None])
    elif kind == "vocab-511":
        np.save(path, good[:, :511])
    elif kind in ("nan", "inf"):
        bad = good.copy()
        bad[0, 3] = np.nan if kind == "nan" else np.inf
        np.save(path, bad)
    elif kind == "object":  # a pickle inside an .npy: loading it would run code
        np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    elif kind == "huge":  # a header claiming 10**12 rows of 512 floats; 16 bytes follow
        header = "{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000, 512), }"
        header = header.ljust(118) + "\n"
        path.write_bytes(
            b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + b"\0" * 16
        )
    elif kind == "truncated":
        np.save(path, np.zeros((4, 512), dtype=np.float32))
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif kind == "npz":
        with path.open("wb") as f:
            np.savez(f, logits=good)
    elif kind == "zero-rows":
        np.save(path, good[:0])
    else:
        raise AssertionError(kind)


def safetensors_logits(path: Path, kind: str) -> None:
    from safetensors.numpy import save_file

    good = np.random.default_rng(0).standard_normal((1, 512)).astype(np.float32)
    if kind == "two":
        save_file({"a": good, "b": good}, str(path))
    elif kind == "none":
        path.write_bytes(_safetensors(b"{}"))
    elif kind == "int":
        save_file({"logits": good.astype(np.int32)}, str(path))
    elif kind == "truncated":
        save_file({"logits": good}, str(path))
        data = path.read_bytes()
        path.write_bytes(data[: len(data) - 1000])
    else:
        raise AssertionError(kind)


def model_folder(path: Path, kind: str, text: str) -> None:
    """A copy of stories260K with one file damaged as `kind` (`model-config:`, `model-patch:`,
    `model-st:`, `model-tok:`) says."""
    shutil.copytree(STORIES, path)
    for f in path.iterdir():
        f.chmod(0o644)
    path.chmod(0o755)
    name = {"config": "config.json", "patch": "config.json", "st": "model.safetensors"}.get(
        kind, "tokenizer.json"
    )
    target = path / name
    if kind == "patch":
        key, value = text.split("=", 1)
        config = json.loads(target.read_text())
        config[key] = json.loads(value)
        target.write_text(json.dumps(config))
        return
    target.unlink()
    if text in ("fifo", "dir"):
        (os.mkfifo if text == "fifo" else os.mkdir)(target)
    elif text == "utf16":
        target.write_text((STORIES / name).read_text(), encoding="utf-16")
    elif kind == "st" and text == "other-shape":  # another model's weights: a 64-token vocab
        from safetensors.torch import load_file, save_file

        tensors = load_file(str(STORIES / name))
        save_file(
            {k: v[:64].clone() if v.shape[0] == 512 else v for k, v in tensors.items()}, str(target)
        )
    elif kind == "st":
        target.write_bytes(weights_file(text))
    else:
        target.write_text(text)


def write_round_dataset(path: Path, kind: str) -> None:
    """A dataset file as `sodaray data build` writes one (`dataset-ok`), or one damaged as
    `kind` says, written with pyarrow as a careless script would."""
    from sodaray.data.store import HASH_KEY, SCHEMA, VERSION_KEY, content_hash

    rows = {
        "sample_id": [0, 1],
        "dataset": ["mine"] * 2,
        "tokenizer": ["t"] * 2,
        "vocab_size": [512] * 2,
        "length": [1, 1],
        "tokens": [[5], [7]],
        "text": ["a", "b"],
        "pii_labels": [None, None],
        "document_id": [None, None],
    }
    schema = SCHEMA
    if kind == "dataset-negative":
        rows["tokens"] = [[5], [-7]]
    elif kind == "dataset-vocab-50000":  # built for another model's tokenizer
        rows["vocab_size"] = [50_000] * 2
        rows["tokens"] = [[5], [40_000]]
    elif kind == "dataset-length-wrong":
        rows["length"] = [3, 1]
    elif kind == "dataset-null-tokens":
        rows["tokens"] = [[5], None]
        schema = pa.schema([f.with_nullable(True) for f in SCHEMA])
    table = pa.Table.from_pydict(rows, schema=schema)
    meta = {VERSION_KEY: b"1", HASH_KEY: content_hash(table).encode()}
    if kind == "dataset-tampered":
        table = pa.Table.from_pydict({**rows, "tokens": [[5], [9]]}, schema=schema)
    if kind == "dataset-no-version":
        del meta[VERSION_KEY]
    pq.write_table(table.replace_schema_metadata(meta), path)


def write_round_rows(path: Path, kind: str) -> None:
    write_rows(path, "rows")
    table = pq.read_table(path)
    if kind == "rows-nan-seconds":
        i = table.schema.get_field_index("seconds")
        table = table.set_column(i, "seconds", pa.array([float("nan")] * len(table)))
    elif kind == "rows-found-null":
        i = table.schema.get_field_index("found")
        table = table.set_column(i, "found", pa.array([None] * len(table), type=pa.bool_()))
    elif kind.startswith("rows-set:"):  # rows-set:COLUMN=JSON;COLUMN=JSON: every row's value
        for change in kind.removeprefix("rows-set:").split(";"):
            name, value = change.split("=", 1)
            i = table.schema.get_field_index(name)
            field = table.schema.field(name)
            column = pa.array([json.loads(value)] * len(table), type=field.type)
            table = table.set_column(i, field, column)
    pq.write_table(table, path)


def build(tmp: Path, files: dict[str, str]) -> None:
    """Write each file under `tmp/in` (the kinds here, else test_hostile_input's)."""
    rest = {}
    for name, content in files.items():
        path = tmp / "in" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        text = content.replace("{model}", str(STORIES)).replace("{tmp}", str(tmp))
        kind, _, arg = text.partition(":")
        if content == "loop":
            path.symlink_to(path.name)  # a link to itself: every open fails with ELOOP
        elif kind in ("model-config", "model-patch", "model-st", "model-tok"):
            model_folder(path, kind.removeprefix("model-"), arg)
        elif kind == "model-st-file":
            path.write_bytes(weights_file(arg))
        elif kind == "npy":
            logits_file(path, arg)
        elif kind == "stl":
            safetensors_logits(path, arg)
        elif kind == "bytes":
            path.write_bytes(arg.encode("latin-1"))
        elif content == "big-line":  # one 64 MB line: no document is that long
            with path.open("w") as f:
                f.write('{"text": "' + "a " * (32 << 20) + '"}\n')
        elif content.startswith("dataset-") and content != "dataset-empty":
            write_round_dataset(path, content)
        elif content in ("rows-nan-seconds", "rows-found-null") or kind == "rows-set":
            write_round_rows(path, content)
        else:
            rest[name] = content
    materialise(tmp, rest)


def _argv(argv: list[str], tmp: Path) -> list[str]:
    return [a.replace("{tmp}", str(tmp)).replace("{model}", str(STORIES)) for a in argv]


# Rows whose fix lies outside the files this round could change, by where it belongs.
XFAIL: dict[str, str] = {}  # row id -> why it fails today (strict: a fixed row says so)


def _params():
    for cid, argv, message, files in CASES:
        marks = [pytest.mark.xfail(strict=True, reason=XFAIL[cid])] if cid in XFAIL else []
        yield pytest.param(argv, message, files, id=cid, marks=marks)


class NotJson(ValueError):
    """NaN or Infinity in what was said to be JSON."""


def strict_json(text: str) -> list:
    """The JSON values `text` holds (one document, or one per line), as the standard reads
    them: NaN and Infinity are not JSON."""

    def refuse(name: str):
        raise NotJson(f"{name} is not JSON: {text[:200]!r}")

    try:
        return [json.loads(text, parse_constant=refuse)]
    except NotJson:
        raise
    except ValueError:
        return [json.loads(line, parse_constant=refuse) for line in text.splitlines() if line]


@pytest.mark.parametrize("argv,message,files", list(_params()))
def test_hostile_input_round_4(capsys, tmp_path, argv, message, files, monkeypatch):
    """Exit 2 with one line naming the problem (or, `OK`, exit 0 with `--json` output that is
    JSON), no traceback, nothing blocked, and nothing written outside `in` and `o`."""
    build(tmp_path, files)
    (tmp_path / "in").mkdir(exist_ok=True)
    monkeypatch.chdir(tmp_path / "in")  # a relative path a command makes lands in `in`
    printed: list[str] = []
    original = capsys.readouterr

    def keep_out():
        got = original()
        printed.append(got.out)
        return got

    monkeypatch.setattr(capsys, "readouterr", keep_out)
    code, err, broken = cli_outcome(_argv(argv, tmp_path), capsys, 120)
    assert broken == [], broken
    if message is OK:
        assert code == 0, err
        if "--json" in argv:
            assert strict_json("".join(printed))
    else:
        assert code == 2, err
        assert message.replace("{tmp}", str(tmp_path)) in err, err
    assert files_outside(tmp_path) == []


# ---- a process of its own: what may take the interpreter down with it ---------------------------
def run_sodaray(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "sodaray", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def test_a_thread_count_no_machine_has_is_one_line(tmp_path):
    """`--threads 100000000` was handed to torch, which died of a segmentation fault."""
    args = _argv([*TRAIN_Q, "--threads", "100000000"], tmp_path)
    done = run_sodaray(args)
    assert done.returncode == 2, done.stderr[-500:]
    assert done.stderr.count("\n") == 1 and "--threads" in done.stderr


# ---- signals at a moment chosen at random, and two commands on one folder ---------------------
HARD = ",".join(str(t) for t in (311, 45, 402, 99, 250, 17, 388, 461))  # not found in seconds
NATIVE_DUMP = ("*** SIGTERM received", "PC: @", "Fatal Python error", "Traceback")


def _leftovers(folder: Path) -> list[str]:
    """Temporary files a write left behind (`writes.write_file` names them `.NAME.x.tmp`)."""
    return sorted(str(p) for p in folder.rglob("*.tmp"))


class NotHandled(Exception):
    """A stop signal came while no handler of sodaray's was in force."""


SIGNALLED = [  # (id, command, signal): each comes at a random (seeded) moment of the run
    ("invert-sigterm", "invert", signal.SIGTERM),
    ("invert-sighup", "invert", signal.SIGHUP),
    ("train-inverter-sigterm", "train", signal.SIGTERM),
    ("train-inverter-sighup", "train", signal.SIGHUP),
    ("data-build-sigterm", "data", signal.SIGTERM),
    ("plan-calibrating-sighup", "plan", signal.SIGHUP),
]


@pytest.mark.parametrize(
    "command,signum", [c[1:] for c in SIGNALLED], ids=[c[0] for c in SIGNALLED]
)
def test_a_stop_signal_at_a_random_moment_is_a_clean_stop(tmp_path, capsys, command, signum):
    """SIGTERM and SIGHUP, what schedulers and a lost terminal send, stop as Ctrl-C does: exit
    128 + the signal's number, one "interrupted" line last, no traceback, no temporary file
    left, and what finished is kept whole (invert's rows in --out; a checkpoint a resume
    reads). The signal comes to this process while the command runs in it, at a moment drawn
    at random (seeded by the row) from its first seconds: loading, building data, searching,
    training or writing."""
    import random
    import threading

    # Imported first: a KeyboardInterrupt inside transformers' lazy import comes out as a
    # ModuleNotFoundError, and the module stays unimportable for the rest of this process.
    import sodaray.inverter.train  # noqa: F401

    # `sweep plan` calibrates for a few seconds; the others run until stopped.
    latest = 1.0 if command == "plan" else 5.0
    delay = random.Random(f"{command}{int(signum)}").uniform(0.1, latest)
    out = tmp_path / "o"
    if command == "invert":
        argv = ["invert", "--model", str(STORIES), "--tokens", "172", "--tokens", HARD]
        argv += ["--max-steps", "1000000", "--json", "--out", str(out / "r.parquet")]
    elif command == "train":
        argv = _argv([*TRAIN_Q[:-4], "--epochs", "100000", "--batch-size", "2"], tmp_path)
        argv += ["--threads", "1"]
    elif command == "data":  # two million samples (over a minute): longer than the signal takes
        # to come, and small enough that a stop held by one long C call stays short
        argv = _argv([*DATA[:6], "--lengths", "1-10", "--per-length", "200000"], tmp_path)
        argv += ["--out", str(out / "d.parquet")]
    else:  # `sweep plan` measures a rate by running searches here
        (tmp_path / "s.yaml").write_text(sweep_text().replace("{model}", str(STORIES)))
        argv = ["sweep", "plan", str(tmp_path / "s.yaml"), "max_steps=100000000"]

    def not_handled(signum, frame):
        raise NotHandled(signal.Signals(signum).name)

    # A signal no handler of sodaray's takes fails the test, rather than ending pytest.
    previous = {sig: signal.signal(sig, not_handled) for sig in (signal.SIGTERM, signal.SIGHUP)}
    timer = threading.Timer(delay, os.kill, (os.getpid(), signum))
    timer.start()
    try:
        code, err, _ = cli_outcome(argv, capsys, 300)
    finally:
        timer.cancel()
        timer.join()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    assert code == 128 + signum and "Traceback" not in err, err[-800:]
    assert "interrupted" in err.strip().splitlines()[-1], err[-800:]
    assert _leftovers(tmp_path) == []
    if command == "invert":
        if (out / "r.parquet").exists():  # only 172 can have been found in these seconds
            assert pq.read_table(out / "r.parquet")["tokens"].to_pylist() == [[172]]
    elif command == "data":
        assert not (out / "d.parquet").exists()  # never half a dataset
    elif command == "train" and (out / "inv" / "state.json").exists():
        done = json.loads((out / "inv" / "state.json").read_text())["epoch"]
        at = argv.index("--epochs")
        resume = [*argv[:at], "--epochs", str(max(done, 1)), *argv[at + 2 :]]
        code, err, broken = cli_outcome(resume, capsys, 300)
        assert (code, broken) == (0, []), err[-800:]


def _together(argvs: list[list[str]]) -> None:
    """The commands started at once, each its own process, run to their end: each ends 0, or
    2 in one line saying why (never a traceback), and at least one ends 0."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "sodaray", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for argv in argvs
    ]
    ends = [(proc, proc.communicate(timeout=300)[1]) for proc in procs]
    for proc, err in ends:
        assert proc.returncode in (0, 2) and "Traceback" not in err, err[-800:]
        assert proc.returncode == 0 or len(err.strip().splitlines()) == 1, err[-800:]
    assert 0 in [proc.returncode for proc in procs]


def test_two_builds_onto_one_file_at_once_leave_one_whole_dataset(tmp_path):
    """Two `data build`s (two seeds) started together onto one --out: the file is one
    build's whole dataset, its rows matching its recorded hash, no temporary file beside it."""
    from sodaray.data.store import read_dataset

    out = tmp_path / "d.parquet"
    base = [*_argv(DATA[:6], tmp_path), "--lengths", "1-4", "--per-length", "50"]
    _together([[*base, "--seed", str(seed), "--out", str(out)] for seed in (0, 1)])
    table = read_dataset(out)  # verifies the rows against the recorded hash
    assert len(table) == 200
    assert _leftovers(tmp_path) == []


def test_two_reports_into_one_folder_at_once_leave_whole_tables(tmp_path):
    """Two `report`s of two result files started together into one --out: every table there
    is whole (each CSV reads, with the rows of one report), no temporary file beside them."""
    import csv

    for name in ("a", "b"):
        write_rows(tmp_path / f"{name}.parquet", "rows")
    base = ["--out", str(tmp_path / "rep"), "--no-figures", "--format", "md,csv"]
    _together([["report", str(tmp_path / f"{n}.parquet"), *base] for n in ("a", "b")])
    tables = sorted((tmp_path / "rep").glob("*.csv"))
    assert tables
    for table in tables:
        with table.open() as f:
            rows = list(csv.reader(f))
        assert len({len(r) for r in rows}) == 1, table  # no row cut short or run together
    assert _leftovers(tmp_path) == []


def test_the_round_is_at_least_100_new_rows():
    """Issue 58's done-when: a round of at least 100 new hostile inputs, none a repeat of an
    earlier table's id, every expected failure naming where its fix belongs."""
    from test_hostile_input import CASES as EARLIER

    ids = [c[0] for c in CASES]
    assert len(ids) == len(set(ids)) >= 100
    assert not set(ids) & {c[0] for c in EARLIER}
    assert set(XFAIL) <= set(ids)
