"""A model entry loaded inside a Ray actor: on the GPU Ray assigned it, or the CPU."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Sequence
from typing import Any

from sodaray.experiment.spec import ModelSpec
from sodaray.models import LoadedModel, ModelLoadError

log = logging.getLogger(__name__)


def load_replica(spec: ModelSpec, num_cpus: float = 1.0) -> LoadedModel:
    """`spec`'s model on this process's Ray GPU if it has one, else the CPU, where torch keeps
    to the `num_cpus` slots Ray gave the actor (else every actor would use every core)."""
    import torch

    from sodaray.models import load_model

    try:
        import ray

        gpus = ray.get_gpu_ids() if ray.is_initialized() else []
    except ImportError:
        gpus = []
    device = "cuda" if gpus and torch.cuda.is_available() else "cpu"
    if device == "cpu":
        torch.set_num_threads(max(1, int(num_cpus)))
    where = spec.source or spec.id
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
