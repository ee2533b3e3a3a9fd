"""How a candidate is scored against its targets: the `Objective` settings, the relaxed loss
(with the fluency penalty) and the exact-match check. The targets themselves are built in
`sodaray.targets`; each observation kind's own loss and check live in `sodaray.observations`.

Two observations are supported, as in the paper:
- `logits`: the target's logits at the last input position, all of them or the top-k (values
  and indices), optionally at `output_tokens` positions, with the target's own greedy
  continuation as fixed context after the input;
- `text`: the target's greedy continuation of `output_tokens` tokens (paper Eq. 5).
An optional fluency penalty (paper Eq. 6) adds the candidate's mean negative log-likelihood.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch
from torch import Tensor

from sodaray.models import LoadedModel
from sodaray.observations import observation

if TYPE_CHECKING:
    from sodaray.targets import TargetSet

ObjectiveKind = Literal["logits", "text"]
LossKind = Literal["huber", "mse"]
# Text objective: "logprob" is the authors' code, mean over output positions of
# max log-prob - log-prob of the observed token (clamped at 1e-12); "prob" is the paper's Eq. 5,
# the sum of probability differences. The default is the form that found more on held-out
# validation inputs (benchmarks/RESULTS.md, issue 13).
TextLoss = Literal["logprob", "prob"]
TEXT_LOSSES: tuple[str, ...] = ("logprob", "prob")
# Fluency penalty: "argmax" is the paper's Eq. 6 and the authors' code, the NLL of the relaxed
# input's argmax tokens (gradient through the model's predictions only); "relaxed" is the
# cross-entropy between each relaxed one-hot and the model's prediction.
FluencyForm = Literal["argmax", "relaxed"]
FLUENCY_FORMS: tuple[str, ...] = ("argmax", "relaxed")
# Where observed logits are compared: as the model emits them, with each position's mean over
# the vocabulary subtracted (TransformerLens' `center_unembed`, which the authors' code loads
# with), or as log-probabilities (what APIs and llama.cpp show). One place defines each: see
# `observed_in_space` and `predicted_in_space`.
ObservationSpace = Literal["raw", "centred", "logprobs"]
SPACES: tuple[str, ...] = ("raw", "centred", "logprobs")


@dataclass(frozen=True)
class Objective:
    """How a candidate is scored and when it counts as found.

    `top_k=None` observes all logits. `space` is where logits are compared, by the loss and by
    the match check alike: `raw`, `centred` (minus each position's mean; over the k observed
    values for top-k) or `logprobs` (log-softmax over the whole vocabulary). `atol`/`rtol`
    default to the paper's tolerance for the model's size (1e-4 under 100M parameters, 1e-3
    above) when left as None.
    """

    kind: ObjectiveKind = "logits"
    top_k: int | None = None
    space: ObservationSpace = "raw"
    output_tokens: int = 1
    loss: LossKind = "huber"
    huber_delta: float = 1.0
    fluency_weight: float = 0.0
    text_loss: TextLoss = "logprob"
    fluency_form: FluencyForm = "argmax"
    atol: float | None = None
    rtol: float | None = None

    def __post_init__(self) -> None:
        kind = observation(self.kind)  # an unknown kind: one line naming the known ones
        if self.loss not in ("huber", "mse"):
            raise ValueError(f"loss must be 'huber' or 'mse', not {self.loss!r}")
        if self.output_tokens < 1:
            raise ValueError(f"output_tokens must be at least 1, not {self.output_tokens}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be at least 1, not {self.top_k}")
        if self.space not in SPACES:
            raise ValueError(f"space must be one of {', '.join(SPACES)}, not {self.space!r}")
        kind.check(self)
        if self.huber_delta <= 0:
            raise ValueError("huber_delta must be positive")
        if self.fluency_weight < 0:
            raise ValueError("fluency_weight must be non-negative")
        if self.text_loss not in TEXT_LOSSES:
            raise ValueError(f"text_loss must be logprob or prob, not {self.text_loss!r}")
        if self.fluency_form not in FLUENCY_FORMS:
            raise ValueError(f"fluency_form must be argmax or relaxed, not {self.fluency_form!r}")


# ---- scoring ------------------------------------------------------------------------------------
PROBE_COLUMNS = 8


@dataclass
class BatchTargets:
    """The rows of a `TargetSet` that sit in the search batch, on the model's device.

    `probe_indices`/`probe_values` (B, m, P) are the P largest observed logits of each row:
    the hard check's cheap first test (see `hard_match`).
    """

    continuation: Tensor  # (B, m)
    observed_values: Tensor | None  # (B, m, k)
    observed_indices: Tensor | None  # (B, m, k)
    probe_indices: Tensor | None = None  # (B, m, P) vocabulary ids
    probe_values: Tensor | None = None  # (B, m, P)

    @classmethod
    def from_set(cls, targets: TargetSet, rows: np.ndarray, device: torch.device) -> BatchTargets:
        idx = torch.as_tensor(rows, dtype=torch.long)

        def take(t: Tensor | None) -> Tensor | None:
            return None if t is None else t[idx].to(device)

        values, indices = take(targets.observed_values), take(targets.observed_indices)
        probe_idx = probe_val = None
        if values is not None and values.shape[-1] > PROBE_COLUMNS:
            top = values.topk(PROBE_COLUMNS, dim=-1)
            probe_val = top.values
            probe_idx = top.indices if indices is None else indices.gather(-1, top.indices)
        return cls(take(targets.continuation), values, indices, probe_idx, probe_val)

    def _fields(self) -> tuple[str, ...]:
        return (
            "continuation",
            "observed_values",
            "observed_indices",
            "probe_indices",
            "probe_values",
        )

    def put(self, slots: Tensor, other: BatchTargets) -> None:
        """Write `other`'s rows into `slots` (a refill)."""
        for name in self._fields():
            mine = getattr(self, name)
            if mine is not None:
                mine[slots] = getattr(other, name)

    def select(self, keep: Tensor) -> BatchTargets:
        return BatchTargets(
            *(None if getattr(self, f) is None else getattr(self, f)[keep] for f in self._fields())
        )


def context_embeds(model: LoadedModel, input_embeds: Tensor, batch: BatchTargets) -> Tensor:
    """Prefix + searched input + fixed continuation context (all but the last observed token)."""
    parts = []
    prefix = model.prefix_embeds(input_embeds.shape[0])
    if prefix is not None:
        parts.append(prefix.to(input_embeds.dtype))
    parts.append(input_embeds)
    if batch.continuation.shape[1] > 1:
        parts.append(model.embed(batch.continuation[:, :-1]).to(input_embeds.dtype))
    return torch.cat(parts, dim=1) if len(parts) > 1 else input_embeds


def observed_positions(model: LoadedModel, n: int, m: int) -> slice:
    """Sequence positions whose next-token logits are observed: last input and m-1 after it."""
    start = len(model.prefix_ids) + n - 1
    return slice(start, start + m)


def objective_loss(
    model: LoadedModel,
    objective: Objective,
    hidden: Tensor,
    n: int,
    batch: BatchTargets,
    input_probs: Tensor | None = None,
) -> Tensor:
    """Per-sample loss (B,) from final hidden states of prefix + input + context.

    `input_probs` (B, n, V) are the relaxed one-hots, needed only for the fluency penalty.
    """
    h_obs = hidden[:, observed_positions(model, n, objective.output_tokens)]
    loss = observation(objective.kind).loss(model, objective, h_obs, batch)
    if objective.fluency_weight > 0:
        penalty = fluency_penalty(model, hidden, n, input_probs, form=objective.fluency_form)
        loss = loss + objective.fluency_weight * penalty
    return loss


def fluency_penalty(
    model: LoadedModel,
    hidden: Tensor,
    n: int,
    input_probs: Tensor | None,
    *,
    form: str = "argmax",
) -> Tensor:
    """Eq. 6: mean negative log-likelihood of the candidate's own tokens, (B,).

    `argmax` (the paper's): the NLL of each relaxed one-hot's most likely token, the gradient
    flowing through the model's predictions only. `relaxed`: the cross-entropy between each
    relaxed one-hot and the model's prediction for that position. The first input token is
    scored only when a prefix (e.g. BOS) precedes it.
    """
    if input_probs is None:
        raise ValueError("the fluency penalty needs the relaxed input")
    p = len(model.prefix_ids)
    first = 0 if p > 0 else 1
    if first >= n:
        return hidden.new_zeros(hidden.shape[0]).float()
    # Positions p+first-1 .. p+n-2 predict input tokens first .. n-1.
    logits = model.unembed(hidden[:, p + first - 1 : p + n - 1]).float()
    logp = logits.log_softmax(-1)
    if form == "argmax":
        tokens = input_probs[:, first:].argmax(-1, keepdim=True)
        nll = -logp.gather(-1, tokens).squeeze(-1)
    else:
        nll = -(input_probs[:, first:].float() * logp).sum(-1)
    return nll.mean(1)


@torch.no_grad()
def hard_match(
    model: LoadedModel,
    objective: Objective,
    tokens: Tensor,
    batch: BatchTargets,
    atol: float,
    rtol: float,
    rows: Tensor | None = None,
) -> Tensor:
    """Whether each candidate input (C, n) reproduces its observed output exactly, (C,) bool.

    `rows` names the batch rows the candidates belong to (default: all, in order); the kind's
    own check decides (`sodaray.observations`).
    """
    if rows is None:
        rows = torch.arange(tokens.shape[0], device=tokens.device)
    n = tokens.shape[1]
    m = objective.output_tokens
    cont = batch.continuation[rows]
    embeds = context_embeds(model, model.embed(tokens), BatchTargets(cont, None, None))
    hidden = model.hidden(embeds)[:, observed_positions(model, n, m)]
    return observation(objective.kind).match(model, objective, hidden, batch, rows, atol, rtol)
