"""The learned inverter: a 2-layer T5 trained for a few steps on a tiny model's outputs, saved,
resumed, and run behind `sodaray.invert` in the common result schema."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest

import sodaray
from sodaray.api import make_config
from sodaray.inverter.model import load_inverter
from sodaray.inverter.train import TrainConfig, train_inverter
from sodaray.search.base import InversionResult


def _cfg(epochs: int) -> TrainConfig:
    return TrainConfig(
        lengths=(1, 2),
        per_length=40,
        output_tokens=3,
        epochs=epochs,
        batch_size=16,
        warmup_steps=2,
        shape="tiny",
    )


def test_train_resume_and_invert(tiny_llama, tmp_path, one_thread):
    out = tmp_path / "inv"
    state = train_inverter(tiny_llama, _cfg(1), out)
    assert state["epoch"] == 1 and len(state["history"]) == 1
    # Resume: a second run with more epochs continues from epoch 1, keeping the history.
    state = train_inverter(tiny_llama, _cfg(2), out)
    assert state["epoch"] == 2
    assert [h["epoch"] for h in json.loads((out / "state.json").read_text())["history"]] == [1, 2]
    net, meta = load_inverter(out / "best")
    assert meta.llm_vocab_size == tiny_llama.vocab_size and meta.output_tokens == 3

    tokens = [[1, 2], [3], [4, 5]]
    targets = sodaray.make_targets(tiny_llama, tokens)
    config = make_config("inverter", {"checkpoint": str(out / "best")})
    results = sodaray.invert(tiny_llama, targets, config)
    assert [r.length for r in results] == [2, 1, 2]
    assert all(isinstance(r, InversionResult) for r in results)
    assert {f.name for f in fields(InversionResult)} == set(results[0].to_dict())
    assert all(r.algorithm == "inverter" and len(r.tokens) == r.length for r in results)
    assert all(0 <= t < tiny_llama.vocab_size for r in results for t in r.tokens)
    assert results[0].params["init"].startswith("random")


def test_inverter_needs_checkpoint():
    with pytest.raises(ValueError, match="checkpoint"):
        make_config("inverter", {})
