"""Studies that resume honestly: new points after a resume, no mixing of two tuning files in
one study, and no RUNNING trial left by a failed `ask` (Optuna journal storage, no Ray)."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import yaml
from conftest import STORIES

from sodaray.tuner import load_tuning
from sodaray.tuner.owner import ask_trial
from sodaray.tuner.study import open_study

pytestmark = pytest.mark.skipif(not STORIES.is_dir(), reason="stories260K not present")


def spec_for(tmp_path: Path, **overrides):
    spec = {
        "name": "resume",
        "model": {"id": str(STORIES)},
        "data": {"build": {"dataset": "random", "lengths": "1", "per_length": 2, "seed": 0}},
        "space": {"learning_rate": {"type": "float", "low": 0.01, "high": 0.5}},
        "max_steps": 5,
        "sampler": "random",
    }
    spec.update(overrides)
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(spec))
    return load_tuning(path)


def run_trials(study, distributions, n: int) -> list[float]:
    values = []
    for _ in range(n):
        trial = ask_trial(study, distributions)
        values.append(trial.params["learning_rate"])
        study.tell(trial.number, 0.0)
    return values


@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_a_resumed_study_proposes_new_points(tmp_path, sampler):
    spec = spec_for(tmp_path, sampler=sampler)
    url = str(tmp_path / "study.journal")
    study, _ = open_study(spec, url, "s")
    first = run_trials(study, spec.distributions(), 3)
    study, _ = open_study(spec, url, "s")  # "run again to add trials"
    second = run_trials(study, spec.distributions(), 3)
    assert not set(first) & set(second)
    # A new study with the same seed still replays the same points (reproducible runs).
    fresh, _ = open_study(spec, str(tmp_path / "other.journal"), "s")
    assert run_trials(fresh, spec.distributions(), 3) == first


def test_another_tuning_file_on_the_same_study_is_refused(tmp_path):
    url = str(tmp_path / "study.journal")
    study, _ = open_study(spec_for(tmp_path), url, "s")
    run_trials(study, spec_for(tmp_path).distributions(), 1)
    open_study(spec_for(tmp_path, trials=50, sampler="tpe"), url, "s")  # same trials: fine
    for changed in (
        {"max_steps": 6},
        {"metric": "exact_per_second"},
        {"space": {"decay": {"type": "float", "low": 0.5, "high": 1.0}}},
    ):
        with pytest.raises(ValueError, match="made by another tuning file"):
            open_study(spec_for(tmp_path, **changed), url, "s")


class _BrokenSampler(optuna.samplers.RandomSampler):
    def sample_independent(self, *args, **kwargs):
        raise RuntimeError("sampler broke")


def test_a_failed_ask_leaves_no_running_trial(tmp_path):
    spec = spec_for(tmp_path)
    url = str(tmp_path / "study.journal")
    study, _ = open_study(spec, url, "s")
    study.sampler = _BrokenSampler()
    with pytest.raises(RuntimeError, match="sampler broke"):
        ask_trial(study, spec.distributions())
    states = [t.state for t in study.get_trials(deepcopy=False)]
    assert states == [optuna.trial.TrialState.FAIL]
    # Resuming enqueues nothing for it (it has no parameters to retry).
    study, stale = open_study(spec, url, "s")
    assert stale == [] and run_trials(study, spec.distributions(), 1)


def test_a_stale_trial_without_all_its_parameters_is_not_re_enqueued(tmp_path):
    spec = spec_for(tmp_path)
    url = str(tmp_path / "study.journal")
    study, _ = open_study(spec, url, "s")
    study.ask()  # a driver that died between ask and sampling: RUNNING, no parameters
    study, stale = open_study(spec, url, "s")
    assert stale == [0]
    assert study.get_trials(states=(optuna.trial.TrialState.WAITING,)) == []
    trial = ask_trial(study, spec.distributions())
    assert set(trial.params) == {"learning_rate"}
