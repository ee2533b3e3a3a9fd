"""Issue 29: a replica's engine holds every unit in flight in one batch (real Ray, CPU, the real
stories260K model): shards of any job, config and length share it, each shard's file is written
once as its rows come back, and a sample's result does not depend on what shared its batch."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml
from conftest import STORIES

from sodaray.experiment.cluster import Cluster
from sodaray.experiment.group import ActorGroup, Failure, ReplicasLost, next_event
from sodaray.experiment.replica import ReplicaWorker
from sodaray.experiment.spec import ModelSpec
from sodaray.experiment.work import Finished, Progress
from sodaray.results import read_results
from sodaray.runner import load_sweep, run_sweep, sweep_status
from sodaray.runner.jobs import plan_jobs
from sodaray.runner.layout import meta_folder, shard_path
from sodaray.runner.run import shard_unit

pytestmark = pytest.mark.skipif(not STORIES.is_dir(), reason="stories260K not present")

SHARDS, SHARD_SIZE, BATCH = 10, 2, 8


def write_sweep(tmp_path: Path, max_steps: int = 60, **extra: Any) -> Path:
    spec = {
        "name": "s",
        "models": [{"id": str(STORIES), "num_cpus": 1, "replicas": 1}],
        "datasets": [
            {"name": "random", "build": {"dataset": "random", "lengths": "1-2", "per_length": 10}}
        ],
        "algorithms": [{"name": "soda", "params": {"max_batch_size": BATCH}}],
        "objectives": [{"kind": "logits"}],
        "max_steps": max_steps,
        "shard_size": SHARD_SIZE,
        **extra,
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def killer() -> tuple[list[int], Callable[[Any], None]]:
    """An `on_shard` callback that kills the replica of the first finished shard (SIGKILL,
    while it still runs the rest), and the list it records that replica's pid in."""
    killed: list[int] = []

    def kill_once(done: Any) -> None:
        if not killed:
            killed.append(done.pid)
            os.kill(done.pid, signal.SIGKILL)

    return killed, kill_once


def shard_ids(folder: Path) -> dict[str, list[int]]:
    return {
        p.name: sorted(pq.read_table(p, columns=["sample_id"])["sample_id"].to_pylist())
        for p in sorted(folder.glob("shard-*.parquet"))
    }


def outcomes(folder: Path) -> dict[int, tuple]:
    rows = read_results(folder).to_pylist()
    return {r["sample_id"]: (r["tokens"], r["found"], r["steps"], r["final_loss"]) for r in rows}


def test_one_replica_writes_each_shard_once_from_a_full_batch(tmp_path, local_ray):
    sweep = load_sweep(write_sweep(tmp_path))
    (plan,) = plan_jobs(sweep.jobs(), tmp_path / "plan")
    expected = {
        shard_path(plan.folder, i).name: sorted(shard_unit(plan, i).rows["sample_id"])
        for i in range(SHARDS)
    }
    run = run_sweep(sweep, tmp_path / "out")
    assert not run.failed and sorted(d.shard for d in run.done) == list(range(SHARDS))
    assert len({d.pid for d in run.done}) == 1  # one replica
    (folder,) = {p.parent for p in (tmp_path / "out").rglob("shard-*.parquet")}
    assert shard_ids(folder) == expected  # every shard file once, with its own samples
    # The occupancy adds up: each step advances every search in it once (the counts come with
    # the shards' rows and with the progress items between them).
    assert run.slot_steps == sum(d.sample_steps for d in run.done)
    # Its model's batch-steps, as `sweep run --costs` prices them, are all of the run's.
    assert run.model_batch_steps == {plan.job.model.label: run.batch_steps}
    assert run.batch_steps > 0
    # 20 samples of two lengths through one batch of 8, full until the last ones drain (one
    # shard at a time could not fill more than 2 of 8 slots; a pool per length, 10 of 16).
    assert run.occupancy > 0.7


@pytest.mark.parametrize("mix_lengths", [True, False])
def test_jobs_of_other_configs_share_the_batch_without_changing_a_result(
    tmp_path, local_ray, mix_lengths
):
    """The temperature-0.05 job alone, then beside a temperature-0.1 job in the same batches:
    its rows are the same, bit for bit (tokens, finds, steps, losses), with lengths 1 and 2 in
    one padded batch (the default) and in a batch each. Batches of 8 with lengths 1-2 hold
    2-16 rows: the few-row matmul kernels are what broke this before `row_rule` probed
    wide inner dimensions."""
    model = [{"id": str(STORIES), "num_cpus": 1, "mix_lengths": mix_lengths}]
    alone = run_sweep(
        load_sweep(write_sweep(tmp_path, max_steps=60, models=model)), tmp_path / "alone"
    )
    grid = {"temperature": [0.05, 0.1]}
    shared = write_sweep(
        tmp_path,
        max_steps=60,
        models=model,
        algorithms=[{"name": "soda", "params": {"max_batch_size": BATCH}, "grid": grid}],
    )
    both = run_sweep(load_sweep(shared), tmp_path / "both")
    assert alone.occupancy < both.occupancy  # more work to fill the same batch
    [job] = [d.job for d in alone.done[:1]]
    mine = [p for p in (tmp_path / "both" / "s").iterdir() if "temperature0.05" in p.name]
    assert len(mine) == 1 and not (tmp_path / "both" / "s" / job).exists()  # its own hash
    assert outcomes(mine[0]) == outcomes(tmp_path / "alone" / "s" / job)
    assert any(v[1] for v in outcomes(mine[0]).values())  # finds were compared too


def test_a_killed_replica_retries_only_its_unfinished_shards(tmp_path, local_ray):
    # 300 steps: the length-2 shards are still running when the first length-1 shard is done.
    sweep = load_sweep(write_sweep(tmp_path, max_steps=300))
    killed, kill_once = killer()
    run = run_sweep(sweep, tmp_path / "out", on_shard=kill_once)
    assert killed and not run.failed
    assert sorted(d.shard for d in run.done) == list(range(SHARDS))  # each written once
    by_pid = {pid: sum(d.pid == pid for d in run.done) for pid in {d.pid for d in run.done}}
    assert killed[0] in by_pid and len(by_pid) == 2  # the restarted replica finished the rest
    rows = read_results(tmp_path / "out")
    assert sorted(rows["sample_id"].to_pylist()) == list(range(2 * SHARDS))


def test_shards_failed_for_good_leave_error_files_that_the_next_run_clears(tmp_path, local_ray):
    """One try per shard: the kill fails the unfinished shards for good (an error file each,
    counted by `sweep status`); the next run computes exactly those and clears the files."""
    sweep = load_sweep(write_sweep(tmp_path, max_steps=300))
    killed, kill_once = killer()
    run = run_sweep(sweep, tmp_path / "out", on_shard=kill_once, cluster=Cluster(max_attempts=1))
    failed = sorted(f.shard for f in run.failed)
    assert killed and failed and all(f.attempts == 1 for f in run.failed)
    assert sorted([d.shard for d in run.done] + failed) == list(range(SHARDS))
    meta = meta_folder(tmp_path / "out" / "s", sweep.jobs()[0].name)
    errors = sorted(meta.glob("shard-*.error.json"))
    assert [int(e.name[6:11]) for e in errors] == failed
    (status,) = sweep_status(tmp_path / "out")
    assert (status.failed, status.pending) == (len(failed), len(failed))

    again = run_sweep(sweep, tmp_path / "out")
    assert sorted(d.shard for d in again.done) == failed and not again.failed
    assert not list(meta.glob("shard-*.error.json"))
    (status,) = sweep_status(tmp_path / "out")
    assert (status.failed, status.pending, status.samples_done) == (0, 0, 2 * SHARDS)


def test_a_bad_job_fails_alone_once_with_its_reason(tmp_path, local_ray, monkeypatch):
    """Inputs holding a token id past the vocabulary: that job's shards fail on their first try
    (a bad input is not retried), with the reason; the good job beside it, on the same replica,
    finishes every shard (issue 30). Planning refuses such a file where the model's local config
    gives its vocabulary; here that check is off, as for a hub model or a GGUF file."""
    from sodaray.data.build import build_dataset
    from sodaray.data.store import write_dataset
    from sodaray.runner import plan

    monkeypatch.setattr(plan, "check_jobs_vocab", lambda jobs, where: None)

    good = build_dataset(str(STORIES), "random", "1-2", 2, progress=False)
    bad = good.set_column(
        good.column_names.index("tokens"),
        "tokens",
        [[[t + 10_000 for t in row] for row in good["tokens"].to_pylist()]],
    )
    datasets = [
        {"name": "bad", "path": str(write_dataset(bad, tmp_path / "bad.pq"))},
        {"name": "good", "path": str(write_dataset(good, tmp_path / "good.pq"))},
    ]
    sweep = load_sweep(write_sweep(tmp_path, max_steps=5, datasets=datasets))
    run = run_sweep(sweep, tmp_path / "out", cluster=Cluster(max_attempts=3))
    assert sorted((f.job.split("_")[1], f.shard) for f in run.failed) == [("bad", 0), ("bad", 1)]
    assert all(f.attempts == 1 and "token id" in f.error for f in run.failed)
    assert sorted((d.job.split("_")[1], d.shard) for d in run.done) == [("good", 0), ("good", 1)]


def drain_group(group: ActorGroup) -> list[tuple[str, Any]]:
    """Every event of a group's units, as (unit key, event), until none is left."""
    events = []
    while len(group):
        got = next_event([group], timeout=60)
        if got is not None:
            events.append((got[1].key, got[2]))
    return events


def test_a_group_whose_replicas_are_gone_for_good_stops_and_fails_no_unit(tmp_path, local_ray):
    """The replicas killed for good (as when the driver's Ray loses its owner): the group raises
    `ReplicasLost` on the first failure instead of burning every unit's tries, each at once."""
    import ray

    sweep = load_sweep(write_sweep(tmp_path, max_steps=5))
    (plan,) = plan_jobs(sweep.jobs(), tmp_path / "out")
    group = ActorGroup(sweep.jobs()[0].model, replicas=1, max_attempts=3)
    group.wait_placed(60)
    group.pids()  # up and loaded
    for actor in group.actors:
        ray.kill(actor, no_restart=True)
    for index in range(3):
        group.submit(shard_unit(plan, index))
    events: list[tuple[str, Any]] = []
    with pytest.raises(ReplicasLost, match="every replica of stories260K is gone"):
        events = drain_group(group)
    assert events == [] and group.dead == {0}
    assert len(group) == 2  # the others are left for a resume, not failed
    group.kill()


def test_units_go_around_a_replica_dead_for_good(tmp_path, local_ray):
    """One of two replicas killed for good: its unit is tried again on the other, which runs
    every unit; no failure is final."""
    import ray

    sweep = load_sweep(write_sweep(tmp_path, max_steps=5))
    (plan,) = plan_jobs(sweep.jobs(), tmp_path / "out")
    group = ActorGroup(sweep.jobs()[0].model, replicas=2, max_attempts=2)
    group.wait_placed(60)
    group.pids()
    ray.kill(group.actors[0], no_restart=True)
    units = [shard_unit(plan, i) for i in range(4)]
    for unit in units:
        group.submit(unit)
    events = drain_group(group)
    failures = [e for _, e in events if isinstance(e, Failure)]
    finished = sorted(k for k, e in events if isinstance(e, Finished))
    assert failures and not any(f.final for f in failures)
    assert finished == sorted(u.key for u in units) and group.dead == {0}
    group.kill()


def test_a_dead_engine_thread_takes_its_replica_out_of_service(tmp_path, local_ray):
    """A replica whose engine thread has ended (here: told to stop, through the real actor)
    is restarted with a fresh engine: the units given to it run there instead of waiting
    for ever or failing one after another until their attempts run out."""
    import ray

    sweep = load_sweep(write_sweep(tmp_path, max_steps=5))
    (plan,) = plan_jobs(sweep.jobs(), tmp_path / "out")
    group = ActorGroup(sweep.jobs()[0].model, replicas=1, max_attempts=2)
    group.wait_placed(60)
    (before,) = group.pids()
    ray.get(group.actors[0].stop.remote())  # the engine's thread ends; the process lives on
    units = [shard_unit(plan, i) for i in range(3)]
    for unit in units:
        group.submit(unit)
    events = drain_group(group)
    assert sorted(k for k, e in events if isinstance(e, Finished)) == sorted(u.key for u in units)
    assert group.dead == set()
    (after,) = group.pids()
    assert after != before  # the same replica, in a new process
    group.kill()


def test_a_config_no_batch_takes_fails_its_own_unit_alone(tmp_path, local_ray):
    """A GCG unit excluding a token past the vocabulary is refused when its work is submitted
    (it used to raise inside the engine's loop and end the engine for every unit): it fails
    once, with its reason, and the same replica process runs the next units."""
    gcg = [{"name": "gcg", "params": {"exclude_tokens": [10**6], "max_batch_size": BATCH}}]
    for name in ("bad", "good"):
        (tmp_path / name).mkdir()
    bad = load_sweep(write_sweep(tmp_path / "bad", max_steps=5, algorithms=gcg))
    good = load_sweep(write_sweep(tmp_path / "good", max_steps=5))
    (bad_plan,) = plan_jobs(bad.jobs(), tmp_path / "out")
    (good_plan,) = plan_jobs(good.jobs(), tmp_path / "out")
    group = ActorGroup(good.jobs()[0].model, replicas=1, max_attempts=3)
    group.wait_placed(60)
    (before,) = group.pids()
    group.submit(shard_unit(bad_plan, 0))
    ((key, failure),) = drain_group(group)
    assert isinstance(failure, Failure) and failure.final and failure.attempts == 1
    assert "exclude_tokens: token id 1000000 is outside the vocabulary" in failure.error
    units = [shard_unit(good_plan, i) for i in range(2)]
    for unit in units:
        group.submit(unit)
    # One try each: a unit sent to a dead engine would fail. Besides the units' rows, only the
    # replica's progress items (`Progress`, about once a second) may come.
    events = [(k, e) for k, e in drain_group(group) if not isinstance(e, Progress)]
    assert sorted(k for k, e in events if isinstance(e, Finished)) == sorted(u.key for u in units)
    assert group.pids() == [before]  # no restart was needed
    group.kill()


def test_units_whose_sample_ids_repeat_share_a_replica_and_keep_their_rows(tmp_path):
    """Two jobs on datasets numbered alike, in flight on one replica at once: each unit's rows
    are its own samples', matched by row, not by id."""
    sweep = load_sweep(write_sweep(tmp_path, max_steps=5))
    (plan,) = plan_jobs(sweep.jobs(), tmp_path / "out")
    first, second = shard_unit(plan, 0), shard_unit(plan, SHARDS - 1)  # lengths 1 and 2
    other = type(second)(
        **{**second.__dict__, "key": "other/9", "context": {**second.context, "job": "other"}},
    )
    other.rows["sample_id"][:] = first.rows["sample_id"]
    # A relative id, as a file gives it: loaded from its absolute path, named as given.
    model_id = os.path.relpath(STORIES)
    worker = ReplicaWorker(ModelSpec(model_id).resolved(), 1)
    outputs: dict[str, Finished] = {}

    def run(unit) -> None:
        *_, outputs[unit.key] = worker.run(unit)

    threads = [threading.Thread(target=run, args=(u,)) for u in (first, other)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    worker.stop()
    for unit in (first, other):
        table = outputs[unit.key].table
        assert table["job"].to_pylist() == [unit.context["job"]] * SHARD_SIZE
        assert table["sample_id"].to_pylist() == unit.rows["sample_id"]
        assert table["true_tokens"].to_pylist() == unit.rows["tokens"]
        assert table["model"].to_pylist() == [model_id] * SHARD_SIZE
