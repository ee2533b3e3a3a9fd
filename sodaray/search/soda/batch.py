"""SODA: Sparse One-hot Discrete Adam (Algorithm 1 of "GPT, But Backwards", Skapars et al. 2025).

Per target, auxiliary inputs Z (n x V) start at zero. Each step: relaxed one-hots
softmax(Z / tau) @ E are fed as inputs_embeds; the loss against the observed output is
differentiated with respect to Z; Adam without bias correction (by default), then decay
Z *= lambda; the hard-max check sends argmax(Z) through the model, and a match stops that
target; every t1 of its own steps the Adam moments reset, every t2 Z is re-drawn from N(0, 0.1^2).

One batch holds searches of any input length, SODA config and objective of one shape
(`Objective.shape`): Z is packed as rows (T, V), T the sum of the slots' lengths; every
hyperparameter, schedule and step counter is the slot's own (`state.SodaState`). A search's
trajectory depends on its own config, target and (seed, sample id), not on what shares its
batch or pass: bit for bit on one CPU thread (`sodaray.model.attention`, `padding.pad_rows`).

The step (`step.soda_step`, captured per shape on CUDA) reads nothing back: its status (tokens,
loss) travels to the host while the next step runs; the host then screens the slots whose tokens
changed (`sodaray.search.soda.screen`) and reads the verdicts a step later (`lag` 2): a search
that matched or spent its budget at step k has taken steps k + 1 and k + 2 too, whose results
are dropped. The host keeps the rare work: the confirm of a screened candidate, and the keyed
re-draws of Z.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from sodaray.model.loaded import LoadedModel
from sodaray.objective.scoring import confirm
from sodaray.objective.targets import TargetSet
from sodaray.search.engine import base
from sodaray.search.engine.executor import Executor, policy_for
from sodaray.search.engine.passes import pass_overhead
from sodaray.search.engine.scheduler import Scheduler
from sodaray.search.engine.slots import locate
from sodaray.search.soda.fused_step import FusedWorkspace, fused_soda_step, invalidate, resolve
from sodaray.search.soda.relaxed import Workspace, workspace_pad
from sodaray.search.soda.screen import Screened, Screener, changed_slots, host_buffer
from sodaray.search.soda.state import SodaState, keyed_normal, observed_of
from sodaray.search.soda.step import Status, StepInputs, bucket, plan_inputs, soda_step

_OWNERS = itertools.count()


@dataclass
class _Launch:
    """A launched step's status on its way to the host (tokens and loss, in host buffers), who
    was where when it ran, and the screen of its tokens once that is launched."""

    ids: np.ndarray  # slot ids in slot order
    row_slot: np.ndarray
    row_offset: np.ndarray
    tokens: np.ndarray  # (rows,) each row's token after the step
    loss: np.ndarray | Tensor  # (slots,): on a CPU the step's own, read where a search ends
    event: torch.cuda.Event | None = None
    screened: Screened | None = None

    def tokens_of(self, slot: int) -> np.ndarray:
        """Slot `slot`'s tokens, in input order."""
        rows = np.flatnonzero(self.row_slot == slot)
        return self.tokens[rows[np.argsort(self.row_offset[rows], kind="stable")]]


class SodaBatch(base.BatchSearch):
    """SODA searches of any lengths and configs in one batch (see the module docstring), of one
    `precision`; `mix_lengths` False keeps each pass to one length; `policy` the scheduler's
    (None: the one `executor` brings on the model's device, `executor.policy_for`)."""

    mixes_lengths: ClassVar[bool] = True
    # A step's outcome reaches the engine two steps later: its tokens are screened while the
    # next step runs, and the screen's verdicts read while the one after runs.
    lag: ClassVar[int] = 2

    def __init__(
        self,
        model: LoadedModel,
        precision: str = "float32",
        mix_lengths: bool = True,
        policy: str | None = None,
        executor: Executor | None = None,
        bucketed: bool | None = None,
        fused: str = "auto",
    ) -> None:
        self.model, self.precision = model, precision
        self.fused = resolve(fused, model.device)
        # Steps at bucketed shapes where the executor captures them (None), or as asked: True
        # takes a capture's shapes on any device (tests check them on a CPU), False never.
        self.bucketed = bucketed
        self.executor = executor if executor is not None else Executor("eager")
        # Lengths share a pass only where that changes no result (`sodaray.model.attention`).
        mix = mix_lengths and model.for_precision(precision).invariant
        policy = policy_for(self.executor.name, policy, model.device)
        self.scheduler = Scheduler(policy, pass_overhead(model) if mix else 0.0, mix)
        self.state = SodaState(model, self.fused)
        self.workspace = Workspace()
        self.fused_ws = FusedWorkspace()
        self.inputs: StepInputs | None = None
        self._shapes: dict[tuple[int, ...], StepInputs] = {}  # captured shapes' inputs
        # Where statuses land on the host: three sets (the step just launched, the last one,
        # whose tokens are being screened, and the one before, whose outcome is read), pinned on
        # CUDA so that the copy out is asynchronous (`host_buffer`: a set doubles to grow).
        self._status: list[dict] = [{}, {}, {}]
        self.screener = Screener(self.state, self.executor.name)
        self._pending: _Launch | None = None  # the last step's status, not yet read
        self._screening: _Launch | None = None  # the one before: its tokens' screen launched
        self._read: _Launch | None = None  # the status the last outcome came from
        self._index = np.zeros(0, dtype=np.int64)  # current slot -> its row in `_read`
        self._addresses: tuple[int, ...] = ()  # what the captured steps read
        self._screen_addresses: tuple[int, ...] = ()  # what the captured screens read
        self.owner = next(_OWNERS)  # this batch's captures, among its executor's

    @classmethod
    def create(
        cls, model: LoadedModel, config: base.SearchConfig, length: int, engine: base.EngineSettings
    ) -> SodaBatch:
        args = (config.precision, engine.mix_lengths, engine.policy, engine.executor)
        return cls(model, *args, fused=config.fused)

    @classmethod
    def family(cls, config: base.SearchConfig, targets: TargetSet) -> list[Any]:
        """One precision and objective shape (any config, loss and length), one step kind."""
        return [config.precision, targets.objective.shape(), config.fused]

    def __len__(self) -> int:
        return len(self.state)

    @property
    def z(self) -> Tensor:
        return self.state.z

    # ---- entering and leaving -------------------------------------------------------------------
    def add(self, entries: Sequence[base.SlotEntry]) -> None:
        self.screener.writing()
        self.state.add(entries, self.precision)

    def remove(self, left: int, holes: np.ndarray, movers: np.ndarray) -> None:
        self.screener.writing()
        self.state.remove(left, holes, movers)

    def close(self) -> None:
        """The batch is done: its captures go (their memory with them)."""
        self.executor.forget(self.owner)
        self.screener.executor.forget(self.owner)

    def candidates(self, slots: np.ndarray) -> list[list[int]]:
        """The tokens the last outcome's step ended on, for current slots `slots`."""
        assert self._read is not None
        return [self._read.tokens_of(int(self._index[s])).tolist() for s in slots]

    # ---- one step -------------------------------------------------------------------------------
    def refresh(self) -> StepInputs:
        """The step's inputs, planned again after slots came or went (cheap when nothing did)."""
        state = self.state
        if not state.dirty and self.inputs is not None:
            return self.inputs
        dev = self.model.device
        capture = self.bucketed if self.bucketed is not None else self.executor.captures(dev)
        if capture:
            rows, slots = bucket(state)
            state.rows.reserve(rows + state.rows.guard)
            state.slots.reserve(slots)
        x = plan_inputs(state, self.scheduler, capture, self._shapes)
        # Rows past the live ones take row 0's numbers: a guard or bucket row computes like a
        # live one (finite temperature, eps), and its results are dropped.
        start, end = len(state.row_slot), x.rows
        if end > start > 0:
            for table in ("h32", "h64", "hi"):
                state.rows.view(table, end)[start:end] = state.rows.view(table, 1)
            invalidate(state, slice(start, end))  # their tau changed: a carried softmax is stale
        self.inputs, state.dirty = x, False
        return x

    def step(self, steps_after: np.ndarray) -> base.StepOutcome:
        """Launch one step of every slot (`steps_after`: each slot's count after it), screen
        the last step's changed tokens, and return the outcome of the step before (`lag`), in
        the current slot order (`StepOutcome.settled`: the slots it covers)."""
        if self.state.dirty:  # a re-plan may grow (move) the buffers a screen reads
            self.screener.writing()
        x = self.refresh()
        self.screener.written()  # what the screens launched next wait for on a side stream
        dev = self.model.device
        resetting = bool(self.state.due("reset", steps_after).any())
        key = None
        if x.capture:
            # The workspace at this shape's size before the step: a capture must not grow it.
            z = self.state.rows.view("z", x.rows)
            embedding = self.model.for_precision(self.precision).embedding_matrix
            if self.fused:
                self.fused_ws.fit(x.rows, embedding)
            else:
                self.workspace.fit(z, workspace_pad(z, embedding))
            key = (self.owner, x.rows, x.slots, x.passes[0].width, x.flags, x.serial, resetting)
        if self.executor.captures(dev):
            # Reallocated: what was captured reads old memory (a screen the observed rows only).
            state = self.state
            addresses = state.rows.addresses() + state.slots.addresses()
            addresses += self.workspace.addresses() + self.fused_ws.addresses()
            if addresses != self._addresses:
                self.executor.forget(self.owner)
                self._addresses = addresses
            if state.slots.addresses() != self._screen_addresses:
                self.screener.executor.forget(self.owner)
                self._screen_addresses = state.slots.addresses()
        fused = self.fused and not x.flags[4]  # the fluency penalty is the eager step's alone

        def run() -> Status:
            if fused:
                return fused_soda_step(self.state, x, self.precision, self.fused_ws, resetting)
            status = soda_step(self.state, x, self.precision, self.workspace, resetting)
            invalidate(self.state)  # Z moved without its statistics (none kept: no-op)
            return status

        status = self.executor.run(key, run, dev)
        launch = self._launch(status)
        self.redraw(steps_after)
        last, self._pending = self._pending, launch
        if last is not None:
            self._screen(last, self._screening)
        read, self._screening = self._screening, last
        fixed = self.state.fixed
        positions = sum(p.batch * (fixed + p.width) for p in x.passes)
        useful = len(self.state) * fixed + len(self.state.row_slot)
        return self._outcome(read, positions, useful)

    def _launch(self, status: Status) -> _Launch:
        """The status of the step just launched, copied to host buffers (asynchronously from
        CUDA); a CPU's loss stays the step's own tensor, read only where a search ends."""
        s = self.state
        rows, slots = len(s.row_slot), len(s)
        mine = self._status.pop(0)  # the set read longest ago
        self._status.append(mine)
        pin = self.model.device.type == "cuda"
        tokens, token_view = host_buffer(mine, rows, torch.long, pin, name="tokens")
        tokens[:rows].copy_(status.tokens[:rows], non_blocking=True)
        loss: np.ndarray | Tensor = status.loss[:slots]
        event = None
        if pin:
            held, loss_view = host_buffer(mine, slots, torch.float32, pin, name="loss")
            held[:slots].copy_(loss, non_blocking=True)
            loss = loss_view[:slots]
            event = torch.cuda.Event()
            event.record()
        # The arrays themselves: a composition change makes new ones (`SodaState.remove`).
        return _Launch(s.host["id"], s.row_slot, s.row_offset, token_view[:rows], loss, event)

    def _screen(self, launch: _Launch, before: _Launch | None) -> None:
        """Launch the screen of `launch`'s slots still in the batch whose tokens changed since
        `before` (the step before it)."""
        if launch.event is not None:
            launch.event.synchronize()
        then = None
        if before is not None:
            then = (before.ids, before.row_slot, before.row_offset, before.tokens)
        changed = changed_slots(launch.ids, launch.row_slot, launch.row_offset, launch.tokens, then)
        picks = np.flatnonzero(changed)
        current, present = locate(launch.ids[picks], self.state.host["id"])
        picks, current = picks[present], current[present]
        if len(picks):
            dev = self.model.device
            capture = self.executor.captures(dev) and self.screener.executor.captures(dev)
            rows = (launch.tokens, launch.row_slot, launch.row_offset)
            launch.screened = self.screener.launch(self.owner, picks, current, *rows, capture)

    def _outcome(self, launch: _Launch | None, positions: int, useful: int) -> base.StepOutcome:
        """`launch`'s outcome in the current slot order: the slots it covers (those in the batch
        then and now), which matched (screened on the device, confirmed here), and their loss."""
        count = len(self.state)
        settled = np.zeros(count, dtype=bool)
        found = np.zeros(count, dtype=bool)
        loss = np.full(count, np.nan, dtype=np.float32)
        self._read, self._index = launch, np.zeros(count, dtype=np.int64)
        if launch is not None and len(launch.ids) and count:
            at, present = locate(self.state.host["id"], launch.ids)
            settled = present
            self._index = np.where(settled, at, 0)
            # Slots whose tokens did not change were screened at an earlier step: not passed here.
            passed = np.zeros(len(launch.ids), dtype=bool)
            if launch.screened is not None:
                passed[launch.screened.slots] = launch.screened.verdicts()
            screened = np.flatnonzero(settled & passed[self._index])
            if len(screened):
                found[screened] = self._confirm(launch, screened)
            if isinstance(launch.loss, Tensor):  # a CPU step's own: a view, no copy
                launch.loss = launch.loss.numpy()
            loss = launch.loss[self._index]
        return base.StepOutcome(found, loss, positions, useful, settled=settled)

    def _confirm(self, launch: _Launch, slots: np.ndarray) -> np.ndarray:
        """The confirm of screened candidates (current slots `slots`), per objective group."""
        s = self.state
        found = np.zeros(len(slots), dtype=bool)
        groups = s.host["group"][slots]
        for g in np.unique(groups):
            mine = np.flatnonzero(groups == g)
            chosen = slots[mine]
            candidates = [
                np.concatenate([launch.tokens_of(int(self._index[c])), s.host["context"][c]])
                for c in chosen
            ]
            objective, atol, rtol = s.groups[int(g)]
            rows = (observed_of(s, len(s)), torch.as_tensor(chosen, device=self.model.device))
            misses = list(s.host["misses"][chosen])
            found[mine] = confirm(self.model, objective, candidates, *rows, atol, rtol, misses)
        return found

    @torch.no_grad()
    def redraw(self, steps_after: np.ndarray) -> None:
        """The re-draws of Z due after this step, their moments reset with them, keyed by
        (seed, sample id, draw number): a sample's trajectory does not depend on its batch
        neighbours, its slot, or the actor a retried shard lands on."""
        h = self.state.host
        due = np.flatnonzero(self.state.due("reinit", steps_after))
        if not len(due):
            return
        vocab = self.state.z.shape[-1]
        keys = [h[k][due].tolist() for k in ("length", "seed", "sample_id", "reinit", "reinit_std")]
        draws = [
            keyed_normal((n, vocab), seed, sample, int(steps_after[s]) // period) * std
            for s, n, seed, sample, period, std in zip(due, *keys, strict=True)
        ]
        fresh = torch.cat(draws)
        rows = self.state.slot_rows()
        dev = self.model.device
        where = torch.as_tensor(np.concatenate([rows[s] for s in due]), device=dev)
        if dev.type == "cuda":
            fresh = fresh.pin_memory()
        self.state.rows["m"][where] = 0.0
        self.state.rows["v"][where] = 0.0
        self.state.z[where] = fresh.to(dev, non_blocking=True)
        invalidate(self.state, where)
