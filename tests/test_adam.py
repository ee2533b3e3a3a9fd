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
        t = age.clamp(min=1).view(-1, *[1] * (len(shape) - 1))
        correction = (1 - HYPER["beta1"] ** t, 1 - HYPER["beta2"] ** t)
        adam_step(param, g.clone(), m, v, correction=correction, **HYPER)
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


def test_per_row_hyperparameters_are_each_rows_own():
    """Columns of hyperparameters (searches of different configs in one batch): each row steps
    exactly as a float hyperparameter of its own would, bit for bit."""
    torch.manual_seed(2)
    param0, m0, v0, g = torch.randn(3, 5), torch.randn(3, 5), torch.rand(3, 5), torch.randn(3, 5)
    rows = [
        dict(learning_rate=0.065, beta1=0.9, beta2=0.995, eps=1e-8),
        dict(learning_rate=0.3, beta1=0.5, beta2=0.99, eps=1e-3),
        dict(learning_rate=0.01, beta1=0.99, beta2=0.9999, eps=1e-6),
    ]
    column = {
        k: torch.tensor([[r[k]] for r in rows], dtype=torch.float64 if "beta" in k else None)
        for k in rows[0]
    }
    param, m, v = param0.clone(), m0.clone(), v0.clone()
    adam_step(param, g.clone(), m, v, **column)
    for i, hyper in enumerate(rows):
        p, mi, vi = param0[i : i + 1].clone(), m0[i : i + 1].clone(), v0[i : i + 1].clone()
        ones = {k: torch.tensor([[x]], dtype=column[k].dtype) for k, x in hyper.items()}
        adam_step(p, g[i : i + 1].clone(), mi, vi, **ones)
        assert torch.equal(param[i], p[0]) and torch.equal(m[i], mi[0]), i
        expected = param0[i] - hyper["learning_rate"] * (
            (hyper["beta1"] * m0[i] + (1 - hyper["beta1"]) * g[i])
            / ((hyper["beta2"] * v0[i] + (1 - hyper["beta2"]) * g[i] ** 2).sqrt() + hyper["eps"])
        )
        torch.testing.assert_close(param[i], expected)
    with pytest.raises(TypeError, match="float64"):
        adam_step(param, g.clone(), m, v, **{**column, "beta1": column["beta1"].float()})
