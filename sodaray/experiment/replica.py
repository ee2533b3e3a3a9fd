"""A model entry loaded inside a Ray actor: on the GPU Ray assigned it, or the CPU."""

from __future__ import annotations

import logging
import os

from sodaray.experiment.spec import ModelSpec
from sodaray.models import LoadedModel

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
    model = load_model(
        spec.id,
        gguf_file=spec.gguf_file,
        device=device,
        dtype=spec.dtype,
        bos=spec.bos,
        trust_remote_code=spec.trust_remote_code,
    )
    log.info("worker %d loaded %s on %s", os.getpid(), spec.id, device)
    return model
