"""Embedding-search baseline (paper appendix Algorithm 2).

Continuous input embeddings X (n x d) start from N(0, 1) (keyed by seed and sample id) and
follow standard Adam (with bias correction); the recovered input is the nearest vocabulary
embedding at each position, found in vocabulary chunks so a (B*n, V) distance matrix never
exists at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from sodaray.search.adam import adam_step
from sodaray.search.denormals import flush_denormals
from sodaray.search.engine import base


@dataclass
class EmbeddingConfig(base.SearchConfig):
    """Defaults from the paper's ablation: gamma 0.065, betas (0.9, 0.995)."""

    learning_rate: float = 0.065
    beta1: float = 0.9
    beta2: float = 0.995
    eps: float = 1e-8
    init_std: float = 1.0
    distance: str = "euclidean"  # or "cosine"
    vocab_chunk: int = 8192

    algorithm = "embedding"
    display_name = "Embedding search"

    def batch_type(self) -> type[base.BatchSearch]:
        return EmbeddingBatch

    def validate(self) -> None:
        super().validate()
        if self.learning_rate <= 0:
            raise ValueError(f"learning_rate must be positive, not {self.learning_rate}")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise ValueError("beta1 and beta2 must be in [0, 1)")
        if self.distance not in ("euclidean", "cosine"):
            raise ValueError(f"distance must be euclidean or cosine, not {self.distance!r}")
        if self.vocab_chunk < 1:
            raise ValueError("vocab_chunk must be at least 1")


@torch.no_grad()
def nearest_tokens(
    x: Tensor, embedding: Tensor, *, distance: str = "euclidean", chunk: int = 8192
) -> Tensor:
    """Index of the nearest row of `embedding` (V, d) for each vector of x (..., d)."""
    flat = x.reshape(-1, x.shape[-1]).to(embedding.dtype)
    if distance == "cosine":
        flat = torch.nn.functional.normalize(flat, dim=-1)
    best_score = torch.full((len(flat),), float("-inf"), device=flat.device)
    best_index = torch.zeros(len(flat), dtype=torch.long, device=flat.device)
    for start in range(0, embedding.shape[0], chunk):
        rows = embedding[start : start + chunk]
        if distance == "cosine":
            score = flat @ torch.nn.functional.normalize(rows, dim=-1).T
        else:  # argmin |x - e|^2 = argmax 2 x.e - |e|^2
            score = 2 * (flat @ rows.T) - rows.pow(2).sum(-1)
        value, index = score.float().max(-1)
        better = value > best_score
        best_score = torch.where(better, value, best_score)
        best_index = torch.where(better, index + start, best_index)
    return best_index.view(x.shape[:-1])


class EmbeddingBatch(base.UniformBatch):
    """Continuous inputs (B, n, d) with their Adam moments, equal lengths, one config."""

    def start(self, entries: Sequence[base.SlotEntry]) -> dict[str, Tensor]:
        """X from N(0, init_std^2), keyed by (seed, sample id) so a sample starts alike in any
        batch; moments and the moment age at zero."""
        d = self.model.embedding_matrix.shape[1]
        dev = self.model.device
        keys = [base.keyed_generator(self.cfg.seed, e.sample_id, 0, "start") for e in entries]
        x = torch.stack([torch.randn((self.n, d), generator=g) for g in keys]).to(dev)
        zero = torch.zeros_like(x)  # copied into the slots' buffers: one serves every column
        return {"x": x * self.cfg.init_std, "m": zero, "v": zero, "age": zero[:, 0, 0]}

    @property
    def x(self) -> Tensor:
        return self.slots["x"]

    def step(self, steps_after: np.ndarray) -> base.StepOutcome:
        x = self.x.detach().requires_grad_(True)
        with torch.enable_grad(), flush_denormals(x.device):  # gradient pass only
            embeds = x.to(self.model.dtype)
            loss = self.loss(embeds, self.batch)
            (grad,) = torch.autograd.grad(loss.sum(), x)
        c = self.cfg
        age = self.slots["age"]
        age += 1
        per_slot = age.view(-1, 1, 1)
        hyper = dict(learning_rate=c.learning_rate, beta1=c.beta1, beta2=c.beta2, eps=c.eps)
        correction = (1 - c.beta1**per_slot, 1 - c.beta2**per_slot)
        adam_step(self.x, grad, self.slots["m"], self.slots["v"], **hyper, correction=correction)
        scaled = self.x / self.model.embed_scale  # nearest to the scaled rows the model looks up
        emb = self.model.embedding_matrix
        tokens = nearest_tokens(scaled, emb, distance=c.distance, chunk=c.vocab_chunk)
        found = self.check(tokens)
        return self.outcome(found, loss)
