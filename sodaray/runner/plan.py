"""`sodaray sweep plan`: what a sweep will cost, before anything runs; and, after a run, how
its plan compares with the wall it took.

Per job: its samples (by length), the most sample-steps it can take (every sample running its
full budget at every length it may try), their FLOPs from the model's shape (`sodaray.cost`),
and its time. A job asking a GPU is priced by measured device costs (`sodaray.device_costs`:
the H100's by default, or a costs file): its samples split evenly over the replicas it uses,
in waves of its batch size taken in length order (the order sweeps submit), each step a floor
per pass plus the samples' FLOPs at the device's rate. A CPU job is priced by a rate in
sample-steps per second per replica, given by the user or measured by a short calibration
here (or by a CPU costs file). Searches stop a sample once it is found, so every estimate is an
upper bound; `check_run` also prices the steps a run actually took.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sodaray.cost import (
    ModelShape,
    format_duration,
    measure_rate,
    model_shape,
    shape_from_config,
)
from sodaray.device_costs import H100, DeviceCosts, StepCost, step_cost
from sodaray.errors import first_line
from sodaray.runner.spec import Job

log = logging.getLogger(__name__)

CALIBRATION_STEPS = 50  # enough steps to amortise the first (warm-up) step's cost


@dataclass(frozen=True)
class JobCost:
    job: str
    model: str
    algorithm: str
    num_gpus: float
    samples_by_length: dict[int, int]
    max_steps: int
    lengths_per_sample: int  # `length: auto` may try every length up to max_length
    batch_size: int
    flops: float | None  # at most, from the model's shape (None: shape unknown offline)
    replicas: int = 1  # those its shards can keep busy
    shape: ModelShape | None = None

    @property
    def samples(self) -> int:
        return sum(self.samples_by_length.values())

    @property
    def sample_steps(self) -> int:
        return self.samples * self.max_steps * self.lengths_per_sample


@dataclass(frozen=True)
class DeviceTime:
    """A job's time on its device(s), summed over its replicas, every sample running its full
    budget: the passes' floors, the samples' work, and the batch-steps they take."""

    floor_seconds: float
    work_seconds: float
    batch_steps: float
    passes: float

    @property
    def seconds(self) -> float:
        return self.floor_seconds + self.work_seconds


def dataset_lengths(job: Job) -> dict[int, int]:
    """Samples per length in the job's dataset before caps: from the build spec (the most it
    builds; hub and local sources may yield fewer), or counted in the dataset file."""
    from sodaray.data import parse_lengths

    if job.dataset.build is not None:
        build = job.dataset.build
        per_length = int(build.get("per_length", 1))
        return {n: per_length for n in parse_lengths(str(build.get("lengths", "1-10")))}
    from sodaray.data import read_dataset
    from sodaray.paths import expand_path

    assert job.dataset.path is not None
    counts: dict[int, int] = {}
    for n in (
        read_dataset(expand_path(job.dataset.path)).column("length").to_pylist()
    ):  # checked, as `run`
        counts[int(n)] = counts.get(int(n), 0) + 1
    return counts


def select_counts(
    available: dict[int, int], samples_per_length: int | None, limit: int | None
) -> dict[int, int]:
    """Per-length counts the runner selects: `samples_per_length` of each length, then at most
    `limit` in all, taken evenly across lengths (as `execute.select_rows` does)."""
    counts = {
        n: k if samples_per_length is None else min(k, samples_per_length)
        for n, k in sorted(available.items())
    }
    if limit is None or limit >= sum(counts.values()):
        return counts
    chosen = dict.fromkeys(counts, 0)
    rank = 0
    while limit > 0:
        for n in counts:  # one of each length per round, shortest first
            if limit > 0 and chosen[n] < counts[n] and rank < counts[n]:
                chosen[n] += 1
                limit -= 1
        rank += 1
    return chosen


def job_precision(job: Job) -> str:
    """The arithmetic a job's steps run in: its model's dtype, or its search's `precision`."""
    if job.model.dtype != "float32":
        return job.model.dtype
    return str(getattr(job.search, "precision", "float32"))


def sample_flops(job: Job, shape: ModelShape, length: int) -> float:
    """One sample-step of `job` at input length `length`: SODA's (and the embedding search's)
    gradient step; GCG adds a forward pass per candidate. The learned inverter's single step
    is counted as one of SODA's (its own model is small beside the target's)."""
    outputs, bos = job.objective.output_tokens, job.model.bos is not False  # unknown: one BOS
    candidates = int(getattr(job.search, "num_candidates", 0))
    return shape.step_flops(length, outputs, bos) + candidates * shape.forward_flops(
        length, outputs, bos
    )


def job_cost(job: Job, shape: ModelShape | None = None) -> JobCost:
    """`job`'s cost; `shape` (the loaded model's, for a GGUF file) where its id tells none."""
    counts = select_counts(dataset_lengths(job), job.samples_per_length, job.limit)
    steps, tries = job.search.step_budget(), job.max_length if job.length == "auto" else 1
    shape = model_shape(job.model.location) or shape
    flops = None
    if shape is not None:  # `length: auto` tries up to max_length: counted at the longest
        flops = sum(
            k * steps * tries * sample_flops(job, shape, job.max_length if tries > 1 else n)
            for n, k in counts.items()
        )
    samples = sum(counts.values())
    return JobCost(
        job=job.name,
        model=job.model.label,
        algorithm=job.algorithm,
        num_gpus=job.model.num_gpus,
        samples_by_length=counts,
        max_steps=steps,
        lengths_per_sample=tries,
        batch_size=job.search.max_batch_size or max(counts.values(), default=1),
        flops=flops,
        replicas=max(1, min(job.model.replicas, math.ceil(samples / job.shard_size))),
        shape=shape,
    )


def waves(shares: dict[int, float], size: int) -> list[tuple[dict[int, float], int]]:
    """`shares` samples per length taken in length order, `size` at a time: each distinct
    wave's samples per length (fractions: a replica's share of a length) and how many times it
    repeats; full waves of one length come as one entry, so a wave count of millions costs
    nothing to price."""
    out: list[tuple[dict[int, float], int]] = []
    wave: dict[int, float] = {}
    room = float(size)
    for n, k in sorted(shares.items()):
        take = min(k, room)
        if take > 1e-9:
            wave[n] = take
            k, room = k - take, room - take
        if room <= 1e-9:
            out.append((wave, 1))
            wave, room = {}, float(size)
            full = int(k // size)
            if full:
                out.append(({n: float(size)}, full))
                k -= full * size
            if k > 1e-9:
                wave, room = {n: k}, size - k
    if wave:
        out.append((wave, 1))
    return out


def device_time(job: Job, cost: JobCost, costs: DeviceCosts) -> DeviceTime:
    """`job` on `costs`'s device, every sample running its full budget: its samples split
    evenly over its replicas, each replica's in waves of its batch, a wave's steps priced by
    `step_cost`; summed over the replicas."""
    shape = cost.shape
    assert shape is not None
    shares: dict[int, float] = {}
    for n, k in cost.samples_by_length.items():  # `length: auto`: every try at the longest
        at = job.max_length if cost.lengths_per_sample > 1 else n
        shares[at] = shares.get(at, 0.0) + k / cost.replicas
    steps = cost.max_steps * cost.lengths_per_sample
    gcg = int(getattr(job.search, "num_candidates", 0)) > 0  # a gradient pass, then candidates
    precision = job_precision(job)
    floor = work = batch = passes = 0.0
    for wave, repeats in waves(shares, cost.batch_size):
        step: StepCost = step_cost(
            costs,
            precision,
            shape.layers,
            wave,
            lambda n: sample_flops(job, shape, n),
            mix=job.model.mix_lengths,
            passes_per_group=2 if gcg else 1,
        )
        floor += repeats * steps * step.floor_seconds
        work += repeats * steps * step.work_seconds
        batch += repeats * steps
        passes += repeats * steps * step.passes
    r = cost.replicas
    return DeviceTime(floor * r, work * r, batch * r, passes * r)


def load_for_plan(job: Job) -> Any:
    """`job`'s model, loaded here for its calibration and (a GGUF file) its shape."""
    from sodaray.models import load_model

    m = job.model
    return load_model(
        m.location,
        gguf_file=m.gguf_file,
        dtype=m.dtype,
        bos=m.bos,
        trust_remote_code=m.trust_remote_code,
    )


def calibrate(job: Job, cost: JobCost, model: Any, steps: int = CALIBRATION_STEPS) -> float:
    """Sample-steps per second for `job` on this machine (`sodaray.cost.measure_rate`) at its
    middle length, batched as the job batches, on `model` (`load_for_plan`)."""
    m = job.model
    lengths = sorted(cost.samples_by_length)
    batch = max(1, min(cost.batch_size, max(cost.samples_by_length.values())))
    threads = max(1, int(m.num_cpus)) if m.num_gpus == 0 else None
    rate = measure_rate(
        model,
        job.search,
        job.objective,
        lengths[len(lengths) // 2],
        batch,
        steps=steps,
        threads=threads,
    )
    log.info("calibration %s: %.1f sample-steps/s", job.name, rate)
    return rate


def calibration_key(job: Job, cost: JobCost) -> str:
    """Jobs that cost the same per sample-step share one calibration."""
    obj = job.objective
    return json.dumps(
        [
            job.model.identity(),
            job.algorithm,
            obj.kind,
            obj.output_tokens,
            bool(obj.fluency_weight),
            cost.batch_size,
            sorted(cost.samples_by_length),
        ],
        default=str,
    )


def plan_sweep(
    jobs: list[Job],
    *,
    rate: float | None,
    measure: bool,
    costs: DeviceCosts = H100,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """Every job's cost and time, and their totals, as plain data (`sweep plan --json`).
    A job is priced by `rate` (sample-steps per second per replica) when given; else a GPU
    job by `costs` (H100's when `costs` is a CPU table), a CPU job by `costs` when it is a CPU
    table, else by a calibration here (`measure`)."""
    gpu_costs = costs if costs.kind == "gpu" else H100
    cpu_costs = costs if costs.kind == "cpu" else None
    rates: dict[str, float | None] = {}
    loaded: dict[str, Any] = {}  # model identity -> the model (None: not loadable here)
    total: dict[str, Any] = {
        "samples": 0,
        "sample_steps": 0,
        "gpu_hours": 0.0,
        "cpu_hours": 0.0,
        "wall_seconds": 0.0,
        "unshaped": 0,
        "unpriced": 0,
    }
    rows = []
    for job in jobs:
        identity = json.dumps(job.model.identity(), sort_keys=True, default=str)
        cost = job_cost(job)
        gpu = job.model.num_gpus > 0
        table = gpu_costs if gpu else cpu_costs
        wants_model = cost.shape is None or (rate is None and table is None)
        if measure and wants_model and identity not in loaded:
            try:  # once per model, however many jobs run it (a GGUF file loads for minutes)
                loaded[identity] = load_for_plan(job)
            except Exception as exc:  # a model not loadable here: say why, go on
                say(f"  no calibration for {job.model.label}: {first_line(exc)}")
                loaded[identity] = None
        model = loaded.get(identity)
        if cost.shape is None and model is not None:
            cost = job_cost(job, shape_from_config(model.model.config))
        time: DeviceTime | None = None
        here: float | None = rate
        priced_by = "--rate" if rate is not None else "-"
        if rate is None and table is not None and cost.shape is not None:
            time = device_time(job, cost, table)
            priced_by = table.device
            here = cost.sample_steps / time.seconds if time.seconds > 0 else None
        elif rate is None and not gpu:
            key = calibration_key(job, cost)
            if key not in rates:
                rates[key] = None
                if model is not None:
                    try:
                        rates[key] = calibrate(job, cost, model)
                    except Exception as exc:  # e.g. the batch does not fit here: say why, go on
                        say(f"  no calibration for {job.name}: {first_line(exc)}")
            here = rates[key]
            priced_by = "calibration" if here is not None else "-"
        seconds = time.seconds if time is not None else None
        if seconds is None and here:
            seconds = cost.sample_steps / here
        wall = None if seconds is None else seconds / cost.replicas
        if seconds is not None and wall is not None:
            total["gpu_hours" if gpu else "cpu_hours"] += seconds / 3600
            total["wall_seconds"] += wall
        total["samples"] += cost.samples
        total["sample_steps"] += cost.sample_steps
        total["unshaped"] += cost.flops is None
        total["unpriced"] += seconds is None
        rows.append(
            {
                "job": cost.job,
                "model": cost.model,
                "kind": "gpu" if gpu else "cpu",
                "samples": cost.samples,
                "max_steps": cost.max_steps,
                "sample_steps": cost.sample_steps,
                "flops": cost.flops,
                "replicas": cost.replicas,
                "priced_by": priced_by,
                "rate": here,
                "device_seconds": seconds,
                "wall_seconds": wall,
                "floor_seconds": None if time is None else time.floor_seconds,
                "work_seconds": None if time is None else time.work_seconds,
                "batch_steps": None if time is None else time.batch_steps,
                "passes": None if time is None else time.passes,
                "estimate": "-" if wall is None else format_duration(wall),
            }
        )
    described = {"gpu": _describe(gpu_costs)}
    if cpu_costs is not None:
        described["cpu"] = _describe(cpu_costs)
    return {"costs": described, "jobs": rows, "total": total}


def _describe(costs: DeviceCosts) -> dict[str, Any]:
    return {
        "device": costs.device,
        "source": costs.source,
        "precisions": {
            name: {
                "pass_seconds": c.pass_seconds,
                "layer_seconds": c.layer_seconds,
                "flops_per_second": c.flops_per_second,
            }
            for name, c in costs.precisions.items()
        },
    }


def check_run(plan: dict[str, Any], run: Any) -> dict[str, Any]:
    """A run (`SweepRun`) against its plan: the plan's wall for the samples the run ran (the
    jobs' pending shards; every sample its full budget), the same costs applied to the steps
    the run took (its batch-steps and sample-steps), and the measured walls: the whole run,
    and its search alone (from the first shard starting on a replica to the last result)."""
    rows = {r["job"]: r for r in plan["jobs"]}
    models: dict[str, dict[str, float]] = {}
    planned, unpriced, priced_by = 0.0, [], set()
    for job, samples in run.job_samples.items():
        row = rows.get(job)
        if row is None or row["device_seconds"] is None or not row["samples"] or not samples:
            unpriced.append(job)
            continue
        share = samples / row["samples"]
        priced_by.add(row["priced_by"])
        planned += row["wall_seconds"] * share
        done = [d for d in run.done if d.job == job]
        sample_steps = sum(d.sample_steps for d in done)
        m = models.setdefault(
            row["model"], {"floor": 0.0, "batch": 0.0, "work": 0.0, "ran": 0.0, "replicas": 1}
        )
        m["replicas"] = max(m["replicas"], row["replicas"])
        m["ran"] += sum(d.batch_steps for d in done)
        if row["batch_steps"]:  # priced by device costs: floors per batch-step, work per sample
            m["floor"] += row["floor_seconds"] * share
            m["batch"] += row["batch_steps"] * share
            m["work"] += sample_steps * row["work_seconds"] / row["sample_steps"]
        else:  # priced by a rate
            m["work"] += sample_steps / row["rate"]
    as_run = sum(
        (((m["ran"] * m["floor"] / m["batch"]) if m["batch"] else 0.0) + m["work"]) / m["replicas"]
        for m in models.values()
    )
    searching = run.searching_seconds

    def ratio(a: float | None, b: float) -> float | None:
        return a / b if a is not None and b > 0 else None

    return {
        "priced_by": sorted(priced_by),
        "planned_seconds": planned,
        "as_run_seconds": as_run,
        "wall_seconds": run.seconds,
        "searching_seconds": searching,
        "wall_over_planned": ratio(run.seconds, planned),
        "searching_over_planned": ratio(searching, planned),
        "searching_over_as_run": ratio(searching, as_run),
        "unpriced_jobs": unpriced,
    }
