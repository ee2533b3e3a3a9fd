"""Issue 28: `include:` of shared YAML pieces and KEY=VALUE overrides on the command line, in the
files' own names, validated as the file, recorded, and covered by the job hash."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import STORIES

from sodaray.cli import main
from sodaray.config.configfile import apply_override
from sodaray.runner import load_sweep
from sodaray.tuner import load_tuning

MODELS = f"""models:
  - {{id: "{STORIES}", name: tiny, num_cpus: 1}}
  - {{id: "{STORIES}", name: qwen2.5-0.5b, bos: false}}
"""
SWEEP = """name: s
include: [models.yaml]
datasets: [{name: random, build: {dataset: random, lengths: "1", per_length: 2}}]
algorithms: [{name: soda, params: {temperature: 0.05}}]
max_steps: 5
"""


def write(tmp_path: Path, **files: str) -> Path:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return tmp_path / next(iter(files))


def test_include_merges_shared_pieces_under_the_files_own_keys(tmp_path):
    path = write(tmp_path, **{"s.yaml": SWEEP, "models.yaml": MODELS + "max_steps: 99\n"})
    sweep = load_sweep(path)
    assert [m.label for m in sweep.models] == ["tiny", "qwen2.5-0.5b"]
    assert sweep.max_steps == 5  # the including file's own value wins
    write(tmp_path, **{"models.yaml": "include: s.yaml\n" + MODELS})
    with pytest.raises(ValueError, match="includes itself"):
        load_sweep(path)
    write(tmp_path, **{"models.yaml": "- just a list\n"})
    with pytest.raises(ValueError, match="an included file is a mapping"):
        load_sweep(path)


def test_overrides_address_fields_by_name_index_and_dotted_names(tmp_path):
    path = write(tmp_path, **{"s.yaml": SWEEP, "models.yaml": MODELS})
    base = load_sweep(path)
    over = load_sweep(
        path,
        overrides=[
            "models.qwen2.5-0.5b.bos=true",  # a name with dots: the longest match
            "models.0.num_cpus=2",
            "algorithms.soda.params.temperature=0.07",
            "algorithms.soda.params.decay=1e-1",  # a field the entry did not have: created
            "seeds=[0, 1]",
        ],
    )
    assert [m.bos for m in over.models] == [None, True]
    assert over.models[0].num_cpus == 2.0 and over.seeds == [0, 1]
    assert over.algorithms[0].params == {"temperature": 0.07, "decay": 0.1}
    # The hash covers the final values: every job is a new one.
    assert not {j.name for j in base.jobs()} & {j.name for j in over.jobs()}
    assert {j.search.temperature for j in over.jobs()} == {0.07}
    assert over.overrides[0] == "models.qwen2.5-0.5b.bos=true"


@pytest.mark.parametrize(
    "override, message",
    [
        ("models.llama.bos=true", "no entry named 'llama' (have: "),
        ("models.7.bos=true", "has 2 entries, not 8"),
        ("max_steps", "write KEY=VALUE"),
        ("=5", "the key is empty"),
        ("models..bos=true", "an empty part"),
        ("max_steps.x=1", "max_steps is 5, not a mapping or a list"),
        ("max_steps=[1", "not a YAML value"),
        ("max_steps=-3", "max_steps: must be at least 1"),  # validated as the file
        ("models.tiny.nope=1", "models[0].nope: unknown field"),
    ],
)
def test_a_bad_override_is_one_line_naming_it(tmp_path, capsys, override, message):
    path = write(tmp_path, **{"s.yaml": SWEEP, "models.yaml": MODELS})
    assert main(["sweep", "plan", str(path), "--no-calibrate", override]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_plan_json_parses_and_tune_takes_overrides(tmp_path, capsys):
    path = write(tmp_path, **{"s.yaml": SWEEP, "models.yaml": MODELS})
    assert main(["sweep", "plan", str(path), "--no-calibrate", "--json", "max_steps=7"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert {job["max_steps"] for job in plan["jobs"]} == {7}
    tuning = Path(__file__).resolve().parents[1] / "tuning" / "stories260k.yaml"
    spec = load_tuning(tuning, ["max_steps=33", "space.temperature.high=0.3"])
    assert spec.max_steps == 33
    assert next(p for p in spec.space if p.name == "temperature").high == 0.3


def test_apply_override_copies_only_along_its_path():
    doc = {"a": {"b": 1}, "c": [{"name": "x", "v": 1}], "d": {"e": 2}}
    out = apply_override(doc, "c.x.v=2")
    assert out["c"][0]["v"] == 2 and doc["c"][0]["v"] == 1  # the input is left as it was
    assert out["d"] is doc["d"]


def test_one_nesting_bound_for_json_and_yaml_at_64_levels():
    """Issue 53: every parser has a nesting bound, the same for JSON and YAML (`files.MAX_NESTING`),
    checked without recursion; 64 levels read, 65 do not, brackets inside strings do not count."""
    import yaml

    from sodaray.config.yamltext import yaml_load
    from sodaray.io.files import MAX_NESTING, json_depth, parse_json

    assert MAX_NESTING == 64
    ok, deep = "[" * 64 + "]" * 64, "[" * 65 + "]" * 65
    assert json_depth(ok) == 64 and parse_json(ok) is not None
    assert yaml_load(ok) is not None
    with pytest.raises(ValueError, match="nested more than 64 levels deep"):
        parse_json(deep)
    with pytest.raises(yaml.YAMLError, match="nested more than 64 levels deep"):
        yaml_load(deep)
    # Brackets in strings (escaped quotes too) are text, not nesting.
    text = json.dumps({"a": "[" * 1000 + '\\"{' * 500})
    assert parse_json(text) == json.loads(text) and json_depth(text) == 1
    assert yaml_load("a: '" + "[" * 1000 + "'")["a"] == "[" * 1000
