"""Optional MLflow tracking, off unless asked for (`--mlflow URI` on `sweep run` and `tune`;
`pip install 'sodaray[mlflow]'`). A sweep (`sweep.py`) is a parent run with a child run per job,
a study (`study.py`) a parent run with a child run per trial under a job's param and metric
names. Runs are found again by a hash of what they are (`store.run_key`), so a resumed sweep or
study updates its runs; a tracking failure mid-run is a warning (the result files and the study
hold everything). See docs/mlflow.md.
"""
