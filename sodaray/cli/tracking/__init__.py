"""Optional MLflow tracking, off unless asked for (`--mlflow URI` on `sweep run` and `tune`).

The extra is `pip install 'sodaray[mlflow]'` (the `mlflow` package: the tracking client, and
`mlflow ui` / `mlflow server` to look at the runs). A URI is a database (`sqlite:///mlflow.db`,
artifacts beside it in `mlartifacts/`) or a server (`http://HOST:5000`). The experiment is the
sweep's or study's name, or `--mlflow-experiment NAME` (several sweeps and studies side by side).

- a sweep (`sweep.py`): a parent run `sweep NAME` (its settings as params; its report, status
  and file as artifacts; its totals) with a child run per job, named as the job's folder, with
  the job's whole configuration as params, its counts, and curves against steps.
- a study (`study.py`): a parent run `study NAME` (its settings, space and how it searches as
  params; its history of values by trial; its leaderboard, plots, best preset and tuning file
  as artifacts) with a child run per trial, logged as the trial ends, under the same param and
  metric names as a job, plus its sampled values (`sampled.*`) and pruning checkpoints.

Runs are found again by a hash of what they are (`store.run_key`), so a resumed sweep or study
updates its runs instead of adding new ones. A tracking failure mid-run (a server gone) is a
warning: the result files and the study hold everything. MLflow's own start-up lines are held
below WARNING so they do not break the progress bars.
"""

from sodaray.cli.tracking.store import INSTALL, check_tracking
from sodaray.cli.tracking.study import StudyTracker
from sodaray.cli.tracking.sweep import log_sweep, sweep_logger

__all__ = ["INSTALL", "StudyTracker", "check_tracking", "log_sweep", "sweep_logger"]
