"""Fields a run never reads make no other job, and sweep entries that a reader could not tell
apart are refused: what the hostile-input rows refuse, seen from the side that must still work."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import STORIES
from test_hostile_input import sweep_text

from sodaray.experiment.spec import SweepError
from sodaray.objective.objectives import Objective
from sodaray.runner import load_sweep

pytestmark = pytest.mark.skipif(not STORIES.is_dir(), reason="stories260K not present")


def _sweep(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(text.replace("{model}", str(STORIES)))
    return path


def test_huber_delta_under_mse_hashes_as_the_default():
    mse = Objective(loss="mse", huber_delta=2.0)
    assert mse.identity() == Objective(loss="mse").identity()
    assert mse.identity()["huber_delta"] == 1.0  # an older mse job keeps its hash
    assert Objective(huber_delta=2.0).identity() != Objective().identity()  # huber reads it


def test_a_loss_grid_keeps_its_huber_delta_and_makes_each_mse_job_once(tmp_path):
    objective = "objectives: [{kind: logits, huber_delta: 2, grid: {loss: [huber, mse]}}]\n"
    jobs = load_sweep(_sweep(tmp_path, sweep_text(extra=objective))).jobs()
    assert sorted(j.objective.loss for j in jobs) == ["huber", "mse"]
    deltas = "objectives: [{kind: logits, grid: {loss: [huber, mse], huber_delta: [1, 2]}}]\n"
    jobs = load_sweep(_sweep(tmp_path, sweep_text(extra=deltas))).jobs()
    assert sorted(j.objective.loss for j in jobs) == ["huber", "huber", "mse"]


def test_a_huber_delta_no_combination_reads_is_refused(tmp_path):
    objective = "objectives: [{kind: logits, grid: {loss: [mse], huber_delta: [1, 2]}}]\n"
    with pytest.raises(SweepError, match=r"objectives\[0\]\.grid\.huber_delta"):
        load_sweep(_sweep(tmp_path, sweep_text(extra=objective)))


def test_models_of_one_id_without_names_are_still_two_entries(tmp_path):
    models = '{id: "{model}"}, {id: "{model}", bos: true}'
    sweep = load_sweep(_sweep(tmp_path, sweep_text(model=models)))
    assert len(sweep.models) == 2
    named = '{id: "{model}", name: a}, {id: "{model}", name: a}'
    with pytest.raises(SweepError, match=r"models\[0\] and models\[1\] are both named 'a'"):
        load_sweep(_sweep(tmp_path, sweep_text(model=named)))
