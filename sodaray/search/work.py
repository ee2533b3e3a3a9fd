"""What callers hand the engine (`Work`: targets, a config, the lengths to try, callbacks) and
what it counts of its batches' fill (`Occupancy`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sodaray.search.base import InversionResult, SearchConfig
from sodaray.targets import TargetSet


@dataclass(eq=False)
class Work:
    """Targets to invert with one config. `plans[row]` lists the lengths to search target `row`
    at, in order (the next is tried when one ends unfound). `on_result(row, result)` runs as
    each target finishes; `on_checkpoint(index, step)` once every target has finished or taken
    `checkpoints[index]` steps; `on_done()` once every target has finished (or the work was
    cancelled, or failed: see `error`)."""

    targets: TargetSet
    config: SearchConfig
    plans: list[Sequence[int]]
    on_result: Callable[[int, InversionResult], None] | None = None
    checkpoints: tuple[int, ...] = ()
    on_checkpoint: Callable[[int, int], None] | None = None
    on_done: Callable[[], None] | None = None
    # Kept by the engine:
    results: dict[int, InversionResult] = field(default_factory=dict)
    cancelled: bool = False
    error: BaseException | None = None
    reported: int = 0  # checkpoints reported so far
    _partial: dict[int, tuple[int, float, list[int]]] = field(default_factory=dict)
    _queued: int = 0
    _active: int = 0
    _finished: bool = False

    def ordered(self) -> list[InversionResult]:
        """The results in target order (all targets must have finished)."""
        return [self.results[i] for i in range(len(self.plans))]


@dataclass
class Occupancy:
    """What the pools' steps held: searches (slot-steps) against capacity, and the sequence
    positions the forward passes computed against those the searches' own sequences hold."""

    slot_steps: int = 0
    capacity_steps: int = 0
    steps: int = 0
    positions: int = 0
    useful: int = 0

    def add(self, other: Occupancy) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    @property
    def rate(self) -> float | None:
        return self.slot_steps / self.capacity_steps if self.capacity_steps else None
