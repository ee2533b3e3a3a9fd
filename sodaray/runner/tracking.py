"""A sweep's jobs in MLflow (`sodaray sweep run --mlflow URI`): one MLflow run per job, in an
experiment named after the sweep, logged when the run ends (also after Ctrl-C): the job's
configuration as parameters and its counts so far (samples, found, exact and their rates) as
metrics. A job is found again by its configuration hash, so running the sweep again (resuming
it) updates the job's run instead of adding another."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sodaray.experiment.tracking import check_tracking, guarded

log = logging.getLogger(__name__)

CONFIG_HASH_TAG = "sodaray.config_hash"


def _flat(prefix: str, value: Any, out: dict[str, str]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            _flat(f"{prefix}.{key}" if prefix else str(key), item, out)
    else:
        out[prefix] = json.dumps(value, default=str) if isinstance(value, list) else str(value)


def job_params(config: dict[str, Any]) -> dict[str, str]:
    """A job's configuration (as hashed into its folder name) flattened into MLflow params:
    `params.temperature`, `objective.top_k`, `model.id`, ..."""
    out: dict[str, str] = {}
    _flat("", config, out)
    return out


def log_sweep(uri: str, sweep: str, folder: str | Path) -> int:
    """Each job under a sweep's results `folder` as an MLflow run (created, or updated when the
    job's configuration hash already has one). Returns the runs logged."""
    from sodaray.runner.layout import JOB_FILE, job_status

    folders = sorted(p.parent for p in Path(folder).rglob(JOB_FILE))
    if not folders:
        return 0
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(sweep)
    experiment_id = (
        experiment.experiment_id if experiment is not None else client.create_experiment(sweep)
    )
    logged = 0
    for job_folder in folders:
        info = json.loads((job_folder / JOB_FILE).read_text())
        status = job_status(job_folder)
        key = info.get("config_hash", "")
        found = client.search_runs(
            [experiment_id], filter_string=f"tags.`{CONFIG_HASH_TAG}` = '{key}'", max_results=1
        )
        if found:
            run_id = found[0].info.run_id
        else:
            run = client.create_run(
                experiment_id,
                run_name=info["job"],
                tags={
                    CONFIG_HASH_TAG: key,
                    "sodaray.sweep": info.get("sweep", sweep),
                    "sodaray.results": str(job_folder),
                },
            )
            run_id = run.info.run_id
            for name, value in job_params(info.get("config", {})).items():
                client.log_param(run_id, name, value[:6000])  # MLflow's length limit
        done = status.samples_done
        metrics = {
            "samples": info.get("samples", done),
            "samples_done": done,
            "shards_done": status.done,
            "shards_failed": status.failed,
            "found": status.found,
            "exact": status.exact,
            "found_rate": status.found / done if done else 0.0,
            "exact_rate": status.exact / done if done else 0.0,
        }
        for name, value in metrics.items():
            # Step: samples done, so a resumed job's history shows its progress.
            client.log_metric(run_id, name, float(value), step=done)
        state = "FINISHED" if status.pending == 0 else "FAILED" if status.failed else "KILLED"
        client.set_terminated(run_id, state)
        logged += 1
    log.info("logged %d sweep jobs to MLflow at %s", logged, uri)
    return logged


def sweep_logger(uri: str) -> Callable[[str, str | Path], None]:
    """`log(sweep, folder)` for `sodaray sweep run`, checked against the URI first."""
    check_tracking(uri)
    return guarded("sweep logging", lambda sweep, folder: log_sweep(uri, sweep, folder))
