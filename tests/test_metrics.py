"""Metrics on hand-built result rows with known answers."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from sodaray.report import metrics


@pytest.mark.parametrize(
    "k, n, low, high",
    # Newcombe (1998), "Two-sided confidence intervals for the single proportion", Table I.
    [
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0, 0.1611),
        (1, 29, 0.0061, 0.1718),
    ],
)
def test_wilson_interval_matches_textbook_values(k, n, low, high):
    got = metrics.wilson_interval(k, n)
    assert got == pytest.approx((low, high), abs=5e-5)


def test_proportion_formats_as_the_paper_prints():
    p = metrics.proportion(81, 263)
    assert p.value == pytest.approx(81 / 263)
    assert p.percent() == "30.8 (25.5–36.6)"
    assert math.isnan(metrics.proportion(0, 0).value)


def rows(**cols) -> pd.DataFrame:
    n = len(next(iter(cols.values())))
    base = {
        "found": [True] * n,
        "exact": [True] * n,
        "steps": [1] * n,
        "max_steps": [10] * n,
        "pii_labels": [None] * n,
        "length": [len(t) for t in cols["true_tokens"]],
    }
    base.update(cols)
    return pd.DataFrame(base)


def test_partial_counts_tokens_at_their_positions():
    df = rows(
        true_tokens=[[1, 2, 3, 4], [5, 6], [7, 8, 9]],
        tokens=[[1, 9, 3, 9], [5, 6], [8, 7]],  # 2/4, 2/2, 0/3 (shorter recovery misses)
        exact=[False, True, False],
    )
    assert metrics.partial_scores(df).tolist() == [0.5, 1.0, 0.0]
    m = metrics.partial(df)
    assert m.value == pytest.approx(0.5)
    assert m.se == pytest.approx(np.std([0.5, 1.0, 0.0], ddof=1) / math.sqrt(3))
    assert metrics.exact_rate(df).k == 1 and metrics.exact_rate(df).n == 3


def test_pii_recovery_over_labelled_tokens_and_by_label():
    df = rows(
        true_tokens=[[1, 2, 3, 4], [5, 6, 7], [8, 9]],
        tokens=[[1, 2, 0, 4], [5, 0, 7], [8, 9]],
        pii_labels=[
            [None, "GIVENNAME", "SURNAME", "SURNAME"],  # PII tokens: 2 right, 3 wrong, 4 right
            ["EMAIL", "EMAIL", None],  # 5 right, 6 wrong
            [None, None],  # no PII: left out of the PII mean
        ],
    )
    by_label = metrics.pii_by_label(df)
    assert by_label == {"EMAIL": (1, 2), "GIVENNAME": (1, 1), "SURNAME": (1, 2)}
    m = metrics.pii_partial(df)
    assert m.n == 2 and m.value == pytest.approx((2 / 3 + 1 / 2) / 2)


def test_false_discovery_is_found_but_not_exact():
    df = rows(
        true_tokens=[[1], [2], [3], [4]],
        tokens=[[1], [9], [3], [8]],
        found=[True, True, False, True],
        exact=[True, False, False, False],
    )
    fd = metrics.false_discovery(df)
    assert (fd.k, fd.n) == (2, 3)


def test_unknown_truth_is_left_out_of_exact():
    df = rows(true_tokens=[[1], [2]], tokens=[[1], [3]], exact=[True, None])
    df.loc[1, "true_tokens"] = None
    assert (metrics.exact_rate(df).k, metrics.exact_rate(df).n) == (1, 1)
    assert metrics.partial(df).n == 1


def test_solved_by_step_and_position():
    df = rows(
        true_tokens=[[1, 2], [3, 4], [5, 6], [7, 8]],
        tokens=[[1, 2], [3, 4], [5, 0], [0, 0]],
        exact=[True, True, False, False],
        steps=[3, 8, 10, 10],
    )
    curve = metrics.solved_by_step(df, steps=[0, 3, 5, 8, 10])
    assert curve.tolist() == [0.0, 0.25, 0.25, 0.5, 0.5]
    by_pos = metrics.solved_by_position(df)
    assert by_pos.to_dict() == {1: 0.75, 2: 0.5}


def test_length_confusion():
    df = rows(true_tokens=[[1], [1, 2], [1, 2], [1, 2, 3]], tokens=[[1], [1], [1, 2], [1, 2, 3]])
    df["predicted_length"] = [1, 1, 2, 3]
    table = metrics.length_confusion(df)
    assert table.loc[2, 1] == 1 and table.loc[2, 2] == 1 and table.loc[3, 3] == 1


def test_cosine_similarity_with_a_local_encoder(tmp_path):
    from conftest import SHARED
    from transformers import AutoTokenizer, BertConfig, BertModel

    if not (SHARED / "tokenizers/gpt2").is_dir():
        pytest.skip("shared tokenizer absent")
    tok = AutoTokenizer.from_pretrained(SHARED / "tokenizers/gpt2")
    tok.pad_token = tok.eos_token
    cfg = BertConfig(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
    )
    BertModel(cfg).save_pretrained(tmp_path / "enc")
    tok.save_pretrained(tmp_path / "enc")
    embedder = metrics.load_sentence_embedder(str(tmp_path / "enc"))
    sims = metrics.cosine_similarities(embedder, ["the cat sat", "a dog"], ["the cat sat", "zzz"])
    assert sims[0] == pytest.approx(1.0, abs=1e-5) and sims[1] < 0.9999
    with pytest.raises(ValueError, match="sentence-embedding model"):
        metrics.load_sentence_embedder(str(tmp_path / "missing"))
