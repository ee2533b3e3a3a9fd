"""Embedding-search baseline (paper appendix Algorithm 2).

Continuous input embeddings X (n x d) start from N(0, 1) and follow standard Adam (with bias
correction); the recovered input is the nearest vocabulary embedding at each position, found in
vocabulary chunks so a (B*n, V) distance matrix never exists at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from sodaray.models import LoadedModel
from sodaray.objectives import context_embeds, objective_loss
from sodaray.search.adam import adam_step
from sodaray.search.base import BatchState, SearchConfig, StepOutcome
from sodaray.search.denormals import flush_denormals
from sodaray.targets import TargetSet


@dataclass
class EmbeddingConfig(SearchConfig):
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
        score = score.float()
        value, index = score.max(-1)
        better = value > best_score
        best_score = torch.where(better, value, best_score)
        best_index = torch.where(better, index + start, best_index)
    return best_index.view(x.shape[:-1])


class EmbeddingBatch(BatchState):
    """Continuous inputs (B, n, d) with their Adam moments."""

    def __init__(
        self,
        model: LoadedModel,
        targets: TargetSet,
        length: int,
        config: EmbeddingConfig,
        slots: int,
        generator: torch.Generator,
    ) -> None:
        super().__init__(model, targets, length, config, slots, generator)
        d = model.embedding_matrix.shape[1]
        dev = model.device
        self.x = torch.zeros((slots, length, d), device=dev, dtype=torch.float32)
        self.m = torch.zeros_like(self.x)
        self.v = torch.zeros_like(self.x)
        self.age = torch.zeros(slots, device=dev, dtype=torch.float32)

    def add(self, slots: Tensor, rows: np.ndarray) -> None:
        shape = (len(slots), self.n, self.x.shape[-1])
        init = torch.randn(shape, generator=self.generator, device=self.generator.device)
        self.x[slots] = init.to(self.x.device) * self.cfg.init_std
        self.m[slots] = 0.0
        self.v[slots] = 0.0
        self.age[slots] = 0.0
        self.add_targets(slots, rows)

    def keep(self, slots: Tensor) -> None:
        self.x, self.m, self.v = self.x[slots], self.m[slots], self.v[slots]
        self.age = self.age[slots]
        self.keep_targets(slots)

    def step(self, steps_after: np.ndarray) -> StepOutcome:
        x = self.x.detach().requires_grad_(True)
        with torch.enable_grad(), flush_denormals(x.device):  # gradient pass only
            embeds = x.to(self.model.dtype)
            hidden = self.model.hidden(context_embeds(self.model, embeds, self.batch))
            loss = objective_loss(self.model, self.objective, hidden, self.n, self.batch)
            (grad,) = torch.autograd.grad(loss.sum(), x)
        c = self.cfg
        self.age += 1
        adam_step(
            self.x,
            grad,
            self.m,
            self.v,
            learning_rate=c.learning_rate,
            beta1=c.beta1,
            beta2=c.beta2,
            eps=c.eps,
            step=self.age,
        )
        tokens = nearest_tokens(
            self.x / self.model.embed_scale,  # nearest to the scaled rows the model looks up
            self.model.embedding_matrix,
            distance=self.cfg.distance,
            chunk=self.cfg.vocab_chunk,
        )
        found = self.check(tokens)
        return StepOutcome(found=found, tokens=tokens, loss=loss.detach())
