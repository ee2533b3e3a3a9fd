"""A sweep's results folder: where each of its files lies, and which shard files and kept rows
are trusted.

Layout: `OUT/<sweep>/<job>/shard-NNNNN.parquet`, one per finished shard, written atomically by
the driver, and nothing else: every `*.parquet` under OUT is a file of result rows in one
schema, so pandas, pyarrow, DuckDB and `datasets` read OUT as the rows alone. The rest lives in
the hidden `OUT/<sweep>/.sodaray/` (readers skip hidden folders, and its files do not end in
`.parquet`, which DuckDB's `**` glob would match even there): `jobs/<job>/job.json` (the job's
settings, shard count), `job.lock`, `shard-NNNNN.error.json`, `shard-NNNNN.kept.pq` (the rows of
an unfinished shard's searches that had ended when its driver stopped) and set-aside
`shard-NNNNN.parquet.corrupt` files, and `datasets/*.pq`, the datasets built for the sweep. Job
folder names hold no `=`, which readers would take for a hive partition column.

Resume is "compute every shard without a valid result file": a shard file is trusted only when
it is a regular file that reads whole as the result schema, with exactly the shard's sample ids,
the job's `config_hash` and its dataset's content hash in its rows (a shard copied from another
job of the same dataset has the same ids; one computed on a dataset cache another build replaced
has another dataset hash); any other is moved aside (`.corrupt`, or `.foreign` for another job's
or dataset's rows) and computed again. A pending shard's kept rows are trusted on the same terms
(this job's, ids of the shard's samples, each once, in this sodaray's schema) and only its other
samples are searched again (a SODA search's result depends on its seed and sample id alone).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sodaray.errors import first_line
from sodaray.io.files import what_is
from sodaray.io.paths import inside
from sodaray.io.writes import REGULAR, OutputFolder
from sodaray.results import META_DIR, RESULT_SCHEMA, VERSION_KEY

log = logging.getLogger(__name__)


def found_exact(table: pa.Table) -> tuple[int, int]:
    """Counts of found and exact rows (unknown exact counts as not exact)."""
    found = int(pc.sum(table["found"]).as_py() or 0)
    exact = int(pc.sum(table["exact"].fill_null(False)).as_py() or 0)
    return found, exact


def shard_path(folder: Path, index: int) -> Path:
    return folder / f"shard-{index:05d}.parquet"


def meta_folder(root: Path, job: str) -> Path:
    """Where a job's settings, lock, errors and set-aside shards live (`root`: the sweep's)."""
    return inside(root, META_DIR, "jobs", job)


def error_path(meta: Path, index: int) -> Path:
    return meta / f"shard-{index:05d}.error.json"


def kept_path(meta: Path, index: int) -> Path:
    return meta / f"shard-{index:05d}.kept.pq"


def read_shard(
    path: Path,
    sample_ids: list[int] | None = None,
    rows: int | None = None,
    config_hash: str | None = None,
    dataset_hash: str | None = None,
) -> tuple[pa.Table | None, str | None]:
    """A shard file's rows and None, or None and why they cannot be trusted. It must be a
    regular file that reads whole (every column: a page corrupt anywhere breaks `report`)
    as Parquet in the result schema, hold exactly `sample_ids` (when given), or `rows` rows
    (else at least one), and be this job's (`config_hash`, when given): a shard copied from
    another job of the same dataset has the same sample ids and another job's results. With
    `dataset_hash`, its rows must have been searched on that dataset (rows that name none, as
    `invert` writes them, pass): a dataset cache replaced by another build has the same ids."""
    kind = what_is(path)
    if kind != REGULAR:
        return None, f"{kind or 'nothing'}, not a shard file"
    try:
        schema = pq.read_schema(path)
        if VERSION_KEY not in (schema.metadata or {}):
            return None, "not a sodaray result file"
        table = pq.read_table(path)
    except (OSError, pa.ArrowException, KeyError) as exc:
        return None, f"unreadable ({first_line(exc)})"
    if "sample_id" not in table.column_names or "found" not in table.column_names:
        return None, "not a sodaray result file (no sample_id or found column)"
    if config_hash is not None:
        if "config_hash" not in table.column_names:
            return None, "its rows name no job (no config_hash column)"
        foreign = [h for h in set(table["config_hash"].to_pylist()) if h != config_hash]
        if foreign:
            jobs = set(table["job"].to_pylist()) if "job" in table.column_names else {"?"}
            name = sorted(map(str, jobs))[0][:160]  # read from a file: bounded
            return None, (
                f"rows of another job ({name}, config hash {str(foreign[0])[:40]}), "
                f"not this job's ({config_hash})"
            )
    if dataset_hash and "dataset_hash" in table.column_names:
        other = [h for h in set(table["dataset_hash"].to_pylist()) if h and h != dataset_hash]
        if other:
            return None, (
                f"rows of another dataset (hash {str(other[0])[:16]}), not this job's "
                f"({dataset_hash[:16]}): the dataset changed since they were searched"
            )
    ids = table["sample_id"].to_pylist()
    if sample_ids is None:
        expected = 1 if rows is None else rows
        ok = len(ids) >= 1 if rows is None else len(ids) == rows
        return (table, None) if ok else (None, f"{len(ids)} rows where the shard has {expected}")
    if sorted(ids) != sorted(sample_ids):
        return None, f"{len(ids)} rows where the shard has {len(sample_ids)} samples (or other ids)"
    return table, None


def read_kept(
    path: Path, sample_ids: list[int], config_hash: str, dataset_hash: str | None = None
) -> tuple[pa.Table | None, str | None]:
    """A pending shard's kept rows and None, or None and why they cannot be trusted: a shard
    file's checks (`read_shard`), of this job and dataset, at most one row for each of
    `sample_ids` (the shard's) and none of another sample."""
    kind = what_is(path)  # before Parquet opens it: a FIFO or a device is never read
    if kind != REGULAR:
        return None, f"{kind or 'nothing'}, not a file of kept rows"
    try:  # its footer, before reading it whole
        footer = pq.read_metadata(path)
        schema = footer.schema.to_arrow_schema()
    except (OSError, pa.ArrowException) as exc:
        return None, f"unreadable ({first_line(exc)})"
    if footer.num_rows > len(sample_ids):
        return None, f"{footer.num_rows} rows where the shard has {len(sample_ids)} samples"
    # This sodaray wrote them, in its schema: rows of another would not join a run's.
    if not schema.remove_metadata().equals(RESULT_SCHEMA):
        return None, "not in this sodaray's result schema"
    table, why = read_shard(path, config_hash=config_hash, dataset_hash=dataset_hash)
    if table is None:
        return None, why
    ids = table["sample_id"].to_pylist()
    if len(set(ids)) != len(ids) or not set(ids) <= set(sample_ids):
        return None, f"{len(ids)} rows not each of another of the shard's {len(sample_ids)} samples"
    return table, None


def pending_kept(
    meta: Path, index: int, sample_ids: list[int], config_hash: str, dataset_hash: str | None
) -> tuple[pa.Table | None, str | None]:
    """Shard `index`'s kept rows, as the next run takes them: (rows, None) when trusted,
    (None, why) when there is a kept file it would set aside, (None, None) when there is none.
    Planning and `sweep status` both ask here, so status counts what the run keeps."""
    path = kept_path(meta, index)
    if not path.exists() and not path.is_symlink():
        return None, None
    return read_kept(path, sample_ids, config_hash, dataset_hash)


def set_aside(path: Path, why: str, meta: Path, out: OutputFolder) -> Path:
    """Move an untrusted file into `meta`, kept for inspection and never read, as NAME.foreign
    when `why` says it holds another job's or dataset's rows, else NAME.corrupt. `out`: the
    output folder (by the rule for writes, nothing below it is a link)."""
    suffix = ".foreign" if why.startswith("rows of another") else ".corrupt"
    target = meta / (path.name + suffix)
    out.move(path, target)
    log.warning("%s: %s; moved to %s, computing it again", path, why, target)
    return target


def id_ranges(ids: list[int]) -> list[list[int]]:
    """Sorted sample ids as `[start, stop)` runs: a job's samples in a few numbers (its
    dataset's ids run 0..N-1, a job takes runs of them per length)."""
    runs: list[list[int]] = []
    for i in ids:
        if runs and runs[-1][1] == i:
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1])
    return runs


def ids_between(runs: list[list[int]], lo: int, hi: int) -> list[int]:
    """The `[lo, hi)`-th of the ids that `runs` (`id_ranges`) hold: a shard's, without making
    every id of the job (a job file may claim billions)."""
    out: list[int] = []
    seen = 0
    for start, stop in runs:
        if seen + (stop - start) > lo and seen < hi:
            first = start + max(lo - seen, 0)
            out.extend(range(first, min(stop, start + hi - seen)))
        seen += stop - start
        if seen >= hi:
            break
    return out
