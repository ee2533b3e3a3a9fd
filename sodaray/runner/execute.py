"""Running a sweep on Ray: jobs -> shards -> actors (one model replica each) -> Parquet files.

Layout: `OUT/<sweep>/<job>/job.json` (the job's settings, shard count) and one
`shard-NNNNN.parquet` per finished shard, written atomically by the driver; a shard that keeps
failing leaves `shard-NNNNN.error.json` instead and is retried by the next run. Resume is
therefore "compute every shard without a result file". Ray does the placement (actors ask for
the resources their model entry names), restarts dead actors, and retries their in-flight
shards; this module only hands each idle actor the next shard of its model.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sodaray.results import write_table_atomic
from sodaray.runner.spec import DatasetSpec, Job, ModelSpec, Sweep
from sodaray.runner.worker import InversionWorker

log = logging.getLogger(__name__)

JOB_FILE = "job.json"


def found_exact(table: pa.Table) -> tuple[int, int]:
    """Counts of found and exact rows (unknown exact counts as not exact)."""
    found = int(pc.sum(table["found"]).as_py() or 0)
    exact = int(pc.sum(table["exact"].fill_null(False)).as_py() or 0)
    return found, exact


def shard_path(folder: Path, index: int) -> Path:
    return folder / f"shard-{index:05d}.parquet"


def error_path(folder: Path, index: int) -> Path:
    return folder / f"shard-{index:05d}.error.json"


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
    done: list[ShardDone] = field(default_factory=list)
    failed: list[ShardFailed] = field(default_factory=list)
    interrupted: bool = False
    seconds: float = 0.0


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C: finished shards are kept; `run` holds the counts so far."""

    def __init__(self, run: SweepRun) -> None:
        super().__init__("interrupted")
        self.run = run


# ---- planning (no Ray) --------------------------------------------------------------------------
@dataclass
class JobPlan:
    job: Job
    folder: Path
    rows: dict[str, list[Any]]  # the selected samples' columns
    shards: int
    pending: list[int]


def select_rows(
    table: pa.Table, samples_per_length: int | None, limit: int | None
) -> dict[str, list[Any]]:
    """The job's samples: the first `samples_per_length` of each length (dataset order), then
    at most `limit` in all, taken evenly across lengths so a quick look covers every length."""
    cols = [
        c
        for c in ("sample_id", "length", "tokens", "text", "pii_labels")
        if c in table.column_names
    ]
    records = table.select(cols).to_pylist()
    records.sort(key=lambda r: r["sample_id"])
    rank: dict[int, int] = {}
    ranked = []
    for r in records:
        k = rank.get(r["length"], 0)
        rank[r["length"]] = k + 1
        if samples_per_length is None or k < samples_per_length:
            ranked.append((k, r))
    if limit is not None:
        ranked.sort(key=lambda kr: (kr[0], kr[1]["length"]))
        ranked = ranked[:limit]
    chosen = sorted((r for _, r in ranked), key=lambda r: r["sample_id"])
    return {c: [r[c] for r in chosen] for c in cols}


def dataset_table(model: ModelSpec, spec: DatasetSpec, root: Path) -> pa.Table:
    """A dataset: its file, or built from the spec for `model`'s tokenizer once (cached
    under `root/datasets/`)."""
    from sodaray.data import read_dataset

    if spec.path is not None:
        return read_dataset(spec.path)
    from sodaray.results import config_hash

    build = dict(spec.build or {})
    key = config_hash({"model": model.identity(), "build": build, "name": spec.name})
    path = root / "datasets" / f"{model.label}-{spec.name}-{key[:8]}.parquet"
    if not path.exists():
        from sodaray.data import build_dataset, write_dataset

        log.info("building dataset %s for %s", spec.name, model.label)
        table = build_dataset(
            model.id,
            build.get("dataset", spec.name),
            build.get("lengths"),
            build.get("per_length"),
            build.get("seed", 1),
            build.get("source"),
            gguf_file=model.gguf_file,
            progress=False,
        )
        write_dataset(table, path)
    return read_dataset(path)


def plan_jobs(jobs: list[Job], root: Path) -> list[JobPlan]:
    plans = []
    for job in jobs:
        folder = root / job.name
        table = dataset_table(job.model, job.dataset, root)
        rows = select_rows(table, job.samples_per_length, job.limit)
        n = len(rows["sample_id"])
        shards = (n + job.shard_size - 1) // job.shard_size
        folder.mkdir(parents=True, exist_ok=True)
        info = {
            "sweep": job.sweep,
            "job": job.name,
            "config_hash": job.config_hash,
            "samples": n,
            "shards": shards,
            "shard_size": job.shard_size,
            "config": job.config(),
        }
        (folder / JOB_FILE).write_text(json.dumps(info, indent=2, default=str) + "\n")
        pending = [i for i in range(shards) if not shard_path(folder, i).exists()]
        plans.append(JobPlan(job, folder, rows, shards, pending))
    return plans


def shard_bounds(plan: JobPlan, index: int) -> tuple[int, int]:
    """The shard's rows, [lo, hi), in the job's selected samples."""
    size = plan.job.shard_size
    return index * size, min((index + 1) * size, len(plan.rows["sample_id"]))


def shard_task(plan: JobPlan, index: int) -> dict[str, Any]:
    job = plan.job
    lo, hi = shard_bounds(plan, index)
    return {
        "sweep": job.sweep,
        "job": job.name,
        "config_hash": job.config_hash,
        "dataset": job.dataset.name,
        "model_name": job.model.label,
        "algorithm": job.algorithm,
        "params": job.params,
        "objective": job.objective,
        "length": job.length,
        "max_length": job.max_length,
        "rows": {c: v[lo:hi] for c, v in plan.rows.items()},
    }


# ---- running on Ray -----------------------------------------------------------------------------
def init_ray(address: str | None) -> None:
    """Start Ray locally (no address) or join a cluster, with a one-line error when the cluster
    cannot be reached (Ray itself would wait minutes on a wrong HOST:PORT)."""
    import socket

    import ray

    hint = "start one (`ray start --head`, `ray up cluster.yaml`) or leave out --address"
    if address and address not in ("auto", "local") and "://" not in address:
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host or "127.0.0.1", int(port)), timeout=5).close()
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot reach a Ray cluster at {address} ({exc}); {hint}") from exc
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    except ConnectionError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"cannot connect to a Ray cluster at {address}: {first}; {hint}") from exc


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
    root = Path(out) / sweep.name
    plans = plan_jobs(sweep.jobs(limit=limit, model=model), root)
    run = SweepRun(jobs=len(plans), shards_total=sum(p.shards for p in plans))
    run.shards_skipped = run.shards_total - sum(len(p.pending) for p in plans)
    pending_samples = sum(
        hi - lo for p in plans for lo, hi in (shard_bounds(p, i) for i in p.pending)
    )
    if on_start is not None:
        on_start(run, pending_samples)
    if not any(p.pending for p in plans):
        run.seconds = time.perf_counter() - started
        return run

    own_ray = not ray.is_initialized()
    if own_ray:
        init_ray(address)
    # One queue and one group of actors per distinct model.
    queues: dict[str, deque[tuple[JobPlan, int]]] = {}
    specs = {}
    for p in plans:
        key = json.dumps(p.job.model.identity(), sort_keys=True)
        # Entries naming the same model (e.g. two presets) share its actors: the most replicas.
        if key not in specs or p.job.model.replicas > specs[key].replicas:
            specs[key] = p.job.model
        queues.setdefault(key, deque()).extend((p, i) for i in p.pending)
    remote = ray.remote(InversionWorker)
    actors: dict[str, list[Any]] = {}
    for key, q in queues.items():
        if not q:
            continue
        spec = specs[key]
        options = dict(
            num_cpus=spec.num_cpus,
            num_gpus=spec.num_gpus,
            max_restarts=-1,
            max_task_retries=max_attempts,
        )
        model_args = {**spec.identity(), "trust_remote_code": spec.trust_remote_code}
        actors[key] = [
            remote.options(**options).remote(model_args, spec.num_cpus)
            for _ in range(min(spec.replicas, len(q)))
        ]
    in_flight: dict[Any, tuple[str, Any, JobPlan, int, float]] = {}
    attempts: dict[tuple[str, int], int] = {}

    def submit(key: str, actor: Any) -> None:
        if queues[key]:
            plan, index = queues[key].popleft()
            ref = actor.run_shard.remote(shard_task(plan, index))
            in_flight[ref] = (key, actor, plan, index, time.perf_counter())

    try:
        for key, group in actors.items():
            for actor in group:
                submit(key, actor)
        while in_flight:
            ready, _ = ray.wait(list(in_flight), num_returns=1)
            ref = ready[0]
            key, actor, plan, index, submitted = in_flight.pop(ref)
            try:
                out_ = ray.get(ref)
            except (ray.exceptions.RayError, OSError) as exc:
                tries = attempts[(plan.job.name, index)] = (
                    attempts.get((plan.job.name, index), 0) + 1
                )
                message = str(exc).strip().splitlines()[-1] if str(exc).strip() else repr(exc)
                if tries < max_attempts:
                    log.warning(
                        "shard %d of %s failed (%s); retrying", index, plan.job.name, message
                    )
                    queues[key].append((plan, index))
                else:
                    failure = ShardFailed(plan.job.name, index, tries, message)
                    run.failed.append(failure)
                    error_path(plan.folder, index).write_text(
                        json.dumps(failure.__dict__, indent=2) + "\n"
                    )
                submit(key, actor)
                continue
            table: pa.Table = out_["table"]
            write_table_atomic(table, shard_path(plan.folder, index))
            error_path(plan.folder, index).unlink(missing_ok=True)
            done = ShardDone(
                plan.job.name,
                index,
                len(table),
                *found_exact(table),
                out_["seconds"],
                out_["pid"],
                time.perf_counter() - submitted - out_["seconds"],
            )
            run.done.append(done)
            submit(key, actor)
            if on_shard is not None:
                on_shard(done)
    except KeyboardInterrupt as exc:
        run.interrupted = True
        run.seconds = time.perf_counter() - started
        for group in actors.values():
            for actor in group:
                ray.kill(actor, no_restart=True)
        raise SweepInterrupted(run) from exc
    finally:
        if own_ray:
            ray.shutdown()
    run.seconds = time.perf_counter() - started
    return run


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


def job_status(folder: Path) -> JobStatus:
    info = json.loads((folder / JOB_FILE).read_text())
    done = failed = samples = found = exact = 0
    for i in range(info["shards"]):
        path = shard_path(folder, i)
        if path.exists():
            done += 1
            t = pq.read_table(path, columns=["found", "exact"])
            samples += len(t)
            f, e = found_exact(t)
            found, exact = found + f, exact + e
        elif error_path(folder, i).exists():
            failed += 1
    return JobStatus(
        info["sweep"], info["job"], info["shards"], done, failed, samples, found, exact
    )


def sweep_status(out: str | Path) -> list[JobStatus]:
    """Every job under `out` (a results folder or one sweep's folder)."""
    out = Path(out)
    if not out.is_dir():
        raise FileNotFoundError(f"no such results folder: {out}")
    return [job_status(p.parent) for p in sorted(out.rglob(JOB_FILE))]
