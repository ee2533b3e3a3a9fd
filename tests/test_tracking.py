"""`--mlflow URI`: tuning trials (Optuna's MLflow callback) and sweep jobs logged to a real MLflow
tracking store (SQLite in tmp_path), on real Ray with stories260K; and the one-line errors when
MLflow is missing or its URI is wrong."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from conftest import STORIES

from sodaray.cli import main


def write_tuning(tmp_path: Path) -> Path:
    spec = {
        "name": "tracked-study",
        "model": {"id": str(STORIES), "num_cpus": 1},
        "data": {"build": {"dataset": "random", "lengths": "1", "per_length": 3, "seed": 0}},
        "algorithm": "soda",
        "space": {"learning_rate": {"type": "float", "low": 0.03, "high": 0.3, "log": True}},
        "max_steps": 20,
        "trials": 2,
    }
    path = tmp_path / "tune.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def write_sweep(tmp_path: Path) -> Path:
    spec = {
        "name": "tracked-sweep",
        "models": [{"id": str(STORIES), "num_cpus": 1}],
        "datasets": [
            {"name": "random", "build": {"dataset": "random", "lengths": "1", "per_length": 3}}
        ],
        "algorithms": [{"name": "soda", "grid": {"temperature": [0.05, 0.1]}}],
        "max_steps": 20,
        "shard_size": 3,
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def command(kind: str, tmp_path: Path) -> list[str]:
    if kind == "tune":
        return ["tune", str(write_tuning(tmp_path)), "--out", str(tmp_path / "runs")]
    return ["sweep", "run", str(write_sweep(tmp_path)), "--out", str(tmp_path / "results")]


@pytest.mark.parametrize("kind", ["tune", "sweep"])
def test_missing_mlflow_is_one_line_naming_the_extra(tmp_path, capsys, monkeypatch, kind):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if not installed: import fails
    code = main([*command(kind, tmp_path), "--mlflow", f"sqlite:///{tmp_path}/m.db"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "pip install 'sodaray[mlflow]'" in err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "results").exists()


@pytest.mark.parametrize("kind", ["tune", "sweep"])
def test_a_bad_tracking_uri_is_one_line_before_anything_runs(tmp_path, capsys, kind):
    pytest.importorskip("mlflow")
    code = main([*command(kind, tmp_path), "--mlflow", "nosuchscheme://x"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "--mlflow nosuchscheme://x" in err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "results").exists()


@pytest.mark.skipif(not STORIES.is_dir(), reason="stories260K not present")
def test_trials_and_sweep_jobs_are_logged_to_mlflow(tmp_path, local_ray, capsys):
    mlflow = pytest.importorskip("mlflow")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)

    assert main([*command("tune", tmp_path), "--mlflow", uri]) == 0, capsys.readouterr()
    study = client.get_experiment_by_name("tracked-study")  # the study's name
    trials = client.search_runs([study.experiment_id])
    assert sorted(r.info.run_name for r in trials) == ["0", "1"]
    for r in trials:
        assert 0 <= r.data.metrics["exact"] <= 1  # the tuning file's metric
        checkpoints = client.get_metric_history(r.info.run_id, "checkpoint")
        assert len(checkpoints) == 4 and checkpoints[-1].step == 20  # the default 4 per length
        assert 0.03 <= float(r.data.params["learning_rate"]) <= 0.3
        assert r.data.tags["state"] == "COMPLETE" and r.data.tags["total"] == "3"
        assert Path(r.data.tags["result_file"]).is_file()

    sweep = command("sweep", tmp_path)
    for _ in range(2):  # a second run (a resume) updates the jobs' runs, adds none
        assert main([*sweep, "--mlflow", uri]) == 0, capsys.readouterr()
    jobs = client.get_experiment_by_name("tracked-sweep")  # the sweep's name
    runs = client.search_runs([jobs.experiment_id])
    jobs_runs = [r for r in runs if r.data.tags["sodaray.kind"] == "job"]
    assert len(jobs_runs) == 2
    assert sorted(r.data.params["params.temperature"] for r in jobs_runs) == ["0.05", "0.1"]
    for r in jobs_runs:
        metrics = r.data.metrics
        assert metrics["samples_done"] == 3 and metrics["shards_done"] == 1
        assert metrics["exact_rate"] == pytest.approx(metrics["exact"] / 3)
        assert r.info.status == "FINISHED" and r.info.run_name.startswith("stories260K")
        # Curves against steps, logged once although the sweep ran twice; they end at the rate.
        curve = client.get_metric_history(r.info.run_id, "exact_by_step")
        assert len(curve) == 20 and [m.step for m in curve] == list(range(1, 21))
        assert curve[-1].value == pytest.approx(metrics["exact_rate"])
        assert [m.value for m in curve] == sorted(m.value for m in curve)
        assert [a.path for a in client.list_artifacts(r.info.run_id)] == ["job.json"]
    (report,) = [r for r in runs if r.data.tags["sodaray.kind"] == "sweep"]
    names = [a.path for a in client.list_artifacts(report.info.run_id, "report")]
    assert "report/README.md" in names and any(n.endswith(".png") for n in names), names
    assert Path(tmp_path, "mlartifacts").is_dir()  # beside the database, not in the cwd
