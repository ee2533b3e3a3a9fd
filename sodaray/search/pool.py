"""The refilling batch pool: at most `max_batch_size` searches run at once; a found or
exhausted search leaves and the next queued target takes its slot, so the batch stays full."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

from sodaray.search.base import BatchSearch, StepOutcome

# finished(rows, tokens (k, n), found (k,), loss (k,), steps (k,), seconds (k,))
FinishedFn = Callable[
    [np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray], None
]


def run_pool(
    search_factory: Callable[[int], BatchSearch],
    num_targets: int,
    *,
    max_steps: int,
    max_batch_size: int,
    max_seconds: float | None = None,
    on_finished: FinishedFn,
    device: torch.device,
    on_step: Callable[[int], None] | None = None,
) -> None:
    """Drive `num_targets` searches through a batch of at most `max_batch_size` slots.

    One host synchronisation per step (the found mask); the per-slot step counters are kept on
    the host as well, since every active slot advances by exactly one step. `on_step(s)` runs
    after each step with the largest slot count `s` (after the step's results were delivered),
    so a caller can report progress or stop the search by raising.
    """
    if num_targets == 0:
        return
    slots = min(max_batch_size, num_targets)
    search = search_factory(slots)
    slot_row = np.arange(slots)  # which target row each slot holds
    steps = np.zeros(slots, dtype=np.int64)
    started = np.full(slots, time.perf_counter())
    next_row = slots
    search.add(torch.arange(slots, device=device), slot_row.copy())
    while len(slot_row):
        out: StepOutcome = search.step(steps + 1)
        steps += 1
        found = out.found.cpu().numpy()
        done = found | (steps >= max_steps)
        if max_seconds is not None:
            done |= (time.perf_counter() - started) >= max_seconds
        if not done.any():
            if on_step is not None:
                on_step(int(steps.max()))
            continue
        done_slots = np.flatnonzero(done)
        now = time.perf_counter()
        on_finished(
            slot_row[done_slots].copy(),
            out.tokens[torch.as_tensor(done_slots, device=out.tokens.device)].cpu().numpy(),
            found[done_slots],
            out.loss.detach()[torch.as_tensor(done_slots, device=out.loss.device)]
            .float()
            .cpu()
            .numpy(),
            steps[done_slots].copy(),
            now - started[done_slots],
        )
        # Refill freed slots from the queue, in order.
        refill = done_slots[: max(0, min(len(done_slots), num_targets - next_row))]
        if len(refill):
            rows = np.arange(next_row, next_row + len(refill))
            next_row += len(refill)
            slot_row[refill] = rows
            steps[refill] = 0
            started[refill] = now
            search.add(torch.as_tensor(refill, device=device), rows)
        empty = done_slots[len(refill) :]
        if len(empty):  # queue exhausted: shrink the batch instead of computing dead slots
            keep = np.setdiff1d(np.arange(len(slot_row)), empty)
            slot_row, steps, started = slot_row[keep], steps[keep], started[keep]
            if len(keep):
                search.keep(torch.as_tensor(keep, device=device))
        if on_step is not None:
            on_step(int(steps.max()) if len(steps) else max_steps)
