"""Objectives: zero at the true input, positive elsewhere; only observed entries count."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sodaray
from sodaray.objective.observations import BatchTargets, observation
from sodaray.objective.scoring import Layout, context_embeds, hard_match, objective_loss

OBJECTIVES = [
    sodaray.Objective(),
    sodaray.Objective(top_k=5),
    sodaray.Objective(output_tokens=3),
    sodaray.Objective(top_k=4, output_tokens=2, loss="mse"),
    sodaray.Objective(kind="text", output_tokens=3),
    sodaray.Objective(fluency_weight=0.0),
    sodaray.Objective(space="centred"),
    sodaray.Objective(space="centred", top_k=4, output_tokens=2),
    sodaray.Objective(space="logprobs"),
    sodaray.Objective(space="logprobs", top_k=5),
]


def one_hot_loss(model, targets, tokens, objective=None):
    objective = objective or targets.objective
    x = torch.tensor(tokens)
    probs = torch.nn.functional.one_hot(x, model.vocab_size).float()
    batch = BatchTargets.from_set(targets, np.arange(len(tokens)), model.device)
    hidden = model.hidden(context_embeds(model, probs @ model.embedding_matrix, batch))
    layout = Layout.uniform(x.shape[0], x.shape[1], model.device)
    return objective_loss(
        model, objective, hidden, layout, batch, probs.reshape(-1, probs.shape[-1])
    )


def batch_of(targets, rows):
    return BatchTargets.from_set(targets, np.asarray(rows), torch.device("cpu"))


@pytest.mark.parametrize(
    "objective",
    OBJECTIVES,
    ids=lambda o: f"{o.kind}-{o.space}-k{o.top_k}-m{o.output_tokens}-{o.loss}",
)
def test_zero_at_true_input_positive_elsewhere(tiny_llama, objective):
    true = [[3, 9, 4], [10, 11, 12]]
    targets = sodaray.make_targets(tiny_llama, true, objective=objective)
    at_true = one_hot_loss(tiny_llama, targets, true)
    assert torch.all(at_true.abs() < 1e-5), at_true
    other = [[3, 9, 5], [11, 11, 12]]
    elsewhere = one_hot_loss(tiny_llama, targets, other)
    if objective.kind == "text":  # a different input may keep the same greedy text
        assert torch.all(elsewhere >= 0)
    else:
        assert torch.all(elsewhere > 1e-4), elsewhere
    assert hard_match(
        tiny_llama,
        objective,
        torch.tensor(true),
        batch_of(targets, [0, 1]),
        targets.atol,
        targets.rtol,
    ).all()
    if objective.kind == "logits":
        assert not hard_match(
            tiny_llama,
            objective,
            torch.tensor(other),
            batch_of(targets, [0, 1]),
            targets.atol,
            targets.rtol,
        ).any()


def test_top_k_loss_ignores_unobserved_logits(tiny_llama):
    objective = sodaray.Objective(top_k=3)
    targets = sodaray.make_targets(tiny_llama, [[5, 6]], objective=objective)
    assert targets.observed_values.shape == (1, 1, 3)
    full = tiny_llama.token_logits(torch.tensor([[5, 6]]))[0, -1]
    top = full.topk(3)
    torch.testing.assert_close(targets.observed_values[0, 0], top.values)
    assert torch.equal(targets.observed_indices[0, 0], top.indices)
    # The loss of a candidate equals the Huber loss over the 3 observed entries only.
    cand = [[7, 8]]
    cand_logits = tiny_llama.token_logits(torch.tensor(cand))[0, -1]
    expected = torch.nn.functional.huber_loss(cand_logits[top.indices], top.values)
    torch.testing.assert_close(
        one_hot_loss(tiny_llama, targets, cand)[0], expected, rtol=1e-4, atol=1e-6
    )


def test_top_k_match_needs_same_top_set(tiny_llama):
    objective = sodaray.Objective(top_k=3, atol=1e9, rtol=0)  # values always "close"
    targets = sodaray.make_targets(tiny_llama, [[5, 6]], objective=objective)
    batch = batch_of(targets, [0])
    assert hard_match(tiny_llama, objective, torch.tensor([[5, 6]]), batch, 1e9, 0).item()
    # A candidate whose own top-3 differs fails even with the loosest value tolerance.
    others = torch.tensor([[a, b] for a in range(20) for b in range(3)])
    own = tiny_llama.token_logits(others)[:, -1].topk(3).indices.sort(-1).values
    differs = ~(own == targets.observed_indices[0, 0].sort().values).all(-1)
    b = BatchTargets(
        batch.continuation.expand(len(others), -1),
        batch.observed_values.expand(len(others), -1, -1),
        batch.observed_indices.expand(len(others), -1, -1),
    )
    matched = hard_match(tiny_llama, objective, others, b, 1e9, 0)
    assert differs.any()
    assert not matched[differs].any()


@pytest.mark.parametrize("form", ["prob", "logprob"])
def test_text_loss_formula(tiny_llama, form):
    objective = sodaray.Objective(kind="text", output_tokens=2, text_loss=form)
    targets = sodaray.make_targets(tiny_llama, [[1, 2]], objective=objective)
    y = targets.continuation[0]
    cand = [[4, 4]]
    seq = torch.tensor([cand[0] + [int(y[0])]])
    logits = tiny_llama.token_logits(seq)[0, -2:]
    if form == "prob":  # the paper's Eq. 5: summed probability margins
        probs = logits.softmax(-1)
        expected = (probs.max(-1).values - probs[torch.arange(2), y]).sum()
    else:  # the authors' code: mean log-probability margins, clamped at 1e-12
        logp = logits.log_softmax(-1)
        expected = (logp.max(-1).values - logp[torch.arange(2), y]).clamp_min(1e-12).mean()
    torch.testing.assert_close(
        one_hot_loss(tiny_llama, targets, cand)[0], expected, rtol=1e-4, atol=1e-6
    )


def test_fluency_penalty_is_mean_nll_of_own_tokens(tiny_llama):
    objective = sodaray.Objective(fluency_weight=0.5)
    targets = sodaray.make_targets(tiny_llama, [[1, 2, 3]], objective=objective)
    cand = [[7, 8, 9]]
    base = one_hot_loss(tiny_llama, targets, cand, sodaray.Objective())
    logp = tiny_llama.token_logits(torch.tensor(cand))[0].log_softmax(-1)
    nll = -(logp[0, 8] + logp[1, 9]) / 2  # no prefix: the first token is not scored
    torch.testing.assert_close(
        one_hot_loss(tiny_llama, targets, cand)[0], base[0] + 0.5 * nll, rtol=1e-4, atol=1e-6
    )


def test_fluency_forms_on_a_relaxed_input(tiny_llama):
    """argmax (the paper's): NLL of each relaxed one-hot's argmax token, no gradient into the
    relaxed weights except through the model; relaxed: the cross-entropy with the weights."""
    from sodaray.objective.scoring import fluency_penalty

    torch.manual_seed(0)
    probs = torch.randn(1, 3, tiny_llama.vocab_size).softmax(-1).requires_grad_(True)
    hidden = tiny_llama.hidden(probs @ tiny_llama.embedding_matrix)
    logp = tiny_llama.unembed(hidden[:, :2]).float().log_softmax(-1)
    top = probs[0, 1:].argmax(-1)
    layout = Layout.uniform(1, 3, tiny_llama.device)
    rows = probs.reshape(3, -1)
    argmax = fluency_penalty(tiny_llama, hidden, layout, rows, form="argmax")
    relaxed = fluency_penalty(tiny_llama, hidden, layout, rows, form="relaxed")
    torch.testing.assert_close(argmax[0], -logp[0, torch.arange(2), top].mean())
    torch.testing.assert_close(relaxed[0], -(probs[0, 1:] * logp[0]).sum(-1).mean())
    assert not torch.isclose(argmax, relaxed).any()
    assert sodaray.Objective().fluency_form == "argmax"  # the paper's form by default


def test_continuation_is_greedy(tiny_llama):
    targets = sodaray.make_targets(
        tiny_llama, [[1, 2]], objective=sodaray.Objective(kind="text", output_tokens=3)
    )
    seq = [1, 2]
    for i in range(3):
        nxt = int(tiny_llama.token_logits(torch.tensor([seq]))[0, -1].argmax())
        assert int(targets.continuation[0, i]) == nxt
        seq.append(nxt)


def test_targets_from_logits_equal_make_targets(tiny_llama, tmp_path):
    from safetensors.numpy import save_file

    made = sodaray.make_targets(tiny_llama, [[4, 5]], objective=sodaray.Objective(top_k=6))
    path = tmp_path / "obs.safetensors"
    save_file(
        {"values": made.observed_values.numpy(), "indices": made.observed_indices.numpy()},
        str(path),
    )
    values, indices = sodaray.read_logits_file(path)
    loaded = sodaray.targets_from_logits(tiny_llama, values, indices)
    torch.testing.assert_close(loaded.observed_values, made.observed_values)
    assert torch.equal(loaded.continuation, made.continuation)
    np.save(tmp_path / "full.npy", np.zeros((2, 3), dtype=np.float32))
    v, _ = sodaray.read_logits_file(tmp_path / "full.npy")
    with pytest.raises(ValueError, match="vocabulary"):
        sodaray.targets_from_logits(tiny_llama, v)


@pytest.mark.parametrize(
    "bad",
    [
        dict(kind="image"),
        dict(top_k=0),
        dict(output_tokens=0),
        dict(loss="l1"),
        dict(kind="text", top_k=3),
        dict(space="probs"),
        dict(kind="text", space="logprobs"),
        dict(space="centred", top_k=1),
    ],
)
def test_bad_objectives(bad):
    with pytest.raises(ValueError):
        sodaray.Objective(**bad)


def test_bad_targets(tiny_llama):
    with pytest.raises(ValueError, match="outside the model.s vocabulary"):
        sodaray.make_targets(tiny_llama, [[64]])
    with pytest.raises(ValueError, match="no tokens"):
        sodaray.make_targets(tiny_llama, [[]])
    with pytest.raises(ValueError, match="larger than the vocabulary"):
        sodaray.make_targets(tiny_llama, [[1]], objective=sodaray.Objective(top_k=65))


def test_tolerance_defaults_follow_model_size(tiny_llama):
    t = sodaray.make_targets(tiny_llama, [[1]])
    assert t.atol == t.rtol == 1e-4
    t = sodaray.make_targets(tiny_llama, [[1]], objective=sodaray.Objective(atol=1e-2))
    assert t.atol == 1e-2 and t.rtol == 1e-4


@pytest.mark.parametrize("top_k", [None, 6])
def test_space_loss_formulas(tiny_llama, top_k):
    """Each space's loss is the Huber loss between the transformed candidate and observation."""
    true, cand = [[5, 6]], [[7, 8]]
    raw_true = tiny_llama.token_logits(torch.tensor(true))[0, -1]
    raw_cand = tiny_llama.token_logits(torch.tensor(cand))[0, -1]
    idx = raw_true.topk(top_k).indices if top_k else torch.arange(raw_true.shape[0])
    expected = {
        "centred": lambda x: x[idx] - x[idx].mean(),
        "logprobs": lambda x: x.log_softmax(-1)[idx],
    }
    for space, f in expected.items():
        objective = sodaray.Objective(top_k=top_k, space=space)
        targets = sodaray.make_targets(tiny_llama, true, objective=objective)
        torch.testing.assert_close(targets.observed_values[0, 0], f(raw_true))
        want = torch.nn.functional.huber_loss(f(raw_cand), f(raw_true))
        got = one_hot_loss(tiny_llama, targets, cand)[0]
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_shifted_logits_match_only_in_shift_free_spaces(tiny_llama):
    """Logits shifted by a constant (what an API's per-request offset does) are the same output
    in the centred and log-probability spaces, and a different one in the raw space."""
    true = torch.tensor([[5, 6]])
    shifted = tiny_llama.token_logits(true)[:, -1:] + 3.0  # (1, 1, V)
    verdicts = {}
    for space in ("raw", "centred", "logprobs"):
        objective = sodaray.Objective(space=space)
        targets = sodaray.targets_from_logits(tiny_llama, shifted.numpy(), objective=objective)
        batch = batch_of(targets, [0])
        verdicts[space] = bool(
            hard_match(tiny_llama, targets.objective, true, batch, targets.atol, targets.rtol)
        )
    assert verdicts == {"raw": False, "centred": True, "logprobs": True}


def test_logprob_file_equals_make_targets(tiny_llama):
    """Top-k log-probabilities as an API returns them invert like the model's own."""
    objective = sodaray.Objective(top_k=5, space="logprobs")
    made = sodaray.make_targets(tiny_llama, [[4, 5]], objective=objective)
    loaded = sodaray.targets_from_logits(
        tiny_llama, made.observed_values.numpy(), made.observed_indices.numpy(), objective=objective
    )
    torch.testing.assert_close(loaded.observed_values, made.observed_values)
    assert (loaded.observed_values <= 0).all()
    batch = batch_of(loaded, [0])
    ok = hard_match(tiny_llama, loaded.objective, torch.tensor([[4, 5]]), batch, 1e-4, 1e-4)
    bad = hard_match(tiny_llama, loaded.objective, torch.tensor([[4, 6]]), batch, 1e-4, 1e-4)
    assert ok.item() and not bad.item()


@pytest.mark.parametrize("top_k", [None, 4])
def test_match_needs_every_observed_position(tiny_llama, top_k):
    """With several output tokens observed, a candidate that reproduces the first position but
    not a later one is no match (the true input, against an observation changed at position 2)."""
    objective = sodaray.Objective(top_k=top_k, output_tokens=3)
    targets = sodaray.make_targets(tiny_llama, [[5, 6]], objective=objective)
    true = torch.tensor([[5, 6]])
    batch = batch_of(targets, [0])
    tol = (targets.atol, targets.rtol)
    assert hard_match(tiny_llama, objective, true, batch, *tol).item()
    changed = batch.observed_values.clone()
    changed[:, 2] += 1.0  # far outside the tolerance, at the last observed position only
    wrong = BatchTargets(batch.continuation, changed, batch.observed_indices)
    assert not hard_match(tiny_llama, objective, true, wrong, *tol).item()


def test_huber_delta_is_the_loss_threshold(tiny_llama):
    """`huber_delta` reaches the loss: quadratic below it, linear above (torch's formula)."""
    true, cand = [[5, 6]], [[7, 8]]
    raw_true = tiny_llama.token_logits(torch.tensor(true))[0, -1]
    raw_cand = tiny_llama.token_logits(torch.tensor(cand))[0, -1]
    losses = []
    for delta in (0.05, 1.0):
        objective = sodaray.Objective(huber_delta=delta)
        targets = sodaray.make_targets(tiny_llama, true, objective=objective)
        want = torch.nn.functional.huber_loss(raw_cand, raw_true, delta=delta)
        got = one_hot_loss(tiny_llama, targets, cand)[0]
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
        losses.append(float(got))
    assert losses[0] != pytest.approx(losses[1])  # the two thresholds give different losses



def test_a_text_match_needs_every_observed_token():
    """The exact text test (the confirm's): a candidate whose greedy tokens agree with the
    observed ones at the first two positions but not the last is no match."""
    objective = sodaray.Objective(kind="text", output_tokens=3)
    observed = torch.tensor([[3, 1, 2], [3, 1, 2]])
    logits = torch.zeros(2, 3, 5)
    logits[0, [0, 1, 2], [3, 1, 2]] = 1.0  # every position's largest is the observed token
    logits[1, [0, 1, 2], [3, 1, 4]] = 1.0  # the last position's is another
    batch = BatchTargets(observed, None, None)
    verdict = observation("text").compare(objective, logits, batch, slice(None), 0.0, 0.0)
    assert verdict.tolist() == [True, False]
