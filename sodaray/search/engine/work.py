"""What callers hand the engine (`Work`: targets, a config, the lengths to try, callbacks; and
what they get back), what the engine keeps of each work in flight (`Ledger`), and what it counts
of its batches' fill (`Occupancy`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sodaray.objective.targets import TargetSet
from sodaray.search.engine.base import InversionResult, SearchConfig


@dataclass(eq=False)
class Work:
    """Targets to invert with one config. `plans[row]`: the lengths to search target `row` at,
    in order (the next when one ends unfound). `on_result(row, result)` runs as each target
    finishes; `on_checkpoint(index, step)` once every target has finished or taken
    `checkpoints[index]` steps (`marks` then holds each running target's loss and candidate at
    that step); `on_done()` once every target has finished, or it was cancelled or failed."""

    targets: TargetSet
    config: SearchConfig
    plans: list[Sequence[int]]
    on_result: Callable[[int, InversionResult], None] | None = None
    checkpoints: tuple[int, ...] = ()
    on_checkpoint: Callable[[int, int], None] | None = None
    on_done: Callable[[], None] | None = None
    # What the caller gets back, written by the engine:
    results: dict[int, InversionResult] = field(default_factory=dict)
    cancelled: bool = False
    error: BaseException | None = None
    # checkpoint index -> row -> (loss, candidate tokens) at that step, for targets running then
    marks: dict[int, dict[int, tuple[float, list[int]]]] = field(default_factory=dict)
    dropped_steps: int = 0  # steps of targets a cancel (or an error) stopped mid-search
    done: bool = False  # the engine is done with it: nothing of it waits or runs

    def sample_steps(self) -> int:
        """The steps its targets took: finished ones' and those a cancel stopped (read this
        once it is done; `Engine.steps_taken` counts a work in flight)."""
        return sum(r.steps for r in self.results.values()) + self.dropped_steps

    def ordered(self) -> list[InversionResult]:
        """The results in target order (all targets must have finished)."""
        return [self.results[i] for i in range(len(self.plans))]


@dataclass
class Ledger:
    """The engine's own count of one work in flight: its targets waiting in queues (`queued`)
    and running in slots (`active`), the checkpoints reported so far, and, for a target between
    two lengths, the steps, seconds and lengths it took at the earlier ones (`partial`)."""

    queued: int = 0
    active: int = 0
    reported: int = 0
    partial: dict[int, tuple[int, float, list[int]]] = field(default_factory=dict)

    def partial_steps(self) -> int:
        return sum(steps for steps, _, _ in self.partial.values())


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
