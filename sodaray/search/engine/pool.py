"""One batch of an engine's searches and the queue of those waiting for it: who sits in which
slot, how many steps each has taken, and what ends them (a find, the step budget, the clock,
a cancel). A batch that reports its steps late (`lag`, SODA's 2: its status reaches the host
while the next step runs, its tokens' screen while the one after runs) is read here at the step
its outcome is of."""

from __future__ import annotations

import time
from collections import deque
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch
from torch import Tensor

from sodaray.model.loaded import LoadedModel
from sodaray.search.engine.base import BatchSearch, SlotEntry
from sodaray.search.engine.scan import position_scan
from sodaray.search.engine.slots import SlotTable, removal_plan
from sodaray.search.engine.work import Ledger, Work


class Finished(NamedTuple):
    """A target's search at one length that ended: whose it was (`work`, its `row`, the `stage`
    of its length plan) and what it reached, steps and seconds at this length alone."""

    work: Work
    row: int
    stage: int
    tokens: list[int]
    found: bool
    loss: float
    steps: int
    seconds: float


class Owner(Protocol):
    """What a pool asks of the engine that owns it (`sodaray.search.engine.loop.Engine`)."""

    model: LoadedModel
    works: dict[Work, Ledger]  # the works in flight, each with the engine's count of it

    def settled(self, slot_steps: int) -> None: ...

    def settle(self, work: Work) -> None: ...

    def finished(self, done: Finished) -> None: ...


class Pool:
    """One batch and its queue. Its slot table follows the batch's removal plans."""

    def __init__(self, engine: Owner, family: str, batch: BatchSearch) -> None:
        self.engine, self.family, self.batch = engine, family, batch
        self.queue: deque[tuple[int, Work, int, int]] = deque()  # (arrival, work, row, stage)
        # When the last `lag` steps were launched (the oldest first): an outcome's time.
        self.clocks = deque([time.perf_counter()], maxlen=max(batch.lag, 1))
        # Per slot: its work, row and stage; `steps` run, those `settled` (whose outcome was
        # read, a `lag` behind), the `base` taken at earlier lengths, `max_steps`, when it
        # `started`, its `deadline`, and its work's next checkpoint step (`mark`, `Work.marks`).
        ints = ("row", "stage", "steps", "settled", "base", "max_steps")
        rest = {"started": np.float64, "deadline": np.float64, "mark": np.int64}
        self.slot = SlotTable({"work": object, **dict.fromkeys(ints, np.int64), **rest})

    def __len__(self) -> int:
        return len(self.slot)

    def head(self) -> int | None:
        """The arrival number of the next target to enter (None: nothing waits)."""
        while self.queue and self.queue[0][1].cancelled:
            self.engine.works[self.queue.popleft()[1]].queued -= 1
        return self.queue[0][0] if self.queue else None

    def admit(self, count: int) -> None:
        """Move the next `count` waiting targets into the batch."""
        joined = []
        while len(joined) < count and self.head() is not None:
            _, work, row, stage = self.queue.popleft()
            self.engine.works[work].queued -= 1
            joined.append((work, row, stage))
        if not joined:
            return
        self.batch.add(
            [SlotEntry(w.targets, row, w.plans[row][stage], w.config) for w, row, stage in joined]
        )
        now = time.perf_counter()
        add: dict[str, list[Any]] = {name: [] for name in self.slot}
        for work, row, stage in joined:
            ledger = self.engine.works[work]
            ledger.active += 1
            limit = work.config.max_seconds
            base = ledger.partial.get(row, (0, 0.0, []))[0]
            deadline = np.inf if limit is None else now + limit
            values = dict(
                work=work,
                row=row,
                stage=stage,
                steps=0,
                settled=0,
                base=base,
                max_steps=work.config.step_budget(),
                started=now,
                deadline=deadline,
                mark=_next_mark(work, base),
            )
            for name, value in values.items():
                add[name].append(value)
        self.slot.append(add)

    def step(self) -> tuple[int, int] | None:
        """One step of every slot; finished searches leave. Returns the positions the forward
        pass computed and those the searches' own sequences hold (None: no slot)."""
        s = self.slot
        count = len(s)
        if not count:
            return None
        out = self.batch.step(s["steps"] + 1)
        s["steps"] += 1
        # The outcome's step: this one, or `lag` before where the batch reports late (a search
        # that ended there took the steps since too; their results are dropped).
        settled = np.ones(count, dtype=bool) if out.settled is None else out.settled
        lag = self.batch.lag
        self.engine.settled(int(settled.sum()))  # a search's every step, but a lag's last
        s["settled"] = np.where(settled, s["steps"] - lag, s["settled"])
        # The outcome's time: when its step was launched (`lag` calls ago, where it lags).
        now = self.clocks[0] if lag else time.perf_counter()
        self.clocks.append(time.perf_counter())
        cancelled = np.fromiter((w.cancelled for w in s["work"]), bool, count)
        marked = np.flatnonzero(settled & (s["base"] + s["settled"] == s["mark"]) & ~cancelled)
        if len(marked):
            self.mark(marked, out)
        ended = out.found | (s["settled"] >= s["max_steps"]) | (now >= s["deadline"])
        done = (settled & ended) | cancelled
        if done.any():
            self.finish(np.flatnonzero(done), cancelled, out, now)
        return out.positions, out.useful

    def mark(self, slots: np.ndarray, out: Any) -> None:
        """`slots` are at a checkpoint of their works: keep their loss and candidate there."""
        s = self.slot
        tokens = self.batch.candidates(slots)
        for slot, loss, candidate in zip(slots, _losses(out, slots), tokens, strict=True):
            work, total = s["work"][slot], int(s["base"][slot] + s["settled"][slot])
            index = work.checkpoints.index(total)
            work.marks.setdefault(index, {})[int(s["row"][slot])] = (float(loss), candidate)
            s["mark"][slot] = _next_mark(work, total)

    def finish(self, slots: np.ndarray, cancelled: np.ndarray, out: Any, now: float) -> None:
        """Deliver what `slots` found (cancelled ones aside) and remove them."""
        s = self.slot
        for slot in slots[cancelled[slots]]:  # the steps a cancel stopped, for its work's count
            s["work"][slot].dropped_steps += int(s["settled"][slot])
        live = slots[~cancelled[slots]]
        if len(live):
            tokens = self.batch.candidates(live)
            losses = _losses(out, live)
            for j, slot in enumerate(live):
                work, row, found = s["work"][slot], int(s["row"][slot]), bool(out.found[slot])
                seconds = now - float(s["started"][slot])
                spent = s["settled"][slot] >= s["max_steps"][slot]  # its budget, not its seconds
                # A config's `scan_positions` (SODA's): check every single-token change.
                if not found and spent and getattr(work.config, "scan_positions", False):
                    began = time.perf_counter()
                    hit = position_scan(self.engine.model, work.targets, row, tokens[j])
                    found, tokens[j] = hit is not None, tokens[j] if hit is None else hit
                    seconds += time.perf_counter() - began
                stage, steps = int(s["stage"][slot]), int(s["settled"][slot])
                self.engine.finished(
                    Finished(work, row, stage, tokens[j], found, float(losses[j]), steps, seconds)
                )
        left, holes, movers = removal_plan(len(s), slots)
        self.batch.remove(left, holes, movers)
        gone = list(s["work"][slots])
        s.remove(left, holes, movers)
        for work in gone:
            self.engine.works[work].active -= 1
            self.engine.settle(work)


def _losses(out: Any, slots: np.ndarray) -> np.ndarray:
    """A step outcome's loss for `slots`, on the host (read from the device for these only)."""
    if isinstance(out.loss, Tensor):
        loss = out.loss.detach()[torch.as_tensor(slots, device=out.loss.device)]
        return loss.float().cpu().numpy()
    return out.loss[slots]  # on the host already, or read from there for these slots only


NO_MARK = np.iinfo(np.int64).max


def _next_mark(work: Work, steps: int) -> int:
    """The first of `work`'s checkpoint steps past `steps` (NO_MARK: none)."""
    return next((c for c in work.checkpoints if c > steps), NO_MARK)
