"""The fused CUDA-path kernels (`sodaray.search.soda.kernels`) against the eager formulas they stand
for, run on CPU tensors by Triton's interpreter: odd vocabularies (not a multiple of the
block), odd row counts, strided per-row columns, every optional part on and off."""

from __future__ import annotations

import os

# Before the kernels are first compiled (`fused._kernels` does it on first use).
os.environ["TRITON_INTERPRET"] = "1"

import pytest
import torch
from torch import Tensor

pytest.importorskip("triton")

from sodaray.search.adam import adam_step  # noqa: E402
from sodaray.search.soda import kernels as fused  # noqa: E402


# The eager formulas the kernels stand for (test-only: the package runs the kernels).
def softmax_forward_reference(z: Tensor, tau: Tensor) -> tuple[Tensor, Tensor]:
    """The eager formula (`RelaxedEmbedding.forward`): the probabilities, and each row's
    (max of z / tau, sum of exp(z / tau - max)), (rows, 2)."""
    x = z / tau
    mx = x.max(-1, keepdim=True).values
    return torch.softmax(x, -1), torch.cat([mx, torch.exp(x - mx).sum(-1, keepdim=True)], 1)


def update_reference(
    z: Tensor, m: Tensor, v: Tensor, dp: Tensor, probs: Tensor, rowdot: Tensor, h32: Tensor, *,
    correction: tuple[Tensor, Tensor] | None = None, decay: bool = False,
    zero: Tensor | None = None,
) -> Tensor:  # fmt: skip
    """The eager step's formulas on the same operands (in place; returns the argmax): the
    public softmax backward (`RelaxedEmbedding.backward`'s), the division by tau, `adam_step`,
    the decay and the moment resets (`step.update`, `step.schedules`)."""
    col = lambda i: h32[:, i : i + 1]  # noqa: E731
    grad = dp.float().sub(rowdot[:, None]).mul_(probs).div_(col(4))
    adam_step(
        z,
        grad,
        m,
        v,
        learning_rate=col(0),
        one_minus_beta1=col(1),
        one_minus_beta2=col(2),
        eps=col(3),
        correction=correction,
    )
    if decay:
        z.mul_(col(5))
    if zero is not None:
        m.masked_fill_(zero[:, None] != 0, 0.0)
        v.masked_fill_(zero[:, None] != 0, 0.0)
    return z.argmax(-1)


def logits_loss_reference(
    pred: Tensor, observed: Tensor, *, huber: bool, delta: float
) -> tuple[Tensor, Tensor]:
    """The eager objective (`LogitsObservation.loss`) per row (summed, rows,) and the gradient
    of the rows' summed losses, by autograd."""
    leaf = pred.float().detach().requires_grad_(True)
    with torch.enable_grad():
        if huber:
            each = torch.nn.functional.huber_loss(leaf, observed, reduction="none", delta=delta)
        else:
            each = (leaf - observed).square()
        loss = each.sum(-1)
        (grad,) = torch.autograd.grad(loss.sum(), leaf)
    return loss.detach(), grad


RTOL = 1e-6
BF16 = 2**-7  # one bfloat16 step: the interpreter's float32 -> bfloat16 cast may round down
SHAPES = [(1, 7), (3, 1023), (5, 2 * fused.CPU_BLOCK + 37)]


def _close(got, want, rtol=RTOL, atol=1e-7):
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol)


def _h32(rows: int, g: torch.Generator) -> torch.Tensor:
    """A (rows, 6) table inside a wider one (a row stride of 8): lr, 1 - b1, 1 - b2, eps,
    tau, decay, rows differing."""
    wide = torch.rand(rows, 8, generator=g)
    t = wide[:, :6]
    t[:, 0] = 0.01 + 0.1 * t[:, 0]
    t[:, 1] = 0.05 + 0.6 * t[:, 1]  # both branches of lerp
    t[:, 2] = 0.005 + 0.6 * t[:, 2]
    t[:, 3] = 1e-8
    t[:, 4] = 0.03 + 0.5 * t[:, 4]
    t[:, 5] = 0.9 + 0.1 * t[:, 5]
    return t


@pytest.mark.parametrize("rows, vocab", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_softmax_forward_matches_eager(rows, vocab, dtype):
    """Stale rows get Q = exp(z / tau - max) and (max, sum, fresh, max); a fresh row (the
    last, where there are several) is left as it is."""
    g = torch.Generator().manual_seed(rows * vocab)
    z = torch.randn(rows, vocab, generator=g) * 3
    tau = _h32(rows, g)[:, 4:5]
    want, stats_want = softmax_forward_reference(z, tau)
    stats = torch.zeros(rows, 4)
    out = torch.full((rows, vocab), -1.0, dtype=dtype)
    stale = rows - 1 if rows > 1 else rows
    stats[stale:, 2] = 1.0
    fused.softmax_forward(z, tau, stats, out)
    got = out[:stale].float() / stats[:stale, 1:2]
    _close(got, want[:stale], rtol=RTOL if dtype == torch.float32 else BF16, atol=1e-7)
    _close(stats[:stale, [0, 1]], stats_want[:stale])
    _close(stats[:stale, 3], stats_want[:stale, 0])
    assert (stats[:, 2] == 1.0).all()
    assert (out[stale:] == -1.0).all() and (stats[stale:, [0, 1, 3]] == 0).all()


@pytest.mark.parametrize("rows, vocab", SHAPES)
@pytest.mark.parametrize(
    "correct, decay, reset", [(False, False, False), (False, True, True), (True, True, False)]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_update_matches_eager(rows, vocab, correct, decay, reset, dtype):
    g = torch.Generator().manual_seed(7 * rows + vocab)
    h32 = _h32(rows, g)
    tau, tau_next = h32[:, 4:5], h32[:, 4:5] * 0.9
    z = torch.randn(rows, vocab, generator=g) * 2
    m = torch.randn(rows, vocab, generator=g) * 1e-2
    v = torch.rand(rows, vocab, generator=g) * 1e-3
    probs, stats = softmax_forward_reference(z, tau)
    dp = (torch.randn(rows, vocab, generator=g) * 5).to(dtype)
    rowdot = (dp.float() * probs).sum(-1)
    correction = None
    if correct:
        t = torch.arange(1, rows + 1, dtype=torch.float64)[:, None]
        correction = ((1 - 0.9**t).float(), (1 - 0.995**t).float())
    zero = (torch.arange(rows) % 2 == 0).to(torch.int64) if reset else None
    ref = [t.clone() for t in (z, m, v)]
    tokens_want = update_reference(
        *ref, dp, probs, rowdot, h32, correction=correction, decay=decay, zero=zero
    )
    st = torch.cat([stats, torch.ones(rows, 1), stats[:, :1]], 1)
    tokens = torch.full((rows,), -1, dtype=torch.int64)
    q = torch.empty(rows, vocab, dtype=dtype)
    fused.update(
        z, m, v, dp, st, rowdot, h32, tau_next, tokens, q,
        correction=correction, decay=decay, zero=zero,
    )  # fmt: skip
    for got, want in zip((z, m, v), ref, strict=True):
        # P by another exp and a division (torch multiplies by 1 / sum), through Adam's lerps
        # and square: up to ~15 float32 steps where P is large
        _close(got, want, rtol=4e-6)
    assert torch.equal(tokens, tokens_want)
    # The next step's Q and statistics: shifted by the old max at the new tau.
    p_next, next_stats = softmax_forward_reference(ref[0], tau_next)
    shift = stats[:, 0] * (tau[:, 0] / tau_next[:, 0])
    _close(st[:, 0], shift)
    _close(st[:, 3], next_stats[:, 0])
    # exp(x - shift) / its sum against exp(x - max) / its sum: a few float32 steps apart
    _close(q.float() / st[:, 1:2], p_next, rtol=4e-6 if dtype == torch.float32 else BF16)
    assert (st[:, 2] == 1.0).all()


def test_update_marks_a_row_stale_when_its_max_drifts():
    """A row whose max moves by DRIFT or more from the shift its Q is written at is left for
    the forward to redo (its Q could overflow or underflow)."""
    vocab = 40
    h32 = torch.tensor([[1e-30, 0.1, 0.1, 1.0, 1.0, 1.0]] * 2)
    z = torch.zeros(2, vocab)
    z[0, 3] = fused.DRIFT + 1  # moved since its statistics
    z[1, 3] = fused.DRIFT - 1
    st = torch.tensor([[0.0, 1.0, 1.0, 0.0]] * 2)
    zero = torch.zeros(2, vocab)
    tokens = torch.empty(2, dtype=torch.int64)
    q = torch.empty(2, vocab)
    fused.update(z, zero.clone(), zero.clone(), zero.clone(), st, torch.zeros(2), h32,
                 h32[:, 4:5], tokens, q)  # fmt: skip
    assert st[:, 2].tolist() == [0.0, 1.0]


def test_update_argmax_takes_the_first_largest_across_blocks():
    vocab = 2 * fused.CPU_BLOCK + 5
    z = torch.zeros(1, vocab)
    h32 = torch.tensor([[1e-30, 0.1, 0.1, 1.0, 1.0, 1.0]])  # a step too small to move Z
    z[0, [3, fused.CPU_BLOCK + 1, vocab - 1]] = 5.0
    probs, stats = softmax_forward_reference(z, h32[:, 4:5])
    tokens = torch.empty(1, dtype=torch.int64)
    st = torch.cat([stats, torch.ones(1, 1), stats[:, :1]], 1)
    zero = torch.zeros(1, vocab)
    fused.update(z, zero.clone(), zero.clone(), zero.clone(), st, torch.zeros(1), h32,
                 h32[:, 4:5], tokens, zero.clone())  # fmt: skip
    assert tokens.tolist() == [3]


@pytest.mark.parametrize("rows, vocab", SHAPES)
@pytest.mark.parametrize("huber", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logits_loss_matches_eager(rows, vocab, huber, dtype):
    g = torch.Generator().manual_seed(rows + vocab)
    pred = (torch.randn(rows, vocab, generator=g) * 2).to(dtype)
    observed = torch.randn(rows, vocab, generator=g) * 2
    delta = 0.7
    want, grad_want = logits_loss_reference(pred, observed, huber=huber, delta=delta)
    entries = 3 * vocab
    got = fused.logits_loss(pred, observed, huber=huber, delta=delta, entries=entries)
    _close(got, want, rtol=1e-5)  # a sum of `vocab` terms, in another order
    _close(pred.float(), grad_want / entries, rtol=RTOL if dtype == torch.float32 else BF16)


def test_traffic_is_counted_per_launch():
    """The forward counts its stale rows only (Z twice, Q once); the update its operands."""
    z = torch.randn(3, 50)
    out = torch.empty_like(z)
    stats = torch.zeros(3, 4)
    stats[2] = torch.tensor([0.0, 1.0, 1.0, 0.0])  # one fresh row
    with fused.counting() as log:
        fused.softmax_forward(z, torch.ones(3, 1), stats, out)
        fused.update(z, z.clone(), z.clone(), z.clone(), stats, torch.zeros(3),
                     torch.ones(3, 6), torch.ones(3, 1), torch.empty(3, dtype=torch.int64),
                     out)  # fmt: skip
    assert log == [
        ("softmax_forward, stale rows (Z read twice)", 800),
        ("softmax_forward, stale rows (Q write)", 400),
        ("update (Z, m, v, dP read)", 2400),
        ("update (Z, m, v, next Q write)", 2400),
    ]


def test_kernels_refuse_strided_rows():
    z = torch.randn(4, 20)[:, :10]
    with pytest.raises(ValueError, match="row-contiguous"):
        fused.softmax_forward(z, torch.ones(4, 1), torch.zeros(4, 4), torch.empty(4, 10))


# ---- the fused step against the eager one, on a real model -------------------------------------
@pytest.fixture(scope="module")
def stories():
    from conftest import STORIES

    import sodaray

    if not STORIES.is_dir():
        pytest.skip("../shared/models/stories260K is not present")
    return sodaray.load_model(str(STORIES), device="cpu")


@pytest.mark.parametrize("bucketed, loss", [(False, "mse"), (True, "huber")])
def test_fused_step_follows_the_eager_step(stories, bucketed, loss):
    """Eight steps of a batch of mixed lengths under the fused step and under the eager one,
    every optional part on (bias correction, annealing, decay, a reset every 3 steps, a
    re-draw every 5), each fused step taken from the eager batch's state (SODA is chaotic: a
    last-bit difference grows, so trajectories are compared a step at a time): Z, m, v, the
    temperatures, tokens and losses agree to rounding, and the statistics the fused step
    carries to the next are those of its new Z at the next temperature."""
    import numpy as np

    import sodaray
    from sodaray.objective.objectives import Objective
    from sodaray.search.engine.base import SlotEntry
    from sodaray.search.soda.batch import SodaBatch
    from sodaray.search.soda.fused_step import invalidate

    cfg = sodaray.SodaConfig(
        bias_correction=True, temperature_end=0.02, max_steps=8, reset_period=3,
        reinit_period=5, seed=3,
    )  # fmt: skip
    tokens = [[5, 9, 11], [3, 4], [7, 200, 31], [400]]
    targets = sodaray.make_targets(stories, tokens, objective=Objective(loss=loss))
    batches = []
    for fused_setting in ("off", "on"):
        batch = SodaBatch(stories, bucketed=bucketed, fused=fused_setting)
        batch.add([SlotEntry(targets, i, len(t), cfg) for i, t in enumerate(tokens)])
        batches.append(batch)
    eager, fast = batches
    assert fast.fused and not eager.fused and "fs" in fast.state.rows
    rows = len(eager.state.rows["z"])
    compared = 0
    for step in range(1, 9):
        for name in ("z", "m", "v", "h32", "hi"):
            fast.state.rows[name].copy_(eager.state.rows[name])
        invalidate(fast.state)
        outs = [b.step(np.full(4, step)) for b in batches]
        for name in ("z", "m", "v", "h32"):
            got, want = fast.state.rows[name], eager.state.rows[name]
            # Adam divides by sqrt(v) + eps: where a gradient is near eps (just after a reset or
            # a re-draw) a rounding-level difference in it moves a few entries by a fraction of
            # the learning rate (0.065); a formula's error moves most of them.
            assert float((got - want).abs().max()) < 0.01, f"{name} {step}"
            close = torch.isclose(got, want, rtol=1e-4, atol=1e-6)
            assert float(close.float().mean()) > 0.97, f"{name} {step}"
        if step in (4, 5):  # 5 re-draws: the statistics carried from step 5 are stale
            fresh = fast.state.rows["fs"][:rows, 2]
            assert bool((fresh == 1.0).all()) == (step == 4)
        stats = fast.state.rows["fs"][:rows]
        tau = fast.state.column("h32", "tau", rows)
        fresh = stats[:, 2] == 1.0
        p_next = softmax_forward_reference(fast.state.rows["z"], tau)[0]
        q = fast.state.rows["q"][:rows].float() / stats[:, 1:2]
        torch.testing.assert_close(q[fresh], p_next[fresh], rtol=1e-5, atol=1e-8)
        # Each row's token after the step, where the row's top two are not a rounding tie (a
        # first bias-corrected step moves most entries by exactly the learning rate).
        top2 = eager.state.rows["z"].topk(2, dim=-1).values
        clear = torch.as_tensor((top2[:, 0] - top2[:, 1]) > 1e-4)
        got, want = (torch.as_tensor(b._pending.tokens[:rows]) for b in (fast, eager))
        assert torch.equal(got[clear], want[clear]), step
        compared += int(clear.sum())
        if step > eager.lag:
            loss_fast, loss_eager = (torch.as_tensor(o.loss[np.arange(4)]) for o in outs)
            torch.testing.assert_close(loss_fast, loss_eager, rtol=1e-3, atol=1e-7)
    assert compared >= 40  # of 72 row-steps


def test_the_fused_setting_is_checked(monkeypatch):
    import sodaray
    from sodaray.search.soda.fused_step import resolve

    cpu = torch.device("cpu")
    assert resolve("off", cpu) is False
    assert resolve("auto", cpu) is False  # a CPU stays eager unless asked
    assert resolve("on", cpu) is True  # under the interpreter (this module sets it)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        resolve("on", cpu)
    with pytest.raises(ValueError, match="fused must be one of"):
        resolve("yes", cpu)
    with pytest.raises(ValueError, match="fused must be off, auto or on"):
        sodaray.SodaConfig(fused="yes").validate()
    # The default, auto (chosen by a GPU measurement), is out of the job hash: jobs written when
    # the default was off keep their hashes; an explicit off or on is a job of its own.
    assert sodaray.SodaConfig().fused == "auto"
    assert "fused" not in sodaray.SodaConfig().to_dict()
    assert sodaray.SodaConfig(fused="off").to_dict()["fused"] == "off"
    assert sodaray.SodaConfig(fused="on").to_dict()["fused"] == "on"
