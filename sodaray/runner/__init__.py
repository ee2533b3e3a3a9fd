"""The sweep runner: sweep files (YAML) -> jobs -> Ray actors -> sharded, resumable Parquet.

Names are imported on first use (PEP 562): `sodaray --help` imports `sodaray.runner.cli`,
which must not pull in torch and Ray through `execute`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sodaray._lazy import lazy_attributes

if TYPE_CHECKING:  # static checkers and IDEs see the real names
    from sodaray.runner.layout import JobStatus, sweep_status
    from sodaray.runner.run import ShardDone, ShardFailed, SweepInterrupted, SweepRun, run_sweep
    from sodaray.runner.spec import DatasetSpec, Job, ModelSpec, Sweep, SweepError, load_sweep

_RUN = "sodaray.runner.run"
_LAYOUT = "sodaray.runner.layout"
_SPEC = "sodaray.runner.spec"
_LAZY: dict[str, str] = {
    "JobStatus": _LAYOUT,
    "ShardDone": _RUN,
    "ShardFailed": _RUN,
    "SweepInterrupted": _RUN,
    "SweepRun": _RUN,
    "run_sweep": _RUN,
    "sweep_status": _LAYOUT,
    "DatasetSpec": _SPEC,
    "Job": _SPEC,
    "ModelSpec": _SPEC,
    "Sweep": _SPEC,
    "SweepError": _SPEC,
    "load_sweep": _SPEC,
}

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


__getattr__, __dir__ = lazy_attributes("sodaray.runner", globals(), _LAZY)
