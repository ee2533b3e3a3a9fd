"""The sweep runner: sweep files (YAML) -> jobs -> Ray actors -> sharded, resumable Parquet."""

from sodaray.runner.execute import (
    JobStatus,
    ShardDone,
    ShardFailed,
    SweepInterrupted,
    SweepRun,
    run_sweep,
    sweep_status,
)
from sodaray.runner.spec import DatasetSpec, Job, ModelSpec, Sweep, SweepError, load_sweep

__all__ = [
    "DatasetSpec",
    "Job",
    "JobStatus",
    "ModelSpec",
    "ShardDone",
    "ShardFailed",
    "Sweep",
    "SweepError",
    "SweepInterrupted",
    "SweepRun",
    "load_sweep",
    "run_sweep",
    "sweep_status",
]
