"""A model replica inside a Ray actor: the model loaded once (on the GPU Ray assigned it, or the
CPU), one engine stepping every sample of every unit in flight together, and the result rows.

The actor is threaded: each unit in flight is one call, a streaming generator that submits the
unit's samples to the shared engine and yields its checkpoints, the rows of its searches that
have ended (every `Unit.keep_every` seconds, where set) and then all its rows, so the engine's
batches draw on all of them at once (sweep shards of any job and length, study trials).

Progress: the engine calls `ProgressReporter.on_batch` on its stepping thread at every step.
Once `EVERY_SECONDS` have passed since the last report, or the engine has stepped a `PARTS`-th of
the smallest step budget in flight (never sooner than `MIN_SECONDS` after the last), it reads
every unit's counts there (nothing moves on that thread meanwhile) and puts one `Progress` item
in the stream of the oldest unit in flight: a 100,000-step shard moves the driver's bar every
second, a 2,000-step one still twenty times. A unit stops being reported on (`done`) from its
work's `on_done`, on that thread and before its stream's end is queued.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import queue
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

from sodaray.errors import first_line
from sodaray.experiment.spec import ModelSpec
from sodaray.experiment.work import Checkpoint, Finished, Kept, Progress, Unit, UnitProgress
from sodaray.io.modelfiles import ModelLoadError
from sodaray.model.loaded import LoadedModel

log = logging.getLogger(__name__)

TARGET_CACHE = 8  # target sets kept for units that come back with the same rows (trials)
ENGINE_EXIT_S = 10.0  # for the engine's thread to record its error once it has handed it out
ENGINE_POLL_S = 1.0  # how often a unit waiting on its engine checks that its thread lives
_QUIET = object()  # no event within ENGINE_POLL_S
EVERY_SECONDS = 1.0  # a progress report at least this often while the engine steps
MIN_SECONDS = 0.1  # and at most ten a second
PARTS = 20  # a report per twentieth of the smallest step budget in flight


class EngineStopped(RuntimeError):
    """The replica's engine thread has died: no unit can run on it until it is restarted."""


def load_replica(spec: ModelSpec, num_cpus: float = 1.0) -> LoadedModel:
    """`spec`'s model on this process's Ray GPU if it has one, else the CPU, where torch keeps
    to the `num_cpus` slots Ray gave the actor (else every actor would use every core)."""
    import ray
    import torch

    gpus = ray.get_gpu_ids() if ray.is_initialized() else []
    device = "cuda" if gpus and torch.cuda.is_available() else "cpu"
    if device == "cpu":
        torch.set_num_threads(max(1, int(num_cpus)))
    where = spec.source or spec.location
    if spec.source is not None and not os.path.exists(spec.source):  # not on this node
        raise ModelLoadError(
            f"model {spec.id} is {spec.source} on the driver, which node {socket.gethostname()} "
            "does not have: put the model at the same path on every node (a shared mount), or "
            "give a hub id"
        )
    model = spec.load_here(where, device=device)
    log.info("worker %d loaded %s on %s", os.getpid(), where, device)
    return model


def replica_rows(
    model: LoadedModel,
    spec: ModelSpec,
    results: Sequence[Any],
    objective: Any,
    rows: dict[str, list[Any]],
    picked: list[int] | None = None,
    **context: Any,
) -> Any:
    """The result rows (a pyarrow Table) of `results` found on this replica of `spec`'s model:
    the row context from the loaded model but the model id as the entry gives it, and true
    texts and PII labels from the dataset `rows` at `picked` (default: all, in order)."""
    from sodaray.results import RunContext, result_rows

    run = RunContext.for_model(model, objective, **context)
    run.model = spec.id

    def column(name: str) -> list[Any] | None:
        values = rows.get(name)
        return values if values is None or picked is None else [values[i] for i in picked]

    return result_rows(results, run, true_texts=column("text"), pii_labels=column("pii_labels"))


def _occupancy(engine: Any) -> tuple[int, int, int]:
    """The engine's slot-steps, capacity-steps and steps since its last output."""
    took = engine.take_occupancy()
    return took.slot_steps, took.capacity_steps, took.steps


@dataclasses.dataclass(eq=False)
class _Watched:
    work: Any  # sodaray.search.engine.loop.Work
    events: Any  # the unit's stream: a queue.Queue its generator yields from
    budget: int  # steps per length

    def counts(self, key: str, taken: int) -> UnitProgress:
        """The unit's counts, given the sample-steps its work has `taken` (engine thread)."""
        plans, results = self.work.plans, self.work.results
        most = self.budget * sum(len(plan) for plan in plans)
        found = 0
        for row, result in results.items():  # a finished sample's bound is what it took
            most -= self.budget * len(plans[row]) - result.steps
            found += bool(result.found)
        return UnitProgress(key, taken, len(results), found, most)


class ProgressReporter:
    """The progress of one replica's units in flight; see the module docstring."""

    def __init__(self) -> None:
        self.engine: Any = None  # the Engine that calls `on_batch` (set once it exists)
        self._units: dict[str, _Watched] = {}  # in arrival order: the oldest carries the item
        self._lock = threading.Lock()  # `watch` comes from the units' threads
        self._last = time.monotonic()
        self._steps = 0  # engine steps since the last report
        self._every = math.inf  # steps per report by budget (PARTS)

    def watch(self, key: str, work: Any, events: Any) -> None:
        """Report on `work` (unit `key`) into `events` until `done(key)`."""
        budget = work.config.step_budget()
        with self._lock:
            self._units[key] = _Watched(work, events, budget)
            self._every = min(self._every, max(1, budget // PARTS))

    def done(self, key: str) -> None:
        with self._lock:
            self._units.pop(key, None)

    def on_batch(self, active: int) -> None:
        """The engine's per-step hook (its stepping thread): report when it is time."""
        self._steps += 1
        now = time.monotonic()
        since = now - self._last
        if since < MIN_SECONDS or (since < EVERY_SECONDS and self._steps < self._every):
            return
        self._last, self._steps = now, 0
        with self._lock:
            units = list(self._units.items())
            self._every = min((max(1, w.budget // PARTS) for _, w in units), default=math.inf)
        if not units or self.engine is None:
            return
        taken = self.engine.steps_taken()
        counts = tuple(w.counts(key, taken.get(w.work, 0)) for key, w in units)
        units[0][1].events.put(Progress(counts, os.getpid(), *_occupancy(self.engine)))


class ReplicaWorker:
    """One model replica; wrapped with `ray.remote` by `experiment.group` (threaded: one call per
    unit in flight), kept a plain class so it is testable without Ray."""

    def __init__(self, spec: ModelSpec, num_cpus: float = 1.0) -> None:
        import torch

        from sodaray.search.engine.loop import Engine

        self.spec = spec
        self.model = load_replica(spec, num_cpus)
        self.reporter = ProgressReporter()
        self.engine = Engine(
            self.model,
            mix_lengths=spec.mix_lengths,
            on_batch=self.reporter.on_batch,
            executor=spec.executor,
        )
        self.reporter.engine = self.engine
        self.works: dict[str, Any] = {}
        self.failed: BaseException | None = None
        self._targets: OrderedDict[Any, Any] = OrderedDict()
        self._threads = torch.get_num_threads()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="sodaray-engine", daemon=True)
        self._thread.start()

    def pid(self) -> int:
        return os.getpid()

    def health(self) -> int:
        """The process id while the engine runs; `EngineStopped` once its thread has ended, by
        an error or by `stop` (a unit handed to it would wait for ever; the actor group then
        restarts this replica: a fresh process with a fresh engine)."""
        if self.failed is not None:
            raise EngineStopped(f"this replica's engine stopped: {first_line(self.failed)}")
        if not self._thread.is_alive():
            raise EngineStopped("this replica's engine stopped")
        return os.getpid()

    def stop(self) -> None:
        """End the engine's thread (a replica used outside Ray, e.g. in tests)."""
        self._stop.set()

    def _serve(self) -> None:
        import torch

        torch.set_num_threads(self._threads)  # OpenMP's thread count is per calling thread
        try:
            self.engine.serve(self._stop)
        except BaseException as exc:  # every unit in flight has been handed the error
            log.error("the engine stopped: %s", exc)
            self.failed = exc

    def cancel(self, key: str) -> None:
        """Stop unit `key`: its call yields the rows finished so far, marked cancelled."""
        work = self.works.get(key)
        if work is not None:
            self.engine.cancel(work)

    def run(self, unit: Unit) -> Iterator[Checkpoint | Progress | Kept | Finished]:
        """Invert `unit`'s samples on the shared engine; yield its checkpoints as they are
        reached (and the replica's progress items it carries), the rows of its ended searches
        every `unit.keep_every` seconds while others run, then all its rows. An error in the
        unit (a bad input) is raised here alone."""
        from sodaray.api import invert, length_plans
        from sodaray.search.engine.work import Work

        self.health()  # raises if the engine stopped
        start = time.perf_counter()
        named = {"fixed": None, "auto": "auto"}  # else an assumed length
        length = named[unit.length] if unit.length in named else int(unit.length)
        inverter = unit.search.algorithm == "inverter"  # one forward pass, no step-wise search
        with self.engine.lock:  # no step runs on the model while targets are built
            targets = self.targets(unit)
            inverted = invert(self.model, targets, unit.search, length=length) if inverter else None
        if inverted is not None:
            yield self._finished(unit, inverted, list(range(len(inverted))), start, False)
            return
        events: queue.Queue[Any] = queue.Queue()
        finished: list[int] = []

        def checkpoint(index: int, step: int) -> None:  # on the engine thread, in step order
            done = {r: work.results[r] for r in finished if work.results[r].steps <= step}
            events.put(at_checkpoint(unit, index, step, done, work.marks.pop(index, {})))

        def ended() -> None:  # on the engine thread: no progress item after the end
            self.reporter.done(unit.key)
            events.put(None)

        work = Work(
            targets,
            unit.search,
            length_plans(self.model, targets, length, unit.max_length),
            on_result=lambda row, _: finished.append(row),
            checkpoints=unit.checkpoints,
            on_checkpoint=checkpoint,
            on_done=ended,
        )
        self.works[unit.key] = work
        self.reporter.watch(unit.key, work, events)
        kept, kept_at = 0, time.monotonic()  # rows of `finished` sent in `Kept` items, and when
        try:
            self.engine.submit(work)
            while True:
                try:
                    item = events.get(timeout=ENGINE_POLL_S)
                except queue.Empty:  # a unit handed to an engine as its thread ended: no wait
                    if work.error is None:  # for ever (a dying engine hands its error first)
                        self.health()  # raises if the engine stopped
                    item = _QUIET
                if item is None:
                    break
                ended_now = len(finished)  # appended on the engine thread: read once
                due = unit.keep_every is not None and time.monotonic() - kept_at >= unit.keep_every
                if due and ended_now > kept:
                    yield Kept(unit.key, self._rows(unit, work.results, finished[kept:ended_now]))
                    kept, kept_at = ended_now, time.monotonic()
                if item is not _QUIET:
                    yield item
        finally:  # also when the driver stops listening: the engine drops the unit
            self.works.pop(unit.key, None)
            self.reporter.done(unit.key)
            if not work.done:
                self.engine.cancel(work)
        if work.error is not None:  # only a dying engine hands a work its error
            self._thread.join(ENGINE_EXIT_S)  # so that the health check this prompts finds it
            raise EngineStopped(f"the engine stopped: {first_line(work.error)}") from work.error
        rows = sorted(work.results)
        yield self._finished(unit, work.results, rows, start, work.cancelled, work.sample_steps())

    def targets(self, unit: Unit) -> Any:
        """The unit's target set, built once for rows and an observation seen before (a study's
        trials share their rows; their objectives differ in the loss only)."""
        from sodaray.objective.targets import make_targets

        obj, ids = unit.objective, tuple(unit.rows["sample_id"])
        key = (ids, tuple(map(tuple, unit.rows["tokens"])), obj.shape(), obj.atol, obj.rtol)
        targets = self._targets.pop(key, None)
        if targets is None:
            targets = make_targets(self.model, unit.rows["tokens"], objective=obj)
            targets.sample_ids = list(ids)
        self._targets[key] = targets
        while len(self._targets) > TARGET_CACHE:
            self._targets.popitem(last=False)
        return dataclasses.replace(targets, objective=obj)

    def _rows(self, unit: Unit, results: Any, rows: list[int]) -> Any:
        """The result rows of the unit's samples at `rows` (`results`: theirs, by row)."""
        got = [results[r] for r in rows]
        context = {"length_mode": unit.length_mode, **unit.context}
        return replica_rows(self.model, self.spec, got, unit.objective, unit.rows, rows, **context)

    def _finished(
        self,
        unit: Unit,
        results: Any,
        rows: list[int],
        start: float,
        cancelled: bool,
        sample_steps: int | None = None,
    ) -> Finished:
        table, seconds = self._rows(unit, results, rows), time.perf_counter() - start
        steps = sum(results[r].steps for r in rows) if sample_steps is None else sample_steps
        return Finished(
            unit.key, table, seconds, os.getpid(), cancelled, *_occupancy(self.engine), steps
        )


def at_checkpoint(
    unit: Unit, index: int, step: int, done: dict[int, Any], marks: dict[int, Any]
) -> Checkpoint:
    """Checkpoint `index` at `step`: the samples finished by then (`done`, by row) counted, and
    each sample's loss and share of its true tokens, a finished one's at its end, a running
    one's at the step (`marks`, by row). A candidate of another length than the true input
    holds none of its tokens."""
    losses, shares = [], []
    for row, true in enumerate(unit.rows["tokens"]):
        if row in done:
            loss, tokens = done[row].final_loss, done[row].tokens
        else:
            loss, tokens = marks.get(row, (float("nan"), []))
        true = list(true)
        same = len(tokens) == len(true) > 0
        losses.append(float(loss))
        right = sum(a == b for a, b in zip(tokens, true, strict=True)) if same else 0
        shares.append(right / len(true) if same else 0.0)
    found = sum(r.found for r in done.values())
    exact = sum(bool(r.exact) for r in done.values())
    return Checkpoint(unit.key, index, step, found, exact, unit.samples, (*losses,), (*shares,))
