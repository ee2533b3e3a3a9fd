"""Optional MLflow tracking, off unless asked for (`--mlflow URI` on `sweep run` and `tune`).

The extra is `pip install 'sodaray[mlflow]'` (`mlflow-skinny`: the tracking client; a database
URI such as `sqlite:///mlflow.db` or a server's `http://HOST:5000`). What is logged:

- a sweep job: one MLflow run per job (in an experiment named after the sweep), found again by
  its configuration hash so a resumed sweep updates it; the configuration as parameters; counts
  and rates; curves of the found and exact rates against steps (from each sample's `steps`, so
  the curve is exact, not sampled during the run) and the mean final loss; `job.json` as an
  artifact. Plus one run for the whole sweep with its report (tables and figures) and status.
- a study's trial: one run per trial (in an experiment named after the study) with its
  parameters, its value under the tuning file's metric, the value at each pruning checkpoint
  as a curve, its state and its user attributes (result file, exact, total, seconds) as tags.

A tracking failure mid-run (a server gone) is a warning: the result files and the study hold
everything. MLflow's own start-up lines are held below WARNING so they do not break the
progress bars.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from sodaray.errors import first_line

log = logging.getLogger(__name__)

INSTALL = "pip install 'sodaray[mlflow]'"
CONFIG_HASH_TAG = "sodaray.config_hash"
KIND_TAG = "sodaray.kind"  # "job", "sweep" or "trial"
CURVE_POINTS = 50  # points of a job's found/exact-against-steps curve


def check_tracking(uri: str) -> None:
    """Import MLflow and reach the tracking URI before any work starts: a typo or a server that
    is down is one line now, not a failure after hours of trials."""
    try:
        from mlflow.tracking import MlflowClient
    except ImportError as exc:
        raise ValueError(f"--mlflow needs the `mlflow-skinny` package ({INSTALL}): {exc}") from exc
    for name in ("mlflow", "alembic"):  # "Creating initial MLflow database tables..." etc.
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
    except Exception as exc:  # MlflowException, connection errors, a bad scheme
        raise ValueError(f"--mlflow {uri}: {first_line(exc)}") from exc


def guarded(name: str, call: Callable[..., None]) -> Callable[..., None]:
    """A tracking call whose failure is a warning: a lost log line must not stop the work."""

    def guarded(*args: Any) -> None:
        try:
            call(*args)
        except Exception as exc:
            log.warning("MLflow %s failed (%s); the run goes on without it", name, exc)

    return guarded


def experiment_id(client: Any, uri: str, name: str) -> str:
    """The experiment named `name`, made if new. With a database file (`sqlite:///x/m.db`) its
    artifacts go beside that file (`x/mlartifacts/`), not into the working directory."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    location = None
    parsed = urlparse(uri)
    if parsed.scheme == "sqlite" and parsed.path not in ("", "/:memory:"):
        db = Path(uri.removeprefix("sqlite:///"))
        location = (db.absolute().parent / "mlartifacts" / name).as_uri()
    return client.create_experiment(name, artifact_location=location)


def run_for(client: Any, experiment: str, tags: dict[str, str], run_name: str) -> tuple[str, bool]:
    """(run id, is new): the run carrying `tags` (a job's hash, a sweep's name), or a new one."""
    query = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
    found = client.search_runs([experiment], filter_string=query, max_results=1)
    if found:
        return found[0].info.run_id, False
    return client.create_run(experiment, run_name=run_name, tags=tags).info.run_id, True


def flat_params(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """A job's configuration (as hashed into its folder name) flattened into MLflow params:
    `params.temperature`, `objective.top_k`, `model.id`, ... (values cut to MLflow's limit)."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict):
            out.update(flat_params(value, name))
        else:
            text = json.dumps(value, default=str) if isinstance(value, list) else str(value)
            out[name] = text[:6000]
    return out


def rate_curves(rows: Any, max_steps: int) -> list[tuple[int, float, float]]:
    """(step, found rate, exact rate) at `CURVE_POINTS` steps up to `max_steps`: the share of
    samples found (and exactly) by that step, from each row's `steps`."""
    import numpy as np

    from sodaray.metrics import solved_by_step

    if len(rows) == 0:
        return []
    points = np.unique(np.linspace(0, max_steps, CURVE_POINTS + 1).round().astype(int))[1:]
    found = solved_by_step(rows, points, column="found")
    exact = solved_by_step(rows, points)
    return [(int(s), f, e) for s, f, e in zip(points, found, exact, strict=True)]


def log_job(client: Any, experiment: str, meta: Path, results: Path, sweep: str) -> None:
    """One job (its `job.json` and status in `meta`, its rows in `results`) as a run."""
    from mlflow.entities import Metric

    from sodaray.results import JOB_FILE, ResultsError, read_results
    from sodaray.runner.layout import job_status, read_job_file

    info = read_job_file(meta)  # checked: it is read back from disk
    status = job_status(meta)
    tags = {CONFIG_HASH_TAG: info.get("config_hash", ""), KIND_TAG: "job"}
    run_id, new = run_for(client, experiment, tags, info["job"])
    if new:
        client.set_tag(run_id, "sodaray.sweep", info.get("sweep", sweep))
        client.set_tag(run_id, "sodaray.results", str(results / info["job"]))
        for name, value in flat_params(info.get("config", {})).items():
            client.log_param(run_id, name, value)
        client.log_artifact(run_id, str(meta / JOB_FILE))
    done = status.samples_done
    counts = {
        "samples": info.get("samples", done),
        "samples_done": done,
        "shards_done": status.done,
        "shards_failed": status.failed,
        "found": status.found,
        "exact": status.exact,
        "found_rate": status.found / done if done else 0.0,
        "exact_rate": status.exact / done if done else 0.0,
    }
    # Step: samples done, so a resumed job's history shows its progress.
    metrics = [Metric(k, float(v), 0, done) for k, v in counts.items()]
    run = client.get_run(run_id)
    if done and run.data.tags.get("sodaray.curves") != str(done):  # once per state of the job
        try:
            rows = read_results(results / info["job"]).to_pandas()
        except ResultsError:
            rows = None
        if rows is not None:
            budget = int(info.get("config", {}).get("params", {}).get("max_steps", 0))
            for step, found, exact in rate_curves(rows, budget or int(rows["steps"].max())):
                metrics += [Metric("found_by_step", found, 0, step)]
                metrics += [Metric("exact_by_step", exact, 0, step)]
            metrics.append(Metric("final_loss_mean", float(rows["final_loss"].mean()), 0, done))
            client.set_tag(run_id, "sodaray.curves", str(done))
    client.log_batch(run_id, metrics=metrics)
    state = "FINISHED" if status.pending == 0 else "FAILED" if status.failed else "KILLED"
    client.set_terminated(run_id, state)


def log_sweep(uri: str, sweep: str, folder: str | Path) -> int:
    """Each job under a sweep's results `folder` as an MLflow run, and the sweep's report and
    status as the artifacts of one run for the sweep. Returns the job runs logged."""
    from mlflow.tracking import MlflowClient

    from sodaray.results import JOB_FILE
    from sodaray.runner.layout import sweep_status

    folders = sorted(p.parent for p in Path(folder).rglob(JOB_FILE))
    if not folders:
        return 0
    client = MlflowClient(tracking_uri=uri)
    experiment = experiment_id(client, uri, sweep)
    for meta in folders:  # .sodaray/jobs/<job>/: job.json; the rows are in <job>/
        log_job(client, experiment, meta, Path(folder), sweep)
    run_id, _ = run_for(client, experiment, {KIND_TAG: "sweep"}, f"{sweep} (report)")
    with tempfile.TemporaryDirectory() as tmp:
        status = [vars(s) for s in sweep_status(folder)]
        Path(tmp, "status.json").write_text(json.dumps(status, default=str, indent=1))
        client.log_artifact(run_id, str(Path(tmp, "status.json")))
        try:
            from sodaray.report import build_report

            build_report(folder, Path(tmp, "report"))
            client.log_artifacts(run_id, str(Path(tmp, "report")), "report")
        except ValueError as exc:  # no rows yet (every shard failed or pending)
            log.info("no report for MLflow: %s", first_line(exc))
    client.set_terminated(run_id, "FINISHED")
    log.info("logged %d sweep jobs to MLflow at %s", len(folders), uri)
    return len(folders)


def sweep_logger(uri: str) -> Callable[[str, str | Path], None]:
    """`log(sweep, folder)` for `sodaray sweep run`, checked against the URI first."""
    check_tracking(uri)
    return guarded("sweep logging", lambda sweep, folder: log_sweep(uri, sweep, folder))


def trial_logger(uri: str, metric: str) -> Callable[[Any, Any], None]:
    """An Optuna callback `(study, frozen_trial)`: each finished trial as an MLflow run."""
    check_tracking(uri)

    def log_trial(study: Any, trial: Any) -> None:
        from mlflow.entities import Metric, Param, RunTag
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=uri)
        experiment = experiment_id(client, uri, study.study_name)
        tags = {KIND_TAG: "trial", "sodaray.trial": str(trial.number)}
        run_id, _ = run_for(client, experiment, tags, str(trial.number))
        metrics = [Metric(metric, float(trial.value), 0, 0)] if trial.value is not None else []
        metrics += [
            Metric("checkpoint", float(v), 0, s) for s, v in trial.intermediate_values.items()
        ]
        attrs = {"state": trial.state.name, **{k: str(v) for k, v in trial.user_attrs.items()}}
        client.log_batch(
            run_id,
            metrics=metrics,
            params=[Param(k, str(v)[:6000]) for k, v in trial.params.items()],
            tags=[RunTag(k, v[:5000]) for k, v in attrs.items()],
        )
        client.set_terminated(run_id, "FINISHED" if trial.state.name == "COMPLETE" else "KILLED")

    return guarded("trial logging", log_trial)
