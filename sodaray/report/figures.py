"""The report's figures as PNG: exact vs steps by input length, exact by token position, and
scaling (exact vs model size and vocabulary), a panel (or point) per configuration."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd

from sodaray.report import drawing, metrics
from sodaray.report.rows import by_setting, named, standard_rows, tuning_rows


def _model_settings(rows: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """A panel per model and configuration, labelled with what tells them apart (the model's
    name where the figure has more than one)."""
    models = sorted(rows["model_name"].dropna().unique())
    if len(models) < 2:
        return by_setting(rows)
    return [
        (named(str(model), setting), part)
        for model in models
        for setting, part in by_setting(rows[rows["model_name"] == model])
    ]


def _figure_rows(df: pd.DataFrame, *known: str) -> pd.DataFrame:
    """SODA's standard rows, tuning trials aside (as the tables: see `tuning_rows`), where the
    `known` columns are not null."""
    base = standard_rows(df[(df["variant"] == "SODA") & ~tuning_rows(df)])
    return base[base[list(known)].notna().all(axis=1)]


def _panel_figure(
    base: pd.DataFrame,
    height: float,
    draw: Callable[[Any, pd.DataFrame, list[int]], tuple[list, dict[int, int]]],
    count: Callable[[pd.DataFrame], int],
    axes_text: tuple[str, str, str],
    what: str,
    caption: str,
) -> drawing.Plot | None:
    """One panel per model and configuration (rows of different configurations are never one
    curve), each drawn by `draw(ax, rows, every length)` -> (legend handles, n by length);
    `axes_text`: the y label, the legend's title and the x label; `what` the title's first line;
    `caption` followed by each panel's n (`count`) and its n per length. None: no rows."""
    if base.empty:
        return None
    plt = drawing.pyplot()
    settings = _model_settings(base)
    fig, axes = plt.subplots(
        len(settings), 1, figsize=(7.5, height * len(settings)), squeeze=False, sharex=True
    )
    ylabel, legend, xlabel = axes_text
    panels = []
    all_lengths = sorted(int(x) for x in base["length"].unique())  # one style per length
    for (ax,), (setting, rows) in zip(axes, settings, strict=True):
        handles, by_length = draw(ax, rows, all_lengths)
        ax.set_ylabel(ylabel)
        drawing.percent_axis(ax)
        drawing.integer_axis(ax.xaxis)
        n = count(rows)
        ax.set_title(f"{setting} (n={n})" if setting else f"n={n}", fontsize="small")
        labels = [f"length {k} (n={v})" for k, v in by_length.items()]
        drawing.legend_outside(ax, handles, labels, legend)
        panels.append((setting, n, by_length))
    axes[-1][0].set_xlabel(xlabel)
    fig.suptitle(drawing.title(base, what, [n for _, n, _ in panels]), fontsize="medium")
    parts = [  # `temperature=0.05: n=12 (length 1: 4, ...)`
        f"{setting + ': ' if setting else ''}n={n} ("
        + ", ".join(f"length {k}: {v}" for k, v in by_length.items())
        + ")"
        for setting, n, by_length in panels
    ]
    panels_text = ("Panels: " if len(panels) > 1 else "") + "; ".join(parts) + "."
    return drawing.Plot(fig, f"{caption} n: samples. {panels_text}")


def _draw_steps(ax, rows: pd.DataFrame, all_lengths: list[int]):
    """A panel of `exact_vs_steps_figure`: a step function and its Wilson band per length."""
    handles, by_length = [], {}
    lengths = sorted(int(x) for x in rows["length"].unique())
    for j, n in enumerate(lengths):
        style = drawing.series_style(all_lengths.index(n))
        sel = rows[rows["length"] == n]
        # Evaluated at every find (where the function changes) and on an even grid (where
        # markers go): drawn as steps, it is the exact function, not a line between grid points.
        finds = {int(s) for s in sel.loc[sel["exact"].fillna(False).astype(bool), "steps"].dropna()}
        curve = metrics.solved_by_step(sel, sorted(set(metrics.solved_by_step(sel).index) | finds))
        count = by_length[n] = drawing.known_count(sel)
        every = max(1, len(curve) // 8)
        (line,) = ax.plot(
            curve.index,
            100 * curve.to_numpy(),
            drawstyle="steps-post",  # found by step s: constant until the next find
            color=style.color,
            marker=style.marker,
            linestyle=style.dash,
            markersize=5,
            markerfacecolor="none",  # hollow: a circle over a square shows both outlines
            markevery=(j * every // len(lengths), every),
            label=f"length {n} (n={count})",
            zorder=3,
        )
        bands = [metrics.wilson_interval(round(v * count), count) for v in curve]
        band = drawing.interval_band(
            ax,
            curve.index,
            bands,
            style.color,
            style.hatch,
            step="post",
            linestyle=style.dash,
            linewidth=0.6,
            label=f"length {n}: 95% Wilson band",
            zorder=1,
        )
        handles.append((band, line))
    return handles, by_length


def exact_vs_steps_figure(df: pd.DataFrame) -> drawing.Plot | None:
    """Exact vs steps, one step function per input length with its 95% Wilson band, one panel
    per configuration."""
    base = _figure_rows(df, "length")
    return _panel_figure(
        base,
        3.6,
        _draw_steps,
        drawing.known_count,
        ("exact (%)", "line: exact by step\nhatched: 95% Wilson", "steps"),
        "Exact inversion vs steps",
        f"Exact inversion against search steps ({drawing.source(base)}): per input length, "
        "the share of samples whose input was recovered exactly within s steps (a step "
        "function, drawn as steps), with its 95% Wilson interval as a hatched band (one "
        "hatching per length).",
    )


def _draw_positions(ax, rows: pd.DataFrame, all_lengths: list[int]):
    """A panel of `exact_by_position_figure`: a group of bars per length, whiskers 95% Wilson."""
    table = metrics.solved_by_position_by_length(rows)
    lengths = list(table.columns)
    width = 0.8 / len(lengths)
    handles, by_length = [], {}
    for j, n in enumerate(lengths):
        style = drawing.series_style(all_lengths.index(int(n)))
        curve = table[n].dropna()
        offsets = [i + (j - (len(lengths) - 1) / 2) * width for i in curve.index]
        count = by_length[int(n)] = int((rows["length"] == n).sum())
        bounds = [metrics.wilson_interval(round(v * count), count) for v in curve]
        err = [
            [100 * max(v - lo, 0) for v, (lo, _) in zip(curve, bounds, strict=True)],
            [100 * max(hi - v, 0) for v, (_, hi) in zip(curve, bounds, strict=True)],
        ]
        bars = ax.bar(
            offsets,
            100 * curve.to_numpy(),
            width=width,
            yerr=err,  # 95% Wilson
            capsize=2,
            color=drawing.rgba(style.color, 0.35),
            edgecolor=style.color,
            hatch=style.hatch,
            linestyle=style.dash,
            linewidth=1.0,
            error_kw={"elinewidth": 0.8, "ecolor": style.color},
            label=f"length {n} (n={count})",
        )
        if bars.errorbar is not None:
            for whiskers in bars.errorbar.lines[2]:  # the interval dashed as its bar's edge
                whiskers.set_linestyle(style.dash)
        # A marker on each bar's top, its shape the length's: a bar of height 0 has no area.
        (top,) = ax.plot(
            offsets,
            100 * curve.to_numpy(),
            linestyle="none",
            marker=style.marker,
            markersize=4,
            color=style.color,
            label=f"_length {n} tops",  # "_": not a legend entry of its own
        )
        handles.append((bars.patches[0], top) if bars.patches else top)
    return handles, by_length


def exact_by_position_figure(df: pd.DataFrame) -> drawing.Plot | None:
    """Tokens recovered by position, one group of bars per input length (as the paper's), one
    panel per configuration."""
    base = _figure_rows(df, "true_tokens", "length")
    return _panel_figure(
        base,
        3.4,
        _draw_positions,
        len,
        ("recovered (%)", "bar: recovered\nwhisker: 95% Wilson", "token position"),
        "Tokens recovered by position",
        f"Tokens recovered in place, by position in the input ({drawing.source(base)}): one "
        "group of bars per input length (colour, hatching and marker per length), whiskers "
        "the 95% Wilson interval.",
    )


DODGE = 1.08  # x factor between the series' points of one model on the log axis
# How the scaling figure marks what came before the input: the marker's fill.
BOS_FILLS = {"BOS": "full", "no BOS": "none", "model default": "left"}
# One line of the scaling figure: (length, BOS label, [(params, vocab, rate, model label)]).
Series = list[tuple[int, str, list[tuple[Any, Any, metrics.Proportion, str]]]]


def _scaling_series(base: pd.DataFrame) -> Series:
    """A series per input length and BOS setting: a point per model and configuration."""
    bos = base["bos"].map(  # a job's `bos` setting (None or missing: the model's default)
        lambda v: "model default" if v is None or pd.isna(v) else "BOS" if v else "no BOS"
    )
    series = []
    for (length, flag), rows in base.groupby([base["length"].astype(int), bos]):
        points = [
            (
                g["model_parameters"].max(),
                g["vocab_size"].max(),
                metrics.exact_rate(g),
                named(str(model), setting),
            )
            for model, rows_m in rows.groupby("model_name")
            for setting, g in by_setting(rows_m)
        ]
        # By size, then name: one model under two presets is two points of one size, and
        # their rates (Wilson proportions) do not order.
        series.append((int(length), flag, sorted(points, key=lambda p: (p[0], p[1], p[3]))))
    return series


def _scaling_panel(ax, series: Series, x_index: int, legend: tuple[list, list] | None) -> None:
    """One panel of `scaling_figure`: exact against `x_index` (0: parameters, 1: vocabulary),
    each series its line with Wilson whiskers; its handles and labels added to `legend`."""
    top = max(p[x_index] for _, _, points in series for p in points)  # the largest model
    first = min(length for length, _, _ in series)
    names: dict[tuple[float, float], list[str]] = {}  # model labels by the point they name
    for j, (length, flag, points) in enumerate(series):
        style = drawing.series_style(j)
        # Series side by side around each model's x (log axis): their whiskers do not
        # overlap, two lengths (or BOS settings) of one model included.
        dodge = DODGE ** (j - (len(series) - 1) / 2)
        xs = [p[x_index] * dodge for p in points]
        ys = [100 * p[2].value for p in points]
        # Clamped at 0: at 0 of n the Wilson bound rounds a hair above the value, and a
        # negative error bar makes matplotlib refuse the whole figure.
        err = [
            [100 * max(p[2].value - p[2].low, 0) for p in points],
            [100 * max(p[2].high - p[2].value, 0) for p in points],
        ]
        bars = ax.errorbar(
            xs,
            ys,
            yerr=err,
            color=style.color,
            linestyle=style.dash,
            marker=style.marker,
            fillstyle=BOS_FILLS[flag],
            capsize=3,
            label=f"length {length}, {flag}",
        )
        for whiskers in bars[2]:  # the interval dashed as its line
            whiskers.set_linestyle(style.dash)
        if legend is not None:
            legend[0].append(bars)
            legend[1].append(f"length {length}, {flag} (n={sum(p[2].n for p in points)})")
        if length == first:  # each model named at its first length's point
            for y, p in zip(ys, points, strict=True):
                names.setdefault((p[x_index], y), []).append(f"{p[3]} (n={p[2].n})")
    for (x, y), texts in names.items():
        # Models at one point share one label, a line each; the largest model's name to the
        # left of its point, inside the axes.
        left = x == top
        ax.annotate(
            "\n".join(dict.fromkeys(texts)),
            (x, y),
            xytext=(-6 if left else 6, 3),
            textcoords="offset points",
            ha="right" if left else "left",
            va="bottom",
            fontsize=7,
        )


def scaling_figure(df: pd.DataFrame) -> drawing.Plot | None:
    """Exact vs parameters and vocabulary: a line per input length and BOS setting through the
    models measured at it, each point with its 95% Wilson interval; each line its own colour,
    marker and dash (its whiskers dashed alike), filled markers with a BOS before the input,
    hollow without, half-filled where the model's default was used."""
    base = _figure_rows(df, "length", "model_parameters")
    if base["model_name"].nunique() < 2:
        return None
    if "bos" not in base:
        base = base.assign(bos=None)
    series = _scaling_series(base)
    plt = drawing.pyplot()
    from matplotlib.ticker import NullFormatter

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4), sharey=True)
    handles, labels = [], []
    for x_index, xlabel in enumerate(("parameters", "vocabulary size")):
        ax = axes[x_index]
        _scaling_panel(ax, series, x_index, (handles, labels) if x_index == 1 else None)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # crowded labels over a narrow range
        ax.set_xlabel(xlabel)
    axes[0].set_ylabel("exact (%)")
    drawing.percent_axis(axes[0])
    drawing.legend_outside(axes[1], handles, labels, "marker filled: BOS\nhollow: no BOS")
    fig.suptitle(
        drawing.title(base, "Exact inversion vs model size, by input length (95% Wilson)"),
        fontsize="medium",
    )
    models = "; ".join(
        f"length {length}, {flag}: " + ", ".join(f"{p[3]} n={p[2].n}" for p in points)
        for length, flag, points in series
    )
    caption = (
        f"Exact inversion against model parameters (left) and vocabulary size (right), "
        f"{drawing.source(base)}: a line per input length and BOS setting through the models, "
        "each point with its 95% Wilson interval; markers filled where a BOS came before the "
        "input, hollow where none did, half-filled for the model's default. n: samples. Both "
        f"panels show the same {drawing.known_count(base)} samples; per line: {models}."
    )
    return drawing.Plot(fig, caption)


FIGURES = {
    "exact_vs_steps": (exact_vs_steps_figure, "needs SODA rows with known lengths"),
    "exact_by_position": (exact_by_position_figure, "needs SODA rows with known inputs"),
    "scaling": (scaling_figure, "needs SODA rows from at least two models"),
}
