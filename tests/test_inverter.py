"""The learned inverter: a 2-layer T5 trained for a few steps on a tiny model's outputs, saved,
resumed, and run behind `sodaray.invert` in the common result schema."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest
import torch

import sodaray
from sodaray.api import make_config
from sodaray.inverter.train import TrainConfig, load_inverter, train_inverter
from sodaray.search.engine.base import InversionResult


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
    assert [r.predicted_length for r in results] == [2, 1, 2]
    assert all(isinstance(r, InversionResult) for r in results)
    assert {f.name for f in fields(InversionResult)} == set(results[0].to_dict())
    assert all(r.algorithm == "inverter" and len(r.tokens) == r.predicted_length for r in results)
    assert all(0 <= t < tiny_llama.vocab_size for r in results for t in r.tokens)
    assert results[0].params["init"].startswith("random")


def test_inverter_needs_checkpoint():
    with pytest.raises(ValueError, match="checkpoint"):
        make_config("inverter", {})


def test_logits_inverter_one_step_and_round_trip(tiny_llama, tmp_path, one_thread):
    """The paper's logits inverter: unigram-adapted log-probs in 8 slices through an MLP; one
    AdamW step changes every weight, the unigram is the batch mean, and a saved checkpoint
    loads back to the same function."""
    from sodaray.inverter.train import build_inverter, build_pairs, save_inverter

    cfg = TrainConfig(
        lengths=(1, 2), per_length=8, output_tokens=1, epochs=1, batch_size=16,
        warmup_steps=1, shape="tiny", observation="logits", mlp_hidden=16, pieces=8,
    )  # fmt: skip
    out = tmp_path / "logits"
    state = train_inverter(tiny_llama, cfg, out)
    assert state["sched_step"] == 1  # 16 pairs, 1 for validation: one batch, one step
    net, meta = load_inverter(out / "last")
    assert meta.observation == "logits" and meta.mlp_hidden == 16 and meta.pieces == 8
    assert net.logits_encoder is not None

    # The same initial weights as training drew (same seed, nothing else uses torch's RNG).
    torch.manual_seed(cfg.seed)
    init = build_inverter(meta)
    trained = dict(net.named_parameters())
    changed = [n for n, p in init.named_parameters() if not torch.equal(p, trained[n])]
    assert changed == list(trained) and "logits_encoder.mlp.0.weight" in changed

    # The first batch sets the unigram vector: the mean log-probabilities of the training rows.
    inputs, _, seen = build_pairs(tiny_llama, [1, 2], 8, 1, cfg.seed, keep_logits=True)
    perm = torch.randperm(len(inputs), generator=torch.Generator().manual_seed(cfg.seed))
    expected = seen[perm[1:]].log_softmax(-1).mean(dim=(0, 1))
    torch.testing.assert_close(net.logits_encoder.unigram, expected)

    # Round trip: saved again and reloaded, the network computes the same thing.
    save_inverter(tmp_path / "copy", net, meta)
    again, _ = load_inverter(tmp_path / "copy")
    x = seen[:4]
    labels = torch.tensor([[1, 2, meta.eos_id]] * 4)
    with torch.no_grad():
        emb = net.encoder_inputs(x)["inputs_embeds"]
        assert emb.shape == (4, 8, net.t5.config.d_model)  # 64 vocab / 8 slices, one position
        torch.testing.assert_close(again.encoder_inputs(x)["inputs_embeds"], emb)
        torch.testing.assert_close(again(x, labels), net(x, labels))

    # Behind sodaray.invert: logits targets work, text targets are refused by name.
    tokens = [[1, 2], [3]]
    obj = sodaray.Objective(kind="logits", output_tokens=1)
    targets = sodaray.make_targets(tiny_llama, tokens, objective=obj)
    config = make_config("inverter", {"checkpoint": str(out / "last")})
    results = sodaray.invert(tiny_llama, targets, config)
    assert [r.predicted_length for r in results] == [2, 1]
    assert results[0].params["observation"] == "logits"
    text = sodaray.make_targets(tiny_llama, tokens, objective=sodaray.Objective(kind="text"))
    with pytest.raises(ValueError, match="logits objective"):
        sodaray.invert(tiny_llama, text, config)
