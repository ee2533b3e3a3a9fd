"""The result schema: one Parquet row per inverted target, shared by `invert --out`, sweeps,
tuning trials and reports.

Schema version 3 (`SCHEMA_VERSION`, also stored in each file's metadata); docs/results.md
says what each column holds.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import platform
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sodaray.errors import first_line
from sodaray.io.files import what_is
from sodaray.io.writes import OutputFolder
from sodaray.search.engine.base import InversionResult

log = logging.getLogger(__name__)

# 2 added `space`; 3 what cross-job queries need (dataset_hash to model_revision) and the layout
# in which every `*.parquet` under a results folder is a file of this schema (job metadata and
# dataset copies under a hidden `.sodaray/`). New nullable columns keep the version: older files
# read back with them null.
SCHEMA_VERSION = 3
VERSION_KEY = b"sodaray.results.version"
# A sweep's folder: a folder of rows per job, and beside them, hidden (readers skip it), each
# job's settings as written when it was planned: META_DIR/jobs/<job>/JOB_FILE.
META_DIR = ".sodaray"
JOB_FILE = "job.json"

# The columns in order, `name:type` (`list<...>` a list; `timestamp` in microseconds, UTC).
_COLUMNS = """
schema_version:int16 sweep:string job:string config_hash:string model:string model_name:string
model_parameters:int64 vocab_size:int64 model_layers:int32 model_width:int64 dataset:string
dataset_hash:string dataset_seed:int64 dataset_source:string shard:int32 sample_id:int64
length:int32 algorithm:string objective:string top_k:int32 space:string confirm:string
output_tokens:int32 loss:string fluency_weight:float64 text_loss:string fluency_form:string
seed:int64 max_steps:int64 params:string true_tokens:list<int64> tokens:list<int64>
true_text:string text:string pii_labels:list<string> found:bool exact:bool steps:int64
seconds:float64 final_loss:float64 predicted_length:int32 length_mode:string
lengths_tried:list<int32> device:string host:string finished_at:timestamp model_revision:string
versions:string
"""


def _arrow_type(name: str) -> pa.DataType:
    if name.startswith("list<"):
        return pa.list_(_arrow_type(name[5:-1]))
    return pa.timestamp("us", tz="UTC") if name == "timestamp" else pa.type_for_alias(name)


RESULT_SCHEMA = pa.schema(
    [(c.split(":")[0], _arrow_type(c.split(":")[1])) for c in _COLUMNS.split()],
    metadata={VERSION_KEY: str(SCHEMA_VERSION).encode()},
)


class ResultsError(ValueError):
    """Result files that cannot be read as sodaray results (missing, empty, wrong schema)."""


@dataclass
class RunContext:
    """What a row needs beyond the `InversionResult`: the model, data and objective it ran on."""

    model: str
    objective: Any  # sodaray.objective.objectives.Objective
    model_parameters: int | None = None
    vocab_size: int | None = None
    model_layers: int | None = None
    model_width: int | None = None
    dataset: str = ""
    length_mode: str = "fixed"
    sweep: str = ""
    job: str = ""
    config_hash: str = ""
    device: str = ""
    model_name: str = ""  # label in reports (default: the model id's last part)
    model_revision: str | None = None  # `sodaray.model.load.model_revision`
    dataset_hash: str | None = None  # the dataset file's `sodaray.dataset.hash`
    dataset_seed: int | None = None
    dataset_source: str | None = None  # the dataset's `info.source`: hub, file or synthetic
    shard: int | None = None  # the shard's index in its sweep job

    @classmethod
    def for_model(cls, model: Any, objective: Any, **kwargs: Any) -> RunContext:
        """Context from a `LoadedModel`."""
        from sodaray.model.load import model_revision

        return cls(
            model=model.name,
            objective=objective,
            model_parameters=model.num_parameters,
            vocab_size=model.vocab_size,
            model_layers=model.num_layers,
            model_width=model.width,
            device=str(model.device),
            model_revision=model_revision(model),
            **kwargs,
        )


@functools.cache
def package_versions() -> str:
    """JSON of the versions that decide a result (recorded in every row)."""
    versions = {"python": platform.python_version()}
    for name in ("sodaray", "torch", "transformers", "ray", "optuna"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return json.dumps(versions, sort_keys=True)


def config_hash(config: dict[str, Any]) -> str:
    """A short, stable hash of a JSON-able configuration (canonical key order)."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def model_label(model: str | None) -> str:
    """A model id's short name: the last part of a hub id or path, without `.gguf`."""
    return Path(str(model or "").rstrip("/")).name.removesuffix(".gguf")


# Columns copied as they are from the `RunContext` and from each `InversionResult`.
_CONTEXT_COLUMNS = (
    *("sweep", "job", "config_hash", "model", "model_parameters", "vocab_size", "model_layers"),
    *("model_width", "dataset", "dataset_hash", "dataset_seed", "dataset_source", "shard"),
    *("length_mode", "device", "model_revision"),
)
_RESULT_COLUMNS = (
    *("sample_id", "algorithm", "seed", "true_tokens", "tokens", "text", "found", "exact"),
    *("steps", "seconds", "final_loss", "predicted_length", "lengths_tried"),
)


def result_rows(
    results: Sequence[InversionResult],
    context: RunContext,
    *,
    true_texts: Sequence[str | None] | None = None,
    pii_labels: Sequence[Sequence[str | None] | None] | None = None,
) -> pa.Table:
    """The result schema's rows for `results` (in order). `true_texts` and `pii_labels` align
    with `results` and come from the dataset when it has them."""
    obj = context.objective
    shared = {name: getattr(context, name) for name in _CONTEXT_COLUMNS}
    shared.update(
        schema_version=SCHEMA_VERSION,
        model_name=context.model_name or model_label(context.model),
        **{name: getattr(obj, name) for name in ("top_k", "space", "output_tokens", "loss")},
        objective=obj.kind,
        confirm=obj.confirm if obj.confirm_applies else None,
        fluency_weight=float(obj.fluency_weight),
        # Null where the option played no part (and in files from before it).
        text_loss=obj.text_loss if obj.kind == "text" else None,
        fluency_form=obj.fluency_form if obj.fluency_weight > 0 else None,
        versions=package_versions(),
        # The batch's end, once for all its rows: rows are made as their shard or trial finishes.
        finished_at=datetime.now(timezone.utc),
        host=socket.gethostname(),
    )
    rows = [
        {
            **shared,
            **{name: getattr(r, name) for name in _RESULT_COLUMNS},
            "length": None if r.true_tokens is None else len(r.true_tokens),
            "max_steps": dict(r.params).get("max_steps"),
            "params": json.dumps(dict(r.params), sort_keys=True, default=str),
            "true_text": None if true_texts is None else true_texts[i],
            "pii_labels": None if pii_labels is None else pii_labels[i],
        }
        for i, r in enumerate(results)
    ]
    return pa.Table.from_pylist(rows, schema=RESULT_SCHEMA)


def write_table_atomic(table: pa.Table, path: str | Path, out: OutputFolder | None = None) -> Path:
    """Write Parquet by the rule for every file sodaray writes (`writes.write_file`): a reader
    never sees a partial file. `out`: the folder the user gave (default: the file's folder)."""
    path = Path(path)
    (OutputFolder(path.parent) if out is None else out).write(
        path, lambda f: pq.write_table(table, f)
    )
    return path


def listed(paths: str | Path | Iterable[str | Path]) -> list[Path]:
    """`paths` (one path or several) as a list."""
    return [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]


def result_files(paths: str | Path | Iterable[str | Path]) -> list[Path]:
    """Parquet files under the given files/folders (temporary and hidden files skipped)."""
    files: list[Path] = []
    for p in listed(paths):
        if (kind := what_is(p)) == "a directory":
            for f in sorted(p.rglob("*.parquet")):
                if any(part.startswith(".") for part in f.relative_to(p).parts):
                    continue
                if (inner := what_is(f)) == "a regular file":
                    files.append(f)
                elif inner != "a directory":  # a folder's own files are found inside it
                    # A FIFO or device would block the reader: named, passed over.
                    log.warning("skipped %s: %s, not a result file", f, inner or "nothing")
        elif kind == "a regular file":
            files.append(p)
        elif kind is None:
            raise ResultsError(f"no such result file or folder: {p}")
        else:
            raise ResultsError(f"{p} is {kind}, not a result file or folder")
    return files


def _unreadable(path: Path, named: bool, what: str, exc: BaseException) -> None:
    """A result file pyarrow cannot read: an error when the caller named it, else a warning
    (the caller passes it over)."""
    if named:
        raise ResultsError(f"{path}: {what} ({first_line(exc)})") from exc
    log.warning("skipped %s: not a readable Parquet file (%s)", path, first_line(exc))


def read_results(paths: str | Path | Iterable[str | Path]) -> pa.Table:
    """All result rows under `paths` (files or folders), checked against the schema version.

    Files from a newer schema are refused; missing columns of older files come back null."""
    paths = listed(paths)
    where = ", ".join(map(str, paths))
    named = {p for p in paths if p.is_file()}
    tables = []
    for f in result_files(paths):
        try:
            schema = pq.read_schema(f)
        except (OSError, pa.ArrowException) as exc:
            # A shard cut short inside a results folder: the others still make a report, and
            # `sodaray sweep run` sets it aside and computes it again.
            _unreadable(f, f in named, "not a Parquet file", exc)
            continue
        version = (schema.metadata or {}).get(VERSION_KEY)
        if version is None and b"sodaray.dataset.version" in (schema.metadata or {}):
            continue  # a sweep's built dataset beside its results, not result rows
        if version is None:
            raise ResultsError(f"{f}: not a sodaray result file (no {VERSION_KEY.decode()})")
        if not version.isdigit():
            raise ResultsError(f"{f}: result schema version {version[:20]!r} is not a number")
        if int(version) > SCHEMA_VERSION:
            raise ResultsError(
                f"{f}: result schema version {int(version)} is newer than this sodaray's "
                f"({SCHEMA_VERSION}); upgrade sodaray"
            )
        # Every version has them: a file without is not result rows.
        if lacking := [c for c in CORE_COLUMNS if c not in schema.names]:
            raise ResultsError(f"{f}: lacks the column {lacking[0]} (every result file has it)")
        try:
            table = pq.read_table(f)
        except (OSError, pa.ArrowException) as exc:
            # A footer that reads and a page that does not (a corrupt, not truncated, file):
            # named, and in a folder passed over, so the good shards beside it still report.
            _unreadable(f, f in named, "not a readable Parquet file", exc)
            continue
        for field in RESULT_SCHEMA:  # older files: add the columns they lack as nulls
            if field.name not in table.column_names:
                table = table.append_column(field, pa.nulls(len(table), field.type))
        try:
            table = table.select(RESULT_SCHEMA.names).cast(RESULT_SCHEMA)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            wrong = [
                f"{n} is {table.schema.field(n).type}"
                for n in RESULT_SCHEMA.names
                if not table.schema.field(n).type.equals(RESULT_SCHEMA.field(n).type)
            ]
            raise ResultsError(
                f"{f}: columns of types the result schema does not have ({', '.join(wrong)})"
            ) from exc
        check_rows(table, f)
        tables.append(table)
    if not tables:
        raise ResultsError(f"no result files (*.parquet) in {where}")
    table = pa.concat_tables(tables)
    if len(table) == 0:
        raise ResultsError(f"the result files in {where} hold no rows")
    check_unique(table, where)
    return table


# In every schema version: a file without one of them is not result rows.
CORE_COLUMNS = ("sample_id", "found", "exact", "steps", "algorithm", "tokens")
# What names one row: a sweep job's or trial's sample at a seed; rows outside sweeps (`invert
# --out`) by the call they came from (its model and the time it finished).
ROW_KEY = ("sweep", "job", "sample_id", "seed", "model", "finished_at")


def check_rows(table: pa.Table, path: Path) -> None:
    """Refuse rows of the file `path` whose `found` is null or `steps` not a count (a rate
    over them would count what no search did), naming the first. (`exact` true with `found`
    false is a result: a true input the match check turned down.)"""
    checks = (
        (pc.is_null(table["found"]), "`found` is null (every row says whether it was found)"),
        (pc.is_null(table["steps"]), "`steps` is null (every row says how many steps it took)"),
        (
            pc.fill_null(pc.less(table["steps"], 0), False),
            "`steps` is negative (a search takes 0 steps or more)",
        ),
    )
    for bad, what in checks:
        if count := pc.sum(bad).as_py() or 0:
            first = table.filter(bad).slice(0, 1).to_pylist()[0]
            rows = "row" if count == 1 else "rows"
            raise ResultsError(
                f"{path}: {count} {rows} where {what}; the first: sample {first['sample_id']}"
            )


def check_unique(table: pa.Table, where: str) -> None:
    """Refuse rows that say the same thing twice (a file read twice, copies of one folder):
    every rate would count them twice."""
    has_job = pc.fill_null(pc.not_equal(table["job"], ""), False)
    keys = table.select(list(ROW_KEY[:4]))
    for name in ROW_KEY[4:]:  # only for rows no job names
        nulls = pa.nulls(len(table), table[name].type)
        keys = keys.append_column(name, pc.if_else(has_job, nulls, table[name]))
    counts = keys.group_by(keys.column_names).aggregate([([], "count_all")])
    repeated = counts.filter(pc.greater(counts["count_all"], 1))
    if len(repeated):
        row = repeated.slice(0, 1).to_pylist()[0]
        job = row["job"] or "an `invert` run"
        raise ResultsError(
            f"the rows in {where} repeat: sample {row['sample_id']} of {job} (seed "
            f"{row['seed']}) is there {row['count_all']} times (the same file given twice, or a "
            "copy of a results folder inside another?)"
        )
