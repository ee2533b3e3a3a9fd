"""SODA's update rule and schedules against their formulas."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from soda_ops import adam_update, apply_schedules, observed, set_steps

import sodaray
from sodaray.objective.scoring import Layout, context_embeds, objective_loss
from sodaray.search.engine.base import SlotEntry
from sodaray.search.engine.slots import removal_plan
from sodaray.search.soda.batch import SodaBatch
from sodaray.search.soda.step import relaxed_gradient


def make_batch(model, config, n=2, rows=3, configs=None):
    """A SODA batch of `rows` targets of length `n`, slot i with `configs[i]` (default: all
    `config`); its packed state is slot after slot, so `view(batch, "z")` is (rows, n, V)."""
    targets = sodaray.make_targets(model, [[1] * n, [2] * n, [3] * n, [4] * n][:rows])
    batch = SodaBatch(model)
    configs = configs or [config] * rows
    batch.add([SlotEntry(targets, i, n, configs[i]) for i in range(rows)])
    batch.refresh()
    return batch


def view(batch, name):
    """A fresh batch's packed (T, V) state as (slots, n, V): a view, writes go through."""
    return batch.state.rows[name].view(len(batch), -1, batch.state.rows[name].shape[-1])


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
    z0 = torch.randn_like(view(batch, "z"))
    m0, v0 = torch.randn_like(z0), torch.rand_like(z0)
    g = torch.randn_like(z0)
    view(batch, "z").copy_(z0), view(batch, "m").copy_(m0), view(batch, "v").copy_(v0)
    age = np.array([1, 2, 7])
    set_steps(batch, age - 1)  # the update advances each count: these are the moments' ages
    adam_update(
        batch, g.clone().view(-1, g.shape[-1])
    )  # update() consumes (overwrites) its gradient
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
    torch.testing.assert_close(view(batch, "m"), m)
    torch.testing.assert_close(view(batch, "v"), v)
    torch.testing.assert_close(view(batch, "z"), z)


def test_each_slot_steps_by_its_own_config(tiny_llama):
    """Three configs in one batch: every knob of the update is the slot's own (learning rate,
    betas, eps, decay and its switch, bias correction), each row as its formula says."""
    cfgs = [
        sodaray.SodaConfig(),
        sodaray.SodaConfig(learning_rate=0.2, beta1=0.5, beta2=0.9, eps=1e-3, decay=0.7),
        sodaray.SodaConfig(learning_rate=0.01, use_decay=False, bias_correction=True),
    ]
    batch = make_batch(tiny_llama, None, configs=cfgs)
    torch.manual_seed(5)
    z0 = torch.randn_like(view(batch, "z"))
    m0, v0, g = torch.randn_like(z0), torch.rand_like(z0), torch.randn_like(z0)
    view(batch, "z").copy_(z0), view(batch, "m").copy_(m0), view(batch, "v").copy_(v0)
    set_steps(batch, [2, 2, 2])  # age 3 at the update
    adam_update(batch, g.clone().view(-1, g.shape[-1]))
    for i, c in enumerate(cfgs):
        m = c.beta1 * m0[i] + (1 - c.beta1) * g[i]
        v = c.beta2 * v0[i] + (1 - c.beta2) * g[i] * g[i]
        if c.bias_correction:
            m, v = m / (1 - c.beta1**3), v / (1 - c.beta2**3)
        z = z0[i] - c.learning_rate * m / (v.sqrt() + c.eps)
        z = z * c.decay if c.use_decay else z
        torch.testing.assert_close(view(batch, "z")[i], z, msg=f"slot {i}")


def test_gradient_is_that_of_the_relaxed_loss(tiny_llama):
    cfg = sodaray.SodaConfig(temperature=0.7)
    batch = make_batch(tiny_llama, cfg)
    torch.manual_seed(2)
    batch.z.copy_(torch.randn_like(batch.z))
    grad, loss = relaxed_gradient(batch.state, batch.refresh(), batch.precision, batch.workspace)
    grad = grad[:6].view(3, 2, -1)  # the rows; the guard row after them
    objective = batch.state.groups[0][0]
    # Per-sample: each sample's gradient is that of its own loss alone.
    for i in range(3):
        z = view(batch, "z")[i : i + 1].clone().requires_grad_(True)
        emb = torch.softmax(z / 0.7, -1) @ tiny_llama.embedding_matrix
        sub = observed(batch).select(torch.tensor([i]))
        hidden = tiny_llama.hidden(context_embeds(tiny_llama, emb, sub))
        li = objective_loss(tiny_llama, objective, hidden, Layout.uniform(1, 2, z.device), sub)
        (gi,) = torch.autograd.grad(li.sum(), z)
        torch.testing.assert_close(grad[i : i + 1], gi, rtol=1e-4, atol=1e-7)
        torch.testing.assert_close(loss[i], li[0].detach())


def test_resets_and_reinit_follow_each_samples_own_steps(tiny_llama):
    cfg = sodaray.SodaConfig(reset_period=5, reinit_period=15)
    batch = make_batch(tiny_llama, cfg)
    z, m, v = view(batch, "z"), view(batch, "m"), view(batch, "v")
    z0 = torch.full_like(z, 3.0)
    z.copy_(z0), m.fill_(1.0), v.fill_(1.0)
    apply_schedules(batch, np.array([5, 7, 30]))  # slot 0: reset; 1: nothing; 2: reset + reinit
    assert m[0].abs().sum() == 0 and v[0].abs().sum() == 0
    assert torch.all(m[1] == 1) and torch.all(v[1] == 1)
    assert m[2].abs().sum() == 0
    torch.testing.assert_close(z[:2], z0[:2])  # no re-draw at 5 or 7
    redrawn = z[2]
    assert not torch.equal(redrawn, z0[2])
    assert abs(redrawn.mean().item()) < 0.05 and abs(redrawn.std().item() - 0.1) < 0.02


def test_schedules_follow_each_slots_own_periods(tiny_llama):
    """Slots of different configs in one batch: each resets and re-draws on its own periods,
    with its own draw size (reinit_std), and only where its switches allow."""
    cfgs = [
        sodaray.SodaConfig(reset_period=5, reinit_period=10),
        sodaray.SodaConfig(reset_period=3, reinit_period=6, reinit_std=0.5),
        sodaray.SodaConfig(reset_period=6, reinit_period=6, use_reinit=False),
    ]
    batch = make_batch(tiny_llama, None, configs=cfgs)
    z, m = view(batch, "z"), view(batch, "m")
    z.fill_(3.0), m.fill_(1.0)
    apply_schedules(batch, np.array([6, 6, 6]))  # 0: nothing; 1: re-draw; 2: reset only
    assert torch.all(m[0] == 1) and torch.all(z[0] == 3)
    assert m[1].abs().sum() == 0 and abs(z[1].std().item() - 0.5) < 0.1
    assert m[2].abs().sum() == 0 and torch.all(z[2] == 3)


def test_switches_turn_schedules_off(tiny_llama):
    cfg = sodaray.SodaConfig(reset_period=5, reinit_period=5, use_resets=False, use_reinit=False)
    batch = make_batch(tiny_llama, cfg)
    batch.z.fill_(3.0), batch.state.rows["m"].fill_(1.0)
    apply_schedules(batch, np.array([5, 10, 15]))
    assert torch.all(batch.state.rows["m"] == 1) and torch.all(batch.z == 3)


def test_reinit_without_resets_still_zeroes_moments(tiny_llama):
    cfg = sodaray.SodaConfig(reset_period=7, reinit_period=4, use_resets=False)
    batch = make_batch(tiny_llama, cfg)
    m = view(batch, "m")
    m.fill_(1.0)
    apply_schedules(batch, np.array([4, 7, 8]))
    assert m[0].abs().sum() == 0 and m[2].abs().sum() == 0
    assert torch.all(m[1] == 1)  # step 7 is a reset step, but resets are off


def test_state_starts_at_zero_and_a_new_search_starts_afresh(tiny_llama):
    cfg = sodaray.SodaConfig()
    batch = make_batch(tiny_llama, cfg)
    assert batch.z.abs().sum() == 0
    batch.z.fill_(1.0), batch.state.rows["m"].fill_(1.0), batch.state.rows["v"].fill_(1.0)
    batch.remove(*removal_plan(3, np.array([1])))  # slot 2 moves into slot 1
    targets = sodaray.make_targets(tiny_llama, [[5, 6, 7]])
    batch.add([SlotEntry(targets, 0, 3, cfg)])  # a search of another length joins
    batch.refresh()
    rows = batch.state.slot_rows()[2]
    assert len(rows) == 3 and list(batch.state.host["length"]) == [2, 2, 3]
    for name in ("z", "m", "v"):
        assert batch.state.rows[name][rows].abs().sum() == 0
        assert torch.all(batch.state.rows[name][np.concatenate(batch.state.slot_rows()[:2])] == 1)


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
    from sodaray.search.soda.relaxed import RelaxedEmbedding, Workspace

    torch.manual_seed(3)
    emb = tiny_llama.embedding_matrix
    z = torch.randn(4, 3, emb.shape[0])
    upstream = torch.randn(4, 3, emb.shape[1])
    z1 = z.clone().requires_grad_(True)
    ref = torch.softmax(z1 / 0.05, -1) @ emb
    (ref_grad,) = torch.autograd.grad(ref, z1, upstream)
    ws = Workspace()
    tau = torch.full((12, 1), 0.05)  # every row its own temperature, here all alike
    for _ in range(2):  # the second pass reuses the buffers
        z2 = z.clone().view(12, -1).requires_grad_(True)
        out = RelaxedEmbedding.apply(z2, emb, tau, ws)
        (grad,) = torch.autograd.grad(out, z2, upstream.view(12, -1))
        assert torch.equal(out.view(4, 3, -1), ref)
        assert torch.equal(grad.view(4, 3, -1), ref_grad)
    assert grad.data_ptr() == ws.grad.data_ptr()


def test_workspace_follows_the_batch_when_it_shrinks(tiny_llama):
    batch = make_batch(tiny_llama, sodaray.SodaConfig())
    batch.step(np.array([1, 1, 1]))
    first = batch.workspace.probs.data_ptr()
    batch.step(np.array([2, 2, 2]))
    assert batch.workspace.probs.data_ptr() == first  # reused, not reallocated
    batch.remove(*removal_plan(3, np.array([1])))
    batch.step(np.array([3, 3]))
    assert batch.workspace.probs.data_ptr() == first  # fewer rows: the same buffer
    assert batch.z.shape == (4, tiny_llama.vocab_size)
    assert batch.workspace.probs.shape == (5, tiny_llama.vocab_size)  # and the guard row


def test_mean_reduction_is_the_authors_batch_averaged_loss(tiny_llama):
    """loss_reduction=mean: one loss averaged over the batch (the authors' code), so each
    sample's gradient is 1/B of its own, and one Adam step equals eps * B under "sum"."""
    steps = {}
    for reduction, eps in (("sum", 3e-6), ("mean", 1e-6)):
        cfg = sodaray.SodaConfig(temperature=0.7, loss_reduction=reduction, eps=eps)
        batch = make_batch(tiny_llama, cfg)
        torch.manual_seed(2)
        batch.z.copy_(torch.randn_like(batch.z))
        grad, _ = relaxed_gradient(batch.state, batch.refresh(), batch.precision, batch.workspace)
        steps[reduction] = grad[:6].clone()
        set_steps(batch, [0, 0, 0])
        adam_update(batch, grad)
        steps[reduction + "_z"] = batch.z.clone()
    torch.testing.assert_close(steps["mean"] * 3, steps["sum"], rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(steps["mean_z"], steps["sum_z"], rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="loss_reduction"):
        sodaray.SodaConfig(loss_reduction="max")
