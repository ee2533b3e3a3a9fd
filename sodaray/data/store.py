"""The dataset file: a Parquet table with a fixed schema, a content hash and build metadata.

One row per sample, in `sample_id` order, with the columns of `SCHEMA` (their meaning: the table
in docs/datasets.md). Schema metadata (byte strings): `sodaray.dataset.version` ("1"),
`sodaray.dataset.args` (the build arguments as JSON), `sodaray.dataset.info` (JSON: the source
read, documents reused, ...) and `sodaray.dataset.hash`: the SHA-256 hex digest of the rows, each
written as the compact JSON list of its column values in schema order, followed by a newline. The
hash depends on the values only, not on the Parquet encoding; the file bytes are reproducible
too, for the same pyarrow version, since nothing time-dependent is written.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sodaray.data.tokenizer import DatasetError
from sodaray.io.files import parse_json, regular_file
from sodaray.io.writes import write_file

FORMAT_VERSION = "1"
VERSION_KEY = b"sodaray.dataset.version"
ARGS_KEY = b"sodaray.dataset.args"
INFO_KEY = b"sodaray.dataset.info"
HASH_KEY = b"sodaray.dataset.hash"
# The `source` of every dataset the `random` builder makes (whatever the sweep names it): the
# report pools such datasets with `random` (their inputs come from the seed and length alone).
RANDOM_SOURCE = "uniform random tokens"

SCHEMA = pa.schema(
    [
        pa.field("sample_id", pa.int64(), nullable=False),
        pa.field("dataset", pa.string(), nullable=False),
        pa.field("tokenizer", pa.string(), nullable=False),
        pa.field("vocab_size", pa.int64(), nullable=False),
        pa.field("length", pa.int32(), nullable=False),
        pa.field("tokens", pa.list_(pa.int64()), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        pa.field("pii_labels", pa.list_(pa.string())),
        pa.field("document_id", pa.int64()),
    ]
)
COLUMNS = tuple(SCHEMA.names)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def content_hash(table: pa.Table) -> str:
    """SHA-256 of the row values (see the module docstring), independent of file encoding."""
    digest = hashlib.sha256()
    columns = [table.column(name).to_pylist() for name in COLUMNS]
    for row in zip(*columns, strict=True):
        digest.update(_dumps(list(row)).encode("utf-8") + b"\n")
    return digest.hexdigest()


def make_table(rows: dict[str, list], args: dict[str, Any], info: dict[str, Any]) -> pa.Table:
    """The dataset table from column lists, with version, arguments, info and hash attached."""
    table = pa.Table.from_pydict(rows, schema=SCHEMA)
    meta = {VERSION_KEY: FORMAT_VERSION.encode(), ARGS_KEY: _dumps(args).encode("utf-8")}
    return _stamped(table.replace_schema_metadata({**meta, INFO_KEY: _dumps(info).encode("utf-8")}))


def _stamped(table: pa.Table) -> pa.Table:
    """`table` with the format version (unless set) and its rows' hash in its metadata."""
    metadata = dict(table.schema.metadata or {})
    metadata.setdefault(VERSION_KEY, FORMAT_VERSION.encode())
    metadata[HASH_KEY] = content_hash(table).encode()  # always matches the rows
    return table.replace_schema_metadata(metadata)


def dataset_hash(table: pa.Table) -> str:
    """The content hash recorded in the table's metadata."""
    return (table.schema.metadata or {}).get(HASH_KEY, b"").decode()


def dataset_metadata(table: pa.Table) -> dict[str, Any]:
    """The build arguments and info recorded in the table's metadata, decoded (each a JSON
    object, bounded as any JSON read)."""
    meta = table.schema.metadata or {}
    out: dict[str, Any] = {"version": meta.get(VERSION_KEY, b"").decode()}
    for name, key in (("args", ARGS_KEY), ("info", INFO_KEY)):
        out[name] = parse_json(meta.get(key, b"{}"), f"dataset metadata {key.decode()}")
        if not isinstance(out[name], dict):
            raise DatasetError(f"dataset metadata {key.decode()}: not a JSON object")
    return {**out, "hash": dataset_hash(table)}


def write_dataset(
    table: pa.Table, path: str | os.PathLike, base: str | os.PathLike | None = None
) -> Path:
    """Write by the rule for every file sodaray writes (`writes.write_file`: atomically, never
    through a link or over anything but a regular file), with fixed writer settings so that
    the same table gives the same bytes. `base`: the folder the user gave, below which
    nothing may be a link (default: the file's folder)."""
    out = Path(path)
    check_rows(table, f"the dataset for {out}")
    table = _stamped(table)
    settings = dict(compression="zstd", compression_level=3, use_dictionary=True, version="2.6")
    settings.update(write_statistics=True, row_group_size=1 << 20)
    parquet = functools.partial(pq.write_table, table, **settings)
    write_file(out.parent if base is None else base, out, parquet)
    return out


def read_dataset(path: str | os.PathLike, *, verify: bool = True) -> pa.Table:
    """Read a dataset file, checking its format version, columns and (with `verify`) hash."""
    p = regular_file(path, "dataset file", DatasetError)  # a FIFO would block the reader
    try:
        table = pq.read_table(p)
    except (pa.ArrowException, OSError) as exc:
        raise DatasetError(f"{path} is not a readable Parquet file: {exc}") from exc
    version = (table.schema.metadata or {}).get(VERSION_KEY)
    if version is None:
        raise DatasetError(f"{path} is not a sodaray dataset (no {VERSION_KEY.decode()})")
    if version.decode() != FORMAT_VERSION:
        raise DatasetError(
            f"{path} has dataset format version {version.decode()}; this sodaray reads "
            f"version {FORMAT_VERSION}"
        )
    missing = [c for c in COLUMNS if c not in table.column_names]
    if missing:
        raise DatasetError(f"{path} lacks the column(s) {', '.join(missing)}")
    table = table.select(list(COLUMNS)).replace_schema_metadata(table.schema.metadata)
    wrong = [f.name for f in SCHEMA if not table.schema.field(f.name).type.equals(f.type)]
    if wrong:
        kinds = ", ".join(
            f"{n} is {table.schema.field(n).type}, not {SCHEMA.field(n).type}" for n in wrong
        )
        raise DatasetError(f"{path}: columns of the wrong type ({kinds})")
    check_rows(table, str(path))
    if verify and content_hash(table) != dataset_hash(table):
        raise DatasetError(f"{path}: the rows do not match the recorded hash (file modified?)")
    return table


def check_rows(table: pa.Table, where: str) -> None:
    """A dataset's rows: at least one, and no sample id twice (a result row is named by its
    sample id: two samples with one id would write two rows that say the same thing); no
    null where the schema has none, no negative token id, and each `length` its row's number
    of tokens."""
    if not len(table):
        raise DatasetError(f"{where} holds no samples")
    for field in SCHEMA:
        if not field.nullable and table.column(field.name).null_count:
            raise DatasetError(f"{where}: {field.name} is null in a row; every row has one")
    tokens = table.column("tokens")
    lowest = pc.min(pc.list_flatten(tokens)).as_py()
    if lowest is not None and lowest < 0:
        raise DatasetError(f"{where}: token id {lowest} is negative")
    counts = pc.list_value_length(tokens)
    wrong = pc.not_equal(counts, pc.cast(table.column("length"), counts.type))
    if pc.any(wrong).as_py():
        i = pc.index(wrong, True).as_py()
        row = table.slice(i, 1).to_pylist()[0]
        raise DatasetError(
            f"{where}: sample_id {row['sample_id']} has length {row['length']} but "
            f"{len(row['tokens'])} tokens"
        )
    ids = table.column("sample_id")
    if pc.count_distinct(ids).as_py() != len(ids):
        repeated = next(v["values"] for v in pc.value_counts(ids).to_pylist() if v["counts"] > 1)
        raise DatasetError(f"{where}: sample_id {repeated} repeats")
