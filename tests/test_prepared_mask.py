"""The prepared attention mask and position ids (`sodaray.model.attention.prepared_mask`,
`sodaray.model.padding.prepared_positions`): a model takes a cached causal mask and cached positions
instead of making its own every forward (issue 41: about 17 operations a forward), and the check
plans its observed positions on the host; nothing a search computes moves by a bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import tiny_model
from torch.profiler import ProfilerActivity, profile

import sodaray
from sodaray.model.attention import prepared_mask
from sodaray.model.padding import prepared_positions
from sodaray.objective.scoring import check_sequences, observed_positions
from sodaray.search.engine.base import SlotEntry, observed_rows


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


def test_prepared_positions_are_the_models_own_made_once():
    """0 .. L-1 in one row, as transformers makes them when given none; one tensor a length."""
    first = prepared_positions(5, torch.device("cpu"))
    assert first.shape == (1, 5) and first.dtype == torch.long
    assert torch.equal(first[0], torch.arange(5))
    assert prepared_positions(5, torch.device("cpu")) is first
    assert not torch.equal(prepared_positions(6, torch.device("cpu"))[:, :5], first + 1)


@pytest.mark.parametrize(("kind", "fewer"), [("gpt-neo", 17), ("qwen2", 8)])
def test_a_forward_with_the_prepared_mask_launches_fewer_operations(kind, fewer, one_thread):
    """Measured 19 and 9 fewer operations a forward, 15 and 7 with the mask alone (eager builds
    and converts a mask; SDPA checks for packed sequences and padding before skipping it; both
    make position ids)."""
    neo = tiny_model(kind)
    x = torch.randn(8, 6, neo.width, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        neo.hidden(x)  # the first call measures once what later ones reuse (`row_rule`)
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


def test_observed_positions_planned_on_the_host_are_the_devices():
    lengths = [3, 1, 4, 2]
    for prefix, m in ((0, 1), (1, 1), (2, 3)):
        on_device = observed_positions(torch.tensor(lengths), prefix, m)
        on_host = observed_positions(np.array(lengths), prefix, m)
        for a, b in zip(on_device, on_host, strict=True):
            assert a.shape == b.shape and a.tolist() == b.tolist()
    assert on_host[1].tolist() == [[4, 5, 6], [2, 3, 4], [5, 6, 7], [3, 4, 5]]


@pytest.mark.parametrize("kind", ["gpt-neo", "qwen2"])
def test_the_check_decides_the_same_with_host_lengths(kind, one_thread):
    """The search's check passes its lengths on the host (its positions made there, no
    kernels): the same decisions as with lengths on the device, finds and misses alike, with
    and without the probe (raw logits: the probe; centred: the whole row at once)."""
    model = tiny_model(kind)
    tokens = [[(7 * i + 3 * j + 1) % 64 for j in range(1 + i % 3)] for i in range(8)]
    width = max(map(len, tokens))
    wrong = [t if i % 2 else [(t[0] + 1) % 64, *t[1:]] for i, t in enumerate(tokens)]
    sequences = torch.tensor([t + [0] * (width - len(t)) for t in wrong])
    lengths = [len(t) for t in tokens]
    rows = torch.arange(len(tokens))
    for space in ("raw", "centred"):
        objective = sodaray.Objective(space=space)
        targets = sodaray.make_targets(model, tokens, objective=objective)
        entries = [SlotEntry(targets, r, lengths[r], None) for r in range(len(tokens))]
        batch = observed_rows(entries, model.device)
        decided = [
            check_sequences(model, objective, sequences, n, batch, rows, 1e-4, 1e-4).tolist()
            for n in (torch.tensor(lengths), np.array(lengths))
        ]
        assert decided[0] == decided[1] == [i % 2 == 1 for i in range(len(tokens))], space
