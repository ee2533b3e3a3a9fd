"""Width-invariant attention (`sodaray.model.attention`) and the split of a batch into passes
(`sodaray.search.engine.passes`): a search's arithmetic must not depend on its pass's width."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model
from soda_ops import passes as planned_passes

import sodaray
from sodaray.model.attention import invariant


def hidden_and_grad(model, x: torch.Tensor, n: int, width: int):
    """Final hidden states at the first `n` positions of `x` padded to `width`, and the
    gradient of a loss on them with respect to those inputs."""
    padded = torch.zeros(x.shape[0], width, x.shape[-1])
    padded[:, :n] = x[:, :n]
    padded.requires_grad_(True)
    with torch.enable_grad(), invariant():
        h = model.hidden(padded)[:, :n]
        # A gather and a 2-D product, as the search's loss reads its observed positions.
        loss = (h.reshape(-1, h.shape[-1]).contiguous() @ torch.ones(h.shape[-1], 1)).square()
        (grad,) = torch.autograd.grad(loss.sum(), padded)
    return h.detach(), grad[:, :n]


@pytest.mark.parametrize("kind", ["gpt2", "llama", "qwen2", "gemma3"])
def test_a_sequence_gives_the_same_bits_in_any_padded_width(kind, one_thread):
    """Forward and input gradients of real lengths 1-17, padded at the end to widths up to 33
    (three attention blocks): bit for bit the same; outside the block, the model's own SDPA
    gives the same values up to rounding."""
    model = tiny_model(kind)
    assert model.invariant
    x = torch.randn(5, 40, model.width, generator=torch.Generator().manual_seed(0)) * 0.3
    compared = 0
    for n in (1, 2, 3, 6, 11, 17):
        ref = hidden_and_grad(model, x, n, n)
        for width in sorted({n + 1, n + 5, 9, 16, 17, 24, 33} - set(range(n + 1))):
            h, g = hidden_and_grad(model, x, n, width)
            assert torch.equal(h, ref[0]) and torch.equal(g, ref[1]), (n, width)
            compared += 1
        padded = torch.zeros(5, 33, model.width)
        padded[:, :n] = x[:, :n]
        with torch.no_grad():
            own = model.hidden(padded)[:, :n]  # outside `invariant()`: SDPA
        torch.testing.assert_close(own, ref[0], atol=1e-5, rtol=1e-4)
    assert compared >= 30


def test_a_model_without_the_attention_interface_keeps_its_own(one_thread):
    """GPT-Neo has no SDPA path: the model runs as loaded and lengths get a pass each."""
    from sodaray.search.soda.batch import SodaBatch

    model = tiny_model("gpt-neo")
    assert not model.invariant
    batch = SodaBatch(model)
    assert not batch.scheduler.mix


def test_how_a_batch_is_split_into_passes_changes_no_result(one_thread):
    """The same mixed-length searches with one pass per step and with a pass per length: the
    same tokens, finds, steps and losses, bit for bit."""
    import sodaray.search.engine.passes as passes
    from sodaray.search.engine.loop import Engine
    from sodaray.search.engine.work import Work

    model = tiny_model("qwen2")
    tokens = [[(7 * i + j) % 64 for j in range(1 + i % 7)] for i in range(14)]
    targets = sodaray.make_targets(model, tokens)
    cfg = sodaray.SodaConfig(max_steps=120, reinit_period=40, reset_period=15, seed=12)
    outcomes, counts = {}, {}
    for name, overhead in (("one pass", 1e6), ("a pass per length", 0.0)):
        passes._OVERHEAD[model.model] = overhead
        engine = Engine(model)
        work = Work(targets, cfg, [(len(t),) for t in tokens])
        engine.submit(work)
        seen: list[int] = []

        def count_passes(_, engine=engine, seen=seen) -> None:
            widths = (len(planned_passes(p.batch)) for p in engine.pools.values())
            seen.append(max(widths, default=0))

        engine.on_batch = count_passes
        engine.run()
        outcomes[name] = [(r.tokens, r.found, r.steps, r.final_loss) for r in work.ordered()]
        counts[name] = max(seen)
    passes._OVERHEAD.pop(model.model)
    assert counts == {"one pass": 1, "a pass per length": 7}
    assert outcomes["one pass"] == outcomes["a pass per length"]
    assert any(o[1] for o in outcomes["one pass"]) and not all(o[1] for o in outcomes["one pass"])
