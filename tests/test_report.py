"""Result rows round-trip through Parquet, and `sodaray report` regenerates every table it has
rows for, from a small real run on stories260K."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import STORIES, tiny_model

import sodaray
from sodaray.cli import main
from sodaray.results import (
    RESULT_SCHEMA,
    SCHEMA_VERSION,
    ResultsError,
    RunContext,
    read_results,
    result_rows,
    write_table_atomic,
)


def run(model, tokens, config, objective=None, *, dataset="random", length=None, pii=None):
    objective = objective or sodaray.Objective()
    targets = sodaray.make_targets(model, tokens, objective=objective)
    results = sodaray.invert(model, targets, config, length=length, max_length=2)
    context = RunContext.for_model(
        model,
        objective,
        dataset=dataset,
        length_mode="auto" if length == "auto" else "fixed" if length is None else "assumed",
    )
    texts = [model.decode(t) for t in tokens]
    return result_rows(results, context, true_texts=texts, pii_labels=pii)


def test_rows_round_trip_with_schema_version(tmp_path):
    model = tiny_model("gpt2")
    table = run(model, [[1, 2], [3]], sodaray.SodaConfig(max_steps=3))
    assert table.schema.equals(RESULT_SCHEMA, check_metadata=False)
    path = write_table_atomic(table, tmp_path / "a" / "rows.parquet")
    assert [p.name for p in path.parent.iterdir()] == ["rows.parquet"]  # no temporary left
    back = read_results(tmp_path)
    assert back.to_pylist() == table.to_pylist()
    row = back.to_pylist()[0]
    assert row["schema_version"] == SCHEMA_VERSION and row["algorithm"] == "soda"
    assert row["length"] == 2 and row["max_steps"] == 3 and '"temperature"' in row["params"]


def test_newer_schema_and_foreign_files_are_refused(tmp_path):
    pq.write_table(pa.table({"x": [1]}), tmp_path / "foreign.parquet")
    with pytest.raises(ResultsError, match="not a sodaray result file"):
        read_results(tmp_path / "foreign.parquet")
    model = tiny_model("gpt2")
    table = run(model, [[1]], sodaray.SodaConfig(max_steps=1))
    newer = table.replace_schema_metadata({b"sodaray.results.version": b"99"})
    pq.write_table(newer, tmp_path / "newer.parquet")
    with pytest.raises(ResultsError, match="newer"):
        read_results(tmp_path / "newer.parquet")


@pytest.mark.slow
def test_report_over_a_real_run_makes_every_table(tmp_path, capsys):
    if not STORIES.is_dir():
        pytest.skip("stories260K not present")
    stories = sodaray.load_model(str(STORIES))
    soda = sodaray.SodaConfig(max_steps=40, seed=0)
    one = [[172], [40], [5], [300]]
    two = [[172, 40], [5, 6]]
    logits_top5 = sodaray.Objective(top_k=5, output_tokens=2)
    parts = {
        "model/stories.parquet": run(stories, one + two, soda),
        "model/tiny.parquet": run(tiny_model("llama"), [[1], [40]], soda),
        "tradeoff/top5.parquet": run(stories, one, soda, logits_top5),
        "tradeoff/text.parquet": run(
            stories, one, soda, sodaray.Objective(kind="text", output_tokens=2)
        ),
        "fluency/nl.parquet": run(stories, two, soda, dataset="nl-id"),
        "fluency/on.parquet": run(
            stories, two, soda, sodaray.Objective(fluency_weight=0.1), dataset="nl-id"
        ),
        "tweaks/bias.parquet": run(
            stories, one, sodaray.SodaConfig(max_steps=40, bias_correction=True)
        ),
        "algo/embedding.parquet": run(stories, one, sodaray.EmbeddingConfig(max_steps=40)),
        "algo/gcg.parquet": run(stories, one, sodaray.GcgConfig(max_steps=3, num_candidates=32)),
        "length/auto.parquet": run(stories, one[:2] + two[:1], soda, length="auto"),
        "length/assumed1.parquet": run(stories, one[:2] + two[:1], soda, length=1),
        "length/assumed2.parquet": run(stories, one[:2] + two[:1], soda, length=2),
        "privacy/pii.parquet": run(
            stories,
            [[172, 40, 5], [6, 7, 8]],
            soda,
            dataset="privacy",
            pii=[[None, "GIVENNAME", "SURNAME"], ["EMAIL", None, None]],
        ),
    }
    for name, table in parts.items():
        write_table_atomic(table, tmp_path / "results" / name)
    out = tmp_path / "report"
    code = main(["report", str(tmp_path / "results"), "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    for name in (
        "model",
        "tradeoff",
        "tradeoff_fdr",
        "fluency",
        "tweaks",
        "algo",
        "privacy",
        "privacy_labels",
        "length",
        "length_auto",
    ):
        for ext in ("md", "tex", "csv"):
            assert (out / f"{name}.{ext}").is_file(), (name, ext, printed)
    for fig in ("exact_vs_steps", "exact_by_position", "scaling"):
        assert (out / f"{fig}.png").stat().st_size > 1000
    model_md = (out / "model.md").read_text()
    assert "max steps: 40" in model_md and "samples: 8" in model_md  # settings in the caption
    tweaks = (out / "tweaks.md").read_text()
    assert "SODA + bias correction" in tweaks and "Embedding search" in tweaks
    tradeoff = (out / "tradeoff.md").read_text()
    assert "top-5 logits" in tradeoff and "text only" in tradeoff
    assert "EMAIL" in (out / "privacy_labels.md").read_text()
    # CSV carries the numbers behind each cell.
    header = (out / "model.csv").read_text().splitlines()[0]
    assert header == "table,row,column,text,value,low,high,se,n"


def test_report_bad_input_is_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    cases = [
        ([str(tmp_path / "empty")], "no result files"),
        ([str(tmp_path / "missing")], "no such result file"),
    ]
    model = tiny_model("gpt2")
    empty = run(model, [[1]], sodaray.SodaConfig(max_steps=1)).slice(0, 0)
    write_table_atomic(empty, tmp_path / "zero" / "rows.parquet")
    cases.append(([str(tmp_path / "zero")], "hold no rows"))
    write_table_atomic(run(model, [[1]], sodaray.SodaConfig(max_steps=1)), tmp_path / "r.parquet")
    cases.append(([str(tmp_path / "r.parquet"), "--format", "md,pdf"], "unknown report format"))
    for argv, message in cases:
        code = main(["report", *argv, "--out", str(tmp_path / "out")])
        err = capsys.readouterr().err
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
