"""A preset file's `objective:` settings (e.g. `space: centred`): read, checked, applied under
every objective a sweep, tuning file or `sodaray invert` sets itself, and written by the tuner."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from conftest import STORIES

from sodaray.cli import main
from sodaray.config.presets import load_preset_file, load_preset_objective
from sodaray.experiment.spec import SweepError, TuningError
from sodaray.runner.spec import load_sweep
from sodaray.tuner import load_tuning
from sodaray.tuner.study import write_preset

pytestmark = pytest.mark.skipif(not STORIES.is_dir(), reason="stories260K not present")

SODA = {"learning_rate": 0.03, "decay": 0.98, "beta1": 0.9, "beta2": 0.995}


def preset(tmp_path: Path, objective=None, name: str = "p.yaml") -> Path:
    doc: dict = {"soda": SODA}
    if objective is not None:
        doc["objective"] = objective
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_preset_file_carries_how_candidates_are_compared(tmp_path):
    centred = preset(tmp_path, {"space": "centred", "huber_delta": "0.5"})
    assert load_preset_objective(centred) == {"space": "centred", "huber_delta": 0.5}
    assert load_preset_file(centred) == SODA  # SODA's knobs apart from the objective
    assert load_preset_objective(preset(tmp_path, None, "plain.yaml")) == {}
    flat = tmp_path / "flat.yaml"
    flat.write_text(yaml.safe_dump(SODA))
    assert load_preset_objective(flat) == {}


@pytest.mark.parametrize(
    "objective,message",
    [
        ({"top_k": 5}, "objective.top_k is not a preset setting"),  # what is observed
        ({"atol": 1.0}, "objective.atol is not a preset setting"),  # when a match counts
        ({"space": "sideways"}, "space must be one of raw, centred, logprobs"),
        ({"huber_delta": float("nan")}, "huber_delta must be a finite"),
        ({"huber_delta": -1.0}, "huber_delta must be positive"),
        ({"fluency_weight": "lots"}, "fluency_weight must be a number"),
        ({"loss": ["huber"]}, "loss"),
        (["space", "centred"], "'objective' must be a mapping"),
    ],
)
def test_bad_preset_objectives_are_one_line_errors(tmp_path, objective, message):
    with pytest.raises(ValueError, match=r"p\.yaml") as info:
        load_preset_objective(preset(tmp_path, objective))
    assert message in str(info.value) and "\n" not in str(info.value)


def sweep_file(tmp_path: Path, models: str, objectives: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(
        f"name: s\nmodels: {models}\n"
        "datasets: [{name: random, build: {dataset: random, lengths: '1', per_length: 2}}]\n"
        f"algorithms: [{{name: soda}}]\nobjectives: {objectives}\nmax_steps: 5\n"
    )
    return path


def test_a_sweep_applies_a_preset_objective_under_its_own_fields(tmp_path):
    p = preset(tmp_path, {"space": "centred"})
    # The second entry names the preset SODA's defaults equal (raw logits): with none, its
    # family's defaults would apply (tests/test_families.py).
    plain = f'{{id: "{STORIES}", preset: tinystories-33m}}'
    models = f'[{{id: "{STORIES}", name: tuned, preset_file: "{p}"}}, {plain}]'
    objectives = "[{kind: logits}, {kind: logits, space: raw}, {kind: logits, loss: mse}]"
    sweep = load_sweep(sweep_file(tmp_path, models, objectives))
    spaces = {(j.model.label, j.objective.space, j.objective.loss) for j in sweep.jobs()}
    assert spaces == {
        ("tuned", "centred", "huber"),  # the preset's setting where the entry says nothing
        ("tuned", "raw", "huber"),  # the entry's own `space: raw` wins
        ("tuned", "centred", "mse"),
        ("stories260K", "raw", "huber"),  # no preset file: the objective's default
        ("stories260K", "raw", "mse"),
    }
    # Results folders tell them apart: the hash and the name carry the preset's setting.
    tuned = [j for j in sweep.jobs() if j.model.label == "tuned"]
    assert len({j.config_hash for j in tuned}) == 3
    assert [j.name for j in tuned if j.objective.space == "centred" and j.objective.loss == "huber"]
    assert all("centred" in j.name for j in tuned if j.objective.space == "centred")


def test_a_preset_objective_that_clashes_with_the_sweeps_names_the_preset(tmp_path):
    p = preset(tmp_path, {"space": "centred"})
    models = f'[{{id: "{STORIES}", preset_file: "{p}"}}]'
    with pytest.raises(SweepError, match=r"models\[0\]\.preset_file.*centred top-1"):
        load_sweep(sweep_file(tmp_path, models, "[{kind: logits, top_k: 1}]"))
    bad = preset(tmp_path, {"kind": "text"}, "bad.yaml")
    models = f'[{{id: "{STORIES}", preset_file: "{bad}"}}]'
    with pytest.raises(SweepError, match=r"models\[0\]\.preset_file.*objective\.kind is not"):
        load_sweep(sweep_file(tmp_path, models, "[{kind: logits}]"))


def tuning_file(tmp_path: Path, model: dict, objective: dict | None = None) -> Path:
    doc = {
        "name": "t",
        "model": model,
        "data": {"build": {"dataset": "random", "lengths": "1", "per_length": 2, "seed": 0}},
        "space": {"learning_rate": {"type": "float", "low": 0.01, "high": 0.1}},
        "max_steps": 5,
        "trials": 1,
    }
    if objective is not None:
        doc["objective"] = objective
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_study_compares_as_its_preset_says_and_writes_how_it_compared(tmp_path):
    p = preset(tmp_path, {"space": "centred"})
    spec = load_tuning(tuning_file(tmp_path, {"id": str(STORIES), "preset_file": str(p)}))
    assert spec.objective_for({}).space == "centred"
    raw = load_tuning(
        tuning_file(tmp_path, {"id": str(STORIES), "preset_file": str(p)}, {"space": "raw"})
    )
    assert raw.objective_for({}).space == "raw"  # the tuning file's own field wins
    # A study run in centred logits writes a preset that is used in centred logits.
    spec = load_tuning(tuning_file(tmp_path, {"id": str(STORIES)}, {"space": "centred"}))
    best = SimpleNamespace(params={"learning_rate": 0.05}, number=3, value=0.5)
    written = write_preset(spec, best, tmp_path / "best.yaml")
    assert load_preset_objective(written) == {"space": "centred"}
    assert load_preset_file(written)["learning_rate"] == 0.05
    # One in raw logits (the default) writes no objective: nothing to apply.
    spec = load_tuning(tuning_file(tmp_path, {"id": str(STORIES), "preset": "tinystories-33m"}))
    written = write_preset(spec, best, tmp_path / "raw.yaml")
    assert "objective" not in yaml.safe_load(written.read_text())
    # One with no preset ran in its family's space (stories260K: Llama, centred): so is its own.
    spec = load_tuning(tuning_file(tmp_path, {"id": str(STORIES)}))
    written = write_preset(spec, best, tmp_path / "family.yaml")
    assert load_preset_objective(written) == {"space": "centred"}


def test_a_tuning_files_objective_that_clashes_with_its_preset_is_refused(tmp_path):
    p = preset(tmp_path, {"space": "centred"})
    model = {"id": str(STORIES), "preset_file": str(p)}
    with pytest.raises(TuningError, match=r"model\.preset_file.*centred top-1"):
        load_tuning(tuning_file(tmp_path, model, {"kind": "logits", "top_k": 1}))


def invert_row(args: list[str], capsys) -> dict:
    argv = ["invert", "--model", str(STORIES), "--tokens", "172", "--max-steps", "3", "--json"]
    assert main([*argv, *args]) == 0
    return json.loads(capsys.readouterr().out.splitlines()[-1])


def test_invert_takes_a_preset_files_objective_unless_a_flag_says_otherwise(tmp_path, capsys):
    p = preset(tmp_path, {"space": "centred", "loss": "mse"})
    row = invert_row(["--preset-file", str(p)], capsys)
    assert (row["space"], row["loss"]) == ("centred", "mse")
    row = invert_row(["--preset-file", str(p), "--space", "raw"], capsys)
    assert (row["space"], row["loss"]) == ("raw", "mse")
    row = invert_row(["--preset", "tinystories-33m"], capsys)
    assert (row["space"], row["loss"]) == ("raw", "huber")
    row = invert_row([], capsys)  # no preset: stories260K is Llama, whose family compares centred
    assert (row["space"], row["loss"], row["defaults"]["family"]) == ("centred", "huber", "llama")


def test_entries_that_make_one_job_twice_make_it_once(tmp_path):
    p = preset(tmp_path, {"space": "centred"})
    models = f'[{{id: "{STORIES}", preset_file: "{p}"}}]'
    objectives = "[{kind: logits}, {kind: logits, space: centred}]"
    jobs = load_sweep(sweep_file(tmp_path, models, objectives)).jobs()
    assert [j.objective.space for j in jobs] == ["centred"]  # one folder: one job
    twice = f'[{{id: "{STORIES}"}}, {{id: "{STORIES}"}}]'
    assert len(load_sweep(sweep_file(tmp_path, twice, "[{kind: logits}]")).jobs()) == 1


def test_shipped_presets_load_and_the_centred_one_compares_in_centred_logits():
    root = Path(__file__).resolve().parents[1] / "tuning" / "presets"
    settings = {p.name: load_preset_objective(p) for p in sorted(root.glob("*.yaml"))}
    for path in root.glob("*.yaml"):
        assert load_preset_file(path)["learning_rate"] > 0
    assert settings.pop("smollm2-135m-bos-centred.yaml") == {"space": "centred"}
    assert settings and all(s == {} for s in settings.values())  # the others: raw, the default
