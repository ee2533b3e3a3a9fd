"""The position scan (`sodaray.search.engine.scan`, `SodaConfig.scan_positions`): after a search's
budget, every single-token change of its final input, decided by the exact check."""

from __future__ import annotations

import pytest
import torch
from conftest import STORIES

import sodaray
from sodaray.objective.observations import BatchTargets
from sodaray.objective.scoring import hard_match
from sodaray.search.engine.scan import position_scan


def reproduces(model, targets, row, tokens) -> bool:
    batch = BatchTargets.from_set(targets, [row], model.device)
    t = torch.tensor([tokens])
    return bool(hard_match(model, targets.objective, t, batch, targets.atol, targets.rtol))


@pytest.mark.parametrize("position", [0, 1, 2])
def test_one_token_off_is_found_at_its_position(tiny_llama, position):
    """An input one token off at any position: the scan returns a change that reproduces the
    target (the true input here: a random model's outputs do not collide within 1e-4), at that
    position, with chunks smaller than the vocabulary."""
    true = [5, 17, 40]
    targets = sodaray.make_targets(tiny_llama, [true])
    off = list(true)
    off[position] = (true[position] + 7) % tiny_llama.vocab_size
    assert not reproduces(tiny_llama, targets, 0, off)
    hit = position_scan(tiny_llama, targets, 0, off, chunk=10)
    assert hit == true and reproduces(tiny_llama, targets, 0, hit)


def test_two_tokens_off_is_not_found(tiny_llama):
    true = [5, 17, 40]
    targets = sodaray.make_targets(tiny_llama, [true])
    assert position_scan(tiny_llama, targets, 0, [6, 18, 40]) is None


def test_the_knob_stays_out_of_the_job_hash_when_off():
    off = sodaray.SodaConfig()
    assert "scan_positions" not in off.to_dict()
    on = sodaray.SodaConfig(scan_positions=True)
    assert on.to_dict()["scan_positions"] is True
    assert sodaray.SodaConfig.from_dict(on.to_dict()) == on


@pytest.mark.skipif(not STORIES.is_dir(), reason="../shared/models/stories260K absent")
def test_a_search_that_ends_unfound_is_scanned_in_the_engine():
    """One step is not enough to find length-1 inputs; with the scan every one is found (at
    length 1 the scan is a brute force), each reproducing its target, and the steps stay the
    search's own. Without it the same searches mostly end unfound."""
    model = sodaray.load_model(str(STORIES), device="cpu", bos=True)
    inputs = [[t] for t in (3, 77, 150, 298, 401, 511)]
    targets = sodaray.make_targets(model, inputs)
    plain = sodaray.invert(model, targets, sodaray.SodaConfig(max_steps=1))
    assert sum(r.found for r in plain) < len(inputs)
    scanned = sodaray.invert(model, targets, sodaray.SodaConfig(max_steps=1, scan_positions=True))
    assert all(r.found for r in scanned)
    assert all(reproduces(model, targets, i, r.tokens) for i, r in enumerate(scanned))
    assert [r.steps for r in scanned] == [1] * len(inputs)
