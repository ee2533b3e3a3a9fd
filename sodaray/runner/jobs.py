"""Planning a sweep's jobs in its results folder: each job's samples, job file, lock, and the
shards still to run (`runner.layout` says which files are trusted)."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from sodaray.experiment.data import DatasetIdentity, dataset_rows
from sodaray.experiment.owner import describe_owner
from sodaray.experiment.spec import places as job_places
from sodaray.io.files import read_json, what_is
from sodaray.io.paths import inside
from sodaray.io.writes import REGULAR, OutputFolder
from sodaray.results import JOB_FILE, META_DIR, write_table_atomic
from sodaray.runner.layout import (
    acquire_lock,
    error_path,
    id_ranges,
    kept_path,
    meta_folder,
    pending_kept,
    read_shard,
    release_lock,
    set_aside,
    shard_path,
)
from sodaray.runner.spec import Job

log = logging.getLogger(__name__)


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
    out: OutputFolder = OutputFolder(Path())  # nothing below it is written through a link
    kept_whole: int = 0  # rows of shards written whole from kept rows at planning


def plan_jobs(
    jobs: list[Job],
    root: Path,
    *,
    lock: bool = False,
    overrides: list[str] | None = None,
    out: OutputFolder | None = None,
) -> list[JobPlan]:
    """Each job's folder, samples and pending shards. With `lock`, the job's lock is taken; a
    job another live driver holds comes back with no pending shards and `locked_by` set.
    `overrides`: recorded in each job's `job.json`. `root`: the sweep's folder in `out`, the
    output folder the user gave (default: `root`'s parent). A job an earlier run wrote with its
    paths spelled otherwise (`EarlierJobs`) takes that run's name and hash."""
    out = OutputFolder(Path(root).parent) if out is None else out
    plans: dict[str, JobPlan] = {}
    held: list[Path] = []
    earlier = EarlierJobs(Path(root))
    try:
        for job in jobs:
            rows, identity = dataset_rows(
                job.model, job.dataset, root, out, job.samples_per_length, job.limit
            )
            if job.dataset.path is not None:  # its rows decide the results, not its path
                job = dataclasses.replace(job, dataset_hash=identity.hash or "")
            places = job_places(job.model, job.dataset)
            if not os.path.lexists(meta_folder(root, job.name)):
                job = earlier.match(job, places)
            if job.name in plans:
                continue
            folder, meta = inside(root, job.name), meta_folder(root, job.name)
            shards = (len(rows["sample_id"]) + job.shard_size - 1) // job.shard_size
            out.make_folder(folder)
            out.make_folder(meta)
            plan = JobPlan(job, folder, meta, rows, shards, [], identity=identity, out=out)
            plans[job.name] = plan
            info = {
                "sweep": job.sweep,
                "job": job.name,
                "config_hash": job.config_hash,
                "samples": len(rows["sample_id"]),
                "shards": shards,
                "shard_size": job.shard_size,
                "sample_ids": id_ranges(rows["sample_id"]),
                "dataset_hash": identity.hash,
                "config": job.config(),
                "overrides": list(overrides or []),
                "places": places,  # where the model and a build's source lie (`EarlierJobs`)
                "defaults": job.defaults and job.defaults.to_dict(),
            }
            owner = acquire_lock(meta, out) if lock else None
            if owner is not None:
                who = describe_owner(owner)
                log.warning("skipping %s: another driver runs it (%s)", job.name, who)
                plan.locked_by = owner
                continue
            if lock:
                held.append(meta)
            out.write(meta / JOB_FILE, json.dumps(info, indent=2, default=str) + "\n")
            for i in range(shards):
                _plan_shard(plan, i, lock)
            # A pending shard's error file is written when it fails: a link there is refused now.
            out.check([error_path(meta, i) for i in plan.pending])
    except BaseException:
        # A job that cannot be planned (a link where its job.json goes) ends the run: the
        # locks taken so far are given back, not left for the next run to break.
        for meta in held:
            release_lock(meta, out)
        raise
    return list(plans.values())


def _plan_shard(plan: JobPlan, i: int, lock: bool) -> None:
    """Shard `i`: done when its file is trusted; else its untrusted files set aside, and it is
    pending with its trusted kept rows, or (with `lock`) written now from kept rows that are
    whole."""
    job, meta, out = plan.job, plan.meta, plan.out
    path, kept = shard_path(plan.folder, i), kept_path(meta, i)
    ids = plan.rows["sample_id"][slice(*shard_bounds(plan, i))]
    if path.exists() or path.is_symlink():
        _, why = read_shard(path, ids, None, job.config_hash, plan.identity.hash)
        if why is None:  # kept rows left by a driver that stopped between the two
            if kept.is_symlink() or what_is(kept) == REGULAR:
                out.remove(kept)  # a link is removed itself
            elif kept.exists():
                set_aside(kept, f"{what_is(kept)}, not a file of kept rows", meta, out)
            return
        plan.corrupt.append(set_aside(path, why, meta, out).name)
    table, why = pending_kept(meta, i, ids, job.config_hash, plan.identity.hash)
    if why is not None:
        plan.corrupt.append(set_aside(kept, why, meta, out).name)
    elif table is not None and len(table) == len(ids) and lock:
        # It stopped before writing the shard: written now, from the kept rows.
        write_table_atomic(shard_table(plan, i, [table]), path, out)
        out.remove(kept)
        out.remove(error_path(meta, i))
        plan.kept_whole += len(table)
        return
    elif table is not None:
        plan.kept[i] = table
    plan.pending.append(i)


class EarlierJobs:
    """The jobs an earlier run planned in a sweep's folder, read once from their `job.json`: a
    job that one of them is, but for how its model or build source path was spelled (the same
    `places`), is that job."""

    def __init__(self, root: Path):
        self.root = root

    def match(self, job: Job, places: dict[str, str]) -> Job:
        info = self.index.get(_place_key(job.config(), places)) if places else None
        if info is None:
            return job
        config = info["config"]
        spelled = {"name": info["job"], "model": config["model"]["id"]}
        if "source" in places:
            spelled["source"] = config["dataset"]["build"]["source"]
        found = dataclasses.replace(job, spelled=spelled)
        if found.config_hash != info["config_hash"]:  # not the same job after all
            return job
        how = "its model or source named by another path"
        log.info("%s: the job %s an earlier run wrote, %s", job.name, found.name, how)
        return found

    @functools.cached_property
    def index(self) -> dict[str, dict[str, Any]]:
        index: dict[str, dict[str, Any]] = {}
        jobs = self.root / META_DIR / "jobs"
        if what_is(jobs) != "a directory":
            return index
        for path in sorted(jobs.glob(f"*/{JOB_FILE}")):
            try:  # a regular file, size-limited: anything may lie in a results folder
                info = read_json(path, "job file")
                places, config = info["places"], info["config"]
                key, name = _place_key(config, places), path.parent.name
                # Its name is the folder it lies in (a file edited to name another is not followed).
                if info["job"] == name and not name.startswith((".", "_")):
                    index.setdefault(key, info)
            except (OSError, ValueError, TypeError, KeyError, AttributeError):
                continue  # not ours, or without `places`: never matched
        return index


def _place_key(config: dict[str, Any], places: dict[str, str]) -> str:
    """A job's settings as its job file holds them (JSON, `default=str`), its path spellings
    replaced by the places they name."""
    config = json.loads(json.dumps(config, default=str))  # a copy, changed below
    if "model" in places:
        config["model"]["id"] = None
    if "source" in places:
        config["dataset"]["build"]["source"] = None
    return json.dumps([config, places], sort_keys=True)


def shard_bounds(plan: JobPlan, index: int) -> tuple[int, int]:
    """The shard's rows, [lo, hi), in the job's selected samples."""
    size = plan.job.shard_size
    return index * size, min((index + 1) * size, len(plan.rows["sample_id"]))


def shard_table(plan: JobPlan, index: int, tables: list[pa.Table]) -> pa.Table:
    """A shard's rows from `tables` (kept rows, a run's rows), one per sample in the shard's
    order, as a run of the whole shard writes them (a sample in two: its first row)."""
    table = pa.concat_tables(tables)
    first = {s: row for row, s in reversed(list(enumerate(table["sample_id"].to_pylist())))}
    return table.take([first[s] for s in plan.rows["sample_id"][slice(*shard_bounds(plan, index))]])
