"""Optional MLflow tracking for sweeps and tuning, off unless asked for (`--mlflow URI`).

Tuning uses Optuna's own integration (`optuna_integration.MLflowCallback`): one MLflow run per
trial, in an experiment named after the study, with the trial's parameters, its value under the
tuning file's metric, its state and its user attributes (result file, exact, total, seconds) as
tags. A sweep logs one MLflow run per job, in an experiment named after the sweep, when the run
ends: the job's configuration as parameters and its counts so far (samples, found, exact and their
rates) as metrics. A job is found again by its configuration hash, so running the sweep again
(resuming it) updates the job's run instead of adding another.

Both packages are an extra (`pip install 'sodaray[mlflow]'`): `mlflow-skinny` (the tracking client;
a database URI such as `sqlite:///mlflow.db` or a server's `http://HOST:5000`) and
`optuna-integration`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

INSTALL = "pip install 'sodaray[mlflow]'"
CONFIG_HASH_TAG = "sodaray.config_hash"


def require_mlflow() -> None:
    """One line naming the extra when MLflow or Optuna's integration is not installed."""
    for module, package in (
        ("mlflow", "mlflow-skinny"),
        ("optuna_integration", "optuna-integration"),
    ):
        try:
            __import__(module)
        except ImportError as exc:
            raise ValueError(f"--mlflow needs the `{package}` package ({INSTALL}): {exc}") from exc


def check_tracking(uri: str) -> None:
    """Import MLflow and reach the tracking URI before any work starts: a typo or a server that
    is down is one line now, not a failure after hours of trials."""
    require_mlflow()
    from mlflow.tracking import MlflowClient

    try:
        MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
    except Exception as exc:  # MlflowException, connection errors, a bad scheme
        from sodaray.validation import first_line

        raise ValueError(f"--mlflow {uri}: {first_line(exc)}") from exc


def _guarded(name: str, call: Callable[..., None]) -> Callable[..., None]:
    """A tracking call whose failure (a server gone mid-run) is a warning: the study's storage
    and the result files hold everything, and a lost log line must not stop trials in flight."""

    def guarded(*args: Any) -> None:
        try:
            call(*args)
        except Exception as exc:
            log.warning("MLflow %s failed (%s); the run goes on without it", name, exc)

    return guarded


def tuning_callback(uri: str, metric: str) -> Callable[[Any, Any], None]:
    """An Optuna callback `(study, frozen_trial)` logging each finished trial to MLflow."""
    check_tracking(uri)
    from optuna_integration import MLflowCallback

    callback = MLflowCallback(
        tracking_uri=uri,
        metric_name=metric,
        create_experiment=True,
        tag_study_user_attrs=True,
        tag_trial_user_attrs=True,
    )
    return _guarded("trial logging", callback)


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
    from sodaray.runner.execute import JOB_FILE, job_status

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
    return _guarded("sweep logging", lambda sweep, folder: log_sweep(uri, sweep, folder))
