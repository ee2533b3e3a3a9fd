"""Issue 15: an actor runs the shards it is given through one refilling pool and streams each
shard's rows back as the shard finishes (real Ray, CPU, the real stories260K model)."""

from __future__ import annotations

import dataclasses
import os
import signal
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml
from conftest import STORIES
from oracle import misreports

from sodaray.experiment.spec import ModelSpec
from sodaray.results import read_results
from sodaray.runner import load_sweep, run_sweep, sweep_status
from sodaray.runner.execute import (
    mean_occupancy,
    meta_folder,
    plan_calls,
    plan_jobs,
    shard_path,
    shard_task,
)
from sodaray.runner.worker import InversionWorker
from sodaray.targets import make_targets

pytestmark = pytest.mark.skipif(not STORIES.is_dir(), reason="stories260K not present")

SHARDS, SHARD_SIZE, BATCH = 10, 2, 8


def write_sweep(tmp_path: Path, max_steps: int = 60) -> Path:
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
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def killer() -> tuple[list[int], Callable[[Any], None]]:
    """An `on_shard` callback that kills the actor of the first finished shard (SIGKILL, while
    it still runs the rest of its call), and the list it records that actor's pid in."""
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


def test_one_actor_streams_each_shard_once_from_a_full_batch(tmp_path, local_ray):
    sweep = load_sweep(write_sweep(tmp_path))
    (plan,) = plan_jobs(sweep.jobs(), tmp_path / "plan")
    expected = {
        shard_path(plan.folder, i).name: sorted(shard_task(plan, i).rows["sample_id"])
        for i in range(SHARDS)
    }
    runs = {}
    for stream in (True, False):
        out = tmp_path / f"stream-{stream}"
        runs[stream] = run = run_sweep(sweep, out, stream=stream)
        assert not run.failed and sorted(d.shard for d in run.done) == list(range(SHARDS))
        assert len({d.pid for d in run.done}) == 1  # one actor
        (folder,) = {p.parent for p in out.rglob("shard-*.parquet")}
        assert shard_ids(folder) == expected  # every shard file once, with its own samples
        # The occupancy the actor reports adds up: each step advances every search in it once.
        assert sum(d.slot_steps for d in run.done) == sum(d.sample_steps for d in run.done)
    # One shard per call: a batch never holds more than a shard; streamed: the pool draws on
    # all shards of the same length (10 of each, more than the batch).
    assert runs[False].occupancy <= SHARD_SIZE / BATCH < runs[True].occupancy
    assert mean_occupancy(runs[True].done[:1]) > 0.9  # the first shard finished in a full batch
    a, b = read_results(tmp_path / "stream-True"), read_results(tmp_path / "stream-False")
    assert a.schema == b.schema
    # Trajectories in batches of other sizes differ in float rounding, so compare what is
    # robust: every reported find reproduces the observation, and no answer is misreported.
    model = InversionWorker(ModelSpec(str(STORIES)), 1).model
    rows = a.to_pylist()
    targets = make_targets(model, [r["true_tokens"] for r in rows])
    targets.sample_ids = [r["sample_id"] for r in rows]
    results = [
        SimpleNamespace(**{k: r[k] for k in ("sample_id", "tokens", "found", "exact")})
        for r in rows
    ]
    for res, r in zip(results, rows, strict=True):
        res.predicted_length, res.lengths_tried = r["predicted_length"], r["lengths_tried"]
    assert misreports(model, targets, results) == []
    assert any(r["found"] for r in rows)  # the referee also saw reported finds


def test_a_killed_actor_retries_only_its_unfinished_shards(tmp_path, local_ray):
    # 300 steps: the length-2 shards are still running when the first length-1 shard is done.
    sweep = load_sweep(write_sweep(tmp_path, max_steps=300))
    killed, kill_once = killer()
    run = run_sweep(sweep, tmp_path / "out", on_shard=kill_once)
    assert killed and not run.failed
    assert sorted(d.shard for d in run.done) == list(range(SHARDS))  # each written once
    by_pid = {pid: sum(d.pid == pid for d in run.done) for pid in {d.pid for d in run.done}}
    assert killed[0] in by_pid and len(by_pid) == 2  # the restarted actor finished the rest
    rows = read_results(tmp_path / "out")
    assert sorted(rows["sample_id"].to_pylist()) == list(range(2 * SHARDS))


def test_shards_failed_for_good_leave_error_files_that_the_next_run_clears(tmp_path, local_ray):
    """One try per shard: the kill fails the call's unfinished shards for good (an error file
    each, counted by `sweep status`); the next run computes exactly those and clears the files."""
    sweep = load_sweep(write_sweep(tmp_path, max_steps=300))
    killed, kill_once = killer()
    run = run_sweep(sweep, tmp_path / "out", on_shard=kill_once, max_attempts=1)
    failed = sorted(f.shard for f in run.failed)
    assert killed and failed and all(f.attempts == 1 for f in run.failed)
    assert sorted(d.shard for d in run.done) + failed == sorted(range(SHARDS))
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


def test_a_shard_that_fails_every_try_is_tried_max_attempts_times(tmp_path, local_ray):
    """Inputs holding a token id past the vocabulary: `invert` fails on every try, so each
    shard is failed after exactly `max_attempts` tries, never retried without end."""
    from sodaray.data import build_dataset, read_dataset, write_dataset

    good = build_dataset(str(STORIES), "random", "1-2", 2, progress=False)
    bad = good.set_column(
        good.column_names.index("tokens"),
        "tokens",
        [[[t + 10_000 for t in row] for row in good["tokens"].to_pylist()]],
    )
    data = write_dataset(bad, tmp_path / "bad.pq")
    assert read_dataset(data)["tokens"].to_pylist()[0][0] >= 10_000
    spec = yaml.safe_load(write_sweep(tmp_path, max_steps=5).read_text())
    spec["datasets"] = [{"name": "bad", "path": str(data)}]
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(spec))
    run = run_sweep(load_sweep(tmp_path / "bad.yaml"), tmp_path / "out", max_attempts=2)
    assert not run.done and sorted(f.shard for f in run.failed) == [0, 1]
    assert all(f.attempts == 2 and f.error for f in run.failed)


def test_shards_whose_sample_ids_repeat_share_a_pool_and_keep_their_rows(tmp_path):
    """Two jobs on datasets numbered alike: results go back to shards by row, not by id."""
    sweep = load_sweep(write_sweep(tmp_path, max_steps=5))
    (plan,) = plan_jobs(sweep.jobs(), tmp_path / "out")
    first, second = shard_task(plan, 0), shard_task(plan, SHARDS - 1)  # lengths 1 and 2
    other = dataclasses.replace(
        second, job="other", rows={**second.rows, "sample_id": first.rows["sample_id"]}
    )
    # A relative id, as a file gives it: loaded from its absolute path, named as given.
    model_id = os.path.relpath(STORIES)
    worker = InversionWorker(ModelSpec(model_id).resolved(), 1)
    outputs = list(worker.run_shards([first, other]))
    assert sorted(o.index for o in outputs) == [0, 1]
    for out in outputs:
        task = [first, other][out.index]
        assert out.table["job"].to_pylist() == [task.job] * SHARD_SIZE
        assert out.table["sample_id"].to_pylist() == task.rows["sample_id"]
        assert out.table["true_tokens"].to_pylist() == task.rows["tokens"]
        assert out.table["model"].to_pylist() == [model_id] * SHARD_SIZE
    steps = sum(sum(o.table["steps"].to_pylist()) for o in outputs)
    assert sum(o.slot_steps for o in outputs) == steps
    mixed = dataclasses.replace(other, search=dataclasses.replace(other.search, seed=7))
    with pytest.raises(ValueError, match="differ in search"):
        list(worker.run_shards([first, mixed]))


def test_calls_keep_a_batch_of_each_length_together_and_never_mix_configs(tmp_path):
    sweep = load_sweep(write_sweep(tmp_path))
    (plan,) = plan_jobs(sweep.jobs(), tmp_path / "out")
    job = plan.job
    other = dataclasses.replace(
        plan, job=dataclasses.replace(job, search=dataclasses.replace(job.search, seed=9))
    )
    shards = [(plan, i) for i in range(SHARDS)] + [(other, i) for i in range(SHARDS)]
    for replicas in (1, 2, 3):
        calls = plan_calls(shards, replicas)
        flat = [(p.job.search.seed, i) for call in calls for p, i in call]
        assert sorted(flat) == sorted((p.job.search.seed, i) for p, i in shards)  # each once
        assert all(len({p.job.search.seed for p, _ in call}) == 1 for call in calls)
        assert len(calls) == 2 * replicas  # one call per replica and config (20 samples each)
        for call in calls:  # whole blocks of BATCH samples (4 shards) of consecutive shards
            indices = [i for _, i in call]
            blocks = [indices[k : k + BATCH // SHARD_SIZE] for k in range(0, len(indices), 4)]
            assert all(b == list(range(b[0], b[0] + len(b))) for b in blocks)
    assert [len(c) for c in plan_calls(shards, 1, stream=False)] == [1] * 2 * SHARDS


def test_sweep_run_progress_has_a_bar_per_job_and_the_occupancy(capsys):
    from sodaray.runner.cli import _Progress
    from sodaray.runner.execute import ShardDone

    progress = _Progress("s")
    progress.start({"job-a": 4, "job-b": 2}, bars=True)
    progress.shard(ShardDone("job-a", 0, 2, 1, 1, 0.5, 1, 0.0, 100, 100, 10, 16))
    progress.shard(ShardDone("job-b", 0, 2, 2, 2, 0.5, 1, 0.0, 60, 60, 10, 8))
    assert (progress.bars["job-a"].n, progress.bars["job-b"].n) == (2, 2)
    assert progress.bars["job-a"].total == 4 and "found 2" in str(progress.bars["job-b"].postfix)
    assert "sample-steps/s" in str(progress.bars["job-a"].postfix)
    # 100 + 60 searches-steps over 10 steps of 16 slots and 10 of 8: 160 / 240
    assert "batch occupancy 75% (since the last shard), mean 67%" in progress.status.desc
    progress.close()
    lines = _Progress("s")
    lines.start({"job-a": 4}, bars=False)  # not a terminal: a line per shard
    lines.shard(ShardDone("job-a", 1, 2, 1, 0, 0.5, 1, 0.0, 100, 100, 10, 16))
    assert "job-a shard 1: 2 samples, 1 found, 0 exact" in capsys.readouterr().err
