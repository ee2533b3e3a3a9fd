"""`sweep status`: each job's shards, failures and kept rows, counted from its results folder
by the checks a run applies (`runner.layout`), so it says what the next run keeps."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
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
    """A job's `job.json`, every field used checked: anything may have written it."""
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
        pair = isinstance(run, list) and len(run) == 2 and all(type(x) is int for x in run)
        if not (pair and last <= run[0] < run[1]):
            return False
        total, last = total + run[1] - run[0], run[1]
    return total == samples


def job_status(meta: Path) -> JobStatus:
    """A job's counts from its `meta` folder and the shard files found (not those it claims)."""
    info = read_job_file(meta)
    shards, size, samples = info["shards"], info["shard_size"], info["samples"]
    folder = inside(meta.parents[2], info["job"])
    own, data = info.get("config_hash"), info.get("dataset_hash")
    runs = info.get("sample_ids")  # None: a job file that does not record them

    def ids_of(index: int) -> list[int] | None:
        return None if runs is None else ids_between(runs, index * size, (index + 1) * size)

    def indexed(where: Path, suffix: str) -> Iterator[tuple[int, Path]]:
        """The files `shard-NNNNN<suffix>` in `where` of the job's shards, with their index."""
        for path in where.glob(f"shard-*{suffix}"):
            digits = path.name.removeprefix("shard-").removesuffix(suffix)
            if path.name.endswith(suffix) and digits.isdigit() and int(digits) < shards:
                yield int(digits), path

    samples_done = found = exact = kept = 0
    finished = set()
    for index, path in indexed(folder, ".parquet"):
        rows = min(size, samples - index * size)
        t, _ = read_shard(path, ids_of(index), rows, own, data)
        if t is not None:  # `run` sets bad ones (and other jobs' rows) aside
            finished.add(index)
            samples_done += len(t)
            f, e = found_exact(t)
            found, exact = found + f, exact + e
    failed = sum(index not in finished for index, _ in indexed(meta, ".error.json"))
    for index, path in indexed(meta, ".kept.pq"):
        if index in finished:
            continue
        ids = ids_of(index)
        if ids is not None and isinstance(own, str):  # the run's own check (`pending_kept`)
            table, _ = pending_kept(meta, index, ids, own, data)
            kept += 0 if table is None else len(table)
        elif what_is(path) == REGULAR:  # a job file without sample ids: counted, not checked
            with contextlib.suppress(OSError, pa.ArrowException):
                kept += min(pq.read_metadata(path).num_rows, size, samples - index * size)
    return JobStatus(
        sweep=info["sweep"],
        job=info["job"],
        shards=shards,
        done=len(finished),
        failed=failed,
        samples_done=samples_done,
        found=found,
        exact=exact,
        kept=kept,
    )


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
