"""The SODA step as one function of the persistent batch's buffers: the relaxation,
the transformer passes at their planned shapes, the loss, the backward to Z, Adam and decay
(bias correction on the device), argmax, and the schedules of the next step (annealing and
moment resets), ending in a small status (tokens, loss). The match check's screen runs a step
later on the slots whose tokens changed (`sodaray.search.soda.screen`).

No operation here reads a value back to the host or takes a shape from data (but the fluency
penalty's, which is never captured), so on CUDA the whole step can be captured once per shape
and replayed (`sodaray.search.engine.executor`); on a CPU it runs eagerly.

What a step reads besides the buffers (`StepInputs`: index tensors, the backward's seed) is
planned on the host when the batch's composition changes (`plan_inputs`): at the slots' own
shapes ("exact": the live rows and a guard row after them), or at a bucketed shape ("capture":
`static_rows` rows, `static_batch` slots, one pass), whose tensors are written in place so that
a captured step finds them where it left them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from sodaray.model.attention import invariant
from sodaray.model.loaded import LoadedModel
from sodaray.objective.observations import BatchTargets
from sodaray.objective.scoring import Layout, objective_loss, observed_positions, sequence_embeds
from sodaray.search.adam import adam_step
from sodaray.search.denormals import flush_denormals
from sodaray.search.engine.scheduler import Scheduler, static_batch, static_rows
from sodaray.search.soda.relaxed import RelaxedEmbedding, Workspace, tf32
from sodaray.search.soda.state import SodaState, observed_of


@dataclass
class Pass:
    """One transformer pass of a step: its slots (host indices; None: every slot), their
    layout, their packed rows, the slots as a tensor, the batch size and input width it runs at
    (padding slots and positions are zeros), `spare` rows after the layout's (the guard row)
    placed in the first padding item, and its objective groups: (group, slots in the pass, their
    layout and rows), the last three None where the pass holds one group."""

    slots: np.ndarray | None
    layout: Layout
    rows: Tensor | None
    index: Tensor | None
    batch: int
    width: int
    spare: int = 1
    groups: list[tuple[int, Tensor | None, Layout | None, Tensor | None]] = field(
        default_factory=list
    )


@dataclass
class StepInputs:
    """What one step reads besides the batch's buffers, for one shape (see the module
    docstring). `rows`: state rows the step runs over; `live`: rows it takes tokens from;
    `slots`: slots its per-slot tensors cover."""

    rows: int
    live: int
    slots: int
    passes: list[Pass]
    seed: Tensor  # (slots,) the backward's seed: each slot's loss weight (0: a padding slot)
    flags: tuple[bool, bool, bool, bool, bool]  # bias correction, annealing, decay, resets, fluency
    capture: bool = False
    serial: int = -1  # which of a batch's captured shapes these are
    held: dict[str, Tensor] = field(default_factory=dict)  # the tensors a re-plan writes again


@dataclass
class Status:
    """What a step ends in, for the host: each row's token after it (live,) and each slot's
    relaxed loss (slots,). The match check screens the tokens a step later
    (`sodaray.search.soda.screen`)."""

    tokens: Tensor
    loss: Tensor


# ---- planning (on the host, when the batch's composition changes) ------------------------------
def bucket(state: SodaState) -> tuple[int, int]:
    """The bucketed shape of `state`'s batch: (rows, slots). A row more than the live ones at
    least: the guard row's part (an elementwise kernel's scalar tail falls on it), so a
    bucketed step computes each live row as the exact one does."""
    return static_rows(len(state.row_slot) + 1), static_batch(len(state))


def plan_inputs(
    state: SodaState,
    scheduler: Scheduler,
    capture: bool,
    shapes: dict[tuple[int, ...], StepInputs] | None = None,
) -> StepInputs:
    """The inputs of the next steps. `capture`: at a bucketed shape, one pass, written into
    the tensors `shapes` holds for that shape where it holds one (a captured step reads them
    there), else made and kept in `shapes`."""
    model, host = state.model, state.host
    dev, count, total = model.device, len(state), len(state.row_slot)
    p, m = len(model.prefix_ids), state.groups[0][0].output_tokens
    lengths = host["length"]
    fluency = any(state.groups[g][0].fluency_weight > 0 for g in np.unique(host["group"]))
    flags = (*state.flags(), fluency)  # what the step computes besides the fixed arithmetic
    weights = state.loss_weights()
    plans = scheduler.passes(lengths, state.fixed)
    groups = np.unique(host["group"])
    # A captured step is one pass of one objective (a step of several would pick its rows by
    # data); any other plan runs eagerly.
    capture = capture and len(plans) == 1 and len(groups) == 1 and not fluency
    if capture:
        rows, slots = bucket(state)
        width = plans[0].width
        live = rows
    else:
        slots, rows, live = count, total + 1, total
        width = int(lengths.max())
    # Host layout of the slots' rows: padding rows (a bucket's) go to the first padding item.
    row_seq = np.full(live, slots, dtype=np.int64)
    row_seq[:total] = state.row_slot
    row_pos = np.arange(live, dtype=np.int64) % max(width, 1)
    row_pos[:total] = state.row_offset
    slot_len = np.ones(slots, dtype=np.int64)
    slot_len[:count] = lengths
    seed = np.zeros(slots, dtype=np.float32)
    seed[:count] = 1.0 if weights is None else weights
    arrays = {
        "row_seq": row_seq,
        "row_offset": row_pos,
        "lengths": slot_len,
        "seed": seed,
    }
    if capture:  # the layout's derived indices, made here so that a re-plan writes them in place
        seq_rows, seq_pos = observed_positions(slot_len, p, m)
        arrays["row_pos"] = row_pos + p
        arrays["seq_rows"] = np.ascontiguousarray(np.broadcast_to(seq_rows, seq_pos.shape))
        arrays["seq_pos"] = seq_pos
    # A captured step has its objective built in: a shape is one objective group's.
    shape = (rows, slots, width, int(groups[0]))
    old = shapes.get(shape) if capture and shapes is not None else None
    if old is not None:
        _write(old, arrays)
        old.flags = flags
        return old
    t = {name: torch.as_tensor(np.array(a, order="C"), device=dev) for name, a in arrays.items()}
    if capture:
        layout = Layout(t["lengths"], t["row_seq"], t["row_offset"], width)
        layout._derived[("input", p)] = t["row_pos"]
        layout._derived[("observed", p, m)] = (t["seq_rows"][:, :1], t["seq_pos"])
        one = [(int(groups[0]), None, None, None)]
        passes = [Pass(None, layout, None, None, slots, width, spare=0, groups=one)]
    else:
        layout = Layout(t["lengths"], t["row_seq"], t["row_offset"], width)
        passes = _passes(state, layout, plans)
    inputs = StepInputs(
        rows=rows,
        live=live,
        slots=slots,
        passes=passes,
        seed=t["seed"],
        flags=flags,
        capture=capture,
    )
    inputs.held = t
    if capture and shapes is not None:
        inputs.serial = len(shapes)  # a captured step's key: these tensors, while they live
        shapes[shape] = inputs
    return inputs


def _write(inputs: StepInputs, arrays: dict[str, np.ndarray]) -> None:
    """A captured shape's inputs, written where its step reads them."""
    for name, values in arrays.items():
        inputs.held[name].copy_(torch.as_tensor(np.array(values, order="C")), non_blocking=True)


def _passes(state: SodaState, layout: Layout, plans) -> list[Pass]:
    """The scheduler's passes at the slots' own shapes (the exact path's)."""
    dev, count, host = state.model.device, len(state), state.host
    passes = []
    for plan in plans:
        if len(plan.slots) == count:
            sub, rows, idx = layout, None, None
            present = host["group"]
        else:
            idx = torch.as_tensor(plan.slots, device=dev)
            sub, rows = layout.select(idx)
            present = host["group"][plan.slots]
        groups: list[tuple[int, Tensor | None, Layout | None, Tensor | None]] = []
        kinds = np.unique(present)
        if len(kinds) == 1:
            groups.append((int(kinds[0]), None, None, None))
        else:
            for g in kinds:
                gi = torch.as_tensor(np.flatnonzero(present == g), device=dev)
                gl, gr = sub.select(gi, sub.longest)
                groups.append((int(g), gi, gl, gr))
        slots = None if rows is None else plan.slots
        passes.append(Pass(slots, sub, rows, idx, plan.batch, plan.width, 1, groups))
    return passes


# ---- the step ----------------------------------------------------------------------------------
def soda_step(
    state: SodaState, x: StepInputs, precision: str, workspace: Workspace, resetting: bool
) -> Status:
    """One step of every slot, in place, and its status: see the module docstring.
    `resetting`: whether some slot's moments reset after this step (the host knows every
    slot's step count: a step where none does skips the reset's arithmetic)."""
    grad, loss = relaxed_gradient(state, x, precision, workspace)
    with torch.no_grad():
        step = update(state, x, grad)
        # The first largest of each row, as `Tensor.max` takes it: fresh each step, so the
        # host may read a step's tokens while the next one runs.
        tokens = state.rows.view("z", x.live).argmax(-1)
        schedules(state, x, step, resetting)
    return Status(tokens, loss.detach())


def relaxed_gradient(
    state: SodaState, x: StepInputs, precision: str, workspace: Workspace
) -> tuple[Tensor, Tensor]:
    """d loss / d Z for the step's rows (the live rows and the guard or bucket rows after them:
    those take a padding item's input, whose outputs no loss reads), and each slot's loss;
    slots are independent, the batch loss their weighted sum. One transformer pass per
    planned pass, all in one backward."""
    run = state.model.for_precision(precision)
    fluency = x.flags[4]
    z = state.rows.view("z", x.rows)
    tau = state.column("h32", "tau", x.rows)
    leaf = z.detach().requires_grad_(True)
    # The relaxed pass may flush denormals (faster; it moves values below 1.2e-38 only); the
    # screen runs outside it, at the model's own precision, and the confirm on the host.
    with torch.enable_grad(), tf32(precision == "tf32"), flush_denormals(z.device), invariant():
        rows = RelaxedEmbedding.apply(leaf, run.embedding_matrix, tau, workspace)
        rows = run.relaxed_embeds(rows)
        probs = torch.softmax(leaf / tau, dim=-1)[: len(state.row_slot)] if fluency else None
        loss = step_loss(state, x, run, rows, probs)
        # d(sum of w * loss) / d loss is w: seeding the backward with it is the same
        # arithmetic as summing first, without the sum, its seed and the product.
        (grad,) = torch.autograd.grad(loss, leaf, grad_outputs=x.seed.to(loss.dtype))
    return grad, loss.detach()


def step_loss(
    state: SodaState,
    x: StepInputs,
    run: LoadedModel,
    rows: Tensor,
    probs: Tensor | None,
    loss_of: Callable[..., Tensor] = objective_loss,
) -> Tensor:
    """Each slot's loss (x.slots,) from the relaxed input rows (embedded, (rows, d)): one
    transformer pass per planned pass, each slot under its objective (`loss_of`, with
    `objective_loss`'s arguments)."""
    observed = observed_of(state, x.slots)
    continuation = observed.continuation
    loss: Tensor | None = None
    for p in x.passes:
        if p.slots is None:  # one pass holds every slot
            embeds = sequence_embeds(
                run, p.layout, rows, continuation, p.width, p.batch, spare=p.spare
            )
            hidden = run.hidden(embeds, prepadded=True)
            return _pass_loss(state, run, hidden, p, observed, probs, loss_of)
        embeds = sequence_embeds(
            run, p.layout, rows[p.rows], continuation[p.index], p.width, p.batch
        )
        hidden = run.hidden(embeds, prepadded=True)
        sub = observed.select(p.index)
        part = _pass_loss(
            state, run, hidden, p, sub, None if probs is None else probs[p.rows], loss_of
        )
        if loss is None:
            loss = part.new_zeros(x.slots)
        loss = loss.index_put((p.index,), part)
    assert loss is not None
    return loss


@torch.no_grad()
def update(state: SodaState, x: StepInputs, grad: Tensor) -> Tensor:
    """Each row's step count advanced, then Adam (bias-corrected for the slots that ask), then
    the multiplicative decay, in place; `grad` is consumed. Returns the step counts."""
    bias, decays = x.flags[0], x.flags[2]
    step = state.column("hi", "step", x.rows)
    step.add_(1)
    h = lambda name: state.column("h32", name, x.rows)  # noqa: E731
    z = state.rows.view("z", x.rows)
    adam_step(
        z,
        grad,
        state.rows.view("m", x.rows),
        state.rows.view("v", x.rows),
        learning_rate=h("learning_rate"),
        one_minus_beta1=h("one_minus_beta1"),
        one_minus_beta2=h("one_minus_beta2"),
        eps=h("eps"),
        correction=_correction(state, x.rows, step) if bias else None,
    )
    if decays:  # x * 1.0 is x: skipping it where no slot decays is exact
        z.mul_(h("decay"))
    return step


def _pass_loss(
    state: SodaState,
    model: LoadedModel,
    hidden: Tensor,
    p: Pass,
    batch: BatchTargets,
    probs: Tensor | None,
    loss_of: Callable[..., Tensor] = objective_loss,
) -> Tensor:
    """The loss of a pass's slots, each under its own objective (once per objective in it)."""
    if len(p.groups) == 1:
        objective = state.groups[p.groups[0][0]][0]
        return loss_of(model, objective, hidden, p.layout, batch, probs)
    loss = None
    for g, idx, sub, rows in p.groups:
        assert idx is not None and sub is not None and rows is not None
        part = loss_of(
            model,
            state.groups[g][0],
            hidden[idx],
            sub,
            batch.select(idx),
            None if probs is None else probs[rows],
        )
        if loss is None:
            loss = part.new_zeros(p.layout.batch)
        loss = loss.index_put((idx,), part)
    assert loss is not None
    return loss


def _correction(state: SodaState, rows: int, step: Tensor) -> tuple[Tensor, Tensor]:
    """Adam's bias correction per row, (1 - beta1^t, 1 - beta2^t) as float32 columns, t the
    steps since the row's moments were last zeroed (a reset or re-draw period's multiple);
    1 where the slot does not correct. In float64, rounded once: what the host computed."""
    col = lambda name: state.column("hi", name, rows)  # noqa: E731
    before = step - 1
    zeroed = torch.maximum(
        torch.div(before, col("reset"), rounding_mode="floor") * col("reset"),
        torch.div(before, col("reinit"), rounding_mode="floor") * col("reinit"),
    )
    age = (step - zeroed).double()
    on = col("bias").bool()
    first = torch.where(on, 1 - state.column("h64", "beta1", rows) ** age, 1.0)
    second = torch.where(on, 1 - state.column("h64", "beta2", rows) ** age, 1.0)
    return first.float(), second.float()


@torch.no_grad()
def schedules(state: SodaState, x: StepInputs, step: Tensor, resetting: bool) -> None:
    """After a step: the next step's temperature where a slot anneals (geometric from its
    temperature at step 0 to its end at its budget, held there; in float64, rounded once), and
    the moment resets of slots at a multiple of their reset period (`resetting`: some slot is;
    the host knows). A re-draw of Z resets its moments too: that is the host's, with the draw
    (`SodaBatch.redraw`), keyed by seed, sample and draw."""
    rows, anneals, resets = x.rows, x.flags[1], x.flags[3]
    if anneals:
        start = state.column("h64", "temperature", rows)
        end = state.column("h64", "temperature_end", rows)
        budget = state.column("hi", "budget", rows)
        at = torch.minimum(step, budget).double() / budget.double()
        state.column("h32", "tau", rows).copy_(start * (end / start) ** at)
    if resets and resetting:
        zero = torch.remainder(step, state.column("hi", "reset", rows)) == 0
        state.rows.view("m", rows).masked_fill_(zero, 0.0)
        state.rows.view("v", rows).masked_fill_(zero, 0.0)


def padding_rows_from_row0(state: SodaState, start: int, end: int) -> None:
    """Rows [start, end) of the per-row tables take row 0's numbers: a guard or bucket row
    computes like a live one (finite temperature, eps), and its results are dropped."""
    if end <= start or not len(state.row_slot):
        return
    for table in ("h32", "h64", "hi"):
        state.rows.view(table, end)[start:end] = state.rows.view(table, 1)
    if "fs" in state.rows:  # their tau changed: a fused step's carried softmax is stale
        state.rows.view("fs", end)[start:end, 2] = 0.0


__all__ = [
    "Pass",
    "Status",
    "observed_of",
    "StepInputs",
    "plan_inputs",
    "relaxed_gradient",
    "schedules",
    "soda_step",
    "update",
]
