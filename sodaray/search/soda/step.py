"""The SODA step as one function of the persistent batch's buffers: the relaxation, the
transformer passes at their planned shapes, the loss, the backward to Z, Adam and decay (bias
correction on the device), argmax, and the next step's schedules (annealing, moment resets),
ending in a small status (tokens, loss); the match check's screen runs a step later.

No operation here reads a value back to the host or takes a shape from data (but the fluency
penalty's, never captured), so on CUDA a step can be captured once per shape and replayed.

What a step reads besides the buffers (`StepInputs`) is planned on the host when the batch's
composition changes (`plan_inputs`): at the slots' own shapes ("exact": the live rows and a
guard row after them), or at a bucketed shape ("capture": one pass), whose tensors are written
in place so that a captured step finds them where it left them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from sodaray.model.attention import invariant
from sodaray.model.loaded import LoadedModel
from sodaray.objective.scoring import Layout, objective_loss, observed_positions, sequence_embeds
from sodaray.search.adam import adam_step
from sodaray.search.denormals import flush_denormals
from sodaray.search.engine.scheduler import Scheduler, static_batch, static_rows
from sodaray.search.soda.relaxed import RelaxedEmbedding, Workspace, tf32
from sodaray.search.soda.state import H32, SodaState, observed_of

Group = tuple[int, Tensor | None, Layout | None, Tensor | None]  # (group, slots, layout, rows)


@dataclass
class Pass:
    """One transformer pass of a step: its slots (host indices; None: every slot), their
    layout, packed rows and index (None: all), the batch and input width it runs at (padding is
    zeros), `spare` rows after the layout's (the guard row) placed in the first padding item,
    and its objective groups (`Group`; the last three None where it holds one group)."""

    slots: np.ndarray | None
    layout: Layout
    rows: Tensor | None
    index: Tensor | None
    batch: int
    width: int
    spare: int = 1
    groups: list[Group] = field(default_factory=list)


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
    relaxed loss (slots,)."""

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
    lengths, groups = host["length"], np.unique(host["group"])
    fluency = any(state.groups[g][0].fluency_weight > 0 for g in groups)
    flags = (*state.flags(), fluency)  # what the step computes besides the fixed arithmetic
    plans = scheduler.passes(lengths, state.fixed)
    # A captured step is one pass of one objective (a step of several would pick its rows by
    # data); any other plan runs eagerly.
    capture = capture and len(plans) == 1 and len(groups) == 1 and not fluency
    if capture:
        (rows, slots), width = bucket(state), plans[0].width
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
    # Each slot's weight: 1 ("sum", its own loss), or 1 / (its config's slots) for "mean".
    counts = np.bincount(host["config"], minlength=len(state.configs))[host["config"]]
    seed[:count] = np.where(host["mean"], 1.0 / counts, 1.0)
    arrays = {"row_seq": row_seq, "row_offset": row_pos, "lengths": slot_len, "seed": seed}
    if capture:  # the layout's derived indices, made here so that a re-plan writes them in place
        seq_rows, seq_pos = observed_positions(slot_len, p, m)
        arrays["row_pos"] = row_pos + p
        arrays["seq_rows"] = np.ascontiguousarray(np.broadcast_to(seq_rows, seq_pos.shape))
        arrays["seq_pos"] = seq_pos
    # A captured step has its objective built in: a shape is one objective group's.
    shape = (rows, slots, width, int(groups[0]))
    old = shapes.get(shape) if capture and shapes is not None else None
    if old is not None:  # written where its captured step reads them
        for name, values in arrays.items():
            old.held[name].copy_(torch.as_tensor(np.array(values, order="C")), non_blocking=True)
        old.flags = flags
        return old
    t = {name: torch.as_tensor(np.array(a, order="C"), device=dev) for name, a in arrays.items()}
    layout = Layout(t["lengths"], t["row_seq"], t["row_offset"], width)
    if capture:
        layout._derived[("input", p)] = t["row_pos"]
        layout._derived[("observed", p, m)] = (t["seq_rows"][:, :1], t["seq_pos"])
        one = [(int(groups[0]), None, None, None)]
        passes = [Pass(None, layout, None, None, slots, width, spare=0, groups=one)]
    else:
        passes = _passes(state, layout, plans)
    inputs = StepInputs(rows, live, slots, passes, t["seed"], flags, capture, held=t)
    if capture and shapes is not None:
        inputs.serial = len(shapes)  # a captured step's key: these tensors, while they live
        shapes[shape] = inputs
    return inputs


def _passes(state: SodaState, layout: Layout, plans) -> list[Pass]:
    """The scheduler's passes at the slots' own shapes (the exact path's)."""
    dev, count, host = state.model.device, len(state), state.host
    passes = []
    for plan in plans:
        whole = len(plan.slots) == count
        idx = None if whole else torch.as_tensor(plan.slots, device=dev)
        sub, rows = (layout, None) if idx is None else layout.select(idx)
        present = host["group"] if whole else host["group"][plan.slots]
        kinds = np.unique(present)
        groups: list[Group] = [(int(kinds[0]), None, None, None)]
        if len(kinds) > 1:
            at = {int(g): torch.as_tensor(np.flatnonzero(present == g), device=dev) for g in kinds}
            groups = [(g, i, *sub.select(i, sub.longest)) for g, i in at.items()]
        slots, spare = (None, 1) if whole else (plan.slots, 0)
        passes.append(Pass(slots, sub, rows, idx, plan.batch, plan.width, spare, groups))
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
    """d loss / d Z for the step's rows (the guard or bucket rows after the live ones take a
    padding item's input, whose outputs no loss reads), and each slot's loss; the batch loss is
    their weighted sum, one backward through every planned pass."""
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
    cont = observed.continuation

    def one(p: Pass) -> Tensor:
        embeds = sequence_embeds(
            run, p.layout, _pick(rows, p.rows), _pick(cont, p.index), p.width, p.batch, p.spare
        )
        hidden = run.hidden(embeds, prepadded=True)
        batch = observed if p.index is None else observed.select(p.index)
        mine = _pick(probs, p.rows)
        if len(p.groups) == 1:  # each slot under its own objective, once per objective
            return loss_of(run, state.groups[p.groups[0][0]][0], hidden, p.layout, batch, mine)
        parts = (
            (i, loss_of(run, state.groups[g][0], hidden[i], sub, batch.select(i), _pick(mine, r)))
            for g, i, sub, r in p.groups
        )
        return _gathered(p.layout.batch, parts)

    if x.passes[0].slots is None:  # one pass holds every slot
        return one(x.passes[0])
    return _gathered(x.slots, ((p.index, one(p)) for p in x.passes))


def _pick(t: Tensor | None, index: Tensor | None) -> Tensor | None:
    """`t`'s rows at `index` (None: all of them)."""
    return t if t is None or index is None else t[index]


def _gathered(count: int, parts: Iterable[tuple[Tensor | None, Tensor]]) -> Tensor:
    """Per-slot losses (count,) from (slots, their losses) parts."""
    loss = None
    for idx, part in parts:
        if loss is None:
            loss = part.new_zeros(count)
        loss = loss.index_put((idx,), part)
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
    z, m, v = (state.rows.view(name, x.rows) for name in "zmv")
    correction = _correction(state, x.rows, step) if bias else None
    # The table's first columns are Adam's arguments by name (learning rate, 1 - betas, eps).
    adam_step(z, grad, m, v, **{name: h(name) for name in H32[:4]}, correction=correction)
    if decays:  # x * 1.0 is x: skipping it where no slot decays is exact
        z.mul_(h("decay"))
    return step


def _correction(state: SodaState, rows: int, step: Tensor) -> tuple[Tensor, Tensor]:
    """Adam's bias correction per row, (1 - beta1^t, 1 - beta2^t) as float32 columns, t the
    steps since the row's moments were last zeroed (a reset or re-draw period's multiple);
    1 where the slot does not correct. In float64, rounded once: what the host computed."""
    col = lambda name: state.column("hi", name, rows)  # noqa: E731
    before = step - 1
    last = lambda name: torch.div(before, col(name), rounding_mode="floor") * col(name)  # noqa: E731
    age = (step - torch.maximum(last("reset"), last("reinit"))).double()
    on = col("bias").bool()
    beta = lambda name: state.column("h64", name, rows)  # noqa: E731
    first, second = (torch.where(on, 1 - beta(b) ** age, 1.0) for b in ("beta1", "beta2"))
    return first.float(), second.float()


@torch.no_grad()
def schedules(state: SodaState, x: StepInputs, step: Tensor, resetting: bool) -> None:
    """After a step: the next step's temperature where a slot anneals (`annealed`), and the
    moment resets of slots at a multiple of their reset period (`resetting`: some slot is). A
    re-draw of Z, and its moments' reset, is the host's (`SodaBatch.redraw`)."""
    rows, anneals, resets = x.rows, x.flags[1], x.flags[3]
    if anneals:
        state.column("h32", "tau", rows).copy_(annealed(state, rows, step))
    if resets and resetting:
        zero = torch.remainder(step, state.column("hi", "reset", rows)) == 0
        state.rows.view("m", rows).masked_fill_(zero, 0.0)
        state.rows.view("v", rows).masked_fill_(zero, 0.0)


def annealed(state: SodaState, rows: int, step: Tensor) -> Tensor:
    """The next step's temperature per row after `step` steps, (rows, 1) float64 (rounded
    where it is stored): geometric from the start to the end at the budget, held there."""
    start, end = (state.column("h64", name, rows) for name in ("temperature", "temperature_end"))
    budget = state.column("hi", "budget", rows)
    at = torch.minimum(step, budget).double() / budget.double()
    return start * (end / start) ** at


__all__ = ["Pass", "Status", "StepInputs", "observed_of", "plan_inputs", "relaxed_gradient"]
__all__ += ["schedules", "soda_step", "update"]
