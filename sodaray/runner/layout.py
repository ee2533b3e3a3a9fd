"""A sweep's results folder: where each of its files lies, and which shard files and kept rows
are trusted.

Layout: `OUT/<sweep>/<job>/shard-NNNNN.parquet`, one per finished shard, written atomically, and
nothing else: every `*.parquet` under OUT is result rows in one schema, so readers (pandas,
pyarrow, DuckDB, `datasets`) read OUT as the rows alone. The rest lives in the hidden
`OUT/<sweep>/.sodaray/` (no file there ends in `.parquet`): `jobs/<job>/` holds `job.json`,
`job.lock`, `shard-NNNNN.error.json`, `shard-NNNNN.kept.pq` (an unfinished shard's ended
searches) and set-aside files; `datasets/*.pq` the datasets built for the sweep. Job folder
names hold no `=` (readers would take it for a hive partition column).

Resume is "compute every shard without a valid result file": a shard file is trusted only when
it reads whole as the result schema, with exactly the shard's sample ids, the job's
`config_hash` and its dataset's hash in its rows; any other is moved aside (`.corrupt`, or
`.foreign` for another job's or dataset's rows) and computed again. Kept rows are trusted on
the same terms, and only the shard's other samples are searched again.

A job's lock (`job.lock`: its driver's record, refreshed while it runs) lets one driver run a
job at a time: another skips the job, and breaks a lock that is not one (with a warning, never
obeyed) or whose owner is gone (`experiment.owner`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sodaray.errors import first_line
from sodaray.experiment.owner import me, owner_gone, record_problem
from sodaray.io.files import read_json, what_is
from sodaray.io.paths import inside
from sodaray.io.writes import LINK, REGULAR, OutputFolder
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
    regular file that reads whole as Parquet in the result schema, hold exactly `sample_ids`
    (when given), or `rows` rows (else at least one), be this job's (`config_hash`, when
    given) and, with `dataset_hash`, searched on that dataset (rows that name none pass)."""
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


def pending_kept(
    meta: Path, index: int, sample_ids: list[int], config_hash: str, dataset_hash: str | None
) -> tuple[pa.Table | None, str | None]:
    """Shard `index`'s kept rows, as the next run takes them: (rows, None) when trusted,
    (None, why) when there is a kept file it would set aside, (None, None) when there is none
    (planning and `sweep status` both ask here). Trusted: a shard file's checks, at most one
    row for each of `sample_ids` (the shard's) and no other."""
    path = kept_path(meta, index)
    if not path.exists() and not path.is_symlink():
        return None, None
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


def set_aside(path: Path, why: str, meta: Path, out: OutputFolder) -> Path:
    """Move an untrusted file into `meta`, kept for inspection and never read, as NAME.foreign
    when `why` says it holds another job's or dataset's rows, else NAME.corrupt."""
    suffix = ".foreign" if why.startswith("rows of another") else ".corrupt"
    target = meta / (path.name + suffix)
    out.move(path, target)
    log.warning("%s: %s; moved to %s, computing it again", path, why, target)
    return target


def id_ranges(ids: list[int]) -> list[list[int]]:
    """Sorted sample ids as `[start, stop)` runs: a job's samples in a few numbers."""
    runs: list[list[int]] = []
    for i in ids:
        if runs and runs[-1][1] == i:
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1])
    return runs


def ids_between(runs: list[list[int]], lo: int, hi: int) -> list[int]:
    """The `[lo, hi)`-th of the ids that `runs` hold: a shard's, without making every id of the
    job (a job file may claim billions)."""
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


# ---- job locks ---------------------------------------------------------------------------------
LOCK_FILE = "job.lock"


def _mine(owner: dict[str, Any]) -> bool:
    return owner["host"] == socket.gethostname() and owner["pid"] == os.getpid()


def lock_state(folder: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(its live owner, None) when another driver holds the job's lock; (None, why) when a lock
    is there to break; (None, None) when there is none or it is this process's own."""
    path = folder / LOCK_FILE
    if not path.exists() and not path.is_symlink():
        return None, None
    try:
        owner = read_json(path, "lock file")
        age = time.time() - path.stat().st_mtime
    except FileNotFoundError:  # released between the two looks
        return None, None
    except (OSError, ValueError) as exc:  # not a regular file, too large, not JSON
        return None, f"not a lock ({first_line(exc)})"
    problem = record_problem(owner)
    if problem is not None:
        return None, f"not a lock: {problem}"
    if _mine(owner):
        return None, None
    why = owner_gone(owner, age)
    return (None, why) if why is not None else (owner, None)


def acquire_lock(folder: Path, out: OutputFolder | None = None) -> dict[str, Any] | None:
    """Take the job's lock; returns the other live owner instead when there is one. The lock
    is written whole and linked into place only where nothing is: no reader sees it half
    written. `out`: the output folder, below which nothing may be a link (default: `folder`)."""
    out = OutputFolder(folder) if out is None else out
    path = folder / LOCK_FILE
    text = json.dumps(me()) + "\n"
    for _ in range(2):
        if out.write(path, text, exclusive=True):
            return None
        owner, why = lock_state(folder)
        if owner is not None:
            return owner
        if why is not None:  # else it is this process's own (or just released): taken again
            log.warning("breaking the lock %s: %s", path, why)
        if out.what_is_at(path) in (REGULAR, LINK, None):  # a link is removed itself
            out.remove(path)
        else:  # a folder, a FIFO, a device in its place: moved aside and kept, never deleted
            out.move(path, path.with_name(f"{LOCK_FILE}.{os.getpid()}.invalid"))
    return lock_state(folder)[0] or {"host": "?"}


def release_lock(folder: Path, out: OutputFolder | None = None) -> None:
    """Remove the job's lock if it is this process's own (`out`: as `acquire_lock`'s)."""
    path = folder / LOCK_FILE
    try:
        owner = read_json(path, "lock file")
    except (OSError, ValueError):
        return
    if record_problem(owner) is None and _mine(owner):
        (OutputFolder(folder) if out is None else out).remove(path)


def refresh_locks(folders: list[Path], out: OutputFolder | None = None) -> None:
    """Touch each held lock (a regular file only; `out`: as `acquire_lock`'s)."""
    for folder in folders:
        with contextlib.suppress(OSError, ValueError):
            (OutputFolder(folder) if out is None else out).touch(folder / LOCK_FILE)
