"""What a search step takes on a device, from measured costs: a floor per transformer pass and a
rate for the batch's work. The H100 figures of issue 41 are the built-in defaults until a device
is re-measured (`benchmarks/bench_invert.py --suite gpu --out FILE` writes a costs file); an
H200's, measured by that suite at padded static shapes (so dear for short inputs), are built in
as `h200`.

    step seconds = passes x (pass_seconds + layers x layer_seconds)
                   + (sum of the step's sample FLOPs) / flops_per_second

and a sweep's wall adds `startup_seconds` once per model (Ray, its replicas, its load).

- A pass costs a floor however few samples it holds: kernel launches, Python dispatch and host
  synchronisation, per layer (each layer launches its own kernels) and besides. On the H100 it is
  about 15 ms for 4 layers and 74 ms for 24 (the issue read 75-90 off its small batches): small
  batches are launch-bound.
- A sample's work is its sample-step FLOPs from the model's shape (`ModelShape.step_flops`:
  its positions through the blocks, the relaxed input's mixture, the unembedding, the update),
  at the rate the device reaches on a batch's work: per sample position, the per-position
  seconds of a shape and precision are its FLOPs per position over that rate.

Each precision (`SodaConfig.precision`: float32, bfloat16; tf32 is priced as float32, its one
H100 measurement having been taken under padded static shapes, RESULTS.md) has its own three
constants, fit by `fit_costs` to measured steps: least squares on
the relative error, the constants kept non-negative (a constant that would go negative is left
out and the rest refit). Measurements of one depth cannot tell the per-layer floor from the rest:
the floor is then all per layer.

The built-in H100 constants are `fit_costs` over the rows of `H100_STEPS` not marked held out
(tests/test_device_costs.py refits them and checks every row's error):
- float32: fit on neo n=10 B=1, B=8, B=1000 and Qwen n=3 B=64, B=1000 (the launch floors and the
  slopes); held out: neo n=3 B=64, neo n=10 B=64 and B=256, Qwen n=3 B=256, Qwen n=10 B=64.
- bfloat16 (five rows measured): fit on neo B=256, B=1000, Qwen B=64, B=1000; held out: Qwen B=256.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sodaray.costs.flops import KNOWN_SHAPES, ModelShape
from sodaray.io.paths import brief

KINDS = ("gpu", "cpu")  # the jobs a costs table prices: those asking a GPU, or none
PRECISIONS = ("float32", "tf32", "bfloat16")
# A precision not measured is priced as float32. For tf32 that errs high where it matters: on an
# H100 it ran 1.8-2.5x float32's speed at B=1000, and 0.76-1.09x at B=64 (host-bound, noisy).
FALLBACK = "float32"
MAX_STEP_SECONDS = 3600.0  # a floor above an hour a pass is a typo, not a measurement
MIN_RATE = 1e3  # FLOP/s: below, a plan's hours overflow before they mean anything


@dataclass(frozen=True)
class PrecisionCosts:
    pass_seconds: float  # a pass's floor besides its layers
    layer_seconds: float  # a pass's floor per transformer layer
    flops_per_second: float  # the rate of a batch's work

    def floor(self, layers: int) -> float:
        """What a pass of a `layers`-layer model costs however few samples it holds."""
        return self.pass_seconds + layers * self.layer_seconds


@dataclass(frozen=True)
class DeviceCosts:
    device: str  # a name for tables and `DEVICE-hours`: h100, or what the costs file says
    kind: str  # one of KINDS
    precisions: Mapping[str, PrecisionCosts]  # FALLBACK always among them
    source: str  # where the numbers come from
    # A sweep's wall before a model's first step: Ray, the model's replicas (they start side by
    # side), its load and its targets, as measured for a model of the measured size; a plan
    # counts it once per model (0: not measured, not counted).
    startup_seconds: float = 0.0

    def at(self, precision: str) -> PrecisionCosts:
        return self.precisions.get(precision) or self.precisions[FALLBACK]

    def priced_as(self, precision: str) -> str:
        return precision if precision in self.precisions else FALLBACK

    def per_position_seconds(self, shape: ModelShape, precision: str) -> float:
        """Seconds one sample position adds to a step (a length-10 input, one output, BOS:
        the step's FLOPs per position; the vocabulary terms make shorter inputs dearer)."""
        return shape.step_flops(10, 1, True) / 11 / self.at(precision).flops_per_second


@dataclass(frozen=True)
class StepCost:
    passes: int
    floor_seconds: float  # the passes' floors
    work_seconds: float  # the samples' FLOPs at the device's rate

    @property
    def seconds(self) -> float:
        return self.floor_seconds + self.work_seconds


def step_cost(
    costs: DeviceCosts,
    precision: str,
    layers: int,
    counts: Mapping[int, float],
    flops: Callable[[int], float],
    mix: bool = True,
    passes_per_group: int = 1,
) -> StepCost:
    """One step over `counts` samples per input length (fractions: a replica's share), one
    sample of length n costing `flops(n)`: the cheaper of one pass padded to the longest length
    (`mix`: lengths may share a pass) and a pass per length. The engine's own split, the
    cheapest by its measured costs among splits that include both, costs about this or less.
    `passes_per_group`: passes a group of samples takes per step (GCG: its gradient, then its
    candidates)."""
    rate = costs.at(precision)
    floor = rate.floor(layers) * passes_per_group
    live = {n: k for n, k in counts.items() if k > 0}
    if not live:
        return StepCost(0, 0.0, 0.0)
    apart = StepCost(
        len(live) * passes_per_group,
        len(live) * floor,
        sum(k * flops(n) for n, k in live.items()) / rate.flops_per_second,
    )
    if not mix or len(live) == 1:
        return apart
    longest = max(live)
    together = StepCost(
        passes_per_group, floor, sum(live.values()) * flops(longest) / rate.flops_per_second
    )
    return min(together, apart, key=lambda c: c.seconds)


@dataclass(frozen=True)
class DeviceTime:
    """A workload's time on its device(s), summed over its replicas, every sample running its
    full budget: the passes' floors, the samples' work, and the batch-steps they take."""

    floor_seconds: float
    work_seconds: float
    batch_steps: float
    passes: float

    @property
    def seconds(self) -> float:
        return self.floor_seconds + self.work_seconds


def waves(shares: Mapping[int, float], size: int) -> list[tuple[dict[int, float], int]]:
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


def device_time(
    costs: DeviceCosts,
    precision: str,
    layers: int,
    shares: Mapping[int, float],
    steps: int,
    batch: int,
    flops: Callable[[int], float],
    replicas: int = 1,
    mix: bool = True,
    passes_per_group: int = 1,
) -> DeviceTime:
    """`shares` samples per input length on each of `replicas` replicas, each running `steps`
    steps, taken in waves of `batch` (`waves`), a wave's steps priced by `step_cost`; summed
    over the replicas."""
    floor = work = batch_steps = passes = 0.0
    for wave, repeats in waves(shares, batch):
        step = step_cost(costs, precision, layers, wave, flops, mix, passes_per_group)
        floor += repeats * steps * step.floor_seconds
        work += repeats * steps * step.work_seconds
        batch_steps += repeats * steps
        passes += repeats * steps * step.passes
    r = replicas
    return DeviceTime(floor * r, work * r, batch_steps * r, passes * r)


@dataclass(frozen=True)
class MeasuredStep:
    """One measured step time: `batch` samples of input length `length` on a model of `shape`,
    all in `passes` passes (one: a batch of one length)."""

    label: str
    shape: ModelShape
    length: int
    batch: float
    precision: str
    ms: float
    outputs: int = 1
    bos: bool = False
    passes: int = 1
    held_out: bool = False  # not used by the fit of the built-in constants: it tests them

    @property
    def flops(self) -> float:
        return self.batch * self.shape.step_flops(self.length, self.outputs, self.bos)

    def predicted_ms(self, costs: DeviceCosts) -> float:
        rate = costs.at(self.precision)
        floor = self.passes * rate.floor(self.shape.layers)
        return 1000 * (floor + self.flops / rate.flops_per_second)


def fit_costs(steps: Sequence[MeasuredStep]) -> dict[str, PrecisionCosts]:
    """Per precision: the three constants that best predict `steps` (least squares on the
    relative error; each constant non-negative, one that would go negative left out)."""
    import numpy as np

    out = {}
    for precision in sorted({s.precision for s in steps}):
        rows = [s for s in steps if s.precision == precision]
        x = np.array([[s.passes, s.passes * s.shape.layers, s.flops] for s in rows], float)
        y = np.array([s.ms / 1000 for s in rows])
        a, b = x / y[:, None], np.ones(len(rows))  # relative: every row counts alike
        best: tuple[float, np.ndarray] | None = None
        # The rate column always stays; with one depth, "all per layer" is tried before "all
        # besides the layers" and wins the tie (it carries to other depths).
        for keep in ((0, 1, 2), (1, 2), (0, 2), (2,)):
            cols = a[:, keep]
            scale = np.abs(cols).max(axis=0)  # FLOPs ~1e12 beside counts ~1: condition it
            if np.linalg.matrix_rank(cols / scale) < len(keep):
                continue
            coef, *_ = np.linalg.lstsq(cols / scale, b, rcond=None)
            coef = coef / scale
            if (coef < 0).any():
                continue
            residual = float(np.sum((cols @ coef - b) ** 2))
            if best is None or residual < best[0] - 1e-9:  # a tie keeps the earlier
                full = np.zeros(3)
                full[list(keep)] = coef
                best = (residual, full)
        if best is None or best[1][2] <= 0:
            raise ValueError(f"{precision}: the measured steps fit no positive rate")
        p, per_layer, inverse_rate = best[1]
        out[precision] = PrecisionCosts(float(p), float(per_layer), float(1 / inverse_rate))
    return out


# ---- the H100 figures of issue 41 (shared/device/README.md): H100 80GB HBM3, 2026-11-25,
# sodaray at cb3cb7b, torch 2.11 + CUDA 13.0, random-init models of the real shapes, 30 steps,
# one length per batch (one pass a step), one observed output, no BOS (bench_invert's models).
_NEO = KNOWN_SHAPES["roneneldan/TinyStories-33M"]
_QWEN = KNOWN_SHAPES["Qwen/Qwen2.5-0.5B"]


def _row(label: str, shape: ModelShape, n: int, b: int, precision: str, ms: float, held=False):
    """A measured row of a device's table (one length per batch, one output, no BOS)."""
    return MeasuredStep(label, shape, n, b, precision, ms, held_out=held)


H100_STEPS: tuple[MeasuredStep, ...] = (
    _row("neo n=10 B=1", _NEO, 10, 1, "float32", 16.1),
    _row("neo n=10 B=8", _NEO, 10, 8, "float32", 15.1),
    _row("neo n=3 B=64", _NEO, 3, 64, "float32", 16.7, held=True),
    _row("neo n=10 B=64", _NEO, 10, 64, "float32", 23.1, held=True),
    _row("neo n=10 B=256", _NEO, 10, 256, "float32", 41.4, held=True),
    _row("neo n=10 B=1000", _NEO, 10, 1000, "float32", 127.3),
    _row("qwen n=3 B=64", _QWEN, 3, 64, "float32", 91.0),
    _row("qwen n=3 B=256", _QWEN, 3, 256, "float32", 139.0, held=True),
    _row("qwen n=3 B=1000", _QWEN, 3, 1000, "float32", 288.0),
    _row("qwen n=10 B=64", _QWEN, 10, 64, "float32", 134.0, held=True),
    _row("neo n=10 B=256", _NEO, 10, 256, "bfloat16", 34.6),
    _row("neo n=10 B=1000", _NEO, 10, 1000, "bfloat16", 82.0),
    _row("qwen n=3 B=64", _QWEN, 3, 64, "bfloat16", 127.0),
    _row("qwen n=3 B=256", _QWEN, 3, 256, "bfloat16", 149.0, held=True),
    _row("qwen n=3 B=1000", _QWEN, 3, 1000, "bfloat16", 195.0),
)

# fit_costs over H100_STEPS' fit rows, to three figures (tests/test_device_costs.py refits).
H100 = DeviceCosts(
    device="h100",
    kind="gpu",
    precisions={
        "float32": PrecisionCosts(3.40e-3, 2.94e-3, 2.76e13),
        "bfloat16": PrecisionCosts(7.41e-3, 4.32e-3, 6.14e13),
    },
    source="issue 41's figures, H100 80GB HBM3, 2026-11-25, not re-measured",
    # Issue 41's Ray sweep (neo shape, 1,000 inputs, one replica): about 35 s of its 70 s wall.
    startup_seconds=35.0,
)


# ---- the H200 figures (benchmarks/RESULTS.md, "Issue 41 on an H200"): NVIDIA H200 141GB,
# 2026-11-26, sodaray at 740535d, torch 2.11 + CUDA 13.0, `bench_invert.py --suite gpu` (its
# models, 20 steps, one process; the first of its two runs). Qwen n=3 B=1000 was not reached
# within the lease, so both precisions' slopes rest on neo's largest batch. The engine then ran
# GPU passes at static shapes (widths of 16s, power-of-two batches), so these rows are padded:
# they over-price short inputs at today's exact default (RESULTS.md, "Issue 41 on an H100").

H200_STEPS: tuple[MeasuredStep, ...] = (
    _row("neo n=10 B=1", _NEO, 10, 1, "float32", 15.9),
    _row("neo n=10 B=64", _NEO, 10, 64, "float32", 16.8, held=True),
    _row("neo n=10 B=1000", _NEO, 10, 1000, "float32", 113.0),
    _row("qwen n=3 B=64", _QWEN, 3, 64, "float32", 117.8),
    _row("qwen n=3 B=256", _QWEN, 3, 256, "float32", 221.7, held=True),
    _row("neo n=10 B=1", _NEO, 10, 1, "bfloat16", 16.1),
    _row("neo n=10 B=64", _NEO, 10, 64, "bfloat16", 20.1, held=True),
    _row("neo n=10 B=1000", _NEO, 10, 1000, "bfloat16", 68.7),
    _row("qwen n=3 B=64", _QWEN, 3, 64, "bfloat16", 123.3),
)

# fit_costs over H200_STEPS' fit rows, to three figures (tests/test_device_costs.py refits).
H200 = DeviceCosts(
    device="h200",
    kind="gpu",
    precisions={
        "float32": PrecisionCosts(0.0, 4.09e-3, 2.93e13),
        "bfloat16": PrecisionCosts(0.0, 4.32e-3, 5.48e13),
    },
    source="bench_invert.py --suite gpu on an NVIDIA H200, 2026-11-26 (RESULTS.md)",
    # plan_vs_wall.py there: 58.1 s wall, 34.9 s of it searching (one run).
    startup_seconds=23.2,
)
BUILT_IN: dict[str, DeviceCosts] = {"h100": H100, "h200": H200}


# ---- costs files ------------------------------------------------------------------------------
# `measured`: not read back; `startup_seconds`: optional (see `DeviceCosts`).
FILE_KEYS = ("device", "kind", "source", "precisions", "startup_seconds", "measured")
CONSTANTS = ("pass_seconds", "layer_seconds", "flops_per_second")


def load_costs(source: str) -> DeviceCosts:
    """Built-in costs by device name (`h100`), or a costs file (YAML, as `bench_invert.py
    --suite gpu --out FILE` writes it); a one-line ValueError naming the problem."""
    if source in BUILT_IN:
        return BUILT_IN[source]
    from sodaray.config.configfile import read_document

    path = Path(source).expanduser()
    if not path.is_file():
        raise ValueError(
            f"--costs {source}: no such costs file, nor built-in costs "
            f"(built in: {', '.join(BUILT_IN)})"
        )
    data, _ = read_document(path, "costs", ValueError)
    return costs_from_data(data, str(path))


def _number(value: Any) -> float | None:
    """A YAML number as a float; None for anything else, a bool, or an integer too large for a
    float (`math.isfinite(10**400)` raised OverflowError, a line naming no file)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:
        return None


def costs_from_data(data: Any, where: str) -> DeviceCosts:
    if not isinstance(data, dict):
        raise ValueError(f"{where}: a costs file is a mapping ({', '.join(FILE_KEYS)})")
    unknown = sorted(str(k) for k in data if k not in FILE_KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(FILE_KEYS)})")
    device, kind = data.get("device"), data.get("kind")
    if not isinstance(device, str) or not device.strip() or len(device) > 100:
        raise ValueError(f"{where}: device must be a name of 1-100 characters")
    if kind not in KINDS:
        raise ValueError(f"{where}: kind must be one of {', '.join(KINDS)}, not {kind!r}")
    precisions = data.get("precisions")
    if not isinstance(precisions, dict) or FALLBACK not in precisions:
        raise ValueError(f"{where}: precisions must be a mapping with {FALLBACK} among them")
    table = {}
    for name, values in precisions.items():
        if name not in PRECISIONS:
            raise ValueError(f"{where}: precision {name!r} is not one of {', '.join(PRECISIONS)}")
        if not isinstance(values, dict) or set(values) != set(CONSTANTS):
            raise ValueError(f"{where}: precisions.{name} must give exactly {', '.join(CONSTANTS)}")
        for key in CONSTANTS:
            value = _number(values[key])
            if value is None or not math.isfinite(value) or value < 0:
                raise ValueError(
                    f"{where}: precisions.{name}.{key} must be a finite number >= 0, "
                    f"not {brief(values[key], 40)}"
                )
        if values["flops_per_second"] < MIN_RATE:
            raise ValueError(
                f"{where}: precisions.{name}.flops_per_second must be at least {MIN_RATE:g}"
            )
        if values["pass_seconds"] + values["layer_seconds"] > MAX_STEP_SECONDS:
            raise ValueError(f"{where}: precisions.{name}: a pass's floor above an hour")
        table[name] = PrecisionCosts(*(float(values[k]) for k in CONSTANTS))
    given = data.get("startup_seconds", 0.0)
    startup = _number(given)
    if startup is None or not math.isfinite(startup) or not 0 <= startup <= MAX_STEP_SECONDS:
        raise ValueError(
            f"{where}: startup_seconds must be a number of seconds from 0 to "
            f"{MAX_STEP_SECONDS:g}, not {brief(given, 40)}"
        )
    source = data.get("source", where)
    return DeviceCosts(device.strip(), kind, table, str(source)[:300], float(startup))


def costs_to_data(costs: DeviceCosts, measured: dict[str, Any] | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {
        "device": costs.device,
        "kind": costs.kind,
        "source": costs.source,
        "precisions": {
            name: {k: float(getattr(c, k)) for k in CONSTANTS}
            for name, c in costs.precisions.items()
        },
    }
    if costs.startup_seconds:
        data["startup_seconds"] = float(costs.startup_seconds)
    if measured:
        data["measured"] = measured
    return data


def describe_costs(costs: DeviceCosts) -> dict[str, Any]:
    """A costs table as plans show it (`sweep plan --json`'s and `tune --dry-run`'s `costs`)."""
    return {
        "device": costs.device,
        "source": costs.source,
        "precisions": {
            name: {key: getattr(c, key) for key in CONSTANTS}
            for name, c in costs.precisions.items()
        },
        "startup_seconds": costs.startup_seconds,
    }


@dataclass
class Fit:
    """A fit and how well it predicts the steps it was fit on (and any held out)."""

    costs: DeviceCosts
    # "label precision" -> predicted / measured - 1
    errors: dict[str, float] = field(default_factory=dict)


def fit_device(steps: Sequence[MeasuredStep], device: str, kind: str, source: str) -> Fit:
    """`DeviceCosts` fit to the steps not held out, and every step's relative error."""
    costs = DeviceCosts(device, kind, fit_costs([s for s in steps if not s.held_out]), source)
    errors = {
        f"{s.label} {s.precision}": s.predicted_ms(costs) / s.ms - 1
        for s in steps
        if s.precision in costs.precisions
    }
    return Fit(costs, errors)
