"""Zero rows appended to a pass so that each row's arithmetic keeps its bits whatever else is in
its batch, and the cached constant tensors (zeros, position ids) a forward reads."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

log = logging.getLogger(__name__)

# Why: a matmul over few rows (how few depends on the inner dimension and the thread count), or
# over a row count that leaves a remainder by a kernel's block of rows, rounds differently; an
# elementwise kernel computes a tensor's last (size mod vector width) elements in scalar code. So
# every pass gets zero rows appended, at least one (the tail falls on it) and enough for
# `row_rule`: on one thread a search's arithmetic is then the same whatever else is in its batch.
_ROW_RULES: dict[tuple[str, int], tuple[int, int]] = {}
PROBE_ROWS = 160  # the largest row count a CPU probe looks at
# Inner dimensions probed (the threshold grows with it, then levels off): every row count is
# tried at the narrow ones; the wide ones check the rule found, multiple by multiple.
PROBE_INNER = (64, 172, 512, 896)
PROBE_WIDE = (2048, 4096)
MAX_MULTIPLE = 32
WIDE_STREAK = 6


def _probe_case(inner: int, rows: int, gen: torch.Generator, device: torch.device):
    w = torch.randn(64, inner, generator=gen).to(device)
    x = torch.randn(rows, inner, generator=gen).to(device)
    g = torch.randn(rows, 64, generator=gen).to(device)
    return w, x, g, x @ w.T, g @ w


def _keeps_bits(rows: int, cases: list) -> bool:
    """Whether a product over the first `rows` rows gives each its bits of the larger one, both
    ways (x @ W.T and g @ W), in every case."""
    return all(
        torch.equal(x[:rows] @ w.T, forward[:rows]) and torch.equal(g[:rows] @ w, backward[:rows])
        for w, x, g, forward, backward in cases
    )


def row_rule(device: torch.device) -> tuple[int, int]:
    """(least, multiple): a matmul on `device` over `least` rows or more, a multiple of
    `multiple`, gives each row the same bits as a larger one does, at every inner dimension
    probed and the current thread count; measured once per process. A GPU is probed for the
    least count only: cuBLAS picks kernels by the row count, and the one-answer contract is a
    CPU's."""
    key = (device.type, torch.get_num_threads() if device.type == "cpu" else 0)
    if key in _ROW_RULES:
        return _ROW_RULES[key]
    gen = torch.Generator().manual_seed(0)
    cpu = device.type == "cpu"
    most = PROBE_ROWS if cpu else 64
    narrow = [_probe_case(i, 2 * most, gen, device) for i in PROBE_INNER]
    if not cpu:
        narrow += [_probe_case(i, 2 * most, gen, device) for i in PROBE_WIDE]
    good = [_keeps_bits(rows, narrow) for rows in range(most + 1)]
    least, multiple = most + 1, 1
    for step in range(1, MAX_MULTIPLE + 1 if cpu else 2):
        bad = [rows for rows in range(step, most + 1, step) if not good[rows]]
        floor = bad[-1] + step if bad else step
        if floor + 4 * step <= most or not cpu:  # seen to hold over four multiples and more
            least, multiple = floor, step
            break
    if cpu:  # the wide dimensions: raise the floor until WIDE_STREAK multiples in a row hold
        wide = [_probe_case(i, 2 * most, gen, device) for i in PROBE_WIDE]
        rows, streak = least, 0
        while streak < WIDE_STREAK and rows <= most:
            streak = streak + 1 if _keeps_bits(rows, wide) else 0
            least = least if streak else rows + multiple
            rows += multiple
    _ROW_RULES[key] = (least, multiple)
    why = "matmuls on %s keep each row's bits from %d rows, in multiples of %d"
    log.info(why, key, least, multiple)
    return least, multiple


def rows_invariant(rows: int, device: torch.device) -> bool:
    """Whether a matmul over `rows` rows on `device` keeps each row's bits (`row_rule`)."""
    least, multiple = row_rule(device)
    return rows >= least and rows % multiple == 0


def pad_rows(x: Tensor, rows_per_item: int = 1, items: int = 0) -> Tensor:
    """`x` with zero items appended along dim 0: at least one, and enough for `row_rule`'s rows
    in all (an item of a (B, L, d) batch is L rows). `items`: a static batch size (the
    scheduler's), whose padded size is then the same for any count of items up to it."""
    extra = padding_items(x.shape[0], x.device, rows_per_item, items)
    return torch.cat([x, _zeros((extra, *x.shape[1:]), x.dtype, x.device)])


def padding_items(count: int, device: torch.device, rows_per_item: int = 1, items: int = 0) -> int:
    """How many zero items `pad_rows` appends to `count` items (the one rule, for a caller that
    keeps its own zero rows after its tensor instead)."""
    least, multiple = row_rule(device)
    per = max(rows_per_item, 1)
    total = max(count + 1, -(-least // per), items + 1)
    step = multiple // math.gcd(multiple, per)  # items whose rows make a multiple
    return -(-total // step) * step - count


_ZEROS: dict[tuple[object, ...], Tensor] = {}


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """Zeros of this shape: a view of one buffer per row shape, grown when a request outgrows
    it (a search pads the same few shapes every step). Only ever read: `torch.cat` copies it."""
    key = (shape[1:], dtype, str(device))
    zeros = _ZEROS.get(key)
    if zeros is None or len(zeros) < shape[0]:
        if zeros is None and len(_ZEROS) >= 32:
            _ZEROS.clear()
        _ZEROS[key] = zeros = torch.zeros(shape, dtype=dtype, device=device)
    return zeros[: shape[0]]


def cached(cache: dict[Any, Tensor], key: Any, make: Callable[[], Tensor]) -> Tensor:
    """`cache[key]`, made on a miss by `make()` (past 256 entries the cache starts afresh)."""
    if key not in cache:
        if len(cache) > 256:
            cache.clear()
        cache[key] = make()
    return cache[key]


_POSITIONS: dict[tuple[int, str], Tensor] = {}


def prepared_positions(length: int, device: torch.device) -> Tensor:
    """(1, L) position ids 0 .. L-1, made once per length and device: what a transformers model
    makes on every forward when given none (two operations per forward). Only ever read."""
    key = (length, str(device))
    return cached(_POSITIONS, key, lambda: torch.arange(length, device=device)[None])
