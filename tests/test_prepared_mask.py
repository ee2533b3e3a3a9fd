"""The prepared attention mask (`sodaray.attention.prepared_mask`): an eager-attention model takes
a cached causal mask instead of building its own every forward (issue 41: about 15 operations a
forward), and nothing a search computes moves by a bit."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model
from torch.profiler import ProfilerActivity, profile

import sodaray
from sodaray.attention import prepared_mask


def leaf_ops(fn) -> int:
    """Profiler ops that do work, as `../shared/tools/opcount.py` counts them (no views)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    skip = ("aten::view", "aten::as_strided", "aten::empty", "aten::empty_strided", "aten::t")
    return sum(
        1
        for e in prof.events()
        if e.name.startswith("aten::") and e.name not in skip and not e.cpu_children
    )


def test_which_models_take_the_prepared_mask():
    """Eager attention and the width-invariant attention do; plain SDPA (a model the
    width-invariant attention could not go into) builds its own."""
    neo = tiny_model("gpt-neo")
    assert neo.model.config._attn_implementation == "eager"
    assert neo.static_mask
    for kind in ("llama", "qwen2", "gemma3"):
        model = tiny_model(kind)
        assert model.invariant and model.static_mask, kind
    sdpa = tiny_model("llama")
    sdpa.model.set_attn_implementation("sdpa")
    assert prepared_mask(sdpa.model, 4, torch.float32, torch.device("cpu")) is None


def test_the_mask_is_transformers_own_values():
    """0 where a query sees a key, the dtype's minimum elsewhere; a sequence longer than the
    model's window gets none (transformers builds another mask for some layers there); the
    width-invariant attention's is marked plain causal and read as no mask."""
    neo = tiny_model("gpt-neo")  # window_size 16
    for dtype in (torch.float32, torch.bfloat16):
        mask = prepared_mask(neo.model, 4, dtype, torch.device("cpu"))
        assert mask.shape == (1, 1, 4, 4) and mask.dtype == dtype
        low = torch.finfo(dtype).min
        expected = torch.full((4, 4), low).triu(1).to(dtype)  # 0 on and below the diagonal
        assert torch.equal(mask[0, 0], expected)
    assert prepared_mask(neo.model, 16, torch.float32, torch.device("cpu")) is not None
    assert prepared_mask(neo.model, 17, torch.float32, torch.device("cpu")) is None
    gemma = tiny_model("gemma3")  # sliding_window 16
    plain = prepared_mask(gemma.model, 3, torch.float32, torch.device("cpu"))
    assert plain.dtype == torch.bool and torch.equal(plain[0, 0], torch.ones(3, 3).tril().bool())
    assert getattr(plain, "_sodaray_plain_causal", False)
    assert prepared_mask(gemma.model, 17, torch.float32, torch.device("cpu")) is None


@pytest.mark.parametrize(("kind", "fewer"), [("gpt-neo", 10), ("qwen2", 5)])
def test_a_forward_with_the_prepared_mask_launches_fewer_operations(kind, fewer, one_thread):
    """Measured 15 and 7 fewer operations a forward (eager builds and converts a mask; SDPA
    checks for packed sequences and padding before skipping it)."""
    neo = tiny_model(kind)
    x = torch.randn(8, 6, neo.width, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        neo.hidden(x)  # the first call measures once what later ones reuse (`invariant_rows`)
        fast = leaf_ops(lambda: neo.hidden(x))
        with_mask = neo.hidden(x)
        neo.static_mask = False
        own = leaf_ops(lambda: neo.hidden(x))
        without = neo.hidden(x)
    assert torch.equal(with_mask, without)
    assert own - fast >= fewer, (own, fast)


@pytest.mark.parametrize(
    ("kind", "attention", "precision"),
    [
        ("gpt-neo", None, "float32"),
        ("gpt-neo", None, "bfloat16"),
        ("gpt2", "eager", "float32"),  # a model whose attention reads only the mask
        ("llama", "eager", "float32"),
        ("llama", None, "float32"),  # the width-invariant attention, mixed lengths in a pass
        ("qwen2", None, "bfloat16"),
        ("gemma3", None, "float32"),
    ],
)
def test_searches_give_the_same_bits_with_the_prepared_mask_and_without(
    kind, attention, precision, one_thread
):
    """Mixed lengths, resets and re-draws: the same tokens, finds, steps and final losses
    whether each forward takes the prepared mask or builds its own."""
    tokens = [[(5 * i + 3 * j) % 64 for j in range(1 + i % 4)] for i in range(10)]
    cfg = sodaray.SodaConfig(
        max_steps=60, reinit_period=25, reset_period=10, seed=3, precision=precision
    )
    outcomes = []
    for static in (True, False):
        model = tiny_model(kind, attention=attention)
        assert model.static_mask  # the model took it
        model.static_mask = static
        shadow = model.for_precision(precision)
        shadow.static_mask = static
        targets = sodaray.make_targets(model, tokens)
        results = sodaray.invert(model, targets, cfg)
        outcomes.append(
            [(r.tokens, r.found, r.steps, r.final_loss, r.lengths_tried) for r in results]
        )
    assert outcomes[0] == outcomes[1]
    assert any(found for _, found, *_ in outcomes[0])  # the searches did find inputs
