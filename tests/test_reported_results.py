"""What `invert` reports is what happened: `found` only for inputs that reproduce the
observation (checked by an independent referee, `oracle.py`), step and second totals summed
over the lengths tried, and the wall-clock budget obeyed."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import tiny_model
from oracle import misreports, reproduces

import sodaray
from sodaray.search.engine import pool
from sodaray.search.soda.batch import SodaBatch

REACHABLE = [[5], [18], [33], [50]]

ALGORITHMS = {
    "soda": sodaray.SodaConfig(max_steps=150),
    "gcg": sodaray.GcgConfig(max_steps=12, num_candidates=64, tokens_per_position=16),
    "embedding": sodaray.EmbeddingConfig(max_steps=150),
}
OBJECTIVES = {
    "logits": sodaray.Objective(),
    "top-k": sodaray.Objective(top_k=5, output_tokens=2),
    "text": sodaray.Objective(kind="text", output_tokens=2),
}


@pytest.fixture(scope="module")
def gpt2() -> sodaray.LoadedModel:
    return tiny_model("gpt2")


def with_unreachable_target(model, objective: sodaray.Objective):
    """Targets for REACHABLE plus a last one that no single-token input produces."""
    targets = sodaray.make_targets(model, REACHABLE + [[0]], objective=objective)
    if objective.kind == "text":
        every = sodaray.objective.targets.greedy_continuation(
            model, torch.arange(model.vocab_size)[:, None], objective.output_tokens
        )[0]
        produced = {tuple(row.tolist()) for row in every}
        unseen = next(
            (a, b)
            for a in range(model.vocab_size)
            for b in range(model.vocab_size)
            if (a, b) not in produced
        )
        targets.continuation[-1] = torch.tensor(unseen)
    else:
        targets.observed_values[-1, 0, 0] += 1.0  # far outside the tolerance
    # The true inputs stay known, so `exact` is refereed too (text: found is often not exact).
    for row in range(len(REACHABLE)):
        assert reproduces(model, targets, row, REACHABLE[row])
    assert not any(reproduces(model, targets, -1, [t]) for t in range(model.vocab_size))
    return targets


@pytest.mark.parametrize("objective", OBJECTIVES.values(), ids=OBJECTIVES.keys())
@pytest.mark.parametrize("config", ALGORITHMS.values(), ids=ALGORITHMS.keys())
def test_found_means_the_referee_reproduces_the_observation(gpt2, objective, config):
    """Both ways: every found result reproduces the observation, and no unfound one does."""
    targets = with_unreachable_target(gpt2, objective)
    results = sodaray.invert(gpt2, targets, config, length=1)
    assert misreports(gpt2, targets, results) == []
    assert not results[-1].found and results[-1].steps == config.max_steps
    if (config.algorithm, objective.kind) != ("embedding", "text"):  # it solves none there
        assert any(r.found for r in results)


def test_the_referee_catches_misreported_results(gpt2):
    """Each way of lying about a result is caught (the check above can fail)."""
    targets = sodaray.make_targets(gpt2, REACHABLE + [[0]], objective=OBJECTIVES["top-k"])
    targets.observed_values[-1, 0, 0] += 1.0
    honest = sodaray.invert(gpt2, targets, ALGORITHMS["soda"], length=1)
    assert misreports(gpt2, targets, honest) == []
    assert honest[0].found and not honest[-1].found
    lies = {
        "found, but it is not": (-1, {"found": True}),
        "not found, but it is": (0, {"found": False}),
        "found, with other tokens": (0, {"tokens": REACHABLE[1], "exact": False}),
        "exact, but it is not": (0, {"exact": False}),
        "another target's result": (0, {"sample_id": 1}),
    }
    for lie, (row, change) in lies.items():
        doctored = list(honest)
        doctored[row] = dataclasses.replace(honest[row], **change)
        assert misreports(gpt2, targets, doctored), lie


@pytest.fixture
def step_clock(monkeypatch):
    """The pool's clock advances one second per SODA step, and only then: a result's seconds
    must equal its steps, and a wall-clock budget of s seconds is exactly s steps."""

    class StepClock:
        now = 0.0

        def perf_counter(self) -> float:
            return self.now

    clock = StepClock()
    monkeypatch.setattr(pool, "time", clock)
    original = SodaBatch.step

    def step(self, steps_after):
        clock.now += 1.0
        return original(self, steps_after)

    monkeypatch.setattr(SodaBatch, "step", step)
    return clock


def test_auto_length_sums_steps_and_seconds_over_the_lengths_tried(gpt2, step_clock):
    targets = sodaray.make_targets(gpt2, [[0], [7, 40], [12]])
    targets.observed_values[0, 0, 0] += 1.0  # target 0 is never found
    budget = 120
    results = sodaray.invert(
        gpt2, targets, sodaray.SodaConfig(max_steps=budget), length="auto", max_length=3
    )
    never, pair, single = results
    assert not never.found and never.lengths_tried == [1, 2, 3]
    assert never.steps == 3 * budget
    assert pair.found and pair.lengths_tried == [1, 2]
    assert budget < pair.steps <= 2 * budget
    assert single.found and single.lengths_tried == [1] and single.steps <= budget
    for r in results:
        assert r.seconds == r.steps, r


def test_max_seconds_ends_each_search(gpt2, step_clock):
    targets = sodaray.make_targets(gpt2, [[0], [1], [2]])
    targets.observed_values[:, 0, 0] += 1.0  # none can be found: only the budgets end them
    cfg = sodaray.SodaConfig(max_steps=1000, max_seconds=7.0, max_batch_size=2)
    results = sodaray.invert(gpt2, targets, cfg)
    assert [(r.found, r.steps, r.seconds) for r in results] == [(False, 7, 7.0)] * 3


def test_max_seconds_in_real_time(gpt2):
    targets = sodaray.make_targets(gpt2, [[0]])
    targets.observed_values[0, 0, 0] += 1.0
    cfg = sodaray.SodaConfig(max_steps=5000, max_seconds=0.05)
    [r] = sodaray.invert(gpt2, targets, cfg)
    assert not r.found and 0.05 <= r.seconds and r.steps < 5000


def test_a_refilled_slot_checks_its_new_target_afresh(gpt2):
    """The same observation twice through a one-slot pool: the second search's first candidate
    equals the first search's answer, and must still be checked (for the new target)."""
    cfg = sodaray.SodaConfig(max_steps=50, max_batch_size=1)
    # A token found at the first step in a one-slot pool (which tokens are depends on the last
    # bit of the CPU's matmuls: the first step's candidates are near-ties), else the slot's last
    # check differs from the second search's first anyway.
    every = sodaray.make_targets(gpt2, [[t] for t in range(gpt2.vocab_size)])
    one_step = dataclasses.replace(cfg, max_steps=1)
    at_once = [r for r in sodaray.invert(gpt2, every, one_step) if r.found]
    assert at_once, "no token is found at the first step"
    token = at_once[0].true_tokens[0]
    targets = sodaray.make_targets(gpt2, [[token], [token]])
    first, second = sodaray.invert(gpt2, targets, cfg)
    assert first.found and first.steps == 1
    assert (second.found, second.steps, second.tokens) == (True, 1, first.tokens)
