"""Figures a reviewer accepts (issue 39), checked on the drawn matplotlib artists: every series
told apart by colour, marker, dash and hatched band; legends outside the data; the found-by-step
curve drawn as steps; each panel's title and the caption naming its n; a tuning study's history
naming its metric, and the plots it cannot make named with the reason."""

from __future__ import annotations

import math

import matplotlib
import optuna
import pandas as pd
import pyarrow.parquet as pq

import sodaray
from sodaray.report import build_report
from sodaray.report.figures import (
    exact_by_position_figure,
    exact_vs_steps_figure,
    scaling_figure,
)
from sodaray.report.rows import load_frame
from sodaray.report.study import MIN_TRIALS_FOR_IMPORTANCE, history_figure, save_plots
from sodaray.results import RunContext, result_rows
from sodaray.search.engine.base import InversionResult
from sodaray.tuner.values import METRIC_LABELS

matplotlib.use("Agg")


def rows(
    found: dict[int, list[int | None]],
    temperature: float = 0.05,
    model: str = "m",
    parameters: int = 100,
    sweep: str = "quick",
):
    """Result rows whose answers are known: per input length, the step at which each sample
    was found (None: never, in a budget of 10 steps)."""
    results = []
    for length, steps in found.items():
        for i, step in enumerate(steps):
            true = list(range(1, length + 1))
            results.append(
                InversionResult(
                    sample_id=len(results),
                    tokens=true if step is not None else [0] * length,
                    text=None,
                    found=step is not None,
                    exact=step is not None,
                    steps=10 if step is None else step,
                    seconds=0.1,
                    final_loss=0.0 if step is not None else 1.0,
                    predicted_length=length,
                    algorithm="soda",
                    seed=i,
                    true_tokens=true,
                    params={"max_steps": 10, "temperature": temperature},
                )
            )
    context = RunContext(
        model=model,
        objective=sodaray.Objective(),
        model_parameters=parameters,
        vocab_size=parameters // 10,
        sweep=sweep,
        dataset="random",
    )
    return result_rows(results, context)


def frame(tmp_path, *tables):
    for i, table in enumerate(tables):
        pq.write_table(table, tmp_path / f"part{i}.parquet")
    return load_frame(tmp_path)


def legend_is_outside(fig, ax) -> None:
    """The legend's box and the axes' data area share no pixel."""
    fig.canvas.draw()
    legend = ax.get_legend()
    assert legend is not None
    box, data = legend.get_window_extent(), ax.get_window_extent()
    assert not box.overlaps(data), (box, data)


def distinct(values) -> bool:
    values = [str(v) for v in values]
    return len(set(values)) == len(values)


# Two configurations (panels) of different n. In the first, lengths 2 and 3 both at 0 of 3:
# equal curves and equal Wilson bands (0-56%), both overlapping length 1's.
TWO_PANELS = (
    rows({1: [2, 5, 9, None], 2: [None] * 3, 3: [None] * 3}, temperature=0.05),
    rows({1: [4, None], 2: [None]}, temperature=0.1),
)


def test_exact_vs_steps_tells_every_length_apart_and_names_each_panels_n(tmp_path):
    plot = exact_vs_steps_figure(frame(tmp_path, *TWO_PANELS))
    fig = plot.figure
    first, second = fig.axes[:2]
    for ax, n in ((first, 10), (second, 3)):
        lines = [line for line in ax.get_lines() if line.get_label().startswith("length")]
        bands = ax.collections
        assert len(bands) == len(lines) == (3 if n == 10 else 2)
        # Found by step s is a step function: drawn as steps, never sloping between points.
        assert {line.get_drawstyle() for line in lines} == {"steps-post"}
        # Colour, marker, dash and band: each tells every length apart on its own.
        assert distinct(line.get_color() for line in lines)
        assert distinct(line.get_marker() for line in lines)
        assert distinct(line.get_linestyle() for line in lines)
        assert distinct(band.get_hatch() for band in bands)
        for line, band in zip(lines, bands, strict=True):
            assert band.get_hatch()  # hatched: overlapping bands stay readable
            face, edge = band.get_facecolor()[0], band.get_edgecolor()[0]
            assert face[3] < 0.2 < edge[3]  # a pale fill, its hatching and outline clear
            assert tuple(edge[:3]) == matplotlib.colors.to_rgb(line.get_color())
        legend_is_outside(fig, ax)
        # Each legend entry draws its band with its line: the hatchings are explained.
        legend = ax.get_legend()
        assert [t.get_text() for t in legend.get_texts()] == [line.get_label() for line in lines]
        assert f"(n={n})" in ax.get_title()
    # The step function changes exactly at the finds: 1 of 4 by step 2, 2 by 5, 3 by 9.
    (length_1, *_) = first.get_lines()
    curve = dict(zip(length_1.get_xdata(), length_1.get_ydata(), strict=True))
    assert [curve[s] for s in (0, 1, 2, 4, 5, 8, 9, 10)] == [0, 0, 25, 25, 50, 50, 75, 75]
    # The title gives no sum no panel shows (13), and points to the panels' own n.
    title = fig._suptitle.get_text()
    assert "n=13" not in title and "n in each panel's title" in title
    assert "temperature=0.05: n=10 (length 1: 4, length 2: 3, length 3: 3)" in plot.caption
    assert "temperature=0.1: n=3 (length 1: 2, length 2: 1)" in plot.caption


def test_one_panel_names_its_n_in_the_title(tmp_path):
    fig = exact_vs_steps_figure(frame(tmp_path, TWO_PANELS[0])).figure
    assert len(fig.axes) == 1 and "n=10" in fig._suptitle.get_text()
    assert fig.axes[0].get_title() == "n=10"


def test_position_bars_differ_in_colour_hatch_dash_and_marker(tmp_path):
    plot = exact_by_position_figure(frame(tmp_path, *TWO_PANELS))
    fig = plot.figure
    ax = fig.axes[0]
    groups = [c for c in ax.containers if hasattr(c, "patches") and len(c.patches)]
    assert len(groups) == 3
    assert distinct(c.patches[0].get_hatch() for c in groups)
    assert distinct(c.patches[0].get_edgecolor() for c in groups)
    assert distinct(c.patches[0].get_linestyle() for c in groups)
    tops = [line for line in ax.get_lines() if line.get_label().endswith(" tops")]
    assert len(tops) == 3
    assert distinct(line.get_marker() for line in tops)
    assert all(c.errorbar is not None for c in groups)  # Wilson whiskers on each
    legend_is_outside(fig, ax)
    assert "(n=10)" in ax.get_title() and "(n=3)" in fig.axes[1].get_title()
    assert "n=10 (length 1: 4, length 2: 3, length 3: 3)" in plot.caption


def test_scaling_series_differ_in_colour_marker_and_dash(tmp_path):
    small = rows({1: [2, None], 2: [None]}, model="small", parameters=100)
    large = rows({1: [2, 3], 2: [4]}, model="large", parameters=1000)
    base = frame(tmp_path, small, large)
    with_bos, without = base.assign(bos=True), base[base["length"] == 1].assign(bos=False)
    plot = scaling_figure(pd.concat([with_bos, without], ignore_index=True))
    fig = plot.figure
    ax = fig.axes[0]
    series = {c.get_label(): c for c in ax.containers}
    assert sorted(series) == ["length 1, BOS", "length 1, no BOS", "length 2, BOS"]
    lines = [c.lines[0] for c in series.values()]
    assert distinct(line.get_color() for line in lines)
    assert distinct(line.get_marker() for line in lines)
    assert distinct(line.get_linestyle() for line in lines)
    # Each interval dashed as its line: the whiskers differ as the lines do.
    assert distinct(c.lines[2][0].get_linestyle() for c in series.values())
    legend_is_outside(fig, fig.axes[1])
    assert not fig.axes[1].get_legend().get_window_extent().overlaps(ax.get_window_extent())
    assert "n=10" in fig._suptitle.get_text()  # both panels show the same 10 samples
    assert "length 1, BOS: small n=2, large n=2" in plot.caption


def test_the_report_index_captions_each_figure_with_its_panels_n(tmp_path):
    results = tmp_path / "rows"
    results.mkdir()
    frame(results, *TWO_PANELS)
    report = build_report(results, tmp_path / "report", formats=["md"])
    index = (tmp_path / "report" / "README.md").read_text()
    assert "![exact_vs_steps](exact_vs_steps.png)" in index
    assert report.captions["exact_vs_steps.png"] in index
    assert "temperature=0.1: n=3" in report.captions["exact_by_position.png"]
    # Input length is "length", a sample count "n": the model table's columns say so.
    model = next(t for t in report.tables if t.name == "model")
    assert [h for h in model.header if "length" in h] == ["length 1", "length 2", "length 3"]
    assert not any(h.startswith("n=") for h in model.header)


def study_with(values: list[float], pruned: list[float] = ()):
    """An in-memory Optuna study: completed trials of these values, then pruned ones whose last
    checkpoint reported these rates."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="s", direction="maximize")
    dist = {"x": optuna.distributions.FloatDistribution(0.0, 1.0)}
    for v in values:
        trial = study.ask(dist)
        trial.report(v, 10)
        study.tell(trial, v)
    for rate in pruned:
        trial = study.ask(dist)
        trial.report(rate, 5)
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    assert len(study.trials) == len(values) + len(pruned) and math.isfinite(values[0])
    return study


def test_history_names_its_metric_and_keeps_its_legend_off_the_points():
    # The last trial is the best, at the lower right where the legend used to sit.
    study = study_with([0.2, 0.4, 0.1, 0.9], pruned=[0.0])
    fig = history_figure(study, METRIC_LABELS["exact"], metric="exact")
    ax = fig.axes[0]
    assert ax.get_ylabel() == "exact rate (share of validation samples recovered exactly)"
    legend_is_outside(fig, ax)
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    pruned = "pruned (its last checkpoint's exact rate, tie-broken)"
    assert texts == ["completed", "best so far", pruned]
    # A metric that is not a rate: the pruned trials' checkpoint rates get their own axis.
    fig = history_figure(study, METRIC_LABELS["exact_per_second"], metric="exact_per_second")
    assert len(fig.axes) == 2 and "checkpoint" in fig.axes[1].get_ylabel()
    legend_is_outside(fig, fig.axes[0])
    assert (
        not fig.axes[0].get_legend().get_window_extent().overlaps(fig.axes[1].get_window_extent())
    )


def test_plots_a_study_cannot_make_are_named_with_the_reason(tmp_path, caplog):
    study = study_with([0.2, 0.5, 0.4])
    with caplog.at_level("INFO", logger="sodaray.report.study"):
        made, skipped = save_plots(study, tmp_path, METRIC_LABELS["exact"])
    assert [p.name for p in made] == ["history.png"] and (tmp_path / "history.png").is_file()
    assert [s.name for s in skipped] == ["importances", "parallel_coordinate"]
    reason = f"needs {MIN_TRIALS_FOR_IMPORTANCE} completed trials"
    assert all(reason in s.reason and "has 3" in s.reason for s in skipped)
    assert reason in caplog.text
    made, skipped = save_plots(study_with([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]), tmp_path)
    assert {p.name for p in made} == {"history.png", "importances.png", "parallel_coordinate.png"}
    assert skipped == []


def test_a_tall_figures_suptitle_clears_its_first_panel(tmp_path):
    """Six stacked panels with two-line titles (the budget figure's shape): after saving, the
    suptitle's lowest line is above every panel's title and legend."""
    import matplotlib.pyplot as plt

    from sodaray.report.drawing import save as _save

    fig, axes = plt.subplots(6, 1, figsize=(8.5, 3.2 * 6), squeeze=False)
    for (ax,) in axes:
        ax.plot([1, 2], [1, 2], label="a line")
        ax.set_title("a panel (n=16)", fontsize="small")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    title = fig.suptitle("Exact vs step budget, extrapolated to 100,000\nstories260K · 6 panels")
    _save(fig, tmp_path / "tall.png")
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()  # _save closed the figure's own canvas
    bottom = title.get_window_extent(renderer).y0
    assert max(ax.get_tightbbox(renderer).y1 for (ax,) in axes) <= bottom
    assert (tmp_path / "tall.png").stat().st_size > 0
