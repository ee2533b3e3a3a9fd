"""The real TinyStories model: every answer SODA finds is one brute force also accepts."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from oracle import misreports

import sodaray
from sodaray.objective.observations import BatchTargets
from sodaray.objective.scoring import hard_match


def brute_force_matches(model, targets, row):
    """All single tokens whose output matches target `row` (the whole 512-token vocabulary)."""
    cand = torch.arange(model.vocab_size).unsqueeze(1)
    batch = BatchTargets.from_set(targets, np.full(model.vocab_size, row), model.device)
    ok = hard_match(model, targets.objective, cand, batch, targets.atol, targets.rtol)
    return set(ok.nonzero().flatten().tolist())


def test_found_answers_equal_brute_force(stories):
    rng = np.random.default_rng(1)
    tokens = [[int(t)] for t in rng.choice(stories.vocab_size, size=24, replace=False)]
    targets = sodaray.make_targets(stories, tokens)
    # 600 steps: 15 of these 24 are found by then on the machine that chose it (19 by 2,000,
    # which took 52 s of the suite); the bar below is half.
    results = sodaray.invert(
        stories, targets, sodaray.SodaConfig(max_steps=600, max_batch_size=24)
    )
    found = [r for r in results if r.found]
    for r in found:
        assert r.tokens[0] in brute_force_matches(stories, targets, r.sample_id)
        assert r.exact  # brute force finds only the true token for these inputs
    assert len(found) >= 0.5 * len(tokens), f"found {len(found)}/{len(tokens)}"


def test_prompt_roundtrip_with_text_objective(stories):
    # "Lily" -> "'s mommy ..." is found at step 187 with seed 0 ("Once" is not found in 1500).
    targets = sodaray.make_targets(
        stories, texts=["Lily"], objective=sodaray.Objective(kind="text", output_tokens=4)
    )
    [r] = sodaray.invert(stories, targets, sodaray.SodaConfig(max_steps=400))
    assert r.found, r
    cont, _ = sodaray.objective.targets.greedy_continuation(stories, torch.tensor([r.tokens]), 4)
    assert torch.equal(cont[0], targets.continuation[0])
    assert misreports(stories, targets, [r]) == []


@pytest.mark.slow
def test_gguf_model_loads_and_checks_its_own_input():
    from conftest import SMOLLM

    path = SMOLLM / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        pytest.skip("SmolLM2 GGUF is not present")
    model = sodaray.load_model(str(path), device="cpu")
    assert model.vocab_size == 49152 and model.split_forward
    assert model.default_tolerance == 1e-3
    targets = sodaray.make_targets(
        model, texts=["Hello world"], objective=sodaray.Objective(top_k=10)
    )
    batch = BatchTargets.from_set(targets, np.array([0]), model.device)
    true = torch.tensor(targets.true_tokens)
    assert hard_match(model, targets.objective, true, batch, targets.atol, targets.rtol).all()
    assert not hard_match(
        model, targets.objective, true.flip(1), batch, targets.atol, targets.rtol
    ).any()
