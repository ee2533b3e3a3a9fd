"""What every MLflow log of sodaray's shares: reaching the tracking URI, the experiment, finding a
run again by what it is, parameters flattened and logged in batches, and curves against steps."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from sodaray.errors import first_line
from sodaray.experiment.waits import within
from sodaray.io.files import check_sqlite_url, shown_url
from sodaray.io.paths import component, inside

log = logging.getLogger(__name__)

INSTALL = "pip install 'sodaray[mlflow]'"
KIND_TAG = "sodaray.kind"  # "sweep" or "job"; "study" or "trial"
KEY_TAG = "sodaray.key"  # a hash of what the run is: how it is found again
PARENT_TAG = "mlflow.parentRunId"  # MLflow's own: the UI nests a child under its parent
NOTE_TAG = "mlflow.note.content"  # MLflow's own: the run's description in the UI
CURVE_POINTS = 50  # points of a found/exact-against-steps curve (fewer when the budget is less)
# MLflow's limits: values longer than these are refused; a batch holds at most so many entries.
PARAM_CHARS, TAG_CHARS = 6000, 5000
BATCH_PARAMS, BATCH_METRICS = 100, 1000
# MLflow's own defaults retry an HTTP request 7 times, backing off, each waiting up to 120 s.
# Where the environment does not set them, a check tries once and waits 10 s, and the run's own
# calls retry twice, each waiting as long: a server gone mid-run costs a tracking call about
# half a minute, then a warning, not hours.
CHECK_HTTP = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
RUN_HTTP = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
# The MLflow settings the user's environment gave before sodaray set any: theirs win.
_USER_SET = {name for name in CHECK_HTTP if name in os.environ}
MetricRow = tuple[str, float, int]  # (name, value, step)


def check_tracking(uri: str, experiment: str | None = None) -> None:
    """`--mlflow-experiment` a plain name (it names an artifact folder beside a database file),
    MLflow imported and the tracking URI reached, before any work starts and within about
    `CHECK_SECONDS` (`sodaray.experiment.waits`): a typo, an empty URI or a server that is down
    or never answers is one line now, not a failure (or a wait) after hours of trials."""
    if experiment is not None:
        component(experiment, "--mlflow-experiment")
    if not uri.strip():
        raise ValueError(
            "--mlflow: an empty tracking URI (give sqlite:///mlflow.db or http://HOST:5000, "
            "or leave out --mlflow)"
        )
    try:
        # The package itself first: a submodule already imported would be found without it.
        import mlflow  # noqa: F401
        from mlflow.tracking import MlflowClient
    except ImportError as exc:
        raise ValueError(f"--mlflow needs the `mlflow` package ({INSTALL}): {exc}") from exc
    check_sqlite_url(uri, "--mlflow")
    for name in ("mlflow", "alembic"):  # "Creating initial MLflow database tables..." etc.
        logging.getLogger(name).setLevel(logging.WARNING)
    shown = shown_url(uri)
    for name, value in RUN_HTTP.items():  # for the run's calls, after this check
        os.environ.setdefault(name, value)
    checking = {k: v for k, v in CHECK_HTTP.items() if k not in _USER_SET}
    saved = {k: os.environ[k] for k in checking}  # each set just above
    os.environ.update(checking)
    try:
        within(
            lambda: MlflowClient(tracking_uri=uri).search_experiments(max_results=1),
            f"--mlflow {shown}",
        )
    except TimeoutError as exc:
        raise ValueError(f"{exc} (is the tracking server up, and its address right?)") from exc
    except Exception as exc:  # MlflowException, connection errors, a bad scheme
        detail = first_line(exc).replace(uri, shown)  # MLflow's message names the URI whole
        raise ValueError(f"--mlflow {shown}: {detail}") from exc
    finally:
        os.environ.update(saved)


def guarded(name: str, call: Callable[..., Any]) -> Callable[..., None]:
    """A tracking call whose failure is a warning: a lost log line must not stop the work."""

    def guarded(*args: Any) -> None:
        try:
            call(*args)
        except Exception as exc:
            log.warning("MLflow %s failed (%s); the run goes on without it", name, exc)

    return guarded


def open_experiment(uri: str, name: str) -> tuple[Any, str]:
    """A client of `uri`, and the experiment named `name`, made if new. With a database file
    (`sqlite:///x/m.db`) its artifacts go beside that file (`x/mlartifacts/`), not into the
    working directory."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(name)
    if found is not None:
        return client, found.experiment_id
    location = None
    url = urlparse(uri)
    if url.scheme == "sqlite" and url.path not in ("", "/:memory:"):
        db = Path(uri.removeprefix("sqlite:///"))
        location = inside(db.absolute().parent / "mlartifacts", name).as_uri()
    return client, client.create_experiment(name, artifact_location=location)


def run_key(*parts: Any) -> str:
    """The hash a run is found by. Searched for instead of names, so a filter string never holds
    a study's or sweep's name (which may hold a quote)."""
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:32]


def find_run(
    client: Any, experiment: str, key: str, run_name: str, tags: dict, parent: str | None = None
) -> tuple[str, bool]:
    """(run id, is new): the run found by `key` in `experiment`, or a new one carrying `tags`
    (and its parent's id). A run found again gets its parent set, as a run logged before
    parents existed has none."""
    found = client.search_runs([experiment], filter_string=f"tags.`{KEY_TAG}` = '{key}'")
    tags = {**tags, KEY_TAG: key, **({} if parent is None else {PARENT_TAG: parent})}
    if not found:
        return client.create_run(experiment, run_name=run_name, tags=tags).info.run_id, True
    run = found[0]
    if parent is not None and run.data.tags.get(PARENT_TAG) != parent:
        client.set_tag(run.info.run_id, PARENT_TAG, parent)
    return run.info.run_id, False


def flat_params(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested configuration flattened into MLflow params: `params.temperature`,
    `objective.top_k`, `model.id`, ...; lists as JSON; values cut to MLflow's limit."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            out.update(flat_params(value, name))
        else:
            text = json.dumps(value, default=str) if isinstance(value, list | dict) else str(value)
            out[name] = text[:PARAM_CHARS]
    return out


def log_params(client: Any, run_id: str, params: dict[str, str]) -> None:
    """Log the params the run does not have yet: MLflow refuses to change a param, and a
    resumed sweep or study may bring other values for the same key (its `overrides`), which
    the run's tags and artifacts then show."""
    from mlflow.entities import Param

    have = client.get_run(run_id).data.params
    new = [Param(k, v) for k, v in params.items() if k not in have]
    for i in range(0, len(new), BATCH_PARAMS):
        client.log_batch(run_id, params=new[i : i + BATCH_PARAMS])


def log_metrics(client: Any, run_id: str, metrics: Iterable[MetricRow]) -> None:
    """(name, value, step) triples, in MLflow's batches, stamped now."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    batch = [Metric(name, float(value), now, int(step)) for name, value, step in metrics]
    for i in range(0, len(batch), BATCH_METRICS):
        client.log_batch(run_id, metrics=batch[i : i + BATCH_METRICS])


def set_tags(client: Any, run_id: str, tags: dict[str, Any]) -> None:
    from mlflow.entities import RunTag

    client.log_batch(run_id, tags=[RunTag(k, str(v)[:TAG_CHARS]) for k, v in tags.items()])


def log_files(client: Any, run_id: str, name: str, value: Any, settings: str | Path) -> None:
    """`value` as a JSON artifact named `name`, and the settings file the run was made from
    (when it is still there) under `settings/`."""
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, name).write_text(json.dumps(value, default=str, indent=1))
        client.log_artifact(run_id, str(Path(tmp, name)))
        if Path(settings).is_file():
            copy = Path(tmp, Path(settings).name)
            shutil.copy(settings, copy)
            client.log_artifact(run_id, str(copy), "settings")


def with_rates(counts: dict[str, Any], samples: float) -> dict[str, Any]:
    """`counts` and its found and exact shares of `samples` (0 when there are none)."""
    shares = {f"{k}_rate": counts[k] / samples if samples else 0.0 for k in ("found", "exact")}
    return counts | shares


def rate_curves(
    rows: Any, max_steps: int, samples: int | None = None
) -> list[tuple[int, float, float]]:
    """(step, found rate, exact rate) at `CURVE_POINTS` steps up to `max_steps` (or every step),
    exact from each row's `steps`. `samples`: the samples searched when the rows are only those
    that finished (a pruned trial's); the others found nothing."""
    import numpy as np

    from sodaray.report.metrics import solved_by_step

    if len(rows) == 0 or max_steps < 1:
        return []
    points = np.unique(np.linspace(0, max_steps, CURVE_POINTS + 1).round().astype(int))[1:]
    found = solved_by_step(rows, points, column="found")
    exact = solved_by_step(rows, points)
    if samples:  # solved_by_step's shares are of the rows (those whose truth is known)
        found = found * len(rows) / samples
        exact = exact * int(rows["exact"].notna().sum()) / samples
    return [(int(s), f, e) for s, f, e in zip(points, found, exact, strict=True)]


def rows_metrics(rows: Any, budget: int, step: int, samples: int | None = None) -> list[MetricRow]:
    """What a job's or a trial's rows show, under the same names for both, so a sweep's jobs
    and a study's trials line up in one chart: `found_by_step` and `exact_by_step` (curves up
    to `budget`; `samples` as `rate_curves`), and the mean final relaxed loss (at `step`)."""
    metrics = []
    for s, found, exact in rate_curves(rows, budget, samples):
        metrics += [("found_by_step", found, s), ("exact_by_step", exact, s)]
    return [*metrics, ("final_loss_mean", float(rows["final_loss"].mean()), step)]
