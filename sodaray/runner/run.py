"""`sodaray sweep run`: a sweep's pending shards as units on each model's replicas, each shard's
file written as its rows come back.

The units of one model go to one actor group, so a replica's batch holds samples of any job,
config and length at once. The driver writes a shard's file when its rows arrive, counts each
job's progress, keeps its locks fresh, and records a shard that failed for good (its error file,
retried by the next run). A running shard's ended searches are kept beside it at most every
`KEEP_EVERY_S`: a driver stopped mid-shard loses only the searches still running. Ctrl-C stops
the replicas and keeps every finished shard.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from sodaray.costs.flops import most_sample_steps
from sodaray.experiment import stops
from sodaray.experiment.cluster import (
    Cluster,
    Placement,
    check_address,
    check_resources,
    cluster_address,
    ray_session,
)
from sodaray.experiment.group import ActorGroup, Failure, next_event
from sodaray.experiment.owner import REFRESH_SECONDS, describe_owner
from sodaray.experiment.work import Finished, Kept, Progress, Unit, UnitProgress
from sodaray.io.paths import inside
from sodaray.io.writes import OutputFolder
from sodaray.results import write_table_atomic
from sodaray.runner.jobs import JobPlan, plan_jobs, shard_bounds, shard_table
from sodaray.runner.layout import (
    error_path,
    found_exact,
    kept_path,
    refresh_locks,
    release_lock,
    shard_path,
)
from sodaray.runner.plan import check_jobs_fit
from sodaray.runner.spec import Job, Sweep

KEEP_EVERY_S = 30.0  # a search on a real model takes minutes; a write is a small Parquet file


@dataclass
class ShardDone:
    """What the driver keeps of a finished shard: counts, never the rows (the occupancy counts:
    its replica's since its previous output)."""

    job: str
    shard: int
    samples: int
    found: int
    exact: int
    seconds: float  # on the replica
    pid: int
    sample_steps: int = 0  # the steps its samples took in this run, summed
    slot_steps: int = 0
    capacity_steps: int = 0
    batch_steps: int = 0
    at: float = 0.0  # seconds into the run when the driver had its rows


@dataclass
class JobProgress:
    """A job's progress in this run: the sample-steps its samples have taken out of the most
    they can take (`most`: equal to `sample_steps` once the job is done), and its samples to
    run, finished and found (running shards as their replicas last reported them)."""

    job: str
    samples: int
    most: int
    sample_steps: int = 0
    finished: int = 0
    found: int = 0

    def add(self, old: UnitProgress, new: UnitProgress) -> None:
        """One of its shards went from `old` counts to `new`."""
        for name in ("sample_steps", "most", "finished", "found"):
            setattr(self, name, getattr(self, name) + getattr(new, name) - getattr(old, name))


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
    kept: int = 0  # samples of unfinished shards whose rows an earlier run kept
    locked: list[str] = field(default_factory=list)  # jobs another live driver is running
    lock_owners: dict[str, str] = field(default_factory=dict)  # job -> "host pid N since ..."
    corrupt: list[str] = field(default_factory=list)  # shard, kept files set aside: recomputed
    done: list[ShardDone] = field(default_factory=list)
    failed: list[ShardFailed] = field(default_factory=list)
    interrupted: bool = False
    seconds: float = 0.0
    started: float = 0.0  # time.perf_counter() when the run began
    progress: dict[str, JobProgress] = field(default_factory=dict)  # jobs with samples to run
    pending_jobs: list[Job] = field(default_factory=list)  # as planned (a file's hash named)
    # Every replica's steps so far: searches stepped against the slots their batches offered,
    # over so many batch-steps; and the batch-steps by model label (`plan.check_run` prices).
    slot_steps: int = 0
    capacity_steps: int = 0
    batch_steps: int = 0
    model_batch_steps: dict[str, int] = field(default_factory=dict)

    @property
    def occupancy(self) -> float | None:
        """Mean batch occupancy so far, over every step of every replica (None: no step yet)."""
        return self.slot_steps / self.capacity_steps if self.capacity_steps else None

    def count_steps(self, output: Progress | Finished, model: str) -> None:
        """A replica of `model` (its label) reported its steps since its previous output."""
        for name in ("slot_steps", "capacity_steps", "batch_steps"):
            setattr(self, name, getattr(self, name) + getattr(output, name))
        self.model_batch_steps[model] = self.model_batch_steps.get(model, 0) + output.batch_steps

    @property
    def searching_seconds(self) -> float | None:
        """The run's wall without its start-up: from the first shard starting on a replica to
        the last shard's rows (None: none finished)."""
        if not self.done:
            return None
        return max(d.at for d in self.done) - min(d.at - d.seconds for d in self.done)


SweepInterrupted = stops.Interrupted  # the name `sodaray.runner` exports


def shard_unit(plan: JobPlan, index: int, keep_every: float | None = None) -> Unit:
    """Shard `index` of a job as a unit: its rows (but those an earlier run kept), its job's
    settings and the rows' context; its ended searches' rows sent every `keep_every` seconds."""
    job = plan.job
    kept = plan.kept.get(index)
    done = set() if kept is None else set(kept["sample_id"].to_pylist())
    picked = [i for i in range(*shard_bounds(plan, index)) if plan.rows["sample_id"][i] not in done]
    context = plan.identity.context(job.dataset.name, job.sweep, job.name)
    context |= {"config_hash": job.config_hash, "shard": index, "model_name": job.model.label}
    return Unit(
        key=f"{job.name}/{index}",
        rows={c: [v[i] for i in picked] for c, v in plan.rows.items()},
        search=job.search,
        objective=job.objective,
        length=job.length,
        max_length=job.max_length,
        keep_every=keep_every,
        context=context,
    )


def _not_started(unit: Unit) -> UnitProgress:
    """A unit's counts before its first step (and again when it is tried from its first step)."""
    return UnitProgress(
        key=unit.key, sample_steps=0, finished=0, found=0, most=unit.most_sample_steps
    )


def run_sweep(
    sweep: Sweep,
    out: str | Path,
    *,
    cluster: Cluster = Cluster(),
    limit: int | None = None,
    model: str | None = None,
    on_start: Callable[[SweepRun, int], None] | None = None,
    on_shard: Callable[[ShardDone], None] | None = None,
    on_progress: Callable[[JobProgress], None] | None = None,
    keep_every: float | None = KEEP_EVERY_S,
) -> SweepRun:
    """Run every shard of `sweep` that has no result file yet. `on_start(run, samples)` is
    called once the work is planned; `on_shard` after each finished shard, `on_progress` with a
    job's counts each time they change (at least once a second while its shards run).
    `keep_every`: seconds between writes of a running shard's ended searches (None: none)."""
    import ray

    started = time.perf_counter()
    check_address(cluster.address)  # before planning (dataset builds): fail fast
    root = inside(out, sweep.name)
    jobs = sweep.jobs(limit=limit, model=model)
    check_jobs_fit(jobs, sweep.path)  # on the driver, before a lock, a build or an actor
    out_folder = OutputFolder(Path(out))  # the folder the user gave: nothing below it is a link
    plans = plan_jobs(jobs, root, lock=True, overrides=sweep.overrides, out=out_folder)
    held = [p.meta for p in plans if p.locked_by is None]
    run = SweepRun(jobs=len(plans), shards_total=sum(p.shards for p in plans), started=started)
    run.lock_owners = {p.job.name: describe_owner(p.locked_by) for p in plans if p.locked_by}
    run.locked = list(run.lock_owners)
    run.corrupt = [f"{p.job.name}/{name}" for p in plans for name in p.corrupt]
    locked = sum(p.shards for p in plans if p.locked_by is not None)
    run.shards_skipped = run.shards_total - locked - sum(len(p.pending) for p in plans)
    pending = [p for p in plans if p.pending]
    run.pending_jobs = [p.job for p in pending]
    run.kept = sum(p.kept_whole for p in plans)  # shards written whole from kept rows
    for p in pending:
        kept = sum(len(t) for t in p.kept.values())
        run.kept += kept
        samples = sum(hi - lo for lo, hi in map(partial(shard_bounds, p), p.pending)) - kept
        most = most_sample_steps(samples, p.job.search, p.job.length, p.job.max_length)
        run.progress[p.job.name] = JobProgress(job=p.job.name, samples=samples, most=most)
    requests = [p.job.model.request() for p in pending]
    attach = cluster_address(cluster.address) is not None
    try:
        with contextlib.ExitStack() as stack:
            session = None
            if pending and attach:  # a cluster that refuses us: its one line, before the plan's
                session = stack.enter_context(ray_session(requests, cluster))
            elif pending and not ray.is_initialized():
                check_resources(requests)  # before Ray starts (it would wait forever) and bars
            if on_start is not None:
                on_start(run, sum(p.samples for p in run.progress.values()))
            if pending:
                if session is None:
                    session = stack.enter_context(ray_session(requests, cluster))
                placement, groups = session  # the groups made, ended however the run stops
                shards = _Shards(pending, run, cluster, placement, groups, keep_every)
                shards.drain(on_shard, on_progress, held, out_folder)
    except KeyboardInterrupt as exc:
        run.interrupted = True
        raise stops.Interrupted(run) from exc
    finally:
        run.seconds = time.perf_counter() - started
        for folder in held:
            release_lock(folder, out_folder)
    return run


class _Shards:
    """One run's shards on one actor group per model (entries naming the same model share it,
    with the most replicas any asks for)."""

    def __init__(
        self,
        plans: list[JobPlan],
        run: SweepRun,
        cluster: Cluster,
        placement: Placement,
        groups: list[ActorGroup],  # the session's (`ray_session` ends them)
        keep_every: float | None,
    ) -> None:
        self.run = run
        self.shards: dict[str, tuple[JobPlan, int]] = {}
        self.counts: dict[str, UnitProgress] = {}  # shards not ended: as last reported
        self.kept: dict[str, list[pa.Table]] = {}  # rows kept in this run, by unit
        models: dict[str, list[JobPlan]] = {}
        for p in plans:
            models.setdefault(json.dumps(p.job.model.identity(), sort_keys=True), []).append(p)
        self.groups = groups
        for same in models.values():
            spec = max((p.job.model for p in same), key=lambda m: m.replicas)
            shards = [(p, i) for p in same for i in p.pending]
            group = ActorGroup(
                spec,
                max_attempts=cluster.max_attempts,
                replicas=min(spec.replicas, len(shards)),
                placement=placement,
            )
            self.groups.append(group)
            for plan, index in shards:
                unit = shard_unit(plan, index, keep_every)
                self.shards[unit.key] = (plan, index)
                self.counts[unit.key] = _not_started(unit)
                group.submit(unit)

    def drain(
        self,
        on_shard: Callable[[ShardDone], None] | None,
        on_progress: Callable[[JobProgress], None] | None,
        held: list[Path],
        out: OutputFolder,
    ) -> None:
        """Until every shard is written or failed for good, keeping `held` locks (in the
        output folder `out`) fresh (Ctrl-C, or a run that cannot go on: `ray_session` ends the
        replicas)."""
        refreshed = time.monotonic()
        while any(len(g) for g in self.groups):
            event = next_event(self.groups, timeout=REFRESH_SECONDS)
            if time.monotonic() - refreshed >= REFRESH_SECONDS:
                refresh_locks(held, out)  # our locks stay fresh for other hosts' drivers
                refreshed = time.monotonic()
            if event is None:
                continue
            group, unit, output = event
            plan, index = self.shards[unit.key]
            moved: set[str] = set()
            if isinstance(output, Progress):
                self.run.count_steps(output, plan.job.model.label)
                for counts in output.units:
                    moved |= self.move(counts)
            elif isinstance(output, Kept):
                self.keep(plan, index, output)
            elif isinstance(output, Finished):
                self.run.count_steps(output, plan.job.model.label)
                done = self.write(plan, index, output)
                if on_shard is not None:
                    on_shard(done)
                final = UnitProgress(
                    key=unit.key,
                    sample_steps=done.sample_steps,
                    finished=len(output.table),
                    found=found_exact(output.table)[0],
                    most=0,
                )
                moved = self.move(final, ended=True)
            elif isinstance(output, Failure) and output.final:
                failed = ShardFailed(
                    job=plan.job.name, shard=index, attempts=output.attempts, error=output.error
                )
                self.run.failed.append(failed)
                text = json.dumps(failed.__dict__, indent=2) + "\n"
                plan.out.write(error_path(plan.meta, index), text)
                moved = self.move(self.counts[unit.key], ended=True)  # nothing more comes
            elif isinstance(output, Failure):  # tried again, from its first step
                moved = self.move(_not_started(unit))
            if on_progress is not None:
                for job in moved:
                    on_progress(self.run.progress[job])
            if not len(group):
                # Its model is done: free its replicas' CPUs and GPUs for the models
                # whose actors wait for room (more models than the machine runs at once).
                group.kill()

    def move(self, new: UnitProgress, ended: bool = False) -> set[str]:
        """A shard's counts are now `new` (its job's name, if they changed anything). A shard
        that has `ended` ends at the steps it took; later reports of it are ignored."""
        old = self.counts.get(new.key)
        if old is None:
            return set()
        if ended:
            new = replace(new, most=new.sample_steps)
            del self.counts[new.key]
        else:
            self.counts[new.key] = new
        if new == old:
            return set()
        job = self.shards[new.key][0].job.name
        self.run.progress[job].add(old, new)
        return {job}

    def keep(self, plan: JobPlan, index: int, output: Kept) -> None:
        """Rows of a running shard's ended searches: written beside it with those kept before
        (atomically: a stop mid-write leaves the last file), for a run that stops first."""
        tables = self.kept.setdefault(output.key, [])
        before = [t for t in [plan.kept.get(index)] if t is not None]
        have = {s for t in [*before, *tables] for s in t["sample_id"].to_pylist()}
        new = pc.invert(pc.is_in(output.table["sample_id"], pa.array(sorted(have), pa.int64())))
        tables.append(output.table.filter(new))  # a unit tried again sends its rows again
        kept = pa.concat_tables([*before, *tables])
        write_table_atomic(kept, kept_path(plan.meta, index), plan.out)

    def write(self, plan: JobPlan, index: int, output: Finished) -> ShardDone:
        """The shard's file, from the run's rows and those an earlier run kept; its kept rows
        then go (a stop between the two leaves both: the next run trusts the shard file)."""
        kept = plan.kept.get(index)
        table = shard_table(plan, index, [t for t in [kept, output.table] if t is not None])
        write_table_atomic(table, shard_path(plan.folder, index), plan.out)
        plan.out.remove(kept_path(plan.meta, index))
        self.kept.pop(output.key, None)
        plan.out.remove(error_path(plan.meta, index))
        found, exact = found_exact(table)
        done = ShardDone(
            job=plan.job.name,
            shard=index,
            samples=len(table),
            found=found,
            exact=exact,
            seconds=output.seconds,
            pid=output.pid,
            sample_steps=int(pc.sum(output.table["steps"]).as_py() or 0),
            slot_steps=output.slot_steps,
            capacity_steps=output.capacity_steps,
            batch_steps=output.batch_steps,
            at=time.perf_counter() - self.run.started,
        )
        self.run.done.append(done)
        return done
