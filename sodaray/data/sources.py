"""Documents for the natural-language and PII datasets: the Hugging Face hub or a local file.

Hub sources (`--source hf`, `HUB_SOURCES`) are streamed, so only the first documents of a large
corpus are fetched. They fail fast with `HubUnreachable` when `HF_HUB_OFFLINE` /
`HF_DATASETS_OFFLINE` is set (a dataset already in the local `datasets` cache is then still
used) or a short metadata request cannot reach the hub. Local files by extension: `.jsonl` /
`.json` (a JSON object per line: `text`, or for PII records `source_text` and `privacy_mask`),
`.csv` (the first of `CSV_TEXT_COLUMNS`, else the column holding the most characters), anything
else plain text, one document per blank-line-separated block.

Each document keeps its position in the source (line, row, block or stream index, empty ones
counted) as its id, so every sample can be traced back to the text it came from.
"""

from __future__ import annotations

import csv
import io
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sodaray.data.tokenizer import DatasetError
from sodaray.errors import first_line
from sodaray.io.files import parse_json, regular_file

log = logging.getLogger(__name__)

CSV_TEXT_COLUMNS = ("text", "Comment", "comment", "body")
# Sentence ends: . ! or ? followed by whitespace; a blank line (paragraph break) ends one too.
_SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+|\n\s*\n")
_BLOCK_BREAK = re.compile(r"\n\s*\n")
_OFFLINE_VALUES = {"1", "ON", "YES", "TRUE"}


class HubUnreachable(DatasetError):
    """The Hugging Face hub cannot be reached (offline mode or no connection)."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Document:
    id: int
    text: str


@dataclass(frozen=True)
class HubSource:
    repo: str
    split: str
    field: str | None  # None: no single text field (PII records)
    example: str | None  # a local copy to pass instead when the hub is out of reach

    def unreachable(self, why: str) -> HubUnreachable:
        """The error for the hub out of reach, saying what to pass instead."""
        hint = "pass --source synthetic for Faker-generated PII text"
        if self.example is not None:
            hint = "pass --source PATH with a local JSONL/CSV/text file"
            hint += f" (e.g. ../shared/data/{self.example})"
        message = f"cannot reach the Hugging Face hub for {self.repo} ({why}); {hint}"
        return HubUnreachable(message, why)


HUB_SOURCES = {
    "nl-id": HubSource("roneneldan/TinyStories", "validation", "text", "tinystories_valid.jsonl"),
    "nl-ood": HubSource("sentence-transformers/reddit", "train", "body", "reddit_comments.csv"),
    "privacy": HubSource("ai4privacy/pii-masking-400k", "validation", None, None),
}


def split_sentences(text: str, max_chars: int = 1000) -> list[str]:
    """Sentences of the first `max_chars` characters: split after . ! ? followed by whitespace,
    and at blank lines; stripped, empty ones dropped. The last piece may be cut by `max_chars`."""
    return [s.strip() for s in _SENTENCE_BREAK.split(text[:max_chars]) if s.strip()]


# ---- local files ----------------------------------------------------------------------------
def _read_text(path: Path) -> str:
    """A source file's text: UTF-8, and text (a NUL byte is in binary files, never in text);
    else one line naming the file."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetError(
            f"{path}: not UTF-8 text ({first_line(exc)}); a source file is JSONL, CSV or "
            "plain text saved as UTF-8"
        ) from exc
    except OSError as exc:
        raise DatasetError(f"{path}: cannot read it ({first_line(exc)})") from exc
    if "\0" in text:
        raise DatasetError(
            f"{path}: holds NUL bytes, so it is a binary file, not a JSONL, CSV or text source"
        )
    return text


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    lines = _read_text(path).split("\n")  # not splitlines(): U+2028 may be inside a string
    if lines and not lines[-1]:
        lines.pop()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            rows.append({})
            continue
        try:
            row = parse_json(line, f"{path}:{number}")
        except ValueError as exc:
            raise DatasetError(str(exc)) from exc
        rows.append(row if isinstance(row, dict) else {"text": row})
    return rows


def _read_csv(path: Path) -> list[str]:
    try:
        rows = list(csv.DictReader(io.StringIO(_read_text(path), newline="")))
    except csv.Error as exc:
        raise DatasetError(f"{path}: not a readable CSV file ({first_line(exc)})") from exc
    if not rows:
        return []
    columns = list(rows[0].keys())
    column = next((c for c in CSV_TEXT_COLUMNS if c in columns), None)
    if column is None:  # no known name: the column holding the most text
        column = max(columns, key=lambda c: sum(len(r.get(c) or "") for r in rows))
    log.info("reading column %r of %s", column, path)
    return [r.get(column) or "" for r in rows]


def read_local_documents(path: str | os.PathLike) -> list[Document]:
    """Documents of a local JSONL, CSV or plain-text file (empty ones skipped, ids kept)."""
    p = regular_file(path, "source file", DatasetError)  # a FIFO would block its read
    suffix = p.suffix.lower()
    if suffix in (".jsonl", ".json"):
        rows = _read_jsonl(p)
        if rows and not any("text" in r for r in rows):
            raise DatasetError(f"{path}: no 'text' field in its JSON lines")
        texts = []
        for number, row in enumerate(rows, 1):
            text = row.get("text")
            if text is not None and not isinstance(text, str):  # 12345 is not a text
                raise DatasetError(
                    f"{path}: line {number}: text must be a string, not {text!r:.60}"
                )
            texts.append(text or "")
    elif suffix == ".csv":
        texts = _read_csv(p)
    else:
        texts = _BLOCK_BREAK.split(_read_text(p))
    docs = [Document(i, t) for i, t in enumerate(texts) if t.strip()]
    if not docs:
        raise DatasetError(f"no documents in {path}")
    return docs


def read_local_pii_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """ai4privacy-style records (`source_text`, `privacy_mask`) from a local JSONL file."""
    p = regular_file(path, "source file", DatasetError)
    if p.suffix.lower() not in (".jsonl", ".json"):
        raise DatasetError(
            f"{path}: a privacy source file must be JSONL with source_text and privacy_mask "
            "(ai4privacy's format); use --source synthetic for generated text"
        )
    records = []
    for i, row in enumerate(_read_jsonl(p)):
        text = row.get("source_text", row.get("text"))
        if text and "privacy_mask" in row:
            records.append({"id": i, "source_text": str(text), "privacy_mask": row["privacy_mask"]})
    if not records:
        raise DatasetError(f"{path}: no records with source_text and privacy_mask")
    return records


# ---- the hub -----------------------------------------------------------------------------------
def _open_hub(hub: HubSource):
    """An iterable over the split's rows: streamed, or from the local cache in offline mode."""
    import datasets

    names = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    if any(os.environ.get(name, "").strip().upper() in _OFFLINE_VALUES for name in names):
        # `datasets` reads the offline switch at import; only then is a cache-only load safe from
        # touching the network.
        if not datasets.config.HF_HUB_OFFLINE:
            raise hub.unreachable("offline mode")
        try:
            return datasets.load_dataset(hub.repo, split=hub.split)
        except Exception as exc:  # not cached: any error means the same thing here
            raise hub.unreachable("offline mode, not in the local cache") from exc
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError

    try:  # a short request first, so a missing network fails in seconds, not retries
        HfApi().dataset_info(hub.repo, timeout=10)
    except RepositoryNotFoundError as exc:
        raise DatasetError(f"dataset {hub.repo} not found on the Hugging Face hub") from exc
    except Exception as exc:
        raise hub.unreachable(first_line(exc)) from exc
    return datasets.load_dataset(hub.repo, split=hub.split, streaming=True)


def read_hub_rows(hub: HubSource, limit: int, *, english_only: bool = False) -> list[dict]:
    """Up to `limit` rows of a hub split in its own order; each gets its stream index as `id`."""
    rows: list[dict] = []
    log.info("streaming up to %d rows of %s [%s]", limit, hub.repo, hub.split)
    try:
        for index, row in enumerate(_open_hub(hub)):
            if english_only and row.get("language", "en") != "en":
                continue
            rows.append({**row, "id": index})
            if len(rows) >= limit:
                break
    except DatasetError:
        raise
    except Exception as exc:  # the stream broke off: network errors come in many types
        raise hub.unreachable(first_line(exc)) from exc
    if not rows:
        raise DatasetError(f"no rows in {hub.repo} [{hub.split}]")
    return rows


def read_hub_documents(hub: HubSource, limit: int) -> list[Document]:
    """Documents from a hub split: `hub.field`, or the row's first string column."""
    docs = []
    for row in read_hub_rows(hub, limit):
        text = row.get(hub.field) if hub.field else None
        if not isinstance(text, str):
            text = next((v for k, v in row.items() if k != "id" and isinstance(v, str)), "")
        if text.strip():
            docs.append(Document(row["id"], text))
    return docs
