"""The budget tables and figure (`sodaray report --extrapolate STEPS`): exact against the step
budget per model, configuration and input length, measured with Wilson intervals, and
extrapolated to STEPS with bootstrap intervals (`extrapolate` holds the statistics and says what
each extrapolation assumes)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from sodaray.report import drawing
from sodaray.report import extrapolate as bud
from sodaray.report.rows import by_setting, named, standard_rows, tuning_rows
from sodaray.report.tables import Cell, Table

LABELS = {
    "weibull": "Weibull",
    "loglogistic": "log-logistic",
    "weibull_cure": "Weibull with a never-found share",
    "loglinear": "log-linear in steps",
}
CURVE_POINTS = 40  # steps between 1 and the target at which the fitted curves are drawn


@dataclass
class Group:
    """One curve: a model, its configuration, an input length, and the fit of its rows."""

    model: str
    setting: str
    length: int
    rows: pd.DataFrame
    fit: bud.BudgetFit

    @property
    def label(self) -> str:
        return f"{named(self.model, self.setting)} / length {self.length}"


def groups(df: pd.DataFrame, target: int, *, where: str) -> list[tuple]:
    """`budget_rows` by model, configuration and input length (one step budget each: `max_steps`
    is part of a configuration), in the tables' order, for `fitted`. Cheap, so a report checks
    them before it writes or fits anything: a group's rows that cannot be samples of its budget
    (an error naming `where`, the result files or folders), then `target` below the step budget
    the rows ran (10 steps measured, `--extrapolate 1` would "extrapolate" where the share is
    known)."""
    parts = []
    base = budget_rows(df)
    for model, rows in sorted(base.groupby("model_name"), key=lambda kv: str(kv[0])):
        for setting, part in by_setting(rows):
            for length, sel in sorted(part.groupby(part["length"].astype(int))):
                parts.append((str(model), setting, int(length), sel, _samples(sel, where)))
    budget = max((samples.budget for *_, samples in parts), default=target)
    if target < budget:
        raise ValueError(
            f"--extrapolate {target:,}: below the measured step budget ({budget:,} steps); "
            "give a larger number of steps (the budget table measures shares within it)"
        )
    return parts


def fitted(parts: list[tuple], target: int) -> list[Group]:
    """Each of `groups`' parts extrapolated to `target` steps."""
    out = []
    for model, setting, length, sel, samples in parts:
        # One fit per group, evaluated where the table and the figure need it.
        steps = sorted(set(_targets(target)) | set(_curve_steps(samples.budget, target)))
        out.append(Group(model, setting, length, sel, bud.extrapolate(samples, steps)))
    return out


def _samples(sel: pd.DataFrame, where: str) -> bud.Samples:
    """A group's rows as `extrapolate.Samples` under the group's step budget (its `max_steps`); a
    ValueError naming `where` and the first row past the budget (or not a count of steps)."""
    budget = int(sel["max_steps"].astype(int).max())
    try:
        return bud.Samples.from_rows(
            sel["steps"], sel["found"].astype(bool), sel["exact"].astype(bool), budget
        )
    except ValueError as exc:
        steps = sel["steps"].astype(float)
        bad = sel[~np.isfinite(steps) | (steps < 0) | (steps > budget)]
        if bad.empty:
            raise ValueError(f"{where}: {exc}") from exc
        row = bad.iloc[0]
        job = row["job"] or "an `invert` run"
        raise ValueError(
            f"{where}: sample {row['sample_id']} of {job} took {row['steps']} steps, outside "
            f"its step budget (max_steps {budget:,}): not rows a search wrote"
        ) from exc


def budget_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The rows the budget tables measure and extrapolate from (`groups`): SODA's paper-table
    rows (main dataset, fixed lengths, no tuning trials) with true inputs known."""
    base = standard_rows(df[(df["algorithm"] == "soda") & ~tuning_rows(df)])
    return base[base["length"].notna() & base["exact"].notna()]


def _targets(target: int) -> list[int]:
    """The steps the table shows: the usual ones up to `target`, and `target` itself."""
    return sorted({t for t in bud.TARGETS if t < target} | {int(target)})


def _curve_steps(budget: int, target: int) -> list[int]:
    """Where the fitted curves are drawn: log-spaced from 1 to `target`, with the budget."""
    grid = np.unique(np.geomspace(1, max(target, budget), CURVE_POINTS).astype(int))
    return sorted({int(x) for x in grid} | {budget, target})


def _estimate(e: bud.Estimate) -> Cell:
    text = f"{100 * e.value:.1f} ({100 * e.low:.1f}–{100 * e.high:.1f})"
    return Cell(text, e.value, e.low, e.high)


def budget_tables(found: list[Group], target: int) -> list[Table]:
    """`budget`: the measured share exact within each fraction of the budget (Wilson 95%), and
    `budget_extrapolated`: each fit's share at the budget and beyond, to `target` (bootstrap
    95%), with the fit's parameters."""
    fractions = ("1/8", "1/4", "1/2", "1")
    measured = Table(
        "budget",
        "Exact by step budget, measured",
        "Exact (%) within a share of each group's step budget (the searches' own steps: a "
        "search's first s steps do not depend on its budget), Wilson 95% interval; n: samples. "
        "At any larger budget the share can only grow: the last column is a lower bound there.",
        ["Model / length", "budget", "n", *(f"{f} of it" for f in fractions)],
    )
    for g in found:
        s = g.fit.samples
        steps = [max(1, s.budget // part) for part in (8, 4, 2, 1)]
        shares = bud.measured(s, steps)
        cells = [Cell(f"{s.budget:,}", float(s.budget)), Cell.count(s.n)]
        measured.rows.append((g.label, cells + [Cell.rate(shares[t]) for t in steps]))
    targets = _targets(target)
    extrapolated = Table(
        "budget_extrapolated",
        f"Exact extrapolated to {target:,} steps",
        "Exact (%) each fit gives at the group's budget and beyond (the fit on the samples; "
        f"2.5th–97.5th percentiles over {bud.BOOTSTRAP:,} bootstrap resamples of the samples), "
        "and its parameters. Weibull and log-logistic assume every input is found eventually at "
        "a rate the budget's finds set; the cure model lets a share never be found; log-linear "
        "continues the measured share's line against log(steps). Each interval is sampling "
        "uncertainty under its own assumption: where the fits disagree, the rows do not decide. "
        "Searches that stopped at another input with the same outputs are never exact and scale "
        "every fit down. `sodaray.report.extrapolate` says more.",
        ["Model / length / fit", "at the budget", *(f"{t:,}" for t in targets), "parameters"],
    )
    for g in found:
        fit = g.fit
        if not fit.extrapolated:
            blank = [Cell("")] * (len(targets) + 1)
            extrapolated.rows.append((g.label, [Cell("no exact find: no fit")] + blank))
            continue
        for model in bud.MODELS:
            by_target = fit.extrapolated[model]
            at_budget = fit.fitted_at_budget.get(model)
            cells = [Cell("–" if at_budget is None else f"{100 * at_budget:.1f}", at_budget)]
            cells += [_estimate(by_target[t]) for t in targets]
            cells.append(Cell(_parameters(fit, model)))
            extrapolated.rows.append((f"{g.label} / {LABELS[model]}", cells))
    return [measured, extrapolated]


def _parameters(fit: bud.BudgetFit, model: str) -> str:
    if model not in fit.params:
        return "–"
    scale, shape = fit.params[model]
    text = f"scale {scale:,.0f} steps, shape {shape:.2f}"
    if model == "weibull_cure" and fit.cure_share is not None:
        text += f", found share {100 * fit.cure_share:.0f}%"
    if fit.at_edge.get(model):
        text += " (scale at the fit's edge: too few finds to place it)"
    return text


def _budget_panel(ax, g: Group, target: int) -> None:
    """One panel of `budget_figure`: `g`'s measured share and each fit's curve."""
    samples = g.fit.samples
    steps = _curve_steps(samples.budget, target)

    def curve(points: dict, color: str, hatch: str, z: int, step: str | None = None, **line):
        """A line through `points` (step -> share) over its hatched interval band."""
        xs, shares = list(points), list(points.values())
        (drawn,) = ax.plot(xs, [100 * p.value for p in shares], color=color, zorder=z + 2, **line)
        bounds = [(p.low, p.high) for p in shares]
        return drawing.interval_band(
            ax, xs, bounds, color, hatch, step=step, linewidth=0.5, zorder=z
        ), drawn

    handles, labels = [], []
    for j, model in enumerate(bud.MODELS):
        style = drawing.series_style(j + 1)
        est = {s: g.fit.extrapolated[model][s] for s in steps}
        handles.append(curve(est, style.color, style.hatch, 1, linestyle=style.dash))
        labels.append(f"{LABELS[model]}, 95% bootstrap")
    measured = bud.measured(samples, list(range(1, samples.budget + 1)))
    hatch = drawing.series_style(0).hatch
    line = {"drawstyle": "steps-post", "linewidth": 1.6}
    handles.insert(0, curve(measured, "black", hatch, 2, "post", **line))
    labels.insert(0, f"measured (n={samples.n}), 95% Wilson")
    ax.axvline(samples.budget, color="grey", linestyle=":", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlim(1, max(target, samples.budget) * 1.05)
    drawing.percent_axis(ax)
    ax.set_ylabel("exact (%)")
    ax.set_title(f"{g.label} (n={samples.n})", fontsize="small")
    drawing.legend_outside(ax, handles, labels, f"dotted: budget {samples.budget:,}")


def budget_figure(found: list[Group], target: int) -> drawing.Plot | None:
    """A panel per model, configuration and length: the measured share exact by step (a step
    function to the budget, its Wilson band hatched), and each fit's curve from step 1 to
    `target` with its bootstrap band (hatched, one hatching per fit), on a log step axis."""
    if not (drawn := [g for g in found if g.fit.extrapolated]):
        return None
    plt = drawing.pyplot()
    fig, axes = plt.subplots(
        len(drawn), 1, figsize=(8.5, 3.2 * len(drawn)), squeeze=False, sharex=True
    )
    for (ax,), g in zip(axes, drawn, strict=True):
        _budget_panel(ax, g, target)
    axes[-1][0].set_xlabel("steps (log scale)")
    rows = pd.concat([g.rows for g in drawn])
    counts = [g.fit.samples.n for g in drawn]
    what = f"Exact vs step budget, extrapolated to {target:,}"
    fig.suptitle(drawing.title(rows, what, counts), fontsize="medium")
    caption = (
        f"Exact inversion against the step budget ({drawing.source(rows)}), a panel per model, "
        "configuration and input length: the measured share exact within s steps (black step "
        "function to the dotted budget line; hatched: 95% Wilson interval), and four fits of "
        f"the per-sample steps to an exact find continued to {target:,} steps, each with its "
        f"95% bootstrap band ({bud.BOOTSTRAP:,} resamples of the samples): Weibull, "
        "log-logistic, Weibull with a never-found share, and a line in log(steps). Past the "
        "budget nothing is measured: the bands are each fit's sampling uncertainty under its "
        "own assumption (see the budget_extrapolated table). n: samples, per panel: "
        + "; ".join(f"{g.label}: n={n}" for g, n in zip(drawn, counts, strict=True))
        + "."
    )
    return drawing.Plot(fig, caption)


def check_target(target: int) -> int:
    """`--extrapolate`'s steps: a whole number from 1 to 10^9."""
    if isinstance(target, bool) or not isinstance(target, int) or not 1 <= target <= 10**9:
        raise ValueError(f"--extrapolate takes a number of steps from 1 to 10^9, not {target!r}")
    return target
