"""A replica's progress while its units run: the counts the driver's progress lines move with.

The engine calls `ProgressReporter.on_batch` on its stepping thread at every step. Once
`EVERY_SECONDS` have passed since the last report, or the engine has stepped a `PARTS`-th of
the smallest step budget in flight (but never sooner than `MIN_SECONDS` after the last), the
reporter reads every unit's counts there (`Engine.steps_taken` and the results so far: nothing
moves on that thread meanwhile) and puts one `Progress` item in the stream of the oldest unit
in flight. So a sweep's shard of 100 samples at 100,000 steps moves the driver's bar every
second rather than once in hours, a 2,000-step shard still moves twenty times however fast
its steps are, and the cost is a clock read per step and a few sums a second.

A unit stops being reported on (`done`) from its work's `on_done`, on that same thread and
before its stream's end is queued, so no item lands in a stream nobody reads any more.
"""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from sodaray.experiment.work import Progress, UnitProgress

EVERY_SECONDS = 1.0  # a report at least this often while the engine steps
MIN_SECONDS = 0.1  # and at most ten a second
PARTS = 20  # a report per twentieth of the smallest step budget in flight


@dataclass(eq=False)
class _Watched:
    work: Any  # sodaray.search.engine.loop.Work
    events: Any  # the unit's stream: a queue.Queue its generator yields from
    budget: int  # steps per length

    def counts(self, key: str, taken: int) -> UnitProgress:
        """The unit's counts, given the sample-steps its work has `taken` (engine thread)."""
        plans, results = self.work.plans, self.work.results
        most = self.budget * sum(len(plan) for plan in plans)
        found = 0
        for row, result in results.items():  # a finished sample's bound is what it took
            most -= self.budget * len(plans[row]) - result.steps
            found += bool(result.found)
        return UnitProgress(key, taken, len(results), found, most)


class ProgressReporter:
    """The progress of one replica's units in flight; see the module docstring."""

    def __init__(self) -> None:
        self.engine: Any = None  # the Engine that calls `on_batch` (set once it exists)
        self._units: dict[str, _Watched] = {}  # in arrival order: the oldest carries the item
        self._lock = threading.Lock()  # `watch` comes from the units' threads
        self._last = time.monotonic()
        self._steps = 0  # engine steps since the last report
        self._every = math.inf  # steps per report by budget (PARTS)

    def watch(self, key: str, work: Any, events: Any) -> None:
        """Report on `work` (unit `key`) into `events` until `done(key)`."""
        budget = work.config.step_budget()
        with self._lock:
            self._units[key] = _Watched(work, events, budget)
            self._every = min(self._every, max(1, budget // PARTS))

    def done(self, key: str) -> None:
        with self._lock:
            self._units.pop(key, None)

    def on_batch(self, active: int) -> None:
        """The engine's per-step hook (its stepping thread): report when it is time."""
        self._steps += 1
        now = time.monotonic()
        since = now - self._last
        if since < MIN_SECONDS or (since < EVERY_SECONDS and self._steps < self._every):
            return
        self._last, self._steps = now, 0
        with self._lock:
            units = list(self._units.items())
            self._every = min((max(1, w.budget // PARTS) for _, w in units), default=math.inf)
        if not units or self.engine is None:
            return
        taken = self.engine.steps_taken()
        counts = tuple(w.counts(key, taken.get(w.work, 0)) for key, w in units)
        took = self.engine.take_occupancy()
        units[0][1].events.put(
            Progress(counts, os.getpid(), took.slot_steps, took.capacity_steps, took.steps)
        )
