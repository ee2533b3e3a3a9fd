"""SODA's persistent batch: every value a step reads, in device buffers that admission and removal
write slot by slot, and the host's mirror of what it needs to plan.

Per row (a slot of length n has n rows, packed; one guard row after them): Z and Adam's moments
(T, V), and three tables of the slot's numbers, one column each: `h32` (float32, the step's
arithmetic: `H32`), `h64` (float64, the schedules' inputs, rounded to float32 once: `H64`) and
`hi` (int64: `HI`; `OFF` for a period that never fires). Per slot: the observed rows
(`BatchTargets`). On the host, two `SlotTable`s: per slot (`host`, `HOST_ARRAYS`) the same
numbers, its continuation and the confirm's misses; per row (`row_map`) its slot and offset.

A step only reads these buffers (and writes Z, the moments, the step counts and the
temperature). A composition change (`add`, `remove`) writes the rows and slots that changed and
marks the batch dirty for the step's planner (`step.plan_inputs`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from sodaray.model.loaded import LoadedModel
from sodaray.objective.objectives import Objective
from sodaray.objective.observations import BatchTargets, screen_slack
from sodaray.search.engine.base import SlotEntry, keyed_generator, observed_rows
from sodaray.search.engine.slots import Buffers, SlotTable, removal_plan

# Columns of the per-row tables, in their order (`tau`: the next step's temperature; the first
# four are `adam_step`'s arguments by name).
H32 = ("learning_rate", "one_minus_beta1", "one_minus_beta2", "eps", "tau", "decay")
H64 = ("temperature", "temperature_end", "beta1", "beta2")
HI = ("step", "budget", "reset", "reinit", "bias")
OFF = 1 << 62  # a period no search reaches: a schedule that is off never fires

# Per-slot host columns (`SodaState.host`), in slot order beside the buffers (`add` says what
# each holds): `id` is unique per slot ever admitted, `context` the observed continuation but
# its last token (the screen's), `misses` what the confirm turned down (`scoring.MISS_MEMORY`).
_INTS = ("length", "reinit", "reset", "config", "group", "seed", "sample_id", "id", "context")
HOST_ARRAYS = {**dict.fromkeys(_INTS, np.int64), "reinit_std": np.float64, "misses": object}
HOST_ARRAYS |= dict.fromkeys(("bias", "anneals", "decays", "mean"), bool)


class SodaState:
    """The persistent batch of one SODA `SodaBatch`: see the module docstring."""

    def __init__(self, model: LoadedModel, fused: bool = False) -> None:
        self.model = model
        self.rows = Buffers(guard=1)  # z, m, v, h32, h64, hi
        self.slots = Buffers()  # the observed rows
        self.host = SlotTable(HOST_ARRAYS)
        self.row_map = SlotTable({"slot": np.int64, "offset": np.int64})  # each row's slot
        self.configs: dict[str, int] = {}
        self.groups: list[tuple[Objective, float, float]] = []
        self._next_id = 0
        self.dirty = True
        # A fused batch's rows carry the next step's softmax (`q`, `fs`) from one step to the
        # next (`soda_fused`).
        self.fused = fused

    def __len__(self) -> int:
        return len(self.slots)

    @property
    def z(self) -> Tensor:
        return self.rows["z"]

    @property
    def row_slot(self) -> np.ndarray:
        """Each row's slot (rows packed in slot order, a slot's in input order)."""
        return self.row_map["slot"]

    @property
    def row_offset(self) -> np.ndarray:
        """Each row's position in its slot's input."""
        return self.row_map["offset"]

    def column(self, table: str, name: str, rows: int) -> Tensor:
        """Rows [0, rows) of one table's column, (rows, 1) (a view: writes go to the table)."""
        i = {"h32": H32, "h64": H64, "hi": HI}[table].index(name)
        return self.rows.view(table, rows)[:, i : i + 1]

    # ---- entering and leaving -------------------------------------------------------------------
    def add(self, entries: Sequence[SlotEntry], precision: str) -> None:
        if not entries:
            return
        dev, vocab = self.model.device, self.model.vocab_size
        first_slot = len(self.slots)
        values: dict[str, list[Any]] = {name: [] for name in HOST_ARRAYS}
        h32, h64, hi = [], [], []
        for e in entries:
            c = e.config
            if c.algorithm != "soda" or c.precision != precision:
                raise ValueError("a SODA batch holds SODA configs of one precision")
            key = repr(sorted(c.to_dict().items()))
            group = (e.targets.objective, e.targets.atol, e.targets.rtol)
            if group not in self.groups:
                self.groups.append(group)
            reinit = c.reinit_period if c.use_reinit else 0
            reset = c.reset_period if c.use_resets else 0
            for name, value in (
                ("length", e.length),
                ("reinit", reinit),
                ("reinit_std", c.reinit_std),
                ("bias", c.bias_correction),
                ("anneals", c.temperature_end not in (None, c.temperature)),
                ("decays", c.use_decay and c.decay != 1.0),
                ("reset", reset),
                ("mean", c.loss_reduction == "mean"),
                ("config", self.configs.setdefault(key, len(self.configs))),
                ("group", self.groups.index(group)),
                ("seed", c.seed),
                ("sample_id", e.sample_id),
                ("id", self._next_id),
                ("context", e.targets.continuation[e.row, :-1].numpy()),
                ("misses", set()),
            ):
                values[name].append(value)
            self._next_id += 1
            # The per-row numbers, in the tables' column order (1 - beta rounded to float32 from
            # float64 once: `adam_step`'s rule).
            end = c.temperature if c.temperature_end is None else c.temperature_end
            decay, n = (c.decay if c.use_decay else 1.0), e.length
            h32 += [[c.learning_rate, 1 - c.beta1, 1 - c.beta2, c.eps, c.temperature, decay]] * n
            h64 += [[c.temperature, end, c.beta1, c.beta2]] * n
            hi += [[0, c.max_steps, reset or OFF, reinit or OFF, int(c.bias_correction)]] * n
        self.host.append(values)
        lengths = np.asarray(values["length"], dtype=np.int64)
        total = int(lengths.sum())
        self.slots.append(observed_rows(entries, dev, screen_slack(self.model)).fields())
        # float64 first, then float32: each value rounded once, as a column made from a float
        # (1 - beta from float64 too: `adam_step`).
        new = {name: torch.zeros((total, vocab), device=dev) for name in "zmv"}
        new["h32"] = torch.as_tensor(np.asarray(h32, np.float64), device=dev).float()
        new["h64"] = torch.as_tensor(np.asarray(h64, np.float64), device=dev)
        new["hi"] = torch.as_tensor(np.asarray(hi, np.int64), device=dev)
        if self.fused:  # the next step's Q at the GEMM's dtype, and its (shift, sum, fresh, max)
            dtype = self.model.for_precision(precision).embedding_matrix.dtype
            new["q"] = torch.zeros((total, vocab), device=dev, dtype=dtype)
            new["fs"] = torch.zeros((total, 4), device=dev)  # stale (fresh 0)
        self.rows.append(new)
        slot = np.repeat(np.arange(first_slot, first_slot + len(entries)), lengths)
        offset = np.concatenate([np.arange(n) for n in lengths])
        self.row_map.append({"slot": slot, "offset": offset})
        self.dirty = True

    def remove(self, left: int, holes: np.ndarray, movers: np.ndarray) -> None:
        count = len(self.slots)
        kept = np.arange(count) < left
        kept[holes] = False
        kept[movers] = True
        plan = removal_plan(len(self.row_map), np.flatnonzero(~kept[self.row_slot]))
        self.rows.remove(*plan)
        renumber = np.arange(count)
        renumber[movers] = holes
        # The tables make new arrays, the old left as they were: a launched step's status holds
        # the old (`batch._Launch`), and reads its slots' rows from them steps later.
        self.row_map.remove(*plan)
        self.row_map["slot"] = renumber[self.row_slot]
        self.slots.remove(left, holes, movers)
        self.host.remove(left, holes, movers)
        self.dirty = True

    def due(self, name: str, steps_after: np.ndarray) -> np.ndarray:
        """Which slots' `name` schedule ("reset", "reinit") fires after a step that leaves them
        at `steps_after` steps (a period of 0: never)."""
        period = self.host[name]
        return (period > 0) & (steps_after % np.maximum(period, 1) == 0)

    def slot_rows(self) -> list[np.ndarray]:
        """Each slot's rows in input order."""
        from sodaray.objective.scoring import slot_rows

        return slot_rows(self.row_slot, self.row_offset, len(self.slots))

    @property
    def fixed(self) -> int:
        """Sequence positions besides the input: the prefix and the observed continuation but
        its last token (one objective shape per batch, so one count)."""
        return len(self.model.prefix_ids) + self.groups[0][0].output_tokens - 1

    def flags(self) -> tuple[bool, bool, bool, bool]:
        """(any slot bias-corrects, anneals, decays, resets its moments): the step's optional
        arithmetic."""
        h = self.host
        on = (h["bias"], h["anneals"], h["decays"], h["reset"] > 0)
        return tuple(bool(a.any()) for a in on)  # type: ignore[return-value]


def observed_of(state: SodaState, slots: int) -> BatchTargets:
    """The observed rows of slots [0, slots) (views of the batch's buffers): what a step's loss
    and a screen read."""
    s = state.slots
    return BatchTargets(
        *(s.view(name, slots) if name in s else None for name in BatchTargets.FIELDS)
    )


def keyed_normal(shape: tuple[int, ...], seed: int, sample_id: int, draw: int) -> Tensor:
    """Standard normal draws that depend only on (seed, sample id, draw number), drawn on the
    CPU (the caller moves them), so not on the device either."""
    return torch.randn(shape, generator=keyed_generator(seed, sample_id, draw, "reinit"))
