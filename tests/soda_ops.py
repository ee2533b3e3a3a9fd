"""A SODA batch's step taken apart, for tests that check one part against its formula: each
calls the step's own functions (`sodaray.search.soda.step`) on the batch's state."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from sodaray.objective.observations import BatchTargets
from sodaray.search.soda.batch import SodaBatch
from sodaray.search.soda.fused_step import invalidate
from sodaray.search.soda.state import observed_of
from sodaray.search.soda.step import schedules, update


def observed(batch: SodaBatch) -> BatchTargets:
    """The observed rows of the live slots."""
    return observed_of(batch.state, len(batch.state))


def passes(batch: SodaBatch) -> list:
    """The transformer passes the last planned step runs."""
    return batch.inputs.passes if batch.inputs is not None else []


def set_steps(batch: SodaBatch, counts: np.ndarray) -> None:
    """Each slot's step count (its rows' counters on the device)."""
    per_row = np.asarray(counts, dtype=np.int64)[batch.state.row_slot]
    column = batch.state.column("hi", "step", len(per_row))
    column.copy_(torch.as_tensor(per_row[:, None], device=column.device))


def adam_update(batch: SodaBatch, grad: Tensor) -> None:
    """Adam and decay from `grad` (consumed; the live rows, or with the guard row after them),
    the step counts advanced first."""
    if len(grad) == len(batch.state.row_slot):  # no guard row given: a zero one
        grad = torch.cat([grad, grad.new_zeros((1, grad.shape[1]))])
    update(batch.state, batch.refresh(), grad)
    invalidate(batch.state)


def apply_schedules(batch: SodaBatch, steps_after: np.ndarray) -> None:
    """The schedules after a step that left each slot at `steps_after` steps."""
    set_steps(batch, steps_after)
    x = batch.refresh()
    step = batch.state.column("hi", "step", x.rows)
    schedules(batch.state, x, step, resetting=True)
    invalidate(batch.state)
    batch.redraw(steps_after)
