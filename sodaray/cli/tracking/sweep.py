"""A sweep in MLflow: one parent run for the sweep (its settings as params, its report, status
and file as artifacts) and a child run per job (everything that defines the job as params, its
counts and its curves against steps), logged from the results folder when `sweep run` ends."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sodaray.cli.tracking.store import (
    KIND_TAG,
    NOTE_TAG,
    check_experiment,
    check_tracking,
    client_for,
    experiment_id,
    find_run,
    flat_params,
    guarded,
    log_metrics,
    log_params,
    rows_metrics,
    run_key,
    set_tags,
)
from sodaray.errors import first_line

log = logging.getLogger(__name__)

SWEEP_TAG = "sodaray.sweep"
CURVES_TAG = "sodaray.curves"  # samples done when the curves were last logged


def sweep_params(sweep: Any, options: dict[str, Any]) -> dict[str, str]:
    """The sweep's settings as params: its file, the entries it crosses, the budget, seeds,
    sizes and overrides, and the command's options that change its jobs (`--model`,
    `--limit`)."""
    algorithms = {
        entry.label or entry.name: {
            "algorithm": entry.name,
            "params": entry.params,
            "grid": entry.grid,
            "max_steps": entry.max_steps or sweep.max_steps,
        }
        for entry in sweep.algorithms
    }
    settings = {
        "sweep": sweep.name,
        "file": str(sweep.path),
        "models": [m.id for m in sweep.models],
        "datasets": [d.name for d in sweep.datasets],
        "algorithms": algorithms,
        "objectives": sweep.objectives,
        "max_steps": sweep.max_steps,
        "seeds": sweep.seeds,
        "samples_per_length": sweep.samples_per_length,
        "shard_size": sweep.shard_size,
        "length": sweep.length,
        "max_length": sweep.max_length,
        "assumed_lengths": sweep.assumed_lengths,
        "overrides": sweep.overrides,
        **{f"command.{k}": v for k, v in options.items() if v is not None},
    }
    return flat_params(settings)


def log_job(client: Any, experiment: str, meta: Path, parent: str) -> dict[str, float]:
    """One job (its checked `job.json` in `meta`, its rows in the sweep's folder) as a child of
    the sweep's run. Returns its counts."""
    from sodaray.io.paths import inside
    from sodaray.results import JOB_FILE, ResultsError, read_results
    from sodaray.runner.status import job_status, read_job_file

    info = read_job_file(meta)  # checked: its job is its folder's name
    status = job_status(meta)
    sweep, job = info["sweep"], info["job"]
    tags = {KIND_TAG: "job", SWEEP_TAG: sweep, "sodaray.config_hash": str(info.get("config_hash"))}
    key = run_key("job", sweep, info.get("config_hash"))
    run_id, new = find_run(client, experiment, key, job, tags, parent)
    overrides = info.get("overrides", [])
    params = {"sweep": sweep, "job": job, **info.get("config", {}), "overrides": overrides}
    log_params(client, run_id, flat_params(params))
    results = inside(meta.parents[2], job)  # `.sodaray/jobs/<job>` -> `<job>`
    set_tags(
        client, run_id, {"sodaray.results": results, "sodaray.overrides": json.dumps(overrides)}
    )
    if new:
        client.log_artifact(run_id, str(meta / JOB_FILE))
    done = status.samples_done
    counts = {
        "samples": info["samples"],
        "samples_done": done,
        "shards_done": status.done,
        "shards_failed": status.failed,
        "found": status.found,
        "exact": status.exact,
        "found_rate": status.found / done if done else 0.0,
        "exact_rate": status.exact / done if done else 0.0,
    }
    # Step: samples done, so a resumed job's history shows its progress.
    metrics = [(k, float(v), done) for k, v in counts.items()]
    if done and client.get_run(run_id).data.tags.get(CURVES_TAG) != str(done):
        try:  # once per state of the job: a finished job's rows are read once
            rows = read_results(results).to_pandas()
        except ResultsError:
            rows = None
        if rows is not None and len(rows):
            budget = int(info.get("config", {}).get("params", {}).get("max_steps", 0))
            metrics += rows_metrics(rows, budget or int(rows["steps"].max()), done)
            client.set_tag(run_id, CURVES_TAG, str(done))
    log_metrics(client, run_id, metrics)
    state = "FINISHED" if status.pending == 0 else "FAILED" if status.failed else "KILLED"
    client.set_terminated(run_id, state)
    return {**counts, "pending": status.pending}


def log_sweep(
    uri: str,
    folder: str | Path,
    sweep: Any,
    experiment: str | None = None,
    options: dict[str, Any] | None = None,
) -> int:
    """The sweep whose results are in `folder` (OUT/<sweep>) as a parent run with a child run
    per job, in the experiment named `experiment` (default: the sweep's name). Returns the
    job runs logged."""
    from sodaray.runner.layout import meta_folder
    from sodaray.runner.status import sweep_status

    folder = Path(folder)
    jobs = sweep_status(folder)
    if not jobs:
        return 0
    client = client_for(uri)
    exp = experiment_id(client, uri, experiment or sweep.name)
    tags = {KIND_TAG: "sweep", SWEEP_TAG: sweep.name}
    parent, _ = find_run(client, exp, run_key("sweep", sweep.name), f"sweep {sweep.name}", tags)
    log_params(client, parent, {**sweep_params(sweep, options or {}), "jobs": str(len(jobs))})
    note = sweep.description or f"sweep {sweep.name} from {sweep.path}"
    set_tags(client, parent, {NOTE_TAG: note, "sodaray.results": folder.absolute()})
    total = dict.fromkeys(("samples_done", "found", "exact", "shards_done", "shards_failed"), 0.0)
    pending = 0
    for status in jobs:
        counts = log_job(client, exp, meta_folder(folder, status.job), parent)
        for name in total:
            total[name] += counts[name]
        pending += int(counts["pending"])
    done = total["samples_done"]
    total["found_rate"] = total["found"] / done if done else 0.0
    total["exact_rate"] = total["exact"] / done if done else 0.0
    log_metrics(client, parent, [(k, v, int(done)) for k, v in total.items()])
    log_sweep_artifacts(client, parent, folder, sweep)
    state = "FINISHED" if not pending else "FAILED" if total["shards_failed"] else "KILLED"
    client.set_terminated(parent, state)
    log.info("logged sweep %s and its %d jobs to MLflow at %s", sweep.name, len(jobs), uri)
    return len(jobs)


def log_sweep_artifacts(client: Any, run_id: str, folder: Path, sweep: Any) -> None:
    """The sweep's report (tables and figures), every job's status, and its file as given."""
    from sodaray.runner.status import sweep_status

    with tempfile.TemporaryDirectory() as tmp:
        status = [dataclasses.asdict(s) for s in sweep_status(folder)]
        Path(tmp, "status.json").write_text(json.dumps(status, default=str, indent=1))
        client.log_artifact(run_id, str(Path(tmp, "status.json")))
        if Path(sweep.path).is_file():
            shutil.copy(sweep.path, Path(tmp, Path(sweep.path).name))
            client.log_artifact(run_id, str(Path(tmp, Path(sweep.path).name)), "settings")
        try:
            from sodaray.report import build_report

            build_report(folder, Path(tmp, "report"))
            client.log_artifacts(run_id, str(Path(tmp, "report")), "report")
        except ValueError as exc:  # no rows yet (every shard failed or pending)
            log.info("no report for MLflow: %s", first_line(exc))


def sweep_logger(
    uri: str,
    sweep: Any,
    experiment: str | None = None,
    options: dict[str, Any] | None = None,
) -> Callable[[str | Path], None]:
    """`log(folder)` for `sodaray sweep run`, checked against the URI first."""
    check_experiment(experiment)
    check_tracking(uri)
    return guarded(
        "sweep logging", lambda folder: log_sweep(uri, folder, sweep, experiment, options)
    )
