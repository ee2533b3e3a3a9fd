"""How a batch of searches of mixed lengths is split into transformer passes.

A pass pads every sequence in it to the longest, so it costs about `overhead + slots x width`
sequence positions, where `overhead` is what a pass costs beyond its positions (kernel launches,
Python dispatch), expressed in positions. Few passes waste positions on padding; many waste the
overhead. `plan_passes` picks the split of the length-sorted slots that costs least (dynamic
programming over the distinct lengths present: a few dozen at most), each step the batch's
membership changed.

The split is free to change from step to step because it changes no result: with the model's
width-invariant attention (`sodaray.attention`), a search's arithmetic does not depend on the
width of its pass or on its neighbours. Without it (a model that kept its own attention, or
`mix_lengths=False`), each pass holds one length.

`pass_overhead` measures the overhead once per model on its device: two forward passes of
different sizes, a straight line through them. On a 2-core CPU, stories260K's is about a hundred
positions (a pass is mostly dispatch), a 0.5B model's a few; on a GPU below its compute limit it
is in the thousands, so one pass takes everything.
"""

from __future__ import annotations

import logging
import time
import weakref

import numpy as np
import torch

from sodaray.models import LoadedModel

log = logging.getLogger(__name__)

MAX_OVERHEAD = 1e6  # positions: a pass costs nothing next to padding (one pass for all)
_OVERHEAD: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def plan_passes(
    lengths: np.ndarray, fixed: int, overhead: float, mix: bool = True
) -> list[np.ndarray]:
    """Slot indices grouped into passes: slot b has `lengths[b]` input tokens and `fixed` other
    positions (prefix, observed continuation). Each pass holds a run of the distinct lengths;
    with `mix` False, exactly one."""
    distinct, inverse, counts = np.unique(lengths, return_inverse=True, return_counts=True)
    k = len(distinct)
    if k <= 1:
        return [np.arange(len(lengths))] if len(lengths) else []
    if not mix:
        bounds = list(range(k + 1))
    else:
        before = np.concatenate([[0], np.cumsum(counts)])
        best = np.full(k + 1, np.inf)
        best[0] = 0.0
        cut = np.zeros(k + 1, dtype=np.int64)
        for j in range(1, k + 1):
            width = fixed + int(distinct[j - 1])
            for i in range(j):
                cost = best[i] + overhead + (before[j] - before[i]) * width
                if cost < best[j]:
                    best[j], cut[j] = cost, i
        bounds = [k]
        while bounds[-1] > 0:
            bounds.append(int(cut[bounds[-1]]))
        bounds.reverse()
    return [
        np.flatnonzero((inverse >= lo) & (inverse < hi))
        for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)
    ]


def pass_overhead(model: LoadedModel) -> float:
    """What a transformer pass costs beyond its positions, in positions (measured once per
    model; a slope that noise made flat or negative counts as no per-position cost)."""
    key = model.model
    if key not in _OVERHEAD:
        small, large = _forward_seconds(model, 1), _forward_seconds(model, 6)
        # pad_rows adds an item (and more up to `invariant_rows` rows): 2 and 7 items of 8.
        per_position = (large - small) / (7 * 8 - 2 * 8)
        if per_position <= 0:
            overhead = MAX_OVERHEAD
        else:
            overhead = float(np.clip(small / per_position - 2 * 8, 0.0, MAX_OVERHEAD))
        _OVERHEAD[key] = overhead
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
