"""Resume checks what it trusts: shard files are validated (bad ones set aside as `*.corrupt`
and recomputed), a dataset file's rows (its hash) name the job, and a per-job lock keeps two
drivers on one results folder from computing the same shards."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import STORIES, another_driver, finish_all

from sodaray.cli import main
from sodaray.experiment.owner import STALE_SECONDS
from sodaray.results import read_results, write_table_atomic
from sodaray.runner import load_sweep, run_sweep, sweep_status
from sodaray.runner.jobs import plan_jobs
from sodaray.runner.layout import LOCK_FILE, acquire_lock, meta_folder, shard_path

pytestmark = pytest.mark.skipif(not STORIES.is_dir(), reason="stories260K not present")


def write_sweep(tmp_path: Path, dataset: dict) -> Path:
    spec = {
        "name": "r",
        "models": [{"id": str(STORIES), "num_cpus": 1}],
        "datasets": [dataset],
        "algorithms": [{"name": "soda"}],
        "max_steps": 5,
        "shard_size": 2,
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


BUILD = {"name": "random", "build": {"dataset": "random", "lengths": "1", "per_length": 4}}


def test_bad_shard_files_are_set_aside_and_recomputed(tmp_path, capsys):
    sweep = load_sweep(write_sweep(tmp_path, BUILD))
    root = tmp_path / "out" / "r"
    (plan,) = plan_jobs(sweep.jobs(), root)
    assert plan.pending == [0, 1]
    finish_all([plan])
    # Shard 0 empty (a crash mid-copy), shard 1 holding another shard's rows (truncated).
    shard_path(plan.folder, 0).write_bytes(b"")
    table = read_results(shard_path(plan.folder, 1))
    write_table_atomic(table.slice(0, 1), shard_path(plan.folder, 1))
    # status does not stop on them: they count as pending
    (status,) = sweep_status(tmp_path / "out")
    assert (status.done, status.pending) == (0, 2)
    assert main(["sweep", "status", str(tmp_path / "out")]) == 0
    capsys.readouterr()
    assert main(["sweep", "status", str(tmp_path / "out"), "--json"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert json.loads(line) == {**dataclasses.asdict(status), "pending": 2}
    (plan,) = plan_jobs(sweep.jobs(), root)
    assert plan.pending == [0, 1]
    # Set aside in the hidden meta folder: the job folder holds result files only.
    assert sorted(p.name for p in plan.meta.glob("*.corrupt")) == [
        "shard-00000.parquet.corrupt",
        "shard-00001.parquet.corrupt",
    ]
    assert plan.meta == root / ".sodaray" / "jobs" / plan.job.name
    assert list(plan.folder.iterdir()) == []
    assert not shard_path(plan.folder, 0).exists()
    finish_all([plan])
    (plan,) = plan_jobs(sweep.jobs(), root)
    assert plan.pending == [] and plan.corrupt == []  # good shards are trusted as before
    assert sorted(read_results(plan.folder)["sample_id"].to_pylist()) == [0, 1, 2, 3]


def test_dataset_rebuilt_in_place_makes_a_new_job(tmp_path):
    from sodaray.data.build import build_dataset
    from sodaray.data.store import write_dataset

    data = tmp_path / "d.parquet"
    write_dataset(build_dataset(str(STORIES), "random", "1", 4, seed=1), data)
    spec = {"name": "random", "path": str(data)}
    sweep = load_sweep(write_sweep(tmp_path, spec))
    (first,) = plan_jobs(sweep.jobs(), tmp_path / "out")
    (again,) = plan_jobs(sweep.jobs(), tmp_path / "out")
    assert again.job.name == first.job.name  # same rows: same job, resumable
    write_dataset(build_dataset(str(STORIES), "random", "1", 4, seed=2), data)
    (rebuilt,) = plan_jobs(sweep.jobs(), tmp_path / "out")
    assert rebuilt.job.name != first.job.name
    assert rebuilt.job.config()["dataset"]["hash"] != first.job.config()["dataset"]["hash"]
    # The same rows under another path are the same job.
    moved = tmp_path / "moved.parquet"
    write_dataset(build_dataset(str(STORIES), "random", "1", 4, seed=1), moved)
    sweep_moved = load_sweep(write_sweep(tmp_path, {"name": "random", "path": str(moved)}))
    (same,) = plan_jobs(sweep_moved.jobs(), tmp_path / "out")
    assert same.job.name == first.job.name


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _write_lock(folder: Path, host: str, pid: int, age: float = 0.0) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_FILE
    path.write_text(json.dumps({"host": host, "pid": pid, "since": time.time()}))
    if age:
        os.utime(path, (time.time() - age, time.time() - age))


def test_a_second_driver_skips_a_locked_job(tmp_path):
    sweep = load_sweep(write_sweep(tmp_path, BUILD))
    root = tmp_path / "out" / "r"
    (job,) = sweep.jobs()
    folder = meta_folder(root, job.name)
    with another_driver(folder) as pid:  # a live process that took the lock as a driver does
        (plan,) = plan_jobs(sweep.jobs(), root, lock=True)
        assert plan.locked_by is not None and plan.pending == []
        run = run_sweep(sweep, tmp_path / "out")  # nothing to do here: no Ray started
        assert run.locked == [job.name] and run.done == []
        assert json.loads((folder / LOCK_FILE).read_text())["pid"] == pid  # not ours


@pytest.mark.parametrize(
    "owner,held",
    [
        ("dead-pid-same-host", False),
        ("other-host-fresh", True),
        ("other-host-stale", False),
        ("garbled-old", False),
    ],
)
def test_stale_locks_are_broken(tmp_path, owner, held):
    folder = tmp_path / "job"
    if owner == "dead-pid-same-host":
        _write_lock(folder, socket.gethostname(), _dead_pid())
    elif owner == "other-host-fresh":
        _write_lock(folder, "elsewhere.example", 1)
    elif owner == "other-host-stale":
        _write_lock(folder, "elsewhere.example", 1, age=STALE_SECONDS + 60)
    else:
        folder.mkdir()
        (folder / LOCK_FILE).write_text("{not json")
        old = time.time() - STALE_SECONDS - 60
        os.utime(folder / LOCK_FILE, (old, old))
    other = acquire_lock(folder)
    assert (other is not None) == held
    mine = json.loads((folder / LOCK_FILE).read_text())
    assert (mine.get("pid") == os.getpid()) == (not held)


def test_run_takes_and_releases_its_locks(tmp_path):
    sweep = load_sweep(write_sweep(tmp_path, BUILD))
    root = tmp_path / "out" / "r"
    plans = plan_jobs(sweep.jobs(), root)
    finish_all(plans)
    seen = []
    run = run_sweep(
        sweep,
        tmp_path / "out",
        on_start=lambda run, n: seen.append((plans[0].meta / LOCK_FILE).exists()),
    )
    assert seen == [True]  # held while running
    assert run.shards_skipped == 2 and not (plans[0].meta / LOCK_FILE).exists()


def test_report_skips_an_unreadable_shard_in_a_folder(tmp_path, caplog):
    sweep = load_sweep(write_sweep(tmp_path, BUILD))
    root = tmp_path / "out" / "r"
    plans = plan_jobs(sweep.jobs(), root)
    finish_all(plans)
    shard_path(plans[0].folder, 0).write_bytes(b"PAR1 cut short")
    assert len(read_results(tmp_path / "out")) == 2  # shard 1's rows
    assert "skipped" in caplog.text and "shard-00000.parquet" in caplog.text
    assert (
        main(["report", str(tmp_path / "out"), "--out", str(tmp_path / "rep"), "--no-figures"]) == 0
    )
    with pytest.raises(ValueError, match="not a Parquet file"):  # named on its own: an error
        read_results(shard_path(plans[0].folder, 0))
