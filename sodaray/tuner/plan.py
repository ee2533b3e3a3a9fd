"""`sodaray tune --dry-run`'s estimate: what a study will cost before it runs, priced as
`sweep plan` prices a job (`experiment.estimate`). Samples x budget x trials bounds the
sample-steps from above (found samples stop early, pruned trials end at a checkpoint); the
trials' samples are split evenly over the `workers` replicas (at most one a trial)."""

from __future__ import annotations

from typing import Any

from sodaray.costs.devices import H100, DeviceCosts
from sodaray.costs.flops import model_shape
from sodaray.experiment.data import dataset_lengths
from sodaray.experiment.estimate import Totals, Workload, describe_tables, price
from sodaray.tuner.spec import TuningSpec


def study_workload(spec: TuningSpec, trials: int, workers: int) -> Workload:
    """The study as one workload: every trial's validation samples, at the file's own settings
    (the space's sampled values aside), on at most one replica a trial."""
    counts = dataset_lengths(spec.data)
    return Workload(
        name=spec.name,
        model=spec.model,
        search=spec.config({}),
        objective=spec.objective_for({}),
        samples_by_length={n: trials * k for n, k in sorted(counts.items())},
        lengths_per_sample=1,  # a trial searches each sample at its own length
        max_length=max(counts, default=1),
        replicas=max(1, min(workers, trials)),
        shape=model_shape(spec.model.location),
    )


def plan_study(
    spec: TuningSpec,
    *,
    trials: int,
    workers: int,
    rate: float | None,
    calibrate: bool,
    costs: DeviceCosts = H100,
) -> dict[str, Any]:
    """The study's cost as plain data: samples, the most sample-steps per trial and in all,
    FLOPs (None where the model's shape is unknown offline), and its time (by `rate`, `costs`,
    or with `calibrate` a rate measured here) on `workers` replicas."""
    load = spec.model.load_here if calibrate else None
    work, time = price(study_workload(spec, trials, workers), costs, rate, load)
    total = Totals()
    total.add(work, time)
    return {
        "samples_by_length": {str(n): k // trials for n, k in work.samples_by_length.items()},
        "samples": work.samples // trials,
        "max_steps": work.max_steps,
        "trials": trials,
        "sample_steps_per_trial": work.sample_steps // trials,
        "sample_steps": work.sample_steps,
        "flops": work.flops,
        "kind": work.kind,
        "workers": workers,
        "replicas": work.replicas,
        "costs": describe_tables(costs),
        **time.fields(),
        "calibrated": time.priced_by == "calibration",
        "gpu_hours": total.gpu_hours,
        "cpu_hours": total.cpu_hours,
        "bound": "upper: found samples stop early and pruned trials end at a checkpoint",
    }
