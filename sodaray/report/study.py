"""What a finished tuning study shows: its leaderboard and its plots, from an Optuna study
object (whatever storage it came from)."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MIN_TRIALS_FOR_IMPORTANCE = 8  # fewer completed trials make fANOVA importances noise


def leaderboard(study: Any, top: int = 10) -> dict[str, Any]:
    """State counts and the `top` completed trials, best first."""
    import optuna

    trials = study.get_trials(deepcopy=False)
    done = sorted(
        (t for t in trials if t.state == optuna.trial.TrialState.COMPLETE), key=lambda t: -t.value
    )
    counts = {s.name.lower(): sum(t.state == s for t in trials) for s in optuna.trial.TrialState}
    return {
        "study": study.study_name,
        "trials": len(trials),
        "states": {k: v for k, v in counts.items() if v},
        "top": [
            {"rank": rank, "trial": t.number, "value": t.value, "params": t.params}
            for rank, t in enumerate(done[:top], start=1)
        ],
    }


def save_plots(study: Any, folder: Path) -> list[Path]:
    """The study's history (every trial: completed as dots, pruned as crosses at their last
    reported value, the best so far as a line; integer trial numbers), and, with enough
    completed trials, Optuna's parameter importances and parallel coordinates, as PNG."""
    import optuna

    complete = optuna.trial.TrialState.COMPLETE
    done = study.get_trials(deepcopy=False, states=(complete,))
    if not done:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    folder.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    pruned = [
        t
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.PRUNED,))
        if t.intermediate_values
    ]
    ax.scatter([t.number for t in done], [t.value for t in done], label="completed", zorder=3)
    if pruned:
        last = [t.intermediate_values[max(t.intermediate_values)] for t in pruned]
        ax.scatter(
            [t.number for t in pruned],
            last,
            marker="x",
            color="grey",
            label="pruned (last reported value)",
            zorder=2,
        )
    best, line = float("-inf"), []
    for t in done:
        best = max(best, t.value)
        line.append((t.number, best))
    ax.step(*zip(*line, strict=True), where="post", color="C3", label="best so far")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(
        xlabel="trial",
        ylabel="objective value",
        title=f"study {study.study_name}: {len(done)} completed, {len(pruned)} pruned",
    )
    ax.legend(loc="lower right")
    made = [_save(fig, folder / "history.png")]
    if len(done) < MIN_TRIALS_FOR_IMPORTANCE:
        log.info(
            "importances and parallel coordinates need %d completed trials, not %d",
            MIN_TRIALS_FOR_IMPORTANCE,
            len(done),
        )
        return made
    from optuna.visualization import matplotlib as ovm

    for name, plot in {
        "importances": ovm.plot_param_importances,
        "parallel_coordinate": ovm.plot_parallel_coordinate,
    }.items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Optuna's matplotlib plots are experimental
                ax = plot(study)
            fig = ax.figure if hasattr(ax, "figure") else ax.flat[0].figure
            fig.set_size_inches(10, 5.5)
            for label in fig.axes[0].get_xticklabels():
                label.set_rotation(20)
            made.append(_save(fig, folder / f"{name}.png"))
        except (ValueError, RuntimeError, ImportError) as exc:  # e.g. too few distinct values
            log.info("plot %s skipped: %s", name, exc)
    return made


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
