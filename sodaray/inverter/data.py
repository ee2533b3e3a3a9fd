"""Training pairs for the inverter: Random inputs (the project's own builder) and the target
model's greedy continuation of each, which is what the text objective observes."""

from __future__ import annotations

import logging

import numpy as np
import torch
from torch import Tensor

from sodaray.data.samples import random_samples
from sodaray.model.loaded import LoadedModel
from sodaray.objective.targets import greedy_continuation

log = logging.getLogger(__name__)


def build_pairs(
    model: LoadedModel,
    lengths: list[int],
    per_length: int,
    output_tokens: int,
    seed: int,
    batch_size: int = 256,
    keep_logits: bool = False,
) -> tuple[list[list[int]], Tensor, Tensor | None]:
    """Random inputs of each length, their greedy continuations (N, output_tokens) and, with
    `keep_logits`, the logits at those positions (N, output_tokens, V): what the logits
    objective observes (with output_tokens=1, the next-token distribution)."""
    if per_length < 1 or output_tokens < 1:
        raise ValueError("per_length and output_tokens must be at least 1")
    samples = random_samples(model.vocab_size, lengths, per_length, seed)
    inputs = [s[2] for s in samples]
    outs: list[Tensor] = []
    seen: list[Tensor] = []
    with torch.no_grad():
        for length in lengths:
            rows = [x for x in inputs if len(x) == length]
            for start in range(0, len(rows), batch_size):
                chunk = torch.tensor(rows[start : start + batch_size], device=model.device)
                cont, logits = greedy_continuation(model, chunk, output_tokens)
                outs.append(cont.cpu())
                if keep_logits:
                    seen.append(logits.float().cpu())
    # random_samples emits lengths in order, so this order matches `inputs`.
    return inputs, torch.cat(outs), torch.cat(seen) if keep_logits else None


def encode_targets(inputs: list[list[int]], pad_id: int, eos_id: int) -> Tensor:
    """Decoder labels: the input then eos, padded with -100 (ignored by the loss)."""
    width = max(len(x) for x in inputs) + 1
    labels = np.full((len(inputs), width), -100, dtype=np.int64)
    for i, x in enumerate(inputs):
        labels[i, : len(x)] = x
        labels[i, len(x)] = eos_id
    return torch.from_numpy(labels)
