"""Targets: what the auditor observed, as tensors. Built from known inputs (the model's own
output, `make_targets`), from observed text (`targets_from_text`) or from observed logits
(`targets_from_logits`, `read_logits_file`)."""

from __future__ import annotations

import itertools
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

    `continuation` (N, m) is the target's greedy continuation: context after the input for
    logits, the observed text for text. `observed_values`/`observed_indices` (N, m, k) are the
    observed logits in the objective's space (indices None: all V); `observed_shift` (N, m)
    what that space took from the raw logits, for `Objective.confirm` (None for raw logits,
    text, and a file's logits, which may carry an offset).
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
        names = ("continuation", "observed_values", "observed_indices", "observed_shift")
        tensors = {n: None if (t := getattr(self, n)) is None else t[idx] for n in names}
        true = None if self.true_tokens is None else [self.true_tokens[i] for i in rows]
        return replace(
            self, **tensors, true_tokens=true, sample_ids=[self.sample_ids[i] for i in rows]
        )


# ---- building targets ---------------------------------------------------------------------------
def _tolerance(model: LoadedModel, objective: Objective) -> dict[str, float]:
    """`atol` and `rtol`: the objective's, or the model's default where it gives none."""
    default = model.default_tolerance
    return {t: default if (v := getattr(objective, t)) is None else v for t in ("atol", "rtol")}


@torch.no_grad()
def greedy_continuation(
    model: LoadedModel, tokens: Tensor, steps: int, *, canonical: bool = False
) -> tuple[Tensor, Tensor]:
    """Greedy continuation (B, steps) of equal-length inputs and the logits that chose it
    (B, steps, V), re-running the whole sequence per step. `canonical` (how targets are made):
    every forward in the match check's own shape (`LoadedModel.canonical_logits`), so the
    logits are exactly those the check computes for the true input with its continuation."""
    n = tokens.shape[1]
    if not canonical:
        seq, seen = tokens, []
        for _ in range(steps):
            seen.append(model.token_logits(seq)[:, -1].float())
            seq = torch.cat([seq, seen[-1].argmax(-1)[:, None]], dim=1)
        return seq[:, n:], torch.stack(seen, 1)
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
        if not all(texts):
            raise ValueError("an input text is empty")
        tokens = [model.encode(t) for t in texts]
    tokens = [[int(t) for t in row] for row in tokens]
    for row in tokens:
        if not row:
            raise ValueError("an input has no tokens")
        if bad := [t for t in row if not 0 <= t < model.vocab_size]:
            raise ValueError(
                f"token id {bad[0]} is outside the model's vocabulary [0, {model.vocab_size})"
            )
    if objective.top_k is not None and objective.top_k > model.vocab_size:
        raise ValueError(
            f"top_k={objective.top_k} is larger than the vocabulary ({model.vocab_size})"
        )
    by_row: dict[int, tuple[Tensor, Tensor]] = {}
    # Equal lengths share a forward, of at most `batch_size` inputs.
    order = sorted(range(len(tokens)), key=lambda i: len(tokens[i]))
    for _, group in itertools.groupby(order, key=lambda i: len(tokens[i])):
        same = list(group)
        for start in range(0, len(same), batch_size):
            rows = same[start : start + batch_size]
            x = torch.tensor([tokens[i] for i in rows], device=model.device)
            cont, logits = greedy_continuation(model, x, objective.output_tokens, canonical=True)
            by_row.update((i, (cont[j].cpu(), logits[j].cpu())) for j, i in enumerate(rows))
    seen = [by_row[i] for i in range(len(tokens))]
    recorded = [observation(objective.kind).record(objective, logits) for _, logits in seen]

    def stacked(parts: list[Tensor | None]) -> Tensor | None:
        return None if not parts or parts[0] is None else torch.stack(parts)

    return TargetSet(
        objective=objective,
        continuation=torch.stack([cont for cont, _ in seen]),
        observed_values=stacked([values for values, _ in recorded]),
        observed_indices=stacked([indices for _, indices in recorded]),
        observed_shift=stacked([raw_shift(objective, logits) for _, logits in seen]),
        true_tokens=tokens,
        **_tolerance(model, objective),
    )


def targets_from_text(
    model: LoadedModel, observed: list[str], *, objective: Objective | None = None
) -> TargetSet:
    """Targets from observed output texts (the text objective; true inputs unknown): each
    text's tokens are the greedy continuation to reproduce, all of one length."""
    if not all(observed):
        raise ValueError("an observed output text is empty")
    encoded = [model.encode(text) for text in observed]
    if len(lengths := {len(e) for e in encoded}) > 1:
        raise ValueError(
            "observed texts tokenize to different lengths "
            f"({sorted(lengths)}); invert them in separate calls"
        )
    base = replace(objective or Objective(), kind="text", top_k=None, output_tokens=len(encoded[0]))
    return TargetSet(
        objective=base,
        continuation=torch.tensor(encoded, dtype=torch.long),
        **_tolerance(model, base),
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
    _, m, k = values.shape
    top_k = None if indices is None else k
    if top_k is None and k != model.vocab_size:
        raise ValueError(
            f"logits have {k} entries per position but the model's vocabulary is "
            f"{model.vocab_size}; pass indices for top-k logits"
        )
    if top_k and (int(indices.min()) < 0 or int(indices.max()) >= model.vocab_size):
        raise ValueError(f"logits indices fall outside the vocabulary [0, {model.vocab_size})")
    if top_k and k > 1 and (indices.sort(-1).values.diff(dim=-1) == 0).any():
        raise ValueError("logits indices repeat a vocabulary index at one position")
    if not torch.isfinite(values).all():
        raise ValueError("observed logits contain NaN or infinity")
    base = replace(objective or Objective(), kind="logits", top_k=top_k, output_tokens=m)
    values = observed_in_space(values, base.space, top_k=top_k is not None)
    # The greedy continuation is the argmax of each observed position.
    best = values.argmax(-1)
    cont = best if indices is None else indices.gather(-1, best[..., None]).squeeze(-1)
    return TargetSet(
        objective=base,
        continuation=cont,
        observed_values=values,
        observed_indices=indices,
        **_tolerance(model, base),
    )


def _check_npy(path: Path) -> None:
    """A `.npy` file's header, checked before numpy reads the array: the NUMPY magic bytes, a
    header numpy can read, no Python objects, and exactly the bytes the header's shape and
    dtype need (numpy would allocate what a header claims before finding the file short)."""
    from numpy.lib import format as npy

    size = path.stat().st_size
    with path.open("rb") as f:
        if f.read(6) != npy.MAGIC_PREFIX:
            raise ValueError("not a .npy file (it does not start with the NUMPY bytes)")
        f.seek(0)
        try:
            version = npy.read_magic(f)
            read = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
            shape, _, dtype = read(f)
        except (ValueError, EOFError, SyntaxError, TypeError) as exc:
            raise ValueError(f"damaged .npy header ({first_line(exc)})") from exc
        if dtype.hasobject:
            raise ValueError("holds Python objects, not numbers; refused (never unpickled)")
        needed = f.tell() + math.prod(shape) * dtype.itemsize
    if needed != size:
        raise ValueError(
            f"its header describes an array of shape {tuple(shape)} ({needed:,} bytes "
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
    try:
        if path.suffix == ".npy":
            _check_npy(path)  # before numpy reads it
            return np.load(path, allow_pickle=False), None
        from safetensors.numpy import load_file

        data = load_file(str(path))
    except Exception as exc:
        raise ValueError(f"cannot read logits file {path}: {first_line(exc)}") from exc
    if (key := "values" if "values" in data else "logits" if "logits" in data else None) is None:
        raise ValueError(f"{path}: expected a tensor named 'values' or 'logits'")
    return data[key], data.get("indices")
