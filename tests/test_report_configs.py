"""Reports never pool rows of different configurations into one cell (a sweep's grid gets one row
per value, a tuning study's trials stay out of the paper tables), and figures show what a reader
needs: curves at zero, whole-number ticks and the n behind each point."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from conftest import tiny_model

import sodaray
from sodaray.data.store import RANDOM_SOURCE
from sodaray.report import build_report
from sodaray.report.drawing import PERCENT_LIMITS
from sodaray.report.figures import (
    exact_by_position_figure,
    exact_vs_steps_figure,
    scaling_figure,
)
from sodaray.report.rows import load_frame
from sodaray.report.tables import build_tables, table_algo, table_fluency, table_model
from sodaray.results import RunContext, result_rows
from sodaray.search.engine.base import InversionResult

matplotlib.use("Agg")


@pytest.fixture(scope="module")
def model():
    return tiny_model("gpt2")


def searched(model, tokens, config, objective=None, **context) -> pa.Table:
    """Rows of a real (short) search, as a sweep job writes them."""
    objective = objective or sodaray.Objective()
    targets = sodaray.make_targets(model, tokens, objective=objective)
    results = sodaray.invert(model, targets, config)
    context.setdefault("dataset", "random")
    return result_rows(results, RunContext.for_model(model, objective, **context))


def written(folder: Path, tables: dict[str, pa.Table]):
    """The tables as Parquet files under `folder`, read back as the report reads them."""
    for name, table in tables.items():
        pq.write_table(table, folder / f"{name}.parquet")
    return load_frame(folder)


def rows_of(table, label: str):
    return next(cells for lab, cells in table.rows if lab == label)


def test_a_temperature_grid_gets_one_row_per_temperature(tmp_path, model):
    tokens = [[1], [2], [3]]
    frame = written(
        tmp_path,
        {
            f"t{t}": searched(
                model,
                tokens,
                sodaray.SodaConfig(max_steps=3, temperature=t),
                sweep="s",
                job=f"t{t}",
            )
            for t in (0.05, 0.5)
        }
        | {"gcg": searched(model, tokens, sodaray.GcgConfig(max_steps=1, num_candidates=8))},
    )
    (models,) = table_model(frame)
    name = frame["model_name"].iloc[0]
    labels = [label for label, _ in models.rows]
    assert labels == [f"{name} (temperature=0.05)", f"{name} (temperature=0.5)"]
    for label in labels:
        assert rows_of(models, label)[-1].n == 3  # each temperature's 3 samples, not 6 pooled
    (algo,) = table_algo(frame)
    assert [label for label, _ in algo.rows] == [
        "SODA (temperature=0.05)",
        "SODA (temperature=0.5)",
        "GCG",  # one configuration: no split, no label
    ]


def test_each_fluency_weight_is_its_own_row(tmp_path, model):
    tokens = [[1, 2], [3, 4]]
    config = sodaray.SodaConfig(max_steps=2)
    frame = written(
        tmp_path,
        {
            f"w{w}": searched(
                model, tokens, config, sodaray.Objective(fluency_weight=w), dataset="nl-id"
            )
            for w in (0.0, 0.1, 0.5)
        },
    )
    (fluency,) = table_fluency(frame)
    assert [(label, cells[0].text, cells[1].n) for label, cells in fluency.rows] == [
        ("nl-id", "off", 2),
        ("nl-id", "0.1", 2),
        ("nl-id", "0.5", 2),
    ]


def test_older_rows_without_a_parameter_are_not_split_off(tmp_path, model):
    """A key only some rows record (a file from before the parameter) splits nothing, where two
    differing parameters both name the row."""
    tokens = [[1], [2]]
    new = searched(model, tokens, sodaray.SodaConfig(max_steps=2))
    params = [json.loads(p) for p in new.column("params").to_pylist()]
    for p in params:
        del p["reinit_std"]
    old = new.set_column(
        new.schema.get_field_index("params"), "params", pa.array(map(json.dumps, params))
    )
    # An older file was written earlier: the same rows at the same instant would be one run twice.
    earlier = pc.subtract(new["finished_at"], pa.scalar(3_600_000_000, pa.duration("us")))
    old = old.set_column(old.schema.get_field_index("finished_at"), "finished_at", earlier)
    frame = written(tmp_path, {"new": new, "old": old})
    (models,) = table_model(frame)
    assert len(models.rows) == 1 and models.rows[0][1][-1].n == 4

    both = searched(model, tokens, sodaray.SodaConfig(max_steps=2, learning_rate=0.1, decay=0.5))
    frame = written(tmp_path, {"both": both})
    (models,) = table_model(frame)
    assert [label.split(" ", 1)[1] for label, _ in models.rows] == [
        "(decay=0.5, learning_rate=0.1)",
        "(decay=0.9, learning_rate=0.065)",
    ]


def test_tuning_trials_are_in_the_jobs_table_only(tmp_path, model):
    tokens = [[1], [2]]
    trials = {
        f"trial-{i}": searched(
            model,
            tokens,
            sodaray.SodaConfig(max_steps=2, learning_rate=lr),
            sweep="tune:study",
            job=f"trial-{i:05d}",
        )
        for i, lr in enumerate((0.01, 0.1))
    }
    folder = tmp_path / "rows"
    folder.mkdir()
    frame = written(folder, trials)
    tables, skipped = build_tables(frame)
    assert [t.name for t in tables] == ["jobs"]
    assert "model" in {s.name for s in skipped}
    assert [label for label, _ in tables[0].rows] == [
        "tune:study / trial-00000",
        "tune:study / trial-00001",
    ]
    assert exact_vs_steps_figure(frame) is None  # nor in the figures
    report = build_report(folder, tmp_path / "report", formats=["md"], figures=False)
    assert any("4 rows from tuning trials (tune:study)" in note for note in report.notes)


def known_rows(
    outcomes: dict[int, list[bool]],
    model_name: str = "m",
    parameters: int = 100,
    sweep: str = "",
    **context,
):
    """Result rows whose answers are known: per input length, whether each sample was solved
    (a solved one in 1 step, an unsolved one recovers nothing right). `context`: more
    `RunContext` fields (the dataset is `random` unless given)."""
    results = []
    for length, solved in outcomes.items():
        for i, ok in enumerate(solved):
            true = list(range(1, length + 1))
            results.append(
                InversionResult(
                    sample_id=len(results),
                    tokens=true if ok else [0] * length,
                    text=None,
                    found=ok,
                    exact=ok,
                    steps=1 if ok else 3,
                    seconds=0.1,
                    final_loss=0.0 if ok else 1.0,
                    predicted_length=length,
                    algorithm="soda",
                    seed=i,
                    true_tokens=true,
                    params={"max_steps": 3},
                )
            )
    context = RunContext(
        model=model_name,
        objective=sodaray.Objective(),
        model_parameters=parameters,
        vocab_size=parameters // 10,
        sweep=sweep,
        **({"dataset": "random"} | context),
    )
    return result_rows(results, context)


def model_cells(folder: Path, tables: dict[str, Any]) -> dict[str, list[tuple[Any, int]]]:
    """The models table over `tables` written to `folder`: (value, n) per cell, by row label."""
    for name, table in tables.items():
        pq.write_table(table, folder / f"{name}.parquet")
    (models,) = table_model(load_frame(folder))
    return {label: [(c.value, c.n) for c in row] for label, row in models.rows}


def test_the_model_table_pools_random_datasets_and_counts_a_search_once(tmp_path):
    """Issue 27's sweep: the no-BOS jobs ran only lengths 1-2, as their own dataset
    (`random-short`, drawn by the same builder from the same seed). They are rows of the models
    table; the same search of the same drawn input, found in both datasets, counts once; a
    dataset of another kind stays out."""
    drawn = {"dataset_source": RANDOM_SOURCE, "dataset_seed": 1}
    tables = {
        "bos": known_rows({1: [True, False], 2: [False]}, "m", sweep="s", job="a", **drawn),
        "again": known_rows(
            {1: [True, False]}, "m", sweep="s", job="b", dataset="random-short", **drawn
        ),
        "nobos": known_rows(
            {1: [True, True], 2: [True]},
            "m-nobos",
            sweep="s",
            job="c",
            dataset="random-short",
            **drawn,
        ),
        "prose": known_rows({1: [True]}, "m-prose", sweep="s", job="d", dataset="nl-id"),
    }
    cells = model_cells(tmp_path, tables)
    assert sorted(cells) == ["m", "m-nobos"]
    assert cells["m"][3:] == [(0.5, 2), (0.0, 1), (pytest.approx(1 / 3), 3)]
    assert cells["m-nobos"][3:] == [(1.0, 2), (1.0, 1), (1.0, 3)]


def test_the_model_table_pools_random_sets_when_none_is_named_random(tmp_path):
    """Issue 27's held-out sweep: a random set per length (`length-1` for one model, `length-2`
    for another), none named `random`. Every model is a row, not only those of the commonest
    dataset."""
    drawn = {"dataset_source": RANDOM_SOURCE, "dataset_seed": 1}
    tables = {
        "one": known_rows(
            {1: [True, True]}, "qwen", sweep="s", job="a", dataset="length-1", **drawn
        ),
        "two": known_rows(
            {2: [False, True]}, "smol", sweep="s", job="b", dataset="length-2", **drawn
        ),
        "prose": known_rows({1: [True]}, "m-prose", sweep="s", job="d", dataset="nl-id"),
    }
    cells = model_cells(tmp_path, tables)
    assert sorted(cells) == ["qwen", "smol"]
    assert cells["qwen"][-1] == (1.0, 2) and cells["smol"][-1] == (0.5, 2)


def test_figures_show_zero_curves_integer_ticks_and_each_points_n(tmp_path):
    # Length 1: 3 of 4 solved; length 2: none of 2 (a curve and bars at zero).
    frame = written(tmp_path, {"a": known_rows({1: [True, True, True, False], 2: [False] * 2})})

    fig = exact_vs_steps_figure(frame).figure
    (ax,) = fig.axes[:1]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"length 1 (n=4)", "length 2 (n=2)"}
    zero = lines["length 2 (n=2)"]
    assert max(zero.get_ydata()) == 0 and zero.get_marker() not in ("None", "", " ", None)
    assert ax.get_ylim()[0] < 0  # the zero curve sits above the frame, not on it
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks)  # steps 0..3: no 0.5 ticks

    fig = exact_by_position_figure(frame).figure
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["length 1 (n=4)", "length 2 (n=2)"]
    markers = [line for line in ax.get_lines() if line.get_marker() not in ("None", "", " ")]
    assert any(max(line.get_ydata()) == 0 for line in markers)  # zero bars get a marker
    assert ax.get_ylim() == PERCENT_LIMITS
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks)

    small, large = tmp_path / "small", tmp_path / "large"
    small.mkdir(), large.mkdir()
    pq.write_table(known_rows({1: [False] * 3}, "small", 100), small / "a.parquet")
    pq.write_table(known_rows({1: [True, False]}, "large", 1000), large / "a.parquet")
    fig = scaling_figure(load_frame([small, large])).figure
    texts = sorted(t.get_text() for t in fig.axes[0].texts)
    assert texts == ["large (n=2)", "small (n=3)"]
    assert fig.axes[0].get_ylim()[0] < 0  # the small model's 0% point is visible


def test_every_line_of_exact_vs_steps_can_be_seen_and_the_title_names_its_rows(tmp_path):
    """Issue 28: lengths 2 and 3 both at 0% drew one line exactly under the other."""
    rows = known_rows({1: [True, False], 2: [False] * 3, 3: [False] * 3}, "tiny", sweep="quick")
    fig = exact_vs_steps_figure(written(tmp_path, {"a": rows})).figure
    ax = fig.axes[0]
    lines = [line for line in ax.get_lines() if line.get_label().startswith("length")]
    zero = [line for line in lines if max(line.get_ydata()) == 0]
    assert len(zero) == 2
    # Same values, yet each its own hollow marker shape and dash: both outlines show.
    assert zero[0].get_marker() != zero[1].get_marker()
    assert zero[0].get_linestyle() != zero[1].get_linestyle()
    assert {line.get_markerfacecolor() for line in zero} == {"none"}
    assert len(ax.collections) == len(lines)  # a Wilson band per curve
    # The band of 1 of 2 found: Wilson's [9.5%, 90.5%] around the 50% end of length 1's curve.
    band = ax.collections[0].get_paths()[0].vertices[:, 1]
    assert band.min() == 0 or band.min() > -1e-9
    assert 90 < band.max() < 91
    title = fig._suptitle.get_text()
    assert "tiny" in title and "sweep quick" in title and "n=8" in title

    fig = exact_by_position_figure(written(tmp_path, {"a": rows})).figure
    groups = fig.axes[0].containers
    bars = [c for c in groups if hasattr(c, "patches") and len(c.patches)]
    assert len(bars) == 3 and all(c.errorbar is not None for c in bars)  # Wilson bars on each
    assert "tiny" in fig._suptitle.get_text()


def test_the_scaling_figure_draws_a_line_per_length_and_marks_the_bos(tmp_path):
    """Issue 27: exact against parameters, one line per length, BOS and no-BOS told apart."""
    small, large = tmp_path / "small", tmp_path / "large"
    small.mkdir(), large.mkdir()
    pq.write_table(known_rows({1: [True, False], 2: [False]}, "small", 100), small / "a.parquet")
    pq.write_table(known_rows({1: [True, True], 2: [True]}, "large", 1000), large / "a.parquet")
    frame = load_frame([small, large])
    assert frame["bos"].isna().all()  # no sweep job's settings beside these rows
    with_bos = frame.assign(bos=True)
    without = frame[frame["length"] == 1].assign(bos=False)
    fig = scaling_figure(pd.concat([with_bos, without], ignore_index=True)).figure
    ax = fig.axes[0]
    lines = {bars.get_label(): bars.lines[0] for bars in ax.containers}  # errorbar's data lines
    assert sorted(lines) == ["length 1, BOS", "length 1, no BOS", "length 2, BOS"]
    assert lines["length 1, BOS"].get_fillstyle() == "full"
    assert lines["length 1, no BOS"].get_fillstyle() == "none"
    # A line through both models, rising with size: 50% -> 100% at length 1, 0% -> 100% at 2.
    assert list(lines["length 2, BOS"].get_ydata()) == [0, 100]
    assert list(lines["length 1, BOS"].get_ydata()) == [50, 100]
    x1, x2 = lines["length 1, BOS"].get_xdata()[0], lines["length 2, BOS"].get_xdata()[0]
    assert x1 < 100 < x2  # one model's lengths side by side, not on one another


def test_the_scaling_figure_takes_one_model_under_two_names(tmp_path):
    """Issue 27's held-out sweep: the same model under two presets, so two entries of one size
    (sorting their points compared the exact rates, which do not order, and the report died)."""
    paper, tuned = tmp_path / "paper", tmp_path / "tuned"
    paper.mkdir(), tuned.mkdir()
    pq.write_table(known_rows({2: [True, False, False]}, "paper", 100), paper / "a.parquet")
    pq.write_table(known_rows({2: [False, False, False]}, "tuned", 100), tuned / "a.parquet")
    fig = scaling_figure(load_frame([paper, tuned])).figure
    ax = fig.axes[0]
    assert sorted(t.get_text() for t in ax.texts) == ["paper (n=3)", "tuned (n=3)"]
    (bars,) = ax.containers
    assert sorted(bars.lines[0].get_ydata()) == [0, pytest.approx(100 / 3)]
