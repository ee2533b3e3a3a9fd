"""A sweep in MLflow: one parent run for the sweep (its settings as params, its report, status
and file as artifacts) and a child run per job (everything that defines the job as params, its
counts and its curves against steps), logged from the results folder when `sweep run` ends."""

from __future__ import annotations

import dataclasses
import json
import logging
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sodaray.cli.tracking import store
from sodaray.errors import first_line

log = logging.getLogger(__name__)

SWEEP_TAG = "sodaray.sweep"
CURVES_TAG = "sodaray.curves"  # samples done when the curves were last logged
TOTALS = ("samples_done", "found", "exact", "shards_done", "shards_failed")  # summed over jobs


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
    return store.flat_params(settings)


def log_job(client: Any, experiment: str, meta: Path, parent: str) -> dict[str, float]:
    """One job (its checked `job.json` in `meta`, its rows in the sweep's folder) as a child of
    the sweep's run. Returns its counts."""
    from sodaray.io.paths import inside
    from sodaray.results import JOB_FILE, ResultsError, read_results
    from sodaray.runner.status import job_status, read_job_file

    info = read_job_file(meta)  # checked: its job is its folder's name
    status = job_status(meta)
    sweep, job = info["sweep"], info["job"]
    config_hash = info.get("config_hash")
    tags = {store.KIND_TAG: "job", SWEEP_TAG: sweep, "sodaray.config_hash": str(config_hash)}
    key = store.run_key("job", sweep, config_hash)
    run_id, new = store.find_run(client, experiment, key, job, tags, parent)
    overrides = info.get("overrides", [])
    params = {"sweep": sweep, "job": job, **info.get("config", {}), "overrides": overrides}
    store.log_params(client, run_id, store.flat_params(params))
    results = inside(meta.parents[2], job)  # `.sodaray/jobs/<job>` -> `<job>`
    tags = {"sodaray.results": results, "sodaray.overrides": json.dumps(overrides)}
    store.set_tags(client, run_id, tags)
    if new:
        client.log_artifact(run_id, str(meta / JOB_FILE))
    done = status.samples_done
    counts = {"samples": info["samples"], "samples_done": done, "shards_done": status.done}
    counts |= {"shards_failed": status.failed, "found": status.found, "exact": status.exact}
    counts = store.with_rates(counts, done)
    # Step: samples done, so a resumed job's history shows its progress.
    metrics = [(k, float(v), done) for k, v in counts.items()]
    if done and client.get_run(run_id).data.tags.get(CURVES_TAG) != str(done):
        try:  # once per state of the job: a finished job's rows are read once
            rows = read_results(results).to_pandas()
        except ResultsError:
            rows = None
        if rows is not None and len(rows):
            budget = int(info.get("config", {}).get("params", {}).get("max_steps", 0))
            metrics += store.rows_metrics(rows, budget or int(rows["steps"].max()), done)
            client.set_tag(run_id, CURVES_TAG, str(done))
    store.log_metrics(client, run_id, metrics)
    state = "FINISHED" if status.pending == 0 else "FAILED" if status.failed else "KILLED"
    client.set_terminated(run_id, state)
    return {**counts, "pending": status.pending}


def log_sweep(
    uri: str, folder: str | Path, sweep: Any, experiment: str | None, options: dict[str, Any]
) -> int:
    """The sweep whose results are in `folder` (OUT/<sweep>) as a parent run with a child run
    per job, and its report, status and file as the parent's artifacts, in the experiment named
    `experiment` (default: the sweep's name). Returns the job runs logged."""
    from sodaray.runner.layout import meta_folder
    from sodaray.runner.status import sweep_status

    folder = Path(folder)
    jobs = sweep_status(folder)
    if not jobs:
        return 0
    client, exp = store.open_experiment(uri, experiment or sweep.name)
    tags = {store.KIND_TAG: "sweep", SWEEP_TAG: sweep.name}
    key = store.run_key("sweep", sweep.name)
    parent, _ = store.find_run(client, exp, key, f"sweep {sweep.name}", tags)
    store.log_params(client, parent, {**sweep_params(sweep, options), "jobs": str(len(jobs))})
    note = sweep.description or f"sweep {sweep.name} from {sweep.path}"
    store.set_tags(client, parent, {store.NOTE_TAG: note, "sodaray.results": folder.absolute()})
    total = dict.fromkeys(TOTALS, 0.0)
    pending = 0
    for status in jobs:
        counts = log_job(client, exp, meta_folder(folder, status.job), parent)
        total = {name: total[name] + counts[name] for name in TOTALS}
        pending += int(counts["pending"])
    done = total["samples_done"]
    totals = store.with_rates(total, done)
    store.log_metrics(client, parent, [(k, v, int(done)) for k, v in totals.items()])
    by_job = [dataclasses.asdict(s) for s in jobs]
    store.log_files(client, parent, "status.json", by_job, sweep.path)
    with tempfile.TemporaryDirectory() as tmp:  # its tables and figures
        try:
            from sodaray.report import build_report

            build_report(folder, Path(tmp, "report"))
            client.log_artifacts(parent, str(Path(tmp, "report")), "report")
        except ValueError as exc:  # no rows yet (every shard failed or pending)
            log.info("no report for MLflow: %s", first_line(exc))
    state = "FINISHED" if not pending else "FAILED" if total["shards_failed"] else "KILLED"
    client.set_terminated(parent, state)
    log.info("logged sweep %s and its %d jobs to MLflow at %s", sweep.name, len(jobs), uri)
    return len(jobs)


def sweep_logger(sweep: Any, args: Any) -> Callable[[str | Path], None]:
    """`log(folder)` for `sodaray sweep run --mlflow URI` (`args`: its options), checked against
    the URI first."""
    uri, experiment = args.mlflow, args.mlflow_experiment
    store.check_tracking(uri, experiment)
    options = {"model": args.model, "limit": args.limit}  # what changes the file's jobs
    return store.guarded(
        "sweep logging", lambda folder: log_sweep(uri, folder, sweep, experiment, options)
    )
