"""What the auditor observed (targets), the loss against it, and the hard-match check.

Two observations are supported, as in the paper:
- `logits`: the target's logits at the last input position, all of them or the top-k (values
  and indices), optionally at `output_tokens` positions, with the target's own greedy
  continuation as fixed context after the input;
- `text`: the target's greedy continuation of `output_tokens` tokens (paper Eq. 5).
An optional fluency penalty (paper Eq. 6) adds the candidate's mean negative log-likelihood.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from sodaray.models import LoadedModel

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
        if self.kind not in ("logits", "text"):
            raise ValueError(f"objective must be 'logits' or 'text', not {self.kind!r}")
        if self.loss not in ("huber", "mse"):
            raise ValueError(f"loss must be 'huber' or 'mse', not {self.loss!r}")
        if self.output_tokens < 1:
            raise ValueError(f"output_tokens must be at least 1, not {self.output_tokens}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be at least 1, not {self.top_k}")
        if self.kind == "text" and self.top_k is not None:
            raise ValueError("top_k applies to the logits objective only")
        if self.space not in SPACES:
            raise ValueError(f"space must be one of {', '.join(SPACES)}, not {self.space!r}")
        if self.kind == "text" and self.space != "raw":
            raise ValueError("space applies to the logits objective only (text: leave it raw)")
        if self.space == "centred" and self.top_k == 1:
            raise ValueError(
                "centred top-1 logits are always 0: observe top_k >= 2 or another space"
            )
        if self.huber_delta <= 0:
            raise ValueError("huber_delta must be positive")
        if self.fluency_weight < 0:
            raise ValueError("fluency_weight must be non-negative")
        if self.text_loss not in TEXT_LOSSES:
            raise ValueError(f"text_loss must be logprob or prob, not {self.text_loss!r}")
        if self.fluency_form not in FLUENCY_FORMS:
            raise ValueError(f"fluency_form must be argmax or relaxed, not {self.fluency_form!r}")


@dataclass
class TargetSet:
    """N observed outputs to invert, as tensors on the CPU (rows enter the search in batches).

    `continuation` (N, m) is the target's greedy continuation: fixed context after the input
    for the logits objective, and the observed text for the text objective. `observed_values`
    (N, m, k) and `observed_indices` (N, m, k) hold the observed logits (indices None = all V).
    """

    objective: Objective
    continuation: Tensor
    observed_values: Tensor | None = None
    observed_indices: Tensor | None = None
    true_tokens: list[list[int]] | None = None
    atol: float = 1e-4
    rtol: float = 1e-4
    sample_ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.sample_ids:
            self.sample_ids = list(range(len(self)))

    def __len__(self) -> int:
        return int(self.continuation.shape[0])

    def subset(self, rows: list[int] | np.ndarray) -> TargetSet:
        idx = torch.as_tensor(np.asarray(rows, dtype=np.int64))
        return replace(
            self,
            continuation=self.continuation[idx],
            observed_values=None if self.observed_values is None else self.observed_values[idx],
            observed_indices=None if self.observed_indices is None else self.observed_indices[idx],
            true_tokens=None if self.true_tokens is None else [self.true_tokens[i] for i in rows],
            sample_ids=[self.sample_ids[i] for i in rows],
        )


# ---- building targets ---------------------------------------------------------------------------
def _resolve_tolerance(model: LoadedModel, objective: Objective) -> tuple[float, float]:
    default = model.default_tolerance
    atol = objective.atol if objective.atol is not None else default
    rtol = objective.rtol if objective.rtol is not None else default
    return atol, rtol


def _check_top_k(model: LoadedModel, objective: Objective) -> None:
    if objective.top_k is not None and objective.top_k > model.vocab_size:
        raise ValueError(
            f"top_k={objective.top_k} is larger than the vocabulary ({model.vocab_size})"
        )


def check_token_ids(model: LoadedModel, tokens: list[list[int]]) -> None:
    for row in tokens:
        if not row:
            raise ValueError("an input has no tokens")
        bad = [t for t in row if not 0 <= int(t) < model.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is out of range [0, {model.vocab_size})")


@torch.no_grad()
def greedy_continuation(model: LoadedModel, tokens: Tensor, steps: int) -> tuple[Tensor, Tensor]:
    """Greedy continuation (B, steps) of equal-length inputs and the logits that chose it
    (B, steps, V). Re-runs the whole sequence per step: `steps` is small here."""
    seq = tokens
    chosen, logits_seen = [], []
    for _ in range(steps):
        logits = model.token_logits(seq)[:, -1].float()
        nxt = logits.argmax(-1)
        chosen.append(nxt)
        logits_seen.append(logits)
        seq = torch.cat([seq, nxt[:, None]], dim=1)
    return torch.stack(chosen, 1), torch.stack(logits_seen, 1)


def make_targets(
    model: LoadedModel,
    tokens: list[list[int]] | None = None,
    *,
    texts: list[str] | None = None,
    objective: Objective | None = None,
    batch_size: int = 256,
) -> TargetSet:
    """Targets from known inputs (token ids or texts): the model's own output is observed.

    Inputs of different lengths are fine; the search groups them by length.
    """
    objective = objective or Objective()
    if (tokens is None) == (texts is None):
        raise ValueError("give exactly one of tokens or texts")
    if texts is not None:
        if any(not t for t in texts):
            raise ValueError("an input text is empty")
        tokens = [model.encode(t) for t in texts]
    assert tokens is not None
    tokens = [[int(t) for t in row] for row in tokens]
    check_token_ids(model, tokens)
    _check_top_k(model, objective)
    atol, rtol = _resolve_tolerance(model, objective)
    m = objective.output_tokens
    conts, values, indices = [], [], []
    order = sorted(range(len(tokens)), key=lambda i: len(tokens[i]))
    # Group equal lengths so each forward is one batch.
    by_row: dict[int, tuple[Tensor, Tensor]] = {}
    start = 0
    while start < len(order):
        n = len(tokens[order[start]])
        end = start
        while end < len(order) and len(tokens[order[end]]) == n and end - start < batch_size:
            end += 1
        rows = order[start:end]
        x = torch.tensor([tokens[i] for i in rows], device=model.device)
        cont, logits = greedy_continuation(model, x, m)
        for j, i in enumerate(rows):
            by_row[i] = (cont[j].cpu(), logits[j].cpu())
        start = end
    for i in range(len(tokens)):
        cont, logits = by_row[i]
        conts.append(cont)
        if objective.kind == "logits":
            if objective.top_k is None:
                values.append(observed_in_space(logits, objective.space, top_k=False))
            else:
                # The transforms keep the order, so the top-k set is the raw logits' top-k.
                top = logits.topk(objective.top_k, dim=-1)
                full = logits.log_softmax(-1) if objective.space == "logprobs" else logits
                vals = full.gather(-1, top.indices)
                values.append(observed_in_space(vals, objective.space, top_k=True))
                indices.append(top.indices)
    return TargetSet(
        objective=objective,
        continuation=torch.stack(conts),
        observed_values=torch.stack(values) if values else None,
        observed_indices=torch.stack(indices) if indices else None,
        true_tokens=tokens,
        atol=atol,
        rtol=rtol,
    )


def targets_from_text(
    model: LoadedModel, observed: list[str], *, objective: Objective | None = None
) -> TargetSet:
    """Targets from observed output texts (the text objective; true inputs unknown).

    Each text is tokenized; its tokens are the greedy continuation to reproduce. Texts must
    tokenize to the same number of tokens to share a batch, so each keeps its own length m.
    """
    base = objective or Objective(kind="text")
    if base.kind != "text":
        base = replace(base, kind="text", top_k=None)
    encoded = []
    for text in observed:
        if not text:
            raise ValueError("an observed output text is empty")
        encoded.append(model.encode(text))
    lengths = {len(e) for e in encoded}
    if len(lengths) > 1:
        raise ValueError(
            "observed texts tokenize to different lengths "
            f"({sorted(lengths)}); invert them in separate calls"
        )
    base = replace(base, output_tokens=len(encoded[0]))
    atol, rtol = _resolve_tolerance(model, base)
    return TargetSet(
        objective=base,
        continuation=torch.tensor(encoded, dtype=torch.long),
        atol=atol,
        rtol=rtol,
    )


def targets_from_logits(
    model: LoadedModel,
    values: Tensor | np.ndarray,
    indices: Tensor | np.ndarray | None = None,
    *,
    objective: Objective | None = None,
) -> TargetSet:
    """Targets from observed logits: values (N, m, V) for all logits, or (N, m, k) with their
    vocabulary indices for top-k. (V,) / (m, V) shapes are read as a single target."""
    if np.iscomplexobj(values):  # a cast to float32 would drop the imaginary part silently
        raise ValueError("observed logits are complex numbers; logits are real")
    if np.asarray(values).size == 0:
        raise ValueError("observed logits are empty")
    if indices is not None and not np.issubdtype(np.asarray(indices).dtype, np.integer):
        raise ValueError(f"logits indices must be integers, not {np.asarray(indices).dtype}")
    values = torch.as_tensor(np.asarray(values, dtype=np.float32))
    if indices is not None:
        indices = torch.as_tensor(np.asarray(indices, dtype=np.int64))
        if indices.shape != values.shape:
            raise ValueError(
                f"logits indices shape {tuple(indices.shape)} differs from values "
                f"{tuple(values.shape)}"
            )
    while values.dim() < 3:
        values = values.unsqueeze(0)
        indices = None if indices is None else indices.unsqueeze(0)
    if values.dim() != 3:
        raise ValueError(f"logits must have 1 to 3 dimensions (N, m, V|k), got {values.dim()}")
    n_obs, m, k = values.shape
    if indices is None:
        if k != model.vocab_size:
            raise ValueError(
                f"logits have {k} entries per position but the model's vocabulary is "
                f"{model.vocab_size}; pass indices for top-k logits"
            )
        top_k = None
    else:
        if int(indices.min()) < 0 or int(indices.max()) >= model.vocab_size:
            raise ValueError(f"logits indices fall outside the vocabulary [0, {model.vocab_size})")
        if k > 1 and (indices.sort(-1).values.diff(dim=-1) == 0).any():
            raise ValueError("logits indices repeat a vocabulary index at one position")
        top_k = k
    if not torch.isfinite(values).all():
        raise ValueError("observed logits contain NaN or infinity")
    base = objective or Objective()
    base = replace(base, kind="logits", top_k=top_k, output_tokens=m)
    atol, rtol = _resolve_tolerance(model, base)
    values = observed_in_space(values, base.space, top_k=top_k is not None)
    # The greedy continuation is the argmax of each observed position.
    best = values.argmax(-1)
    cont = best if indices is None else indices.gather(-1, best[..., None]).squeeze(-1)
    return TargetSet(
        objective=base,
        continuation=cont,
        observed_values=values,
        observed_indices=indices,
        atol=atol,
        rtol=rtol,
    )


def read_logits_file(path: str | Path) -> tuple[np.ndarray, np.ndarray | None]:
    """Read observed logits from .npy (values only) or .safetensors (`values`/`logits` and
    optional `indices`). Never unpickles."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"logits file not found: {path}")
    if path.suffix not in (".npy", ".safetensors"):
        raise ValueError(f"logits file must be .npy or .safetensors, not {path.suffix!r}")
    try:
        if path.suffix == ".npy":
            return np.load(path, allow_pickle=False), None
        from safetensors.numpy import load_file

        data = load_file(str(path))
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"cannot read logits file {path}: {first}") from exc
    key = "values" if "values" in data else "logits" if "logits" in data else None
    if key is None:
        raise ValueError(f"{path}: expected a tensor named 'values' or 'logits'")
    return data[key], data.get("indices")


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


def _elementwise_loss(objective: Objective, pred: Tensor, target: Tensor) -> Tensor:
    if objective.loss == "huber":
        return F.huber_loss(pred, target, reduction="none", delta=objective.huber_delta)
    return (pred - target).square()


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
    m = objective.output_tokens
    pos = observed_positions(model, n, m)
    h_obs = hidden[:, pos]
    if objective.kind == "logits":
        pred = predicted_in_space(model, h_obs, batch.observed_indices, objective.space)
        per_entry = _elementwise_loss(objective, pred, batch.observed_values)
        loss = per_entry.flatten(1).mean(1)
    elif objective.text_loss == "prob":
        # Eq. 5: sum over positions of max_a p(a) - p(y_i), teacher-forced on y.
        probs = model.unembed(h_obs).float().softmax(-1)
        p_true = probs.gather(-1, batch.continuation[..., None]).squeeze(-1)
        loss = (probs.amax(-1) - p_true).sum(1)
    else:
        # The authors' form: log-probabilities keep a gradient where p(y_i) is tiny, which the
        # probability difference flattens; the clamp keeps the loss positive once matched.
        logp = model.unembed(h_obs).float().log_softmax(-1)
        lp_true = logp.gather(-1, batch.continuation[..., None]).squeeze(-1)
        loss = (logp.amax(-1) - lp_true).clamp_min(1e-12).mean(1)
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

    `rows` names the batch rows the candidates belong to (default: all, in order). For logits,
    a cheap necessary condition runs first: the few largest observed logits, with a looser
    tolerance; only candidates that pass it pay for the full-vocabulary comparison.
    """
    if rows is None:
        rows = torch.arange(tokens.shape[0], device=tokens.device)
    n = tokens.shape[1]
    m = objective.output_tokens
    cont = batch.continuation[rows]
    embeds = context_embeds(model, model.embed(tokens), BatchTargets(cont, None, None))
    hidden = model.hidden(embeds)[:, observed_positions(model, n, m)]
    if objective.kind == "text":
        pred = model.unembed(hidden).argmax(-1)
        return (pred == cont).all(1)
    result = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
    alive = torch.arange(tokens.shape[0], device=tokens.device)
    # The probe compares raw logits; the other spaces need the whole row anyway.
    if model.split_forward and batch.probe_indices is not None and objective.space == "raw":
        probe_pred = model.unembed(hidden, batch.probe_indices[rows]).float()
        # Far looser than the real test than any rounding: it never rejects a true match.
        ok = torch.isclose(
            probe_pred, batch.probe_values[rows], atol=2 * atol + 1e-5, rtol=2 * rtol
        )
        alive = ok.flatten(1).all(1).nonzero().squeeze(1)
        if len(alive) == 0:
            return result
        hidden, rows = hidden[alive], rows[alive]
    values = batch.observed_values[rows]
    full = model.unembed(hidden).float()
    space = objective.space
    if space == "centred" and batch.observed_indices is None:
        full = full - full.mean(-1, keepdim=True)
    elif space == "logprobs":
        full = full.log_softmax(-1)  # monotone: the top-k set below is unchanged
    if batch.observed_indices is None:
        close = torch.isclose(full, values, atol=atol, rtol=rtol).flatten(1).all(1)
    else:
        indices = batch.observed_indices[rows]
        k = indices.shape[-1]
        at_obs = full.gather(-1, indices)
        if space == "centred":
            at_obs = at_obs - at_obs.mean(-1, keepdim=True)
        close = torch.isclose(at_obs, values, atol=atol, rtol=rtol).flatten(1).all(1)
        # Its own top-k must be the observed set (order-free: ties may swap equal values).
        own = full.topk(k, dim=-1).indices.sort(-1).values
        close &= (own == indices.sort(-1).values).flatten(1).all(1)
    result[alive] = close
    return result
