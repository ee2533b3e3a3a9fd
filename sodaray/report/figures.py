"""Figures as PNG: exact vs steps by input length, exact by token position, and scaling (exact
vs model size and vocabulary at a fixed input length).

What a reviewer needs from each: every series told apart by colour, marker, dash and its
interval's hatching (two series with the same values, two lengths both at 0%, still both show,
and where their bands overlap each hatching stays readable); the legend beside the axes, never
over the data; a step function (found by step) drawn as steps; each panel's title naming its n
(the samples behind it) and each caption the n of every panel. "length" is the input's length
in tokens, "n" a count of samples, everywhere. Rows of different configurations get a panel
(or point) each.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from sodaray.io.writes import write_file
from sodaray.report import metrics
from sodaray.report.tables import Skipped, by_setting, named, standard_rows, tuning_rows


@dataclass
class Plot:
    """A drawn figure and its caption: what a reader needs beside it (what each line, bar and
    band is, and the n of each panel)."""

    figure: Any  # matplotlib.figure.Figure
    caption: str


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a cluster head or in CI
    import matplotlib.pyplot as plt

    return plt


def _clear_suptitle(fig) -> None:
    """In a tall figure tight_layout can leave the suptitle over the first panel's title: the
    panels then give up the band down to the suptitle's lowest line."""
    from matplotlib.text import Text

    get_suptitle = getattr(fig, "get_suptitle", None)  # matplotlib >= 3.8
    text = get_suptitle() if get_suptitle else ""
    found = [c for c in fig.get_children() if isinstance(c, Text) and c.get_text() == text]
    if not text or not found:
        return
    title = found[0]
    renderer = fig.canvas.get_renderer()
    bottom = title.get_window_extent(renderer).y0
    tops = [ax.get_tightbbox(renderer).y1 for ax in fig.axes]
    if tops and max(tops) > bottom:
        fig.tight_layout(rect=(0, 0, 1, bottom / fig.bbox.height))


def _save(fig, path: Path) -> Path:
    """The figure as PNG at `path`, in the folder the user gave (`report --out`), by the rule
    for every file sodaray writes (`writes.write_file`)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()  # the legends beside the axes are part of each axes' tight box
    _clear_suptitle(fig)
    write_file(path.parent, path, lambda f: fig.savefig(f, dpi=120, format="png"))
    plt.close(fig)
    return path


# A percent axis from a little below 0 to a little above 100: a curve or point at 0 (or 100)
# would otherwise lie on the frame, where a reader cannot see it.
PERCENT_LIMITS = (-4, 104)


def _percent_axis(ax) -> None:
    ax.set_ylim(*PERCENT_LIMITS)


def _integer_axis(axis) -> None:
    """Ticks on whole numbers only (steps, positions): no half-step ticks on a short range."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def _known_count(rows: pd.DataFrame) -> int:
    """Samples behind a point: rows whose true input is known (exact is defined)."""
    return int(rows["exact"].notna().sum())


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


def _panels(plt, settings: list[tuple[str, pd.DataFrame]], width: float, height: float):
    """One axes per configuration (rows of different configurations are never one curve)."""
    fig, axes = plt.subplots(
        len(settings), 1, figsize=(width, height * len(settings)), squeeze=False, sharex=True
    )
    return fig, [ax for (ax,) in axes]


def _figure_rows(df: pd.DataFrame) -> pd.DataFrame:
    """SODA's standard rows, tuning trials aside (as the tables: see `tuning_rows`)."""
    return standard_rows(df[(df["variant"] == "SODA") & ~tuning_rows(df)])


# ---- how series are told apart ----------------------------------------------------------------
# Series j gets colour, marker, dash and hatch j: any one of them tells two series apart, so
# they still differ in greyscale print, for a colour-blind reader, and where two series lie on
# each other (two lengths both at 0%: hollow markers of different shapes, staggered along x,
# show both). Hatches of different directions over a pale fill keep overlapping bands readable:
# where two 95% bands coincide a reader sees both hatchings, each explained by the legend.
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
DASHES: tuple[Any, ...] = (
    "-",
    "--",
    "-.",
    ":",
    (0, (5, 1, 1, 1, 1, 1)),
    (0, (8, 2)),
    (0, (1, 1)),
    (0, (4, 1, 1, 1, 1, 1, 1, 1)),
)
HATCHES = ("//", "\\\\", "||", "--", "xx", "..", "++", "oo")
BAND_ALPHA = 0.08  # the band's fill: pale enough that a curve and other hatchings show through
EDGE_ALPHA = 0.6  # its hatching and outline


@dataclass(frozen=True)
class Style:
    color: str
    marker: str
    dash: Any
    hatch: str


def series_style(j: int) -> Style:
    """Series j's colour, marker, dash and hatch (each cycles on its own length)."""
    return Style(
        f"C{j % 10}", MARKERS[j % len(MARKERS)], DASHES[j % len(DASHES)], HATCHES[j % len(HATCHES)]
    )


def _rgba(color: str, alpha: float) -> tuple[float, float, float, float]:
    from matplotlib.colors import to_rgba

    return to_rgba(color, alpha)


def _legend_outside(ax, handles: list, labels: list[str], title: str | None = None) -> None:
    """The legend to the right of the axes, outside the data (it hid points and bands inside);
    a (patch, line) handle draws the series' hatched band with its line and marker over it."""
    from matplotlib.legend_handler import HandlerTuple

    ax.legend(
        handles,
        labels,
        loc="upper left",
        bbox_to_anchor=(1.02, 1.0),
        borderaxespad=0.0,
        fontsize="small",
        title=title,
        title_fontsize="small",
        handler_map={tuple: HandlerTuple(ndivide=None, pad=0.0)},
        handlelength=3.0,
    )


def _panel_title(setting: str, n: int) -> str:
    """A panel's title: its configuration (if the figure has several) and its n."""
    return f"{setting} (n={n})" if setting else f"n={n}"


def _title(rows: pd.DataFrame, what: str, panel_counts: list[int] | None = None) -> str:
    """`what`, then the model(s), sweep(s) and n: the one panel's, n per panel where all panels
    hold the same number, else a pointer to the panels' own titles (never the sum, which no
    panel shows)."""

    def names(column: str) -> str:
        values = sorted({str(v) for v in rows[column].dropna() if str(v)})
        return ", ".join(values[:3]) + (f" +{len(values) - 3}" if len(values) > 3 else "")

    parts = [names("model_name")]
    sweeps = names("sweep")
    if sweeps:
        parts.append(f"sweep {sweeps}")
    counts = panel_counts or [_known_count(rows)]
    if len(counts) == 1:
        parts.append(f"n={counts[0]}")
    elif len(set(counts)) == 1:
        parts.append(f"{len(counts)} panels, n={counts[0]} each")
    else:
        parts.append(f"{len(counts)} panels, n in each panel's title")
    return what + "\n" + " · ".join(p for p in parts if p)  # two lines: fits a narrow figure


def _source(rows: pd.DataFrame) -> str:
    """Model(s) and sweep(s) of a caption."""
    models = ", ".join(sorted({str(v) for v in rows["model_name"].dropna()}))
    sweeps = ", ".join(sorted({str(v) for v in rows["sweep"].dropna() if str(v)}))
    return f"SODA on {models}" + (f", sweep {sweeps}" if sweeps else "")


def _panels_caption(panels: list[tuple[str, int, dict[int, int]]]) -> str:
    """Each panel's n and its n per length: `temperature=0.05: n=12 (length 1: 4, ...)`."""
    parts = []
    for setting, n, by_length in panels:
        lengths = ", ".join(f"length {k}: {v}" for k, v in by_length.items())
        parts.append(f"{setting + ': ' if setting else ''}n={n} ({lengths})")
    return ("Panels: " if len(panels) > 1 else "") + "; ".join(parts) + "."


# ---- the figures ------------------------------------------------------------------------------
def _step_curve(rows: pd.DataFrame) -> pd.Series:
    """Exact by step, evaluated at every step where a sample was found (where the function
    changes) and on an even grid up to the budget (where markers go): drawn as steps, it is the
    exact function, not a line sloping between grid points."""
    grid = metrics.solved_by_step(rows).index
    exact = rows["exact"].fillna(False).astype(bool)
    found = {int(s) for s in rows.loc[exact, "steps"].dropna()}
    return metrics.solved_by_step(rows, sorted(set(grid) | found))


def exact_vs_steps_figure(df: pd.DataFrame) -> Plot | None:
    """Exact vs steps, one step function per input length with its 95% Wilson band, one panel
    per configuration."""
    base = _figure_rows(df)
    base = base[base["length"].notna()]
    if base.empty:
        return None
    plt = _pyplot()
    settings = _model_settings(base)
    fig, axes = _panels(plt, settings, 7.5, 3.6)
    panels = []
    all_lengths = sorted(int(x) for x in base["length"].unique())  # one style per length
    for ax, (setting, rows) in zip(axes, settings, strict=True):
        handles, labels, by_length = [], [], {}
        lengths = sorted(int(x) for x in rows["length"].unique())
        for j, n in enumerate(lengths):
            style = series_style(all_lengths.index(n))
            sel = rows[rows["length"] == n]
            curve = _step_curve(sel)
            count = by_length[n] = _known_count(sel)
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
            band = ax.fill_between(
                curve.index,
                [100 * lo for lo, _ in bands],
                [100 * hi for _, hi in bands],
                step="post",
                facecolor=_rgba(style.color, BAND_ALPHA),
                edgecolor=_rgba(style.color, EDGE_ALPHA),
                hatch=style.hatch,
                linestyle=style.dash,
                linewidth=0.6,
                label=f"length {n}: 95% Wilson band",
                zorder=1,
            )
            handles.append((band, line))
            labels.append(f"length {n} (n={count})")
        ax.set_ylabel("exact (%)")
        _percent_axis(ax)
        _integer_axis(ax.xaxis)
        ax.set_title(_panel_title(setting, _known_count(rows)), fontsize="small")
        _legend_outside(ax, handles, labels, "line: exact by step\nhatched: 95% Wilson")
        panels.append((setting, _known_count(rows), by_length))
    axes[-1].set_xlabel("steps")
    counts = [n for _, n, _ in panels]
    fig.suptitle(_title(base, "Exact inversion vs steps", counts), fontsize="medium")
    caption = (
        f"Exact inversion against search steps ({_source(base)}): per input length, the share "
        "of samples whose input was recovered exactly within s steps (a step function, "
        "drawn as steps), with its 95% Wilson interval as a hatched band (one hatching per "
        f"length). n: samples. {_panels_caption(panels)}"
    )
    return Plot(fig, caption)


def exact_by_position_figure(df: pd.DataFrame) -> Plot | None:
    """Tokens recovered by position, one group of bars per input length (as the paper's), one
    panel per configuration."""
    base = _figure_rows(df)
    base = base[base["true_tokens"].notna() & base["length"].notna()]
    if base.empty:
        return None
    plt = _pyplot()
    settings = _model_settings(base)
    fig, axes = _panels(plt, settings, 7.5, 3.4)
    panels = []
    all_lengths = sorted(int(x) for x in base["length"].unique())
    for ax, (setting, rows) in zip(axes, settings, strict=True):
        table = metrics.solved_by_position_by_length(rows)
        lengths = list(table.columns)
        width = 0.8 / len(lengths)
        handles, labels, by_length = [], [], {}
        for j, n in enumerate(lengths):
            style = series_style(all_lengths.index(int(n)))
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
                color=_rgba(style.color, 0.35),
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
            labels.append(f"length {n} (n={count})")
        ax.set_ylabel("recovered (%)")
        _percent_axis(ax)
        _integer_axis(ax.xaxis)
        ax.set_title(_panel_title(setting, len(rows)), fontsize="small")
        _legend_outside(ax, handles, labels, "bar: recovered\nwhisker: 95% Wilson")
        panels.append((setting, len(rows), by_length))
    axes[-1].set_xlabel("token position")
    counts = [n for _, n, _ in panels]
    fig.suptitle(_title(base, "Tokens recovered by position", counts), fontsize="medium")
    caption = (
        f"Tokens recovered in place, by position in the input ({_source(base)}): one group of "
        "bars per input length (colour, hatching and marker per length), whiskers the 95% "
        f"Wilson interval. n: samples. {_panels_caption(panels)}"
    )
    return Plot(fig, caption)


DODGE = 1.08  # x factor between the series' points of one model on the log axis
BOS_FILLS = {  # how the scaling figure marks what came before the input: the marker's fill
    "BOS": "full",
    "no BOS": "none",
    "model default": "left",
}


def _bos_label(value: Any) -> str:
    """A job's `bos` setting as its label (None or missing: the model's default)."""
    if value is None or pd.isna(value):
        return "model default"
    return "BOS" if value else "no BOS"


def scaling_figure(df: pd.DataFrame) -> Plot | None:
    """Exact vs parameters and vocabulary: a line per input length and BOS setting through the
    models measured at it, each point with its 95% Wilson interval; each line its own colour,
    marker and dash (its whiskers dashed alike), filled markers with a BOS before the input,
    hollow without, half-filled where the model's default was used."""
    base = _figure_rows(df)
    base = base[base["length"].notna() & base["model_parameters"].notna()]
    if base["model_name"].nunique() < 2:
        return None
    if "bos" not in base:
        base = base.assign(bos=None)
    bos = base["bos"].map(_bos_label)
    series = []  # (length, BOS label, [(params, vocab, rate, label)])
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
        points = sorted(points, key=lambda p: (p[0], p[1], p[3]))
        series.append((int(length), flag, points))
    plt = _pyplot()
    from matplotlib.ticker import NullFormatter

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4), sharey=True)
    lengths = sorted({length for length, _, _ in series})
    handles, labels = [], []
    for ax, x_index, xlabel in ((axes[0], 0, "parameters"), (axes[1], 1, "vocabulary size")):
        top = max(p[x_index] for _, _, points in series for p in points)  # the largest model
        names: dict[tuple[float, float], list[str]] = {}  # model labels by the point they name
        for j, (length, flag, points) in enumerate(series):
            style = series_style(j)
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
            if ax is axes[1]:
                handles.append(bars)
                labels.append(f"length {length}, {flag} (n={sum(p[2].n for p in points)})")
            if length == lengths[0]:  # each model named at its first length's point
                for y, p in zip(ys, points, strict=True):
                    names.setdefault((p[x_index], y), []).append(f"{p[3]} (n={p[2].n})")
        for (x, y), texts in names.items():
            # Models at one point (one model under two BOS settings) share one label, a line
            # each, rather than printing over each other; the largest model's name to the left
            # of its point, inside the axes.
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
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # crowded labels over a narrow range
        ax.set_xlabel(xlabel)
    axes[0].set_ylabel("exact (%)")
    _percent_axis(axes[0])
    _legend_outside(axes[1], handles, labels, "marker filled: BOS\nhollow: no BOS")
    fig.suptitle(
        _title(base, "Exact inversion vs model size, by input length (95% Wilson)"),
        fontsize="medium",
    )
    models = "; ".join(
        f"length {length}, {flag}: " + ", ".join(f"{p[3]} n={p[2].n}" for p in points)
        for length, flag, points in series
    )
    caption = (
        f"Exact inversion against model parameters (left) and vocabulary size (right), "
        f"{_source(base)}: a line per input length and BOS setting through the models, each "
        "point with its 95% Wilson interval; markers filled where a BOS came before the input, "
        f"hollow where none did, half-filled for the model's default. n: samples. Both panels "
        f"show the same {_known_count(base)} samples; per line: {models}."
    )
    return Plot(fig, caption)


def _save_or_none(plot: Plot | None, path: Path) -> Plot | None:
    if plot is None:
        return None
    _save(plot.figure, path)
    return plot


def exact_vs_steps(df: pd.DataFrame, path: Path) -> Plot | None:
    return _save_or_none(exact_vs_steps_figure(df), path)


def exact_by_position(df: pd.DataFrame, path: Path) -> Plot | None:
    return _save_or_none(exact_by_position_figure(df), path)


def scaling(df: pd.DataFrame, path: Path) -> Plot | None:
    return _save_or_none(scaling_figure(df), path)


FIGURES = {
    "exact_vs_steps": (exact_vs_steps, "needs SODA rows with known lengths"),
    "exact_by_position": (exact_by_position, "needs SODA rows with known inputs"),
    "scaling": (scaling, "needs SODA rows from at least two models"),
}


def build_figures(df: pd.DataFrame, out: Path) -> tuple[list[Path], dict[str, str], list[Skipped]]:
    """Every figure the rows have data for, as PNG in `out`: the files, each file's caption
    (by file name) and what was skipped and why."""
    made: list[Path] = []
    captions: dict[str, str] = {}
    skipped: list[Skipped] = []
    for name, (draw, need) in FIGURES.items():
        path = out / f"{name}.png"
        plot = draw(df, path)
        if plot is None:
            skipped.append(Skipped(name, need))
        else:
            made.append(path)
            captions[path.name] = plot.caption
    return made, captions, skipped
