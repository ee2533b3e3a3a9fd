"""The result schema: one Parquet row per inverted target, shared by `invert --out`, sweeps,
tuning trials and reports.

Schema version 3 (`SCHEMA_VERSION`, also stored in each file's metadata). Columns:

| column | type | meaning |
|---|---|---|
| schema_version | int16 | this schema's version |
| sweep, job, config_hash | string | where the row came from (empty outside sweeps/tuning) |
| model | string | model id or path (as given; `model_revision` says which weights) |
| model_name | string | the model's label (a sweep entry's `name`; default: the id's last part) |
| model_parameters, vocab_size | int64 | model size, for scaling plots |
| model_layers, model_width | int32, int64 | blocks and embedding width (null in older files) |
| dataset | string | dataset name (`random`, `nl-id`, `nl-ood`, `privacy`, or a label) |
| dataset_hash | string | the dataset file's content hash, `sodaray.dataset.hash` (null: no file) |
| dataset_seed | int64 | the seed the dataset was built with (null: unknown, or not built) |
| dataset_source | string | where its rows came from: `hf:…`, `file:…`, `synthetic (faker …)` |
| shard | int32 | the shard's index in its sweep job (null outside sweeps) |
| sample_id | int64 | the sample's id in its dataset |
| length | int32 | true input length (null when unknown) |
| algorithm | string | `soda`, `gcg`, `embedding` |
| objective | string | `logits` or `text` |
| top_k | int32 | observed top-k logits (null: all) |
| space | string | where logits were compared: `raw`, `centred`, `logprobs` (null in v1 files) |
| confirm | string | `both`: a centred or logprobs match held to the raw logits too; `space`: not |
|  |  | (null: raw logits, text, or files from before it) |
| output_tokens | int32 | observed output positions |
| loss | string | `huber` or `mse` |
| fluency_weight | float64 | fluency penalty weight (0: off) |
| text_loss | string | text objective's form, `logprob` or `prob` (null: logits) |
| fluency_form | string | fluency penalty's form, `argmax` or `relaxed` (null: off) |
| seed, max_steps | int64 | the search's seed and step budget |
| params | string | the algorithm's parameters as JSON (seed aside) |
| true_tokens, tokens | list<int64> | true input (null when unknown) and recovered input |
| true_text, text | string | their decoded text (null without a tokenizer / true input) |
| pii_labels | list<string> | PII label per true token, null items for non-PII tokens |
| found | bool | the recovered input reproduces the observed output |
| exact | bool | the recovered input equals the true input (null when unknown) |
| steps | int64 | search steps taken (summed over tried lengths) |
| seconds | float64 | wall-clock seconds in the batch |
| final_loss | float64 | relaxed loss at the last step |
| predicted_length | int32 | length of the recovered input |
| length_mode | string | `fixed` (true length), `assumed` (length given) or `auto` (1..N tried) |
| lengths_tried | list<int32> | lengths searched, in order |
| device | string | torch device the search ran on |
| host | string | the machine the search ran on (its host name) |
| finished_at | timestamp[us, UTC] | when the rows' batch (shard, trial, `invert` call) finished |
| model_revision | string | hub commit, else `sha256:` + 16 hex of local files (null: in memory) |
| versions | string | JSON of package versions (sodaray, torch, transformers, ...) |
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
import pyarrow.parquet as pq

from sodaray.errors import first_line
from sodaray.io.files import what_is
from sodaray.io.writes import OutputFolder
from sodaray.search.engine.base import InversionResult

log = logging.getLogger(__name__)

# 2: the `space` column. New nullable columns (model_layers, model_width, text_loss,
# fluency_form) keep the version: older files read back with them null.
# 3: what cross-job queries need (dataset_hash, dataset_seed, shard, host, finished_at,
# model_revision), and the layout that makes every `*.parquet` under a results folder a file
# of this schema (job metadata and dataset copies under a hidden `.sodaray/`, no `=` in job
# folder names), so pandas, pyarrow, DuckDB and `datasets` read a folder as these rows alone.
# Older files still read back here, with the new columns null (dataset_source, added later,
# keeps the version as the nullable columns of 2 did).
SCHEMA_VERSION = 3
VERSION_KEY = b"sodaray.results.version"
# A sweep's folder: a folder of rows per job, and beside them, hidden (readers skip it), each
# job's settings as written when it was planned: META_DIR/jobs/<job>/JOB_FILE.
META_DIR = ".sodaray"
JOB_FILE = "job.json"

RESULT_SCHEMA = pa.schema(
    [
        ("schema_version", pa.int16()),
        ("sweep", pa.string()),
        ("job", pa.string()),
        ("config_hash", pa.string()),
        ("model", pa.string()),
        ("model_name", pa.string()),
        ("model_parameters", pa.int64()),
        ("vocab_size", pa.int64()),
        ("model_layers", pa.int32()),
        ("model_width", pa.int64()),
        ("dataset", pa.string()),
        ("dataset_hash", pa.string()),
        ("dataset_seed", pa.int64()),
        ("dataset_source", pa.string()),
        ("shard", pa.int32()),
        ("sample_id", pa.int64()),
        ("length", pa.int32()),
        ("algorithm", pa.string()),
        ("objective", pa.string()),
        ("top_k", pa.int32()),
        ("space", pa.string()),
        ("confirm", pa.string()),
        ("output_tokens", pa.int32()),
        ("loss", pa.string()),
        ("fluency_weight", pa.float64()),
        ("text_loss", pa.string()),
        ("fluency_form", pa.string()),
        ("seed", pa.int64()),
        ("max_steps", pa.int64()),
        ("params", pa.string()),
        ("true_tokens", pa.list_(pa.int64())),
        ("tokens", pa.list_(pa.int64())),
        ("true_text", pa.string()),
        ("text", pa.string()),
        ("pii_labels", pa.list_(pa.string())),
        ("found", pa.bool_()),
        ("exact", pa.bool_()),
        ("steps", pa.int64()),
        ("seconds", pa.float64()),
        ("final_loss", pa.float64()),
        ("predicted_length", pa.int32()),
        ("length_mode", pa.string()),
        ("lengths_tried", pa.list_(pa.int32())),
        ("device", pa.string()),
        ("host", pa.string()),
        ("finished_at", pa.timestamp("us", tz="UTC")),
        ("model_revision", pa.string()),
        ("versions", pa.string()),
    ],
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
    versions = package_versions()
    # The batch's end, once for all its rows: rows are made as their shard or trial finishes.
    finished_at = datetime.now(timezone.utc)
    host = socket.gethostname()
    rows = []
    for i, r in enumerate(results):
        params = dict(r.params)
        true_text = true_texts[i] if true_texts is not None else None
        rows.append(
            {
                "schema_version": SCHEMA_VERSION,
                "sweep": context.sweep,
                "job": context.job,
                "config_hash": context.config_hash,
                "model": context.model,
                "model_name": context.model_name or model_label(context.model),
                "model_parameters": context.model_parameters,
                "vocab_size": context.vocab_size,
                "model_layers": context.model_layers,
                "model_width": context.model_width,
                "dataset": context.dataset,
                "dataset_hash": context.dataset_hash,
                "dataset_seed": context.dataset_seed,
                "dataset_source": context.dataset_source,
                "shard": context.shard,
                "sample_id": r.sample_id,
                "length": None if r.true_tokens is None else len(r.true_tokens),
                "algorithm": r.algorithm,
                "objective": obj.kind,
                "top_k": obj.top_k,
                "space": obj.space,
                "confirm": obj.confirm if obj.confirm_applies else None,
                "output_tokens": obj.output_tokens,
                "loss": obj.loss,
                "fluency_weight": float(obj.fluency_weight),
                # Null where the option played no part (and in files from before it).
                "text_loss": obj.text_loss if obj.kind == "text" else None,
                "fluency_form": obj.fluency_form if obj.fluency_weight > 0 else None,
                "seed": r.seed,
                "max_steps": params.get("max_steps"),
                "params": json.dumps(params, sort_keys=True, default=str),
                "true_tokens": r.true_tokens,
                "tokens": r.tokens,
                "true_text": true_text,
                "text": r.text,
                "pii_labels": None if pii_labels is None else pii_labels[i],
                "found": r.found,
                "exact": r.exact,
                "steps": r.steps,
                "seconds": r.seconds,
                "final_loss": r.final_loss,
                "predicted_length": r.predicted_length,
                "length_mode": context.length_mode,
                "lengths_tried": r.lengths_tried,
                "device": context.device,
                "host": host,
                "finished_at": finished_at,
                "model_revision": context.model_revision,
                "versions": versions,
            }
        )
    return pa.Table.from_pylist(rows, schema=RESULT_SCHEMA)


def write_table_atomic(table: pa.Table, path: str | Path, out: OutputFolder | None = None) -> Path:
    """Write Parquet by the rule for every file sodaray writes (`writes.write_file`: a
    temporary file in the same folder, then a rename; never through a link or over anything
    but a regular file): a reader (or a resumed sweep) never sees a partial file. `out`: the
    folder the user gave, below which nothing may be a link (default: the file's folder)."""
    path = Path(path)
    (OutputFolder(path.parent) if out is None else out).write(
        path, lambda f: pq.write_table(table, f)
    )
    return path


def result_files(paths: str | Path | Iterable[str | Path]) -> list[Path]:
    """Parquet files under the given files/folders (temporary and hidden files skipped)."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    files: list[Path] = []
    for p in map(Path, paths):
        kind = what_is(p)
        if kind == "a directory":
            for f in sorted(p.rglob("*.parquet")):
                if any(part.startswith(".") for part in f.relative_to(p).parts):
                    continue
                inner = what_is(f)
                if inner == "a regular file":
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
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    where = ", ".join(map(str, paths))
    files = result_files(paths)
    if not files:
        raise ResultsError(f"no result files (*.parquet) in {where}")
    named = {Path(p) for p in paths if Path(p).is_file()}
    tables = []
    for f in files:
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
        lacking = [c for c in CORE_COLUMNS if c not in schema.names]
        if lacking:  # every version has them: a file without is not result rows
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
    """Refuse rows of the file `path` that break what every row written says: `found` is
    true or false and `steps` a count (0 or more). A rate over such rows would count what no
    search did; the error names the file and the first such row. (`exact` true with `found`
    false is a result, not damage: a true input the match check turned down, which the
    project's checks count as exact-not-found.)"""
    import pyarrow.compute as pc

    checks = (
        (pc.is_null(table["found"]), "`found` is null (every row says whether it was found)"),
        (pc.is_null(table["steps"]), "`steps` is null (every row says how many steps it took)"),
        (
            pc.fill_null(pc.less(table["steps"], 0), False),
            "`steps` is negative (a search takes 0 steps or more)",
        ),
    )
    for bad, what in checks:
        count = pc.sum(bad).as_py() or 0
        if count:
            first = table.filter(bad).slice(0, 1).to_pylist()[0]
            rows = "row" if count == 1 else "rows"
            raise ResultsError(
                f"{path}: {count} {rows} where {what}; the first: sample {first['sample_id']}"
            )


def check_unique(table: pa.Table, where: str) -> None:
    """Refuse rows that say the same thing twice (a file read twice, copies of one folder):
    every rate would count them twice."""
    import pyarrow.compute as pc

    job = table["job"]
    has_job = pc.fill_null(pc.not_equal(job, ""), False)
    keys = table.select(list(ROW_KEY[:4]))
    for name in ROW_KEY[4:]:  # only for rows no job names
        column = table[name]
        keys = keys.append_column(
            name, pc.if_else(has_job, pa.nulls(len(table), column.type), column)
        )
    names = keys.column_names
    counts = keys.group_by(names).aggregate([([], "count_all")])
    repeated = counts.filter(pc.greater(counts["count_all"], 1))
    if len(repeated):
        row = repeated.slice(0, 1).to_pylist()[0]
        job = row["job"] or "an `invert` run"
        raise ResultsError(
            f"the rows in {where} repeat: sample {row['sample_id']} of {job} (seed "
            f"{row['seed']}) is there {row['count_all']} times (the same file given twice, or a "
            "copy of a results folder inside another?)"
        )
