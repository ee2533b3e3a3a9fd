"""Scoring a batch of candidate inputs against their targets: where each input sits in the batch
(`Layout`), the relaxed loss with the fluency penalty, and the exact-match check.

Inputs of different lengths share one batch. Each slot's sequence is laid out as the model saw
it when the target was made (fixed prefix, the input, the target's continuation) from position
0, and shorter sequences are padded at the END. Under the causal mask nothing attends to a later
position, so the outputs a slot is scored on are those of its own unpadded sequence (equal up to
float rounding): no attention mask and no position ids are needed, and every model family works
as it does unbatched (rotary, absolute and sliding-window positions alike). The padding costs
transformer compute only; the (rows, V) state of a relaxed search holds no padding at all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from sodaray.model.loaded import LoadedModel
from sodaray.model.padding import padding_items
from sodaray.objective.objectives import Objective
from sodaray.objective.observations import BatchTargets, observation, screen_slack

Index = Tensor | np.ndarray  # integer indices on the device, or planned on the host

# Sequences a search's `misses` holds at most (`check_sequences`): bytes of a few tokens each;
# past it, a near miss is confirmed again each time it comes back (slower, never wrong).
MISS_MEMORY = 1024


def observed_positions(lengths: Index, prefix: int, m: int) -> tuple[Index, Index]:
    """(B, 1) sequence indices and (B, m) positions of the final states whose next-token logits
    are observed, for inputs of `lengths` after a prefix of `prefix` tokens: each input's last
    position (its first observed one) and the m - 1 after it. On the host for host `lengths`
    (numpy), where a caller that planned its sequences there makes them without a kernel."""
    if isinstance(lengths, Tensor):
        rows, steps = (torch.arange(k, device=lengths.device) for k in (len(lengths), m))
    else:
        rows, steps = np.arange(len(lengths)), np.arange(m)
    return rows[:, None], prefix + lengths[:, None] - 1 + steps


@dataclass
class Layout:
    """Where each slot's input sits: slot b holds `lengths[b]` tokens, and a packed (T, ...)
    input holds them in the rows where `row_slot == b`, at input positions `row_offset`.
    `longest` is the largest length (known on the host: it sizes the padded sequence)."""

    lengths: Tensor  # (B,) long
    row_slot: Tensor  # (T,) long
    row_offset: Tensor  # (T,) long
    longest: int
    # Index tensors derived from the layout, made on first use: a batch's layout lives for many
    # steps, and each derivation is a few operations (kernels on a GPU) a step.
    _derived: dict[tuple[object, ...], Any] = field(default_factory=dict, repr=False, compare=False)

    def _once(self, key: tuple[object, ...], make: Callable[[], Any]) -> Any:
        if key not in self._derived:
            self._derived[key] = make()
        return self._derived[key]

    def input_index(
        self, prefix: int, item: int | None = None, spare: int = 0
    ) -> tuple[Tensor, Tensor]:
        """(sequence, position) of each packed row after a prefix of `prefix` tokens, and of
        `spare` rows more at positions 0, 1, ... of sequence `item` (a padding item)."""
        positions = self._once(("input", prefix), lambda: self.row_offset + prefix)
        if not spare:
            return self.row_slot, positions
        dev = self.row_slot.device
        return self._once(
            ("input", prefix, item, spare),
            lambda: (
                torch.cat([self.row_slot, torch.full((spare,), item, device=dev)]),
                torch.cat([positions, torch.arange(spare, device=dev)]),
            ),
        )

    def observed(self, prefix: int, m: int) -> tuple[Tensor, Tensor]:
        """`observed_positions` of this layout's slots, made once."""
        key = ("observed", prefix, m)
        return self._once(key, lambda: observed_positions(self.lengths, prefix, m))

    @classmethod
    def uniform(cls, batch: int, length: int, device: torch.device) -> Layout:
        """`batch` inputs of `length` tokens, packed slot after slot."""
        return cls(
            torch.full((batch,), length, dtype=torch.long, device=device),
            torch.arange(batch, device=device).repeat_interleave(length),
            torch.arange(length, device=device).repeat(batch),
            length,
        )

    @property
    def batch(self) -> int:
        return int(self.lengths.shape[0])

    def select(self, slots: Tensor, longest: int | None = None) -> tuple[Layout, Tensor]:
        """The layout of `slots` alone (renumbered 0..len-1) and the packed rows they hold."""
        inverse = torch.full((self.batch,), -1, dtype=torch.long, device=self.lengths.device)
        inverse[slots] = torch.arange(len(slots), device=slots.device)
        rows = (inverse[self.row_slot] >= 0).nonzero().squeeze(1)
        lengths = self.lengths[slots]
        if longest is None:
            longest = int(lengths.max()) if len(slots) else 0
        sub = Layout(lengths, inverse[self.row_slot[rows]], self.row_offset[rows], longest)
        return sub, rows


def sequence_embeds(
    model: LoadedModel,
    layout: Layout,
    rows: Tensor,
    continuation: Tensor,
    width: int | None = None,
    items: int | None = None,
    spare: int = 0,
) -> Tensor:
    """(B, prefix + width + m - 1, d): the prefix, each slot's input rows (T, d) and its
    continuation but the last observed token, padded at the end with zeros; `width` (default:
    the longest input) is the input positions the sequence has room for. `items` given: the
    zero items `pad_rows(seq, L, items)` would append are made with it (for
    `LoadedModel.hidden(prepadded=True)`: one tensor, not a second one and a copy). `spare`
    (with `items`): `rows` ends with that many rows the layout does not place; they go to the
    first padding item, whose outputs nothing reads (so the caller need not slice them off)."""
    batch, d = layout.batch, rows.shape[-1]
    p, m = len(model.prefix_ids), continuation.shape[1]
    length = p + (width or layout.longest) + m - 1
    extra = 0 if items is None else padding_items(batch, rows.device, length, items)
    if spare > (length if extra else 0):
        raise ValueError("spare rows need a padding item with room for them")
    seq = rows.new_zeros(batch + extra, length, d)
    if p:
        seq[:batch, :p] = model.prefix_embeds(batch).to(rows.dtype)
    # In place: `seq` is new and has no history, and the out-of-place form copied it first.
    seq.index_put_(layout.input_index(p, batch if spare else None, spare), rows)
    if m > 1:
        after = p + layout.lengths[:, None] + torch.arange(m - 1, device=rows.device)
        slot = torch.arange(batch, device=rows.device)[:, None].expand(-1, m - 1)
        context = model.embed(continuation[:, :-1]).to(rows.dtype)
        seq.index_put_((slot.reshape(-1), after.reshape(-1)), context.reshape(-1, d))
    return seq


def observed_hidden(model: LoadedModel, layout: Layout, hidden: Tensor, m: int) -> Tensor:
    """(B, m, ·): the final states whose next-token logits are observed, at each slot's last
    input position and the m - 1 positions after it."""
    return hidden[layout.observed(len(model.prefix_ids), m)]


def context_embeds(model: LoadedModel, input_embeds: Tensor, batch: BatchTargets) -> Tensor:
    """Prefix + equal-length inputs (B, n, d) + fixed continuation context."""
    b, n, d = input_embeds.shape
    layout = Layout.uniform(b, n, input_embeds.device)
    return sequence_embeds(model, layout, input_embeds.reshape(b * n, d), batch.continuation)


def objective_loss(
    model: LoadedModel,
    objective: Objective,
    hidden: Tensor,
    layout: Layout,
    batch: BatchTargets,
    input_probs: Tensor | None = None,
) -> Tensor:
    """Per-slot loss (B,) from the final hidden states of `sequence_embeds`.

    `input_probs` (T, V) are the packed relaxed one-hots, needed only for the fluency penalty.
    """
    h_obs = observed_hidden(model, layout, hidden, objective.output_tokens)
    loss = observation(objective.kind).loss(model, objective, h_obs, batch)
    if objective.fluency_weight > 0:
        penalty = fluency_penalty(model, hidden, layout, input_probs, form=objective.fluency_form)
        loss = loss + objective.fluency_weight * penalty
    return loss


def fluency_penalty(
    model: LoadedModel,
    hidden: Tensor,
    layout: Layout,
    input_probs: Tensor | None,
    *,
    form: str = "argmax",
) -> Tensor:
    """Eq. 6: each slot's mean negative log-likelihood of its own tokens, (B,).

    `argmax` (the paper's): the NLL of each relaxed one-hot's most likely token, the gradient
    flowing through the model's predictions only. `relaxed`: the cross-entropy between each
    relaxed one-hot and the model's prediction for that position. The first input token is
    scored only when a prefix (e.g. BOS) precedes it; a slot with no scored token gets 0.
    """
    if input_probs is None:
        raise ValueError("the fluency penalty needs the relaxed input")
    p = len(model.prefix_ids)
    rows = (layout.row_offset >= (0 if p > 0 else 1)).nonzero().squeeze(1)
    slot = layout.row_slot[rows]
    out = hidden.new_zeros(layout.batch, dtype=torch.float32)
    if len(rows) == 0:
        return out
    # Position p + i - 1 predicts input token i.
    states = hidden[slot, p + layout.row_offset[rows] - 1]
    logp = model.unembed(states[None]).float()[0].log_softmax(-1)
    probs = input_probs[rows]
    if form == "argmax":
        nll = -logp.gather(-1, probs.argmax(-1, keepdim=True)).squeeze(-1)
    else:
        nll = -(probs.float() * logp).sum(-1)
    count = torch.zeros_like(out).index_add_(0, slot, torch.ones_like(nll))
    return out.index_add(0, slot, nll) / count.clamp_min(1.0)


@torch.no_grad()
def check_candidates(
    model: LoadedModel,
    objective: Objective,
    layout: Layout,
    tokens: Tensor,
    batch: BatchTargets,
    slots: Tensor,
    atol: float,
    rtol: float,
) -> Tensor:
    """Whether each candidate reproduces its observed output exactly, (C,) bool: candidate c
    has the packed tokens (T,) of `layout`'s slot c and is scored against row `slots[c]` of
    `batch` (see `check_sequences`)."""
    continuation = batch.continuation[slots]
    m = continuation.shape[1]
    seq = tokens.new_zeros(layout.batch, layout.longest + m - 1)
    seq[layout.row_slot, layout.row_offset] = tokens
    if m > 1:  # the continuation right after each input, but its last token
        after = layout.lengths[:, None] + torch.arange(m - 1, device=tokens.device)
        seq = seq.scatter(1, after, continuation[:, :-1])
    return check_sequences(model, objective, seq, layout.lengths, batch, slots, atol, rtol)


@torch.no_grad()
def check_sequences(
    model: LoadedModel,
    objective: Objective,
    sequences: Tensor,
    lengths: Index,
    batch: BatchTargets,
    rows: Tensor,
    atol: float,
    rtol: float,
    misses: Sequence[set[bytes]] | None = None,
) -> Tensor:
    """Whether each candidate reproduces its observed output exactly, (C,) bool. Candidate c is
    `sequences[c]`: its `lengths[c]` input tokens, then its row's continuation but the last
    observed token, then anything (padding), scored against row `rows[c]` of `batch` by the
    observation kind's own test.

    Two stages: a screen of the candidates in their own batch, the tolerance loosened past
    anything a shape does to the arithmetic (`observations.screen_slack`); then `confirm` of
    the few it lets through in the canonical shape, where targets were recorded. So a decision
    does not depend on what shared the batch, and a true input is never missed. `misses`: as
    `confirm`'s."""
    kind = observation(objective.kind)
    m, p = objective.output_tokens, len(model.prefix_ids)
    ids = sequences
    if p:
        ids = torch.cat([model.prefix_tensor(ids.device).expand(len(ids), -1), ids], dim=1)
    hidden = model.hidden(model.embed(ids))
    where = observed_positions(lengths, p, m)
    if not isinstance(lengths, Tensor):  # planned on the host: sent, not computed
        where = tuple(torch.as_tensor(i, device=ids.device) for i in where)
    observed = hidden[where]
    slack = screen_slack(model)
    passed = kind.probe(model, objective, observed, batch, rows)
    probed = passed is not None
    if passed is None:  # no cheap test: the screen on every candidate
        passed = kind.match(model, objective, observed, batch, rows, atol, rtol, slack)
    near = passed.nonzero().squeeze(1)
    if len(near) == 0:  # the usual step: all False, so no second tensor
        return passed
    if probed:  # the screen on the candidates the probe let through
        ok = kind.match(model, objective, observed[near], batch, rows[near], atol, rtol, slack)
        near = near[ok]
        if len(near) == 0:
            return torch.zeros_like(passed)
    host, where_near = sequences[near].cpu().numpy(), near.cpu().numpy()
    sizes = lengths[near].cpu().numpy() if isinstance(lengths, Tensor) else lengths[where_near]
    candidates = [host[i, : n + m - 1] for i, n in enumerate(sizes.tolist())]
    seen = None if misses is None else [misses[c] for c in where_near.tolist()]
    ok = confirm(model, objective, candidates, batch, rows[near], atol, rtol, seen)
    found = torch.zeros_like(passed)
    found[near] = torch.as_tensor(ok, device=found.device)
    return found


def confirm(
    model: LoadedModel,
    objective: Objective,
    candidates: Sequence[np.ndarray],
    batch: BatchTargets,
    rows: Tensor,
    atol: float,
    rtol: float,
    misses: Sequence[set[bytes]] | None = None,
) -> np.ndarray:
    """The match check's second stage, (C,) bool on the host: candidate c (its input tokens and
    its continuation but the last observed token, on the host) against row `rows[c]` of
    `batch`, in the canonical shape (`LoadedModel.canonical_logits`), where targets were
    recorded. `misses[c]` holds the sequences candidate c's search turned down before: the
    computation is deterministic, so one seen there is not computed again, and one turned down
    now joins it (up to `MISS_MEMORY` a search)."""
    kind = observation(objective.kind)
    m = objective.output_tokens
    found = np.zeros(len(candidates), dtype=bool)
    keys = [np.ascontiguousarray(c, dtype=np.int64).tobytes() for c in candidates]
    by_length: dict[int, list[int]] = {}
    for c in range(len(candidates)):
        if misses is None or keys[c] not in misses[c]:  # a miss seen before is not computed
            by_length.setdefault(len(candidates[c]), []).append(c)
    for group in by_length.values():
        tokens = torch.as_tensor(np.stack([candidates[c] for c in group]), device=rows.device)
        logits = model.canonical_logits(tokens, m)
        index = rows[torch.as_tensor(group, device=rows.device)]
        ok = kind.compare(objective, logits, batch, index, atol, rtol).cpu().numpy()
        found[group] = ok
        if misses is not None:
            for c, hit in zip(group, ok.tolist(), strict=True):
                if not hit and len(misses[c]) < MISS_MEMORY:
                    misses[c].add(keys[c])
    return found


def hard_match(
    model: LoadedModel,
    objective: Objective,
    tokens: Tensor,
    batch: BatchTargets,
    atol: float,
    rtol: float,
    rows: Tensor | None = None,
) -> Tensor:
    """Whether each equal-length candidate input (C, n) reproduces its observed output
    exactly, (C,) bool; `rows` names the batch rows they belong to (default: all, in order)."""
    if rows is None:
        rows = torch.arange(tokens.shape[0], device=tokens.device)
    layout = Layout.uniform(*tokens.shape, tokens.device)
    return check_candidates(model, objective, layout, tokens.reshape(-1), batch, rows, atol, rtol)


def slot_rows(row_slot: np.ndarray, row_offset: np.ndarray, batch: int) -> list[np.ndarray]:
    """Each slot's packed rows in input order (host bookkeeping for draws and answers)."""
    order = np.lexsort((row_offset, row_slot))
    counts = np.bincount(row_slot, minlength=batch)
    return np.split(order, np.cumsum(counts)[:-1]) if batch else []
