"""What a trial is worth: its value under the study's metric, and what it reports to the pruner
at each checkpoint."""

from __future__ import annotations

import math
from collections.abc import Sequence

# What each metric's value is, as an axis or a column says it (the plots, the leaderboard).
METRIC_LABELS = {
    "exact": "exact rate (share of validation samples recovered exactly)",
    "exact_per_second": "exact inversions per second of search",
    "exact_then_loss": "exact rate, ties broken by the mean final loss (exact_then_loss)",
}
SIGNALS = ("loss", "tokens", "exact")  # what a checkpoint may report (`checkpoint_value`)


def trial_value(metric: str, exact: int, total: int, seconds: float, losses: list[float]) -> float:
    """A trial's objective value (maximised). `exact`: the exact rate. `exact_per_second`:
    exact inversions per second of search. `exact_then_loss`: the exact rate, ties broken by the
    mean final relaxed loss, a term below one sample's worth of exact rate (a signal for the
    sampler where a budget solves almost nothing)."""
    if metric == "exact_per_second":
        return exact / max(seconds, 1e-9)
    rate = exact / total
    if metric == "exact_then_loss":
        finite = [x for x in losses if math.isfinite(x)]
        mean = sum(finite) / len(finite) if finite else math.inf
        closeness = 1.0 - math.tanh(mean) if math.isfinite(mean) else 0.0  # in [0, 1]
        return rate + closeness / (total + 1)
    return rate


def checkpoint_steps(max_steps: int, count: int) -> tuple[int, ...]:
    """The steps at which a trial reports to the pruner: `count` evenly spaced, the last at
    its budget."""
    return tuple(sorted({max(1, -(-(j + 1) * max_steps // count)) for j in range(count)}))


def checkpoint_value(
    signal: str, exact: int, total: int, losses: Sequence[float], shares: Sequence[float]
) -> float:
    """What a checkpoint reports to the pruner (maximised): the exact rate at the checkpoint,
    ties broken by the samples' mean relaxed loss there (`loss`: as `exact_then_loss` breaks
    a trial's) or by their mean share of true tokens in place (`tokens`). Either tie-break is
    below one sample's worth of exact rate, so the value never ranks fewer finds above more;
    unlike the exact rate alone, it differs between trials before any has found anything.
    Without per-sample values (an algorithm that reports none), the exact rate."""
    if signal == "loss" and losses:
        return trial_value("exact_then_loss", exact, total, 0.0, list(losses))
    if signal == "tokens" and shares:
        return exact / total + (sum(shares) / len(shares)) / (total + 1)
    return exact / total
