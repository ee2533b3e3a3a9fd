"""Running a sweep on Ray: jobs -> shards -> actors (one model replica each) -> Parquet files.

Layout: `OUT/<sweep>/<job>/shard-NNNNN.parquet`, one per finished shard, written atomically by
the driver, and nothing else: every `*.parquet` under OUT is a file of result rows in one
schema, so pandas, pyarrow, DuckDB and `datasets` read OUT as the rows alone. The rest lives in
the hidden `OUT/<sweep>/.sodaray/` (readers skip hidden folders, and its files do not end in
`.parquet`, which DuckDB's `**` glob would match even there): `jobs/<job>/job.json` (the job's
settings, shard count), `job.lock`, `shard-NNNNN.error.json` and set-aside
`shard-NNNNN.parquet.corrupt` files, and `datasets/*.pq`, the datasets built for the sweep. Job
folder names hold no `=`, which readers would take for a hive partition column.

A shard that keeps failing leaves `shard-NNNNN.error.json` and is retried by the next run.
Resume is therefore "compute every shard without a valid result file": a shard file is trusted
only when it reads as the result schema with exactly the shard's sample ids; any other is moved
aside as `.sodaray/jobs/<job>/shard-NNNNN.parquet.corrupt` and computed again. A driver holds
`.sodaray/jobs/<job>/job.lock` (its host and pid, refreshed while it runs) for every job it
runs; a second driver on the same folder skips those jobs, and breaks a lock whose owner is
gone (same host: the pid is dead; another host: not refreshed for `LOCK_STALE_SECONDS`). A
sweep folder in the layout before result schema 3 (`job.json` beside the shards) is refused,
not mixed with new files. Ray does the placement (actors ask for the resources their model
entry names) and restarts dead actors; this module hands each idle actor the next call of its
model.

A call is, by default (`stream=True`), several shards that share a search config, objective and
length mode (`worker.batch_key`): the actor runs them through one refilling pool, so its batch
stays at `max_batch_size` while the call has samples left, and streams each shard's rows back
(a Ray streaming generator) as soon as the shard's last sample finishes; the driver writes the
shard file then. `plan_calls` deals a model's shards into calls, at least one per replica and
none over about `STREAM_BATCHES * max_batch_size` samples (a call's targets are built at once).
Jobs that share a model but not a batch key take turns on its actors: one pool runs one config
and one objective. When a call fails (its actor died, an error in `invert`), its unfinished
shards are retried as a new call, up to `max_attempts` tries per shard; shards it already
streamed are written and kept. `stream=False` is the old way, one shard per call.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sodaray.experiment.cluster import actor_class, check_address, check_resources, ray_session
from sodaray.experiment.data import DatasetIdentity, dataset_identity, dataset_table, select_rows
from sodaray.experiment.spec import ModelSpec
from sodaray.results import VERSION_KEY, write_table_atomic
from sodaray.runner.spec import Job, Sweep
from sodaray.runner.worker import InversionWorker, ShardOutput, ShardTask, batch_key
from sodaray.validation import first_line, last_line

log = logging.getLogger(__name__)

JOB_FILE = "job.json"
LOCK_FILE = "job.lock"
META_DIR = ".sodaray"  # hidden: result readers skip it
LOCK_REFRESH_SECONDS = 30.0
LOCK_STALE_SECONDS = 300.0
# A streamed call holds at most this many batches' worth of samples: its targets (observed
# logits) are built at once, and bounded calls keep retries after a failure small. Each call
# ends with a draining batch, so fewer, larger calls keep occupancy higher.
STREAM_BATCHES = 8


def found_exact(table: pa.Table) -> tuple[int, int]:
    """Counts of found and exact rows (unknown exact counts as not exact)."""
    found = int(pc.sum(table["found"]).as_py() or 0)
    exact = int(pc.sum(table["exact"].fill_null(False)).as_py() or 0)
    return found, exact


class LayoutError(ValueError):
    """A sweep folder written in the layout before result schema 3."""


def shard_path(folder: Path, index: int) -> Path:
    return folder / f"shard-{index:05d}.parquet"


def meta_folder(root: Path, job: str) -> Path:
    """Where a job's settings, lock, errors and set-aside shards live (`root`: the sweep's)."""
    return root / META_DIR / "jobs" / job


def error_path(meta: Path, index: int) -> Path:
    return meta / f"shard-{index:05d}.error.json"


def check_layout(root: Path) -> None:
    """Refuse a sweep folder in the old layout: its job.json and dataset copies break the
    result readers, its job folders carry `=`, and its shards lack schema 3's columns, so new
    shards beside them would make a folder no reader takes whole."""
    old = sorted(root.glob("*/" + JOB_FILE))[:1] + sorted(root.glob("datasets/*.parquet"))[:1]
    if old:
        raise LayoutError(
            f"{root} holds results in the layout before result schema 3 ({old[0]}); "
            "give another --out, or move it aside: sodaray report still reads it"
        )


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


@dataclass
class ShardDone:
    """What the driver keeps of a finished shard: counts, never the rows."""

    job: str
    shard: int
    samples: int
    found: int
    exact: int
    seconds: float  # inside the worker
    pid: int
    # Seconds outside the worker's `run_shard`: task transfer, actor start-up on a first shard,
    # result transfer and the driver's write.
    overhead: float = 0.0
    sample_steps: int = 0  # the shard's samples' steps, summed
    # The batch occupancy the actor measured since its previous output (see ShardOutput).
    slot_steps: int = 0
    batch_steps: int = 0
    max_batch_size: int = 1


@dataclass
class ShardFailed:
    job: str
    shard: int
    attempts: int
    error: str


@dataclass
class SweepRun:
    """Counts of one `run_sweep` call."""

    jobs: int = 0
    shards_total: int = 0
    shards_skipped: int = 0  # already finished before this run
    locked: list[str] = field(default_factory=list)  # jobs another live driver is running
    corrupt: list[str] = field(default_factory=list)  # shard files set aside and recomputed
    done: list[ShardDone] = field(default_factory=list)
    failed: list[ShardFailed] = field(default_factory=list)
    interrupted: bool = False
    seconds: float = 0.0
    job_samples: dict[str, int] = field(default_factory=dict)  # samples to run, per job

    @property
    def occupancy(self) -> float | None:
        """Mean batch occupancy so far: searches per step over `max_batch_size`, averaged
        over every step of every actor (None before any step)."""
        return mean_occupancy(self.done)


def mean_occupancy(done: list[ShardDone]) -> float | None:
    capacity = sum(d.batch_steps * d.max_batch_size for d in done)
    return sum(d.slot_steps for d in done) / capacity if capacity else None


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C: finished shards are kept; `run` holds the counts so far."""

    def __init__(self, run: SweepRun) -> None:
        super().__init__("interrupted")
        self.run = run


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


def plan_jobs(jobs: list[Job], root: Path, *, lock: bool = False) -> list[JobPlan]:
    """Each job's folder, samples and pending shards. With `lock`, the job's lock is taken; a
    job another live driver holds comes back with no pending shards and `locked_by` set."""
    check_layout(root)
    plans = []
    for job in jobs:
        table = dataset_table(job.model, job.dataset, root)
        identity = dataset_identity(table)
        if job.dataset.path is not None:  # its rows decide the results, not its path
            job = dataclasses.replace(job, dataset_hash=identity.hash or "")
        folder = root / job.name
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


def shard_task(plan: JobPlan, index: int) -> ShardTask:
    job = plan.job
    lo, hi = shard_bounds(plan, index)
    return ShardTask(
        sweep=job.sweep,
        job=job.name,
        config_hash=job.config_hash,
        dataset=job.dataset.name,
        model_name=job.model.label,
        search=job.search,
        objective=job.objective,
        length=job.length,
        max_length=job.max_length,
        rows={c: v[lo:hi] for c, v in plan.rows.items()},
        shard=index,
        dataset_identity=plan.identity,
    )


# ---- running on Ray -----------------------------------------------------------------------------
def run_sweep(
    sweep: Sweep,
    out: str | Path,
    *,
    address: str | None = None,
    limit: int | None = None,
    model: str | None = None,
    max_attempts: int = 3,
    on_start: Callable[[SweepRun, int], None] | None = None,
    on_shard: Callable[[ShardDone], None] | None = None,
    stream: bool = True,
) -> SweepRun:
    """Run every shard of `sweep` that has no result file yet. `on_start(run, samples)` is
    called once the work is planned; `on_shard` after each finished shard (progress).
    `stream=False` hands actors one shard per call (the pre-issue-15 way, kept for comparison)."""
    started = time.perf_counter()
    check_address(address)  # before planning (dataset builds): fail fast
    root = Path(out) / sweep.name
    plans = plan_jobs(sweep.jobs(limit=limit, model=model), root, lock=True)
    held = [p.meta for p in plans if p.locked_by is None]
    try:
        return _run_plans(plans, started, address, max_attempts, on_start, on_shard, held, stream)
    finally:
        for folder in held:
            release_lock(folder)


def _run_plans(
    plans: list[JobPlan],
    started: float,
    address: str | None,
    max_attempts: int,
    on_start: Callable[[SweepRun, int], None] | None,
    on_shard: Callable[[ShardDone], None] | None,
    held: list[Path],
    stream: bool = True,
) -> SweepRun:
    import ray

    run = SweepRun(jobs=len(plans), shards_total=sum(p.shards for p in plans))
    run.locked = [p.job.name for p in plans if p.locked_by is not None]
    run.corrupt = [f"{p.job.name}/{name}" for p in plans for name in p.corrupt]
    locked_shards = sum(p.shards for p in plans if p.locked_by is not None)
    run.shards_skipped = run.shards_total - locked_shards - sum(len(p.pending) for p in plans)
    pending = [p for p in plans if p.pending]
    requests = [p.job.model.request() for p in pending]
    if address is None and not ray.is_initialized():
        check_resources(requests, None)  # before Ray starts (it would wait forever) and bars
    run.job_samples = {
        p.job.name: sum(hi - lo for lo, hi in map(partial(shard_bounds, p), p.pending))
        for p in pending
    }
    if on_start is not None:
        on_start(run, sum(run.job_samples.values()))
    try:
        if pending:
            with ray_session(requests, address):
                _Dispatch(pending, run, max_attempts, stream).drain(on_shard, held)
    except KeyboardInterrupt as exc:
        run.interrupted = True
        raise SweepInterrupted(run) from exc
    finally:
        run.seconds = time.perf_counter() - started
    return run


class _Dispatch:
    """One run's calls: a queue of calls and a group of actors per distinct model, the calls in
    flight, and the tries each shard has had. Hands each idle actor the next call of its model
    and writes each shard file as its rows come back."""

    def __init__(self, plans: list[JobPlan], run: SweepRun, max_attempts: int, stream: bool):
        self.run, self.max_attempts, self.stream = run, max_attempts, stream
        shards: dict[str, list[tuple[JobPlan, int]]] = {}
        models: dict[str, ModelSpec] = {}
        for p in plans:
            key = json.dumps(p.job.model.identity(), sort_keys=True)
            # Entries naming the same model (e.g. two presets) share its actors: the most
            # replicas.
            if key not in models or p.job.model.replicas > models[key].replicas:
                models[key] = p.job.model
            shards.setdefault(key, []).extend((p, i) for i in p.pending)
        self.queues = {
            key: deque(plan_calls(items, models[key].replicas, stream))
            for key, items in shards.items()
        }
        # Ray retries a one-shard call on the restarted actor by itself; streamed calls opt out
        # in `submit` (a re-run generator would redo the shards it already returned).
        self.actors = {key: self._start(m, len(self.queues[key])) for key, m in models.items()}
        self.in_flight: dict[Any, _Call] = {}
        self.attempts: dict[tuple[str, int], int] = {}

    def _start(self, model: ModelSpec, calls: int) -> list[Any]:
        """`model`'s actors: one per replica, no more than it has calls. Local paths made
        absolute once, here where they were checked: an actor on another node starts in that
        node's working directory."""
        on_actors = model.resolved()
        remote = actor_class(InversionWorker, model, self.max_attempts)
        return [remote.remote(on_actors, model.num_cpus) for _ in range(min(model.replicas, calls))]

    def drain(self, on_shard: Callable[[ShardDone], None] | None, held: list[Path]) -> None:
        """Run every call, keeping `held` locks fresh; Ctrl-C kills the actors."""
        import ray

        try:
            for key, group in self.actors.items():
                for actor in group:
                    self.submit(key, actor)
            refreshed = time.monotonic()
            while self.in_flight:
                ready, _ = ray.wait(
                    list(self.in_flight), num_returns=1, timeout=LOCK_REFRESH_SECONDS
                )
                if time.monotonic() - refreshed >= LOCK_REFRESH_SECONDS:
                    refresh_locks(held)  # our locks stay fresh for other hosts' drivers
                    refreshed = time.monotonic()
                done = self.receive(ready[0]) if ready else None
                if done is not None and on_shard is not None:
                    on_shard(done)
        except KeyboardInterrupt:
            for actor in (a for group in self.actors.values() for a in group):
                ray.kill(actor, no_restart=True)
            raise

    def submit(self, key: str, actor: Any) -> None:
        if not self.queues[key]:
            return
        call = _Call(key, actor, dict(enumerate(self.queues[key].popleft())), time.perf_counter())
        tasks = [shard_task(plan, index) for plan, index in call.left.values()]
        if self.stream:
            method = actor.run_shards.options(num_returns="streaming", max_task_retries=0)
            self.in_flight[method.remote(tasks)] = call
        else:
            self.in_flight[actor.run_shard.remote(tasks[0])] = call

    def receive(self, waitable: Any) -> ShardDone | None:
        """A ready call's next output, written as its shard file (None: the call ended or
        failed; its actor gets the next call)."""
        import ray

        call = self.in_flight[waitable]
        try:
            if self.stream:
                ref = next(waitable)  # ready: an output, an error, or the end
            else:
                ref = waitable  # a one-shard call: its only output
                del self.in_flight[waitable]
            output: ShardOutput = ray.get(ref)
        except StopIteration:
            del self.in_flight[waitable]
            if call.left:  # the generator ended without them: never silently lost
                self.fail(call, RuntimeError(f"the call ended with {len(call.left)} shards left"))
            self.submit(call.key, call.actor)
            return None
        except (ray.exceptions.RayError, OSError) as exc:
            self.in_flight.pop(waitable, None)
            self.fail(call, exc)
            self.submit(call.key, call.actor)
            return None
        plan, index = call.left.pop(output.index)
        write_table_atomic(output.table, shard_path(plan.folder, index))
        error_path(plan.meta, index).unlink(missing_ok=True)
        done = ShardDone(
            plan.job.name,
            index,
            len(output.table),
            *found_exact(output.table),
            output.seconds,
            output.pid,
            time.perf_counter() - call.submitted - output.seconds,
            int(pc.sum(output.table["steps"]).as_py() or 0),
            output.slot_steps,
            output.batch_steps,
            output.max_batch_size,
        )
        self.run.done.append(done)
        if not self.stream:
            self.submit(call.key, call.actor)
        return done

    def fail(self, call: _Call, exc: BaseException) -> None:
        """The call's unfinished shards: queued again as one call, or failed for good (an
        error file each) once they have had `max_attempts` tries."""
        message = last_line(exc)
        retry = []
        for plan, index in call.left.values():
            key = (plan.job.name, index)
            tries = self.attempts[key] = self.attempts.get(key, 0) + 1
            if tries < self.max_attempts:
                log.warning("shard %d of %s failed (%s); retrying", index, plan.job.name, message)
                retry.append((plan, index))
            else:
                failure = ShardFailed(plan.job.name, index, tries, message)
                self.run.failed.append(failure)
                error_path(plan.meta, index).write_text(
                    json.dumps(failure.__dict__, indent=2) + "\n"
                )
        if retry:
            self.queues[call.key].append(retry)


@dataclass
class _Call:
    """One call in flight: its actor and the shards it has not returned yet, by position."""

    key: str  # the model's queue
    actor: Any
    left: dict[int, tuple[JobPlan, int]]
    submitted: float


def plan_calls(
    shards: list[tuple[JobPlan, int]], replicas: int, stream: bool = True
) -> list[list[tuple[JobPlan, int]]]:
    """A model's pending shards as actor calls. Streamed: shards of one batch key share calls,
    at least one call per replica and at most `STREAM_BATCHES` batches' worth of samples per
    call. The key's shards are cut into blocks of consecutive shards holding a batch's worth of
    samples, and the blocks dealt round-robin: `invert` runs one pool per input length and
    datasets list samples by length, so a block keeps a length's samples together (a pool a
    call can fill), while dealing mixes easy and hard lengths across calls (replicas finish
    together). Keys take turns, in the order their first shard comes."""
    if not stream:
        return [[item] for item in shards]
    groups: dict[str, list[tuple[JobPlan, int]]] = {}
    for plan, index in shards:
        job = plan.job
        key = batch_key(job.search, job.objective, job.length, job.max_length)
        groups.setdefault(key, []).append((plan, index))
    calls = []
    for items in groups.values():
        batch = items[0][0].job.search.max_batch_size
        blocks: list[list[tuple[JobPlan, int]]] = [[]]
        filled = samples = 0
        for plan, index in items:
            lo, hi = shard_bounds(plan, index)
            if filled >= batch:
                blocks.append([])
                filled = 0
            blocks[-1].append((plan, index))
            filled += hi - lo
            samples += hi - lo
        count = min(len(blocks), max(replicas, -(-samples // (STREAM_BATCHES * batch))))
        calls.extend([item for block in blocks[j::count] for item in block] for j in range(count))
    return calls


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


def job_status(meta: Path) -> JobStatus:
    """A job's counts from its `meta` folder (`.sodaray/jobs/<job>`) and its shard files."""
    info = json.loads((meta / JOB_FILE).read_text())
    folder = meta.parents[2] / info["job"]
    done = failed = samples = found = exact = 0
    for i in range(info["shards"]):
        path = shard_path(folder, i)
        size = min(info["shard_size"], info["samples"] - i * info["shard_size"])
        if path.exists() and shard_problem(path, rows=size) is None:  # `run` sets bad ones aside
            done += 1
            t = pq.read_table(path, columns=["found", "exact"])
            samples += len(t)
            f, e = found_exact(t)
            found, exact = found + f, exact + e
        elif error_path(meta, i).exists():
            failed += 1
    return JobStatus(
        info["sweep"], info["job"], info["shards"], done, failed, samples, found, exact
    )


def sweep_status(out: str | Path) -> list[JobStatus]:
    """Every job under `out` (a results folder or one sweep's folder)."""
    out = Path(out)
    if not out.is_dir():
        raise FileNotFoundError(f"no such results folder: {out}")
    jobs = []
    for path in sorted(out.rglob(JOB_FILE)):
        if path.parent.parent.name == "jobs" and path.parents[2].name == META_DIR:
            jobs.append(job_status(path.parent))
        else:  # beside its shards: the layout before schema 3, whose runs are refused
            log.warning("skipped %s: a job in the layout before result schema 3", path.parent)
    return jobs
