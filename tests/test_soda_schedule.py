"""`temperature_end`: SODA's temperature annealed over a search's budget (not in the paper; off
by default). Its formula, its neutrality when off (results and job hashes as before), and its
independence of what shares the batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import STORIES, tiny_model
from soda_ops import apply_schedules

import sodaray
from sodaray.runner import load_sweep
from sodaray.search.engine.base import SlotEntry
from sodaray.search.engine.loop import Engine
from sodaray.search.engine.work import Work
from sodaray.search.soda.batch import SodaBatch


def test_the_schedule_is_geometric_from_start_to_end():
    """The device's schedule (`soda_step.schedules`): after step t, the next step's temperature
    is start * (end / start) ** (t / budget), held at the end past the budget."""
    model = tiny_model("qwen2")
    targets = sodaray.make_targets(model, [[3]])
    cfg = sodaray.SodaConfig(temperature=0.2, temperature_end=0.02, max_steps=100)
    batch = SodaBatch(model)
    batch.add([SlotEntry(targets, 0, 1, cfg)])
    at = []
    for t in (0, 50, 100, 150):
        apply_schedules(batch, np.array([t]))
        at.append(batch.state.column("h32", "tau", 1).item())
    assert at[0] == pytest.approx(0.2) and at[2] == pytest.approx(0.02)
    assert at[1] == pytest.approx((0.2 * 0.02) ** 0.5)  # halfway: the geometric mean
    assert at[3] == pytest.approx(0.02)  # held at the end past the budget


def test_off_by_default_and_out_of_the_hash():
    assert "temperature_end" not in sodaray.SodaConfig().to_dict()
    assert sodaray.SodaConfig(temperature_end=0.01).to_dict()["temperature_end"] == 0.01
    with pytest.raises(ValueError, match="temperature_end must be positive"):
        sodaray.SodaConfig(temperature_end=0.0)


@pytest.mark.skipif(not STORIES.parent.is_dir(), reason="shared models not present")
def test_existing_jobs_keep_their_folders():
    """The option's arrival changes no job's hash: results folders written before it resume.
    (Issue 39 wrote the quickstart's model path from the sweep's folder; its old spelling, read
    from the repository root, still names the old folders. Issue 38 gave a model without a
    preset its family's defaults, which changes the quickstart's jobs; naming the preset SODA's
    own defaults equal gives back the jobs of before.)"""
    old = ["models.0.id=../shared/models/stories260K", "models.0.preset=tinystories-33m"]
    names = [j.name for j in load_sweep("sweeps/quickstart.yaml", overrides=old).jobs()]
    assert [n.rsplit("-", 1)[1] for n in names] == ["5b9ce690", "7ca78dd6"]


def outcome(results) -> list:
    return [(r.tokens, r.found, r.steps, r.final_loss) for r in results]


def test_annealing_changes_the_search_but_not_its_neighbours(one_thread):
    model = tiny_model("llama")
    targets = sodaray.make_targets(model, [[i, (5 * i + 1) % 64] for i in range(8)])

    def run(*configs) -> list:
        engine = Engine(model)
        works = [Work(targets, c, [(2,)] * 8) for c in configs]
        for w in works:
            engine.submit(w)
        engine.run()
        return [outcome(w.ordered()) for w in works]

    constant = sodaray.SodaConfig(max_steps=120, temperature=0.1, seed=3)
    same = sodaray.SodaConfig(max_steps=120, temperature=0.1, temperature_end=0.1, seed=3)
    annealed = sodaray.SodaConfig(max_steps=120, temperature=0.3, temperature_end=0.03, seed=3)
    (alone,) = run(constant)
    assert run(same) == [alone]  # an end equal to the start is the constant temperature
    (annealed_alone,) = run(annealed)
    (start_only,) = run(sodaray.SodaConfig(max_steps=120, temperature=0.3, seed=3))
    assert annealed_alone != start_only  # the temperature moved during the search
    # Sharing one batch, each search is what it was alone.
    assert run(constant, annealed) == [alone, annealed_alone]
    assert torch.get_num_threads() == 1
