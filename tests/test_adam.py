"""The shared Adam step against PyTorch's own Adam, slot by slot."""

from __future__ import annotations

import pytest
import torch

from sodaray.search.adam import adam_step

HYPER = dict(learning_rate=0.065, beta1=0.9, beta2=0.995, eps=1e-8)


def torch_adam(param: torch.Tensor, grads: list[torch.Tensor]) -> torch.Tensor:
    p = param.clone().requires_grad_(True)
    opt = torch.optim.Adam(
        [p], lr=HYPER["learning_rate"], betas=(HYPER["beta1"], HYPER["beta2"]), eps=HYPER["eps"]
    )
    for g in grads:
        p.grad = g.clone()
        opt.step()
    return p.detach()


@pytest.mark.parametrize("shape", [(3, 4, 5), (3, 6)])
def test_bias_corrected_step_is_torch_adam_per_slot(shape):
    """Slots at different step counts: each follows its own Adam, as if alone."""
    torch.manual_seed(0)
    param0 = torch.randn(shape)
    grads = [torch.randn(shape) for _ in range(6)]
    first_step = [0, 2, 4]  # slot i joins at step first_step[i] (a refill)
    param, m, v = param0.clone(), torch.zeros(shape), torch.zeros(shape)
    age = torch.zeros(shape[0])
    for s, g in enumerate(grads):
        active = torch.tensor([s >= f for f in first_step])
        age += active.float()
        # A slot that has not joined yet sees a zero gradient: zero moments leave it unchanged.
        g = torch.where(active.view(-1, *[1] * (len(shape) - 1)), g, torch.zeros_like(g))
        adam_step(param, g.clone(), m, v, step=age.clamp(min=1), **HYPER)
    for i, f in enumerate(first_step):
        expected = torch_adam(param0[i], [g[i] for g in grads[f:]])
        torch.testing.assert_close(param[i], expected, rtol=1e-5, atol=1e-6)


def test_uncorrected_step_formula_and_consumed_gradient():
    torch.manual_seed(1)
    param0, m0, v0 = torch.randn(2, 3, 7), torch.randn(2, 3, 7), torch.rand(2, 3, 7)
    g = torch.randn(2, 3, 7)
    param, m, v, grad = param0.clone(), m0.clone(), v0.clone(), g.clone()
    adam_step(param, grad, m, v, **HYPER)
    m_new = 0.9 * m0 + 0.1 * g
    v_new = 0.995 * v0 + 0.005 * g * g
    torch.testing.assert_close(m, m_new)
    torch.testing.assert_close(v, v_new)
    torch.testing.assert_close(param, param0 - 0.065 * m_new / (v_new.sqrt() + 1e-8))
    torch.testing.assert_close(grad, v_new.sqrt() + 1e-8)  # its memory held the denominator
