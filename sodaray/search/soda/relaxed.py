"""The relaxed input softmax(Z / tau) @ E, forward and backward, in buffers reused every step
(`Workspace`, `RelaxedEmbedding`), and the tf32 switch of the gradient pass."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import Tensor

from sodaray.model.padding import pad_rows, padding_items, rows_invariant
from sodaray.search.adam import Hyper


@contextlib.contextmanager
def tf32(enabled: bool):
    """TF32 CUDA matmuls inside the block only (never for the hard-max check)."""
    if not enabled or not torch.cuda.is_available():
        yield
        return
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


class Workspace:
    """Two (T, V) buffers reused every step (a fresh one is a new mmap whose pages cost as much
    as the softmax), the probabilities and the gradient, with spare rows: a batch reallocates
    only when it outgrows them. `padded` is `probs` with the `pad` zero rows `pad_rows` would
    append for the product with the embedding, kept zero in the buffer (no (T, V) copy)."""

    def __init__(self) -> None:
        self._probs: Tensor | None = None
        self._grad: Tensor | None = None
        self._zeroed: tuple[int, int] | None = None  # buffer rows known to hold zeros
        self.probs: Tensor | None = None
        self.grad: Tensor | None = None
        self.padded: Tensor | None = None

    def fit(self, like: Tensor, pad: int = 0) -> None:
        rows = like.shape[0]
        buf = self._probs
        if buf is None or buf.shape[0] < rows + pad or buf.shape[1:] != like.shape[1:]:
            old = buf.shape[0] if buf is not None else 0
            spare = (max(rows + pad, 2 * old), *like.shape[1:])
            self._probs = like.new_empty(spare)
            self._grad = like.new_empty(spare)
            self._zeroed = None
        assert self._probs is not None and self._grad is not None
        if not pad:
            self._zeroed = None  # this step's probabilities may cover any rows
        elif self._zeroed != (rows, rows + pad):
            self._probs[rows : rows + pad].zero_()
            self._zeroed = (rows, rows + pad)
        self.probs, self.grad = self._probs[:rows], self._grad[:rows]
        self.padded = self._probs[: rows + pad]

    def addresses(self) -> tuple[int, ...]:
        """Where the buffers are (a captured step reads them there)."""
        return tuple(t.data_ptr() for t in (self._probs, self._grad) if t is not None)


def _aten_out(name: str) -> Any:
    """The `out=` overload of an ATen kernel (autograd's own for softmax: bits match
    `torch.softmax`), or None where this torch lacks it (not public API: the public path then;
    `tests/test_soda_kernels.py` fails if the pinned torch lacks it)."""
    try:
        return getattr(torch.ops.aten, name).out
    except (AttributeError, RuntimeError):
        return None


SOFTMAX_OUT = _aten_out("_softmax")
SOFTMAX_BACKWARD_OUT = _aten_out("_softmax_backward_data")


def workspace_pad(z: Tensor, embedding: Tensor) -> int:
    """The zero rows the workspace keeps after the probabilities for the product with the
    embedding (`Workspace.padded`): `pad_rows`'s, where the product reads the workspace
    (the same dtype); none where a bf16 copy is made first."""
    return padding_items(len(z), z.device) if embedding.dtype == z.dtype else 0


class RelaxedEmbedding(torch.autograd.Function):
    """softmax(Z / tau) @ E as one explicit 2-D matmul each way, in the workspace's buffers:
    Z (T, V) packed rows, tau a float or a (T, 1) column. Backward gives dZ only: dP = dX @ E^T,
    then the softmax backward and 1/tau in place, with autograd's own kernels (the same bits)."""

    @staticmethod
    def forward(ctx, z: Tensor, embedding: Tensor, temperature: Hyper, ws: Workspace) -> Tensor:
        same = embedding.dtype == z.dtype  # then the product reads the workspace's zero rows
        ws.fit(z, workspace_pad(z, embedding))
        probs = torch.div(z, temperature, out=ws.probs)
        if SOFTMAX_OUT is not None:
            SOFTMAX_OUT(probs, -1, False, out=probs)
        else:  # the public path: a temporary the size of `probs`, then copied back
            probs.copy_(torch.softmax(probs, -1))
        ctx.save_for_backward(probs, embedding)
        ctx.temperature, ctx.ws = temperature, ws
        padded = ws.padded if same else pad_rows(probs.to(embedding.dtype))
        return (padded @ embedding)[: len(probs)]

    @staticmethod
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor, None, None, None]:
        probs, embedding = ctx.saved_tensors
        g = grad_out.to(embedding.dtype)
        grad = ctx.ws.grad
        if rows_invariant(len(g), g.device) and embedding.dtype == grad.dtype:
            torch.mm(g, embedding.T, out=grad)
        else:  # rows off the rule (padded: see `row_rule`), or a bfloat16 pass: copied in after
            grad.copy_((pad_rows(g) @ embedding.T)[: len(g)])
        if SOFTMAX_BACKWARD_OUT is not None:
            SOFTMAX_BACKWARD_OUT(grad, probs, -1, probs.dtype, grad_input=grad)
        else:  # the public path: dP -> P * (dP - <dP, P>), not bit-identical to the kernel
            grad.sub_(torch.linalg.vecdot(grad, probs).unsqueeze(-1)).mul_(probs)
        # div, not multiply by 1/tau: bit-identical to autograd's, so outcomes do not move.
        return grad.div_(ctx.temperature), None, None, None
