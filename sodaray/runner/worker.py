"""The Ray actor: one model replica, loaded once, inverting shards through `sodaray.invert`.

Two ways in. `run_shard` inverts one shard and returns its rows (one call per shard: the pool
refills only from that shard, so its batch shrinks as the shard's easy samples finish).
`run_shards` takes several shards of the same search, objective and length mode, runs ONE
`invert` over their concatenated targets, so the refilling pool draws from all of them and its
batch stays full, and yields each shard's rows as soon as its last sample finishes (a Ray
streaming generator: the driver writes each shard file while the rest still run).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from sodaray.experiment.data import DatasetIdentity
from sodaray.experiment.replica import load_replica, replica_rows
from sodaray.experiment.spec import ModelSpec
from sodaray.objectives import Objective
from sodaray.search.base import InversionResult, SearchConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShardTask:
    """One shard of a job, as it crosses to an actor: typed settings and the shard's rows
    (tokens, ids, texts, PII labels), so workers need no shared filesystem."""

    sweep: str
    job: str
    config_hash: str
    dataset: str
    model_name: str
    search: SearchConfig
    objective: Objective
    length: str  # "fixed", "auto", or an assumed length ("3")
    max_length: int
    rows: dict[str, list[Any]]
    shard: int | None = None  # the shard's index in its job
    dataset_identity: DatasetIdentity = DatasetIdentity()

    def batch_key(self) -> str:
        return batch_key(self.search, self.objective, self.length, self.max_length)


def batch_key(search: SearchConfig, objective: Objective, length: str, max_length: int) -> str:
    """Shards with equal keys can share one `invert` call (one pool): the pool runs one search
    config, one objective (it shapes the targets and the loss) and one length plan. Everything
    else (job, dataset, texts) is per row and goes back into each shard's rows."""
    return json.dumps(
        [search.algorithm, search.to_dict(), dataclasses.asdict(objective), length, max_length],
        sort_keys=True,
        default=str,
    )


@dataclass(frozen=True)
class ShardOutput:
    table: pa.Table
    pid: int
    seconds: float  # worker time: the shard's call start to this shard's last sample
    index: int = 0  # the shard's position in the call's task list (streams)
    # Batch occupancy since the previous output of the same call: the searches each step
    # advanced, summed over those steps (slot-steps), and the steps; occupancy is
    # slot_steps / (batch_steps * max_batch_size).
    slot_steps: int = 0
    batch_steps: int = 0
    max_batch_size: int = 1


class _Occupancy:
    """Counts `invert`'s `on_batch` reports; `take` returns the counts since the last take."""

    def __init__(self) -> None:
        self.slot_steps = self.batch_steps = 0
        self.lock = threading.Lock()

    def add(self, active: int) -> None:
        with self.lock:
            self.slot_steps += active
            self.batch_steps += 1

    def take(self) -> tuple[int, int]:
        with self.lock:
            out = self.slot_steps, self.batch_steps
            self.slot_steps = self.batch_steps = 0
        return out


_DONE = object()  # end of the inverting thread's results


class InversionWorker:
    """Loads one model on the GPU Ray assigned (or the CPU) and inverts shards of a job.

    Wrapped with `ray.remote` by the runner; kept a plain class so it is testable without Ray.
    The driver writes the returned rows.
    """

    def __init__(self, model: ModelSpec, num_cpus: float = 1.0) -> None:
        self.spec = model
        self.model = load_replica(model, num_cpus)

    def pid(self) -> int:
        return os.getpid()

    def run_shard(self, task: ShardTask) -> ShardOutput:
        """One shard, one `invert` call (the runner's `stream=False` path): its pool refills
        only from this shard."""
        (output,) = self.run_shards([task])
        return output

    def run_shards(self, tasks: list[ShardTask]) -> Iterator[ShardOutput]:
        """Invert `tasks` (equal `batch_key`) in one refilling pool; yield each shard's output
        as its last sample finishes, in finishing order (`ShardOutput.index` names the task).

        `invert` runs on a thread and its `on_target` callback feeds a queue this generator
        drains: a callback cannot yield, and the pool must keep stepping while the driver
        writes. An error in `invert` is raised here, after the shards finished before it."""
        if not tasks:
            return
        keys = {t.batch_key() for t in tasks}
        if len(keys) > 1:
            raise ValueError("run_shards: the shards differ in search, objective or length")
        start = time.perf_counter()
        owner = [i for i, t in enumerate(tasks) for _ in t.rows["sample_id"]]
        log.debug("one pool for %d shards, %d samples", len(tasks), len(owner))
        first = [0]
        for t in tasks:
            first.append(first[-1] + len(t.rows["sample_id"]))
        left = [len(t.rows["sample_id"]) for t in tasks]
        results: list[InversionResult | None] = [None] * len(owner)
        occupancy = _Occupancy()
        found: queue.Queue[Any] = queue.Queue()
        threads = _torch_threads()

        def work() -> None:
            _torch_threads(threads)  # OpenMP's thread count is per calling thread
            try:
                self._invert(tasks, on_batch=occupancy.add, on_target=lambda *r: found.put(r))
                found.put(_DONE)
            except BaseException as exc:  # noqa: BLE001 -- handed to the generator to raise
                found.put(exc)

        thread = threading.Thread(target=work, name="sodaray-invert", daemon=True)
        thread.start()
        while True:
            item = found.get()
            if item is _DONE:
                break
            if isinstance(item, BaseException):
                raise item
            row, result = item
            results[row] = result
            i = owner[row]
            left[i] -= 1
            if left[i] == 0:
                shard = results[first[i] : first[i + 1]]
                if not any(left):  # the last shard: its final step is reported after its rows
                    thread.join()
                slot_steps, batch_steps = occupancy.take()
                yield ShardOutput(
                    self._table(tasks[i], shard),  # type: ignore[arg-type]
                    os.getpid(),
                    time.perf_counter() - start,
                    i,
                    slot_steps,
                    batch_steps,
                    tasks[i].search.max_batch_size,
                )
        thread.join()
        if any(left):  # invert returned without a result for some rows: a bug, say so loudly
            raise RuntimeError(f"invert finished {len(owner) - sum(left)} of {len(owner)} rows")

    def _invert(self, tasks: list[ShardTask], **callbacks: Any) -> list[InversionResult]:
        from sodaray.api import invert
        from sodaray.targets import make_targets

        task = tasks[0]
        tokens = [t for task_ in tasks for t in task_.rows["tokens"]]
        targets = make_targets(self.model, tokens, objective=task.objective)
        # The real ids: SODA keys its re-draws by (seed, sample id, draw), so a sample follows
        # the same trajectory whichever shards share its batch. Ids may repeat across jobs;
        # results are matched to shards by row (`on_target`), never by id.
        targets.sample_ids = [i for task_ in tasks for i in task_.rows["sample_id"]]
        auto = task.length == "auto"
        assumed = task.length.isdigit()  # an assumed length, right or wrong
        return invert(
            self.model,
            targets,
            task.search,
            length="auto" if auto else int(task.length) if assumed else None,
            max_length=task.max_length,
            **callbacks,
        )

    def _table(self, task: ShardTask, results: list[InversionResult]) -> pa.Table:
        length = task.length
        return replica_rows(
            self.model,
            self.spec,
            results,
            task.objective,
            task.rows,
            dataset=task.dataset,
            length_mode="auto" if length == "auto" else "assumed" if length.isdigit() else "fixed",
            sweep=task.sweep,
            job=task.job,
            config_hash=task.config_hash,
            shard=task.shard,
            model_name=task.model_name,
            **task.dataset_identity.context(),
        )


def _torch_threads(count: int | None = None) -> int:
    import torch

    if count is not None and torch.get_num_threads() != count:
        torch.set_num_threads(count)
    return torch.get_num_threads()
