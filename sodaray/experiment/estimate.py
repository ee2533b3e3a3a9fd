"""What a plan prices, for sweeps (`sweep plan`, `runner.plan`) and studies (`tune --dry-run`,
`tuner.plan`) alike: one model's workload, every sample running its whole budget, and its time.

A workload is samples per input length, each running its step budget at each length it may try
(`length: auto`: priced at the longest), split evenly over the replicas it can keep busy. Its
time, by one rule (`price`): at a given rate (`--rate`, sample-steps per second per replica);
else a GPU workload by measured device costs (`sodaray.costs.devices`: the H100's by default);
else a CPU workload by a costs file of kind cpu, or a rate measured by a short calibration
(`calibrate`), or not at all. Searches stop a sample once found, so every time is an upper bound.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import astuple, dataclass
from time import perf_counter
from typing import Any

from sodaray.costs.devices import H100, DeviceCosts, DeviceTime, describe_costs, step_cost, waves
from sodaray.costs.flops import ModelShape, format_duration, shape_from_config
from sodaray.experiment.spec import ModelSpec
from sodaray.objective.objectives import Objective
from sodaray.search.engine.base import SearchConfig

log = logging.getLogger(__name__)

CALIBRATION_STEPS = 50  # enough steps to amortise the first (warm-up) step's cost


@dataclass(frozen=True)
class Workload:
    """What one model's replicas run at most for a sweep's job or a study."""

    name: str  # the job's or the study's
    model: ModelSpec
    search: SearchConfig
    objective: Objective
    samples_by_length: dict[int, int]  # over every unit (a study: every trial's)
    lengths_per_sample: int  # `length: auto` may try every length up to max_length
    max_length: int
    replicas: int  # those its units can keep busy
    shape: ModelShape | None  # None: unknown offline (a GGUF file not loaded)

    @property
    def max_steps(self) -> int:
        return self.search.step_budget()

    @property
    def samples(self) -> int:
        return sum(self.samples_by_length.values())

    @property
    def sample_steps(self) -> int:
        return self.samples * self.max_steps * self.lengths_per_sample

    @property
    def batch_size(self) -> int:
        return self.search.max_batch_size or max(self.samples_by_length.values(), default=1)

    @property
    def kind(self) -> str:
        """Which costs price it (`device_costs.KINDS`): a replica asking a GPU, or none."""
        return "gpu" if self.model.num_gpus > 0 else "cpu"

    @property
    def candidates(self) -> int:
        """Forward passes a sample-step adds beyond the gradient step (GCG's candidates)."""
        return int(getattr(self.search, "num_candidates", 0))

    def priced_length(self, n: int) -> int:
        """The length a sample of length `n` is priced at: `length: auto`'s tries at the longest."""
        return self.max_length if self.lengths_per_sample > 1 else n

    def sample_flops(self, length: int) -> float:
        """One sample-step at input length `length`: SODA's gradient step (the embedding
        search's and the inverter's alike); GCG adds a forward pass per candidate."""
        assert self.shape is not None
        bos = self.model.bos is not False  # unknown: count one token, the common case
        outputs = self.objective.output_tokens
        step = self.shape.step_flops(length, outputs, bos)
        return step + self.candidates * self.shape.forward_flops(length, outputs, bos)

    @property
    def flops(self) -> float | None:
        """FLOPs at most, from the model's shape (None: shape unknown)."""
        if self.shape is None:
            return None
        steps = self.max_steps * self.lengths_per_sample
        return sum(
            k * steps * self.sample_flops(self.priced_length(n))
            for n, k in self.samples_by_length.items()
        )

    def device_time(self, costs: DeviceCosts) -> DeviceTime:
        """Its time on `costs`'s device, summed over its replicas: each replica's share of the
        samples per length runs every step in waves of `batch_size` (`devices.waves`), each
        step priced by `devices.step_cost`."""
        assert self.shape is not None
        dtype = self.model.dtype  # the arithmetic its steps run in, else its search's precision
        precision = dtype if dtype != "float32" else getattr(self.search, "precision", "float32")
        shares: dict[int, float] = {}
        for n, k in self.samples_by_length.items():
            at = self.priced_length(n)
            shares[at] = shares.get(at, 0.0) + k / self.replicas
        steps = self.max_steps * self.lengths_per_sample
        passes = 2 if self.candidates else 1  # a gradient pass, then candidates
        layers, mix = self.shape.layers, self.model.mix_lengths
        total = [0.0] * 4
        for wave, repeats in waves(shares, self.batch_size):
            step = step_cost(costs, str(precision), layers, wave, self.sample_flops, mix, passes)
            total = [t + repeats * steps * v for t, v in zip(total, astuple(step), strict=True)]
        return DeviceTime(*(t * self.replicas for t in total))

    def with_shape(self, shape: ModelShape) -> Workload:
        return dataclasses.replace(self, shape=shape)


def calibrate(work: Workload, model: Any, steps: int = CALIBRATION_STEPS) -> float:
    """Sample-steps per second for `work` on this machine: random inputs at its middle length,
    batched as it batches, on `model` (its `ModelSpec.load_here`), with a CPU replica's threads
    (Ray's num_cpus), after a 2-step warm-up."""
    import torch

    from sodaray.api import invert
    from sodaray.objective.targets import make_targets

    middle = sorted(work.samples_by_length)[len(work.samples_by_length) // 2]
    batch = max(1, min(work.batch_size, max(work.samples_by_length.values())))
    threads = max(1, int(work.model.num_cpus)) if work.model.num_gpus == 0 else None
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model.vocab_size, (batch, middle), generator=generator).tolist()
    targets = make_targets(model, tokens, objective=work.objective)
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        invert(model, targets, dataclasses.replace(work.search, max_steps=2))
        start = perf_counter()
        results = invert(model, targets, dataclasses.replace(work.search, max_steps=steps))
        seconds = perf_counter() - start
    finally:
        torch.set_num_threads(before)
    rate = sum(r.steps for r in results) / seconds if seconds > 0 else float("inf")
    log.info("calibration %s: %.1f sample-steps/s", work.name, rate)
    return rate


def tables(costs: DeviceCosts) -> dict[str, DeviceCosts | None]:
    """The costs that price each kind of workload, given one `--costs`: a GPU table prices GPU
    workloads (CPU ones need a rate); a CPU table prices CPU workloads, and the H100's GPU ones."""
    return {
        "gpu": costs if costs.kind == "gpu" else H100,
        "cpu": costs if costs.kind == "cpu" else None,
    }


def describe_tables(costs: DeviceCosts) -> dict[str, Any]:
    """The tables a plan priced by, as its JSON shows them (`costs`)."""
    return {kind: describe_costs(t) for kind, t in tables(costs).items() if t is not None}


@dataclass(frozen=True)
class Price:
    """A workload's time: `device_seconds` summed over its replicas, `wall_seconds` with them
    running side by side (None: not priced), and what priced it."""

    priced_by: str  # --rate, a costs table's device, calibration, or - (not priced)
    rate: float | None  # sample-steps per second per replica
    device_seconds: float | None
    wall_seconds: float | None
    time: DeviceTime | None = None  # priced by device costs: its parts

    def fields(self) -> dict[str, Any]:
        """Its fields in a plan's JSON (`sweep plan --json`'s rows, `tune --dry-run`'s estimate)."""
        parts = ("floor_seconds", "work_seconds", "batch_steps", "passes")
        return {
            "priced_by": self.priced_by,
            "rate": self.rate,
            "device_seconds": self.device_seconds,
            "wall_seconds": self.wall_seconds,
            **{k: getattr(self.time, k, None) for k in parts},  # None: not priced by costs
            "estimate": "-" if self.wall_seconds is None else format_duration(self.wall_seconds),
        }


def price(
    work: Workload,
    costs: DeviceCosts,
    rate: float | None,
    load: Callable[[], Any] | None = None,
    measure: Callable[[Workload, Any], float | None] = calibrate,
) -> tuple[Workload, Price]:
    """`work`, its shape filled in from its model's config where unknown, and its time by the
    module's rule. The model is loaded by `load()` (None: never; it may give None, a model not
    loadable here) only where needed: for that shape, or for a CPU workload no rate or costs
    table prices, priced by `measure(work, model)` (a rate, or None)."""
    table = tables(costs)[work.kind]
    unpriced = rate is None and table is None  # a CPU workload without a CPU costs table
    model = load() if load is not None and (work.shape is None or unpriced) else None
    if work.shape is None and model is not None:
        work = work.with_shape(shape_from_config(model.model.config))
    time: DeviceTime | None = None
    here, priced_by = rate, "--rate" if rate is not None else "-"
    if rate is None and table is not None and work.shape is not None:
        time = work.device_time(table)
        priced_by = table.device
        here = work.sample_steps / time.seconds if time.seconds > 0 else None
    elif rate is None and work.kind == "cpu" and model is not None:
        here = measure(work, model)
        priced_by = "calibration" if here is not None else "-"
    seconds = time.seconds if time is not None else work.sample_steps / here if here else None
    wall = None if seconds is None else seconds / work.replicas
    return work, Price(priced_by, here, seconds, wall, time)


@dataclass
class Totals:
    """A plan's sums: samples, sample-steps, GPU- and CPU-hours (over every replica), the wall
    (workloads one after another), and the workloads of unknown shape and without a price."""

    samples: int = 0
    sample_steps: int = 0
    gpu_hours: float = 0.0
    cpu_hours: float = 0.0
    wall_seconds: float = 0.0
    startup_seconds: float = 0.0  # of the wall: the models' start-ups (`DeviceCosts`)
    unshaped: int = 0
    unpriced: int = 0

    def add(self, work: Workload, cost: Price, startup: float = 0.0) -> None:
        self.samples += work.samples
        self.sample_steps += work.sample_steps
        self.unshaped += work.shape is None
        if cost.device_seconds is None or cost.wall_seconds is None:
            self.unpriced += 1
            return
        if work.kind == "gpu":
            self.gpu_hours += cost.device_seconds / 3600
        else:
            self.cpu_hours += cost.device_seconds / 3600
        self.wall_seconds += cost.wall_seconds + startup
        self.startup_seconds += startup
