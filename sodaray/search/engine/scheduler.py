"""The scheduler: what one replica runs next, as a plan. The engine and its batches only carry
plans out.

Pure (no torch, no Ray): what waits, what runs and what the device costs go in; which searches
enter, how many slots a batch holds and its transformer passes (slots and shapes) come out, under
a named policy, so every decision is a function a test can call (`tests/test_scheduler.py`).

Policies (`POLICIES`):
- "exact": each pass at its own shape. A pass pads its sequences to its longest and costs a
  fixed overhead besides, so the slots are split where padding would cost more than another
  pass (`plan_passes`, dynamic programming over the distinct lengths).
- "static": every pass at one of a few shapes, batch and width rounded up to the buckets of
  `CAPTURE_SHAPES`, so that a step can be captured once per shape and replayed; the padding's
  results are dropped. Where the exact path is invariant to its batch (one CPU thread, with
  the width-invariant attention), results are bit for bit those of "exact".
A run's policy follows from its executor and device (`executor.policy_for`).

`CAPTURE_SHAPES` is the one table of the bucketed shapes a captured step (and screen) runs at:
`static_batch`, `static_rows`, `static_width` and `static_screen` answer from it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

POLICIES = ("exact", "static")


@dataclass(frozen=True)
class CaptureShapes:
    """The buckets a captured step's shapes are rounded up to: its batch (`static_batch`), the
    (rows, V) state's rows (`static_rows`), a pass's input width (`static_width`) and a
    captured screen's candidates (`static_screen`); the `*_per_doubling` are powers of two."""

    min_batch: int = 8
    min_rows: int = 8
    rows_per_doubling: int = 8
    width_step: int = 16  # the attention's block (`sodaray.model.attention`)
    min_screen: int = 8
    screen_per_doubling: int = 4

    def __post_init__(self) -> None:
        for name in ("rows_per_doubling", "screen_per_doubling"):
            per = getattr(self, name)
            if per < 1 or per & (per - 1):
                raise ValueError(f"{name} must be a power of two, not {per}")


CAPTURE_SHAPES = CaptureShapes()


@dataclass(frozen=True)
class PassPlan:
    """One transformer pass: its slots (indices into the batch), and the batch size and input
    width it runs at (at least `len(slots)` and the slots' longest input)."""

    slots: np.ndarray
    batch: int
    width: int


@dataclass(frozen=True)
class Scheduler:
    """A policy and what it knows of the device: `overhead`, what a pass costs beyond its
    positions, in positions (measured per model, `passes.pass_overhead`); `mix`, whether inputs
    of different lengths may share a pass (the model's relaxed pass is width-invariant)."""

    policy: str
    overhead: float = 0.0
    mix: bool = True

    def __post_init__(self) -> None:
        check_policy(self.policy)

    def passes(self, lengths: np.ndarray, fixed: int) -> list[PassPlan]:
        """The passes of one step: slot b has `lengths[b]` input tokens and `fixed` other
        positions (prefix, observed continuation)."""
        plans = []
        for slots in plan_passes(lengths, fixed, self.overhead, self.mix):
            longest = int(lengths[slots].max())
            batch, width = len(slots), longest
            if self.policy == "static":
                batch = static_batch(batch)
                # Wider inputs only where the extra positions change no bit (the attention
                # is width-invariant); otherwise a pass keeps its own width.
                width = static_width(longest) if self.mix else longest
            plans.append(PassPlan(slots, batch, width))
        return plans


def check_policy(policy: str) -> str:
    """`policy` if it is one of `POLICIES`, else a one-line error naming them."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, not {policy!r}")
    return policy


def static_batch(count: int) -> int:
    """The next power of two from `CAPTURE_SHAPES.min_batch` (smaller batches would each be a
    shape of their own)."""
    return max(CAPTURE_SHAPES.min_batch, 1 << max(count - 1, 0).bit_length())


def static_rows(count: int) -> int:
    """The rows a captured step runs over for `count` live rows: `rows_per_doubling` sizes per
    power of two, so a bucket wastes at most 1/rows_per_doubling of the state's arithmetic and a
    handful of buckets (a capture each) covers a run."""
    return _per_doubling(count, CAPTURE_SHAPES.min_rows, CAPTURE_SHAPES.rows_per_doubling)


def static_screen(count: int) -> int:
    """The candidates a captured screen runs for `count`: `screen_per_doubling` sizes per power
    of two from `min_screen`, as the rows."""
    return _per_doubling(count, CAPTURE_SHAPES.min_screen, CAPTURE_SHAPES.screen_per_doubling)


def _per_doubling(count: int, least: int, per: int) -> int:
    """`count` rounded up to `least`, or to one of `per` (a power of two) sizes between two
    powers of two."""
    if count <= least:
        return least
    step = 1 << max(count.bit_length() - per.bit_length(), 0)
    return -(-count // step) * step


def static_width(longest: int) -> int:
    """The static input width for a longest input of `longest`: a power of two up to
    `width_step` (short inputs are the common case: a power of two at most doubles a pass's
    width), then a multiple of it (the attention pads to its block either way)."""
    step = CAPTURE_SHAPES.width_step
    if longest <= step:
        return 1 << max(longest - 1, 0).bit_length()
    return -(-longest // step) * step


def plan_passes(
    lengths: np.ndarray, fixed: int, overhead: float, mix: bool = True
) -> list[np.ndarray]:
    """Slot indices grouped into passes: slot b has `lengths[b]` input tokens and `fixed` other
    positions. A pass costs `overhead + slots x (fixed + its longest length)`; the split of the
    length-sorted slots that costs least, each pass a run of the distinct lengths; with `mix`
    False, exactly one length a pass."""
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


def admit(free: int, heads: Sequence[Sequence[int]]) -> list[int]:
    """How many waiting searches each pool of a family takes: `free` slots go to the waiting
    searches in the order they arrived, whichever pool they wait in; `heads[i]`: pool i's first
    waiting arrival numbers, in order (at least `free` of them, or all it has)."""
    taken = [0] * len(heads)
    for _, i in sorted((a, i) for i, h in enumerate(heads) for a in h)[: max(free, 0)]:
        taken[i] += 1
    return taken


def capacity(asked: Sequence[int]) -> int:
    """The slots a family's batches share: the largest batch any of its works asked for (each
    work's own batch is checked against the device's memory when it is submitted)."""
    return max(asked, default=0)


def pick_replica(loads: Mapping[int, int]) -> int | None:
    """The replica that takes the next unit: the least loaded (samples in flight) of those with
    room, the lowest index on a tie; None when none has room."""
    return min(loads, key=lambda i: (loads[i], i)) if loads else None
