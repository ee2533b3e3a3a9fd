"""SODA's update rule and schedules against their formulas."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sodaray
from sodaray.objectives import context_embeds, objective_loss
from sodaray.search.soda import SodaBatch


def make_batch(model, config, n=2, rows=3, seed=0):
    targets = sodaray.make_targets(model, [[1] * n, [2] * n, [3] * n][:rows])
    gen = torch.Generator().manual_seed(seed)
    batch = SodaBatch(model, targets, n, config, rows, gen)
    batch.add(torch.arange(rows), np.arange(rows))
    return batch


def test_paper_defaults():
    c = sodaray.SodaConfig()
    assert (c.learning_rate, c.decay, c.beta1, c.beta2, c.temperature) == (
        0.065,
        0.9,
        0.9,
        0.995,
        0.05,
    )
    assert (c.reset_period, c.reinit_period, c.reinit_std, c.eps) == (50, 1500, 0.1, 1e-8)
    assert not c.bias_correction and c.use_decay and c.use_resets and c.use_reinit
    assert sodaray.Objective().loss == "huber" and sodaray.Objective().huber_delta == 1.0


@pytest.mark.parametrize("bias_correction", [False, True])
@pytest.mark.parametrize("use_decay", [False, True])
def test_adam_update_matches_formula(tiny_llama, bias_correction, use_decay):
    cfg = sodaray.SodaConfig(bias_correction=bias_correction, use_decay=use_decay)
    batch = make_batch(tiny_llama, cfg)
    torch.manual_seed(1)
    z0 = torch.randn_like(batch.z)
    m0, v0 = torch.randn_like(z0), torch.rand_like(z0)
    g = torch.randn_like(z0)
    batch.z.copy_(z0), batch.m.copy_(m0), batch.v.copy_(v0)
    age = np.array([1, 2, 7])
    batch.update(g.clone(), age)  # update() consumes (overwrites) its gradient
    m = 0.9 * m0 + 0.1 * g
    v = 0.995 * v0 + 0.005 * g * g
    if bias_correction:
        t = torch.tensor(age, dtype=torch.float32).view(-1, 1, 1)
        m_hat, v_hat = m / (1 - 0.9**t), v / (1 - 0.995**t)
    else:
        m_hat, v_hat = m, v
    z = z0 - 0.065 * m_hat / (v_hat.sqrt() + 1e-8)
    if use_decay:
        z = z * 0.9
    torch.testing.assert_close(batch.m, m)
    torch.testing.assert_close(batch.v, v)
    torch.testing.assert_close(batch.z, z)


def test_gradient_is_that_of_the_relaxed_loss(tiny_llama):
    cfg = sodaray.SodaConfig(temperature=0.7)
    batch = make_batch(tiny_llama, cfg)
    torch.manual_seed(2)
    batch.z.copy_(torch.randn_like(batch.z))
    grad, loss = batch.gradient()
    # Per-sample: each sample's gradient is that of its own loss alone.
    for i in range(3):
        z = batch.z[i : i + 1].clone().requires_grad_(True)
        emb = torch.softmax(z / 0.7, -1) @ tiny_llama.embedding_matrix
        sub = batch.batch.select(torch.tensor([i]))
        hidden = tiny_llama.hidden(context_embeds(tiny_llama, emb, sub))
        li = objective_loss(tiny_llama, batch.objective, hidden, 2, sub)
        (gi,) = torch.autograd.grad(li.sum(), z)
        torch.testing.assert_close(grad[i : i + 1], gi, rtol=1e-4, atol=1e-7)
        torch.testing.assert_close(loss[i], li[0].detach())


def test_resets_and_reinit_follow_each_samples_own_steps(tiny_llama):
    cfg = sodaray.SodaConfig(reset_period=5, reinit_period=15)
    batch = make_batch(tiny_llama, cfg)
    z0 = torch.full_like(batch.z, 3.0)
    batch.z.copy_(z0), batch.m.fill_(1.0), batch.v.fill_(1.0)
    batch.moment_age[:] = 4
    batch.apply_schedules(np.array([5, 7, 30]))  # slot 0: reset; 1: nothing; 2: reset + reinit
    assert batch.m[0].abs().sum() == 0 and batch.v[0].abs().sum() == 0
    assert torch.all(batch.m[1] == 1) and torch.all(batch.v[1] == 1)
    assert batch.m[2].abs().sum() == 0
    torch.testing.assert_close(batch.z[:2], z0[:2])  # no re-draw at 5 or 7
    redrawn = batch.z[2]
    assert not torch.equal(redrawn, z0[2])
    assert abs(redrawn.mean().item()) < 0.05 and abs(redrawn.std().item() - 0.1) < 0.02
    assert list(batch.moment_age) == [0, 4, 0]


def test_switches_turn_schedules_off(tiny_llama):
    cfg = sodaray.SodaConfig(reset_period=5, reinit_period=5, use_resets=False, use_reinit=False)
    batch = make_batch(tiny_llama, cfg)
    batch.z.fill_(3.0), batch.m.fill_(1.0)
    batch.apply_schedules(np.array([5, 10, 15]))
    assert torch.all(batch.m == 1) and torch.all(batch.z == 3)


def test_reinit_without_resets_still_zeroes_moments(tiny_llama):
    cfg = sodaray.SodaConfig(reset_period=7, reinit_period=4, use_resets=False)
    batch = make_batch(tiny_llama, cfg)
    batch.m.fill_(1.0)
    batch.apply_schedules(np.array([4, 7, 8]))
    assert batch.m[0].abs().sum() == 0 and batch.m[2].abs().sum() == 0
    assert torch.all(batch.m[1] == 1)  # step 7 is a reset step, but resets are off


def test_state_starts_at_zero_and_refill_clears_it(tiny_llama):
    batch = make_batch(tiny_llama, sodaray.SodaConfig())
    assert batch.z.abs().sum() == 0
    batch.z.fill_(1.0), batch.m.fill_(1.0), batch.v.fill_(1.0)
    batch.add(torch.tensor([1]), np.array([0]))
    assert batch.z[1].abs().sum() == 0 and batch.m[1].abs().sum() == 0
    assert torch.all(batch.z[0] == 1)


@pytest.mark.parametrize(
    "bad",
    [
        {"learning_rate": 0},
        {"decay": 1.5},
        {"beta1": 1.0},
        {"temperature": -1},
        {"reset_period": 0},
        {"max_steps": 0},
    ],
)
def test_bad_config_values_are_rejected(bad):
    with pytest.raises(ValueError):
        sodaray.SodaConfig(**bad)


def test_unknown_parameter_is_named():
    with pytest.raises(ValueError, match="lerning_rate"):
        sodaray.make_config("soda", {"lerning_rate": 0.1}, source="sweep.yaml")


def test_presets_load():
    for name in sodaray.PRESETS:
        cfg = sodaray.SodaConfig.from_preset(name)
        assert cfg.learning_rate > 0
    assert sodaray.SodaConfig.from_preset("qwen2.5-3b").temperature == 0.07
    with pytest.raises(ValueError, match="unknown preset"):
        sodaray.SodaConfig.from_preset("gpt-5")


def test_relaxed_embedding_matches_autograd_bit_for_bit(tiny_llama):
    """The workspace kernels (in place, out=) are autograd's own: same bits both ways."""
    from sodaray.search.soda import RelaxedEmbedding, Workspace

    torch.manual_seed(3)
    emb = tiny_llama.embedding_matrix
    z = torch.randn(4, 3, emb.shape[0])
    upstream = torch.randn(4, 3, emb.shape[1])
    z1 = z.clone().requires_grad_(True)
    ref = torch.softmax(z1 / 0.05, -1) @ emb
    (ref_grad,) = torch.autograd.grad(ref, z1, upstream)
    ws = Workspace()
    for _ in range(2):  # the second pass reuses the buffers
        z2 = z.clone().requires_grad_(True)
        out = RelaxedEmbedding.apply(z2, emb, 0.05, ws)
        (grad,) = torch.autograd.grad(out, z2, upstream)
        assert torch.equal(out, ref) and torch.equal(grad, ref_grad)
    assert grad.data_ptr() == ws.grad.data_ptr()


def test_workspace_follows_the_batch_when_it_shrinks(tiny_llama):
    batch = make_batch(tiny_llama, sodaray.SodaConfig())
    batch.step(np.array([1, 1, 1]))
    first = batch.workspace.probs.data_ptr()
    batch.step(np.array([2, 2, 2]))
    assert batch.workspace.probs.data_ptr() == first  # reused, not reallocated
    batch.keep(torch.tensor([0, 2]))
    batch.step(np.array([3, 3]))
    assert batch.workspace.probs.shape == batch.z.shape == (2, 2, tiny_llama.vocab_size)


def test_mean_reduction_is_the_authors_batch_averaged_loss(tiny_llama):
    """loss_reduction=mean: one loss averaged over the batch (the authors' code), so each
    sample's gradient is 1/B of its own, and one Adam step equals eps * B under "sum"."""
    steps = {}
    for reduction, eps in (("sum", 3e-6), ("mean", 1e-6)):
        cfg = sodaray.SodaConfig(temperature=0.7, loss_reduction=reduction, eps=eps)
        batch = make_batch(tiny_llama, cfg)
        torch.manual_seed(2)
        batch.z.copy_(torch.randn_like(batch.z))
        grad, _ = batch.gradient()
        steps[reduction] = grad.clone()
        batch.update(grad, np.ones(3, dtype=np.int64))
        steps[reduction + "_z"] = batch.z.clone()
    torch.testing.assert_close(steps["mean"] * 3, steps["sum"], rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(steps["mean_z"], steps["sum_z"], rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="loss_reduction"):
        sodaray.SodaConfig(loss_reduction="max")
