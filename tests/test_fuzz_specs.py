"""Issue 30: sweep and tuning documents built from the files' own fields, filled with hostile
strings, numbers, nesting and YAML aliases (hypothesis). Whatever the document, `sweep plan`
and `tune`'s loader end in success or in one line and exit 2 (no traceback), within seconds,
and write nothing outside `--out`.

Bounded for CI: a fixed number of examples from a fixed seed (`derandomize`), each under an
alarm; `SODARAY_FUZZ_EXAMPLES` runs more where time allows.
"""

from __future__ import annotations

import os
from dataclasses import fields
from pathlib import Path

import pytest
import yaml
from conftest import STORIES, cli_outcome
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sodaray.data.build import BUILD_KEYS
from sodaray.experiment.spec import MODEL_KEYS, OBJECTIVE_KEYS
from sodaray.runner.spec import ALGORITHM_KEYS, TOP_KEYS
from sodaray.search.soda.config import SodaConfig
from sodaray.tuner.spec import TOP_KEYS as TUNING_KEYS

pytestmark = pytest.mark.skipif(not STORIES.is_dir(), reason="stories260K not present")

EXAMPLES = int(os.environ.get("SODARAY_FUZZ_EXAMPLES", "150"))
SECONDS = 20  # per example: parsing and planning a document is milliseconds

HOSTILE_TEXT = [
    "..", ".", "/etc/passwd", "../../x", "a/b", "", " ", "x" * 300, "nul\0byte", "$HOME",
    "${SODARAY_FUZZ_UNSET}/m", "~", "\u202e", "é", "random", "soda", "logits", "1-3", "1-99999999",
    "tpe", "grid", str(STORIES),
]  # fmt: skip
HOSTILE_NUMBERS = [0, -1, 1, 2, 3, 2.5, 1e-12, 1e308, 10**30, float("nan"), float("inf"), True]
NAMES = sorted(
    {*TOP_KEYS, *TUNING_KEYS, *MODEL_KEYS, *BUILD_KEYS, *OBJECTIVE_KEYS, *ALGORITHM_KEYS}
    | {f.name for f in fields(SodaConfig)}
    | {"low", "high", "step", "log", "type", "choices", "path", "build", "params"}
)

scalars = st.one_of(
    st.sampled_from(HOSTILE_TEXT), st.sampled_from(HOSTILE_NUMBERS), st.none(), st.text(max_size=8)
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(NAMES), inner, max_size=4)
    ),
    max_leaves=12,
)


def mostly(valid, hostile=values):
    """`valid` three times in four: a document must get past its first field to reach the
    checks behind it."""
    return st.one_of(valid, valid, valid, hostile)


def entries(keys, valid_value=scalars, max_size=3):
    return st.dictionaries(st.sampled_from(sorted(keys)), mostly(valid_value), max_size=max_size)


SODA_FIELDS = sorted(f.name for f in fields(SodaConfig))
small_numbers = st.sampled_from([1, 2, 5, 0.1, 0.5, 0.9, 1e-3])


@st.composite
def documents(draw, kind: str) -> dict:
    """A document of `kind` (sweep or tuning): its fields mostly well-formed, each value now and
    then drawn from the hostile pool; some values shared, so the YAML dump writes them as
    aliases."""
    model = {"id": draw(mostly(st.just(str(STORIES)), st.sampled_from(["gpt2", *HOSTILE_TEXT])))}
    model.update(draw(entries(MODEL_KEYS - {"id", "datasets"})))
    build = {"dataset": "random", "lengths": "1-2", "per_length": 2}
    build.update(draw(entries(BUILD_KEYS, max_size=2)))
    name = draw(mostly(st.just("random"), st.sampled_from(HOSTILE_TEXT)))
    dataset = {"name": name, "build": build}
    shared = draw(mostly(st.lists(small_numbers, min_size=1, max_size=3)))  # aliased below
    if kind == "sweep":
        doc = {
            "name": draw(mostly(st.just("s"), st.sampled_from(HOSTILE_TEXT))),
            "models": [model],
            "datasets": [dataset],
            "algorithms": [
                {
                    "name": draw(mostly(st.just("soda"), st.sampled_from(HOSTILE_TEXT))),
                    "params": draw(entries(SODA_FIELDS, small_numbers, max_size=2)),
                    "grid": draw(
                        st.dictionaries(st.sampled_from(SODA_FIELDS), st.just(shared), max_size=3)
                    ),
                }
            ],
            "max_steps": 5,
        }
        extra = draw(entries(TOP_KEYS - {"name", "models", "datasets", "algorithms"}))
    else:
        param = {"low": 0.01, "high": 0.1, **draw(entries(["low", "high", "step", "log", "type"]))}
        space = {draw(mostly(st.just("learning_rate"), st.sampled_from(NAMES))): param}
        space.update(draw(entries(SODA_FIELDS, values, max_size=1)))
        doc = {
            "name": draw(mostly(st.just("t"), st.sampled_from(HOSTILE_TEXT))),
            "model": model,
            "data": {"build": {**build, "seed": 0}},
            "space": space,
            "max_steps": 5,
            "trials": 1,
        }
        extra = draw(entries(TUNING_KEYS - {"name", "model", "data", "space"}))
    doc.update(extra)
    if draw(st.booleans()):
        doc["description"] = shared
    return doc


def dump(doc: dict) -> str:
    try:
        return yaml.safe_dump(doc, allow_unicode=True)
    except yaml.YAMLError:  # a value YAML cannot write (NUL): write what remains
        return yaml.safe_dump({k: v for k, v in doc.items() if k == "name"})


def check_one(tmp_path: Path, argv: list[str], capsys) -> None:
    _, err, broken = cli_outcome(argv, capsys, SECONDS)
    assert broken == [], err
    outside = [
        p
        for p in tmp_path.rglob("*")
        if p.is_file() and p.parent != tmp_path and "o" not in p.parts
    ]
    assert outside == [], outside


SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,  # nothing written into the checkout
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@SETTINGS
@given(doc=documents("sweep"))
def test_any_sweep_document_plans_or_fails_in_one_line(doc, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # `gpt2`, a hub id, with no preset: its family's defaults need its config, which an offline
    # machine fails to read in one line at once (the hub's retries would outlast the alarm).
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = tmp_path / "s.yaml"
    path.write_text(dump(doc), encoding="utf-8")
    check_one(tmp_path, ["sweep", "plan", str(path), "--no-calibrate"], capsys)


@SETTINGS
@given(doc=documents("tuning"))
def test_any_tuning_document_loads_or_fails_in_one_line(doc, tmp_path, capsys, monkeypatch):
    """`tune --dry-run`: the file read and checked as `tune` does, nothing run."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # as above
    path = tmp_path / "t.yaml"
    path.write_text(dump(doc), encoding="utf-8")
    check_one(tmp_path, ["tune", str(path), "--out", str(tmp_path / "o"), "--dry-run"], capsys)
