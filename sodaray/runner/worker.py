"""The Ray actor: one model replica, loaded once, inverting shards through `sodaray.invert`."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from sodaray.experiment.replica import load_replica
from sodaray.experiment.spec import ModelSpec
from sodaray.objectives import Objective
from sodaray.search.base import SearchConfig


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


@dataclass(frozen=True)
class ShardOutput:
    table: pa.Table
    pid: int
    seconds: float


class InversionWorker:
    """Loads one model on the GPU Ray assigned (or the CPU) and inverts shards of a job.

    Wrapped with `ray.remote` by the runner; kept a plain class so it is testable without Ray.
    The driver writes the returned rows.
    """

    def __init__(self, model: ModelSpec, num_cpus: float = 1.0) -> None:
        self.model_id = model.id
        self.model = load_replica(model, num_cpus)

    def pid(self) -> int:
        return os.getpid()

    def run_shard(self, task: ShardTask) -> ShardOutput:
        from sodaray.api import invert
        from sodaray.results import RunContext, result_rows
        from sodaray.targets import make_targets

        start = time.perf_counter()
        rows = task.rows
        targets = make_targets(self.model, rows["tokens"], objective=task.objective)
        targets.sample_ids = list(rows["sample_id"])
        auto = task.length == "auto"
        assumed = task.length.isdigit()  # an assumed length, right or wrong
        results = invert(
            self.model,
            targets,
            task.search,
            length="auto" if auto else int(task.length) if assumed else None,
            max_length=task.max_length,
        )
        context = RunContext.for_model(
            self.model,
            task.objective,
            dataset=task.dataset,
            length_mode="auto" if auto else "assumed" if assumed else "fixed",
            sweep=task.sweep,
            job=task.job,
            config_hash=task.config_hash,
        )
        context.model = self.model_id
        context.model_name = task.model_name
        table = result_rows(
            results, context, true_texts=rows.get("text"), pii_labels=rows.get("pii_labels")
        )
        return ShardOutput(table, os.getpid(), time.perf_counter() - start)
