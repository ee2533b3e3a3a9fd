"""Dataset builders: determinism, shapes, sources, PII labels, file checks and CLI errors."""

from __future__ import annotations

import csv
import json
import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import SHARED, STORIES

from sodaray.cli import main
from sodaray.data.build import build_dataset, parse_lengths
from sodaray.data.pii import PII_LABELS, Span, SyntheticPii, label_tokens
from sodaray.data.sources import split_sentences
from sodaray.data.store import dataset_hash, dataset_metadata, read_dataset, write_dataset
from sodaray.data.tokenizer import DatasetError, load_tokenizer

GPT2 = SHARED / "tokenizers" / "gpt2"
STORIES_JSONL = SHARED / "data" / "tinystories_valid.jsonl"
REDDIT_CSV = SHARED / "data" / "reddit_comments.csv"
SMOLLM_GGUF = SHARED / "models" / "smollm2-135m-instruct-q4_1" / "SmolLM2-135M-Instruct.Q4_1.gguf"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="../shared is not present")


@pytest.fixture(scope="module")
def stories_tok():
    if not STORIES.is_dir():
        pytest.skip("../shared/models/stories260K is not present")
    return load_tokenizer(str(STORIES))


@pytest.fixture(scope="module")
def gpt2_tok():
    if not GPT2.is_dir():
        pytest.skip("../shared/tokenizers/gpt2 is not present")
    return load_tokenizer(str(GPT2))


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["data", "build", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def encode(tok, text: str) -> list[int]:
    return list(tok.tokenizer(text, add_special_tokens=False)["input_ids"])


def test_parse_lengths():
    assert parse_lengths("1-10") == list(range(1, 11))
    assert parse_lengths("3") == [3]
    assert parse_lengths("5,1,3,3") == [1, 3, 5]
    assert parse_lengths([2, 4]) == [2, 4]
    for bad, message in [("0-3", "at least 1"), ("5-2", "ends before"), ("abc", "A-B")]:
        with pytest.raises(DatasetError, match=message):
            parse_lengths(bad)


def test_split_sentences():
    text = "One day. Two days!\nThree? Four\n\nFive " + "x" * 2000
    assert split_sentences(text)[:4] == ["One day.", "Two days!", "Three?", "Four"]
    assert len("".join(split_sentences(text))) <= 1000


# ---- random ----------------------------------------------------------------------------------
def test_random_deterministic_file_bytes(tmp_path, stories_tok):
    m = str(STORIES)
    a = build_dataset(m, "random", "1-3", 10, seed=1, tokenizer=stories_tok)
    b = build_dataset(m, "random", "1-3", 10, seed=1, tokenizer=stories_tok)
    val = build_dataset(m, "random", "1-3", 10, seed=0, tokenizer=stories_tok)
    write_dataset(a, tmp_path / "a.parquet")
    write_dataset(b, tmp_path / "b.parquet")
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
    assert dataset_hash(a) == dataset_hash(b) != dataset_hash(val)
    assert a.column("tokens").to_pylist() != val.column("tokens").to_pylist()

    table = read_dataset(tmp_path / "a.parquet")
    assert table.schema.equals(a.schema) and dataset_hash(table) == dataset_hash(a)
    rows = table.to_pylist()
    assert [r["sample_id"] for r in rows] == list(range(30))
    assert [r["length"] for r in rows] == [1] * 10 + [2] * 10 + [3] * 10
    for r in rows:
        assert len(r["tokens"]) == r["length"] and all(0 <= t < 512 for t in r["tokens"])
        assert r["vocab_size"] == 512 and r["tokenizer"] == m and r["dataset"] == "random"
        assert r["pii_labels"] is None and r["document_id"] is None
        assert r["text"] == stories_tok.tokenizer.decode(r["tokens"])
    meta = dataset_metadata(table)
    assert (
        meta["version"] == "1"
        and meta["args"]["seed"] == 1
        and meta["args"]["lengths"]
        == [
            1,
            2,
            3,
        ]
    )


def test_random_cli(tmp_path, capsys):
    if not STORIES.is_dir():
        pytest.skip("stories260K is not present")
    out = tmp_path / "sub" / "r.parquet"
    args = ["--model", str(STORIES), "--dataset", "random", "--lengths", "2,4"]
    code, stdout, _ = run(capsys, *args, "--per-length", "5", "--out", str(out))
    assert code == 0
    table = read_dataset(out)
    assert len(table) == 10 and str(out) in stdout and "10 rows" in stdout
    # One line for the file, one for where its rows came from (no fallback line: nothing failed).
    first, source = stdout.strip().splitlines()
    assert dataset_hash(table) in first and source == "  source: uniform random tokens"
    assert sorted(set(table.column("length").to_pylist())) == [2, 4]


# ---- natural language --------------------------------------------------------------------------
def _check_sentence_samples(table: pa.Table, texts: dict[int, str], tok) -> None:
    for r in table.to_pylist():
        sentences = [encode(tok, s) for s in split_sentences(texts[r["document_id"]])]
        assert any(s[: r["length"]] == r["tokens"] for s in sentences if len(s) >= r["length"])


@needs_shared
def test_nl_id_from_jsonl(stories_tok):
    table = build_dataset(
        str(STORIES), "nl-id", "1-4", 10, source=str(STORIES_JSONL), tokenizer=stories_tok
    )
    lines = STORIES_JSONL.read_text(encoding="utf-8").splitlines()
    texts = {i: json.loads(line)["text"] for i, line in enumerate(lines)}
    assert len(table) == 40
    _check_sentence_samples(table, texts, stories_tok)
    docs = table.column("document_id").to_pylist()
    assert len(set(docs)) == len(docs)  # fresh documents while unused ones remain
    assert dataset_metadata(table)["info"]["documents_reused"] == 0
    again = build_dataset(
        str(STORIES), "nl-id", "1-4", 10, source=str(STORIES_JSONL), tokenizer=stories_tok
    )
    assert dataset_hash(again) == dataset_hash(table)


@needs_shared
def test_nl_ood_from_csv(gpt2_tok):
    table = build_dataset(
        str(GPT2), "nl-ood", "3,8", 15, seed=0, source=str(REDDIT_CSV), tokenizer=gpt2_tok
    )
    with REDDIT_CSV.open(encoding="utf-8", newline="") as f:
        texts = {i: row["Comment"] for i, row in enumerate(csv.DictReader(f))}
    assert len(table) == 30 and table.column("length").to_pylist() == [3] * 15 + [8] * 15
    _check_sentence_samples(table, texts, gpt2_tok)
    assert all(0 <= t < 50257 for ts in table.column("tokens").to_pylist() for t in ts)


def test_small_source_reuses_documents(tmp_path, stories_tok, caplog):
    src = tmp_path / "tiny.txt"
    src.write_text("The cat sat on the mat. It was happy.\n\nA dog ran home.\n\nBirds sing.\n")
    with caplog.at_level(logging.WARNING, logger="sodaray.data"):
        table = build_dataset(
            str(STORIES), "nl-id", "1-2", 3, source=str(src), tokenizer=stories_tok
        )
    assert len(table) == 6
    assert dataset_metadata(table)["info"]["documents_reused"] == 3
    assert any("reuse" in rec.getMessage() for rec in caplog.records)
    with pytest.raises(DatasetError, match="200 tokens"):
        build_dataset(str(STORIES), "nl-id", "200", 1, source=str(src), tokenizer=stories_tok)


# ---- privacy -----------------------------------------------------------------------------------
def test_label_tokens_marks_inserted_values(gpt2_tok):
    text = "My name is Alice Smith and my email is alice.smith@example.com today."
    spans = [
        Span(11, 16, "GIVENNAME"),
        Span(17, 22, "SURNAME"),
        Span(39, 62, "EMAIL"),
    ]
    ids, labels = label_tokens(gpt2_tok.tokenizer, text, spans)
    assert len(ids) == len(labels)
    decode = gpt2_tok.tokenizer.decode
    for span in spans:
        picked = [t for t, lab in zip(ids, labels, strict=True) if lab == span.label]
        assert text[span.start : span.end] in decode(picked)
    plain = decode([t for t, lab in zip(ids, labels, strict=True) if lab is None])
    assert "Alice" not in plain and "@" not in plain and "today" in plain


@pytest.mark.parametrize("tok_name", ["gpt2_tok", "stories_tok"])
def test_synthetic_templates_label_every_value(request, tok_name):
    tok = request.getfixturevalue(tok_name).tokenizer
    gen = SyntheticPii(seed=3)
    for lead in PII_LABELS:
        text, spans = gen.sentence(lead)
        assert spans[0].label == lead
        ids, labels = label_tokens(tok, text, spans)
        for span in spans:  # each label occurs once per template
            picked = [t for t, lab in zip(ids, labels, strict=True) if lab == span.label]
            assert text[span.start : span.end] in tok.decode(picked)


@pytest.mark.parametrize("tok_name", ["gpt2_tok", "stories_tok"])
def test_privacy_synthetic_build(request, tok_name):
    tok = request.getfixturevalue(tok_name)
    model = str(GPT2 if tok_name == "gpt2_tok" else STORIES)
    table = build_dataset(model, "privacy", "15-17", 20, source="synthetic", tokenizer=tok)
    rows = table.to_pylist()
    assert len(rows) == 60 and [r["length"] for r in rows] == [15] * 20 + [16] * 20 + [17] * 20
    seen = set()
    for r in rows:
        labels = r["pii_labels"]
        assert len(labels) == len(r["tokens"]) == r["length"]
        assert set(labels) <= set(PII_LABELS) | {None} and any(labels)
        assert all(0 <= t < tok.vocab_size for t in r["tokens"])
        seen.update(lab for lab in labels if lab)
    assert seen == set(PII_LABELS)
    same = build_dataset(model, "privacy", "15-17", 20, source="synthetic", tokenizer=tok)
    other = build_dataset(model, "privacy", "15-17", 20, seed=0, source="synthetic", tokenizer=tok)
    assert dataset_hash(same) == dataset_hash(table) != dataset_hash(other)
    assert "faker" in dataset_metadata(table)["info"]["source"]


def test_privacy_from_ai4privacy_jsonl(tmp_path, gpt2_tok):
    text = "Contact Maria Rossi at maria.rossi@example.org or in Milano soon please."
    mask = [
        {"label": "GIVENNAME", "start": 8, "end": 13, "value": "Maria"},
        {"label": "SURNAME", "start": 14, "end": 19, "value": "Rossi"},
        {"label": "EMAIL", "start": 23, "end": 45, "value": "maria.rossi@example.org"},
        {"label": "CITY", "start": 52, "end": 58, "value": "Milano"},
        {"label": "SOMETHINGELSE", "start": 0, "end": 7},
    ]
    lines = [
        json.dumps({"source_text": text, "privacy_mask": mask if i % 2 else json.dumps(mask)})
        for i in range(6)
    ]
    src = tmp_path / "pii.jsonl"
    src.write_text("\n".join(lines) + "\n")
    table = build_dataset(
        str(GPT2), "privacy", "4,12", 3, source=str(src), tokenizer=gpt2_tok, records="prefix"
    )
    ids, labels = label_tokens(gpt2_tok.tokenizer, text, [Span(**_span(m)) for m in mask[:4]])
    for r in table.to_pylist():
        assert r["tokens"] == ids[: r["length"]] and r["pii_labels"] == labels[: r["length"]]
    assert sorted(table.column("document_id").to_pylist()) == list(range(6))
    assert "SOMETHINGELSE" not in str(table.column("pii_labels").to_pylist())


def test_privacy_whole_records_of_each_length_first_in_order(tmp_path, gpt2_tok):
    """The authors' set: records whose whole text has the length, the first of each length in
    source order; longer records are not cut to a prefix."""
    texts = [
        "Call Anna now.",  # short
        "Write to Anna Smith at anna@example.org today, thanks a lot for it.",
        "Call Bob now.",
        "Call Eve now.",
        "Call Tom now.",
    ]
    lines = []
    for text in texts:
        start = text.index(text.split()[1])
        mask = [{"label": "GIVENNAME", "start": start, "end": start + len(text.split()[1])}]
        lines.append(json.dumps({"source_text": text, "privacy_mask": mask}))
    src = tmp_path / "pii.jsonl"
    src.write_text("\n".join(lines) + "\n")
    n = len(gpt2_tok.tokenizer(texts[0])["input_ids"])
    table = build_dataset(str(GPT2), "privacy", str(n), 2, source=str(src), tokenizer=gpt2_tok)
    rows = table.to_pylist()
    assert [r["document_id"] for r in rows] == [0, 2]  # the first two whole records of length n
    assert [gpt2_tok.tokenizer.decode(r["tokens"]) for r in rows] == texts[0:1] + texts[2:3]
    assert rows[0]["pii_labels"].count("GIVENNAME") >= 1 and None in rows[0]["pii_labels"]
    assert dataset_metadata(table)["args"]["records"] == "whole"


def _span(m: dict) -> dict:
    return {"start": m["start"], "end": m["end"], "label": m["label"]}


# ---- the hub, offline ----------------------------------------------------------------------------
def test_hub_unreachable_offline(monkeypatch, tmp_path, capsys, caplog):
    if not STORIES.is_dir():
        pytest.skip("stories260K is not present")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    args = ["--model", str(STORIES), "--out", str(tmp_path / "x.parquet")]
    code, _, err = run(capsys, *args, "--dataset", "nl-id")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "cannot reach the Hugging Face hub" in err and "--source PATH" in err
    code, _, err = run(capsys, *args, "--dataset", "nl-ood", "--lengths", "2", "--per-length", "2")
    assert code == 2 and "sentence-transformers/reddit" in err
    # privacy falls back to synthetic text
    code, out, err = run(capsys, *args, "--dataset", "privacy", "--per-length", "2")
    assert code == 0 and "20 rows" in out
    assert any("falling back" in rec.getMessage() for rec in caplog.records)
    assert dataset_metadata(read_dataset(tmp_path / "x.parquet"))["info"]["fallback"] == "synthetic"
    assert "fallback: synthetic" in out
    # `--json` says so too (issue 39): a caller reading only the JSON sees the records are Faker's.
    code, out, err = run(capsys, *args, "--dataset", "privacy", "--per-length", "2", "--json")
    built = json.loads(out)
    assert code == 0 and built["fallback"] == "synthetic" and built["rows"] == 20
    assert built["source"].startswith("synthetic (faker")


def test_hub_rows_streamed_in_order(monkeypatch, gpt2_tok):
    from sodaray.data import sources

    rows = [
        {"title": "t", "body": "Short one. " + "A much longer sentence about trains goes here."},
        {"title": "t", "body": ""},  # empty: skipped, but the stream index is kept
        {"title": "t", "body": "Another comment with enough words in it to be used. Yes."},
        {"other": "No body field at all, so the first string column is read.", "n": 1},
    ]
    monkeypatch.setattr(sources, "_open_hub", lambda hub: iter(rows))
    table = build_dataset(str(GPT2), "nl-ood", "6", 3, tokenizer=gpt2_tok)
    assert sorted(table.column("document_id").to_pylist()) == [0, 2, 3]
    assert dataset_metadata(table)["info"]["source"].startswith("hf:sentence-transformers/reddit")

    text = "Call me at 555-0100 please, any time after nine in the morning."
    pii = [{"start": 11, "end": 19, "label": "TELEPHONENUM"}]
    records = [
        {"source_text": text, "privacy_mask": pii, "language": lang} for lang in ("de", "en", "en")
    ]
    monkeypatch.setattr(sources, "_open_hub", lambda hub: iter(records))
    table = build_dataset(str(GPT2), "privacy", "5", 2, tokenizer=gpt2_tok, records="prefix")
    assert sorted(table.column("document_id").to_pylist()) == [1, 2]  # English rows only
    assert "TELEPHONENUM" in table.column("pii_labels").to_pylist()[0]


# ---- bad input ---------------------------------------------------------------------------------
BAD = [
    (["--dataset", "nope"], "choose one of random, nl-id, nl-ood, privacy"),
    (["--dataset", "random", "--lengths", "0-3"], "at least 1"),
    (["--dataset", "random", "--lengths", "5-2"], "ends before"),
    (["--dataset", "random", "--lengths", "abc"], "A-B"),
    (["--dataset", "random", "--per-length", "0"], "per-length"),
    (["--dataset", "nl-id", "--source", "/no/such/file.jsonl"], "/no/such/file.jsonl"),
    (["--dataset", "nl-id", "--source", "synthetic"], "privacy"),
    (["--dataset", "random", "--source", "hf"], "no source"),
]


@pytest.mark.parametrize(("argv", "message"), BAD)
def test_bad_input_one_line_errors(capsys, tmp_path, argv, message):
    out = str(tmp_path / "x.parquet")
    code, _, err = run(capsys, "--model", "./no/such/model", *argv, "--out", out)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_bad_model_path(capsys, tmp_path):
    out = str(tmp_path / "x.parquet")
    code, _, err = run(capsys, "--model", "./no/such/model", "--dataset", "random", "--out", out)
    assert code == 2 and "no such model" in err


def test_read_dataset_checks(tmp_path, stories_tok):
    table = build_dataset(str(STORIES), "random", "1", 3, tokenizer=stories_tok)
    pq.write_table(table.replace_schema_metadata(None), tmp_path / "plain.parquet")
    with pytest.raises(DatasetError, match="not a sodaray dataset"):
        read_dataset(tmp_path / "plain.parquet")
    pq.write_table(table.drop_columns(["text"]), tmp_path / "short.parquet")
    with pytest.raises(DatasetError, match="text"):
        read_dataset(tmp_path / "short.parquet")
    tampered = table.set_column(
        table.column_names.index("text"), "text", pa.array(["x", "y", "z"])
    ).replace_schema_metadata(table.schema.metadata)
    pq.write_table(tampered, tmp_path / "tampered.parquet")
    with pytest.raises(DatasetError, match="hash"):
        read_dataset(tmp_path / "tampered.parquet")
    with pytest.raises(DatasetError, match="no such dataset file"):
        read_dataset(tmp_path / "missing.parquet")


@pytest.mark.slow
def test_gguf_tokenizer_vocab_size(tmp_path, capsys):
    if not SMOLLM_GGUF.is_file():
        pytest.skip("the SmolLM2 GGUF file is not present")
    out = tmp_path / "g.parquet"
    code, _, _ = run(
        capsys, "--model", str(SMOLLM_GGUF), "--dataset", "random", "--lengths", "2",
        "--per-length", "4", "--out", str(out),
    )  # fmt: skip
    table = read_dataset(out)
    assert code == 0 and set(table.column("vocab_size").to_pylist()) == {49152}
