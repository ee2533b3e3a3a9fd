"""Figures as PNG: exact vs steps by input length, exact by token position, and scaling (exact
vs model size and vocabulary at a fixed input length)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from sodaray import metrics
from sodaray.report.tables import Skipped, standard_rows


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


def exact_vs_steps(df: pd.DataFrame, path: Path) -> Path | None:
    base = standard_rows(df[df["variant"] == "SODA"])
    base = base[base["length"].notna()]
    if base.empty:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for n in sorted(int(x) for x in base["length"].unique()):
        curve = metrics.solved_by_step(base[base["length"] == n])
        ax.plot(curve.index, 100 * curve.to_numpy(), label=f"n={n}")
    ax.set_xlabel("steps")
    ax.set_ylabel("exact (%)")
    ax.set_ylim(0, 100)
    ax.set_title("Exact inversion vs steps, by input length")
    ax.legend(fontsize="small", ncol=2)
    return _save(fig, path)


def exact_by_position(df: pd.DataFrame, path: Path) -> Path | None:
    """Tokens recovered by position, one group of bars per input length (as the paper's)."""
    base = standard_rows(df[df["variant"] == "SODA"])
    base = base[base["true_tokens"].notna() & base["length"].notna()]
    if base.empty:
        return None
    table = metrics.solved_by_position_by_length(base)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    lengths = list(table.columns)
    width = 0.8 / len(lengths)
    for j, n in enumerate(lengths):
        curve = table[n].dropna()
        offsets = [i + (j - (len(lengths) - 1) / 2) * width for i in curve.index]
        ax.bar(offsets, 100 * curve.to_numpy(), width=width, label=f"n={n}")
    ax.set_xlabel("token position")
    ax.set_ylabel("recovered (%)")
    ax.set_ylim(0, 100)
    ax.set_title("Tokens recovered by position, by input length")
    ax.legend(fontsize="small", ncol=2)
    return _save(fig, path)


def scaling(df: pd.DataFrame, path: Path) -> Path | None:
    base = standard_rows(df[df["variant"] == "SODA"])
    base = base[base["length"].notna() & base["model_parameters"].notna()]
    if base["model_name"].nunique() < 2:
        return None
    # The length shared by the most models, so every point is measured at the same length.
    length = base.groupby("length")["model_name"].nunique().sort_values(kind="stable").index[-1]
    rows = base[base["length"] == length]
    points = [
        (g["model_parameters"].max(), g["vocab_size"].max(), metrics.exact_rate(g), model)
        for model, g in rows.groupby("model_name")
    ]
    plt = _pyplot()
    from matplotlib.ticker import NullFormatter

    fig, axes = plt.subplots(1, 2, figsize=(8, 3.5), sharey=True)
    for ax, x_index, xlabel in ((axes[0], 0, "parameters"), (axes[1], 1, "vocabulary size")):
        for p in points:
            rate = p[2]
            err = [[100 * (rate.value - rate.low)], [100 * (rate.high - rate.value)]]
            ax.errorbar(p[x_index], 100 * rate.value, yerr=err, fmt="o", capsize=3)
            ax.annotate(str(p[3]), (p[x_index], 100 * rate.value), fontsize=7)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # crowded labels over a narrow range
        ax.set_xlabel(xlabel)
    axes[0].set_ylabel(f"exact (%) at n={int(length)}")
    axes[0].set_ylim(0, 100)
    fig.suptitle("Exact inversion vs model size")
    return _save(fig, path)


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
