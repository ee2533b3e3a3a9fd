"""Figures as PNG: exact vs steps by input length, exact by token position, and scaling (exact
vs model size and vocabulary at a fixed input length). Every curve, bar group and point names
its n (the samples behind it); rows of different configurations get a panel (or point) each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from sodaray import metrics
from sodaray.report.tables import Skipped, by_setting, named, standard_rows, tuning_rows


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a cluster head or in CI
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=120)
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


# Each *_figure returns the matplotlib figure (None: no rows for it); the function of the plain
# name saves it as PNG.
# Each line its own hollow marker shape and dash, its markers staggered along x where the curve
# is long enough: two curves with the same values (two lengths both at 0%) still both show.
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
DASHES = ("-", "--", "-.", ":")


def _title(rows: pd.DataFrame, what: str) -> str:
    """`what`, then the model(s), sweep(s) and samples the figure is drawn from."""

    def names(column: str) -> str:
        values = sorted({str(v) for v in rows[column].dropna() if str(v)})
        return ", ".join(values[:3]) + (f" +{len(values) - 3}" if len(values) > 3 else "")

    parts = [names("model_name")]
    sweeps = names("sweep")
    if sweeps:
        parts.append(f"sweep {sweeps}")
    parts.append(f"n={_known_count(rows)}")
    return what + "\n" + " · ".join(p for p in parts if p)  # two lines: fits a narrow figure


def exact_vs_steps_figure(df: pd.DataFrame):
    """Exact vs steps, one curve per input length with its 95% Wilson band, one panel per
    configuration."""
    base = _figure_rows(df)
    base = base[base["length"].notna()]
    if base.empty:
        return None
    plt = _pyplot()
    settings = _model_settings(base)
    fig, axes = _panels(plt, settings, 5.5, 3.8)
    for ax, (setting, rows) in zip(axes, settings, strict=True):
        lengths = sorted(int(x) for x in rows["length"].unique())
        for j, n in enumerate(lengths):
            sel = rows[rows["length"] == n]
            curve = metrics.solved_by_step(sel)
            count = _known_count(sel)
            every = max(1, len(curve) // 8)
            (line,) = ax.plot(
                curve.index,
                100 * curve.to_numpy(),
                marker=MARKERS[j % len(MARKERS)],
                linestyle=DASHES[j % len(DASHES)],
                markersize=5,
                markerfacecolor="none",  # hollow: a circle over a square shows both outlines
                markevery=(j * every // len(lengths), every),
                label=f"length {n} (n={count})",
            )
            bands = [metrics.wilson_interval(round(v * count), count) for v in curve]
            ax.fill_between(
                curve.index,
                [100 * lo for lo, _ in bands],
                [100 * hi for _, hi in bands],
                color=line.get_color(),
                alpha=0.12,
                linewidth=0,
            )
        ax.set_ylabel("exact (%)")
        _percent_axis(ax)
        _integer_axis(ax.xaxis)
        if setting:
            ax.set_title(setting, fontsize="small")
        ax.legend(fontsize="small", ncol=2)
    axes[-1].set_xlabel("steps")
    fig.suptitle(_title(base, "Exact inversion vs steps (95% Wilson bands)"), fontsize="medium")
    return fig


def exact_by_position_figure(df: pd.DataFrame):
    """Tokens recovered by position, one group of bars per input length (as the paper's), one
    panel per configuration."""
    base = _figure_rows(df)
    base = base[base["true_tokens"].notna() & base["length"].notna()]
    if base.empty:
        return None
    plt = _pyplot()
    settings = _model_settings(base)
    fig, axes = _panels(plt, settings, 6, 3.5)
    for ax, (setting, rows) in zip(axes, settings, strict=True):
        table = metrics.solved_by_position_by_length(rows)
        lengths = list(table.columns)
        width = 0.8 / len(lengths)
        for j, n in enumerate(lengths):
            curve = table[n].dropna()
            offsets = [i + (j - (len(lengths) - 1) / 2) * width for i in curve.index]
            count = int((rows["length"] == n).sum())
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
                error_kw={"elinewidth": 0.8, "alpha": 0.6},
                label=f"length {n} (n={count})",
            )
            # A marker on each bar's top: a bar of height 0 has no area to see.
            ax.plot(
                offsets,
                100 * curve.to_numpy(),
                linestyle="none",
                marker="o",
                markersize=3,
                color=bars.patches[0].get_facecolor() if bars.patches else None,
            )
        ax.set_ylabel("recovered (%)")
        _percent_axis(ax)
        _integer_axis(ax.xaxis)
        if setting:
            ax.set_title(setting, fontsize="small")
        ax.legend(fontsize="small", ncol=2)
    axes[-1].set_xlabel("token position")
    fig.suptitle(_title(base, "Tokens recovered by position (95% Wilson)"), fontsize="medium")
    return fig


DODGE = 1.08  # x factor between the lengths' points of one model on the log axis
BOS_STYLES = {  # how the scaling figure marks what came before the input: (dash, fill)
    "BOS": ("-", "full"),
    "no BOS": ("--", "none"),
    "model default": (":", "left"),
}


def _bos_label(value: Any) -> str:
    """A job's `bos` setting as its label (None or missing: the model's default)."""
    if value is None or pd.isna(value):
        return "model default"
    return "BOS" if value else "no BOS"


def scaling_figure(df: pd.DataFrame):
    """Exact vs parameters and vocabulary: a line per input length (and BOS setting) through
    the models measured at it, each point with its 95% Wilson interval; filled markers with a
    BOS before the input, hollow without, half-filled where the model's default was used."""
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

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2), sharey=True)
    lengths = sorted({length for length, _, _ in series})
    colors = {n: f"C{i % 10}" for i, n in enumerate(lengths)}
    for ax, x_index, xlabel in ((axes[0], 0, "parameters"), (axes[1], 1, "vocabulary size")):
        top = max(p[x_index] for _, _, points in series for p in points)  # the largest model
        for length, flag, points in series:
            dash, fill = BOS_STYLES[flag]
            # Lengths side by side around each model's x (log axis): their bars do not overlap.
            dodge = DODGE ** (lengths.index(length) - (len(lengths) - 1) / 2)
            xs = [p[x_index] * dodge for p in points]
            ys = [100 * p[2].value for p in points]
            # Clamped at 0: at 0 of n the Wilson bound rounds a hair above the value, and a
            # negative error bar makes matplotlib refuse the whole figure.
            err = [
                [100 * max(p[2].value - p[2].low, 0) for p in points],
                [100 * max(p[2].high - p[2].value, 0) for p in points],
            ]
            ax.errorbar(
                xs,
                ys,
                yerr=err,
                color=colors[length],
                linestyle=dash,
                marker=MARKERS[lengths.index(length) % len(MARKERS)],
                fillstyle=fill,
                capsize=3,
                label=f"length {length}, {flag}",
            )
            if length == lengths[0]:  # each model named once, at its first length's point
                for x, y, p in zip(xs, ys, points, strict=True):
                    # The largest model's name to the left of its point: inside the axes.
                    left = p[x_index] == top
                    ax.annotate(
                        f"{p[3]} (n={p[2].n})",
                        (x, y),
                        xytext=(-4 if left else 4, 3),
                        textcoords="offset points",
                        ha="right" if left else "left",
                        fontsize=7,
                    )
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # crowded labels over a narrow range
        ax.set_xlabel(xlabel)
    axes[0].set_ylabel("exact (%)")
    _percent_axis(axes[0])
    axes[1].legend(fontsize="small", loc="best")
    fig.suptitle(
        _title(base, "Exact inversion vs model size, by input length (95% Wilson)"),
        fontsize="medium",
    )
    return fig


def _save_or_none(fig, path: Path) -> Path | None:
    return None if fig is None else _save(fig, path)


def exact_vs_steps(df: pd.DataFrame, path: Path) -> Path | None:
    return _save_or_none(exact_vs_steps_figure(df), path)


def exact_by_position(df: pd.DataFrame, path: Path) -> Path | None:
    return _save_or_none(exact_by_position_figure(df), path)


def scaling(df: pd.DataFrame, path: Path) -> Path | None:
    return _save_or_none(scaling_figure(df), path)


FIGURES = {
    "exact_vs_steps": (exact_vs_steps, "needs SODA rows with known lengths"),
    "exact_by_position": (exact_by_position, "needs SODA rows with known inputs"),
    "scaling": (scaling, "needs SODA rows from at least two models"),
}


def build_figures(df: pd.DataFrame, out: Path) -> tuple[list[Path], list[Skipped]]:
    made: list[Path] = []
    skipped: list[Skipped] = []
    for name, (draw, need) in FIGURES.items():
        path = draw(df, out / f"{name}.png")
        if path is None:
            skipped.append(Skipped(name, need))
        else:
            made.append(path)
    return made, skipped
