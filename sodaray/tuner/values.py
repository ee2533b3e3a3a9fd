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
    """A trial's objective value (maximised) under `metric` (`METRIC_LABELS`); the loss's
    tie-break is below one sample's worth of exact rate."""
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
    """What a checkpoint reports to the pruner (maximised): the exact rate there, ties broken
    by the samples' mean relaxed loss (`loss`) or mean share of true tokens in place (`tokens`),
    below one sample's worth of exact rate; the exact rate alone without per-sample values."""
    if signal == "loss" and losses:
        return trial_value("exact_then_loss", exact, total, 0.0, list(losses))
    if signal == "tokens" and shares:
        return exact / total + (sum(shares) / len(shares)) / (total + 1)
    return exact / total
