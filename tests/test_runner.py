"""The sweep runner on real Ray (local, CPU) and the real stories260K model."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import yaml
from conftest import STORIES

from sodaray.cli import main
from sodaray.results import read_results
from sodaray.runner import SweepInterrupted, load_sweep, run_sweep, sweep_status

pytestmark = pytest.mark.skipif(not STORIES.is_dir(), reason="stories260K not present")


def write_sweep(tmp_path: Path, **overrides) -> Path:
    spec = {
        "name": "t",
        "models": [{"id": str(STORIES), "num_cpus": 1, "replicas": 2}],
        "datasets": [
            {"name": "random", "build": {"dataset": "random", "lengths": "1-2", "per_length": 4}}
        ],
        "algorithms": [{"name": "soda", "grid": {"temperature": [0.05, 0.1]}}],
        "objectives": [{"kind": "logits"}],
        "max_steps": 20,
        "shard_size": 2,
    }
    spec.update(overrides)
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def rows_by_job(out: Path) -> list[tuple[str, int]]:
    table = read_results(out)
    return sorted(zip(table["job"].to_pylist(), table["sample_id"].to_pylist(), strict=True))


def expected_rows(sweep) -> list[tuple[str, int]]:
    return sorted((job.name, i) for job in sweep.jobs() for i in range(8))


def test_two_jobs_two_actors_write_each_row_once(tmp_path, local_ray):
    sweep = load_sweep(write_sweep(tmp_path))
    run = run_sweep(sweep, tmp_path / "out")
    assert run.jobs == 2 and run.shards_total == 8 and len(run.done) == 8 and not run.failed
    assert len({d.pid for d in run.done}) == 2  # both actors worked
    assert rows_by_job(tmp_path / "out") == expected_rows(sweep)
    row = read_results(tmp_path / "out").to_pylist()[0]
    assert row["sweep"] == "t" and row["config_hash"] and row["max_steps"] == 20
    assert row["dataset"] == "random" and row["true_tokens"] and '"torch"' in row["versions"]
    assert row["model"] == str(STORIES) and row["model_name"] == "stories260K"
    # The report has a row per job.
    assert main(["report", str(tmp_path / "out"), "--out", str(tmp_path / "report")]) == 0
    jobs_md = (tmp_path / "report" / "jobs.md").read_text()
    assert all(job.name in jobs_md for job in sweep.jobs())
    # A finished sweep runs nothing again.
    again = run_sweep(sweep, tmp_path / "out")
    assert again.done == [] and again.shards_skipped == 8
    status = sweep_status(tmp_path / "out")
    assert [(s.done, s.pending, s.samples_done) for s in status] == [(4, 0, 8), (4, 0, 8)]


def test_killed_actor_loses_and_duplicates_nothing(tmp_path, local_ray):
    # One actor: after the kill, every shard it had not finished can only be done by the
    # restarted actor. (With two, the survivor may finish everything first on a loaded machine,
    # and the restart goes unobserved.) The replica holds several shards at once, so shards it
    # finished before the kill may be reported after the first; how many is a race, so the
    # test asserts what does not depend on it. The unit-level kill test is test_replicas.py's.
    models = [{"id": str(STORIES), "num_cpus": 1, "replicas": 1}]
    # 300 steps: the length-2 shards are still running when the first length-1 shard is done.
    sweep = load_sweep(write_sweep(tmp_path, models=models, max_steps=300))
    killed = []

    def kill_once(done) -> None:
        if not killed:  # the actor holds more shards: kill it mid-work
            killed.append(done.pid)
            os.kill(done.pid, signal.SIGKILL)

    run = run_sweep(sweep, tmp_path / "out", on_shard=kill_once)
    assert killed and not run.failed
    assert rows_by_job(tmp_path / "out") == expected_rows(sweep)
    # Every shard reported once, and the restarted actor (another pid) did the rest.
    assert sorted((d.job, d.shard) for d in run.done) == sorted(
        (job.name, shard) for job in sweep.jobs() for shard in range(4)
    )
    assert run.done[-1].pid != killed[0]


def test_interrupted_sweep_resumes_only_missing_shards(tmp_path, local_ray):
    sweep = load_sweep(write_sweep(tmp_path))
    seen = []

    def stop_after_three(done) -> None:
        seen.append(done)
        if len(seen) == 3:
            raise KeyboardInterrupt

    with pytest.raises(SweepInterrupted) as info:
        run_sweep(sweep, tmp_path / "out", on_shard=stop_after_three)
    finished = len(info.value.run.done)
    assert finished == 3
    files = sorted(p.name for p in (tmp_path / "out").rglob("*.parquet"))
    assert len(files) == 3 and not list((tmp_path / "out").rglob(".*.tmp"))
    rerun = run_sweep(sweep, tmp_path / "out")
    assert len(rerun.done) == 8 - finished and rerun.shards_skipped == finished
    assert rows_by_job(tmp_path / "out") == expected_rows(sweep)


def test_assumed_lengths_run_every_sample_at_each_length(tmp_path, local_ray):
    """The paper's length table: each assumed length is its own job over every true length, a
    wrong length included, and the report shows the share found per (true, assumed) pair."""
    sweep = load_sweep(
        write_sweep(
            tmp_path,
            models=[{"id": str(STORIES), "num_cpus": 1}],
            algorithms=[{"name": "soda"}],
            length=[1, 2],
            shard_size=8,
        )
    )
    run = run_sweep(sweep, tmp_path / "out")
    assert run.jobs == 2 and not run.failed
    rows = read_results(tmp_path / "out").to_pylist()
    pairs = sorted((r["length"], r["predicted_length"], r["length_mode"]) for r in rows)
    assert pairs == sorted((t, a, "assumed") for t in (1, 2) for a in (1, 2) for _ in range(4))
    # A wrong length is never an exact recovery.
    assert not any(r["exact"] for r in rows if r["length"] != r["predicted_length"])
    assert main(["report", str(tmp_path / "out"), "--out", str(tmp_path / "report")]) == 0
    length_md = (tmp_path / "report" / "length.md").read_text()
    assert "assumed 1" in length_md and "assumed 2" in length_md


def test_more_models_than_the_machine_runs_at_once_take_turns(tmp_path, local_ray, monkeypatch):
    """Three models of one CPU each on a 2-CPU Ray: the third model's replica waits for room,
    which a finished model's replicas give back (they used to stay, and the sweep hung: an
    alarm turns a hang into a failure). Model paths may name environment variables; a job
    keeps the id as written."""
    monkeypatch.setenv("SODARAY_TEST_MODELS", str(STORIES.parent))

    def hung(*_):
        raise TimeoutError("the sweep hung: a model's replica never got room")

    models = [
        {"id": "$SODARAY_TEST_MODELS/stories260K", "name": "a", "bos": True, "num_cpus": 1},
        {"id": str(STORIES), "name": "b", "bos": False, "num_cpus": 1},
        {"id": str(STORIES), "name": "c", "dtype": "bfloat16", "num_cpus": 1},
    ]
    sweep = load_sweep(write_sweep(tmp_path, models=models, algorithms=[{"name": "soda"}]))
    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(180)
    try:
        run = run_sweep(sweep, tmp_path / "out")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert not run.failed and len(run.done) == 3 * 4
    assert len({d.pid for d in run.done}) == 3  # a replica per model
    rows = read_results(tmp_path / "out").to_pylist()
    assert {r["model"] for r in rows} == {"$SODARAY_TEST_MODELS/stories260K", str(STORIES)}


def test_a_model_entry_runs_only_on_the_datasets_it_names(tmp_path, monkeypatch):
    datasets = [
        {"name": "random", "build": {"dataset": "random", "lengths": "1-2", "per_length": 4}},
        {"name": "short", "build": {"dataset": "random", "lengths": "1", "per_length": 4}},
    ]
    models = [
        {"id": str(STORIES), "name": "all"},
        {"id": str(STORIES), "name": "some", "bos": False, "datasets": ["short"]},
    ]
    path = write_sweep(tmp_path, models=models, datasets=datasets, algorithms=[{"name": "soda"}])
    pairs = sorted((j.model.label, j.dataset.name) for j in load_sweep(path).jobs())
    assert pairs == [("all", "random"), ("all", "short"), ("some", "short")]
    models[1]["datasets"] = ["nope"]
    with pytest.raises(ValueError, match=r"models\[1\]\.datasets: no dataset entry named 'nope'"):
        load_sweep(write_sweep(tmp_path, models=models, datasets=datasets))
    monkeypatch.delenv("SODARAY_UNSET_VARIABLE", raising=False)
    models[1] = {"id": "$SODARAY_UNSET_VARIABLE/stories260K"}
    with pytest.raises(ValueError, match="environment variable SODARAY_UNSET_VARIABLE is not set"):
        load_sweep(write_sweep(tmp_path, models=models, datasets=datasets))


@pytest.mark.parametrize(
    "options,message",
    [
        ({"max_attempts": 0}, "--max-attempts must be at least 1, not 0"),
        ({"wait_for_nodes": -1.0}, "--wait-for-nodes must be a number of seconds, 0 or more"),
        ({"wait_for_nodes": float("nan")}, "--wait-for-nodes must be a number of seconds"),
        ({"wait_for_nodes": float("inf")}, "--wait-for-nodes must be a number of seconds"),
    ],
)
def test_a_cluster_record_that_breaks_its_rules_is_never_made(options, message):
    """`run_sweep` and `run_tuning` take the Ray options as one `Cluster`: a record with no try
    or a wait that is negative or not finite is refused as it is made, in one line."""
    from sodaray.experiment.cluster import Cluster

    with pytest.raises(ValueError, match=message) as caught:
        Cluster(**options)
    assert "\n" not in str(caught.value)
    assert Cluster() == Cluster(None, 3, 0.0)  # the defaults: a fresh local Ray, 3 tries, no wait
