"""What a search step takes on a device, from measured costs: a floor per transformer pass and a
rate for the batch's work. Built in: `h100` (the default) and `h200`, costs files packaged beside
this module with the measured steps they were fit to; `bench_invert.py --suite gpu --out FILE`
measures a device and writes a costs file of the same form.

    step seconds = passes x (pass_seconds + layers x layer_seconds)
                   + (sum of the step's sample FLOPs) / flops_per_second

and a sweep's wall adds `startup_seconds` once per model (Ray, its replicas, its load).

- A pass costs a floor however few samples it holds: kernel launches, Python dispatch and host
  synchronisation, per layer (each layer launches its own kernels) and besides: small batches
  are launch-bound.
- A sample's work is its sample-step FLOPs from the model's shape (`ModelShape.step_flops`:
  its positions through the blocks, the relaxed input's mixture, the unembedding, the update),
  at the rate the device reaches on a batch's work: per sample position, the per-position
  seconds of a shape and precision are its FLOPs per position over that rate.

Each measured precision (`SodaConfig.precision`; one not measured, tf32 among them, is priced as
float32) has its own three constants, fit by `fit_costs` to measured steps: least squares on the
relative error, the constants kept non-negative (a constant that would go negative is left out
and the rest refit). Measurements of one depth cannot tell the per-layer floor from the rest:
the floor is then all per layer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any

from sodaray.config.configfile import read_document
from sodaray.config.yamltext import yaml_load
from sodaray.costs.flops import KNOWN_SHAPES, ModelShape
from sodaray.io.paths import brief

KINDS = ("gpu", "cpu")  # the jobs a costs table prices: those asking a GPU, or none
PRECISIONS = ("float32", "tf32", "bfloat16")
# A precision not measured is priced as float32 (for tf32 that errs high where the batch's work
# dominates: there it runs faster).
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


# ---- costs files ------------------------------------------------------------------------------
# `measured`: not read back; `startup_seconds`: optional (see `DeviceCosts`).
FILE_KEYS = ("device", "kind", "source", "precisions", "startup_seconds", "measured")
CONSTANTS = ("pass_seconds", "layer_seconds", "flops_per_second")


def load_costs(source: str) -> DeviceCosts:
    """Built-in costs by device name (`h100`), or a costs file (YAML, as `bench_invert.py
    --suite gpu --out FILE` writes it); a one-line ValueError naming the problem."""
    if source in BUILT_IN:
        return BUILT_IN[source]
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
    float (`math.isfinite(10**400)` raises OverflowError)."""
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
    """`costs` as a costs file holds them, with what was `measured` (kept, not read back)."""
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


def _built_in(device: str) -> tuple[DeviceCosts, tuple[MeasuredStep, ...]]:
    """The packaged costs file `DEVICE.yaml` beside this module: its costs, and the measured
    steps they were fit to (`measured.rows`, `MeasuredStep`s whose shapes `measured.shapes`
    names; `held_out` rows were left out of the fit)."""
    name = f"{device}.yaml"
    data = yaml_load(files(__package__).joinpath(name).read_text(encoding="utf-8"))
    measured = data["measured"]
    shapes = {key: KNOWN_SHAPES[model] for key, model in measured["shapes"].items()}
    steps = tuple(MeasuredStep(**{**r, "shape": shapes[r["shape"]]}) for r in measured["rows"])
    return costs_from_data(data, name), steps


H100, H100_STEPS = _built_in("h100")
H200, H200_STEPS = _built_in("h200")
BUILT_IN: dict[str, DeviceCosts] = {"h100": H100, "h200": H200}


def describe_costs(costs: DeviceCosts) -> dict[str, Any]:
    """A costs table as plans show it (`sweep plan --json`'s and `tune --dry-run`'s `costs`)."""
    data = costs_to_data(costs)
    shown = {key: data[key] for key in ("device", "source", "precisions")}
    return {**shown, "startup_seconds": costs.startup_seconds}


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
