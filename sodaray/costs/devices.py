"""What a search step takes on a device, from measured costs: a floor per transformer pass and a
rate for the batch's work. Built in: `h100` (the default) and `h200`, costs files packaged beside
this module with the measured steps they were fit to; `bench_invert.py --suite gpu --out FILE`
measures a device, fits the constants and writes a costs file of the same form.

    step seconds = passes x (pass_seconds + layers x layer_seconds)
                   + (sum of the step's sample FLOPs) / flops_per_second

and a sweep's wall adds `startup_seconds` once per model (Ray, its replicas, its load). A pass
costs a floor however few samples it holds (small batches are launch-bound); a sample's work is
its sample-step FLOPs (`ModelShape.step_flops`) at the rate the device reaches on a batch's work.
Each measured precision (`SodaConfig.precision`) has its own three constants; one not measured,
tf32 among them, is priced as float32.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

from sodaray.config.configfile import read_document
from sodaray.config.yamltext import yaml_load
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
    # A sweep's wall before a model's first step (Ray, replicas, load, targets), counted once
    # per model by a plan (0: not measured, not counted).
    startup_seconds: float = 0.0

    def at(self, precision: str) -> PrecisionCosts:
        return self.precisions.get(precision) or self.precisions[FALLBACK]


@dataclass(frozen=True)
class DeviceTime:
    """Time on a device: the passes' floors, the samples' work, and the batch-steps they take
    (a workload's: summed over its replicas, every sample running its full budget; a step's: one
    batch-step)."""

    floor_seconds: float
    work_seconds: float
    batch_steps: float
    passes: float

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
) -> DeviceTime:
    """One step over `counts` samples per input length (fractions: a replica's share), a sample
    of length n costing `flops(n)`: the cheaper of one pass padded to the longest length (`mix`:
    lengths may share a pass) and a pass per length (the engine's own split costs about this or
    less). `passes_per_group`: passes a group takes per step (GCG: gradient, then candidates)."""
    rate = costs.at(precision)
    floor = rate.floor(layers) * passes_per_group
    live = {n: k for n, k in counts.items() if k > 0}
    if not live:
        return DeviceTime(0.0, 0.0, 1, 0)
    work = sum(k * flops(n) for n, k in live.items()) / rate.flops_per_second
    apart = DeviceTime(len(live) * floor, work, 1, len(live) * passes_per_group)
    if not mix or len(live) == 1:
        return apart
    work = sum(live.values()) * flops(max(live)) / rate.flops_per_second
    together = DeviceTime(floor, work, 1, passes_per_group)
    return min(together, apart, key=lambda c: c.seconds)


def waves(shares: Mapping[int, float], size: int) -> list[tuple[dict[int, float], int]]:
    """`shares` samples per length taken in length order, `size` at a time: each distinct wave's
    samples per length and how many times it repeats (full waves of one length: one entry)."""
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


# ---- costs files (`measured`: not read back; `startup_seconds`: optional) ----------------------
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
    """A YAML number as a float; None for anything else (a bool, an int too large for a float)."""
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


def costs_to_data(costs: DeviceCosts) -> dict[str, Any]:
    """`costs` as a costs file holds them (a file's `measured` steps are not read back)."""
    data: dict[str, Any] = dict(device=costs.device, kind=costs.kind, source=costs.source)
    data["precisions"] = {
        name: {k: float(getattr(c, k)) for k in CONSTANTS} for name, c in costs.precisions.items()
    }
    if costs.startup_seconds:
        data["startup_seconds"] = float(costs.startup_seconds)
    return data


def _built_in(device: str) -> DeviceCosts:
    """The packaged costs file `DEVICE.yaml` (its `measured` steps: bench_invert.py reads them)."""
    name = f"{device}.yaml"
    return costs_from_data(yaml_load(files(__package__).joinpath(name).read_text("utf-8")), name)


H100, H200 = _built_in("h100"), _built_in("h200")
BUILT_IN: dict[str, DeviceCosts] = {"h100": H100, "h200": H200}


def describe_costs(costs: DeviceCosts) -> dict[str, Any]:
    """A costs table as plans show it (`sweep plan --json`'s and `tune --dry-run`'s `costs`)."""
    data = {**costs_to_data(costs), "startup_seconds": costs.startup_seconds}
    return {key: data[key] for key in ("device", "source", "precisions", "startup_seconds")}
