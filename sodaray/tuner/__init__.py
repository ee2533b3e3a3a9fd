"""The tuner: Optuna studies over an algorithm's parameters, trials on Ray actors, presets out.

Names are imported on first use (PEP 562): `sodaray --help` imports `sodaray.tuner.cli`,
which must not pull in torch through the tuning file's checks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sodaray._lazy import lazy_attributes

if TYPE_CHECKING:  # static checkers and IDEs see the real names
    from sodaray.tuner.run import TrialOutcome, TuneRun, run_tuning
    from sodaray.tuner.spec import ParamSpace, TuningError, TuningSpec, load_tuning

_SPEC = "sodaray.tuner.spec"
_RUN = "sodaray.tuner.run"
_LAZY: dict[str, str] = {
    "ParamSpace": _SPEC,
    "TuningError": _SPEC,
    "TuningSpec": _SPEC,
    "load_tuning": _SPEC,
    "TrialOutcome": _RUN,
    "TuneRun": _RUN,
    "run_tuning": _RUN,
}

__all__ = [
    "ParamSpace",
    "TrialOutcome",
    "TuneRun",
    "TuningError",
    "TuningSpec",
    "load_tuning",
    "run_tuning",
]


__getattr__, __dir__ = lazy_attributes("sodaray.tuner", globals(), _LAZY)
