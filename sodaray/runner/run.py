"""`sodaray sweep run`: a sweep's pending shards as units on each model's replicas, each shard's
file written as its rows come back.

Every shard of every job is a unit (`experiment.work.Unit`); the units of one model go to one
actor group (`experiment.group.ActorGroup`), whose replicas run all of them through one engine,
so a replica's batch holds samples of any job, config and length at once. The driver writes a
shard's file when its rows arrive, keeps its locks fresh, and records a shard that failed for
good (`.sodaray/jobs/<job>/shard-NNNNN.error.json`, retried by the next run). Ctrl-C stops the
replicas and keeps every finished shard.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pyarrow.compute as pc

from sodaray.experiment.cluster import check_address, check_resources, ray_session
from sodaray.experiment.group import ActorGroup, Failure, next_event
from sodaray.experiment.work import Finished, Unit
from sodaray.paths import inside
from sodaray.progress import mean_occupancy
from sodaray.results import write_table_atomic
from sodaray.runner.layout import (
    LOCK_REFRESH_SECONDS,
    JobPlan,
    error_path,
    found_exact,
    plan_jobs,
    refresh_locks,
    release_lock,
    shard_bounds,
    shard_path,
)
from sodaray.runner.spec import Job, Sweep

log = logging.getLogger(__name__)


@dataclass
class ShardDone:
    """What the driver keeps of a finished shard: counts, never the rows. The occupancy counts
    are its replica's since its previous output (see `experiment.work.Finished`)."""

    job: str
    shard: int
    samples: int
    found: int
    exact: int
    seconds: float  # on the replica
    pid: int
    sample_steps: int = 0  # the shard's samples' steps, summed
    slot_steps: int = 0
    capacity_steps: int = 0
    batch_steps: int = 0
    at: float = 0.0  # seconds into the run when the driver had its rows


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
    started: float = 0.0  # time.perf_counter() when the run began
    job_samples: dict[str, int] = field(default_factory=dict)  # samples to run, per job
    pending_jobs: list[Job] = field(default_factory=list)  # as planned (a file's hash named)

    @property
    def occupancy(self) -> float | None:
        """Mean batch occupancy so far: searches per step over the batches' capacity, over
        every step of every replica (None before any step)."""
        return mean_occupancy(self.done)

    @property
    def searching_seconds(self) -> float | None:
        """The run's wall without its start-up (Ray, the replicas loading their models): from
        the first shard starting on a replica to the last shard's rows (None: none finished)."""
        if not self.done:
            return None
        return max(d.at for d in self.done) - min(d.at - d.seconds for d in self.done)


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C: finished shards are kept; `run` holds the counts so far."""

    def __init__(self, run: SweepRun) -> None:
        super().__init__("interrupted")
        self.run = run


def shard_unit(plan: JobPlan, index: int) -> Unit:
    """Shard `index` of a job as a unit: its rows, its job's settings and the rows' context."""
    job = plan.job
    lo, hi = shard_bounds(plan, index)
    return Unit(
        key=f"{job.name}/{index}",
        rows={c: v[lo:hi] for c, v in plan.rows.items()},
        search=job.search,
        objective=job.objective,
        length=job.length,
        max_length=job.max_length,
        context={
            "dataset": job.dataset.name,
            "sweep": job.sweep,
            "job": job.name,
            "config_hash": job.config_hash,
            "shard": index,
            "model_name": job.model.label,
            **plan.identity.context(),
        },
    )


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
) -> SweepRun:
    """Run every shard of `sweep` that has no result file yet. `on_start(run, samples)` is
    called once the work is planned; `on_shard` after each finished shard (progress)."""
    import ray

    started = time.perf_counter()
    check_address(address)  # before planning (dataset builds): fail fast
    root = inside(out, sweep.name)
    jobs = sweep.jobs(limit=limit, model=model)
    plans = plan_jobs(jobs, root, lock=True, overrides=sweep.overrides)
    held = [p.meta for p in plans if p.locked_by is None]
    run = SweepRun(jobs=len(plans), shards_total=sum(p.shards for p in plans), started=started)
    run.locked = [p.job.name for p in plans if p.locked_by is not None]
    run.corrupt = [f"{p.job.name}/{name}" for p in plans for name in p.corrupt]
    locked = sum(p.shards for p in plans if p.locked_by is not None)
    run.shards_skipped = run.shards_total - locked - sum(len(p.pending) for p in plans)
    pending = [p for p in plans if p.pending]
    run.pending_jobs = [p.job for p in pending]
    run.job_samples = {
        p.job.name: sum(hi - lo for lo, hi in map(partial(shard_bounds, p), p.pending))
        for p in pending
    }
    requests = [p.job.model.request() for p in pending]
    try:
        if address is None and pending and not ray.is_initialized():
            check_resources(requests, None)  # before Ray starts (it would wait forever) and bars
        if on_start is not None:
            on_start(run, sum(run.job_samples.values()))
        if pending:
            with ray_session(requests, address):
                _Shards(pending, run, max_attempts).drain(on_shard, held)
    except KeyboardInterrupt as exc:
        run.interrupted = True
        raise SweepInterrupted(run) from exc
    finally:
        run.seconds = time.perf_counter() - started
        for folder in held:
            release_lock(folder)
    return run


class _Shards:
    """One run's shards on one actor group per model (entries naming the same model share it,
    with the most replicas any asks for)."""

    def __init__(self, plans: list[JobPlan], run: SweepRun, max_attempts: int) -> None:
        self.run = run
        self.shards: dict[str, tuple[JobPlan, int]] = {}
        models: dict[str, list[JobPlan]] = {}
        for p in plans:
            models.setdefault(json.dumps(p.job.model.identity(), sort_keys=True), []).append(p)
        self.groups = []
        for same in models.values():
            spec = max((p.job.model for p in same), key=lambda m: m.replicas)
            shards = [(p, i) for p in same for i in p.pending]
            group = ActorGroup(
                spec, max_attempts=max_attempts, replicas=min(spec.replicas, len(shards))
            )
            for plan, index in shards:
                unit = shard_unit(plan, index)
                self.shards[unit.key] = (plan, index)
                group.submit(unit)
            self.groups.append(group)

    def drain(self, on_shard: Callable[[ShardDone], None] | None, held: list[Path]) -> None:
        """Until every shard is written or failed for good, keeping `held` locks fresh; Ctrl-C
        kills the replicas."""
        try:
            refreshed = time.monotonic()
            while any(len(g) for g in self.groups):
                event = next_event(self.groups, timeout=LOCK_REFRESH_SECONDS)
                if time.monotonic() - refreshed >= LOCK_REFRESH_SECONDS:
                    refresh_locks(held)  # our locks stay fresh for other hosts' drivers
                    refreshed = time.monotonic()
                if event is None:
                    continue
                group, unit, output = event
                plan, index = self.shards[unit.key]
                if isinstance(output, Finished):
                    done = self.write(plan, index, output)
                    if on_shard is not None:
                        on_shard(done)
                elif isinstance(output, Failure) and output.final:
                    self.fail(plan, index, output)
                if not len(group):
                    # Its model is done: free its replicas' CPUs and GPUs for the models
                    # whose actors wait for room (more models than the machine runs at once).
                    group.kill()
        except KeyboardInterrupt:
            for group in self.groups:
                group.kill()
            raise

    def write(self, plan: JobPlan, index: int, output: Finished) -> ShardDone:
        table = output.table
        write_table_atomic(table, shard_path(plan.folder, index))
        error_path(plan.meta, index).unlink(missing_ok=True)
        done = ShardDone(
            plan.job.name,
            index,
            len(table),
            *found_exact(table),
            output.seconds,
            output.pid,
            int(pc.sum(table["steps"]).as_py() or 0),
            output.slot_steps,
            output.capacity_steps,
            output.batch_steps,
            time.perf_counter() - self.run.started,
        )
        self.run.done.append(done)
        return done

    def fail(self, plan: JobPlan, index: int, failure: Failure) -> None:
        failed = ShardFailed(plan.job.name, index, failure.attempts, failure.error)
        self.run.failed.append(failed)
        error_path(plan.meta, index).write_text(json.dumps(failed.__dict__, indent=2) + "\n")
