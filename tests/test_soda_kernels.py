"""SODA's relaxed embedding writes softmax and its backward into reused buffers through ATen's
`out=` kernels (not public API). On the pinned torch that fast path must be the one in use (a
silent fall back to the public path would cost speed and move outcomes), and both paths must
compute the same function."""

from __future__ import annotations

import pytest
import torch

from sodaray.search.soda import relaxed as soda


def relaxed(z: torch.Tensor, embedding: torch.Tensor, tau: torch.Tensor):
    """(output, dZ) of SODA's relaxed embedding for a fixed upstream gradient."""
    z = z.clone().requires_grad_(True)
    out = soda.RelaxedEmbedding.apply(z, embedding, tau, soda.Workspace())
    out.backward(torch.linspace(-1, 1, out.numel()).reshape(out.shape))
    return out.detach(), z.grad


def reference(z: torch.Tensor, embedding: torch.Tensor, tau: torch.Tensor):
    z = z.clone().requires_grad_(True)
    out = torch.softmax(z / tau, -1) @ embedding
    out.backward(torch.linspace(-1, 1, out.numel()).reshape(out.shape))
    return out.detach(), z.grad


@pytest.fixture
def inputs():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(24, 512, generator=g)
    embedding = torch.randn(512, 32, generator=g)
    tau = torch.rand(24, 1, generator=g) * 0.2 + 0.01  # per-row temperatures, as slots have
    return z, embedding, tau


def test_the_fast_kernels_are_found_on_this_torch():
    assert soda.SOFTMAX_OUT is not None, "torch.ops.aten._softmax.out is gone: public path taken"
    assert soda.SOFTMAX_BACKWARD_OUT is not None, "_softmax_backward_data.out is gone"


def test_the_fast_path_is_autograd_bit_for_bit(inputs):
    out, grad = relaxed(*inputs)
    ref_out, ref_grad = reference(*inputs)
    assert torch.equal(out, ref_out) and torch.equal(grad, ref_grad)


def test_the_public_path_computes_the_same_function(inputs, monkeypatch):
    fast_out, fast_grad = relaxed(*inputs)
    monkeypatch.setattr(soda, "SOFTMAX_OUT", None)
    monkeypatch.setattr(soda, "SOFTMAX_BACKWARD_OUT", None)
    out, grad = relaxed(*inputs)
    assert torch.equal(out, fast_out)  # torch.softmax is the same kernel, copied
    # The same function up to float32 rounding of the row sums (ulps of the largest gradient).
    scale = fast_grad.abs().max().item()
    torch.testing.assert_close(grad, fast_grad, rtol=1e-4, atol=1e-6 * scale)
    assert not torch.equal(grad, torch.zeros_like(grad))


def test_one_workspace_over_growing_and_shrinking_batches_keeps_its_zero_rows(inputs):
    """The product reads the workspace's own zero rows after the probabilities (no padded copy,
    issue 41): as a batch's row count moves (rows left by a larger step become padding, a few
    rows need many), every output is the padded product's bit for bit."""
    from sodaray.model.padding import pad_rows

    z, embedding, tau = inputs
    ws = soda.Workspace()
    for rows in (24, 5, 24, 11, 2, 17):
        out = soda.RelaxedEmbedding.apply(z[:rows], embedding, tau[:rows], ws)
        expected = (pad_rows(torch.softmax(z[:rows] / tau[:rows], -1)) @ embedding)[:rows]
        assert torch.equal(out, expected), rows
        assert len(ws.padded) > rows and not ws.padded[rows:].any(), rows
