"""Issue 30: input as an attacker or a careless user writes it. Every row ends in one line on
stderr and exit code 2, or (rows marked `ok`) in the right behaviour; no row writes outside the
folder it runs in, except into `--out`.

A row is (id, argv, the text the error must contain, files to write first). Files are written
under `{tmp}/in`; a command's output goes to `{tmp}/o`; after the row, every file under `{tmp}`
must lie in one of the two (a name that escaped `--out` would leave one elsewhere). `{model}` is
the stories260K folder. File contents name a kind (see `materialise`) or are the text itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import socket
import subprocess
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import STORIES, one_line_error

from sodaray.cli import main
from sodaray.experiment.data import CACHE_KEY

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
DATA = ["data", "build", "--model", "{model}", "--dataset", "random", "--out", "{tmp}/o/d.parquet"]
BUILD_600 = '{name: random, build: {dataset: random, lengths: "600", per_length: 1}}'
BIG = 30_000_000  # bytes: the issue's 30 MB preset
DEEP = "[" * 100_000 + "]" * 100_000  # issue 53's job.lock: a RecursionError in every parser
NESTED = "nested more than 64 levels deep"
ALIAS_CHAIN = "".join(  # each anchor 60 levels around the one before: few nodes, deep expanded
    f"a{i}: &a{i} " + "[" * 60 + (f"*a{i - 1}" if i else "1") + "]" * 60 + "\n" for i in range(200)
)


SWEEP_FILE = {"s.yaml": sweep_text()}
TUNE_FILE = {"t.yaml": tune_text()}


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
    ("invert-out-empty", [*INV, "--tokens", "172", "--out", ""], "--out: empty value", {}),
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
    # ---- issue 37: token and length lists (one rule: `validation.parse_int_list`)
    ("tokens-space", [*INV, "--tokens", "1 2"], "'1 2' is not a non-negative integer", {}),
    ("tokens-empty-item", [*INV, "--tokens", "1,,2"], "'1,,2' has an empty item", {}),
    ("tokens-trailing-comma", [*INV, "--tokens", "1,"], "'1,' has an empty item", {}),
    ("tokens-other-digits", [*INV, "--tokens", "١٧٢"], "is not a non-negative integer", {}),
    ("tokens-underscore", [*INV, "--tokens", "1_0"], "'1_0' is not a non-negative integer", {}),
    ("data-lengths-space", [*DATA, "--lengths", "1 2"], "not '1 2'", {}),
    ("data-lengths-empty-item", [*DATA, "--lengths", "1,,3"], "not '1,,3'", {}),
    (
        "sweep-build-lengths-space",
        PLAN,
        "datasets[0].build.lengths: lengths take A-B",
        {"s.yaml": sweep_text(dataset='{name: r, build: {dataset: random, lengths: "1 2"}}')},
    ),
    (
        "train-inverter-lengths-empty-item",
        ["train-inverter", "--model", "{model}", "--out", "{tmp}/o/inv", "--lengths", "1,,2"],
        "not '1,,2'",
        {},
    ),
    (
        "report-format-empty-item",
        ["report", f"{IN}/rows.parquet", "--out", "{tmp}/o", "--format", "md,,csv"],
        "'md,,csv' has an empty item",
        {"rows.parquet": "rows"},
    ),
    # ---- issue 37: preset files are strict (one rule: `presets._read_preset`)
    (
        "preset-soda-and-params",
        [*INV, "--tokens", "1", "--preset-file", f"{IN}/p.yaml"],
        "give `soda:` or `params:`, not both",
        {"p.yaml": "soda: {temperature: 0.1}\nparams: {learning_rate: 0.5}\n"},
    ),
    (
        "preset-section-misspelt",
        [*INV, "--tokens", "1", "--preset-file", f"{IN}/p.yaml"],
        "'objectve' is not a preset section",
        {"p.yaml": "soda: {temperature: 0.1}\nobjectve: {space: centred}\n"},
    ),
    (
        "preset-include",
        [*INV, "--tokens", "1", "--preset-file", f"{IN}/p.yaml"],
        "'include' is not a preset section",
        {"p.yaml": "soda: {temperature: 0.1}\ninclude: other.yaml\n"},
    ),
    (
        "preset-flat-with-objective",
        [*INV, "--tokens", "1", "--preset-file", f"{IN}/p.yaml"],
        "puts its parameters under `soda:`",
        {"p.yaml": "temperature: 0.1\nobjective: {space: centred}\n"},
    ),
    (
        "sweep-preset-section-misspelt",
        PLAN,
        "models[0].preset_file: {tmp}/in/p.yaml: 'objectve' is not a preset section",
        {
            "p.yaml": "soda: {temperature: 0.1}\nobjectve: {space: centred}\n",
            "s.yaml": sweep_text(model='{id: "{model}", preset_file: "{tmp}/in/p.yaml"}'),
        },
    ),
    # ---- issue 37: one size limit for every YAML and JSON file (`files.read_config`)
    (
        "preset-30-mb",
        [*INV, "--tokens", "1", "--preset-file", f"{IN}/p.yaml"],
        "30,000,000 bytes is not a preset file (at most 4,194,304)",
        {"p.yaml": "big:soda: {temperature: 0.1}\nnote: "},
    ),
    (
        "sweep-include-30-mb",
        PLAN,
        "30,000,000 bytes is not a sweep file (at most 4,194,304) (included by",
        {"s.yaml": "include: [b.yaml]\n" + sweep_text(), "b.yaml": "big:description: "},
    ),
    (
        "status-job-json-30-mb",
        ["sweep", "status", "{tmp}/in/r"],
        "30,000,000 bytes is not a job file",
        {f"r/{JOB}/job.json": "big:"},
    ),
    (
        "inverter-checkpoint-json-list",
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
        "inverter.json: an inverter checkpoint file holds a JSON object, not list",
        {"ck/inverter.json": "[1, 2]"},
    ),
    # ---- issue 37: paths that exist and are not regular files (`files.regular_file`)
    ("sweep-file-a-directory", ["sweep", "plan", IN], "is a directory, not a sweep file", {}),
    ("sweep-file-dev-zero", ["sweep", "plan", "/dev/zero"], "is a character device", {}),
    ("sweep-file-fifo", ["sweep", "plan", f"{IN}/s.yaml"], "is a FIFO", {"s.yaml": "fifo"}),
    ("tune-file-dev-zero", ["tune", "/dev/zero", "--out", "{tmp}/o"], "not a tuning file", {}),
    (
        "sweep-include-fifo",
        PLAN,
        "b.yaml is a FIFO (named pipe), not a sweep file (included by",
        {"s.yaml": "include: [b.yaml]\n" + sweep_text(), "b.yaml": "fifo"},
    ),
    (
        "preset-file-fifo",
        [*INV, "--tokens", "1", "--preset-file", f"{IN}/p.yaml"],
        "p.yaml is a FIFO (named pipe), not a preset file",
        {"p.yaml": "fifo"},
    ),
    (
        "preset-file-a-directory",
        [*INV, "--tokens", "1", "--preset-file", IN],
        "is a directory, not a preset file",
        {},
    ),
    ("logits-dev-zero", [*INV, "--logits-file", "/dev/zero"], "is a character device", {}),
    ("logits-fifo", [*INV, "--logits-file", f"{IN}/l.npy"], "is a FIFO", {"l.npy": "fifo"}),
    (
        "sweep-dataset-path-fifo",
        PLAN,
        "datasets[0].path: {tmp}/in/d.parquet is a FIFO (named pipe), not a dataset file",
        {
            "d.parquet": "fifo",
            "s.yaml": sweep_text(dataset='{name: d, path: "{tmp}/in/d.parquet"}'),
        },
    ),
    (
        "data-source-fifo",
        [*DATA[:5], "nl-id", "--source", f"{IN}/src.jsonl", "--out", "{tmp}/o/d.parquet"],
        "src.jsonl is a FIFO (named pipe), not a source file",
        {"src.jsonl": "fifo"},
    ),
    (
        "data-source-dev-zero",
        [*DATA[:5], "nl-id", "--source", "/dev/zero", "--out", "{tmp}/o/d.parquet"],
        "/dev/zero is a character device, not a source file",
        {},
    ),
    ("report-dev-zero", ["report", "/dev/zero", "--out", "{tmp}/o"], "is a character device", {}),
    (
        "report-fifo",
        ["report", f"{IN}/r.parquet", "--out", "{tmp}/o"],
        "FIFO",
        {"r.parquet": "fifo"},
    ),
    ("status-dev-zero", ["sweep", "status", "/dev/zero"], "not a results folder", {}),
    (
        "report-embedding-model-dev-zero",
        ["report", f"{IN}/rows.parquet", "--out", "{tmp}/o", "--embedding-model", "/dev/zero"],
        "is a character device, not a model folder",
        {"rows.parquet": "rows"},
    ),
    ("model-fifo", ["invert", "--model", f"{IN}/m", "--tokens", "1"], "is a FIFO", {"m": "fifo"}),
    (
        "model-gguf-dev-zero",
        ["invert", "--model", f"{IN}/m.gguf", "--tokens", "1"],
        "m.gguf is a character device, not a GGUF model file",
        {"m.gguf": "link:/dev/zero"},
    ),
    (
        "data-model-fifo",
        [*DATA[:3], f"{IN}/m", *DATA[4:]],
        "is a FIFO (named pipe), not a model folder",
        {"m": "fifo"},
    ),
    (
        "inverter-checkpoint-dev-zero",
        [
            *INV,
            "--tokens",
            "1",
            "--objective",
            "text",
            "--algorithm",
            "inverter",
            "--param",
            "checkpoint=/dev/zero",
        ],
        "is a character device, not an inverter checkpoint folder",
        {},
    ),
    # ---- issue 37: what `sweep plan` (and `run`, `tune`) checks without loading weights
    (
        "plan-length-over-context",
        PLAN,
        "dataset random has inputs of length 600: input length 600 + 1 output tokens = 601 "
        "positions exceed stories260K's context of 512",
        {"s.yaml": sweep_text(dataset=BUILD_600)},
    ),
    (
        "run-length-over-context",  # on the driver: before any actor, one line, not 5 per shard
        RUN,
        "exceed stories260K's context of 512",
        {"s.yaml": sweep_text(dataset=BUILD_600)},
    ),
    (
        "plan-bos-pushes-over-context",
        PLAN,
        "input length 511 + 1 output tokens + 1 fixed = 513 positions exceed",
        {
            "s.yaml": sweep_text(
                model='{id: "{model}", bos: true}',
                dataset='{name: r, build: {dataset: random, lengths: "511", per_length: 1}}',
            )
        },
    ),
    (
        "plan-auto-max-length-over-context",
        PLAN,
        "length: auto tries up to max_length 700",
        {"s.yaml": sweep_text(extra="length: auto\nmax_length: 700\n")},
    ),
    (
        "plan-assumed-length-over-context",
        PLAN,
        "assumed length 900",
        {"s.yaml": sweep_text(extra="length: [1, 900]\n")},
    ),
    (
        "plan-output-tokens-over-context",
        PLAN,
        "input length 1 + 600 output tokens",
        {"s.yaml": sweep_text(extra="objectives: [{kind: logits, output_tokens: 600}]\n")},
    ),
    (
        "tune-length-over-context",
        TUNE,
        "data has inputs of length 600",
        {"t.yaml": tune_text().replace('lengths: "1"', 'lengths: "600"')},
    ),
    (
        "plan-model-folder-empty",
        PLAN,
        "models[0].id: {tmp}/in/m holds no config.json: not a model folder",
        {"m": "dir", "s.yaml": sweep_text(model='{id: "{tmp}/in/m"}')},
    ),
    (
        "plan-model-folder-without-weights",
        PLAN,
        "models[0].id: {tmp}/in/m holds no weights",
        {"m": "config-only-model", "s.yaml": sweep_text(model='{id: "{tmp}/in/m"}')},
    ),
    (
        "tune-model-folder-without-weights",
        TUNE,
        "model.id: {tmp}/in/m holds no weights",
        {"m": "config-only-model", "t.yaml": tune_text().replace("{model}", "{tmp}/in/m")},
    ),
    (
        "invert-model-folder-without-weights",
        ["invert", "--model", f"{IN}/m", "--tokens", "1"],
        "holds no weights",
        {"m": "config-only-model"},
    ),
    (
        "plan-model-gguf-fifo",
        PLAN,
        "models[0].id: {tmp}/in/m.gguf is a FIFO",
        {"m.gguf": "fifo", "s.yaml": sweep_text(model='{id: "{tmp}/in/m.gguf"}')},
    ),
    (
        "run-keep-every-negative",
        [*RUN, "--keep-every", "-1"],
        "--keep-every must be 0 to 86400 seconds",
        {"s.yaml": sweep_text()},
    ),
    (
        "run-keep-every-nan",
        [*RUN, "--keep-every", "nan"],
        "--keep-every must be 0 to 86400 seconds",
        {"s.yaml": sweep_text()},
    ),
    # ---- and the rows a report must refuse
    (
        "report-duplicate-rows",
        ["report", f"{IN}/rows.parquet", f"{IN}/again.parquet", "--out", "{tmp}/o"],
        "repeat",
        {"rows.parquet": "rows", "again.parquet": "rows"},
    ),
    # ---- issue 53: every wait has a bound (`waits.CHECK_SECONDS`; timed in test_bounded_waits)
    ("run-mlflow-empty", [*RUN, "--mlflow", ""], "--mlflow: empty value", SWEEP_FILE),
    ("tune-mlflow-blank", [*TUNE, "--mlflow", "  "], "--mlflow: an empty tracking URI", TUNE_FILE),
    (
        "tune-journal-fifo",  # appending to a FIFO waits for a reader for ever
        [*TUNE, "--storage", f"{IN}/j.journal"],
        "j.journal is a FIFO (named pipe), not a study journal",
        {**TUNE_FILE, "j.journal": "fifo"},
    ),
    (
        "tune-journal-a-directory",
        [*TUNE, "--storage", f"{IN}/j.journal"],
        "j.journal is a directory, not a study journal",
        {**TUNE_FILE, "j.journal/x": "x"},
    ),
    (
        "tune-storage-sqlite-fifo",  # SQLite opens a FIFO, then waits on it
        [*TUNE, "--storage", "sqlite:///{tmp}/in/s.db"],
        "s.db is a FIFO (named pipe), not a database file",
        {**TUNE_FILE, "s.db": "fifo"},
    ),
    (
        "run-mlflow-sqlite-fifo",
        [*RUN, "--mlflow", "sqlite:///{tmp}/in/m.db"],
        "m.db is a FIFO (named pipe), not a database file",
        {**SWEEP_FILE, "m.db": "fifo"},
    ),
    (
        "run-address-unknown-host",
        [*RUN, "--address", "nosuchhost.invalid:6379"],
        "cannot reach a Ray cluster at nosuchhost.invalid:6379 (from --address)",
        SWEEP_FILE,
    ),
    (
        "tune-address-refused",
        [*TUNE, "--address", "127.0.0.1:1"],
        "cannot reach a Ray cluster at 127.0.0.1:1 (from --address)",
        TUNE_FILE,
    ),
    # ---- issue 53: what sodaray says is what it does
    (
        "report-extrapolate-below-budget",  # the rows ran 5 steps: "extrapolated" to 1
        ["report", f"{IN}/rows.parquet", "--out", "{tmp}/o", "--extrapolate", "1"],
        "--extrapolate 1: below the measured step budget (5 steps)",
        {"rows.parquet": "rows"},
    ),
    (
        "report-extrapolate-one-below-budget",
        ["report", f"{IN}/rows.parquet", "--out", "{tmp}/o", "--extrapolate", "4"],
        "--extrapolate 4: below the measured step budget (5 steps)",
        {"rows.parquet": "rows"},
    ),
    (
        "tune-int-step-half",  # int(0.5): the range became `step: 0`, silently
        TUNE,
        "space.reset_period.step: an int range's step is a whole number, not 0.5",
        {"t.yaml": tune_text(space="{reset_period: {type: int, low: 2, high: 8, step: 0.5}}")},
    ),
    (
        "tune-override-int-step-half",
        [*TUNE, "space.reset_period={type: int, low: 2, high: 8, step: 1.5}"],
        "an int range's step is a whole number, not 1.5",
        TUNE_FILE,
    ),
    (
        "sweep-model-name-newline",  # a folder and a label: a line break split the plan table
        PLAN,
        "models[0].name: must be printable",
        {"s.yaml": sweep_text(model='{id: "{model}", name: "a\\nb"}')},
    ),
    (
        "sweep-dataset-name-terminal-escape",
        PLAN,
        "datasets[0].name: must be printable",
        {"s.yaml": sweep_text(dataset='{name: "d\\e[2J", build: {dataset: random, lengths: "1"}}')},
    ),
    # ---- issue 53: every parser has a bound (`files.MAX_NESTING`, `configfile.MAX_OVERRIDE_CHARS`)
    (
        "sweep-yaml-nested-100000",
        PLAN,
        NESTED,
        {"s.yaml": sweep_text(extra=f"description: {DEEP}\n")},
    ),
    (
        "sweep-include-nested",
        PLAN,
        "b.yaml: not valid YAML (nested more than 64",
        {"s.yaml": "include: [b.yaml]\n" + sweep_text(), "b.yaml": f"description: {DEEP}\n"},
    ),
    (
        "sweep-block-nested",  # block style: the same bound, whatever the style
        PLAN,
        NESTED,
        {
            "s.yaml": sweep_text(
                extra="description:\n" + "".join("  " * i + "- \n" for i in range(2000))
            )
        },
    ),
    (
        "sweep-alias-chain-deep",  # 200 aliases, each 60 levels around the last: 12,000 deep
        PLAN,
        "its aliases make it nested more than 64",
        {"s.yaml": ALIAS_CHAIN + sweep_text()},
    ),
    (
        "sweep-recursive-alias-grid",
        PLAN,
        "a node contains itself",
        {"s.yaml": sweep_text(algorithm="{name: soda, grid: {temperature: &a [0.1, *a]}}")},
    ),
    ("tune-yaml-nested", TUNE, NESTED, {"t.yaml": tune_text(extra=f"description: {DEEP}\n")}),
    (
        "preset-yaml-nested",
        [*INV, "--tokens", "1", "--preset-file", f"{IN}/p.yaml"],
        NESTED,
        {"p.yaml": f"soda: {{temperature: 0.1}}\nnote: {DEEP}\n"},
    ),
    (
        "costs-yaml-nested",
        [*PLAN, "--costs", f"{IN}/c.yaml"],
        NESTED,
        {"s.yaml": sweep_text(), "c.yaml": f"device: {DEEP}\nkind: gpu\n"},
    ),
    (
        "override-value-nested",
        [*PLAN, "description=" + "[" * 1000 + "]" * 1000],
        NESTED,
        {"s.yaml": sweep_text()},
    ),
    (
        "override-key-1000-parts",
        [*PLAN, "a." * 1000 + "b=1"],
        "the key has 1,001 parts (at most 64)",
        {"s.yaml": sweep_text()},
    ),
    (
        "override-100000-characters",
        [*PLAN, "description=" + "x" * 100_000],
        "100,012 characters (an override is at most 65,536)",
        {"s.yaml": sweep_text()},
    ),
    (
        "tune-override-nested",
        [*TUNE, "fixed=" + "{a: " * 1000 + "1" + "}" * 1000],
        NESTED,
        {"t.yaml": tune_text()},
    ),
    (
        "param-nested",
        [*INV, "--tokens", "1", "--param", "temperature=" + "[" * 1000 + "]" * 1000],
        NESTED,
        {},
    ),
    (
        "status-job-json-nested-100000",
        ["sweep", "status", "{tmp}/in/r"],
        "job.json: not a readable job file (",
        {f"r/{JOB}/job.json": DEEP},
    ),
    (
        "data-jsonl-line-nested",
        [*DATA[:5], "nl-id", "--source", f"{IN}/d.jsonl", "--out", "{tmp}/o/d.parquet"],
        "d.jsonl:2: nested more than 64",
        {"d.jsonl": '{"text": "a b c"}\n' + DEEP + "\n"},
    ),
    (
        "report-params-nested",
        ["report", f"{IN}/rows.parquet", "--out", "{tmp}/o"],
        "a result row's params: nested more than 64",
        {"rows.parquet": "rows-params-deep"},
    ),
    (
        "run-dataset-metadata-nested",
        RUN,
        "dataset metadata sodaray.dataset.args: nested more than 64",
        {
            "d.parquet": "dataset-args-deep",
            "s.yaml": sweep_text(dataset='{name: d, path: "{tmp}/in/d.parquet"}'),
        },
    ),
]


def materialise(tmp: Path, files: dict[str, str]) -> None:
    """Write each file under `tmp/in`; a content naming a kind below is built, not written."""
    for name, content in files.items():
        path = tmp / "in" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        text = content.replace("{model}", str(STORIES)).replace("{tmp}", str(tmp))
        if content == "fifo":
            os.mkfifo(path)  # opening it would block: only what it is may be looked at
        elif content == "dir":
            path.mkdir()
        elif content.startswith("link:"):
            path.symlink_to(content.removeprefix("link:"))
        elif content == "config-only-model":
            path.mkdir()
            shutil.copy(STORIES / "config.json", path / "config.json")
        elif content.startswith("big:"):  # BIG bytes: the prefix, then one long YAML string
            head = text.removeprefix("big:")
            path.write_text(head + '"' + "x" * (BIG - len(head) - 3) + '"\n')
            assert path.stat().st_size == BIG
        elif content == "bool-logits":
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
    if kind == "dataset-args-deep":
        meta[b"sodaray.dataset.args"] = DEEP.encode()
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
    elif kind == "rows-params-deep":
        index = table.schema.get_field_index("params")
        table = table.set_column(index, "params", pa.array([DEEP] * len(table)))
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
    assert message.replace("{tmp}", str(tmp_path)) in err, err
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


def test_a_bad_job_fails_alone_once_with_its_reason(tmp_path, local_ray, monkeypatch):
    """Issue 30, case 6: a dataset holding a token id the model does not have fails its own
    shards at once (one try each, the reason given) while the job beside it finishes. Planning
    refuses such a file where the model's local config gives its vocabulary; here that check is
    off, as for a hub model or a GGUF file, whose vocabulary only the replica learns."""
    from sodaray.runner import load_sweep, plan, run_sweep

    monkeypatch.setattr(plan, "check_jobs_vocab", lambda jobs, where: None)

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


# ---- issue 37: what resume trusts (shards, locks) and what a report reads ------------------------
# A finished results folder of two jobs (two temperatures, two shards each), computed once here
# without Ray; each row below tampers with a copy of it as a careless user or a crash would, and
# says what the next run must do: which shards it computes again, and the warning naming why.
TWO = (
    'name: two\nmodels: [{id: "{model}", num_cpus: 1}]\n'
    'datasets: [{name: random, build: {dataset: random, lengths: "1", per_length: 4}}]\n'
    "algorithms: [{name: soda, grid: {temperature: [0.05, 0.1]}}]\nmax_steps: 5\nshard_size: 2\n"
)


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    from conftest import finish_all

    from sodaray.runner import load_sweep
    from sodaray.runner.jobs import plan_jobs

    base = tmp_path_factory.mktemp("finished")
    (base / "s.yaml").write_text(TWO.replace("{model}", str(STORIES)))
    plans = plan_jobs(load_sweep(base / "s.yaml").jobs(), base / "out" / "two")
    finish_all(plans)
    return base


def two_jobs(tmp_path: Path, finished: Path):
    """A copy of the finished folder: (sweep, its root, job A's plan-less paths, job B's)."""
    from sodaray.runner import load_sweep
    from sodaray.runner.layout import meta_folder

    shutil.copytree(finished, tmp_path, dirs_exist_ok=True)
    sweep = load_sweep(tmp_path / "s.yaml")
    root = tmp_path / "out" / "two"
    a, b = sorted(sweep.jobs(), key=lambda j: j.search.temperature)  # 0.05, 0.1
    paths = [(root / j.name, meta_folder(root, j.name)) for j in (a, b)]
    return sweep, root, paths


def corrupt_pages(path: Path) -> None:
    """Bytes of the first data page overwritten: the footer still reads, the rows do not."""
    data = bytearray(path.read_bytes())
    data[4:40] = b"\xff" * 36
    path.write_bytes(bytes(data))


@contextlib.contextmanager
def unrelated_process():
    """A live process that is not a sodaray run (`sleep`), whose pid a lock may name."""
    proc = subprocess.Popen([shutil.which("sleep") or "/bin/sleep", "300"])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def _start_ticks(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def _boot() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


HOST = socket.gethostname()
# (id, what is done to job A (or B), the shards of A and B the next run computes, the warning).
RESUME_CASES: list[tuple[str, str, tuple[list[int], list[int]], str]] = [
    # A shard copied from another job of the same dataset: same sample ids, other results.
    ("shard-from-another-job", "copy-a0-to-b0", ([], [0]), "rows of another job"),
    ("shard-corrupt-page", "corrupt-a0", ([0], []), "unreadable"),
    ("shard-is-a-fifo", "fifo-a0", ([0], []), "a FIFO (named pipe), not a shard file"),
    ("shard-is-a-directory", "dir-a0", ([0], []), "a directory, not a shard file"),
    # Job A's lock (its shards deleted, so what the run would compute shows):
    ("lock-json-list", "lock:[1, 2]", ([0, 1], []), "not a lock: it holds list"),
    ("lock-json-number", "lock:7", ([0, 1], []), "not a lock: it holds int"),
    ("lock-empty", "lock:", ([0, 1], []), "job.lock: not valid JSON"),
    ("lock-garbled", "lock:{not json", ([0, 1], []), "not valid JSON"),
    # Issue 53: a RecursionError, and the sweep could not run; now an invalid lock, broken.
    ("lock-nested-100000", "lock:" + DEEP, ([0, 1], []), "nested more than 64 levels deep"),
    ("lock-object-nested", "lock:" + '{"a": ' * 5000 + "1" + "}" * 5000, ([0, 1], []), "nested"),
    ("lock-no-host", 'lock:{"pid": 5}', ([0, 1], []), "it names no host"),
    ("lock-pid-text", f'lock:{{"host": "{HOST}", "pid": "12"}}', ([0, 1], []), "its pid is '12'"),
    ("lock-pid-huge", f'lock:{{"host": "{HOST}", "pid": {2**80}}}', ([0, 1], []), "is gone"),
    ("lock-a-directory", "lock-dir", ([0, 1], []), "is a directory, not a lock file"),
    ("lock-a-fifo", "lock-fifo", ([0, 1], []), "is a FIFO (named pipe), not a lock file"),
    # A live pid that is not a sodaray run: the issue's case (the run skipped the job, exit 0).
    ("lock-live-unrelated-pid", "lock-unrelated", ([0, 1], []), "is not a sodaray run ("),
    ("lock-pid-reused", "lock-reused", ([0, 1], []), "is another process now"),
    ("lock-before-a-restart", "lock-other-boot", ([0, 1], []), "before this machine restarted"),
    # Issue 53: a cache is trusted on its content, not its name. The issue's case: the dataset
    # cache replaced by another seed's build and A's shard 1 deleted; the resume mixed rows of
    # two seeds. The cache is set aside and rebuilt; only A's shard 1 runs, on this seed's rows.
    ("cache-another-seeds-build", "cache-other-seed", ([1], []), "not this entry's build"),
    # ... and with the build's key copied in: every shard was searched on other rows: all again.
    ("cache-key-forged", "cache-forged", ([0, 1], [0, 1]), "rows of another dataset"),
    ("cache-a-fifo", "cache-fifo", ([1], []), "a FIFO (named pipe), not a dataset file"),
    ("cache-no-build-recorded", "cache-no-key", ([1], []), "no build recorded"),
    # Kept rows of another job, or of this job on another dataset: set aside, searched again.
    ("kept-from-another-job", "kept-b1-as-a1", ([1], []), "rows of another job"),
    ("kept-of-another-dataset", "kept-other-data", ([1], []), "rows of another dataset"),
    # A kept file's footer holding a schema 1,000 lists deep: pyarrow's own bound refuses it.
    ("kept-footer-nested-1000", "kept-deep-footer", ([1], []), "unreadable"),
]
NAMED = {
    "cache-other": ".pq",
    "cache-fifo": ".pq",
    "cache-no": ".pq",
    "kept": "kept.pq",
    "lock": "job.lock",
}


_OTHER: list[pa.Table] = []


def other_seeds_build() -> pa.Table:
    """TWO's dataset built with another seed, as `sodaray data build` writes it: the same
    sample ids, other inputs."""
    if not _OTHER:
        from sodaray.data.build import build_dataset

        _OTHER.append(build_dataset(str(STORIES), "random", "1", 4, seed=2, progress=False))
    return _OTHER[0]


def tamper(how: str, a: tuple[Path, Path], b: tuple[Path, Path], pid: int) -> None:
    (a_dir, a_meta), (b_dir, _) = a, b
    if how.startswith("lock") or how == "":
        for shard in a_dir.glob("shard-*.parquet"):
            shard.unlink()
    lock = a_meta / "job.lock"
    [cache] = a_meta.parents[1].glob("datasets/*.pq")
    if how.startswith(("cache", "kept")):
        a1 = pq.read_table(a_dir / "shard-00001.parquet")
        (a_dir / "shard-00001.parquet").unlink()
    if how in ("cache-other-seed", "cache-forged", "cache-no-key"):
        meta = dict(pq.read_schema(cache).metadata)
        table = other_seeds_build() if how != "cache-no-key" else pq.read_table(cache)
        if how != "cache-no-key":  # forged: this build's key; else the other build's own
            key = meta[CACHE_KEY] if how == "cache-forged" else b"5eed2" + b"0" * 59
            table = table.replace_schema_metadata({**table.schema.metadata, CACHE_KEY: key})
        else:
            table = table.replace_schema_metadata({k: v for k, v in meta.items() if k != CACHE_KEY})
        pq.write_table(table, cache)
    elif how == "cache-fifo":
        cache.unlink()
        os.mkfifo(cache)
    elif how == "kept-b1-as-a1":
        shutil.copy(b_dir / "shard-00001.parquet", a_meta / "shard-00001.kept.pq")
    elif how == "kept-deep-footer":
        kind = pa.int64()
        for _ in range(1000):
            kind = pa.list_(kind)
        pq.write_table(pa.table({"x": pa.array([None], type=kind)}), a_meta / "shard-00001.kept.pq")
    elif how == "kept-other-data":
        i = a1.schema.get_field_index("dataset_hash")
        a1 = a1.set_column(i, "dataset_hash", pa.array(["f" * 64] * len(a1)))
        pq.write_table(a1.slice(0, 1), a_meta / "shard-00001.kept.pq")
    elif how == "copy-a0-to-b0":
        shutil.copy(a_dir / "shard-00000.parquet", b_dir / "shard-00000.parquet")
    elif how == "corrupt-a0":
        corrupt_pages(a_dir / "shard-00000.parquet")
    elif how in ("fifo-a0", "dir-a0"):
        (a_dir / "shard-00000.parquet").unlink()
        make = os.mkfifo if how == "fifo-a0" else os.mkdir
        make(a_dir / "shard-00000.parquet")
    elif how.startswith("lock:"):
        lock.write_text(how.removeprefix("lock:"))
    elif how == "lock-dir":
        lock.mkdir()
    elif how == "lock-fifo":
        os.mkfifo(lock)
    elif how == "lock-unrelated":  # as an older sodaray, or a hand, wrote it: no start time
        lock.write_text(json.dumps({"host": HOST, "pid": pid, "since": time.time()}))
    elif how in ("lock-reused", "lock-other-boot"):
        start, boot = _start_ticks(pid), _boot()
        if how == "lock-reused":
            start -= 1  # the pid's process started at another time than the lock's
        else:
            boot = "0" + boot[1:] if boot[0] != "0" else "1" + boot[1:]
        lock.write_text(json.dumps({"host": HOST, "pid": pid, "boot": boot, "start": start}))
    else:
        raise AssertionError(how)


@pytest.mark.parametrize(
    "how,pending,warning", [c[1:] for c in RESUME_CASES], ids=[c[0] for c in RESUME_CASES]
)
def test_resume_trusts_only_this_jobs_shards_and_live_locks(
    tmp_path, finished, caplog, how, pending, warning
):
    """Issue 37: each row is computed again (with a warning naming the file and why), never
    trusted, obeyed, or ended in a traceback; `sweep status` does not count it as done."""
    import logging

    from sodaray.runner import sweep_status
    from sodaray.runner.jobs import plan_jobs
    from sodaray.runner.layout import release_lock

    sweep, root, (a, b) = two_jobs(tmp_path, finished)
    with unrelated_process() as pid:
        tamper(how, a, b, pid)
        status = {s.job: s for s in sweep_status(tmp_path / "out")}
        if not how.startswith(("lock", "cache")):  # status before any run: the bad shard is pending
            done = {job: s.done for job, s in status.items()}
            assert [done[a[0].name], done[b[0].name]] == [2 - len(p) for p in pending]
        with caplog.at_level(logging.WARNING):
            plans = plan_jobs(sweep.jobs(), root, lock=True)
        for plan in plans:
            release_lock(plan.meta)
    got = {p.job.name: p.pending for p in plans}
    assert (got[a[0].name], got[b[0].name]) == pending
    assert all(p.locked_by is None for p in plans)  # nothing here is another live driver
    assert warning in caplog.text, caplog.text
    named = next((v for k, v in NAMED.items() if how.startswith(k)), "shard-00000.parquet")
    assert named in caplog.text
    # Status counted the kept rows the run keeps (issue 53: it said 7 where the run kept 3).
    for p in plans:
        assert status[p.job.name].kept == sum(map(len, p.kept.values())) + p.kept_whole
    if how == "copy-a0-to-b0":  # kept for inspection beside the job's settings, never read
        assert (b[1] / "shard-00000.parquet.foreign").is_file()


def test_a_job_another_driver_holds_is_not_run_and_the_run_says_so(tmp_path, finished, capsys):
    """Issue 37: the job is skipped while a live sodaray driver holds it (the rule a second
    driver on one folder relies on), but the run does not end as if complete: it names the
    holder, lists the job as not run, and exits 1. Nothing is pending here, so no Ray starts."""
    from conftest import another_driver

    sweep, root, (a, _) = two_jobs(tmp_path, finished)
    for shard in a[0].glob("shard-*.parquet"):
        shard.unlink()
    with another_driver(a[1]) as pid:
        code = main(["sweep", "run", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "out")])
        out, err = capsys.readouterr()
        assert json.loads((a[1] / "job.lock").read_text())["pid"] == pid  # left alone
    assert code == 1, err
    assert f"skipped {a[0].name}: another driver is running it ({HOST} pid {pid} since" in err
    assert f"NOT RUN {a[0].name}: another driver holds its lock" in out


def test_a_lock_of_an_unrelated_pid_and_another_jobs_shard_are_computed_again(
    tmp_path, finished, capsys, caplog, local_ray
):
    """Issue 37, end to end: job A's lock names a live process that is not a sodaray run (the
    run used to skip A and exit 0 with its shard never computed) and job B holds a shard copied
    from A (resume used to trust it). One `sweep run` computes both, warning about each."""
    import logging

    import pyarrow.compute as pc

    from sodaray.results import read_results

    sweep, root, (a, b) = two_jobs(tmp_path, finished)
    (a[0] / "shard-00001.parquet").unlink()
    shutil.copy(a[0] / "shard-00000.parquet", b[0] / "shard-00000.parquet")
    with unrelated_process() as pid, caplog.at_level(logging.WARNING):
        (a[1] / "job.lock").write_text(json.dumps({"host": HOST, "pid": pid}))
        code = main(["sweep", "run", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    assert code == 0, err + out
    assert "is not a sodaray run" in caplog.text and "rows of another job" in caplog.text
    assert "2 shards run in" in out and "2 skipped" in out  # A's shard 1, B's shard 0
    rows = read_results(tmp_path / "out")
    assert len(rows) == 8
    for job in sweep.jobs():  # every row is its own job's
        mine = rows.filter(pc.equal(rows["job"], job.name))
        assert len(mine) == 4 and set(mine["config_hash"].to_pylist()) == {job.config_hash}


def test_a_swapped_cache_and_foreign_kept_rows_resume_as_one_seed_and_status_says_so(
    tmp_path, finished, capsys, caplog, local_ray
):
    """Issue 53, end to end: the dataset cache replaced by another seed's build and a shard
    deleted (the resume mixed 14 rows of one seed with 2 of the other, in silence), and kept
    rows beside two pending shards, one file of them another job's (`sweep status` counted it:
    "the next run keeps 3", and it kept 1). The cache is set aside and rebuilt, every row is
    of this seed's inputs, and status said what the run kept."""
    import logging

    from sodaray.data.store import read_dataset
    from sodaray.results import read_results
    from sodaray.runner import sweep_status

    sweep, root, (a, b) = two_jobs(tmp_path, finished)
    [cache] = root.glob(".sodaray/datasets/*.pq")
    truth = {r["sample_id"]: r["tokens"] for r in read_dataset(cache).to_pylist()}
    other = other_seeds_build()
    key = {CACHE_KEY: b"5eed2" + b"0" * 59}  # the other build's own
    pq.write_table(other.replace_schema_metadata({**other.schema.metadata, **key}), cache)
    b1 = pq.read_table(b[0] / "shard-00001.parquet")
    for folder in (a[0], b[0]):
        (folder / "shard-00001.parquet").unlink()
    shutil.copy(b[0] / "shard-00000.parquet", a[1] / "shard-00001.kept.pq")  # another job
    pq.write_table(b1.slice(0, 1), b[1] / "shard-00001.kept.pq")  # B's own: kept
    status = {s.job: s.kept for s in sweep_status(tmp_path / "out")}
    assert status == {a[0].name: 0, b[0].name: 1}
    with caplog.at_level(logging.WARNING):
        code = main(["sweep", "run", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    assert code == 0, err + out
    assert "1 samples of unfinished shards ended in an earlier run: kept" in err
    assert "not this entry's build" in caplog.text and "rows of another job" in caplog.text
    assert len(list(root.glob(".sodaray/datasets/*.foreign"))) == 1  # kept, never read
    rows = read_results(tmp_path / "out")
    assert len(rows) == 8
    assert len(set(rows["dataset_hash"].to_pylist())) == 1
    for r in rows.to_pylist():  # every row searched this seed's input for its sample id
        assert r["true_tokens"] == truth[r["sample_id"]]


# Issue 53: labels read from files are printed as data, never as layout (`errors.shown`).
LABELS = {
    # A costs file's `device:` with a line break split the plan table.
    "costs-device-newline": ("h100\nfake row", "h100\\nfake row"),
    "costs-source-terminal-escape": ("\x1b[2Jcleared", "\\x1b[2Jcleared"),
    "status-job-folder-newline": ("j\nx", "j\\nx"),
    "report-model-pipe-and-newline": ("m|x\ny", "m\\|x\\ny"),
}


@pytest.mark.parametrize("case", list(LABELS))
def test_labels_from_files_are_printed_as_data(tmp_path, capsys, case):
    label, printed = LABELS[case]
    (tmp_path / "s.yaml").write_text(sweep_text().replace("{model}", str(STORIES)))
    if case.startswith("costs"):
        field = "device" if "device" in case else "source"
        costs = {"device": "d", "kind": "cpu", "source": "s", field: label}
        costs["precisions"] = {
            "float32": {"pass_seconds": 0.001, "layer_seconds": 0.0, "flops_per_second": 1e12}
        }
        (tmp_path / "c.yaml").write_text(json.dumps(costs))  # JSON is YAML: escapes kept
        argv = ["sweep", "plan", str(tmp_path / "s.yaml"), "--no-calibrate"]
        argv += ["--costs", str(tmp_path / "c.yaml")]
        expect = 1 + 1 + 1 + 1 + 1  # model, sweep, priced by, header, the job
    elif case.startswith("status"):
        meta = tmp_path / "r" / ".sodaray" / "jobs" / label
        meta.mkdir(parents=True)
        (meta / "job.json").write_text(job_json(job=label))
        argv = ["sweep", "status", str(tmp_path / "r")]
        expect = 2
    else:
        rows = pq.read_table(Path(_rows_file(tmp_path)))
        i = rows.schema.get_field_index("model_name")
        rows = rows.set_column(i, "model_name", pa.array([label] * len(rows)))
        pq.write_table(rows, tmp_path / "rows.parquet")
        argv = ["report", str(tmp_path / "rows.parquet"), "--out", str(tmp_path / "rep")]
        argv += ["--no-figures", "--format", "md"]
        expect = None
    assert main(argv) == 0
    out = capsys.readouterr().out
    if expect is None:
        out = (tmp_path / "rep" / "model.md").read_text()
        table = [line for line in out.splitlines() if line.startswith("|")]
        widths = {len(line.replace("\\|", "").split("|")) for line in table}
        assert len(widths) == 1, out  # every row as many cells as the header
    else:
        lines = [line for line in out.splitlines() if line.strip()]
        if case.startswith("costs"):
            lines = lines[:5] if "device" in case else lines
        assert len(lines) >= expect, out
    assert printed in out, out
    assert label not in out and "\x1b" not in out


def _rows_file(tmp_path: Path) -> Path:
    path = tmp_path / "made" / "rows.parquet"
    path.parent.mkdir()
    write_rows(path, "rows")
    return path


REPORT_WARNED: list[tuple[str, str]] = [
    # One corrupt (not truncated) shard among good ones: the others still make the report.
    ("report-corrupt-shard-among-good", "corrupt"),
    ("report-fifo-named-like-a-shard", "fifo"),
]


@pytest.mark.parametrize("how", [c[1] for c in REPORT_WARNED], ids=[c[0] for c in REPORT_WARNED])
def test_report_warns_naming_a_bad_shard_and_reports_the_rest(
    tmp_path, finished, capsys, caplog, how
):
    """Issue 37: `report` on a folder with one bad shard used to end in a thrift error naming no
    file (a FIFO would block it for ever); now a warning names it and the good shards report."""
    import logging

    sweep, root, (a, _) = two_jobs(tmp_path, finished)
    bad = a[0] / "shard-00000.parquet"
    if how == "corrupt":
        corrupt_pages(bad)
    else:
        bad.unlink()
        os.mkfifo(bad)
    with caplog.at_level(logging.WARNING):
        code = main(["report", str(root), "--out", str(tmp_path / "rep"), "--no-figures"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "6 result rows" in out  # the three good shards
    assert f"skipped {bad}" in caplog.text
    assert (tmp_path / "rep" / "model.md").is_file()


def test_the_tables_hold_every_case_of_issue_37():
    """The issue's list, each a row here (and its siblings): token lists, presets, sizes, paths
    that are not regular files, context and model checks, shards, locks and report."""
    ids = {c[0] for c in CASES} | {c[0] for c in RESUME_CASES} | {c[0] for c in REPORT_WARNED}
    issue = {
        "tokens-space",
        "tokens-empty-item",
        "preset-soda-and-params",
        "preset-section-misspelt",
        "preset-include",
        "preset-30-mb",
        "plan-length-over-context",
        "plan-model-folder-empty",
        "plan-model-folder-without-weights",
        "shard-from-another-job",
        "lock-live-unrelated-pid",
        "lock-json-list",
        "sweep-file-a-directory",
        "sweep-file-dev-zero",
        "sweep-file-fifo",
        "report-corrupt-shard-among-good",
        "run-length-over-context",
    }
    assert issue <= ids
    assert len(RESUME_CASES) == len({c[0] for c in RESUME_CASES})


def test_the_tables_hold_every_case_of_issue_53():
    """The issue's cases that fit these tables (the rest: the timed waits in
    test_bounded_waits.py, the grid sampler and a study's preset in test_tuner.py, the
    100,000-job plan in test_sweep_plan.py), each a row here, with their siblings."""
    ids = {c[0] for c in CASES} | {c[0] for c in RESUME_CASES} | set(LABELS)
    issue = {
        "lock-nested-100000",  # '[' * 100000 in job.lock: RecursionError
        "cache-another-seeds-build",  # a cache swapped: two seeds' rows mixed
        "run-mlflow-empty",  # --mlflow '': nothing logged, nothing said
        "report-extrapolate-below-budget",
        "costs-device-newline",  # the plan table split
        "tune-int-step-half",  # step: 0.5 became step: 0
        "kept-from-another-job",  # status counted kept rows the run did not keep
    }
    assert issue <= ids
    assert len(ids) == len(CASES) + len(RESUME_CASES) + len(LABELS)  # no id twice
