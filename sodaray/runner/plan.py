"""`sodaray sweep plan`: what a sweep will cost, before anything runs.

Per job: its samples (by length), the most sample-steps it can take (every sample running its
full budget at every length it may try), and a time estimate from a rate in sample-steps per
second, given by the user or measured by a short calibration on the local device. Searches
stop a sample once it is found, so the estimate is an upper bound.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

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

    @property
    def samples(self) -> int:
        return sum(self.samples_by_length.values())

    @property
    def sample_steps(self) -> int:
        return self.samples * self.max_steps * self.lengths_per_sample


def dataset_lengths(job: Job) -> dict[int, int]:
    """Samples per length in the job's dataset before caps: from the build spec (the most it
    builds; hub and local sources may yield fewer), or counted in the dataset file."""
    from sodaray.data import parse_lengths

    if job.dataset.build is not None:
        build = job.dataset.build
        per_length = int(build.get("per_length", 1))
        return {n: per_length for n in parse_lengths(str(build.get("lengths", "1-10")))}
    import pyarrow.parquet as pq

    assert job.dataset.path is not None
    counts: dict[int, int] = {}
    for n in pq.read_table(job.dataset.path, columns=["length"]).column("length").to_pylist():
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


def job_cost(job: Job) -> JobCost:
    counts = select_counts(dataset_lengths(job), job.samples_per_length, job.limit)
    return JobCost(
        job=job.name,
        model=job.model.label,
        algorithm=job.algorithm,
        num_gpus=job.model.num_gpus,
        samples_by_length=counts,
        max_steps=job.search.step_budget(),
        lengths_per_sample=job.max_length if job.length == "auto" else 1,
        batch_size=job.search.max_batch_size or max(counts.values(), default=1),
    )


def calibrate(job: Job, cost: JobCost, steps: int = CALIBRATION_STEPS) -> float:
    """Sample-steps per second for `job` on this machine: a short search of random inputs at
    the job's middle length, batched as the job batches (its batch size or its samples per
    length, whichever is smaller). Loads the model, so hub models need the hub or a cache."""
    from dataclasses import replace

    import torch

    from sodaray.api import invert
    from sodaray.models import load_model
    from sodaray.targets import make_targets

    model = load_model(
        job.model.id,
        gguf_file=job.model.gguf_file,
        dtype=job.model.dtype,
        bos=job.model.bos,
        trust_remote_code=job.model.trust_remote_code,
    )
    lengths = sorted(cost.samples_by_length)
    length = lengths[len(lengths) // 2]
    batch = max(1, min(cost.batch_size, max(cost.samples_by_length.values())))
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model.vocab_size, (batch, length), generator=generator).tolist()
    targets = make_targets(model, tokens, objective=job.objective)
    threads = torch.get_num_threads()
    if job.model.num_gpus == 0:
        # Ray gives a CPU actor num_cpus threads (OMP_NUM_THREADS); measuring with all cores
        # instead overstates one actor on an idle machine and collapses on a busy one.
        torch.set_num_threads(max(1, int(job.model.num_cpus)))
    try:
        invert(model, targets, replace(job.search, max_steps=2))  # warm-up: first-call costs
        start = time.perf_counter()
        results = invert(model, targets, replace(job.search, max_steps=steps))
        seconds = time.perf_counter() - start
    finally:
        torch.set_num_threads(threads)
    done = sum(r.steps for r in results)
    log.info("calibration %s: %d sample-steps in %.2fs", job.name, done, seconds)
    return done / seconds if seconds > 0 else float("inf")


def format_duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    hours = seconds / 3600
    return f"{hours:,.1f} h" if hours >= 1 else f"{seconds / 60:,.1f} min"
