"""The report's paper tables on hand-made result rows whose right answers are known: the length
table (unsolved inputs have no predicted length; assumed lengths), PII by label per algorithm
with a None row, recovery by position per length, and the models table's size columns."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import STORIES, tiny_model

import sodaray
from sodaray.report import metrics
from sodaray.report.drawing import save
from sodaray.report.figures import exact_by_position_figure
from sodaray.report.rows import prepare
from sodaray.report.tables import (
    table_algo,
    table_length,
    table_model,
    table_privacy,
    table_tweaks,
)
from sodaray.results import RESULT_SCHEMA, RunContext, read_results, result_rows


def frame(**cols: list[Any]) -> pd.DataFrame:
    """Result rows: every schema column, nulls unless given (the report's own input shape)."""
    n = len(next(iter(cols.values())))
    data: dict[str, list[Any]] = {name: [None] * n for name in RESULT_SCHEMA.names}
    data.update(
        model=["m"] * n,
        model_name=["m"] * n,
        dataset=["random"] * n,
        algorithm=["soda"] * n,
        objective=["logits"] * n,
        output_tokens=[1] * n,
        fluency_weight=[0.0] * n,
        max_steps=[10] * n,
        seed=[0] * n,
        steps=[1] * n,
        length_mode=["fixed"] * n,
        params=[json.dumps({})] * n,
    )
    data.update(cols)
    if "length" not in cols and "true_tokens" in cols:
        data["length"] = [len(t) for t in cols["true_tokens"]]
    return prepare(pd.DataFrame(data))


def cells(table, label: str) -> list[str]:
    return next(c for lab, c in table.rows if lab == label)


def texts(table, label: str) -> list[str]:
    return [c.text for c in cells(table, label)]


def test_auto_length_unsolved_sample_has_no_predicted_length():
    # A length-3 input never solved: lengths 1..3 tried, the last (3) left as its "length".
    df = frame(
        true_tokens=[[1, 2, 3], [1, 2, 3], [4]],
        tokens=[[1, 2, 3], [9, 9, 9], [4]],
        found=[True, False, True],
        exact=[True, False, True],
        predicted_length=[3, 3, 1],
        length_mode=["auto"] * 3,
    )
    (table,) = table_length(df)
    assert table.name == "length_auto"
    assert table.header == ["True length", "pred 1", "pred 3", "unsolved", "Correct"]
    assert texts(table, "3")[:3] == ["0", "1", "1"]
    correct = cells(table, "3")[3]
    assert (correct.value, correct.n) == (0.5, 2)  # the unsolved one is not correct


def test_assumed_lengths_give_share_found_per_true_and_assumed_pair():
    # True lengths 1 and 2, each searched at assumed 1 and 2.
    df = frame(
        true_tokens=[[5], [5], [6, 7], [6, 7], [8, 9], [8, 9]],
        tokens=[[5], [5, 1], [6], [6, 7], [8], [1, 2]],
        found=[True, True, True, True, False, False],
        exact=[True, False, False, True, False, False],
        predicted_length=[1, 2, 1, 2, 1, 2],
        length_mode=["assumed"] * 6,
    )
    (table,) = table_length(df)
    assert table.name == "length"
    assert table.header == ["True length", "assumed 1", "assumed 2"]
    one, two = cells(table, "1"), cells(table, "2")
    assert [(c.value, c.n) for c in one] == [(1.0, 1), (1.0, 1)]
    assert [(c.value, c.n) for c in two] == [(0.5, 2), (0.5, 2)]


def test_pii_by_label_one_column_per_algorithm_with_a_none_row():
    true = [[1, 2, 3]]
    labels = [["NAME", "NAME", None]]
    df = pd.concat(
        [
            frame(
                true_tokens=true,
                tokens=[[1, 2, 3]],
                pii_labels=labels,
                dataset=["privacy"],
                found=[True],
                exact=[True],
            ),
            frame(
                true_tokens=true,
                tokens=[[1, 0, 0]],
                pii_labels=labels,
                dataset=["privacy"],
                algorithm=["gcg"],
                found=[False],
                exact=[False],
            ),
        ],
        ignore_index=True,
    )
    _, by_label = table_privacy(df)
    assert by_label.header == ["Label", "Tokens", "GCG", "SODA"]
    assert [lab for lab, _ in by_label.rows] == ["NAME", "None"]
    name = cells(by_label, "NAME")
    assert name[0].value == 2  # two NAME tokens, not four (no pooling across algorithms)
    assert (name[1].value, name[2].value) == (0.5, 1.0)
    none = cells(by_label, "None")
    assert none[0].value == 1 and (none[1].value, none[2].value) == (0.0, 1.0)


def test_recovery_by_position_is_broken_down_by_length(tmp_path):
    df = frame(
        true_tokens=[[1], [2], [3, 4], [5, 6]],
        tokens=[[1], [0], [3, 0], [5, 6]],
        found=[True, False, False, True],
        exact=[True, False, False, True],
    )
    table = metrics.solved_by_position_by_length(df)
    assert list(table.columns) == [1, 2]
    assert table.loc[1, 1] == 0.5 and pd.isna(table.loc[2, 1])
    assert table.loc[1, 2] == 1.0 and table.loc[2, 2] == 0.5
    plot = exact_by_position_figure(df)
    assert plot is not None
    save(plot.figure, tmp_path / "by_position.png")
    assert (tmp_path / "by_position.png").is_file()


def test_models_table_has_layers_width_and_vocabulary(tmp_path):
    model = tiny_model("gpt2")  # 2 layers, width 32
    objective = sodaray.Objective()
    targets = sodaray.make_targets(model, [[1], [2]], objective=objective)
    results = sodaray.invert(model, targets, sodaray.SodaConfig(max_steps=2))
    table = result_rows(results, RunContext.for_model(model, objective, dataset="random"))
    pq.write_table(table, tmp_path / "rows.parquet")
    df = prepare(read_results(tmp_path).to_pandas())
    (models,) = table_model(df)
    assert models.header[:4] == ["Model", "Layers", "Width", "Vocab"]
    row = models.rows[0][1]
    assert (row[0].value, row[1].value) == (2, 32)
    assert row[2].value == model.vocab_size


def test_older_result_files_read_back_with_null_size_columns(tmp_path):
    model = tiny_model("gpt2")
    objective = sodaray.Objective()
    targets = sodaray.make_targets(model, [[1]], objective=objective)
    results = sodaray.invert(model, targets, sodaray.SodaConfig(max_steps=1))
    table = result_rows(results, RunContext.for_model(model, objective))
    old = table.drop_columns(["model_layers", "model_width"])
    pq.write_table(old, tmp_path / "old.parquet")
    back = read_results(tmp_path)
    assert back.column("model_layers").to_pylist() == [None]
    assert back.schema.field("model_width").type == pa.int64()
    (models,) = table_model(prepare(back.to_pandas()))
    assert models.rows[0][1][0].text == ""  # blank, not a crash


@pytest.mark.parametrize(
    ("params", "label"),
    [
        (
            {"bias_correction": True, "use_decay": False, "use_resets": False, "use_reinit": False},
            "Adam",
        ),
        ({"use_decay": False}, "SODA − decay"),
    ],
)
def test_ablation_rows_are_named_as_the_papers(params, label):
    df = pd.concat(
        [
            frame(true_tokens=[[1]], tokens=[[1]], found=[True], exact=[True]),
            frame(
                true_tokens=[[1]],
                tokens=[[2]],
                found=[False],
                exact=[False],
                params=[json.dumps(params)],
            ),
        ],
        ignore_index=True,
    )
    (tweaks,) = table_tweaks(df)
    assert {lab for lab, _ in tweaks.rows} == {label, "SODA"}


def test_algorithms_table_reports_exact_partial_and_cosine():
    df = pd.concat(
        [
            frame(true_tokens=[[1, 2]], tokens=[[1, 2]], found=[True], exact=[True]),
            frame(
                true_tokens=[[1, 2]],
                tokens=[[1, 0]],
                found=[False],
                exact=[False],
                algorithm=["gcg"],
            ),
        ],
        ignore_index=True,
    )
    df["cos_sim"] = [1.0, 0.25]
    (table,) = table_algo(df)
    assert table.header == ["Algorithm", "Logits Exact", "Logits Partial", "Logits Cos. Sim."]
    gcg = cells(table, "GCG")
    assert [c.value for c in gcg] == [0.0, 0.5, 0.25]


def test_every_algorithm_has_its_row_in_the_algorithms_table():
    """The inverter and an algorithm this version does not know both get rows, after SODA,
    GCG and embedding search in registry order (the table once listed three by name)."""
    rows = [
        frame(
            true_tokens=[[1, 2]],
            tokens=[[1, 2] if algo == "soda" else [1, 0]],
            found=[algo == "soda"],
            exact=[algo == "soda"],
            algorithm=[algo],
        )
        for algo in ("newalgo", "inverter", "embedding", "gcg", "soda")
    ]
    (table,) = table_algo(pd.concat(rows, ignore_index=True))
    labels = [label for label, _ in table.rows]
    assert labels == ["SODA", "GCG", "Embedding search", "T5 inverter", "newalgo"]
    assert [c.value for c in cells(table, "T5 inverter")][:2] == [0.0, 0.5]


def test_random_ids_over_the_tokenizer_by_default_padded_vocab_as_option(tmp_path):
    import shutil

    from conftest import SHARED
    from transformers import GPT2Config

    from sodaray.data.build import build_dataset

    tokenizer = SHARED / "tokenizers" / "gpt2"
    if not tokenizer.is_dir():
        pytest.skip("shared tokenizer absent")
    folder = tmp_path / "padded"
    shutil.copytree(tokenizer, folder)
    GPT2Config(vocab_size=50304).save_pretrained(folder)  # padded past len(tokenizer) = 50257

    def top_id(vocab: str) -> int:
        table = build_dataset(str(folder), "random", "5", 2000, 1, vocab=vocab, progress=False)
        return max(max(t) for t in table.column("tokens").to_pylist())

    assert top_id("tokenizer") < 50257
    assert top_id("model") >= 50257  # ~9 of 10,000 draws land in the padding
    spec = load_sweep_text(tmp_path, "random")
    assert spec.datasets[0].build == {"dataset": "random", "lengths": "1", "vocab": "tokenizer"}


def load_sweep_text(tmp_path, dataset: str):
    from sodaray.runner.spec import load_sweep

    path = tmp_path / "s.yaml"
    path.write_text(
        "name: s\nmodels: [{id: gpt2}]\n"
        f"datasets: [{{name: {dataset}, build: {{dataset: {dataset}, lengths: '1'}}}}]\n"
        "algorithms: [{name: soda}]\n"
    )
    return load_sweep(path)


def _privacy_rows(source: str | None) -> pd.DataFrame:
    return frame(
        true_tokens=[[1, 2]],
        tokens=[[1, 2]],
        pii_labels=[["NAME", None]],
        dataset=["privacy"],
        dataset_source=[source],
        found=[True],
        exact=[True],
    )


def test_privacy_tables_say_when_their_records_are_synthetic():
    main, by_label = table_privacy(_privacy_rows("synthetic (faker 30.0.0, en_US)"))
    assert main.caption.startswith("SYNTHETIC PII: ")
    assert by_label.caption.startswith("SYNTHETIC PII: ")
    mixed = pd.concat(
        [_privacy_rows("synthetic (faker 30.0.0, en_US)"), _privacy_rows("hf:ai4privacy")],
        ignore_index=True,
    )
    assert table_privacy(mixed)[0].caption.startswith("SYNTHETIC PII (1 of 2 rows): ")
    for source in ("hf:ai4privacy/pii-masking-200k[train] (English)", None):
        assert "SYNTHETIC" not in table_privacy(_privacy_rows(source))[0].caption


@pytest.mark.skipif(not STORIES.exists(), reason="needs ../shared/models/stories260K")
def test_a_synthetic_dataset_names_its_source_in_the_result_rows():
    from sodaray.data.build import build_dataset
    from sodaray.experiment.data import dataset_identity

    table = build_dataset(str(STORIES), "privacy", "15", 2, seed=0, source="synthetic")
    identity = dataset_identity(table)
    assert identity.source.startswith("synthetic (faker ")
    model = tiny_model("gpt2")
    context = RunContext.for_model(model, sodaray.Objective(), dataset="privacy")
    context = dataclasses.replace(context, dataset_source=identity.source)
    target = sodaray.make_targets(model, [[1, 2]])
    results = sodaray.invert(model, target, sodaray.SodaConfig(max_steps=1))
    rows = result_rows(results, context).to_pylist()
    assert rows[0]["dataset_source"] == identity.source
