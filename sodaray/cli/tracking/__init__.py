"""Optional MLflow tracking, off unless asked for (`--mlflow URI` on `sweep run` and `tune`).

The extra is `pip install 'sodaray[mlflow]'` (the `mlflow` package: the tracking client, and
`mlflow ui` / `mlflow server` to look at the runs). A URI is a database (`sqlite:///mlflow.db`,
artifacts beside it in `mlartifacts/`) or a server (`http://HOST:5000`). The experiment is the
sweep's or study's name, or `--mlflow-experiment NAME` (several sweeps and studies side by side).
A sweep (`sweep.py`) is a parent run with a child run per job; a study (`study.py`) a parent run
with a child run per trial, under the same param and metric names as a job.

Runs are found again by a hash of what they are (`store.run_key`), so a resumed sweep or study
updates its runs instead of adding new ones. A tracking failure mid-run (a server gone) is a
warning: the result files and the study hold everything. MLflow's own start-up lines are held
below WARNING so they do not break the progress bars.
"""
