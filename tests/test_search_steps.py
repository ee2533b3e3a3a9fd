"""One step of each algorithm against a reference written from its definition (added for the
mutants of the issue 12 mutation pass that the other fast tests let through)."""

from __future__ import annotations

import numpy as np
import torch
from conftest import tiny_model
from soda_ops import observed

import sodaray
from sodaray.objective.scoring import Layout, context_embeds, objective_loss
from sodaray.search.embedding import EmbeddingBatch
from sodaray.search.engine.base import SlotEntry
from sodaray.search.gcg import GcgBatch
from sodaray.search.soda.batch import SodaBatch
from sodaray.search.soda.state import keyed_normal
from sodaray.search.soda.step import relaxed_gradient


def relaxed_loss(model, observed, objective, row: int, embeds: torch.Tensor, n: int, probs=None):
    sub = observed.select(torch.tensor([row]))
    hidden = model.hidden(context_embeds(model, embeds, sub))
    flat = None if probs is None else probs.reshape(-1, probs.shape[-1])
    layout = Layout.uniform(1, n, embeds.device)
    return objective_loss(model, objective, hidden, layout, sub, flat).sum()


def soda_batch(model, targets, n, cfg):
    batch = SodaBatch(model)
    batch.add([SlotEntry(targets, i, n, cfg) for i in range(len(targets))])
    batch.refresh()
    return batch


def uniform_batch(cls, model, targets, n, cfg):
    batch = cls(model, cfg, n, torch.Generator().manual_seed(0))
    batch.add([SlotEntry(targets, i, n, cfg) for i in range(len(targets))])
    return batch


def test_first_bias_corrected_soda_step(tiny_llama):
    """From Z = 0 with bias correction, m_hat = g and v_hat = g^2: Z = -lr * g / (|g| + eps),
    then decay. Needs the step to advance each slot's moment age (an age of 0 divides by 0)."""
    cfg = sodaray.SodaConfig(bias_correction=True)
    targets = sodaray.make_targets(tiny_llama, [[1, 2], [3, 4]])
    batch = soda_batch(tiny_llama, targets, 2, cfg)
    grad, _ = relaxed_gradient(batch.state, batch.refresh(), batch.precision, batch.workspace)
    grad = grad[:4].clone()  # the workspace buffer: the step reuses it
    batch.step(np.array([1, 1]))
    expected = -0.065 * grad / (grad.abs() + 1e-8) * 0.9
    torch.testing.assert_close(batch.z, expected)
    assert batch.state.column("hi", "step", 4)[:, 0].tolist() == [1, 1, 1, 1]  # each row's


def test_soda_fluency_gradient_uses_the_temperature(tiny_llama):
    """With the fluency penalty, both terms see softmax(Z / tau)."""
    objective = sodaray.Objective(fluency_weight=0.5)
    targets = sodaray.make_targets(tiny_llama, [[1, 2, 3]], objective=objective)
    cfg = sodaray.SodaConfig(temperature=0.7)
    batch = soda_batch(tiny_llama, targets, 3, cfg)
    torch.manual_seed(4)
    batch.z.copy_(torch.randn_like(batch.z))
    grad, _ = relaxed_gradient(batch.state, batch.refresh(), batch.precision, batch.workspace)
    grad = grad[:3]  # the rows; the guard row after them
    z = batch.z.clone()[None].requires_grad_(True)
    probs = torch.softmax(z / 0.7, -1)
    embeds = probs @ tiny_llama.embedding_matrix
    loss = relaxed_loss(tiny_llama, observed(batch), objective, 0, embeds, 3, probs)
    (expected,) = torch.autograd.grad(loss, z)
    expected = expected[0]
    torch.testing.assert_close(grad, expected, rtol=1e-4, atol=1e-7)


def test_embedding_search_is_adam_per_target_and_a_refill_starts_afresh():
    model = tiny_model("gpt2")
    targets = sodaray.make_targets(model, [[1, 2], [3, 4]])
    cfg = sodaray.EmbeddingConfig(init_std=0.25)
    batch = uniform_batch(EmbeddingBatch, model, targets, 2, cfg)
    assert abs(batch.x.std().item() - 0.25) < 0.05
    observed = batch.batch

    def reference(x0: torch.Tensor, row: int, steps: int) -> torch.Tensor:
        x = x0.clone().requires_grad_(True)
        opt = torch.optim.Adam([x], lr=0.065, betas=(0.9, 0.995), eps=1e-8)
        for _ in range(steps):
            opt.zero_grad()
            relaxed_loss(model, observed, targets.objective, row, x[None], 2).backward()
            opt.step()
        return x.detach()

    start = batch.x.clone()
    for s in range(1, 4):
        batch.step(np.array([s, s]))
    for row in range(2):
        torch.testing.assert_close(batch.x[row], reference(start[row], row, 3))
    batch.add([SlotEntry(targets, 0, 2, cfg)])  # slot 2 takes target 0 from scratch
    fresh = batch.x[2].clone()
    torch.testing.assert_close(fresh, start[0])  # its draw is keyed by (seed, sample id)
    batch.step(np.array([4, 4, 1]))
    torch.testing.assert_close(batch.x[2], reference(fresh, 0, 1))


def test_gcg_swaps_in_tokens_from_the_gradients_top_k():
    model = tiny_model("llama")
    cfg = sodaray.GcgConfig(num_candidates=100, tokens_per_position=4)
    targets = sodaray.make_targets(model, [[1, 3, 5], [7, 9, 11]])
    batch = uniform_batch(GcgBatch, model, targets, 3, cfg)
    grad = batch.one_hot_gradient()
    best = (-grad).topk(4, dim=-1).indices  # (B, n, 4): the most negative gradient entries
    cands = batch.sample_candidates(grad)
    for b, c, pos in (cands != batch.tokens[:, None, :]).nonzero().tolist():
        assert cands[b, c, pos] in best[b, pos]


def test_a_given_tolerance_is_kept(tiny_llama):
    objective = sodaray.Objective(atol=1e-2, rtol=1e-3)
    t = sodaray.make_targets(tiny_llama, [[1]], objective=objective)
    assert (t.atol, t.rtol) == (1e-2, 1e-3)


def test_nearest_token_is_by_distance_not_by_dot_product():
    from sodaray.search.embedding import nearest_tokens

    E = torch.tensor([[1.0, 0.0], [10.0, 0.0], [0.0, -3.0]])
    x = torch.tensor([[[1.2, 0.1], [2.0, -2.5]]])  # the largest dot product: row 1 for both
    assert nearest_tokens(x, E, chunk=2).tolist() == [[0, 2]]


def test_soda_steps_follow_the_algorithm_written_out(tiny_llama):
    """Twelve steps of the optimised engine (fused embedding, in-place Adam, workspace buffers,
    denormal flushing) against SODA written plainly from its definition, with a moment reset
    every 3 steps and a re-draw every 5: each step's Z agrees to rounding. Compared on the same
    machine, so it holds whatever BLAS or library release the arithmetic comes from (a golden
    file of outcomes does not: SODA's trajectories are chaotic and move with the last bit)."""
    cfg = sodaray.SodaConfig(reset_period=3, reinit_period=5, seed=7)
    tokens = [[1, 2], [3, 4], [5, 6]]
    targets = sodaray.make_targets(tiny_llama, tokens)
    batch = soda_batch(tiny_llama, targets, 2, cfg)
    emb = tiny_llama.embedding_matrix
    z = torch.zeros_like(batch.z).view(3, 2, -1)
    m, v = torch.zeros_like(z), torch.zeros_like(z)
    compared = 0
    before: list[tuple[torch.Tensor, torch.Tensor]] = []  # the last steps' tokens, checked
    for step in range(1, 13):
        grads = []
        for row in range(3):
            zr = z[row : row + 1].clone().requires_grad_(True)
            probs = torch.softmax(zr / cfg.temperature, -1)
            loss = relaxed_loss(tiny_llama, observed(batch), targets.objective, row, probs @ emb, 2)
            grads.append(torch.autograd.grad(loss, zr)[0])
        g = torch.cat(grads)
        m = cfg.beta1 * m + (1 - cfg.beta1) * g
        v = cfg.beta2 * v + (1 - cfg.beta2) * g * g
        z = (z - cfg.learning_rate * m / (v.sqrt() + cfg.eps)) * cfg.decay
        top2 = z.topk(2, dim=-1)  # the candidate checked is the argmax before the schedules
        clear = (top2.values[..., 0] - top2.values[..., 1]) > 1e-3  # not a rounding tie
        expected_tokens = top2.indices[..., 0]
        if step % cfg.reset_period == 0 or step % cfg.reinit_period == 0:
            m, v = torch.zeros_like(m), torch.zeros_like(v)
        if step % cfg.reinit_period == 0:
            draw = step // cfg.reinit_period
            z = torch.stack(
                [cfg.reinit_std * keyed_normal(z.shape[1:], 7, sid, draw) for sid in range(3)]
            )
        batch.step(np.full(3, step))
        torch.testing.assert_close(batch.z.view(3, 2, -1), z, rtol=1e-3, atol=1e-4, msg=f"{step}")
        if len(before) == batch.lag:  # an outcome reaches the host `lag` steps late
            tokens = torch.tensor(batch.candidates(np.arange(3)))
            expected, sure = before.pop(0)
            assert torch.equal(tokens[sure], expected[sure]), f"step {step - batch.lag}"
            compared += int(sure.sum())
        before.append((expected_tokens, clear))
    assert batch.lag == 2
    assert compared >= 30  # most of the 60 candidate tokens were clear enough to compare
