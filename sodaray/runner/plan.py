"""`sodaray sweep plan`: what a sweep will cost, before anything runs.

Per job: its samples (by length), the most sample-steps it can take (every sample running its
full budget at every length it may try), their FLOPs from the model's shape (`sodaray.cost`),
and time estimates: device-hours at a stated device and efficiency, and the time at a rate in
sample-steps per second, given by the user or measured by a short calibration on the local
device. Searches stop a sample once it is found, so every estimate is an upper bound.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from sodaray.cost import (
    ModelShape,
    device_seconds,
    format_duration,
    lengths_tried,
    measure_rate,
    model_shape,
    search_flops,
    shape_from_config,
)
from sodaray.errors import first_line
from sodaray.experiment.data import dataset_lengths
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

    @property
    def samples(self) -> int:
        return sum(self.samples_by_length.values())

    @property
    def sample_steps(self) -> int:
        return self.samples * self.max_steps * self.lengths_per_sample


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


def job_cost(job: Job, shape: ModelShape | None = None) -> JobCost:
    """`job`'s cost; `shape` (the loaded model's, for a GGUF file) where its id tells none."""
    counts = select_counts(dataset_lengths(job.dataset), job.samples_per_length, job.limit)
    steps, tries = job.search.step_budget(), lengths_tried(job.length, job.max_length)
    shape = model_shape(job.model.location) or shape
    outputs = job.objective.output_tokens
    bos = job.model.bos is not False  # unknown: count one token, the common case
    flops = None
    if shape is not None:  # `length: auto` tries up to max_length: counted at the longest
        at = {job.max_length: sum(counts.values())} if tries > 1 else counts
        flops = search_flops(shape, at, steps * tries, outputs, bos)
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
    )


def load_for_plan(job: Job) -> Any:
    """`job`'s model, loaded here for its calibration and (a GGUF file) its shape."""
    return job.model.load_here()


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
    jobs: list[Job], *, rate: float | None, measure: bool, device: str, efficiency: float, say
) -> dict[str, Any]:
    """Every job's cost and estimates, and their totals, as plain data (`sweep plan --json`)."""
    rates: dict[str, float | None] = {}
    loaded: dict[str, Any] = {}  # model identity -> the model (None: not loadable here)
    keys = ("samples", "sample_steps", "device_hours", "gpu_hours", "cpu_hours")
    total: dict[str, Any] = dict.fromkeys((*keys, "unshaped", "unrated"), 0)
    rows = []
    for job in jobs:
        identity = json.dumps(job.model.identity(), sort_keys=True, default=str)
        cost = job_cost(job)
        if measure and rate is None and identity not in loaded:
            try:  # once per model, however many jobs run it (a GGUF file loads for minutes)
                loaded[identity] = load_for_plan(job)
            except Exception as exc:  # a model not loadable here: say why, go on
                say(f"  no calibration for {job.model.label}: {first_line(exc)}")
                loaded[identity] = None
        model = loaded.get(identity)
        if cost.flops is None and model is not None:
            cost = job_cost(job, shape_from_config(model.model.config))
        key = calibration_key(job, cost)
        if key not in rates:
            rates[key] = rate
            if model is not None:
                try:
                    rates[key] = calibrate(job, cost, model)
                except Exception as exc:  # e.g. the batch does not fit here: say why, go on
                    say(f"  no calibration for {job.name}: {first_line(exc)}")
        here, hours = rates[key], None
        if cost.flops is not None:
            hours = device_seconds(cost.flops, device, job.model.dtype, efficiency) / 3600
            total["device_hours"] += hours
        seconds = None if here is None else cost.sample_steps / here
        if seconds is not None:
            total["gpu_hours" if cost.num_gpus > 0 else "cpu_hours"] += seconds / 3600
        total["samples"] += cost.samples
        total["sample_steps"] += cost.sample_steps
        total["unshaped"] += cost.flops is None
        total["unrated"] += here is None
        rows.append(
            {
                "job": cost.job,
                "model": cost.model,
                "samples": cost.samples,
                "max_steps": cost.max_steps,
                "sample_steps": cost.sample_steps,
                "flops": cost.flops,
                "device_hours": hours,
                "rate": here,
                "estimate": "-" if seconds is None else format_duration(seconds),
            }
        )
    return {"device": device, "efficiency": efficiency, "jobs": rows, "total": total}
