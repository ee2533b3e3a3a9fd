"""Targets: what the auditor observed, as tensors. Built from known inputs (the model's own
output, `make_targets`), from observed text (`targets_from_text`) or from observed logits
(`targets_from_logits`, `read_logits_file`). Scoring a candidate against them is
`sodaray.objective.objectives`' job; what each observation kind records is
`sodaray.objective.observations`'.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from sodaray.errors import first_line
from sodaray.model.loaded import LoadedModel
from sodaray.objective.objectives import Objective
from sodaray.objective.observations import observation, observed_in_space, raw_shift

log = logging.getLogger(__name__)


@dataclass
class TargetSet:
    """N observed outputs to invert, as tensors on the CPU (rows enter the search in batches).

    `continuation` (N, m) is the target's greedy continuation: fixed context after the input
    for the logits objective, and the observed text for the text objective. `observed_values`
    (N, m, k) and `observed_indices` (N, m, k) hold the observed logits (indices None = all V),
    in the objective's space; `observed_shift` (N, m) what that space took from each position's
    raw logits, for the confirm in both spaces (`Objective.confirm`). None for raw logits and
    text, and for a file of logits: its values may carry an offset (an API's per-request shift,
    which the centred and logprobs spaces forgive), so its raw logits are not known.
    """

    objective: Objective
    continuation: Tensor
    observed_values: Tensor | None = None
    observed_indices: Tensor | None = None
    observed_shift: Tensor | None = None
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
            observed_shift=None if self.observed_shift is None else self.observed_shift[idx],
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
            raise ValueError(
                f"token id {bad[0]} is outside the model's vocabulary [0, {model.vocab_size})"
            )


@torch.no_grad()
def greedy_continuation(
    model: LoadedModel, tokens: Tensor, steps: int, *, canonical: bool = False
) -> tuple[Tensor, Tensor]:
    """Greedy continuation (B, steps) of equal-length inputs and the logits that chose it
    (B, steps, V). Re-runs the whole sequence per step: `steps` is small here.

    `canonical` (what targets are made with): every forward in the match check's own shape
    (`LoadedModel.canonical_logits`), over the input and `steps - 1` positions after it,
    filled as they are chosen. A causal model's logits at a position do not see the later
    ones, bit for bit, so the logits returned are exactly those the check computes for the
    true input with its continuation in place."""
    if not canonical:
        seq = tokens
        chosen, logits_seen = [], []
        for _ in range(steps):
            logits = model.token_logits(seq)[:, -1].float()
            nxt = logits.argmax(-1)
            chosen.append(nxt)
            logits_seen.append(logits)
            seq = torch.cat([seq, nxt[:, None]], dim=1)
        return torch.stack(chosen, 1), torch.stack(logits_seen, 1)
    n = tokens.shape[1]
    seq = torch.cat([tokens, tokens.new_zeros(len(tokens), steps - 1)], dim=1)
    chosen = tokens.new_zeros(len(tokens), steps)
    for i in range(steps):
        logits = model.canonical_logits(seq, steps)
        chosen[:, i] = logits[:, i].argmax(-1)
        if i + 1 < steps:
            seq[:, n + i] = chosen[:, i]
    if not torch.equal(logits.argmax(-1), chosen):  # a later position changed an earlier one
        log.warning("the model's logits at a position depend on later ones; matches may be missed")
    return chosen, logits


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
    kind = observation(objective.kind)
    m = objective.output_tokens
    conts, values, indices, shifts = [], [], [], []
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
        cont, logits = greedy_continuation(model, x, m, canonical=True)
        for j, i in enumerate(rows):
            by_row[i] = (cont[j].cpu(), logits[j].cpu())
        start = end
    for i in range(len(tokens)):
        cont, logits = by_row[i]
        conts.append(cont)
        vals, idx = kind.record(objective, logits)
        if vals is not None:
            values.append(vals)
        if idx is not None:
            indices.append(idx)
        if objective.kind == "logits":
            shifts.append(raw_shift(objective, logits))
    return TargetSet(
        objective=objective,
        continuation=torch.stack(conts),
        observed_values=torch.stack(values) if values else None,
        observed_indices=torch.stack(indices) if indices else None,
        observed_shift=None if not shifts or shifts[0] is None else torch.stack(shifts),
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
    kind = np.asarray(values).dtype
    if kind == np.bool_ or not np.issubdtype(kind, np.number):  # a cast would make 0s and 1s
        what = "booleans" if kind == np.bool_ else f"{kind.name.rstrip('0123456789')}s"
        raise ValueError(f"the logits file holds {what} (dtype {kind}), not numbers")
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


def _check_npy(path: Path) -> None:
    """A `.npy` file's header, checked before numpy reads the array: the NUMPY magic bytes, a
    header numpy can read, no Python objects, and exactly the bytes the header's shape and
    dtype need (a file cut short, or one whose header claims more than it holds: numpy would
    allocate what the header says before finding out). ValueError naming the file."""
    from numpy.lib import format as npy

    size = path.stat().st_size
    with path.open("rb") as f:
        if f.read(6) != npy.MAGIC_PREFIX:
            raise ValueError(f"{path}: not a .npy file (it does not start with the NUMPY bytes)")
        f.seek(0)
        try:
            version = npy.read_magic(f)
            read = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
            shape, _, dtype = read(f)
        except (ValueError, EOFError, SyntaxError, TypeError) as exc:
            raise ValueError(f"{path}: damaged .npy header ({first_line(exc)})") from exc
        if dtype.hasobject:
            raise ValueError(
                f"{path}: holds Python objects, not numbers; refused (never unpickled)"
            )
        needed = f.tell() + math.prod(shape) * dtype.itemsize
    if needed != size:
        raise ValueError(
            f"{path}: its header describes an array of shape {tuple(shape)} ({needed:,} bytes "
            f"with the header) but the file has {size:,} bytes: cut short or damaged"
        )


def read_logits_file(path: str | Path) -> tuple[np.ndarray, np.ndarray | None]:
    """Read observed logits from .npy (values only) or .safetensors (`values`/`logits` and
    optional `indices`). Never unpickles."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"logits file {path} is a directory, not a .npy or .safetensors file")
    if not path.is_file():
        raise ValueError(f"logits file not found: {path}")
    if path.suffix not in (".npy", ".safetensors"):
        raise ValueError(f"logits file must be .npy or .safetensors, not {path.suffix!r}")
    if path.suffix == ".npy":
        try:  # before numpy reads it
            _check_npy(path)
        except ValueError as exc:  # "PATH: why"
            raise ValueError(f"cannot read logits file {exc}") from exc
    try:
        if path.suffix == ".npy":
            return np.load(path, allow_pickle=False), None
        from safetensors.numpy import load_file

        data = load_file(str(path))
    except Exception as exc:
        raise ValueError(f"cannot read logits file {path}: {first_line(exc)}") from exc
    key = "values" if "values" in data else "logits" if "logits" in data else None
    if key is None:
        raise ValueError(f"{path}: expected a tensor named 'values' or 'logits'")
    return data[key], data.get("indices")
