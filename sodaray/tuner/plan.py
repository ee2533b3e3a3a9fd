"""`sodaray tune --dry-run`'s estimate: what a study will cost before it runs, by the cost model
`sweep plan` uses (`sodaray.cost`): every trial runs each validation sample for the whole step
budget at most, so samples x budget x trials is an upper bound on the sample-steps (found samples
stop early, pruned trials end at a checkpoint). FLOPs come from the model's shape and give
device-hours at a stated device and efficiency; a rate in sample-steps per second (given, or
measured by a short calibration here) gives the time on `workers` replicas.
"""

from __future__ import annotations

import logging
from typing import Any

from sodaray.cost import (
    device_seconds,
    format_duration,
    measure_rate,
    model_shape,
    search_flops,
    shape_from_config,
)
from sodaray.experiment.data import dataset_lengths
from sodaray.tuner.spec import TuningSpec

log = logging.getLogger(__name__)

CALIBRATION_STEPS = 50  # as `sweep plan`: enough steps to amortise the warm-up step's cost


def plan_study(
    spec: TuningSpec,
    *,
    trials: int,
    workers: int,
    rate: float | None,
    calibrate: bool,
    device: str,
    efficiency: float,
) -> dict[str, Any]:
    """The study's cost as plain data: samples, the most sample-steps per trial and in all,
    FLOPs and device-hours (None where the model's shape is unknown offline: a GGUF file
    without `calibrate`), and the time at `rate` (or the calibrated one) on `workers`."""
    counts = dataset_lengths(spec.data)
    search, objective = spec.config({}), spec.objective_for({})
    steps = search.step_budget()
    samples = sum(counts.values())
    per_trial = samples * steps
    shape = model_shape(spec.model.location)
    model = None
    if calibrate and rate is None:
        model = spec.model.load_here()
        shape = shape or shape_from_config(model.model.config)
        lengths = sorted(counts)
        batch = max(1, min(search.max_batch_size or samples, max(counts.values())))
        threads = max(1, int(spec.model.num_cpus)) if spec.model.num_gpus == 0 else None
        rate = measure_rate(
            model,
            search,
            objective,
            lengths[len(lengths) // 2],
            batch,
            steps=CALIBRATION_STEPS,
            threads=threads,
        )
        log.info("calibration %s: %.1f sample-steps/s", spec.name, rate)
    bos = spec.model.bos is not False  # unknown: count one token, the common case
    flops = None
    if shape is not None:
        flops = trials * search_flops(shape, counts, steps, objective.output_tokens, bos)
    hours = None
    if flops is not None:
        hours = device_seconds(flops, device, spec.model.dtype, efficiency) / 3600
    seconds = None if rate is None else trials * per_trial / (rate * workers)
    return {
        "samples_by_length": {str(n): k for n, k in sorted(counts.items())},
        "samples": samples,
        "max_steps": steps,
        "trials": trials,
        "sample_steps_per_trial": per_trial,
        "sample_steps": trials * per_trial,
        "flops": flops,
        "device": device,
        "efficiency": efficiency,
        "device_hours": hours,
        "rate": rate,
        "calibrated": model is not None,
        "workers": workers,
        "seconds": seconds,
        "time": None if seconds is None else format_duration(seconds),
        "bound": "upper: found samples stop early and pruned trials end at a checkpoint",
    }

