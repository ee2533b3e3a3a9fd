"""Optional MLflow tracking, off unless asked for (`--mlflow URI`): what sweeps
(`runner.tracking`) and studies (`tuner.cli`) share. Both packages are an extra
(`pip install 'sodaray[mlflow]'`): `mlflow-skinny` (the tracking client; a database URI such as
`sqlite:///mlflow.db` or a server's `http://HOST:5000`) and `optuna-integration`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sodaray.errors import first_line

log = logging.getLogger(__name__)

INSTALL = "pip install 'sodaray[mlflow]'"


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
        raise ValueError(f"--mlflow {uri}: {first_line(exc)}") from exc


def guarded(name: str, call: Callable[..., None]) -> Callable[..., None]:
    """A tracking call whose failure (a server gone mid-run) is a warning: the study's storage
    and the result files hold everything, and a lost log line must not stop trials in flight."""

    def guarded(*args: Any) -> None:
        try:
            call(*args)
        except Exception as exc:
            log.warning("MLflow %s failed (%s); the run goes on without it", name, exc)

    return guarded
