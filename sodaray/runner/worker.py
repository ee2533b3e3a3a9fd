"""The Ray actor: one model replica, loaded once, inverting shards through `sodaray.invert`."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import pyarrow as pa

log = logging.getLogger(__name__)


class InversionWorker:
    """Loads one model on the GPU Ray assigned (or the CPU) and inverts shards of a job.

    Wrapped with `ray.remote` by the runner; kept a plain class so it is testable without Ray.
    A shard task holds its rows (tokens, ids, texts, PII labels), so workers need no shared
    filesystem; the driver writes the returned rows.
    """

    def __init__(self, model: dict[str, Any], num_cpus: float = 1.0) -> None:
        import torch

        from sodaray.models import load_model

        try:
            import ray

            gpus = ray.get_gpu_ids() if ray.is_initialized() else []
        except ImportError:
            gpus = []
        device = "cuda" if gpus and torch.cuda.is_available() else "cpu"
        if device == "cpu":  # stay within the CPU slots Ray gave this actor
            torch.set_num_threads(max(1, int(num_cpus)))
        self.model_id = model["id"]
        self.model = load_model(
            model["id"],
            gguf_file=model.get("gguf_file"),
            device=device,
            dtype=model.get("dtype", "float32"),
            bos=model.get("bos"),
            trust_remote_code=model.get("trust_remote_code", False),
        )
        log.info("worker %d loaded %s on %s", os.getpid(), self.model_id, device)

    def pid(self) -> int:
        return os.getpid()

    def run_shard(self, task: dict[str, Any]) -> dict[str, Any]:
        from sodaray.api import invert, make_config
        from sodaray.objectives import Objective, make_targets
        from sodaray.results import RunContext, result_rows

        start = time.perf_counter()
        rows = task["rows"]
        objective = Objective(**task["objective"])
        targets = make_targets(self.model, rows["tokens"], objective=objective)
        targets.sample_ids = list(rows["sample_id"])
        config = make_config(task["algorithm"], task["params"])
        auto = task["length"] == "auto"
        assumed = str(task["length"]).isdigit()  # an assumed length, right or wrong
        results = invert(
            self.model,
            targets,
            config,
            length="auto" if auto else int(task["length"]) if assumed else None,
            max_length=task["max_length"],
        )
        context = RunContext.for_model(
            self.model,
            objective,
            dataset=task["dataset"],
            length_mode="auto" if auto else "assumed" if assumed else "fixed",
            sweep=task["sweep"],
            job=task["job"],
            config_hash=task["config_hash"],
        )
        context.model = self.model_id
        context.model_name = task.get("model_name", "")
        table: pa.Table = result_rows(
            results, context, true_texts=rows.get("text"), pii_labels=rows.get("pii_labels")
        )
        return {"table": table, "pid": os.getpid(), "seconds": time.perf_counter() - start}
