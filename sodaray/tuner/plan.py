"""`sodaray tune --dry-run`'s estimate: what a study will cost before it runs, priced as
`sweep plan` prices a job (`experiment.estimate`). Samples x budget x trials bounds the
sample-steps from above (found samples stop early, pruned trials end at a checkpoint); the
trials' samples are split evenly over the `workers` replicas (at most one a trial)."""

from __future__ import annotations

from typing import Any

from sodaray.costs.devices import H100, DeviceCosts
from sodaray.costs.flops import model_shape, shape_from_config
from sodaray.experiment.data import dataset_lengths
from sodaray.experiment.estimate import Totals, Workload, describe_tables, price, tables
from sodaray.experiment.estimate import calibrate as calibrate_rate
from sodaray.tuner.spec import TuningSpec


def study_workload(spec: TuningSpec, trials: int, workers: int) -> Workload:
    """The study as one workload: every trial's validation samples, at the file's own settings
    (the space's sampled values aside), on at most one replica a trial."""
    counts = dataset_lengths(spec.data)
    samples = {n: trials * k for n, k in sorted(counts.items())}
    how = (spec.config({}), spec.objective_for({}), samples)
    # A trial searches each sample at its own length: one length per sample.
    sizes = (1, max(counts, default=1), max(1, min(workers, trials)))
    return Workload(spec.name, spec.model, *how, *sizes, model_shape(spec.model.location))


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
    work = study_workload(spec, trials, workers)
    model = None
    unpriced = tables(costs)[work.kind] is None  # a CPU model without a CPU costs file
    if calibrate and (work.shape is None or (rate is None and unpriced)):
        model = spec.model.load_here()
        if work.shape is None:
            work = work.with_shape(shape_from_config(model.model.config))
    time = price(work, costs, rate, None if model is None else lambda: calibrate_rate(work, model))
    total = Totals()
    total.add(work, time)
    per_trial = {str(n): k // trials for n, k in work.samples_by_length.items()}
    out: dict[str, Any] = dict(samples_by_length=per_trial, samples=work.samples // trials)
    out |= dict(max_steps=work.max_steps, trials=trials)
    out |= dict(sample_steps_per_trial=work.sample_steps // trials, sample_steps=work.sample_steps)
    out |= dict(flops=work.flops, kind=work.kind, workers=workers, replicas=work.replicas)
    out |= {"costs": describe_tables(costs), **time.fields()}
    out |= dict(calibrated=time.priced_by == "calibration", gpu_hours=total.gpu_hours)
    bound = "upper: found samples stop early and pruned trials end at a checkpoint"
    return out | dict(cpu_hours=total.cpu_hours, bound=bound)
