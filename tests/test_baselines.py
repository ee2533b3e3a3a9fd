"""GCG and embedding search: same objectives, same pool, same results as SODA."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import tiny_model

import sodaray
from sodaray.search.embedding import nearest_tokens
from sodaray.search.engine.base import SlotEntry
from sodaray.search.gcg import GcgBatch


def gcg_batch(model, targets, n, cfg):
    batch = GcgBatch(model, cfg, n, torch.Generator().manual_seed(0))
    batch.add([SlotEntry(targets, i, n, cfg) for i in range(len(targets))])
    return batch


@pytest.mark.parametrize(
    "config",
    [
        sodaray.GcgConfig(max_steps=30, num_candidates=64, tokens_per_position=16),
        sodaray.EmbeddingConfig(max_steps=400),
    ],
    ids=["gcg", "embedding"],
)
def test_baselines_recover_length_one_inputs(config):
    model = tiny_model("gpt2")
    tokens = [[i] for i in range(0, 64, 8)]
    results = sodaray.invert(model, sodaray.make_targets(model, tokens), config)
    assert sum(bool(r.exact) for r in results) >= 6
    for r in results:
        assert r.algorithm == config.algorithm
        assert r.params["max_steps"] == config.max_steps
        if r.found:
            assert r.exact


def test_gcg_candidates_stay_in_vocabulary_and_avoid_filtered_tokens():
    model = tiny_model("llama")
    excluded = list(range(0, 64, 2))  # every even token
    cfg = sodaray.GcgConfig(num_candidates=200, tokens_per_position=64, exclude_tokens=excluded)
    targets = sodaray.make_targets(model, [[1, 3, 5], [7, 9, 11]])
    batch = gcg_batch(model, targets, 3, cfg)
    assert (batch.tokens % 2 == 1).all()  # random start avoids filtered tokens too
    for _ in range(3):
        cands = batch.sample_candidates(batch.one_hot_gradient())
        assert cands.shape == (2, 200, 3)
        assert cands.min() >= 0 and cands.max() < model.vocab_size
        assert (cands % 2 == 1).all()
        # Each candidate differs from the current tokens in at most one position.
        assert ((cands != batch.tokens[:, None, :]).sum(-1) <= 1).all()
        batch.step(np.array([1, 1]))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        GcgBatch(model, sodaray.GcgConfig(exclude_tokens=[64]), 3, torch.Generator())


def test_gcg_out_of_memory_fallback_gives_same_scores():
    model = tiny_model("gpt2")
    targets = sodaray.make_targets(model, [[1, 2], [3, 4]])
    cfg = sodaray.GcgConfig(num_candidates=50, eval_batch_size=64)
    batch = gcg_batch(model, targets, 2, cfg)
    cands = batch.sample_candidates(batch.one_hot_gradient())
    expected = batch.score(cands)
    real = batch._loss

    def limited(tokens, owner):  # chunks over 8 candidates "run out of memory"
        if len(tokens) > 8:
            raise torch.OutOfMemoryError("simulated: out of memory")
        return real(tokens, owner)

    batch._loss = limited
    got = batch.score(cands)
    assert batch.chunk <= 8
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_nearest_embedding_returns_the_token_of_an_exact_embedding():
    model = tiny_model("qwen2")
    E = model.embedding_matrix
    ids = torch.tensor([[0, 5, 63], [17, 17, 2]])
    for distance in ("euclidean", "cosine"):
        got = nearest_tokens(E[ids], E, distance=distance, chunk=7)  # chunks not dividing V
        assert torch.equal(got, ids)


def test_same_seed_same_results_for_baselines():
    model = tiny_model("llama")
    targets = sodaray.make_targets(model, [[i, i + 1] for i in range(4)])
    for cfg in (
        sodaray.GcgConfig(max_steps=5, num_candidates=32, seed=2),
        sodaray.EmbeddingConfig(max_steps=30, seed=2),
    ):
        a = sodaray.invert(model, targets, cfg)
        b = sodaray.invert(model, targets, cfg)
        assert [(r.tokens, r.steps) for r in a] == [(r.tokens, r.steps) for r in b]


def test_cli_accepts_baseline_algorithms(capsys):
    from conftest import STORIES

    from sodaray.cli import main

    if not STORIES.is_dir():
        pytest.skip("stories260K not present")
    code = main(
        [
            "invert",
            "--model",
            str(STORIES),
            "--tokens",
            "172",
            "--algorithm",
            "gcg",
            "--param",
            "num_candidates=64",
            "--max-steps",
            "20",
            "--json",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0 and '"algorithm": "gcg"' in out
