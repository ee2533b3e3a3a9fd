"""Models that scale their input embeddings (Gemma: sqrt(d) inside the lookup) must see the same
input through the relaxed path as through token ids, or the search optimises another model."""

from __future__ import annotations

import math

import torch
from conftest import tiny_model


def test_gemma_scale_measured_and_relaxed_one_hot_equals_tokens():
    model = tiny_model("gemma3")
    assert math.isclose(model.embed_scale, math.sqrt(32), rel_tol=1e-3)
    tokens = torch.tensor([[3, 9, 4]])
    one_hot = torch.nn.functional.one_hot(tokens, model.vocab_size).float()
    relaxed = model.relaxed_embeds(one_hot @ model.embedding_matrix)
    torch.testing.assert_close(relaxed, model.embed(tokens))
    unscaled = one_hot @ model.embedding_matrix
    assert not torch.allclose(model.hidden(unscaled), model.hidden(model.embed(tokens)))


def test_unscaled_models_keep_scale_one(tiny_llama):
    assert tiny_llama.embed_scale == 1.0
