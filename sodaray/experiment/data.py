"""A dataset entry's rows: its file, or built once per model from its spec, then the samples a
job or a study uses."""

from __future__ import annotations

import logging
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from sodaray.errors import first_line, shown
from sodaray.experiment.spec import DatasetSpec, ModelSpec
from sodaray.io.paths import inside
from sodaray.io.writes import OutputFolder

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DatasetIdentity:
    """What names a dataset's rows in result rows: its content hash, build seed and source
    (None where its metadata lacks them). The source tells a report whether privacy rows are
    the paper's ai4privacy records or the synthetic offline fallback."""

    hash: str | None = None
    seed: int | None = None
    source: str | None = None

    def context(self, dataset: str, sweep: str, job: str) -> dict[str, Any]:
        """The context (`sodaray.results.RunContext` fields) of result rows made on these rows
        of `dataset` by `job` of `sweep` (a sweep's job name, its shard added by the caller; a
        study's trial or arm)."""
        own = {"dataset_hash": self.hash, "dataset_seed": self.seed, "dataset_source": self.source}
        return {"dataset": dataset, "sweep": sweep, "job": job, **own}


def dataset_identity(table: pa.Table) -> DatasetIdentity:
    from sodaray.data.store import dataset_hash, dataset_metadata

    meta = dataset_metadata(table)
    seed = meta["args"].get("seed")
    return DatasetIdentity(
        dataset_hash(table) or None, None if seed is None else int(seed), meta["info"].get("source")
    )


ROW_COLUMNS = ("sample_id", "length", "tokens", "text", "pii_labels")  # those a unit carries


def select_rows(
    table: pa.Table, samples_per_length: int | None, limit: int | None
) -> dict[str, list[Any]]:
    """The job's samples: the first `samples_per_length` of each length (dataset order), then
    at most `limit` in all, taken evenly across lengths so a quick look covers every length."""
    cols = [c for c in ROW_COLUMNS if c in table.column_names]
    records = sorted(table.select(cols).to_pylist(), key=lambda r: r["sample_id"])
    rank: Counter[int] = Counter()
    ranked = []
    for r in records:
        k = rank[r["length"]] = rank[r["length"]] + 1  # its place among its length's
        if samples_per_length is None or k <= samples_per_length:
            ranked.append((k, r))
    if limit is not None:
        ranked = sorted(ranked, key=lambda kr: (kr[0], kr[1]["length"]))[:limit]
    chosen = sorted((r for _, r in ranked), key=lambda r: r["sample_id"])
    return {c: [r[c] for r in chosen] for c in cols}


def dataset_lengths(spec: DatasetSpec) -> dict[int, int]:
    """Samples per length in a dataset entry, before any cap, without building it: from the
    build spec (the most it builds; hub and local sources may yield fewer), or counted in the
    dataset file (read and checked). What plans count (`sweep plan`, `tune --dry-run`)."""
    from sodaray.data.build import parse_lengths
    from sodaray.data.store import read_dataset

    if spec.build is not None:
        per_length = int(spec.build.get("per_length", 1))
        return {n: per_length for n in parse_lengths(str(spec.build.get("lengths", "1-10")))}
    assert spec.location is not None
    return dict(Counter(int(n) for n in read_dataset(spec.location).column("length").to_pylist()))


CACHE_KEY = b"sodaray.dataset.cache_key"  # what build a cached dataset is, in its metadata


def dataset_table(
    model: ModelSpec, spec: DatasetSpec, root: Path, out: OutputFolder | None = None
) -> pa.Table:
    """A dataset: its file, or built from the spec for `model`'s tokenizer once (cached
    under `root/.sodaray/datasets/`; `out`: the output folder `root` lies in, default its
    parent, below which the cache is never written, moved or replaced through a link). A
    cache is trusted on its content, not its name: it must read as a dataset whose rows match
    their hash and whose metadata names this build (`CACHE_KEY`); another (a file another
    seed's build put there, one cut short, one from a sodaray that recorded no key) is moved
    aside with a warning and built again."""
    from sodaray.data.store import read_dataset, write_dataset

    if spec.location is not None:
        return read_dataset(spec.location)
    from sodaray.results import config_hash

    build = dict(spec.build or {})
    key = config_hash({"model": model.weights(), "build": build, "name": spec.name})
    # A hidden folder, `*.pq`: result readers (and DuckDB's `**/*.parquet`) pass over the cache.
    path = inside(root, ".sodaray", "datasets", f"{model.label}-{spec.name}-{key[:8]}.pq")
    out = OutputFolder(Path(root).parent) if out is None else out
    if path.exists() or path.is_symlink():
        table, why = _cached(path, key)
        if table is not None:
            return table
        aside = path.with_name(f"{path.name}.{os.getpid()}.foreign")
        out.move(path, aside)  # the name itself, never through a link
        log.warning("%s: %s; moved to %s, building it again", path, why, aside.name)
    from sodaray.data.build import build_dataset

    log.info("building dataset %s for %s", spec.name, model.label)
    # A local model by its real path: the rows (and the content hash) name the tokenizer, and
    # the model named by another path must build the same rows.
    where = model.location
    table = build_dataset(
        os.path.realpath(where) if model.is_local() else where,
        build.get("dataset", spec.name),
        build.get("lengths"),
        build.get("per_length"),
        build.get("seed", 1),
        spec.source_location(),  # a source file by the rule for paths in files
        gguf_file=model.gguf_file,
        progress=False,
        vocab=build.get("vocab", "tokenizer"),
        records=build.get("records", "whole"),
    )
    meta = {**(table.schema.metadata or {}), CACHE_KEY: key.encode()}
    write_dataset(table.replace_schema_metadata(meta), path, out.base)
    return read_dataset(path)


def dataset_rows(
    model: ModelSpec,
    spec: DatasetSpec,
    root: Path,
    out: OutputFolder | None = None,
    samples_per_length: int | None = None,
    limit: int | None = None,
) -> tuple[dict[str, list[Any]], DatasetIdentity]:
    """The entry's rows for `model` (`dataset_table`, same arguments) as `select_rows` selects
    them, and the dataset's identity."""
    table = dataset_table(model, spec, root, out)
    identity = dataset_identity(table)
    return select_rows(table, samples_per_length, limit), identity


def _cached(path: Path, key: str) -> tuple[pa.Table | None, str]:
    """A cached dataset's rows when it is this build's (`CACHE_KEY`), else None and why not."""
    from sodaray.data.store import read_dataset

    try:
        table = read_dataset(path)
    except ValueError as exc:  # DatasetError: not a regular file, unreadable, rows changed
        return None, first_line(exc).removeprefix(f"{path}").lstrip(": ") or "unreadable"
    recorded = (table.schema.metadata or {}).get(CACHE_KEY, b"").decode(errors="replace")
    if recorded != key:
        built = "no build recorded" if not recorded else f"the build {shown(recorded, 16)}"
        return None, f"not this entry's build (it holds {built}, not {key[:16]})"
    return table, ""
