"""`--mlflow URI`: a sweep and a two-trial study logged to a real MLflow tracking store (SQLite in
a temporary folder), on real Ray with stories260K, read back: parent and child runs, every
parameter that defines each, curves against steps, artifacts; the README's `mlflow ui` command
started on that store, its page and the runs its runs page shows fetched over HTTP; and the
one-line errors when MLflow is missing or its URI is wrong."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from conftest import STORIES

from sodaray.cli import main

ROOT = Path(__file__).resolve().parent.parent
BUDGET = 100  # steps per sample: enough for stories260K to find some length-1 inputs
CURVE_STEPS = list(range(2, BUDGET + 1, 2))  # a curve's 50 points: every budget/50 steps
SWEEPS = "tracked sweeps"  # the sweep's experiment, chosen with --mlflow-experiment


def write_tuning(tmp_path: Path) -> Path:
    spec = {
        "name": "tracked-study",
        "description": "two trials of SODA's learning rate",
        "model": {"id": str(STORIES), "num_cpus": 1},
        "data": {"build": {"dataset": "random", "lengths": "1", "per_length": 3, "seed": 1}},
        "algorithm": "soda",
        "fixed": {"temperature": 0.05},
        # Around SODA's default rate, where stories260K finds some of these inputs in the budget.
        "space": {"learning_rate": {"type": "float", "low": 0.05, "high": 0.08, "log": True}},
        "max_steps": 30,  # overridden on the command line: the runs show the budget that ran
        "trials": 2,
        "pruner": "median",  # waits for 3 trials: both run to their end
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
        "max_steps": 30,
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


# ---- a sweep and a study in one store, read back ------------------------------------------------
@pytest.fixture(scope="module")
def store(tmp_path_factory, local_ray):
    """A two-trial study and a sweep logged to one SQLite store, each run twice: the study one
    trial at a time (the second run resumes it and adds its trial under the same parent), the
    sweep again once finished (a resume: it must add no run), in an experiment of its own
    choosing; both with an override of the file's budget."""
    if not STORIES.is_dir():
        pytest.skip("stories260K not present")
    mlflow = pytest.importorskip("mlflow")
    tmp = tmp_path_factory.mktemp("tracked")
    uri = f"sqlite:///{tmp}/mlflow.db"
    over = f"max_steps={BUDGET}"
    for _ in range(2):
        assert main([*command("tune", tmp), over, "--trials", "1", "--mlflow", uri]) == 0
    for _ in range(2):
        sweep = [*command("sweep", tmp), over, "--mlflow", uri, "--mlflow-experiment", SWEEPS]
        assert main(sweep) == 0
    return tmp, mlflow.tracking.MlflowClient(tracking_uri=uri)


def runs_of(client, experiment: str) -> tuple[object, list]:
    """(the parent run, its children) of the experiment, which must hold one parent."""
    found = client.get_experiment_by_name(experiment)
    assert found is not None, experiment
    runs = client.search_runs([found.experiment_id], max_results=1000)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1, [r.info.run_name for r in parents]
    children = [r for r in runs if r is not parents[0]]
    assert all(r.data.tags["mlflow.parentRunId"] == parents[0].info.run_id for r in children)
    return parents[0], children


def check_curves(client, run, found: float, exact: float) -> list[float]:
    """Found and exact rates against steps: 50 points up to the budget, never falling, ending
    at the run's rates. Returns the exact curve's values."""
    for name, final in (("found_by_step", found), ("exact_by_step", exact)):
        curve = sorted(client.get_metric_history(run.info.run_id, name), key=lambda m: m.step)
        assert [m.step for m in curve] == CURVE_STEPS
        values = [m.value for m in curve]
        assert values == sorted(values) and values[-1] == pytest.approx(final)
    return values


def artifacts(client, run_id: str, path: str | None = None) -> set[str]:
    return {a.path for a in client.list_artifacts(run_id, path)}


def test_a_study_is_a_parent_run_with_a_child_run_per_trial(store):
    tmp, client = store
    parent, trials = runs_of(client, "tracked-study")  # the study's name; resumed: one parent
    assert parent.info.run_name == "study tracked-study" and parent.info.status == "FINISHED"
    p = parent.data.params
    assert p["model.id"] == str(STORIES) and p["dataset.name"] == "validation"
    assert p["algorithm"] == "soda" and p["metric"] == "exact" and p["max_steps"] == str(BUDGET)
    assert p["fixed.temperature"] == "0.05" and p["objective.kind"] == "logits"
    assert (p["space.learning_rate.low"], p["space.learning_rate.log"]) == ("0.05", "True")
    assert (p["sampler"], p["pruner"], p["trials"]) == ("tpe", "median", "2")
    # What the study spent and pruning saved (issue 54), as the leaderboard counts them.
    assert parent.data.metrics["sample_steps_spent"] > 0
    assert parent.data.metrics["sample_steps_saved"] >= 0
    assert json.loads(p["overrides"]) == [f"max_steps={BUDGET}"]
    assert parent.data.tags["mlflow.note.content"] == "two trials of SODA's learning rate"
    assert parent.data.metrics["trials_complete"] == 2  # the study's, after the second run
    history = client.get_metric_history(parent.info.run_id, "value")  # step: trial number
    assert sorted(m.step for m in history) == [0, 1]
    best = max(m.value for m in history)
    assert parent.data.metrics["best_value"] == pytest.approx(best)
    assert {"leaderboard.json", "best_preset.yaml", "plots", "settings"} <= artifacts(
        client, parent.info.run_id
    )
    assert "plots/history.png" in artifacts(client, parent.info.run_id, "plots")
    assert artifacts(client, parent.info.run_id, "settings") == {"settings/tune.yaml"}

    assert sorted(int(r.data.params["trial"]) for r in trials) == [0, 1]
    rising = 0
    for r in trials:
        p, n = r.data.params, r.data.params["trial"]
        rate = float(p["sampled.learning_rate"])
        assert r.info.run_name == f"soda learning_rate={rate:.4g}, trial {n}"
        assert 0.05 <= rate <= 0.08 and float(p["params.learning_rate"]) == rate
        # The budget, model, data, objective and fixed values, as a sweep's job logs them.
        assert p["params.max_steps"] == str(BUDGET) and p["params.temperature"] == "0.05"
        assert p["fixed.temperature"] == "0.05" and p["model.id"] == str(STORIES)
        assert p["dataset.name"] == "validation" and p["dataset.build.per_length"] == "3"
        assert p["objective.kind"] == "logits" and p["metric"] == "exact"
        assert p["study"] == "tracked-study" and p["algorithm"] == "soda"
        assert json.loads(p["overrides"]) == [f"max_steps={BUDGET}"]
        m = r.data.metrics
        assert m["samples"] == 3 and m["exact_rate"] == pytest.approx(m["exact"] / 3)
        assert m["value"] == pytest.approx(m["exact_rate"])  # the file's metric: exact
        exact = check_curves(client, r, m["found_rate"], m["exact_rate"])
        rising += exact[0] < exact[-1]
        checkpoints = client.get_metric_history(r.info.run_id, "checkpoint")
        assert sorted(c.step for c in checkpoints) == [25, 50, 75, 100]  # 4 per length
        assert r.data.tags["state"] == "COMPLETE" and r.info.status == "FINISHED"
        assert Path(r.data.tags["result_file"]).is_file() and r.data.tags["samples"] == "3"
    assert rising  # some inputs found within the budget: the counts and curves are not all 0


def test_a_sweep_is_a_parent_run_with_a_child_run_per_job(store):
    tmp, client = store
    parent, jobs = runs_of(client, SWEEPS)  # run twice: no run added by the resume
    assert client.get_experiment_by_name("tracked-sweep") is None  # not the default one
    assert parent.info.run_name == "sweep tracked-sweep" and parent.info.status == "FINISHED"
    p = parent.data.params
    assert json.loads(p["models"]) == [str(STORIES)] and json.loads(p["datasets"]) == ["random"]
    assert json.loads(p["algorithms.soda.grid.temperature"]) == [0.05, 0.1]
    assert p["max_steps"] == str(BUDGET) and p["jobs"] == "2"
    assert json.loads(p["overrides"]) == [f"max_steps={BUDGET}"]
    assert parent.data.metrics["samples_done"] == 6
    names = artifacts(client, parent.info.run_id)
    assert {"status.json", "report", "settings"} <= names, names
    report = artifacts(client, parent.info.run_id, "report")
    assert "report/README.md" in report and any(n.endswith(".png") for n in report), report
    assert artifacts(client, parent.info.run_id, "settings") == {"settings/sweep.yaml"}

    assert len(jobs) == 2
    assert sorted(r.data.params["params.temperature"] for r in jobs) == ["0.05", "0.1"]
    rising = 0
    for r in jobs:
        p = r.data.params
        assert r.info.run_name == p["job"] and r.info.run_name.startswith("stories260K")
        assert p["params.max_steps"] == str(BUDGET) and p["model.id"] == str(STORIES)
        assert p["dataset.name"] == "random" and p["objective.kind"] == "logits"
        assert p["algorithm"] == "soda" and p["sweep"] == "tracked-sweep"
        assert json.loads(p["overrides"]) == [f"max_steps={BUDGET}"]
        m = r.data.metrics
        assert m["samples_done"] == 3 and m["shards_done"] == 1
        assert m["exact_rate"] == pytest.approx(m["exact"] / 3)
        assert r.info.status == "FINISHED"
        # Logged once although the sweep ran twice.
        exact = check_curves(client, r, m["found_rate"], m["exact_rate"])
        rising += exact[0] < exact[-1]
        assert artifacts(client, r.info.run_id) == {"job.json"}
    assert rising  # stories260K finds some inputs within the budget: the curves show when
    assert Path(tmp, "mlartifacts", SWEEPS).is_dir()  # beside the database


def test_jobs_and_trials_share_their_parameter_and_curve_names(store):
    """What makes a sweep and a study comparable in one table and one chart."""
    _, client = store
    (_, trials), (_, jobs) = runs_of(client, "tracked-study"), runs_of(client, SWEEPS)
    shared = set(trials[0].data.params) & set(jobs[0].data.params)
    assert {"model.id", "dataset.name", "algorithm", "params.max_steps", "objective.kind"} <= shared
    assert {"params.learning_rate", "params.temperature", "overrides"} <= shared
    curves = {"found_by_step", "exact_by_step", "exact_rate", "found_rate", "final_loss_mean"}
    assert curves <= set(trials[0].data.metrics) & set(jobs[0].data.metrics)


# ---- the README's command starts the UI ---------------------------------------------------------
def readme_ui_command() -> list[str]:
    """The docs' `mlflow ui` line (docs/mlflow.md), run with this environment's `mlflow`."""
    lines = [
        line.split("#")[0].strip()
        for line in (ROOT / "docs" / "mlflow.md").read_text().splitlines()
        if line.strip().startswith("mlflow ui ")
    ]
    assert len(lines) == 1, lines  # one command to look at the runs
    argv = shlex.split(lines[0])
    return [str(Path(sys.executable).parent / "mlflow"), *argv[1:]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fetch(url: str, body: dict | None = None) -> bytes:
    data = None if body is None else json.dumps(body).encode()
    headers = {} if body is None else {"Content-Type": "application/json"}
    with urllib.request.urlopen(urllib.request.Request(url, data, headers), timeout=30) as r:
        return r.read()


def test_the_readme_command_starts_the_ui_and_it_shows_the_runs(store):
    tmp, client = store
    command = readme_ui_command()
    assert "sqlite:///mlflow.db" in command  # the store named in the README's commands
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    # One worker, and none of MLflow's background job runners (not what the UI needs), so the
    # server starts in seconds on a busy machine. Its own session: stopped, with every process
    # it started, by its group, and nothing else.
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    log = (tmp / "ui.log").open("wb")
    server = subprocess.Popen(
        [*command, "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        cwd=tmp,  # the README's relative sqlite:///mlflow.db is the store the fixture wrote
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, (tmp / "ui.log").read_text()[-3000:]
            try:
                if fetch(f"{base}/health").strip() == b"OK":
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            assert time.monotonic() < deadline, (tmp / "ui.log").read_text()[-3000:]
            time.sleep(0.5)
        page = fetch(f"{base}/").decode()
        assert "<title>MLflow</title>" in page
        # The UI's built page: mlflow-skinny has none, which is what made `mlflow ui` fail.
        bundle = re.search(r'src="(static-files/[^"]+\.js)"', page)
        assert bundle is not None, page[:500]
        assert len(fetch(f"{base}/{bundle.group(1)}")) > 1000

        # What the runs page asks for: the experiments, then their runs.
        api = f"{base}/ajax-api/2.0/mlflow"
        found = json.loads(fetch(f"{api}/experiments/search", {"max_results": 100}))
        ids = {e["name"]: e["experiment_id"] for e in found["experiments"]}
        assert {"tracked-study", SWEEPS} <= set(ids)
        body = {"experiment_ids": [ids["tracked-study"], ids[SWEEPS]], "max_results": 100}
        runs = json.loads(fetch(f"{api}/runs/search", body))["runs"]
        names = {r["info"]["run_name"]: r for r in runs}
        assert {"study tracked-study", "sweep tracked-sweep"} <= set(names)
        assert sum(name.startswith("soda learning_rate=") for name in names) == 2
        assert sum(name.startswith("stories260K") for name in names) == 2
        study = names["study tracked-study"]
        params = {p["key"]: p["value"] for p in study["data"]["params"]}
        assert params["model.id"] == str(STORIES) and params["max_steps"] == str(BUDGET)
        # The study's artifacts, served as the run page shows them.
        run_id = study["info"]["run_id"]
        plots = json.loads(fetch(f"{api}/artifacts/list?run_id={run_id}&path=plots"))
        assert "plots/history.png" in {f["path"] for f in plots["files"]}
        preset = fetch(f"{base}/get-artifact?path=best_preset.yaml&run_uuid={run_id}")
        assert "learning_rate" in yaml.safe_load(preset)["soda"]
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        try:  # whatever the server started and left behind, in its group alone
            os.killpg(server.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        server.wait()
        log.close()


def test_a_pruned_trials_curves_count_the_samples_it_never_finished(store):
    """A pruned trial's rows are the samples that finished: its curves are shares of every
    sample it was given, so they equal the curves of all its rows, unfinished ones not found."""
    from sodaray.cli.tracking.store import rate_curves
    from sodaray.results import read_results

    tmp, _ = store
    rows = read_results(tmp / "results" / "tracked-sweep").to_pandas()
    assert 0 < rows["found"].sum() < len(rows)  # some found, some not: the case at hand
    finished = rows[rows["found"]]

    def flat(curves: list[tuple[int, float, float]]) -> list[float]:
        return [x for point in curves for x in point]

    whole = flat(rate_curves(rows, BUDGET))
    assert flat(rate_curves(finished, BUDGET, samples=len(rows))) == pytest.approx(whole)
    assert flat(rate_curves(finished, BUDGET)) != pytest.approx(whole)  # shares of 3, not 6
