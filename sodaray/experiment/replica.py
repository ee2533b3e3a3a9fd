"""A model replica inside a Ray actor: the model loaded once (on the GPU Ray assigned it, or the
CPU), one engine stepping every sample of every unit in flight together, and the result rows.

The actor is threaded: each unit in flight is one call, a streaming generator that submits the
unit's samples to the shared engine and yields its checkpoints, the rows of its searches that
have ended (every `Unit.keep_every` seconds, where set) and then all its rows, so the engine's
batches draw on all of them at once (sweep shards of any job and length, study trials). About
once a second one of the streams also carries the progress of every unit in flight
(`experiment.reporter`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

from sodaray.errors import first_line
from sodaray.experiment.reporter import ProgressReporter
from sodaray.experiment.spec import ModelSpec
from sodaray.experiment.work import Checkpoint, Finished, Kept, Progress, Unit
from sodaray.io.modelfiles import ModelLoadError
from sodaray.model.loaded import LoadedModel

log = logging.getLogger(__name__)

TARGET_CACHE = 8  # target sets kept for units that come back with the same rows (trials)
ENGINE_EXIT_S = 10.0  # for the engine's thread to record its error once it has handed it out
ENGINE_POLL_S = 1.0  # how often a unit waiting on its engine checks that its thread lives
_QUIET = object()  # no event within ENGINE_POLL_S


class EngineStopped(RuntimeError):
    """The replica's engine thread has died: no unit can run on it until it is restarted."""


def load_replica(spec: ModelSpec, num_cpus: float = 1.0) -> LoadedModel:
    """`spec`'s model on this process's Ray GPU if it has one, else the CPU, where torch keeps
    to the `num_cpus` slots Ray gave the actor (else every actor would use every core)."""
    import torch

    from sodaray.model.load import load_model

    try:
        import ray

        gpus = ray.get_gpu_ids() if ray.is_initialized() else []
    except ImportError:
        gpus = []
    device = "cuda" if gpus and torch.cuda.is_available() else "cpu"
    if device == "cpu":
        torch.set_num_threads(max(1, int(num_cpus)))
    where = spec.source or spec.location
    if spec.source is not None and not os.path.exists(spec.source):
        # Resolved on the driver (`ModelSpec.resolved`), absent on this node: say so in one line
        # rather than transformers' hub lookup of a path.
        raise ModelLoadError(
            f"model {spec.id} is {spec.source} on the driver, which node {socket.gethostname()} "
            "does not have: put the model at the same path on every node (a shared mount), or "
            "give a hub id"
        )
    model = load_model(
        where,
        gguf_file=spec.gguf_file,
        device=device,
        dtype=spec.dtype,
        bos=spec.bos,
        trust_remote_code=spec.trust_remote_code,
    )
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
        """The process id while the engine runs; `EngineStopped` once its thread has died (the
        actor group then restarts this replica: a fresh process with a fresh engine)."""
        self._check_engine()
        return os.getpid()

    def _check_engine(self) -> None:
        """`EngineStopped` once the engine's thread has ended, by an error or by `stop`: a unit
        handed to it would wait for ever."""
        if self.failed is not None:
            raise EngineStopped(f"this replica's engine stopped: {first_line(self.failed)}")
        if not self._thread.is_alive():
            raise EngineStopped("this replica's engine stopped")

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

        self._check_engine()
        start = time.perf_counter()
        length = (
            None
            if unit.length == "fixed"
            else "auto"
            if unit.length == "auto"
            else int(unit.length)
        )
        with self.engine.lock:  # no step runs on the model while targets are built
            targets = self.targets(unit)
            inverted = None
            if unit.search.algorithm == "inverter":  # one forward pass, no step-wise search
                inverted = invert(self.model, targets, unit.search, length=length)
        if inverted is not None:
            yield self._finished(unit, inverted, list(range(len(inverted))), start, False)
            return
        events: queue.Queue[Any] = queue.Queue()
        finished: list[int] = []

        def checkpoint(index: int, step: int) -> None:  # on the engine thread, in step order
            done = {r: work.results[r] for r in finished if work.results[r].steps <= step}
            found = sum(r.found for r in done.values())
            exact = sum(bool(r.exact) for r in done.values())
            losses, shares = at_checkpoint(unit, done, work.marks.pop(index, {}))
            events.put(
                Checkpoint(unit.key, index, step, found, exact, unit.samples, losses, shares)
            )

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
                        self._check_engine()
                    item = _QUIET
                if item is None:
                    break
                ended_now = len(finished)  # appended on the engine thread: read once
                if (
                    unit.keep_every is not None
                    and ended_now > kept
                    and time.monotonic() - kept_at >= unit.keep_every
                ):
                    picked = finished[kept:ended_now]
                    yield Kept(
                        unit.key, self._rows(unit, [work.results[r] for r in picked], picked)
                    )
                    kept, kept_at = ended_now, time.monotonic()
                if item is not _QUIET:
                    yield item
        finally:  # also when the driver stops listening: the engine drops the unit
            self.works.pop(unit.key, None)
            self.reporter.done(unit.key)
            if not work.done:
                self.engine.cancel(work)
        if work.error is not None:  # only a dying engine hands a work its error
            # Its thread records the error right after: the health check that this unit's
            # failure prompts must find it.
            self._thread.join(ENGINE_EXIT_S)
            raise EngineStopped(f"the engine stopped: {first_line(work.error)}") from work.error
        rows = sorted(work.results)
        results = [work.results[r] for r in rows]
        yield self._finished(unit, results, rows, start, work.cancelled, work.sample_steps())

    def targets(self, unit: Unit) -> Any:
        """The unit's target set, built once for rows and an observation seen before (a study's
        trials share their rows; their objectives differ in the loss only)."""
        from sodaray.objective.targets import make_targets

        objective = unit.objective
        key = (
            tuple(unit.rows["sample_id"]),
            tuple(map(tuple, unit.rows["tokens"])),
            objective.shape(),
            objective.atol,
            objective.rtol,
        )
        targets = self._targets.pop(key, None)
        if targets is None:
            targets = make_targets(self.model, unit.rows["tokens"], objective=objective)
            targets.sample_ids = list(unit.rows["sample_id"])
        self._targets[key] = targets
        while len(self._targets) > TARGET_CACHE:
            self._targets.popitem(last=False)
        return dataclasses.replace(targets, objective=objective)

    def _rows(self, unit: Unit, results: list[Any], rows: list[int]) -> Any:
        """The result rows of `results`, the unit's samples at `rows`."""
        return replica_rows(
            self.model,
            self.spec,
            results,
            unit.objective,
            unit.rows,
            rows,
            length_mode=unit.length_mode,
            **unit.context,
        )

    def _finished(
        self,
        unit: Unit,
        results: list[Any],
        rows: list[int],
        start: float,
        cancelled: bool,
        sample_steps: int | None = None,
    ) -> Finished:
        table = self._rows(unit, results, rows)
        took = self.engine.take_occupancy()
        return Finished(
            unit.key,
            table,
            time.perf_counter() - start,
            os.getpid(),
            cancelled,
            took.slot_steps,
            took.capacity_steps,
            took.steps,
            sum(r.steps for r in results) if sample_steps is None else sample_steps,
        )


def at_checkpoint(
    unit: Unit, done: dict[int, Any], marks: dict[int, tuple[float, list[int]]]
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Each sample's loss and share of its true tokens at a checkpoint: a finished one's
    (`done`, by row) at its end, a running one's at the checkpoint's step (`marks`, by row).
    A candidate of another length than the true input holds none of its tokens."""
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
    return tuple(losses), tuple(shares)
