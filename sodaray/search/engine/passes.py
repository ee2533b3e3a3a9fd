"""What a transformer pass costs beyond its positions, measured: the scheduler's input for
splitting a step into passes (`sodaray.search.engine.scheduler.plan_passes`).

A pass pads every sequence in it to the longest, so it costs about `overhead + slots x width`
positions, `overhead` being its kernel launches and dispatch, in positions. The split may change
from step to step: with the width-invariant attention it changes no result. `pass_overhead`
measures it once per model on its device: two forward passes of different sizes, a straight
line through them (about a hundred positions for stories260K on a 2-core CPU, thousands on a
GPU, where one pass takes everything).
"""

from __future__ import annotations

import logging
import time
import weakref

import numpy as np
import torch

from sodaray.model.loaded import LoadedModel

log = logging.getLogger(__name__)

MAX_OVERHEAD = 1e6  # positions: a pass costs nothing next to padding (one pass for all)
_OVERHEAD: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def pass_overhead(model: LoadedModel) -> float:
    """What a transformer pass costs beyond its positions, in positions (measured once per
    model; a slope that noise made flat or negative counts as no per-position cost)."""
    key = model.model
    if key not in _OVERHEAD:
        small, large = _forward_seconds(model, 1), _forward_seconds(model, 6)
        # pad_rows adds an item (and more up to `row_rule(device)[0]` rows): 2 and 7 items of 8.
        per_position = (large - small) / (7 * 8 - 2 * 8)
        fit = small / per_position - 2 * 8 if per_position > 0 else MAX_OVERHEAD
        _OVERHEAD[key] = overhead = float(np.clip(fit, 0.0, MAX_OVERHEAD))
        log.info("%s: a pass costs %.0f positions beyond its own", model.name, overhead)
    return _OVERHEAD[key]


def _forward_seconds(model: LoadedModel, batch: int, width: int = 8, repeats: int = 2) -> float:
    x = torch.zeros(batch, width, model.width, device=model.device, dtype=model.dtype)
    best = float("inf")
    with torch.no_grad():
        for _ in range(repeats + 1):  # the first warms up
            _sync(model.device)
            start = time.perf_counter()
            model.hidden(x)
            _sync(model.device)
            best = min(best, time.perf_counter() - start)
    return best


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
