"""The match check's screen, run a step behind the step, on the searches whose tokens it changed.

When the host has read a step's tokens (while the next step runs), only the slots whose tokens
changed go through the model: an unchanged slot was screened at the step that made its tokens,
and whether they match depends on them and its target alone (the screen never turns a match
down; the confirm decides, in one shape). So every find is found at the step that made it.

The screen is one function of a packed host-built input (`Screener.launch`), captured on CUDA
once per shape (`scheduler.static_screen`'s buckets) with its own executor and memory pool, and
run eagerly elsewhere; on CUDA after the next step on its stream, or beside it on a stream of
its own (`SIDE_STREAM`). The host reads its verdicts a step later still (`SodaBatch.lag` is 2)
and confirms what passed (`SodaBatch._confirm`).
"""

from __future__ import annotations

from collections.abc import Hashable
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from sodaray.model.padding import padding_items
from sodaray.objective.observations import observation, screen_slack
from sodaray.objective.scoring import observed_positions
from sodaray.search.engine.executor import Executor
from sodaray.search.engine.scheduler import static_screen, static_width
from sodaray.search.engine.slots import locate
from sodaray.search.soda.state import SodaState, observed_of

# On CUDA, whether screens run on a stream of their own, beside the next step (which at small
# batches leaves most of the GPU idle), rather than after it on the step's. Off until a GPU
# measures it faster (`benchmarks/gpu_check.py` times both).
SIDE_STREAM = False


def changed_slots(
    ids: np.ndarray,
    row_slot: np.ndarray,
    row_offset: np.ndarray,
    tokens: np.ndarray,
    before: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None,
) -> np.ndarray:
    """Which slots (in the order of `ids`) hold tokens other than they did at the step before,
    (slots,) bool: a slot absent then (new) counts as changed. `before`: that step's (ids,
    row_slot, row_offset, tokens), None where there was none."""
    slots = len(ids)
    if before is None:
        return np.ones(slots, dtype=bool)
    ids0, slot0, offset0, tokens0 = before
    if ids0 is ids and slot0 is row_slot:  # no slot came or went: the rows line up
        moved = tokens != tokens0
    else:  # rows matched by (slot id, offset); a row absent before is a changed one
        span = int(max(offset0.max(initial=0), row_offset.max(initial=0))) + 1
        at, present = locate(ids[row_slot] * span + row_offset, ids0[slot0] * span + offset0)
        moved = ~present
        moved[present] = tokens0[at[present]] != tokens[present]
    return np.bincount(row_slot[moved], minlength=slots) > 0


@dataclass
class Screened:
    """A launched screen: the slots it covers (indices into its launch's slot order) and its
    verdicts: on CUDA where they land on the host (`event`: when they have), on a CPU the
    screen's own tensor."""

    slots: np.ndarray
    passed: np.ndarray | Tensor
    event: torch.cuda.Event | None = None

    def verdicts(self) -> np.ndarray:
        """Whether each of `slots` passed, (len(slots),) bool (waits for them on CUDA)."""
        if self.event is not None:
            self.event.synchronize()
        if isinstance(self.passed, Tensor):
            self.passed = self.passed.numpy()
        return self.passed[: len(self.slots)]


class Screener:
    """Runs a batch's screens (see the module docstring): builds each one's input on the host,
    in buffers made once (pinned on CUDA, copied asynchronously), and runs it under its own
    executor (own captures, own memory pool: a screen's intermediates never share memory with
    a step's)."""

    def __init__(self, state: SodaState, executor: str | None) -> None:
        self.state = state
        # Its shapes: about four per power of two of slots, per objective group.
        self.executor = Executor(executor, "match-check screens", max_shapes=64)
        self.turn = 0
        # Per turn (two screens are on their way at once): the host's input and where the
        # verdicts land, each with its numpy view; per shape on CUDA: the device's input.
        self._host: list[dict] = [{}, {}]
        self._out: list[dict] = [{}, {}]
        self._busy: list[torch.cuda.Event | None] = [None, None]  # a turn's last screen's end
        self._device: dict[tuple[bool, int], Tensor] = {}  # (on the side stream, size)
        self._stream: torch.cuda.Stream | None = None  # SIDE_STREAM's, made on first use
        self._written: torch.cuda.Event | None = None  # the last write of the observed rows

    def writing(self) -> None:
        """The batch's observed rows are about to change or move (slots come or go, buffers
        grow): the step's stream waits for the screens under way on the side stream, which
        read them (and a freed buffer is not reused under them)."""
        if self._stream is not None:
            torch.cuda.current_stream(self._stream.device).wait_stream(self._stream)

    def written(self) -> None:
        """Everything the step's stream has been given so far: a screen on the side stream
        waits for it (not for the step launched after it) before it reads the observed rows."""
        if self._stream is not None:
            self._written = torch.cuda.Event()
            self._written.record()

    def launch(
        self,
        owner: Hashable,
        picks: np.ndarray,
        current: np.ndarray,
        tokens: np.ndarray,
        row_slot: np.ndarray,
        row_offset: np.ndarray,
        capture: bool,
    ) -> Screened:
        """Screen slots `picks` of a launch (indices into its slot order; `current`: their
        slots now, each in the batch) on that launch's `tokens` (its rows' `row_slot` and
        `row_offset`); `capture`: at a bucketed, captured shape (one objective group)."""
        state, model = self.state, self.state.model
        dev = model.device
        groups = state.host["group"][current]
        order = np.argsort(groups, kind="stable")  # each objective group's candidates together
        picks, current, groups = picks[order], current[order], groups[order]
        count = len(picks)
        capture = capture and bool((groups == groups[0]).all())
        p, m = len(model.prefix_ids), state.groups[0][0].output_tokens
        lengths = state.host["length"][current]
        # A GPU screens a bucketed count at the batch's width (a few shapes, captured or not,
        # which change only as slots come and go); a CPU the count at the candidates' width.
        cuda = dev.type == "cuda"
        width = static_width(int(state.host["length"].max())) if cuda else int(lengths.max())
        length = p + width + m - 1
        k = static_screen(count) if cuda else count
        rows = k + padding_items(k, dev, length)
        # One flat buffer, two contiguous blocks: the sequences (rows, length), then per
        # candidate its observed positions, its slot and its row (k, m + 2).
        size = rows * length + k * (m + 2)
        self.turn ^= 1
        if self._busy[self.turn] is not None:  # this turn's buffers are still being read
            self._busy[self.turn].synchronize()
            self._busy[self.turn] = None
        held, flat = host_buffer(self._host[self.turn], size, torch.long, cuda, exact=cuda)
        flat[:size] = 0  # the padding rows: token 0, slot 0, position 0 after the prefix
        ids = flat[: rows * length].reshape(rows, length)
        meta = flat[rows * length : size].reshape(k, m + 2)
        ids[:count, :p] = model.prefix_ids
        where = np.full(int(max(picks.max(), row_slot.max())) + 1, -1, dtype=np.int64)
        where[picks] = np.arange(count)
        at = where[row_slot]
        mine = at >= 0
        ids[at[mine], p + row_offset[mine]] = tokens[mine]
        context = p + lengths[:, None] + np.arange(m - 1)
        ids[np.arange(count)[:, None], context] = state.host["context"][current]
        slot_len = np.ones(k, dtype=np.int64)
        slot_len[:count] = lengths
        meta[:, :m] = observed_positions(slot_len, p, m)[1]
        meta[:, m] = current[-1]  # a bucket's padding rows: the last candidate's slot
        meta[:count, m] = current
        meta[:, m + 1] = np.arange(k)
        kinds, first = np.unique(groups, return_index=True)  # each group's candidates a run
        ends = [*first[1:].tolist(), k]  # the last's padding rows too: verdicts never read
        spans = [(int(g), int(a), b) for g, a, b in zip(kinds, first, ends, strict=True)]
        key = (owner, k, rows, length, spans[0][0]) if capture else None

        shape = (k, rows, length, m, spans)

        def run(inputs: Tensor) -> Tensor:  # a capture reads `inputs` where they lie
            return self.executor.run(key, lambda: screen(state, inputs, shape), dev)

        if not cuda:  # the host's buffer is the input; verdicts read where they lie
            return Screened(picks, run(held[:size]))
        # Only a captured screen goes beside: an eager one would make the model's caches on a
        # stream the step's does not wait for.
        if capture and SIDE_STREAM and self._stream is None:
            self._stream = torch.cuda.Stream(dev)
            self._stream.wait_stream(torch.cuda.current_stream(dev))  # all written so far
        stream = self._stream if capture else None
        with torch.cuda.stream(stream) if stream is not None else nullcontext():
            if stream is not None and self._written is not None:
                stream.wait_event(self._written)
            # Copied whole from its pinned twin; one per stream (each orders its own uses).
            inputs = self._device.get((stream is not None, size))
            if inputs is None:
                inputs = torch.empty_like(held, device=dev)
                self._device[(stream is not None, size)] = inputs
            inputs.copy_(held, non_blocking=True)
            verdicts = run(inputs)
            out, passed = host_buffer(self._out[self.turn], k, torch.bool, pin=True)
            out[:k].copy_(verdicts, non_blocking=True)
            event = self._busy[self.turn] = torch.cuda.Event()
            event.record()
        return Screened(picks, passed, event)


def host_buffer(
    held: dict, size: int, dtype: torch.dtype, pin: bool, exact: bool = False, name: str = "grown"
) -> tuple[Tensor, np.ndarray]:
    """A 1-D host buffer in `held` of at least `size` (pinned where `pin`) and its numpy view,
    made once: `exact`, of that size (copied whole; one per bucketed shape), else the one named
    `name`, which grows by doubling and is used by its leading part."""
    key = size if exact else name
    got = held.get(key)
    if got is None or len(got[0]) < size:
        grown = size if exact or got is None else max(size, 2 * len(got[0]))
        tensor = torch.zeros(grown, dtype=dtype, pin_memory=pin)
        held[key] = got = (tensor, tensor.numpy())
    return got


@torch.no_grad()
def screen(state: SodaState, packed: Tensor, shape: tuple) -> Tensor:
    """Which of `k` candidates pass the match check's screen, (k,) bool (`shape`: k, rows,
    length, m and `spans`, the (objective group, first, end) candidate ranges): their sequences
    (`packed`'s first block, (rows, length)) in one batch at the model's own precision, held to
    a necessary condition of a match against their slots' observed rows: the observation's probe
    where it has one, else the whole test, loosened past anything a shape does to the
    arithmetic. It never turns a match down (the confirm decides) and reads nothing back."""
    model, (k, rows, length, m, spans) = state.model, shape
    ids = packed[: rows * length].view(rows, length)
    meta = packed[rows * length : rows * length + k * (m + 2)].view(k, m + 2)
    hidden = model.hidden(model.embed(ids), prepadded=True)
    slots = meta[:, m]
    states = hidden[meta[:, m + 1 :], meta[:, :m]]
    batch = observed_of(state, state.slots.capacity)  # wherever its slots lie
    passed = []
    for g, first, end in spans:
        objective, atol, rtol = state.groups[g]
        kind = observation(objective.kind)
        mine, which = states[first:end], slots[first:end]
        ok = kind.probe(model, objective, mine, batch, which)
        if ok is None:
            ok = kind.match(model, objective, mine, batch, which, atol, rtol, screen_slack(model))
        passed.append(ok)
    return passed[0] if len(passed) == 1 else torch.cat(passed)


__all__ = ["Screened", "Screener", "changed_slots", "screen"]
