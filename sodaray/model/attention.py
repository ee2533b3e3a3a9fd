"""Attention whose result for a sequence does not depend on how wide the padded batch around it
is, so that searches of any input length can share one transformer pass bit for bit.

Why: PyTorch's fused attention blocks and vectorises its key loop by the padded width, so a
sequence's rounding would move with the longest input in its batch. How: inside `invariant()`
(the relaxed gradient pass), attention is plain matmuls on queries, keys and values zero-padded to
a multiple of `BLOCK` positions, masked with -inf, and a softmax over the padded width: the extra
keys add exact zeros and every reduction sees the same vector layout whatever the width. Outside
the block the model's own SDPA runs, unchanged: targets and the hard-max check see the model as
deployed. It goes in through transformers' `AttentionInterface` and `AttentionMaskInterface` (as
`sodaray-invariant`, with SDPA's masks); a model whose attention cannot take it keeps its own, and
its searches share a pass only with searches of their own length (`LoadedModel.invariant`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from sodaray.model.padding import cached

log = logging.getLogger(__name__)

NAME = "sodaray-invariant"
BLOCK = 16  # padded width granularity: a multiple of the widest float vector (AVX-512: 16)

_state = threading.local()  # per thread: the engine steps on its own thread


def _active() -> bool:
    return getattr(_state, "depth", 0) > 0


@contextlib.contextmanager
def invariant() -> Iterator[None]:
    """Width-invariant attention for the models that took it (`install`), inside the block."""
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        yield
    finally:
        _state.depth -= 1


def _padded_attention(
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None, scale: float | None, cap: Any
) -> Tensor:
    """softmax(q k^T * scale + mask) v over zero-padded positions; (B, L, H, hd) like SDPA.
    Grouped-query heads stay grouped: a key head's query heads are rows of one matmul."""
    batch, heads, length, dim = query.shape
    kv_heads, keys = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    width = max(-(-max(length, keys) // BLOCK) * BLOCK, BLOCK)
    q = nn.functional.pad(query, (0, 0, 0, width - length))
    q = q.reshape(batch, kv_heads, groups * width, dim)  # one key head's query heads: rows
    k = nn.functional.pad(key, (0, 0, 0, width - keys))
    v = nn.functional.pad(value, (0, 0, 0, width - keys))
    scale = dim**-0.5 if scale is None else scale
    bias = _causal_bias(width, keys - length, keys, groups, query.device, query.dtype)
    bias = bias.view(1, 1, groups, width, width)
    if mask is not None:
        # SDPA's mask joins the causal bias, so that whether transformers sends one for a width
        # (a sliding window does from some width on) changes no kernel, only the bias's values,
        # exact 0s wherever both let a query see a key: the same bits with a mask or without.
        bias = bias + _mask_bias(mask, length, keys, width, heads, kv_heads, bias.dtype)
    if cap is None:  # the usual case: one fused op
        per_head = bias.shape[0] * bias.shape[1] > 1  # else one (GW, W) bias for every head
        rows = bias.expand(batch, kv_heads, -1, -1, -1) if per_head else bias
        rows = rows.reshape(-1, groups * width, width)  # (1 or B x kv heads, GW, W)
        q_rows = q.reshape(batch * kv_heads, groups * width, dim)
        k_cols = k.reshape(batch * kv_heads, width, dim).transpose(1, 2)
        scores = torch.baddbmm(rows, q_rows, k_cols, alpha=scale)
    else:
        scores = torch.matmul(q, k.transpose(-1, -2))
        scores = torch.tanh(scores * (scale / cap)) * cap
        scores = scores.view(batch, kv_heads, groups, width, width) + bias
    scores = scores.view(batch, kv_heads, groups * width, width)
    # Half precision: the softmax in float32, as the models' own eager attention.
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(scores.dtype)
    out = torch.matmul(probs, v)
    out = out.view(batch, heads, width, dim)[:, :, :length]
    return out.transpose(1, 2).contiguous()


def _mask_bias(
    mask: Tensor, length: int, keys: int, width: int, heads: int, kv_heads: int, dtype: torch.dtype
) -> Tensor:
    """SDPA's attention mask (B or 1, H or 1, L, keys; True attends, or a float added) as an
    additive bias padded to (B or 1, kv heads or 1, groups or 1, width, width)."""
    mask = mask[..., :length, :keys]
    if mask.dtype == torch.bool:
        mask = torch.zeros_like(mask, dtype=dtype).masked_fill(~mask, -torch.inf)
    mask = nn.functional.pad(mask.to(dtype), (0, width - keys, 0, width - length))
    if mask.shape[1] == 1:
        return mask.unsqueeze(1)  # (B or 1, 1, 1, W, W)
    return mask.view(mask.shape[0], kv_heads, heads // kv_heads, width, width)


_BIAS: dict[tuple[Any, ...], Tensor] = {}


def _causal_bias(
    width: int, offset: int, keys: int, groups: int, device: torch.device, dtype: torch.dtype
) -> Tensor:
    """(groups * width, width): 0 where query i (at position offset + i) may see key j, else
    -inf (keys past `keys` are padding), once per query head of a key head. Cached: a search
    asks for the same few widths every step (a captured step reads the cached tensor where it
    lies: `executor.pinned_caches` keeps it alive)."""

    def make() -> Tensor:
        rows = torch.arange(width, device=device)[:, None] + offset
        cols = torch.arange(width, device=device)[None, :]
        blocked = (cols > rows) | (cols >= keys)
        bias = torch.zeros(width, width, dtype=dtype, device=device)
        return bias.masked_fill(blocked, -torch.inf).repeat(groups, 1)

    return cached(_BIAS, (width, offset, keys, groups, str(device), dtype), make)


def _attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if attention_mask is not None and getattr(attention_mask, _PLAIN, False):
        attention_mask = None  # `prepared_mask`: what SDPA's causal skip would have given
    unsupported = {k for k in ("s_aux", "sinks", "position_bias") if kwargs.get(k) is not None}
    if not _active() or dropout or unsupported:
        if _active() and unsupported:  # `install` refuses such models; say so if one slips by
            log.warning("width-invariant attention skipped (%s)", ", ".join(sorted(unsupported)))
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    cap = kwargs.get("softcap")
    return _padded_attention(query, key, value, attention_mask, scaling, cap), None


_registered = False


def install(model: nn.Module) -> bool:
    """Route `model`'s attention through this module (SDPA outside `invariant()`). Returns
    whether it took: only a model on SDPA whose class takes the attention interface does."""
    global _registered
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) == NAME:
        return True
    setter = getattr(model, "set_attn_implementation", None)
    if getattr(config, "_attn_implementation", None) != "sdpa" or setter is None:
        return False
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

        if not _registered:
            AttentionInterface.register(NAME, _attention)
            AttentionMaskInterface.register(NAME, sdpa_mask)
            _registered = True
        setter(NAME)
    except (ImportError, ValueError, AttributeError, TypeError) as exc:
        log.info("width-invariant attention unavailable for this model: %s", exc)
        return False
    return getattr(config, "_attn_implementation", None) == NAME


# Config fields that bound how far a query sees: past them transformers builds another mask than
# the causal one for some layers, so a prepared causal mask is given only to shorter sequences.
_WINDOWS = ("sliding_window", "window_size", "attention_chunk_size")
_PREPARED: dict[tuple[Any, ...], Tensor] = {}
_PLAIN = "_sodaray_plain_causal"  # marks a prepared mask `_attention` reads as "no mask"


def prepared_mask(
    model: nn.Module, length: int, dtype: torch.dtype, device: torch.device
) -> Tensor | None:
    """A (1, 1, L, L) causal mask, cached, that stands in for the one transformers would build
    (on every forward) for a sequence of `length` positions; None where none can (an
    implementation other than eager or this module's, or a window shorter than the sequence).
    Eager: transformers' own additive mask (0 where a query sees a key, else the dtype's
    minimum). This module's: transformers builds none here (SDPA's causal skip), so the mask
    is True-where-visible, marked plain, and `_attention` turns it back into no mask. A 4D
    mask is used as is (`create_causal_mask`); `LoadedModel` checks once per model that it
    gives the same logits, bit for bit, else lets transformers build its own."""
    implementation = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if implementation not in ("eager", NAME):
        return None
    for name in _WINDOWS:
        window = getattr(model.config, name, None)
        if isinstance(window, int) and 0 < window < length:
            return None

    def make() -> Tensor:
        positions = torch.arange(length, device=device)
        sees = (positions[None, :] <= positions[:, None])[None, None]
        if implementation != "eager":
            setattr(sees, _PLAIN, True)
            return sees
        blocked = torch.tensor(torch.finfo(dtype).min, dtype=dtype, device=device)
        return torch.where(sees, torch.zeros((), dtype=dtype, device=device), blocked)

    return cached(_PREPARED, (implementation, length, dtype, str(device)), make)
