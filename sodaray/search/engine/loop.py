"""The engine: every search one model replica runs, in as few batches as the work allows.

Work arrives as `Work` items (a target set, one config, the lengths each target may be searched
at, callbacks) from any number of callers (an `invert` call, a sweep's shards, a study's
trials). Each target waits in a queue and enters a batch as soon as a slot is free, so batches
stay full while anything waits. SODA searches of one precision and objective shape share one
batch at any config and length (`SodaBatch`); GCG and embedding search get a batch per config
and length, and the batches of one family (the same key but for the length) share one
capacity, filled in the order the targets arrived. All batches step in turn.

Results do not depend on what shares a batch (every hyperparameter, schedule and random draw
is the search's own; on CPU every matmul is padded so that BLAS rounds each row alike), nor on
the width of a transformer pass (the relaxed pass's attention is width-invariant,
`sodaray.model.attention`), so a SODA batch splits its slots into passes by cost alone
(`sodaray.search.engine.passes`); a model that kept its own attention, or `mix_lengths=False`,
runs a pass per length.

A target searched at several lengths (`length="auto"`) enters again at its next length when
one ends unfound, its steps and seconds adding up. A work's checkpoints (steps) are reported
once every one of its targets has finished or taken that many steps (a tuner prunes on them).
A cancelled work's waiting targets leave the queues and its running ones their slots at the
next step. `submit` and `cancel` may be called from any thread; `run` (until no work is left)
or `serve` (until stopped) steps the pools on the calling thread, where every callback runs.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from sodaray.model.loaded import LoadedModel
from sodaray.objective.targets import TargetSet
from sodaray.search.engine.base import BatchSearch, InversionResult, SearchConfig
from sodaray.search.engine.executor import Executor, policy_for
from sodaray.search.engine.pool import Finished, Pool
from sodaray.search.engine.scheduler import admit, capacity
from sodaray.search.engine.work import Ledger, Occupancy, Work

log = logging.getLogger(__name__)


__all__ = ["Engine", "Occupancy", "Work", "pool_key", "params_of"]


class Engine:
    """Steps every pool of one model's searches; see the module docstring."""

    def __init__(
        self,
        model: LoadedModel,
        *,
        mix_lengths: bool = True,
        on_batch: Callable[[int], None] | None = None,
        policy: str | None = None,
        executor: str | None = None,
    ) -> None:
        self.model, self.mix_lengths = model, mix_lengths
        # What runs SODA's steps (`executor`) and the scheduler's policy, both checked here,
        # not at the first batch: an error now.
        self.executor = Executor(executor)
        self.policy = policy_for(executor, policy, model.device)
        self.on_batch = on_batch
        self.pools: dict[str, Pool] = {}
        self.capacity: dict[str, int] = {}  # per family: slots its batches share
        self.works: dict[Work, Ledger] = {}  # the works in flight, each with its own count
        self._arrivals = itertools.count()
        self.occupancy = Occupancy()
        self._lock = threading.Lock()  # guards the inbox and the occupancy counters
        # Held by `serve` around each step: another thread that must use the model meanwhile
        # (building targets) takes it too, so no two passes run on the model at once.
        self.lock = threading.Lock()
        self._inbox: list[tuple[str, Work]] = []
        self._wake = threading.Event()

    # ---- from any thread ------------------------------------------------------------------------
    def submit(self, work: Work) -> None:
        """Queue `work`; its sizes are checked here (the caller gets the error)."""
        batch = work.config.batch_type()
        if batch is None:
            raise ValueError(f"the engine runs step-wise searches, not {work.config.algorithm}")
        if len(work.plans) != len(work.targets):
            raise ValueError("a work needs one length plan per target")
        batch.refuse(self.model, work.config)  # here, on the caller's thread
        from sodaray.config.capacity import check_context, check_state_memory

        if work.plans:  # plans are increasing: the last length is each one's longest
            longest = max(plan[-1] for plan in work.plans)
            check_context(self.model, longest, work.targets.objective.output_tokens)
            batch = min(work.config.max_batch_size, len(work.plans))
            check_state_memory(self.model, batch, longest, work.config.algorithm)
        with self._lock:
            self._inbox.append(("submit", work))
        self._wake.set()

    def cancel(self, work: Work) -> None:
        """Stop `work`: no result is delivered for a target that had not finished."""
        with self._lock:
            self._inbox.append(("cancel", work))
        self._wake.set()

    def settled(self, slot_steps: int) -> None:
        """A pool read the outcome of `slot_steps` slot-steps (before it delivers their results:
        a caller woken by one finds them counted); `on_batch` hears of each search step once."""
        with self._lock:
            self.occupancy.slot_steps += slot_steps
        if self.on_batch is not None:
            self.on_batch(slot_steps)

    def take_occupancy(self) -> Occupancy:
        """The counts since the last take."""
        with self._lock:
            out, self.occupancy = self.occupancy, Occupancy()
        return out

    # ---- the stepping thread --------------------------------------------------------------------
    def steps_taken(self) -> dict[Work, int]:
        """Sample-steps each work in flight has taken so far: its finished targets' steps, those
        of targets between two lengths, and those of its running slots. Read-only; call it on
        the stepping thread (from a callback such as `on_batch`), where nothing moves."""
        taken = {
            work: sum(r.steps for r in work.results.values())
            + ledger.partial_steps()  # earlier lengths
            for work, ledger in self.works.items()
        }
        for pool in self.pools.values():
            # A slot's `steps` count its current length only: earlier ones are in `partial`.
            for work, steps in zip(pool.slot["work"], pool.slot["settled"].tolist(), strict=True):
                taken[work] = taken.get(work, 0) + steps
        return taken

    def run(self) -> None:
        """Step until every submitted work is done."""
        while True:
            self._admit()
            if not self.works:
                return
            self.iterate()

    def serve(self, stop: threading.Event, idle_wait: float = 0.05) -> None:
        """Step until `stop` is set, waiting while there is nothing to do. On an error every
        unfinished work gets it (`Work.error`, then `on_done`) before it is raised."""
        try:
            while not stop.is_set():
                self._admit()
                if not self.works:
                    self._wake.wait(idle_wait)
                    self._wake.clear()
                    continue
                with self.lock:
                    self.iterate()
        except BaseException as exc:
            for work in list(self.works):
                work.error = exc
                self._done(work)
            raise

    def iterate(self) -> None:
        """Fill the free slots, step every batch once, then report the checkpoints reached."""
        self._fill()
        # A family's batches are one batch's worth of slots.
        busy = {pool.family for pool in self.pools.values() if len(pool)}
        step = Occupancy(capacity_steps=sum(self.capacity[f] for f in busy), steps=len(busy))
        # Counted before the step: a search finishing in it wakes its caller, who takes the
        # occupancy so far (`take_occupancy`), and must find this step's slots in it (its
        # slot-steps are counted by the pool, as their outcomes are read: `settled`).
        with self._lock:
            self.occupancy.add(step)
        sized = Occupancy()
        for key, pool in list(self.pools.items()):
            sizes = pool.step()
            if sizes is not None:
                sized.add(Occupancy(positions=sizes[0], useful=sizes[1]))
            if not len(pool) and not pool.queue:
                del self.pools[key]  # its state's memory goes back, and its captures'
                pool.batch.close()
        with self._lock:
            self.occupancy.add(sized)
        self._checkpoints()

    def _fill(self) -> None:
        """Each family's free slots go to its waiting targets in the order they arrived."""
        families: dict[str, list[Pool]] = {}
        for pool in self.pools.values():
            families.setdefault(pool.family, []).append(pool)
        for family, pools in families.items():
            free = self.capacity[family] - sum(len(p) for p in pools)
            if free <= 0:
                continue
            heads = []
            for pool in pools:
                pool.head()  # drops cancelled work from the front
                heads.append([arrival for arrival, *_ in itertools.islice(pool.queue, free)])
            for pool, count in zip(pools, admit(free, heads), strict=True):
                if count:
                    pool.admit(count)

    def _admit(self) -> None:
        with self._lock:
            inbox, self._inbox = self._inbox, []
        self._wake.clear()
        for kind, work in inbox:
            if kind == "cancel":
                self._cancel(work)
                continue
            self.works[work] = Ledger()
            for row in range(len(work.plans)):
                self._enqueue(work, row, 0)
            self.settle(work)  # a work with no targets is done at once

    def _enqueue(self, work: Work, row: int, stage: int) -> None:
        length = work.plans[row][stage]
        family, key = pool_key(work.config, work.targets, length)
        pool = self.pools.get(key)
        if pool is None:
            pool = self.pools[key] = Pool(self, family, self._new_batch(work, length))
        asked = (self.capacity.get(family, 0), work.config.max_batch_size)
        self.capacity[family] = capacity(asked)
        pool.queue.append((next(self._arrivals), work, row, stage))
        self.works[work].queued += 1

    def _new_batch(self, work: Work, length: int) -> BatchSearch:
        batch = work.config.batch_type()
        assert batch is not None  # `submit` refused the others
        return batch.create(self.model, work.config, length, self)

    def _cancel(self, work: Work) -> None:
        if work not in self.works or work.cancelled:
            return
        work.cancelled = True
        for pool in self.pools.values():
            kept = deque(item for item in pool.queue if item[1] is not work)
            self.works[work].queued -= len(pool.queue) - len(kept)
            pool.queue = kept
        self.settle(work)

    def finished(self, done: Finished) -> None:
        """A target's search at one length ended: its result, or its next length."""
        work, row, stage, tokens, found, loss, steps, seconds = done
        partial = self.works[work].partial
        prior_steps, prior_seconds, tried = partial.pop(row, (0, 0.0, []))
        length = work.plans[row][stage]
        steps, seconds, tried = steps + prior_steps, seconds + prior_seconds, [*tried, length]
        if not found and stage + 1 < len(work.plans[row]):
            partial[row] = (steps, seconds, tried)
            self._enqueue(work, row, stage + 1)
            return
        targets, config = work.targets, work.config
        true = None if targets.true_tokens is None else list(targets.true_tokens[row])
        result = InversionResult(
            sample_id=targets.sample_ids[row],
            tokens=tokens,
            text=self.model.decode(tokens),
            found=found,
            exact=None if true is None else tokens == true,
            steps=steps,
            seconds=seconds,
            final_loss=loss,
            predicted_length=length,
            algorithm=config.algorithm,
            seed=config.seed,
            true_tokens=true,
            lengths_tried=tried,
            params=params_of(config),
        )
        work.results[row] = result
        if work.on_result is not None:
            work.on_result(row, result)

    def settle(self, work: Work) -> None:
        """Finish `work` once nothing of it waits or runs."""
        ledger = self.works.get(work)
        idle = ledger is not None and ledger.queued == 0 and ledger.active == 0
        if idle and (work.cancelled or len(work.results) == len(work.plans)):
            self._done(work)

    def _done(self, work: Work) -> None:
        if work.done:
            return
        if not work.cancelled and work.error is None:
            self._report(work, float("inf"))
        work.done = True
        # Steps of targets a cancel or an error left between two lengths: the work's own count.
        ledger = self.works.pop(work, None)
        if ledger is not None:
            work.dropped_steps += ledger.partial_steps()
        if work.on_done is not None:
            work.on_done()

    def _checkpoints(self) -> None:
        pending = [w for w, ledger in self.works.items() if ledger.reported < len(w.checkpoints)]
        pending = [w for w in pending if not w.cancelled]
        if not pending:
            return
        least: dict[int, int] = {}  # each work's least steps over its running targets
        for pool in self.pools.values():
            total = pool.slot["base"] + pool.slot["settled"]  # earlier lengths included
            for work, steps in zip(pool.slot["work"], total.tolist(), strict=True):
                least[id(work)] = min(least.get(id(work), steps), steps)
        for work in pending:
            if self.works[work].queued:
                continue  # a target not started yet has taken no steps
            self._report(work, least.get(id(work), float("inf")))

    def _report(self, work: Work, progress: float) -> None:
        ledger, marks = self.works[work], work.checkpoints
        while ledger.reported < len(marks) and marks[ledger.reported] <= progress:
            index = ledger.reported
            ledger.reported += 1
            if work.on_checkpoint is not None:
                work.on_checkpoint(index, work.checkpoints[index])


def pool_key(config: SearchConfig, targets: TargetSet, length: int) -> tuple[str, str]:
    """(family, key): searches with equal keys share a batch, and the batches of a family share
    one capacity. SODA: one precision and objective shape (any config, loss and length); the
    equal-length algorithms: one config, objective and tolerance, a batch per length."""
    batch = config.batch_type()
    assert batch is not None
    family = [config.algorithm, *batch.family(config, targets)]
    name = json.dumps(family, sort_keys=True, default=str)
    return (name, name) if batch.mixes_lengths else (name, f"{name} length {length}")


def params_of(config: SearchConfig) -> dict[str, Any]:
    """A result's `params`: the algorithm's configuration, seed aside."""
    return {k: v for k, v in config.to_dict().items() if k != "seed"}
