"""The SODA step with its full-vocabulary passes fused (`sodaray.search.soda.kernels`'s Triton
kernels): the CUDA path's alternative to `step.soda_step`, behind the `fused` setting.

The last step's update kernel left each row's unnormalised probabilities Q (at the GEMM's dtype)
and their sum in `SodaState`'s `q` and `fs` tables; the forward kernel recomputes them only for
rows whose Z or tau changed since. X = (Q @ E) / sum is the autograd leaf (the model and the
loss as in `step.step_loss`); dP = dX @ E^T is one GEMM and <dP, P> is <dX, X>; then one kernel
does the softmax backward, 1/tau, Adam, decay, resets and argmax, and writes the next step's Q
at the next temperature. Observed-logits objectives (raw space, Huber or squared error) take
the fused loss kernel (`FusedLogitsLoss`); any other objective its eager form.

Trajectories follow the eager step's formulas but not its bits, so the CPU path stays eager
(`bits_digest.py`) and a fused step runs only where `resolve` says so. Like the eager step it
reads nothing back to the host, so on CUDA it can be captured.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

from sodaray.model.attention import invariant
from sodaray.model.loaded import LoadedModel
from sodaray.objective.objectives import Objective
from sodaray.objective.observations import BatchTargets
from sodaray.objective.scoring import Layout, objective_loss, observed_hidden
from sodaray.search.denormals import flush_denormals
from sodaray.search.soda import kernels as fused
from sodaray.search.soda.relaxed import tf32
from sodaray.search.soda.state import SodaState
from sodaray.search.soda.step import Status, StepInputs, _correction, annealed, step_loss

SETTINGS = ("off", "auto", "on")


def resolve(setting: str, device: torch.device) -> bool:
    """Whether a batch on `device` takes the fused step: `off` never; `auto` on CUDA where
    Triton imports; `on` wherever the kernels can run (CUDA, or a CPU under
    `TRITON_INTERPRET=1`), else a ValueError."""
    if setting not in SETTINGS:
        raise ValueError(f"fused must be one of {', '.join(SETTINGS)}, not {setting!r}")
    if setting == "off":
        return False
    if setting == "auto":
        return device.type == "cuda" and fused.available()
    if not fused.available():
        raise ValueError("fused: on needs the triton package")
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("fused: on needs a CUDA device (or TRITON_INTERPRET=1 on a CPU)")
    return True


class FusedWorkspace:
    """The (rows, V) buffer of a fused step's dP at the GEMM's dtype, with spare rows
    (reallocated only when a batch outgrows it)."""

    def __init__(self) -> None:
        self._dp: Tensor | None = None

    def fit(self, rows: int, like: Tensor) -> Tensor:
        """The dP buffer (rows, V) of `like`'s dtype and device (`like`: E, (V, d))."""
        vocab = like.shape[0]
        buf = self._dp
        if buf is None or buf.shape[0] < rows or buf.shape[1] != vocab or buf.dtype != like.dtype:
            old = buf.shape[0] if buf is not None else 0
            self._dp = buf = like.new_empty((max(rows, 2 * old), vocab))
        return buf[:rows]

    def addresses(self) -> tuple[int, ...]:
        """Where the buffer is (a captured step reads it there)."""
        return () if self._dp is None else (self._dp.data_ptr(),)


class FusedLogitsLoss(torch.autograd.Function):
    """Each slot's observed-logits loss (B,) from its final states `h` (B, m, d): the logits
    h @ W^T, then the loss and its gradient (kept in the logits' buffer) in one kernel pass;
    the backward is dlogits @ W, scaled per slot on the narrow side."""

    @staticmethod
    def forward(ctx, h: Tensor, weight: Tensor, observed: Tensor, huber: bool, delta: float):
        b, m, d = h.shape
        vocab = weight.shape[0]
        logits = h.reshape(-1, d) @ weight.T
        rows = fused.logits_loss(
            logits, observed.reshape(-1, vocab), huber=huber, delta=delta, entries=m * vocab
        )
        ctx.save_for_backward(logits, weight)
        ctx.shape = (b, m, d)
        return rows.view(b, m).sum(1) / (m * vocab)

    @staticmethod
    def backward(ctx, grad: Tensor):
        dlogits, weight = ctx.saved_tensors
        b, m, d = ctx.shape
        dh = (dlogits @ weight).view(b, m, d) * grad.to(dlogits.dtype)[:, None, None]
        return dh, None, None, None, None


def _fusable(model: LoadedModel, objective: Objective, batch: BatchTargets) -> Tensor | None:
    """The unembedding weight where the objective's loss can take the fused kernel, else None."""
    plain = objective.kind == "logits" and objective.top_k is None and objective.space == "raw"
    plain = plain and objective.fluency_weight == 0 and model.split_forward
    if not plain or batch.observed_values is None:
        return None
    head = model.model.get_output_embeddings()
    if getattr(head, "bias", None) is not None or not isinstance(head, torch.nn.Linear):
        return None
    observed = batch.observed_values
    if observed.shape[-1] != head.weight.shape[0] or observed.dtype != torch.float32:
        return None
    return head.weight


def fused_loss(
    model: LoadedModel,
    objective: Objective,
    hidden: Tensor,
    layout: Layout,
    batch: BatchTargets,
    probs: Tensor | None = None,
) -> Tensor:
    """`scoring.objective_loss`, through the fused kernel where the objective allows."""
    weight = _fusable(model, objective, batch)
    if weight is None:
        return objective_loss(model, objective, hidden, layout, batch, probs)
    h = observed_hidden(model, layout, hidden, objective.output_tokens)
    assert batch.observed_values is not None
    observed = batch.observed_values.contiguous()
    return FusedLogitsLoss.apply(
        h.to(weight.dtype), weight, observed, objective.loss == "huber", objective.huber_delta
    )


def fused_soda_step(
    state: SodaState, x: StepInputs, precision: str, ws: FusedWorkspace, resetting: bool
) -> Status:
    """`step.soda_step` with the fused kernels (see the module docstring). The fluency
    penalty (which needs P's gradient) is the eager step's alone."""
    if x.flags[4]:
        raise ValueError("the fused step has no fluency penalty: run the eager step")
    run = state.model.for_precision(precision)
    embedding = run.embedding_matrix
    z = state.rows.view("z", x.rows)
    h32 = state.rows.view("h32", x.rows)
    stats = state.rows.view("fs", x.rows)
    tau = state.column("h32", "tau", x.rows)
    q = state.rows.view("q", x.rows)
    dp = ws.fit(x.rows, embedding)
    with torch.no_grad(), tf32(precision == "tf32"):
        fused.softmax_forward(z, tau, stats, q)  # the rows the last step left stale
        mixed = (torch.mm(q, embedding).float() / stats[:, 1:2]).to(embedding.dtype)
    leaf = mixed.detach().requires_grad_(True)
    with torch.enable_grad(), tf32(precision == "tf32"), flush_denormals(z.device), invariant():
        loss = step_loss(state, x, run, run.relaxed_embeds(leaf), None, fused_loss)
        (dx,) = torch.autograd.grad(loss, leaf, grad_outputs=x.seed.to(loss.dtype))
    with torch.no_grad(), tf32(precision == "tf32"):
        # <dP, P> = <dX E^T, P> = <dX, P E> = <dX, X>: no vocabulary pass.
        rowdot = (dx.float() * mixed.float()).sum(-1)
        torch.mm(dx, embedding.T, out=dp)
        step = state.column("hi", "step", x.rows)
        step.add_(1)
        bias, anneals, decays, resets = x.flags[:4]
        tau_next = annealed(state, x.rows, step).float() if anneals else tau
        zero = None
        if resets and resetting:
            zero = (torch.remainder(step, state.column("hi", "reset", x.rows)) == 0).int().view(-1)
        tokens = torch.empty(x.rows, dtype=torch.int64, device=z.device)
        m, v = (state.rows.view(name, x.rows) for name in "mv")
        correction = _correction(state, x.rows, step) if bias else None
        last = dict(correction=correction, decay=decays, zero=zero)
        fused.update(z, m, v, dp, stats, rowdot, h32, tau_next, tokens, q, **last)
        if anneals:
            tau.copy_(tau_next)
    return Status(tokens[: x.live], loss.detach())


def invalidate(state: SodaState, rows: Tensor | slice | None = None) -> None:
    """Mark rows' carried softmax (Q and its statistics) stale, where Z or tau changed outside
    a fused step: the next forward recomputes them. None: every row."""
    if "fs" not in state.rows:
        return
    table = state.rows.view("fs", state.rows.capacity)  # bucket rows past the guard too
    table[slice(None) if rows is None else rows, 2] = 0.0


__all__ = ["FusedWorkspace", "SETTINGS", "fused_soda_step", "invalidate", "resolve"]
