"""A sweep's results folder: its layout, the per-job locks, and which shards are still to run.

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
`sweep status` counts shards and kept rows by the same checks (`pending_kept`), from the sample
ids and dataset hash the job file records, so it says what the next run keeps. A driver
holds `.sodaray/jobs/<job>/job.lock` (its host, pid, boot id and process start time, refreshed
while it runs) for every job it runs; a second driver on the same folder skips those jobs, and
breaks a lock that is not a lock or whose owner is gone (same host: the pid is dead, another
process now, or from before a restart; another host: not renewed for
`experiment.owner.STALE_SECONDS`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sodaray.errors import first_line
from sodaray.experiment.data import DatasetIdentity, dataset_identity, dataset_table, select_rows
from sodaray.experiment.owner import describe_owner, me, owner_gone, record_problem
from sodaray.experiment.spec import places as job_places
from sodaray.io.files import read_json, what_is
from sodaray.io.paths import brief, inside
from sodaray.io.writes import (
    LINK,
    check_places,
    make_folder,
    move_file,
    remove_file,
    touch_file,
    what_is_at,
    write_file,
)
from sodaray.results import JOB_FILE, META_DIR, RESULT_SCHEMA, VERSION_KEY, write_table_atomic
from sodaray.runner.spec import Job

log = logging.getLogger(__name__)

REGULAR = "a regular file"  # `files.what_is` of one
LOCK_FILE = "job.lock"


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


def shard_problem(
    path: Path,
    sample_ids: list[int] | None = None,
    rows: int | None = None,
    config_hash: str | None = None,
    dataset_hash: str | None = None,
) -> str | None:
    """Why a shard file cannot be trusted, or None (see `read_shard`)."""
    return read_shard(path, sample_ids, rows, config_hash, dataset_hash)[1]


def read_shard(
    path: Path,
    sample_ids: list[int] | None = None,
    rows: int | None = None,
    config_hash: str | None = None,
    dataset_hash: str | None = None,
) -> tuple[pa.Table | None, str | None]:
    """A shard file's rows and None, or None and why they cannot be trusted. It must be a
    regular file that reads whole (every column: a page corrupt anywhere broke `report` later)
    as Parquet in the result schema, hold exactly `sample_ids` (when given), or `rows` rows
    (else at least one), and be this job's (`config_hash`, when given): a shard copied from
    another job of the same dataset has the same sample ids and another job's results. With
    `dataset_hash`, its rows must have been searched on that dataset (rows that name none, as
    `invert` writes them, pass): a dataset cache replaced by another build has the same ids."""
    kind = what_is(path)
    if kind != "a regular file":
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
    `plan_jobs` and `job_status` both ask here, so status counts what the run keeps."""
    path = kept_path(meta, index)
    if not path.exists() and not path.is_symlink():
        return None, None
    return read_kept(path, sample_ids, config_hash, dataset_hash)


def set_aside(
    path: Path, why: str, meta: Path, suffix: str = ".corrupt", base: Path | None = None
) -> Path:
    """Move an untrusted shard file to `meta/*.corrupt` (or `suffix`: `.foreign` for another
    job's rows), kept for inspection, never read. `base`: the output folder (by the rule for
    writes, nothing below it is a link; default: `meta`)."""
    target = meta / (path.name + suffix)
    move_file(meta if base is None else base, path, target)
    log.warning("%s: %s; moved to %s, computing it again", path, why, target)
    return target


# ---- per-job locks ------------------------------------------------------------------------------
# A lock holds its driver's record (`experiment.owner`): a lock whose driver is over is stale; so
# is a file that is not a lock at all (a JSON list, garbage): it is broken with a warning instead
# of being obeyed or ending the run in a traceback.
def lock_state(folder: Path) -> tuple[dict[str, Any] | None, str | None]:
    """A job's lock: (its live owner, None) when another driver holds it; (None, why) when a
    lock is there but stale or invalid (to break); (None, None) when there is none or it is
    this process's own."""
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
    if owner["host"] == socket.gethostname() and owner["pid"] == os.getpid():
        return None, None
    why = owner_gone(owner, age)
    return (None, why) if why is not None else (owner, None)


def lock_owner(folder: Path) -> dict[str, Any] | None:
    """The live owner of a job's lock (host, pid, ...), or None when unlocked or stale."""
    return lock_state(folder)[0]


def acquire_lock(folder: Path, base: Path | None = None) -> dict[str, Any] | None:
    """Take the job's lock; returns the other live owner instead when there is one. The lock
    is written whole and linked into place only where nothing is (`write_file`'s
    `exclusive`): no reader sees it half written, which it could not tell from garbage.
    `base`: the output folder, below which nothing may be a link (default: `folder`)."""
    base = folder if base is None else base
    path = folder / LOCK_FILE
    text = json.dumps(me()) + "\n"
    for _ in range(2):
        if write_file(base, path, text, exclusive=True):
            return None
        owner, why = lock_state(folder)
        if owner is not None:
            return owner
        if why is not None:  # else it is this process's own (or just released): taken again
            log.warning("breaking the lock %s: %s", path, why)
        if what_is_at(base, path) in (REGULAR, LINK, None):  # a link is removed itself
            remove_file(base, path)
        else:  # a folder, a FIFO, a device in its place: moved aside and kept, never deleted
            move_file(base, path, path.with_name(f"{LOCK_FILE}.{os.getpid()}.invalid"))
    return lock_owner(folder) or {"host": "?"}


def release_lock(folder: Path, base: Path | None = None) -> None:
    """Remove the job's lock if it is this process's own (`base`: as `acquire_lock`'s)."""
    path = folder / LOCK_FILE
    try:
        owner = read_json(path, "lock file")
    except (OSError, ValueError):
        return
    if (
        record_problem(owner) is None
        and owner["host"] == socket.gethostname()
        and owner["pid"] == os.getpid()
    ):
        remove_file(folder if base is None else base, path)


def refresh_locks(folders: list[Path], base: Path | None = None) -> None:
    """Touch each held lock (a regular file only: a link's target is never touched)."""
    for folder in folders:
        with contextlib.suppress(OSError, ValueError):
            touch_file(folder if base is None else base, folder / LOCK_FILE)


# ---- planning (no Ray) --------------------------------------------------------------------------
@dataclass
class JobPlan:
    job: Job
    folder: Path  # the shard files, and nothing else
    meta: Path  # job.json, the lock, errors and set-aside shards
    rows: dict[str, list[Any]]  # the selected samples' columns
    shards: int
    pending: list[int]
    locked_by: dict[str, Any] | None = None
    corrupt: list[str] = field(default_factory=list)
    identity: DatasetIdentity = DatasetIdentity()  # the dataset's, for the rows
    kept: dict[int, pa.Table] = field(default_factory=dict)  # pending shards' kept rows
    base: Path = Path()  # the output folder: nothing below it is written through a link
    # Rows of shards whose kept rows were whole: written as the shard file at planning.
    kept_whole: int = 0


def plan_jobs(
    jobs: list[Job],
    root: Path,
    *,
    lock: bool = False,
    overrides: list[str] | None = None,
    base: Path | None = None,
) -> list[JobPlan]:
    """Each job's folder, samples and pending shards. With `lock`, the job's lock is taken; a
    job another live driver holds comes back with no pending shards and `locked_by` set.
    `overrides`: the command line's KEY=VALUE, recorded in each job's `job.json`. `root`: the
    sweep's folder in `base`, the output folder the user gave (default: `root`'s parent),
    below which nothing is written through a link (`writes`)."""
    base = Path(root).parent if base is None else Path(base)
    plans: list[JobPlan] = []
    held: list[Path] = []
    earlier = EarlierJobs(Path(root))
    try:
        planned: set[str] = set()
        for job in jobs:
            plan = _plan_job(job, root, base, lock, overrides, held, earlier, planned)
            if plan is not None:
                plans.append(plan)
    except BaseException:
        # A job that cannot be planned (a link where its job.json goes) ends the run: the
        # locks taken so far are given back, not left for the next run to break.
        for meta in held:
            release_lock(meta, base)
        raise
    return plans


def _plan_job(
    job: Job,
    root: Path,
    base: Path,
    lock: bool,
    overrides: list[str] | None,
    held: list[Path],
    earlier: EarlierJobs | None = None,
    planned: set[str] | None = None,
) -> JobPlan | None:
    """One job's plan (`plan_jobs`), or None for a job `planned` holds already; the meta
    folder of a lock it takes is added to `held`. A job new to `root` that an earlier run
    wrote with its paths spelled otherwise (`EarlierJobs`) takes that run's name and hash."""
    table = dataset_table(job.model, job.dataset, root, base)
    identity = dataset_identity(table)
    if job.dataset.path is not None:  # its rows decide the results, not its path
        job = dataclasses.replace(job, dataset_hash=identity.hash or "")
    places = job_places(job.model, job.dataset)
    if earlier is not None and not os.path.lexists(meta_folder(root, job.name)):
        job = earlier.match(job, places)
    if planned is not None:
        if job.name in planned:  # two entries naming one model by two paths: one job
            return None
        planned.add(job.name)
    folder = inside(root, job.name)
    meta = meta_folder(root, job.name)
    rows = select_rows(table, job.samples_per_length, job.limit)
    n = len(rows["sample_id"])
    shards = (n + job.shard_size - 1) // job.shard_size
    make_folder(base, folder)
    make_folder(base, meta)
    info = {
        "sweep": job.sweep,
        "job": job.name,
        "config_hash": job.config_hash,
        "samples": n,
        "shards": shards,
        "shard_size": job.shard_size,
        # What `sweep status` checks shards and kept rows against, as a run does.
        "sample_ids": id_ranges(rows["sample_id"]),
        "dataset_hash": identity.hash,
        "config": job.config(),
        "overrides": list(overrides or []),
        # Where the model and a build's source lie, links resolved: a later run that names
        # them by another path finds this job by them (`EarlierJobs`). Not hashed.
        "places": places,
        # The family defaults a model entry without a preset got, and why (not hashed).
        "defaults": None if job.defaults is None else job.defaults.to_dict(),
    }
    if lock:
        owner = acquire_lock(meta, base)
        if owner is not None:
            log.warning("skipping %s: another driver runs it (%s)", job.name, describe_owner(owner))
            return JobPlan(job, folder, meta, rows, shards, [], owner, identity=identity, base=base)
        held.append(meta)
    write_file(base, meta / JOB_FILE, json.dumps(info, indent=2, default=str) + "\n")
    plan = JobPlan(job, folder, meta, rows, shards, [], identity=identity, base=base)
    for i in range(shards):
        path = shard_path(folder, i)
        lo, hi = shard_bounds(plan, i)
        ids = rows["sample_id"][lo:hi]
        kept = kept_path(meta, i)
        if path.exists() or path.is_symlink():
            why = shard_problem(path, ids, None, job.config_hash, identity.hash)
            if why is None:  # kept rows left by a driver that stopped between the two
                if kept.is_symlink() or what_is(kept) == REGULAR:
                    remove_file(base, kept)  # a link is removed itself
                elif kept.exists():
                    set_aside(kept, f"{what_is(kept)}, not a file of kept rows", meta, base=base)
                continue
            plan.corrupt.append(set_aside(path, why, meta, _suffix(why), base).name)
        table, why = pending_kept(meta, i, ids, job.config_hash, identity.hash)
        if why is not None:
            plan.corrupt.append(set_aside(kept, why, meta, _suffix(why), base).name)
        elif table is not None and len(table) == len(ids) and lock:
            # It stopped before writing the shard: written now, from the kept rows.
            write_table_atomic(shard_table(plan, i, [table]), path, base)
            remove_file(base, kept)
            remove_file(base, error_path(meta, i))
            plan.kept_whole += len(table)
            continue
        elif table is not None:
            plan.kept[i] = table
        plan.pending.append(i)
    # A pending shard's error file is written when it fails: a link there is refused now.
    check_places(base, [error_path(meta, i) for i in plan.pending])
    return plan


class EarlierJobs:
    """The jobs an earlier run planned in a sweep's folder, read (once, when a job new to the
    folder asks) from their `job.json`: a job that one of them is, but for how its model or
    build source path was spelled (`/m` against `../m` or a link to `/m`: the same `places`),
    is that job. Job files from before `places` was recorded are not matched."""

    def __init__(self, root: Path):
        self.root = root
        self.index: dict[str, dict[str, Any]] | None = None

    def match(self, job: Job, places: dict[str, str]) -> Job:
        if not places:
            return job
        if self.index is None:
            self.index = self._read()
        info = self.index.get(_place_key(_plain(job.config()), places))
        if info is None:
            return job
        config = info["config"]
        spelled = {"name": info["job"], "model": config["model"]["id"]}
        if "source" in places:
            spelled["source"] = config["dataset"]["build"]["source"]
        found = dataclasses.replace(job, spelled=spelled)
        if found.config_hash != info["config_hash"]:  # not the same job after all
            return job
        log.info(
            "%s: the job %s an earlier run wrote, its model or source named by another path",
            job.name,
            found.name,
        )
        return found

    def _read(self) -> dict[str, dict[str, Any]]:
        index: dict[str, dict[str, Any]] = {}
        jobs = self.root / META_DIR / "jobs"
        if what_is(jobs) != "a directory":
            return index
        for path in sorted(jobs.glob(f"*/{JOB_FILE}")):
            try:  # a regular file, size-limited: anything may lie in a results folder
                info = read_json(path, "job file")
                places, config = info["places"], info["config"]
                key = _place_key(config, places)
                # Its name is the folder it lies in (a file edited to name another is not
                # followed: the name becomes the folder this run writes in).
                name = path.parent.name
                if info["job"] == name and not name.startswith((".", "_")):
                    index.setdefault(key, info)
            except (OSError, ValueError, TypeError, KeyError, AttributeError):
                continue  # not ours, or from before `places`: never matched
        return index


def _plain(config: dict[str, Any]) -> dict[str, Any]:
    """`config` as its job file holds it (JSON, `default=str`)."""
    return json.loads(json.dumps(config, default=str))


def _place_key(config: dict[str, Any], places: dict[str, str]) -> str:
    """A job's settings with its path spellings replaced by the places they name."""
    config = json.loads(json.dumps(config))  # a copy, changed below
    if "model" in places:
        config["model"]["id"] = None
    if "source" in places:
        config["dataset"]["build"]["source"] = None
    return json.dumps([config, places], sort_keys=True)


def _suffix(why: str) -> str:
    """Where an untrusted file is set aside: `.foreign` for another job's or dataset's rows."""
    return ".foreign" if why.startswith("rows of another") else ".corrupt"


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


def shard_bounds(plan: JobPlan, index: int) -> tuple[int, int]:
    """The shard's rows, [lo, hi), in the job's selected samples."""
    size = plan.job.shard_size
    return index * size, min((index + 1) * size, len(plan.rows["sample_id"]))


def shard_table(plan: JobPlan, index: int, tables: list[pa.Table]) -> pa.Table:
    """A shard's rows from `tables` (kept rows, a run's rows), one per sample in the shard's
    order, as a run of the whole shard writes them (a sample in two: its first row)."""
    lo, hi = shard_bounds(plan, index)
    table = pa.concat_tables(tables)
    first: dict[int, int] = {}
    for row, sample in enumerate(table["sample_id"].to_pylist()):
        first.setdefault(sample, row)
    return table.take([first[s] for s in plan.rows["sample_id"][lo:hi]])


# ---- status -----------------------------------------------------------------------------------
@dataclass
class JobStatus:
    sweep: str
    job: str
    shards: int
    done: int
    failed: int
    samples_done: int
    found: int
    exact: int
    kept: int = 0  # samples of unfinished shards whose rows a stopped run kept

    @property
    def pending(self) -> int:
        return self.shards - self.done


MAX_SHARDS = 10_000_000  # a job.json claiming more was not written by sodaray


def read_job_file(meta: Path) -> dict[str, Any]:
    """A job's `job.json`, checked: it is read back from disk, where anything may have written
    it (a job naming `../../etc`, a count of 10^12 shards), so every field used is checked."""
    path = meta / JOB_FILE
    try:  # a regular file of at most `MAX_CONFIG_BYTES`, UTF-8, JSON
        info = read_json(path, "job file")
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable job file ({first_line(exc)})") from exc
    if not isinstance(info, dict):
        raise ValueError(f"{path}: not a job file (a JSON object)")
    if info.get("job") != meta.name or not isinstance(info.get("sweep"), str):
        raise ValueError(f"{path}: its job is {brief(info.get('job'))}, not its folder's name")
    counts = [info.get(k) for k in ("shards", "shard_size", "samples")]
    if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts):
        raise ValueError(f"{path}: shards, shard_size and samples must be counts")
    shards, size, samples = counts
    if size < 1 or shards > MAX_SHARDS or shards != -(-samples // size):
        raise ValueError(f"{path}: {shards} shards of {size} do not hold {samples} samples")
    runs = info.get("sample_ids")
    if runs is not None and not _valid_runs(runs, samples):
        raise ValueError(f"{path}: sample_ids are not {samples} ids as [start, stop) runs")
    for key in ("config_hash", "dataset_hash"):
        if info.get(key) is not None and not isinstance(info[key], str):
            raise ValueError(f"{path}: {key} is {brief(info[key])}, not a hash")
    return info


def _valid_runs(runs: Any, samples: int) -> bool:
    """`runs` are increasing `[start, stop)` pairs of ids holding `samples` ids in all."""
    if not isinstance(runs, list):
        return False
    total, last = 0, -1
    for run in runs:
        if not (
            isinstance(run, list)
            and len(run) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) for x in run)
            and last <= run[0] < run[1]
        ):
            return False
        total += run[1] - run[0]
        last = run[1]
    return total == samples


def job_status(meta: Path) -> JobStatus:
    """A job's counts from its `meta` folder (`.sodaray/jobs/<job>`) and its shard files (the
    files there are counted, not the shards the job file says it has)."""
    info = read_job_file(meta)
    shards, size, samples = info["shards"], info["shard_size"], info["samples"]
    folder = inside(meta.parents[2], info["job"])
    own, data = info.get("config_hash"), info.get("dataset_hash")
    runs = info.get("sample_ids")  # None: a job file from before they were recorded

    def ids_of(index: int) -> list[int] | None:
        return None if runs is None else ids_between(runs, index * size, (index + 1) * size)

    done = failed = samples_done = found = exact = 0
    finished = set()
    for path in folder.glob("shard-*.parquet"):
        index = _shard_index(path.name, ".parquet")
        if index is None or index >= shards:
            continue
        rows = min(size, samples - index * size)
        t, _ = read_shard(path, ids_of(index), rows, own, data)
        if t is not None:  # `run` sets bad ones (and other jobs' rows) aside
            finished.add(index)
            samples_done += len(t)
            f, e = found_exact(t)
            found, exact = found + f, exact + e
    done = len(finished)
    for path in meta.glob("shard-*.error.json"):
        index = _shard_index(path.name, ".error.json")
        failed += index is not None and index < shards and index not in finished
    kept = 0
    for path in meta.glob("shard-*.kept.pq"):
        index = _shard_index(path.name, ".kept.pq")
        if index is None or index >= shards or index in finished:
            continue
        ids = ids_of(index)
        if ids is not None and isinstance(own, str):  # the run's own check (`pending_kept`)
            table, _ = pending_kept(meta, index, ids, own, data)
            kept += 0 if table is None else len(table)
        elif what_is(path) == REGULAR:  # an older job file: counted, not checked
            with contextlib.suppress(OSError, pa.ArrowException):
                kept += min(pq.read_metadata(path).num_rows, size, samples - index * size)
    return JobStatus(
        info["sweep"], info["job"], shards, done, failed, samples_done, found, exact, kept
    )


def _shard_index(name: str, suffix: str) -> int | None:
    digits = name.removeprefix("shard-").removesuffix(suffix)
    return int(digits) if name.endswith(suffix) and digits.isdigit() else None


def sweep_status(out: str | Path) -> list[JobStatus]:
    """Every job under `out` (a results folder or one sweep's folder)."""
    out = Path(out)
    kind = what_is(out)
    if kind is None:
        raise FileNotFoundError(f"no such results folder: {out}")
    if kind != "a directory":
        raise ValueError(f"{out} is {kind}, not a results folder")
    found = sorted(out.glob(f"{META_DIR}/jobs/*/{JOB_FILE}"))
    found += sorted(out.glob(f"*/{META_DIR}/jobs/*/{JOB_FILE}"))
    return [job_status(path.parent) for path in found]
