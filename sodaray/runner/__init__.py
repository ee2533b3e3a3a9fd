"""The sweep runner: sweep files (YAML) -> jobs -> Ray actors -> sharded, resumable Parquet.

Names are imported on first use (PEP 562): `sodaray --help` imports `sodaray.cli.sweep`,
which must not pull in torch and Ray through `runner.run`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sodaray._lazy import lazy_attributes

if TYPE_CHECKING:  # static checkers and IDEs see the real names (exported by `__all__`)
    from sodaray.experiment.spec import DatasetSpec, ModelSpec, SweepError  # noqa: F401
    from sodaray.runner.run import ShardDone, ShardFailed, SweepInterrupted, SweepRun, run_sweep  # noqa: F401
    from sodaray.runner.spec import Job, Sweep, load_sweep  # noqa: F401
    from sodaray.runner.status import JobStatus, sweep_status  # noqa: F401

_MODULES = {  # the module that defines each public name
    "sodaray.runner.run": ("ShardDone", "ShardFailed", "SweepInterrupted", "SweepRun", "run_sweep"),
    "sodaray.runner.status": ("JobStatus", "sweep_status"),
    "sodaray.runner.spec": ("Job", "Sweep", "load_sweep"),
    "sodaray.experiment.spec": ("DatasetSpec", "ModelSpec", "SweepError"),
}
_LAZY = {name: module for module, names in _MODULES.items() for name in names}
__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_attributes("sodaray.runner", globals(), _LAZY)
