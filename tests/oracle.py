"""An independent referee for reported results: it re-runs the model on the returned tokens
(plain input ids, the whole forward, no probe, none of the engine's scoring code) and compares
with the observation itself. Tests use it to check that `found` means what it says."""

from __future__ import annotations

import torch

import sodaray
from sodaray.objective.targets import TargetSet


@torch.no_grad()
def reproduces(model: sodaray.LoadedModel, targets: TargetSet, row: int, tokens: list[int]) -> bool:
    """Whether input `tokens` gives the output observed for target `row`, within its tolerance."""
    objective = targets.objective
    m = objective.output_tokens
    observed_text = [int(t) for t in targets.continuation[row]]
    if objective.kind == "text":  # the greedy continuation, generated token by token
        seq = list(tokens)
        for expected in observed_text:
            nxt = int(model.token_logits(torch.tensor([seq]))[0, -1].argmax())
            if nxt != expected:
                return False
            seq.append(nxt)
        return True
    n = len(tokens)
    # Logits at the last input position and the m - 1 observed tokens after it.
    logits = model.token_logits(torch.tensor([list(tokens) + observed_text[:-1]]))[0]
    logits = logits[n - 1 : n - 1 + m].float()
    values = targets.observed_values[row]
    atol, rtol = targets.atol, targets.rtol
    if targets.observed_indices is None:
        return bool(torch.isclose(logits, values, atol=atol, rtol=rtol).all())
    indices = targets.observed_indices[row]
    if not torch.isclose(logits.gather(-1, indices), values, atol=atol, rtol=rtol).all():
        return False
    own_top = logits.topk(indices.shape[-1], dim=-1).indices
    return all(
        set(own_top[p].tolist()) == set(indices[p].tolist()) for p in range(indices.shape[0])
    )


def misreports(
    model: sodaray.LoadedModel,
    targets: TargetSet,
    results: list[sodaray.InversionResult],
) -> list[str]:
    """Every way `results` (in target order) disagree with the referee; empty when honest."""
    problems = []
    for row, r in enumerate(results):
        label = f"target {row} ({r.tokens})"
        if r.sample_id != targets.sample_ids[row]:
            problems.append(f"{label}: sample_id {r.sample_id} is not {targets.sample_ids[row]}")
        n = r.predicted_length
        if len(r.tokens) != n or (r.lengths_tried and r.lengths_tried[-1] != n):
            problems.append(f"{label}: length {r.predicted_length}, tried {r.lengths_tried}")
        if reproduces(model, targets, row, r.tokens) != r.found:
            problems.append(f"{label}: reported found={r.found}, the referee disagrees")
        if targets.true_tokens is not None:
            if r.exact != (r.tokens == list(targets.true_tokens[row])):
                problems.append(f"{label}: exact={r.exact}, true {targets.true_tokens[row]}")
        elif r.exact is not None:
            problems.append(f"{label}: exact={r.exact} without a known input")
    return problems
