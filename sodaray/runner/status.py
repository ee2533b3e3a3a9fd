"""`sweep status`: each job's shards, failures and kept rows, counted from its results folder
by the checks a run applies (`runner.layout`), so it says what the next run keeps."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from sodaray.errors import first_line
from sodaray.io.files import read_json, what_is
from sodaray.io.paths import brief, inside
from sodaray.io.writes import REGULAR
from sodaray.results import JOB_FILE, META_DIR
from sodaray.runner.layout import found_exact, ids_between, pending_kept, read_shard


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
    runs = info.get("sample_ids")  # None: a job file that does not record them

    def ids_of(index: int) -> list[int] | None:
        return None if runs is None else ids_between(runs, index * size, (index + 1) * size)

    failed = samples_done = found = exact = 0
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
        elif what_is(path) == REGULAR:  # a job file without sample ids: counted, not checked
            with contextlib.suppress(OSError, pa.ArrowException):
                kept += min(pq.read_metadata(path).num_rows, size, samples - index * size)
    counts = (shards, len(finished), failed, samples_done, found, exact, kept)
    return JobStatus(info["sweep"], info["job"], *counts)


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
