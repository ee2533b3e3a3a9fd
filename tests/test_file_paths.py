"""One rule for relative paths in sweep and tuning files (issue 39): read from the folder of the
file that names them, as `include:` always was, so a file runs the same from any directory;
job hashes keep the path as written; a file written for the old rule (paths from the current
directory) still runs, with a warning saying how to write it; a missing path is one line that
names the rule and where it was looked for."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
import yaml
from conftest import SHARED, STORIES, one_line_error, stand_in

from sodaray.cli import main
from sodaray.costs.flops import model_shape
from sodaray.runner.spec import load_sweep
from sodaray.tuner.spec import load_tuning

pytestmark = pytest.mark.skipif(not STORIES.is_dir(), reason="stories260K not present")
ROOT = Path(__file__).resolve().parents[1]
JSONL = SHARED / "data" / "tinystories_valid.jsonl"
RULE = "a relative path in a sweep or tuning file is read from the file's folder"


def write(path: Path, doc: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def sweep_doc(model: str, **extra) -> dict:
    return {
        "name": "s",
        "models": [{"id": model, "num_cpus": 1, **extra}],
        "datasets": [{"name": "random", "build": {"dataset": "random", "lengths": 1}}],
        "algorithms": [{"name": "soda"}],
        "max_steps": 5,
    }


def rel(target: Path, start: Path) -> str:
    return os.path.relpath(target, start)


def test_paths_are_read_from_the_files_folder_whatever_the_directory(tmp_path, monkeypatch, caplog):
    folder = tmp_path / "study"
    preset = write(folder / "presets" / "p.yaml", {"soda": {"temperature": 0.07}})
    path = write(
        folder / "s.yaml",
        sweep_doc(rel(STORIES, folder), preset_file=rel(preset, folder)),
    )
    names = set()
    for cwd in (tmp_path, folder, ROOT, Path("/")):
        monkeypatch.chdir(cwd)
        with caplog.at_level(logging.WARNING, logger="sodaray.io.paths"):
            (job,) = load_sweep(path).jobs()
        assert caplog.text == ""  # nothing read from the current directory
        assert job.model.id == rel(STORIES, folder)  # rows and hashes keep it as written
        assert job.model.resolved().source == str(STORIES)
        assert job.search.temperature == 0.07  # the preset file, found from the file's folder
        names.add(job.name)
    assert len(names) == 1  # one job folder, whichever directory the sweep ran from


def test_tuning_files_read_model_data_source_and_start_from_from_their_folder(
    tmp_path, monkeypatch
):
    folder = tmp_path / "tune"
    write(folder / "start.yaml", {"soda": {"learning_rate": 0.07}})
    path = write(
        folder / "t.yaml",
        {
            "name": "t",
            "model": {"id": rel(STORIES, folder)},
            "data": {"build": {"dataset": "nl-id", "lengths": 1, "source": rel(JSONL, folder)}},
            "space": {"learning_rate": {"low": 0.01, "high": 0.1}},
            "start_from": "start.yaml",
        },
    )
    monkeypatch.chdir("/")
    spec = load_tuning(path)
    assert spec.model.resolved().source == str(STORIES)
    assert Path(spec.data.source_location()).resolve() == JSONL.resolve()
    assert spec.data.build["source"] == rel(JSONL, folder)  # the study's hash keeps it as written
    assert spec.start_params() == {"learning_rate": 0.07}


def test_an_included_files_paths_are_read_from_its_own_folder(tmp_path, monkeypatch):
    common = tmp_path / "common"
    write(common / "models.yaml", {"models": [{"id": rel(STORIES, common), "num_cpus": 1}]})
    doc = sweep_doc("unused")
    del doc["models"]
    path = write(tmp_path / "sweeps" / "s.yaml", {"include": "../common/models.yaml", **doc})
    monkeypatch.chdir("/")
    (job,) = load_sweep(path).jobs()
    assert job.model.resolved().source == str(STORIES)
    # Written as from the including file's folder: one folder for every path in the document.
    assert job.model.id == rel(STORIES, tmp_path / "sweeps")


def test_a_missing_path_names_the_rule_and_where_it_looked(tmp_path, capsys, monkeypatch):
    path = write(tmp_path / "sub" / "s.yaml", sweep_doc("../models/none"))
    monkeypatch.chdir(ROOT)
    err = one_line_error(["sweep", "plan", str(path), "--no-calibrate"], capsys)
    assert "models[0].id: no such model folder or file: ../models/none" in err
    assert f"looked for {tmp_path / 'models' / 'none'}: {RULE}" in err
    preset = write(tmp_path / "sub" / "p.yaml", sweep_doc(str(STORIES), preset_file="none.yaml"))
    err = one_line_error(["sweep", "plan", str(preset), "--no-calibrate"], capsys)
    assert f"no such preset file: none.yaml (looked for {tmp_path / 'sub' / 'none.yaml'}" in err


def test_a_file_written_for_the_current_directory_still_runs_with_a_warning(
    tmp_path, monkeypatch, caplog
):
    old = rel(STORIES, tmp_path)  # right from tmp_path, where the old rule read it
    path = write(tmp_path / "sweeps" / "s.yaml", sweep_doc(old))
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.WARNING, logger="sodaray.io.paths"):
        (job,) = load_sweep(path).jobs()
    assert job.model.resolved().source == str(STORIES)
    assert job.model.id == old  # its hash as before: old results folders resume
    assert RULE in caplog.text and f"write it as {rel(STORIES, tmp_path / 'sweeps')}" in caplog.text


def test_shipped_files_run_from_the_root_and_from_elsewhere_without_a_warning(monkeypatch, caplog):
    files = sorted((ROOT / "sweeps").glob("*.yaml")) + sorted((ROOT / "tuning").glob("*.yaml"))
    for cwd in (ROOT, Path("/")):
        monkeypatch.chdir(cwd)
        for path in files:
            with caplog.at_level(logging.WARNING, logger="sodaray.io.paths"):
                if path.parent.name == "sweeps":
                    assert load_sweep(path, model=stand_in(path)).jobs(), path
                else:
                    assert load_tuning(path).distributions(), path
            assert caplog.text == "", path


def test_tune_dry_run_shows_each_range_and_an_estimate(tmp_path, capsys):
    args = ["tune", str(ROOT / "tuning" / "stories260k.yaml"), "space.temperature.high=0.3"]
    args += ["trials=3", "--dry-run", "--rate", "100", "--workers", "2"]
    assert main([*args, "--out", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    plan = json.loads(out)
    # A bound override shows as the range the study samples, not a class name.
    assert plan["space"]["temperature"] == {
        "type": "float",
        "low": 0.01,
        "high": 0.3,
        "log": False,
        "step": None,
    }
    assert plan["space"]["learning_rate"]["log"] is True
    # The shipped file's pruner and what its 2 checkpoints report (issue 54).
    assert (plan["pruner"], plan["signal"]) == ("successive_halving", "loss")
    assert plan["checkpoints"] == [300, 600]
    assert plan["space"]["reset_period"] == {
        "type": "int",
        "low": 10,
        "high": 110,
        "log": False,
        "step": 10,
    }
    est = plan["estimate"]
    # 5 lengths x 20 validation samples, 600 steps each at most, 3 trials.
    assert est["samples"] == 100 and est["sample_steps"] == 3 * 100 * 600
    # FLOPs from stories260K's config, as `sweep plan` counts them: a forward over BOS, the
    # input and the outputs but the last, a backward to the input as dear again, the update.
    shape = model_shape(str(STORIES))
    outputs = load_tuning(ROOT / "tuning" / "stories260k.yaml").objective_for({}).output_tokens
    flops = 3 * 20 * 600 * sum(shape.step_flops(n, outputs, True) for n in range(1, 6))
    assert est["flops"] == pytest.approx(flops)
    # A CPU model at --rate: 100 sample-steps/s per worker, two workers side by side.
    assert est["priced_by"] == "--rate" and est["kind"] == "cpu"
    assert est["device_seconds"] == pytest.approx(3 * 100 * 600 / 100)
    assert est["wall_seconds"] == pytest.approx(3 * 100 * 600 / (100 * 2))
    assert est["cpu_hours"] == pytest.approx(0.5) and est["gpu_hours"] == 0
    assert est["estimate"] == "15.0 min" and est["calibrated"] is False
    # The same lines as `sweep plan`'s, on stderr (stdout holds the JSON alone).
    assert "estimate: 0.50 CPU-hours" in err and "estimate: 15.0 min of wall" in err
    # Without a rate, a CPU model has no price (the default h100 costs price GPU models):
    # counts and FLOPs only, no time made up.
    dry = ["tune", str(ROOT / "tuning" / "stories260k.yaml"), "--dry-run", "--out", str(tmp_path)]
    assert main(dry) == 0
    out, err = capsys.readouterr()
    est = json.loads(out)["estimate"]
    assert est["wall_seconds"] is None and est["priced_by"] == "-" and est["flops"] > 0
    assert "no price: pass --rate" in err
