"""Fused full-vocabulary kernels of the CUDA step (Triton), and the bytes of (rows, V) tensors
each launch reads and writes (`VocabTraffic`, what `benchmarks/vocab_passes.py` counts: aten
never sees these kernels). The eager formulas they stand for are in tests/test_fused_kernels.py.

- `softmax_forward`: Q = exp(Z / tau - c) per row, unnormalised, for the rows whose statistics
  are stale only: the others hold what the last `update` left for this Z and tau.
- `update`: the softmax backward (P recomputed from Z and the row's statistics), Adam, decay,
  resets, argmax, and the next step's Q and statistics (shifted by the old max; a row whose
  max moved by more than `DRIFT` is marked stale): one pass over Z, m, v and dP.
- `logits_loss`: the observed-logits objective and its gradient in one pass.

Tensors are CUDA tensors, or CPU tensors under `TRITON_INTERPRET=1` (the tests' way), which
may be set after import (`_kernels` compiles on first use); a vocabulary need not be a multiple
of the block. Z, m, v, dP, P and the logits are row-contiguous; per-row columns may be strided.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

BLOCK = 1024  # vocabulary columns a program holds at once (CUDA)
# Under the interpreter (CPU tensors) each block costs numpy calls: wider blocks, same masks.
CPU_BLOCK = 8192
DRIFT = 16.0  # how far (in Z / tau) a row's max may move from the shift its Q was written at


def available() -> bool:
    """Whether Triton can be imported (the kernels' only requirement beyond torch)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


class VocabTraffic:
    """Bytes of vocabulary-wide operands the kernels read and write while counting is on
    (`counting`); each launch adds its own. Off (None) outside a count: no cost in a step."""

    local = threading.local()

    @classmethod
    def add(cls, name: str, *tensors: Tensor) -> None:
        log = getattr(cls.local, "log", None)
        if log is not None:
            log.append((name, sum(t.numel() * t.element_size() for t in tensors)))


@contextlib.contextmanager
def counting() -> Iterator[list[tuple[str, int]]]:
    """`with counting() as log:` collects (kernel name, bytes) per launch into `log`."""
    VocabTraffic.local.log = log = []
    try:
        yield log
    finally:
        VocabTraffic.local.log = None


# The kernels' Triton sources: plain functions here, jitted by `_kernels` on first use (so that
# `TRITON_INTERPRET` may be set after import), reading `tl`, which `_kernels` binds.
tl: Any = None


def _forward_kernel(z_ptr, tau_ptr, tau_stride, st_ptr, out_ptr, V, B: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    if tl.load(st_ptr + r * 4 + 2) != 1.0:  # stale: statistics online, then Q
        tau = tl.load(tau_ptr + r * tau_stride)
        mx = -float("inf")
        s = 0.0
        for start in range(0, V, B):
            c = start + tl.arange(0, B)
            x = tl.load(z_ptr + r * V + c, mask=c < V, other=-float("inf")) / tau
            new = tl.maximum(mx, tl.max(x, 0))
            s = s * tl.exp(mx - new) + tl.sum(tl.exp(x - new), 0)
            mx = new
        for start in range(0, V, B):
            c = start + tl.arange(0, B)
            z = tl.load(z_ptr + r * V + c, mask=c < V, other=0.0)
            q = tl.exp(z / tau - mx)
            tl.store(out_ptr + r * V + c, q.to(out_ptr.dtype.element_ty), mask=c < V)
        tl.store(st_ptr + r * 4, mx)
        tl.store(st_ptr + r * 4 + 1, s)
        tl.store(st_ptr + r * 4 + 2, 1.0)
        tl.store(st_ptr + r * 4 + 3, mx)


def _update_kernel(
    z_ptr, m_ptr, v_ptr, dp_ptr, st_ptr, rd_ptr, tok_ptr, q_ptr,
    col_ptr, col_stride,  # h32 columns: lr, 1 - beta1, 1 - beta2, eps, tau, decay
    tn_ptr, tn_stride, c1_ptr, c2_ptr, zero_ptr, V, drift,
    HAS_CORR: tl.constexpr, HAS_DECAY: tl.constexpr, HAS_RESET: tl.constexpr,
    B: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0).to(tl.int64)
    row = col_ptr + r * col_stride
    lr = tl.load(row)
    w1 = tl.load(row + 1)
    w2 = tl.load(row + 2)
    eps = tl.load(row + 3)
    tau = tl.load(row + 4)
    decay = tl.load(row + 5)
    tn = tl.load(tn_ptr + r * tn_stride)
    mx = tl.load(st_ptr + r * 4)  # the shift of this step's Q
    s = tl.load(st_ptr + r * 4 + 1)
    shift = tl.load(st_ptr + r * 4 + 3) * (tau / tn)  # this Z's max, at the next tau
    rd = tl.load(rd_ptr + r)
    stp = lr
    root2 = 1.0
    if HAS_CORR:
        stp = lr / tl.load(c1_ptr + r)
        root2 = tl.sqrt(tl.load(c2_ptr + r))
    zero = 0
    if HAS_RESET:
        zero = tl.load(zero_ptr + r)
    best = -float("inf")
    idx = 0
    nmx = -float("inf")
    ns = 0.0
    for start in range(0, V, B):
        c = start + tl.arange(0, B)
        inside = c < V
        at = r * V + c
        z = tl.load(z_ptr + at, mask=inside, other=0.0)
        m = tl.load(m_ptr + at, mask=inside, other=0.0)
        v = tl.load(v_ptr + at, mask=inside, other=0.0)
        dp = tl.load(dp_ptr + at, mask=inside, other=0.0).to(tl.float32)
        p = tl.exp(z / tau - mx) / s
        g = p * (dp - rd) / tau
        # torch's lerp, both its branches (exact at either end of the weight)
        m = tl.where(w1 < 0.5, m + w1 * (g - m), g - (g - m) * (1 - w1))
        g2 = g * g
        v = tl.where(w2 < 0.5, v + w2 * (g2 - v), g2 - (g2 - v) * (1 - w2))
        denom = tl.sqrt(v)
        if HAS_CORR:
            denom = denom / root2
        denom = denom + eps
        z = z + -(m / denom) * stp
        if HAS_DECAY:
            z = z * decay
        if HAS_RESET:
            m = tl.where(zero != 0, 0.0, m)
            v = tl.where(zero != 0, 0.0, v)
        tl.store(z_ptr + at, z, mask=inside)
        tl.store(m_ptr + at, m, mask=inside)
        tl.store(v_ptr + at, v, mask=inside)
        zz = tl.where(inside, z, -float("inf"))
        top = tl.max(zz, 0)
        where = tl.argmax(zz, 0)  # the first largest, as `Tensor.argmax` takes it
        idx = tl.where(top > best, where + start, idx)
        best = tl.maximum(best, top)
        x = zz / tn
        nmx = tl.maximum(nmx, tl.max(x, 0))
        q = tl.exp(x - shift)
        tl.store(q_ptr + at, q.to(q_ptr.dtype.element_ty), mask=inside)
        ns += tl.sum(q, 0)
    tl.store(tok_ptr + r, idx.to(tl.int64))
    tl.store(st_ptr + r * 4, shift)
    tl.store(st_ptr + r * 4 + 1, ns)
    tl.store(st_ptr + r * 4 + 2, tl.where(tl.abs(nmx - shift) < drift, 1.0, 0.0))
    tl.store(st_ptr + r * 4 + 3, nmx)


def _loss_kernel(
    pred_ptr, obs_ptr, loss_ptr, delta, scale, V, HUBER: tl.constexpr, B: tl.constexpr
):
    r = tl.program_id(0).to(tl.int64)
    acc = 0.0
    for start in range(0, V, B):
        c = start + tl.arange(0, B)
        inside = c < V
        pred = tl.load(pred_ptr + r * V + c, mask=inside, other=0.0).to(tl.float32)
        obs = tl.load(obs_ptr + r * V + c, mask=inside, other=0.0)
        d = pred - obs
        if HUBER:
            a = tl.abs(d)
            each = tl.where(a < delta, 0.5 * d * d, delta * (a - 0.5 * delta))
            g = tl.minimum(tl.maximum(d, -delta), delta)
        else:
            each = d * d
            g = 2.0 * d
        acc += tl.sum(tl.where(inside, each, 0.0), 0)
        tl.store(pred_ptr + r * V + c, (g * scale).to(pred_ptr.dtype.element_ty), mask=inside)
    tl.store(loss_ptr + r, acc)


@functools.cache
def _kernels() -> tuple[Any, Any, Any]:
    """The three kernels (forward, update, loss), jitted under the interpreter setting of now."""
    global tl
    import triton
    import triton.language

    tl = triton.language
    return tuple(triton.jit(f) for f in (_forward_kernel, _update_kernel, _loss_kernel))


def _launch(kernel: Any, rows: int, *args: Any, **constants: Any) -> None:
    """One program per row (none where there are no rows), at the device's block width. A
    counter of aten operations skips what runs inside (`VocabTraffic.local.inside`: Triton's
    interpreter copies the operands with aten ops; `VocabTraffic` counts the kernel's own)."""
    if rows:
        VocabTraffic.local.inside = True
        try:
            kernel[(rows,)](*args, **constants, B=BLOCK if args[0].is_cuda else CPU_BLOCK)
        finally:
            VocabTraffic.local.inside = False


def _rows_ok(*tensors: Tensor) -> None:
    for t in tensors:
        if t.stride(-1) != 1 or (t.dim() == 2 and t.stride(0) != t.shape[1]):
            raise ValueError("fused kernels take row-contiguous (rows, V) tensors")


# ---- the forward softmax -----------------------------------------------------------------------
def softmax_forward(z: Tensor, tau: Tensor, stats: Tensor, out: Tensor) -> Tensor:
    """The stale rows' Q = exp(z / tau - max) into `out` (rows, V) at its dtype, and their
    statistics into `stats` (rows, 4: shift, sum, fresh, max; fresh then 1); `tau` a (rows, 1)
    column. Fresh rows are left as they are. P = out / stats[:, 1:2]."""
    _rows_ok(z, out, stats)
    if stats.shape[-1] != 4:
        raise ValueError("stats has four columns: shift, sum, fresh, max")
    rows, vocab = z.shape
    forward, _, _ = _kernels()
    if getattr(VocabTraffic.local, "log", None) is not None:  # counting only: a host read
        stale = int((stats[:, 2] != 1.0).sum())
        if stale:
            VocabTraffic.add("softmax_forward, stale rows (Z read twice)", z[:stale], z[:stale])
            VocabTraffic.add("softmax_forward, stale rows (Q write)", out[:stale])
    _launch(forward, rows, z, tau, tau.stride(0), stats, out, vocab)
    return out


# ---- the backward, Adam, decay, resets, argmax -------------------------------------------------
def update(
    z: Tensor, m: Tensor, v: Tensor, dp: Tensor, stats: Tensor, rowdot: Tensor, h32: Tensor,
    tau_next: Tensor, tokens: Tensor, q: Tensor, *,
    correction: tuple[Tensor, Tensor] | None = None, decay: bool = False,
    zero: Tensor | None = None,
) -> None:  # fmt: skip
    """In place: Z, m, v one SODA update from dP = dL/dP (rows, V), `rowdot` = <dP, P> (rows,),
    `h32` the state's (rows, 6) table (`state.H32`); `stats` (`softmax_forward`'s) replaced by
    the new Z's at `tau_next` (rows, 1), whose Q goes to `q`; `tokens` (rows,) int64 gets each
    row's argmax. `correction`: float32 per row; `decay`: multiply by the decay column; `zero`:
    (rows,) nonzero where the moments reset after it."""
    _rows_ok(z, m, v, dp, stats, q)
    if h32.stride(-1) != 1 or h32.shape[-1] != 6:
        raise ValueError("update takes the (rows, 6) h32 table")
    rows, vocab = z.shape
    _, kernel, _ = _kernels()
    c1, c2 = correction if correction is not None else (rowdot, rowdot)
    rowdot, c1, c2 = rowdot.contiguous(), c1.contiguous(), c2.contiguous()
    _launch(
        kernel, rows, z, m, v, dp, stats, rowdot, tokens, q, h32, h32.stride(0),
        tau_next, tau_next.stride(0), c1, c2, rowdot if zero is None else zero, vocab, DRIFT,
        HAS_CORR=correction is not None, HAS_DECAY=decay, HAS_RESET=zero is not None,
    )  # fmt: skip
    VocabTraffic.add("update (Z, m, v, dP read)", z, m, v, dp)
    VocabTraffic.add("update (Z, m, v, next Q write)", z, m, v, q)


# ---- the objective -----------------------------------------------------------------------------
def logits_loss(
    pred: Tensor, observed: Tensor, *, huber: bool, delta: float, entries: int
) -> Tensor:
    """Each row's summed loss (rows,) float32 of predicted logits `pred` (rows, V) against
    `observed` (rows, V) float32; `pred` then holds the gradient of (the row's loss summed /
    `entries`) in its own dtype. Huber with `delta`, or the squared error."""
    _rows_ok(pred, observed)
    rows, vocab = pred.shape
    out = torch.empty(rows, dtype=torch.float32, device=pred.device)
    _, _, kernel = _kernels()
    _launch(kernel, rows, pred, observed, out, float(delta), 1.0 / entries, vocab, huber)
    VocabTraffic.add("logits_loss (logits, observed read)", pred, observed)
    VocabTraffic.add("logits_loss (gradient write)", pred)
    return out
