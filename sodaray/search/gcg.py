"""GCG baseline (paper appendix Algorithm 3, after Zou et al. 2023).

Per target, one-hot inputs start from random tokens (keyed by seed and sample id). Each step:
the gradient of the loss with respect to the one-hot gives, per position, the top-k most
promising replacement tokens; each of `num_candidates` candidates changes one uniformly chosen
position to one of that position's top-k tokens, chosen uniformly; all candidates of all samples
are scored by the model in chunks and each sample moves to its best candidate; the hard-max
check stops a sample that matches.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from sodaray.model.loaded import LoadedModel
from sodaray.search.denormals import flush_denormals
from sodaray.search.engine import base

log = logging.getLogger(__name__)


@dataclass
class GcgConfig(base.SearchConfig):
    """GCG's knobs, defaulting to the paper's: top-k 128, 700 candidates, 700 steps."""

    max_steps: int = 700
    # Each position's best replacement tokens by gradient (the paper's top-k; named apart from
    # the objective's `top_k`, the number of observed logits).
    tokens_per_position: int = 128
    num_candidates: int = 700
    # Candidate sequences scored per forward; halves on out-of-memory instead of crashing.
    eval_batch_size: int = 4096
    exclude_tokens: list[int] = field(default_factory=list)

    algorithm = "gcg"
    display_name = "GCG"
    RENAMED: ClassVar[dict[str, str]] = {"top_k": "tokens_per_position"}

    def batch_type(self) -> type[base.BatchSearch]:
        return GcgBatch

    def validate(self) -> None:
        super().validate()
        if min(self.tokens_per_position, self.num_candidates, self.eval_batch_size) < 1:
            raise ValueError(
                "tokens_per_position, num_candidates and eval_batch_size must be at least 1"
            )


class GcgBatch(base.UniformBatch):
    """Current tokens (B, n) of a batch of equal-length GCG searches of one config."""

    def __init__(
        self, model: LoadedModel, config: GcgConfig, length: int, generator: torch.Generator
    ) -> None:
        super().__init__(model, config, length, generator)
        self.refuse(model, config)
        dev = model.device
        self.allowed = torch.ones(model.vocab_size, dtype=torch.bool, device=dev)
        if config.exclude_tokens:
            self.allowed[torch.tensor(config.exclude_tokens, device=dev)] = False
        self.allowed_ids = self.allowed.nonzero().squeeze(1)
        self.chunk = config.eval_batch_size

    @staticmethod
    def refuse(model: LoadedModel, config: GcgConfig) -> None:
        """Refuse a config this model's batches cannot take (the engine asks when a work is
        submitted, so a bad config fails its own work, not the engine)."""
        vocab = model.vocab_size
        bad = [t for t in config.exclude_tokens if not 0 <= t < vocab]
        if bad:
            raise ValueError(
                f"exclude_tokens: token id {bad[0]} is outside the vocabulary [0, {vocab})"
            )
        if len(set(config.exclude_tokens)) >= vocab:
            raise ValueError("exclude_tokens removes the whole vocabulary")

    def start(self, entries: Sequence[base.SlotEntry]) -> dict[str, Tensor]:
        """Random allowed tokens, drawn from a key of (seed, sample id): a sample starts from
        the same tokens whatever else enters the batch with it."""
        keys = [base.keyed_generator(self.cfg.seed, e.sample_id, 0, "start") for e in entries]
        count = len(self.allowed_ids)
        picks = torch.stack([torch.randint(count, (self.n,), generator=g) for g in keys])
        return {"tokens": self.allowed_ids[picks.to(self.allowed_ids.device)]}

    @property
    def tokens(self) -> Tensor:
        """Each slot's current tokens (B, n), in place."""
        return self.slots["tokens"]

    def step(self, steps_after: np.ndarray) -> base.StepOutcome:
        grad = self.one_hot_gradient()
        candidates = self.sample_candidates(grad)  # (B, C, n)
        losses = self.score(candidates)  # (B, C)
        best = losses.argmin(1)
        rows = torch.arange(len(best), device=best.device)
        self.tokens.copy_(candidates[rows, best])
        loss = losses[rows, best]
        found = self.check(self.tokens.clone())
        return self.outcome(found, loss)

    def one_hot_gradient(self) -> Tensor:
        one_hot = F.one_hot(self.tokens, self.model.vocab_size).to(self.model.dtype)
        one_hot.requires_grad_(True)
        fluency = self.objective.fluency_weight > 0
        # Denormals flushed in the gradient pass only (see search/denormals.py); scoring and the
        # hard check run without it.
        with torch.enable_grad(), flush_denormals(one_hot.device):
            embeds = self.model.relaxed_embeds(one_hot @ self.model.embedding_matrix)
            probs = one_hot.reshape(-1, one_hot.shape[-1]) if fluency else None
            loss = self.loss(embeds, self.batch, probs)
            (grad,) = torch.autograd.grad(loss.sum(), one_hot)
        return grad

    @torch.no_grad()
    def sample_candidates(self, grad: Tensor) -> Tensor:
        """(B, C, n): each candidate swaps one uniform position for one of its top-k tokens."""
        B, n, _ = grad.shape
        k = min(self.cfg.tokens_per_position, len(self.allowed_ids))
        masked = grad.float().masked_fill(~self.allowed, float("inf"))
        top = (-masked).topk(k, dim=-1).indices  # (B, n, k): most negative gradient first
        C = self.cfg.num_candidates
        gen, dev = self.generator, self.generator.device
        pos = torch.randint(n, (B, C), generator=gen, device=dev).to(grad.device)
        choice = torch.randint(k, (B, C), generator=gen, device=dev).to(grad.device)
        new_tok = top.gather(1, pos[..., None].expand(B, C, k)).gather(2, choice[..., None])
        cands = self.tokens[:, None, :].expand(B, C, n).clone()
        cands.scatter_(2, pos[..., None], new_tok)
        return cands

    @torch.no_grad()
    def score(self, candidates: Tensor) -> Tensor:
        """Loss of every candidate (B, C), scored in chunks that shrink on out-of-memory."""
        B, C, n = candidates.shape
        flat = candidates.reshape(B * C, n)
        owner = torch.arange(B, device=flat.device).repeat_interleave(C)
        out = torch.empty(B * C, device=flat.device)
        start = 0
        while start < len(flat):
            size = min(self.chunk, len(flat) - start)
            try:
                part = slice(start, start + size)
                out[part] = self._loss(flat[part], owner[part])
            except (torch.OutOfMemoryError, RuntimeError) as exc:
                text = str(exc).lower()
                said = "out of memory" in text or "not enough memory" in text
                if not (said or isinstance(exc, torch.OutOfMemoryError)) or self.chunk == 1:
                    raise
                self.chunk = max(1, self.chunk // 2)
                log.warning(
                    "out of memory scoring %d candidates; retrying with %d", size, self.chunk
                )
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                continue
            start += size
        return out.view(B, C)

    def _loss(self, tokens: Tensor, owner: Tensor) -> Tensor:
        probs = None
        if self.objective.fluency_weight > 0:
            probs = F.one_hot(tokens.reshape(-1), self.model.vocab_size).float()
        return self.loss(self.model.embed(tokens), self.batch.select(owner), probs).float()
