"""The position scan: after a search ends unfound, every single-token change of its final input,
one position at a time (the first position first), each decided by the exact match check.

Why: a failed search is often one token off, at the first position (the one whose signal
reaches the output only through the later ones), where neither the rank of the true token in Z
nor the loss gradient points at it, so the scan tries all V tokens there. It costs
`length x V` candidate forwards at most: a few hundred sample-steps' work on a vocabulary of
512, several step budgets per position on a large one, so it is off by default
(`SodaConfig.scan_positions`).
"""

from __future__ import annotations

import numpy as np
import torch

from sodaray.model.loaded import LoadedModel
from sodaray.objective.observations import BatchTargets, screen_slack
from sodaray.objective.scoring import hard_match
from sodaray.objective.targets import TargetSet

CHUNK = 512  # candidates decided per batch: the screen holds (CHUNK, m, V) logits


def position_scan(
    model: LoadedModel, targets: TargetSet, row: int, tokens: list[int], chunk: int = CHUNK
) -> list[int] | None:
    """The first single-token change of `tokens` (position 0 first, tokens in id order) that
    reproduces target `row` exactly, or None. Deterministic: the check decides each candidate
    as it would alone (`scoring.check_sequences`)."""
    batch = BatchTargets.from_set(targets, np.asarray([row]), model.device, screen_slack(model))
    vocab = model.vocab_size
    base = torch.tensor(tokens, dtype=torch.long, device=model.device)
    for position in range(len(tokens)):
        for start in range(0, vocab, chunk):
            ids = torch.arange(start, min(start + chunk, vocab), device=model.device)
            candidates = base.expand(len(ids), -1).clone()
            candidates[:, position] = ids
            rows = torch.zeros(len(ids), dtype=torch.long, device=model.device)
            match = hard_match(
                model, targets.objective, candidates, batch, targets.atol, targets.rtol, rows
            )
            hits = match.nonzero()
            if len(hits):
                return candidates[int(hits[0])].tolist()
    return None
