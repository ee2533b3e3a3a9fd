"""Observation kinds: what an auditor saw, each with how it is recorded from the model's output,
its relaxed loss, and its exact-match check. A new kind is one class here, one entry in
`OBSERVATIONS` and its name in `objectives.KINDS`: the rest of the package asks the registry.
Also here: the observed rows a search batch holds (`BatchTargets`), and the one definition of
how observed and predicted logits are moved into each observation space.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from sodaray.model.loaded import LoadedModel
from sodaray.objective.objectives import KINDS, Objective

# ---- the observed rows of a batch ---------------------------------------------------------------
PROBE_COLUMNS = 8
# The match check's screen (`scoring.check_sequences`) loosens the test by this fraction of a
# row's largest observed magnitude: a thousand times what a batch's shape does to a float32
# forward, so it never drops a candidate the canonical test would take, yet lets few through.
SCREEN_SLACK = 1e-3


def screen_slack(model: LoadedModel) -> float:
    """The screen's slack for `model`'s precision: a few hundred roundings at half precision."""
    return max(SCREEN_SLACK, 256 * torch.finfo(model.dtype).eps)


@dataclass
class BatchTargets:
    """The observed rows of the targets that sit in a search batch, on the model's device.

    observed + `observed_shift` are the raw logits a confirm in both spaces holds a match to
    (NaN: not known; None for text). `probe_*` are the P largest observed logits of each row
    and how far a candidate's may be from them: the hard check's cheap first test
    (`LogitsObservation.probe`).
    """

    continuation: Tensor  # (B, m)
    observed_values: Tensor | None = None  # (B, m, k)
    observed_indices: Tensor | None = None  # (B, m, k)
    observed_shift: Tensor | None = None  # (B, m)
    probe_indices: Tensor | None = None  # (B, m, P) vocabulary ids
    probe_values: Tensor | None = None  # (B, m, P)
    probe_allowed: Tensor | None = None  # (B, m, P)

    FIELDS: ClassVar[tuple[str, ...]]  # the fields' names, in order (set below the class)

    @classmethod
    def from_set(
        cls, targets: Any, rows: np.ndarray, device: torch.device, slack: float = SCREEN_SLACK
    ) -> BatchTargets:
        """Rows `rows` of a `TargetSet` (anything with `continuation`, `observed_values` and
        `observed_indices` tensors on the CPU, `atol` and `rtol`); `slack`: the screen's."""
        idx = torch.as_tensor(rows, dtype=torch.long)

        def take(t: Tensor | None) -> Tensor | None:
            return None if t is None else t[idx].to(device)

        values, indices = take(targets.observed_values), take(targets.observed_indices)
        probe_idx = probe_val = allowed = None
        if values is not None and values.shape[-1] > PROBE_COLUMNS:
            top = values.topk(PROBE_COLUMNS, dim=-1)
            probe_val = top.values
            probe_idx = top.indices if indices is None else indices.gather(-1, top.indices)
            # Looser than the full test by more than any rounding: it never rejects a match.
            scale = values.abs().flatten(1).amax(1)[:, None, None]
            atol, rtol = float(targets.atol), float(targets.rtol)
            allowed = 2 * atol + 1e-5 + 2 * rtol * probe_val.abs() + 2 * slack * scale
        cont = take(targets.continuation)
        shift = take(getattr(targets, "observed_shift", None))
        if shift is None and values is not None:  # logits whose raw values are not known
            shift = torch.full(cont.shape, torch.nan, device=device)
        return cls(cont, values, indices, shift, probe_idx, probe_val, allowed)

    def fields(self) -> dict[str, Tensor]:
        """The tensors that are present, by name."""
        return {name: t for name in self.FIELDS if (t := getattr(self, name)) is not None}

    def select(self, keep: Tensor) -> BatchTargets:
        return BatchTargets(**{name: t[keep] for name, t in self.fields().items()})


BatchTargets.FIELDS = tuple(f.name for f in dataclasses.fields(BatchTargets))


# ---- observation spaces -------------------------------------------------------------------------
def observed_in_space(values: Tensor, space: str, *, top_k: bool) -> Tensor:
    """Observed values (..., V) or top-k values (..., k) moved into `space`.

    Idempotent, so a file may hold raw or already-transformed values: centring twice is
    centring once, and log-softmax of log-probabilities returns them. Top-k log-probabilities
    cannot be renormalised (the rest of the vocabulary is unseen) and are taken as given.
    """
    if space == "raw":
        return values
    if space == "centred":
        return values - values.mean(-1, keepdim=True)
    return values if top_k else values.log_softmax(-1)


def raw_shift(objective: Objective, logits: Tensor) -> Tensor | None:
    """(...,) what `objective.space` takes from each position of the raw `logits` (..., V) the
    model emitted: the mean (over the top k for top-k observations) for `centred`, the
    log-normaliser for full `logprobs`; None where nothing is taken (raw) or the raw values
    cannot be recovered (top-k log-probabilities are taken as given)."""
    if objective.space == "centred":
        top = objective.top_k
        return (logits if top is None else logits.topk(top, dim=-1).values).mean(-1)
    if objective.space == "logprobs" and objective.top_k is None:
        return logits.logsumexp(-1)
    return None


def predicted_in_space(
    model: LoadedModel, hidden: Tensor, indices: Tensor | None, space: str
) -> Tensor:
    """The candidate's values in `space` at the observed entries: (B, P, V) or (B, P, k)."""
    if space == "raw" or (space == "centred" and indices is not None):
        values = model.unembed(hidden, indices).float()
        return values if space == "raw" else values - values.mean(-1, keepdim=True)
    full = model.unembed(hidden).float()  # centring or normalising needs every logit
    values = full - full.mean(-1, keepdim=True) if space == "centred" else full.log_softmax(-1)
    return values if indices is None else values.gather(-1, indices)


# ---- the kinds ----------------------------------------------------------------------------------
class Observation:
    """One kind of observation. `hidden` arguments are final hidden states at the observed
    positions (B, m, d); `batch` holds the observed rows (continuation, values, indices)."""

    kind: ClassVar[str]

    def record(self, objective: Objective, logits: Tensor) -> tuple[Tensor | None, Tensor | None]:
        """What is observed of the model's logits (m, V) at the observed positions besides the
        greedy continuation: (values, indices), each None when not part of the observation."""
        return None, None

    def label(self, objective: Objective) -> str:
        """A short name for job folders ("text4", "top10x1-centred")."""

    def loss(self, model: LoadedModel, objective: Objective, hidden: Tensor, batch) -> Tensor:
        """The relaxed loss per sample, (B,)."""

    def probe(self, model, objective, hidden, batch: BatchTargets, rows) -> Tensor | None:
        """A cheap necessary condition for `match`, (C,) bool (a candidate it turns down cannot
        match), or None where this observation has none. `rows` may be a slice: `slice(None)`
        is candidate c against row c, without a lookup."""
        return None

    def match(self, model, objective, hidden, batch, rows, atol, rtol, slack=0.0) -> Tensor:
        """Whether each candidate (C,) reproduces its row's observation, (C,) bool, from its
        final hidden states (C, m, d). `slack` loosens the test by that fraction of the row's
        largest observed magnitude (a screen; 0: the exact test)."""
        logits = model.unembed(hidden).float()
        return self.compare(objective, logits, batch, rows, atol, rtol, slack)

    def compare(self, objective, logits, batch, rows, atol, rtol, slack=0.0) -> Tensor:
        """`match` on the candidates' full float logits (C, m, V)."""


class TextObservation(Observation):
    """The model's greedy continuation of `output_tokens` tokens (paper Eq. 5)."""

    kind = "text"

    def label(self, objective: Objective) -> str:
        return f"text{objective.output_tokens}"

    def loss(self, model: LoadedModel, objective: Objective, hidden: Tensor, batch) -> Tensor:
        # Eq. 5 ("prob"): the sum over positions of max_a p(a) - p(y_i), teacher-forced on y.
        # The authors' form: log-probabilities keep a gradient where p(y_i) is tiny, which the
        # probability difference flattens; the clamp keeps the loss positive once matched.
        prob = objective.text_loss == "prob"
        logits = model.unembed(hidden).float()
        p = logits.softmax(-1) if prob else logits.log_softmax(-1)
        gap = p.amax(-1) - p.gather(-1, batch.continuation[..., None]).squeeze(-1)
        return gap.sum(1) if prob else gap.clamp_min(1e-12).mean(1)

    def compare(self, objective, logits, batch, rows, atol, rtol, slack=0.0) -> Tensor:
        observed = batch.continuation[rows]
        if not slack:
            return (logits.argmax(-1) == observed).all(1)
        # Screen: each observed token within `slack` of the position's largest logit.
        top = logits.amax(-1)
        margin = slack * logits.abs().amax(-1)
        return (logits.gather(-1, observed[..., None]).squeeze(-1) >= top - margin).all(1)


class LogitsObservation(Observation):
    """The logits at the last input position (all, or the top-k values and their indices),
    optionally at `output_tokens` positions, in an observation space."""

    kind = "logits"

    def record(self, objective: Objective, logits: Tensor) -> tuple[Tensor | None, Tensor | None]:
        if objective.top_k is None:
            return observed_in_space(logits, objective.space, top_k=False), None
        # The transforms keep the order, so the top-k set is the raw logits' top-k.
        top = logits.topk(objective.top_k, dim=-1)
        full = logits.log_softmax(-1) if objective.space == "logprobs" else logits
        values = full.gather(-1, top.indices)
        return observed_in_space(values, objective.space, top_k=True), top.indices

    def label(self, objective: Objective) -> str:
        what = "all" if objective.top_k is None else f"top{objective.top_k}"
        what += f"x{objective.output_tokens}"
        return what if objective.space == "raw" else f"{what}-{objective.space}"

    def loss(self, model: LoadedModel, objective: Objective, hidden: Tensor, batch) -> Tensor:
        pred = predicted_in_space(model, hidden, batch.observed_indices, objective.space)
        observed = batch.observed_values
        if objective.loss == "huber":
            per_entry = F.huber_loss(pred, observed, reduction="none", delta=objective.huber_delta)
        else:
            per_entry = (pred - observed).square()
        return per_entry.flatten(1).mean(1)

    def probe(self, model, objective, hidden, batch, rows) -> Tensor | None:
        """For raw logits: the few largest observed logits, with a looser tolerance; only
        candidates that pass it pay for the full-vocabulary comparison. The other spaces need
        the whole row anyway."""
        if not model.split_forward or batch.probe_allowed is None or objective.space != "raw":
            return None
        probe_pred = model.unembed(hidden, batch.probe_indices[rows]).float()
        off = (probe_pred - batch.probe_values[rows]).abs() <= batch.probe_allowed[rows]
        return off.flatten(1).all(1)

    def compare(self, objective, logits, batch, rows, atol, rtol, slack=0.0) -> Tensor:
        found = self._compare_in_space(objective, logits, batch, rows, atol, rtol, slack)
        if slack or not objective.confirms_raw or batch.observed_shift is None:
            return found
        # The confirm in both spaces: where the raw logits are known, the candidate's raw
        # logits must meet them too (a row whose shift is NaN is decided by its space alone).
        shift, indices = batch.observed_shift[rows], batch.observed_indices
        raw = batch.observed_values[rows] + shift[..., None]
        at_obs = logits if indices is None else logits.gather(-1, indices[rows])
        close = _close(at_obs, raw, atol, rtol, 0.0).all(1)
        return found & (close | shift.isnan().any(1))

    def _compare_in_space(self, objective, logits, batch, rows, atol, rtol, slack) -> Tensor:
        space = objective.space
        values = batch.observed_values[rows]
        if space == "centred" and batch.observed_indices is None:
            logits = logits - logits.mean(-1, keepdim=True)
        elif space == "logprobs":
            logits = logits.log_softmax(-1)  # monotone: the top-k set below is unchanged
        if batch.observed_indices is None:
            return _close(logits, values, atol, rtol, slack).all(1)
        indices = batch.observed_indices[rows]
        at_obs = logits.gather(-1, indices)
        if space == "centred":
            at_obs = at_obs - at_obs.mean(-1, keepdim=True)
        close = _close(at_obs, values, atol, rtol, slack).all(1)
        if slack:  # a screen: which entries make the top k may swap within the slack
            return close
        # Its own top-k must be the observed set (order-free: ties may swap equal values).
        own = logits.topk(indices.shape[-1], dim=-1).indices.sort(-1).values
        return close & (own == indices.sort(-1).values).flatten(1).all(1)


def _close(pred: Tensor, observed: Tensor, atol: float, rtol: float, slack: float) -> Tensor:
    """(C, ...) -> (C, entries) bool: `torch.isclose` (slack 0), or within `slack` times the
    candidate's largest observed magnitude more."""
    if not slack:
        return torch.isclose(pred, observed, atol=atol, rtol=rtol).flatten(1)
    pred, observed = pred.flatten(1), observed.flatten(1)
    allowed = atol + rtol * observed.abs() + slack * observed.abs().amax(1, keepdim=True)
    return (pred - observed).abs() <= allowed


OBSERVATIONS: dict[str, Observation] = {o.kind: o for o in (LogitsObservation(), TextObservation())}
assert tuple(OBSERVATIONS) == KINDS  # a new kind: its class here, its name in `objectives.KINDS`


def observation(kind: str) -> Observation:
    """The kind of an `Objective` (which refuses any other)."""
    return OBSERVATIONS[kind]
