"""A sweep's results folder: its layout, the per-job locks, and which shards are still to run.

Layout: `OUT/<sweep>/<job>/shard-NNNNN.parquet`, one per finished shard, written atomically by
the driver, and nothing else: every `*.parquet` under OUT is a file of result rows in one
schema, so pandas, pyarrow, DuckDB and `datasets` read OUT as the rows alone. The rest lives in
the hidden `OUT/<sweep>/.sodaray/` (readers skip hidden folders, and its files do not end in
`.parquet`, which DuckDB's `**` glob would match even there): `jobs/<job>/job.json` (the job's
settings, shard count), `job.lock`, `shard-NNNNN.error.json` and set-aside
`shard-NNNNN.parquet.corrupt` files, and `datasets/*.pq`, the datasets built for the sweep. Job
folder names hold no `=`, which readers would take for a hive partition column.

Resume is "compute every shard without a valid result file": a shard file is trusted only when
it reads as the result schema with exactly the shard's sample ids; any other is moved aside and
computed again. A driver holds `.sodaray/jobs/<job>/job.lock` (its host and pid, refreshed while
it runs) for every job it runs; a second driver on the same folder skips those jobs, and breaks
a lock whose owner is gone (same host: the pid is dead; another host: not refreshed for
`LOCK_STALE_SECONDS`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sodaray.errors import first_line
from sodaray.experiment.data import DatasetIdentity, dataset_identity, dataset_table, select_rows
from sodaray.paths import brief, inside
from sodaray.results import JOB_FILE, META_DIR, VERSION_KEY
from sodaray.runner.spec import Job

log = logging.getLogger(__name__)

LOCK_FILE = "job.lock"
LOCK_REFRESH_SECONDS = 30.0
LOCK_STALE_SECONDS = 300.0


def found_exact(table: pa.Table) -> tuple[int, int]:
    """Counts of found and exact rows (unknown exact counts as not exact)."""
    found = int(pc.sum(table["found"]).as_py() or 0)
    exact = int(pc.sum(table["exact"].fill_null(False)).as_py() or 0)
    return found, exact


def shard_path(folder: Path, index: int) -> Path:
    return folder / f"shard-{index:05d}.parquet"


def meta_folder(root: Path, job: str) -> Path:
    """Where a job's settings, lock, errors and set-aside shards live (`root`: the sweep's)."""
    return inside(root, META_DIR, "jobs", job)


def error_path(meta: Path, index: int) -> Path:
    return meta / f"shard-{index:05d}.error.json"


def shard_problem(
    path: Path, sample_ids: list[int] | None = None, rows: int | None = None
) -> str | None:
    """Why a shard file cannot be trusted, or None: it must read as Parquet in the result schema
    and hold exactly `sample_ids` (when given), or `rows` rows (else at least one)."""
    try:
        schema = pq.read_schema(path)
        if VERSION_KEY not in (schema.metadata or {}):
            return "not a sodaray result file"
        table = pq.read_table(path, columns=["sample_id", "found", "exact"])
    except (OSError, pa.ArrowException, KeyError) as exc:
        return f"unreadable ({first_line(exc)})"
    ids = table["sample_id"].to_pylist()
    if sample_ids is None:
        expected = 1 if rows is None else rows
        ok = len(ids) >= 1 if rows is None else len(ids) == rows
        return None if ok else f"{len(ids)} rows where the shard has {expected}"
    if sorted(ids) != sorted(sample_ids):
        return f"{len(ids)} rows where the shard has {len(sample_ids)} samples (or other ids)"
    return None


def set_aside(path: Path, why: str, meta: Path) -> Path:
    """Move an untrusted shard file to `meta/*.corrupt` (kept for inspection, never read)."""
    target = meta / (path.name + ".corrupt")
    meta.mkdir(parents=True, exist_ok=True)
    os.replace(path, target)
    log.warning("%s: %s; moved to %s, computing it again", path, why, target)
    return target


# ---- per-job locks ------------------------------------------------------------------------------
def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


def lock_owner(folder: Path) -> dict[str, Any] | None:
    """The live owner of a job's lock (host, pid), or None when unlocked or stale."""
    path = folder / LOCK_FILE
    try:
        owner = json.loads(path.read_text())
        age = time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return None
    except (OSError, ValueError):  # half-written or garbled: stale once old enough
        return None if time.time() - _mtime(path) > LOCK_STALE_SECONDS else {"host": "?"}
    if owner.get("host") == socket.gethostname():
        same_driver = owner.get("pid") == os.getpid()
        return None if same_driver or not _pid_alive(int(owner.get("pid", 0))) else owner
    return None if age > LOCK_STALE_SECONDS else owner


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def acquire_lock(folder: Path) -> dict[str, Any] | None:
    """Take the job's lock; returns the other live owner instead when there is one."""
    path = folder / LOCK_FILE
    me = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            owner = lock_owner(folder)
            if owner is not None:
                return owner
            log.warning("breaking the stale lock %s", path)
            path.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(me) + "\n")
        return None
    return lock_owner(folder) or {"host": "?"}


def release_lock(folder: Path) -> None:
    path = folder / LOCK_FILE
    try:
        owner = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if owner.get("host") == socket.gethostname() and owner.get("pid") == os.getpid():
        path.unlink(missing_ok=True)


def refresh_locks(folders: list[Path]) -> None:
    for folder in folders:
        try:
            os.utime(folder / LOCK_FILE)
        except OSError:
            pass


# ---- planning (no Ray) --------------------------------------------------------------------------
@dataclass
class JobPlan:
    job: Job
    folder: Path  # the shard files, and nothing else
    meta: Path  # job.json, the lock, errors and set-aside shards
    rows: dict[str, list[Any]]  # the selected samples' columns
    shards: int
    pending: list[int]
    locked_by: dict[str, Any] | None = None
    corrupt: list[str] = field(default_factory=list)
    identity: DatasetIdentity = DatasetIdentity()  # the dataset's, for the rows


def plan_jobs(
    jobs: list[Job], root: Path, *, lock: bool = False, overrides: list[str] | None = None
) -> list[JobPlan]:
    """Each job's folder, samples and pending shards. With `lock`, the job's lock is taken; a
    job another live driver holds comes back with no pending shards and `locked_by` set.
    `overrides`: the command line's KEY=VALUE, recorded in each job's `job.json`."""
    plans = []
    for job in jobs:
        table = dataset_table(job.model, job.dataset, root)
        identity = dataset_identity(table)
        if job.dataset.path is not None:  # its rows decide the results, not its path
            job = dataclasses.replace(job, dataset_hash=identity.hash or "")
        folder = inside(root, job.name)
        meta = meta_folder(root, job.name)
        rows = select_rows(table, job.samples_per_length, job.limit)
        n = len(rows["sample_id"])
        shards = (n + job.shard_size - 1) // job.shard_size
        folder.mkdir(parents=True, exist_ok=True)
        meta.mkdir(parents=True, exist_ok=True)
        info = {
            "sweep": job.sweep,
            "job": job.name,
            "config_hash": job.config_hash,
            "samples": n,
            "shards": shards,
            "shard_size": job.shard_size,
            "config": job.config(),
            "overrides": list(overrides or []),
        }
        if lock and (owner := acquire_lock(meta)) is not None:
            host, pid = owner.get("host"), owner.get("pid")
            log.warning("skipping %s: another driver runs it (%s pid %s)", job.name, host, pid)
            plans.append(JobPlan(job, folder, meta, rows, shards, [], owner, identity=identity))
            continue
        (meta / JOB_FILE).write_text(json.dumps(info, indent=2, default=str) + "\n")
        plan = JobPlan(job, folder, meta, rows, shards, [], identity=identity)
        for i in range(shards):
            path = shard_path(folder, i)
            if not path.exists():
                plan.pending.append(i)
                continue
            lo, hi = shard_bounds(plan, i)
            why = shard_problem(path, rows["sample_id"][lo:hi])
            if why is not None:
                plan.corrupt.append(set_aside(path, why, meta).name)
                plan.pending.append(i)
        plans.append(plan)
    return plans


def shard_bounds(plan: JobPlan, index: int) -> tuple[int, int]:
    """The shard's rows, [lo, hi), in the job's selected samples."""
    size = plan.job.shard_size
    return index * size, min((index + 1) * size, len(plan.rows["sample_id"]))


# ---- status -----------------------------------------------------------------------------------
@dataclass
class JobStatus:
    sweep: str
    job: str
    shards: int
    done: int
    failed: int
    samples_done: int
    found: int
    exact: int

    @property
    def pending(self) -> int:
        return self.shards - self.done


MAX_SHARDS = 10_000_000  # a job.json claiming more was not written by sodaray


def read_job_file(meta: Path) -> dict[str, Any]:
    """A job's `job.json`, checked: it is read back from disk, where anything may have written
    it (a job naming `../../etc`, a count of 10^12 shards), so every field used is checked."""
    path = meta / JOB_FILE
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a readable job file ({first_line(exc)})") from exc
    if not isinstance(info, dict):
        raise ValueError(f"{path}: not a job file (a JSON object)")
    if info.get("job") != meta.name or not isinstance(info.get("sweep"), str):
        raise ValueError(f"{path}: its job is {brief(info.get('job'))}, not its folder's name")
    counts = [info.get(k) for k in ("shards", "shard_size", "samples")]
    if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts):
        raise ValueError(f"{path}: shards, shard_size and samples must be counts")
    shards, size, samples = counts
    if size < 1 or shards > MAX_SHARDS or shards != -(-samples // size):
        raise ValueError(f"{path}: {shards} shards of {size} do not hold {samples} samples")
    return info


def job_status(meta: Path) -> JobStatus:
    """A job's counts from its `meta` folder (`.sodaray/jobs/<job>`) and its shard files (the
    files there are counted, not the shards the job file says it has)."""
    info = read_job_file(meta)
    shards, size, samples = info["shards"], info["shard_size"], info["samples"]
    folder = inside(meta.parents[2], info["job"])
    done = failed = samples_done = found = exact = 0
    finished = set()
    for path in folder.glob("shard-*.parquet"):
        index = _shard_index(path.name, ".parquet")
        if index is None or index >= shards:
            continue
        if shard_problem(path, rows=min(size, samples - index * size)) is None:
            # `run` sets bad ones aside
            finished.add(index)
            t = pq.read_table(path, columns=["found", "exact"])
            samples_done += len(t)
            f, e = found_exact(t)
            found, exact = found + f, exact + e
    done = len(finished)
    for path in meta.glob("shard-*.error.json"):
        index = _shard_index(path.name, ".error.json")
        failed += index is not None and index < shards and index not in finished
    return JobStatus(info["sweep"], info["job"], shards, done, failed, samples_done, found, exact)


def _shard_index(name: str, suffix: str) -> int | None:
    digits = name.removeprefix("shard-").removesuffix(suffix)
    return int(digits) if name.endswith(suffix) and digits.isdigit() else None


def sweep_status(out: str | Path) -> list[JobStatus]:
    """Every job under `out` (a results folder or one sweep's folder)."""
    out = Path(out)
    if not out.is_dir():
        raise FileNotFoundError(f"no such results folder: {out}")
    found = sorted(out.glob(f"{META_DIR}/jobs/*/{JOB_FILE}"))
    found += sorted(out.glob(f"*/{META_DIR}/jobs/*/{JOB_FILE}"))
    return [job_status(path.parent) for path in found]
