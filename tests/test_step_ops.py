"""What a SODA step launches outside the model's layers (issue 41: at most 30 operations, from
about 123), counted as `../shared/tools/opcount.py` and `benchmarks/step_ops.py` count them:
torch.profiler on CPU, operations that do work, over ten steps; outside = 2 ops(1 layer) -
ops(2 layers). The count depends on the model's architecture and the step's code paths, not on
its widths, so small models of the measured shapes stand in for them (their batch of 96 rows
clears every row-invariance threshold `padding.row_rule(device)[0]` gives, as the benchmark's 64
do on one thread)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from step_ops import ops_per_step  # noqa: E402


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("shape, bos, most", [("neo", False, 30), ("neo", True, 31)])
def test_outside_the_layers(one_thread, shape, bos, most):
    one = ops_per_step(shape, 1, bos, small=True)
    two = ops_per_step(shape, 2, bos, small=True)
    outside = 2 * one - two
    assert outside <= most, (one, two)
    assert two > one  # the count sees the layers at all
