"""What a finished tuning study shows: its leaderboard and its plots, from an Optuna study
object (whatever storage it came from)."""

from __future__ import annotations

import itertools
import logging
import warnings
from pathlib import Path
from typing import Any

from sodaray.errors import first_line
from sodaray.io.writes import OutputFolder
from sodaray.report.drawing import integer_axis, pyplot, save
from sodaray.report.tables import Skipped

log = logging.getLogger(__name__)

MIN_TRIALS_FOR_IMPORTANCE = 8  # fewer completed trials make fANOVA importances noise


def leaderboard(study: Any, top: int = 10) -> dict[str, Any]:
    """State counts, the `top` completed trials, best first, and the sample-steps the trials
    spent (pruned ones' included) and the pruner saved at most: from the trials' attributes, so
    a resumed study counts all its runs."""
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
        "sample_steps": {
            "spent": sum(int(t.user_attrs.get("sample_steps", 0)) for t in trials),
            "saved": sum(int(t.user_attrs.get("saved_steps", 0)) for t in trials),
        },
    }


def history_figure(study: Any, value_label: str = "objective value", metric: str = "exact"):
    """The study's history as a matplotlib figure: completed trials as dots at their value,
    the best so far as a step line, pruned trials as crosses at the exact rate of their last
    checkpoint (on their own axis where the study's metric is not a rate), integer trial
    numbers; the legend beside the axes, where it hides no point. None: no completed trial."""
    import optuna

    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if not done:
        return None
    fig, ax = pyplot().subplots(figsize=(9, 4.5))
    pruned = [
        t
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.PRUNED,))
        if t.intermediate_values
    ]
    numbers, values = [t.number for t in done], [t.value for t in done]
    handles = [ax.scatter(numbers, values, label="completed", zorder=3)]
    best = list(itertools.accumulate(values, max))
    handles += ax.step(numbers, best, where="post", color="C3", linestyle="--", label="best so far")
    if pruned:
        # Checkpoints report the exact rate (`tuner.values.checkpoint_value`): on the value's
        # axis when the metric is that rate (or with a tie-break), else on their own.
        rate_ax = ax if metric != "exact_per_second" else ax.twinx()
        if rate_ax is not ax:
            rate_ax.set_ylabel("exact rate at the last checkpoint (pruned)")
            rate_ax.set_ylim(-0.04, 1.04)
        last = [t.intermediate_values[max(t.intermediate_values)] for t in pruned]
        label = "pruned (its last checkpoint's exact rate, tie-broken)"
        at = [t.number for t in pruned]
        handles.append(rate_ax.scatter(at, last, marker="x", color="grey", label=label, zorder=2))
    integer_axis(ax.xaxis)
    if metric != "exact_per_second":  # (exact_then_loss: the rate plus less than one sample)
        # A rate: the whole 0-1 range, so a flat study does not look like a wide spread, and
        # a trial at 0 or 1 sits inside the frame rather than on it.
        ax.set_ylim(-0.04, 1.04)
    ax.set(
        xlabel="trial",
        ylabel=value_label,
        title=f"study {study.study_name}: {len(done)} completed, {len(pruned)} pruned",
    )
    ax.legend(
        handles=handles,
        loc="upper left",
        bbox_to_anchor=(1.12 if pruned and metric == "exact_per_second" else 1.02, 1.0),
        borderaxespad=0.0,
        fontsize="small",
    )
    return fig


def save_plots(
    study: Any,
    folder: Path,
    value_label: str = "objective value",
    metric: str = "exact",
    out: OutputFolder | None = None,
) -> tuple[list[Path], list[Skipped]]:
    """The study's history (`history_figure`) and, with enough completed trials, Optuna's
    parameter importances and parallel coordinates, as PNG in `folder` (below `out`, default
    `folder`, nothing through a link). Returns the files, and each plot not made with why."""
    out = OutputFolder(folder) if out is None else out
    import optuna

    if (fig := history_figure(study, value_label, metric)) is None:
        reason = "no completed trial yet"
        log.info("plots skipped: %s", reason)
        return [], [Skipped(name, reason) for name in PLOTS]
    made = [save(fig, folder / "history.png", out, dpi=110)]
    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if len(done) < MIN_TRIALS_FOR_IMPORTANCE:
        reason = (
            f"needs {MIN_TRIALS_FOR_IMPORTANCE} completed trials (fewer make parameter "
            f"importances noise), the study has {len(done)}"
        )
        log.info("importances and parallel coordinates skipped: %s", reason)
        return made, [Skipped(name, reason) for name in PLOTS[1:]]
    from optuna.visualization import matplotlib as ovm

    skipped = []
    plots = (ovm.plot_param_importances, ovm.plot_parallel_coordinate)
    for name, plot in zip(PLOTS[1:], plots, strict=True):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Optuna's matplotlib plots are experimental
                ax = plot(study)
            fig = ax.figure if hasattr(ax, "figure") else ax.flat[0].figure
            fig.set_size_inches(10, 5.5)
            for label in fig.axes[0].get_xticklabels():
                label.set_rotation(20)
            made.append(save(fig, folder / f"{name}.png", out, dpi=110))
        except (ValueError, RuntimeError, ImportError) as exc:  # e.g. too few distinct values
            log.info("plot %s skipped: %s", name, exc)
            skipped.append(Skipped(name, f"Optuna could not draw it: {first_line(exc)}"))
    return made, skipped


# The plots `save_plots` makes, in order.
PLOTS = ("history", "importances", "parallel_coordinate")
