"""A running shard's ended searches are kept beside it (`shard-NNNNN.kept.pq`), so a driver
stopped mid-shard (killed: a crash, a session's machine taken away) loses only the searches
still running; the next run searches the shard's other samples and writes the shard as one
uninterrupted run would have (the same tokens, finds, steps and losses, in the same order).
Kept rows are trusted on a shard file's terms."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import STORIES

from sodaray.experiment.replica import ReplicaWorker
from sodaray.experiment.work import Finished, Kept
from sodaray.results import read_results, write_table_atomic
from sodaray.runner import load_sweep, run_sweep, sweep_status
from sodaray.runner.jobs import plan_jobs
from sodaray.runner.layout import kept_path, meta_folder, shard_path
from sodaray.runner.run import shard_unit

pytestmark = pytest.mark.skipif(not STORIES.is_dir(), reason="stories260K not present")

# Lengths 1 and 2 in one shard: length-1 searches are mostly found early, length-2 ones mostly
# run their whole budget, so a shard has ended searches long before it ends.
STEPS = 400


def write_sweep(tmp_path: Path, max_steps: int = STEPS, shard_size: int = 8) -> Path:
    spec = {
        "name": "k",
        "models": [{"id": str(STORIES), "num_cpus": 1, "preset": "tinystories-33m"}],
        "datasets": [
            {"name": "random", "build": {"dataset": "random", "lengths": "1-2", "per_length": 4}}
        ],
        "algorithms": [{"name": "soda", "params": {"max_batch_size": 8}}],  # all at once
        "objectives": [{"kind": "logits"}],
        "max_steps": max_steps,
        "shard_size": shard_size,
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def outcomes(table: pa.Table) -> dict[int, tuple]:
    return {
        r["sample_id"]: (r["tokens"], r["found"], r["steps"], r["final_loss"], r["shard"])
        for r in table.to_pylist()
    }


def whole_shards(plan: Any) -> list[pa.Table]:
    """Every shard of `plan` run whole on one replica worker in this process (no Ray)."""
    worker = ReplicaWorker(plan.job.model, 1)
    try:
        return [list(worker.run(shard_unit(plan, i)))[-1].table for i in range(plan.shards)]
    finally:
        worker.stop()


def test_a_replica_sends_its_ended_searches_rows_before_all_its_rows(tmp_path):
    sweep = load_sweep(write_sweep(tmp_path))
    (plan,) = plan_jobs(sweep.jobs(), tmp_path / "out" / "k")
    # A checkpoint at every step wakes the unit's stream every step: rows go as searches end.
    unit = dataclasses.replace(
        shard_unit(plan, 0, keep_every=0.0), checkpoints=tuple(range(1, STEPS + 1))
    )
    worker = ReplicaWorker(plan.job.model, 1)
    try:
        items = list(worker.run(unit))
    finally:
        worker.stop()
    kept = [item for item in items if isinstance(item, Kept)]
    assert isinstance(items[-1], Finished) and not any(isinstance(i, Finished) for i in items[:-1])
    assert kept  # sent before the unit's end
    rows = pa.concat_tables([k.table for k in kept])
    ids = rows["sample_id"].to_pylist()
    assert len(ids) == len(set(ids))  # each search's row once
    whole = outcomes(items[-1].table)
    assert outcomes(rows) == {i: whole[i] for i in ids}  # the same rows as at the end
    # Sent in the order they ended: no kept row took more steps than a later-kept one.
    steps = [outcomes(k.table) for k in kept]
    assert all(
        max(v[2] for v in a.values()) <= min(v[2] for v in b.values())
        for a, b in zip(steps, steps[1:], strict=False)
    )


def test_a_killed_driver_loses_only_the_searches_still_running(tmp_path):
    sweep_file = write_sweep(tmp_path)
    out = tmp_path / "out"
    # The reference: the shard run whole, in this process.
    (fresh,) = plan_jobs(load_sweep(sweep_file).jobs(), tmp_path / "ref" / "k")
    (reference,) = whole_shards(fresh)
    # A driver killed (SIGKILL, with its Ray) once some of its searches have been kept.
    cmd = [sys.executable, "-m", "sodaray", "sweep", "run", str(sweep_file), "--out", str(out)]
    driver = subprocess.Popen(
        [*cmd, "--keep-every", "0"],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    (job,) = [j.name for j in load_sweep(sweep_file).jobs()]
    kept = kept_path(meta_folder(out / "k", job), 0)
    try:
        deadline = time.monotonic() + 300
        while not kept.exists() and driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        _, err = driver.communicate()
    assert kept.exists(), err.decode()[-2000:]
    assert not shard_path(out / "k" / job, 0).exists()  # killed mid-shard
    before = len(pq.read_table(kept))
    assert 1 <= before < 8 and sweep_status(out)[0].kept == before
    # The next run searches only the others, and writes the shard as the whole run did.
    run = run_sweep(load_sweep(sweep_file), out)
    assert run.kept == before and run.progress[job].samples == 8 - before
    assert len(run.done) == 1 and run.done[0].samples == 8
    table = read_results(shard_path(out / "k" / job, 0))
    assert table["sample_id"].to_pylist() == reference["sample_id"].to_pylist()  # its order
    assert outcomes(table) == outcomes(reference)  # bit for bit: tokens, finds, steps, losses
    assert not kept.exists()  # the shard file holds them now


def rows_of(tmp_path: Path) -> tuple[Any, list[pa.Table]]:
    """A plan of 2 shards of 4 (the run to resume) and its shards' rows, run whole."""
    sweep = load_sweep(write_sweep(tmp_path, max_steps=5, shard_size=4))
    (ref,) = plan_jobs(sweep.jobs(), tmp_path / "ref" / "k")
    return sweep, whole_shards(ref)


def with_ids(table: pa.Table, kind: pa.DataType) -> pa.Table:
    i = table.schema.get_field_index("sample_id")
    return table.set_column(i, "sample_id", table["sample_id"].cast(kind))


def with_hash(table: pa.Table, value: str) -> pa.Table:
    i = table.schema.get_field_index("config_hash")
    return table.set_column(i, "config_hash", pa.array([value] * len(table)))


# How a kept file may be wrong: each is set aside and its shard searched whole.
UNTRUSTED = {
    "empty": (lambda s0, s1: b"", ".corrupt"),
    "another job's rows": (lambda s0, s1: with_hash(s0.slice(0, 2), "0" * 16), ".foreign"),
    "another shard's samples": (lambda s0, s1: s1.slice(0, 2), ".corrupt"),
    "a sample twice": (lambda s0, s1: pa.concat_tables([s0.slice(0, 1)] * 2), ".corrupt"),
    "more rows than the shard": (lambda s0, s1: pa.concat_tables([s0, s1]), ".corrupt"),
    "another schema": (lambda s0, s1: s0.slice(0, 2).drop_columns(["host"]), ".corrupt"),
    "ids as text": (lambda s0, s1: with_ids(s0.slice(0, 2), pa.string()), ".corrupt"),
    "a FIFO": (lambda s0, s1: "fifo", ".corrupt"),
    "a directory": (lambda s0, s1: "dir", ".corrupt"),
    "a link to a device": (lambda s0, s1: "/dev/zero", ".corrupt"),
}


@pytest.mark.parametrize("case", list(UNTRUSTED))
def test_untrusted_kept_rows_are_set_aside(tmp_path, case):
    sweep, (s0, s1) = rows_of(tmp_path)
    make, suffix = UNTRUSTED[case]
    root = tmp_path / "out" / "k"
    (plan,) = plan_jobs(sweep.jobs(), root)  # the folders
    path = kept_path(plan.meta, 0)
    what = make(s0, s1)
    if isinstance(what, pa.Table):
        write_table_atomic(what, path)
    elif what == "fifo":
        os.mkfifo(path)
    elif what == "dir":
        path.mkdir()
    elif isinstance(what, str):
        path.symlink_to(what)
    else:
        path.write_bytes(what)
    (plan,) = plan_jobs(sweep.jobs(), root, lock=True)
    assert plan.pending == [0, 1] and plan.kept == {}
    assert plan.corrupt == [path.name + suffix] and not path.exists()
    assert shard_unit(plan, 0).samples == 4  # searched whole


def test_kept_rows_leave_only_the_other_samples_to_search(tmp_path):
    sweep, (s0, _) = rows_of(tmp_path)
    root = tmp_path / "out" / "k"
    (plan,) = plan_jobs(sweep.jobs(), root)
    write_table_atomic(s0.take([3, 1]), kept_path(plan.meta, 0))  # in the order they ended
    (plan,) = plan_jobs(sweep.jobs(), root, lock=True)
    assert plan.pending == [0, 1] and plan.corrupt == []
    unit = shard_unit(plan, 0)
    ids = s0["sample_id"].to_pylist()
    assert unit.rows["sample_id"] == [ids[0], ids[2]]
    assert unit.rows["tokens"] == [s0["true_tokens"][i].as_py() for i in (0, 2)]
    # Every row kept (a driver stopped before writing the shard): the shard is written from
    # them in the shard's order at planning, and nothing of it runs.
    write_table_atomic(s0.take([2, 0, 3, 1]), kept_path(plan.meta, 0))
    (plan,) = plan_jobs(sweep.jobs(), root, lock=True)
    assert plan.pending == [1] and not kept_path(plan.meta, 0).exists()
    # Rows kept beside a valid shard file (a stop between writing one and removing the other)
    # go; anything else there is set aside, never followed into.
    write_table_atomic(s0.take([1]), kept_path(plan.meta, 0))
    (plan,) = plan_jobs(sweep.jobs(), root, lock=True)
    assert plan.pending == [1] and not kept_path(plan.meta, 0).exists() and not plan.corrupt
    kept_path(plan.meta, 0).mkdir()
    (plan,) = plan_jobs(sweep.jobs(), root, lock=True)
    assert plan.pending == [1] and not kept_path(plan.meta, 0).exists()
    assert (plan.meta / "shard-00000.kept.pq.corrupt").is_dir()
    assert outcomes(read_results(shard_path(plan.folder, 0))) == outcomes(s0)
    assert read_results(shard_path(plan.folder, 0))["sample_id"].to_pylist() == ids
