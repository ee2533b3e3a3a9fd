"""The tuner: Optuna studies over an algorithm's parameters, trials on Ray actors, presets out."""

from sodaray.tuner.spec import ParamSpace, TuningError, TuningSpec, load_tuning
from sodaray.tuner.study import TrialOutcome, TuneRun, run_tuning

__all__ = [
    "ParamSpace",
    "TrialOutcome",
    "TuneRun",
    "TuningError",
    "TuningSpec",
    "load_tuning",
    "run_tuning",
]
