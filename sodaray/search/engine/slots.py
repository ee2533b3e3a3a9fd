"""Slot bookkeeping shared by the engine and every batch: host columns per slot (`SlotTable`),
tensors with spare capacity (`Buffers`), and the one rule for removing slots: the last live rows
move into the holes, every array indexed by slot applying the same `(holes, movers)` plan, so
the big per-row state (SODA's Z and moments) is never copied whole.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor


def removal_plan(count: int, removed: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
    """Removing `removed` (distinct indices) from `count` live entries: the new count and the
    moves `movers -> holes` that keep the survivors in [0, new count)."""
    removed = np.unique(np.asarray(removed, dtype=np.int64))
    left = count - len(removed)
    gone = np.zeros(count, dtype=bool)
    gone[removed] = True
    holes = np.flatnonzero(gone[:left])
    movers = left + np.flatnonzero(~gone[left:])
    return left, holes, movers


def locate(keys: np.ndarray, among: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each of `keys` sits in `among` (distinct values: slot ids, or row keys), and
    whether it is there at all (where not, the index is 0)."""
    if not len(among):
        return np.zeros(len(keys), dtype=np.int64), np.zeros(len(keys), dtype=bool)
    order = np.argsort(among)
    at = np.minimum(np.searchsorted(among[order], keys), len(order) - 1)
    present = among[order[at]] == keys
    return np.where(present, order[at], 0), present


class SlotTable:
    """Host columns indexed by slot, `len(self)` entries each in slot order: objects (dtype
    `object`) or rows of a fixed width (2-D, the width from the first append). `remove` makes
    new arrays and leaves the old as they were (a lagging batch's status may still read them);
    writes in place (`table["steps"] += 1`) go to the live column."""

    def __init__(self, columns: dict[str, Any]) -> None:
        self._columns = {name: np.zeros(0, dtype=kind) for name, kind in columns.items()}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[str]:
        return iter(self._columns)

    def __getitem__(self, name: str) -> np.ndarray:
        return self._columns[name]

    def __setitem__(self, name: str, values: np.ndarray) -> None:
        column = self._columns[name]
        if len(values) != self._count:
            raise ValueError(f"column {name!r} takes {self._count} entries, not {len(values)}")
        self._columns[name] = np.asarray(values, dtype=column.dtype)

    def append(self, values: dict[str, Sequence[Any]]) -> None:
        """Add slots at the end: every column gets the same number of entries."""
        if set(values) != set(self._columns):
            raise ValueError(f"append: the columns are {sorted(self._columns)}")
        added = {len(v) for v in values.values()}
        if len(added) != 1:
            raise ValueError("append: every column takes the same number of entries")
        for name, new in values.items():
            column = self._columns[name]
            if column.dtype == object:  # element by element: a sequence stays one entry
                rows = np.empty(len(new), dtype=object)
                rows[:] = list(new)
            else:
                rows = np.asarray(new, dtype=column.dtype)
            if not self._count and column.shape[1:] != rows.shape[1:]:
                column = column.reshape(0, *rows.shape[1:])  # a 2-D column's width
            self._columns[name] = np.concatenate([column, rows])
        self._count += added.pop()

    def remove(self, left: int, holes: np.ndarray, movers: np.ndarray) -> None:
        """Apply a removal plan to every column (new arrays: see the class docstring)."""
        for name, column in self._columns.items():
            moved = column.copy()
            moved[holes] = column[movers]
            self._columns[name] = moved[:left]
        self._count = left


class Buffers:
    """Tensors sharing a leading dimension of `len(self)` live rows, each in a buffer with
    spare capacity: appending writes the new rows (the buffer doubles when full), removing moves
    the last rows into the holes. `self["z"]` is the live view; in-place ops on it are kept.
    `guard` rows always follow the live ones (zeros at first, then whatever rows left): an op
    over them too keeps its scalar tail off the live rows (see `padding.pad_rows`)."""

    def __init__(self, guard: int = 0) -> None:
        self.count, self.guard = 0, guard
        self._buffers: dict[str, Tensor] = {}

    def __len__(self) -> int:
        return self.count

    def __contains__(self, name: str) -> bool:
        return name in self._buffers

    def __getitem__(self, name: str) -> Tensor:
        return self._buffers[name][: self.count]

    def view(self, name: str, rows: int) -> Tensor:
        """Rows [0, rows) of a buffer, live or not (a step at a bucketed shape reads rows past
        the live ones: whatever they hold, their results are dropped)."""
        buf = self._buffers[name]
        if rows > buf.shape[0]:
            raise ValueError(f"{rows} rows of {name!r} asked for, {buf.shape[0]} held")
        return buf[:rows]

    @property
    def capacity(self) -> int:
        """Rows every buffer holds, spare and guard rows included (0 before the first append)."""
        return min((b.shape[0] for b in self._buffers.values()), default=0)

    def reserve(self, rows: int) -> None:
        """Grow every buffer to hold at least `rows` rows (their addresses then change)."""
        for name, buf in self._buffers.items():
            if buf.shape[0] < rows:
                grown = buf.new_zeros((rows, *buf.shape[1:]))
                grown[: buf.shape[0]] = buf
                self._buffers[name] = grown

    def addresses(self) -> tuple[int, ...]:
        """The buffers' data pointers: what a captured step read, and must find again."""
        return tuple(b.data_ptr() for b in self._buffers.values())

    def append(self, values: dict[str, Tensor]) -> None:
        """Add rows: every buffer gets the same number, and a first append names the buffers."""
        added = {len(v) for v in values.values()}
        if len(added) != 1 or (self._buffers and set(values) != set(self._buffers)):
            raise ValueError("append: every buffer takes the same number of rows")
        (k,) = added
        if not self._buffers:  # empty, then grown below
            self._buffers = {name: rows[:0] for name, rows in values.items()}
        if self.capacity < self.count + k + self.guard:
            self.reserve(max(2 * self.count, self.count + k, 8) + self.guard)
        for name, rows in values.items():
            self._buffers[name][self.count : self.count + k] = rows
        self.count += k

    def remove(self, left: int, holes: np.ndarray, movers: np.ndarray) -> None:
        """Apply a removal plan (`removal_plan`)."""
        if len(holes):
            for buf in self._buffers.values():
                src = torch.as_tensor(movers, device=buf.device)
                dst = torch.as_tensor(holes, device=buf.device)
                buf[dst] = buf[src]
        self.count = left
