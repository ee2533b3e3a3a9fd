"""The tuner: Optuna studies over an algorithm's parameters, trials on Ray actors, presets out.

Names are imported on first use (PEP 562): `sodaray --help` imports `sodaray.cli.tune`,
which must not pull in torch through the tuning file's checks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sodaray._lazy import lazy_attributes

if TYPE_CHECKING:  # static checkers and IDEs see the real names (exported by `__all__`)
    from sodaray.experiment.spec import TuningError  # noqa: F401
    from sodaray.tuner.run import TrialOutcome, TuneRun, run_tuning  # noqa: F401
    from sodaray.tuner.spec import ParamSpace, TuningSpec, load_tuning  # noqa: F401

_MODULES = {  # the module that defines each public name
    "sodaray.experiment.spec": ("TuningError",),
    "sodaray.tuner.spec": ("ParamSpace", "TuningSpec", "load_tuning"),
    "sodaray.tuner.run": ("TrialOutcome", "TuneRun", "run_tuning"),
}
_LAZY = {name: module for module, names in _MODULES.items() for name in names}
__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_attributes("sodaray.tuner", globals(), _LAZY)
