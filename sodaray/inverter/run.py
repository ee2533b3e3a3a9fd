"""The inverter behind `sodaray.invert`: one forward pass per target, checked with the same
hard-match test as the searches, reported in the same result schema."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from sodaray.model.loaded import LoadedModel
from sodaray.objective.observations import BatchTargets, screen_slack
from sodaray.objective.scoring import hard_match
from sodaray.objective.targets import TargetSet
from sodaray.search.engine.base import InversionResult, SearchConfig

if TYPE_CHECKING:  # transformers loads only when an inverter runs
    from sodaray.inverter.train import InverterMeta

log = logging.getLogger(__name__)


@dataclass
class InverterConfig(SearchConfig):
    """`checkpoint`: a folder written by `sodaray train-inverter` (its best/ or last/)."""

    checkpoint: str = ""

    algorithm = "inverter"
    display_name = "T5 inverter"
    stepwise = False  # one generation per sample, whatever max_steps says

    def validate(self) -> None:
        super().validate()
        if not self.checkpoint:
            raise ValueError("the inverter needs checkpoint=PATH (from sodaray train-inverter)")


def _observation(targets: TargetSet, meta: InverterMeta) -> torch.Tensor:
    """What the checkpoint reads: the observed tokens, or the observed full-vocabulary logits."""
    if meta.observation == "text":
        return targets.continuation
    if targets.objective.kind != "logits" or targets.observed_values is None:
        raise ValueError("a logits inverter needs targets of the logits objective")
    if targets.observed_indices is not None:
        raise ValueError("a logits inverter reads all logits, not top_k ones")
    return targets.observed_values.float()


def run_inverter(
    model: LoadedModel,
    targets: TargetSet,
    config: InverterConfig,
    lengths: list[int],
    on_result: Callable[[InversionResult], None] | None = None,
) -> list[InversionResult]:
    from sodaray.inverter.train import generate, load_inverter

    net, meta = load_inverter(config.checkpoint)
    if meta.llm_vocab_size != model.vocab_size:
        raise ValueError(
            f"the inverter was trained for a vocabulary of {meta.llm_vocab_size}, "
            f"the model has {model.vocab_size}"
        )
    obs = _observation(targets, meta)
    m = min(meta.output_tokens, obs.shape[1])
    if m < meta.output_tokens:
        trained = meta.output_tokens
        log.warning("targets observe %d positions, the inverter was trained on %d", m, trained)
    params = {k: v for k, v in config.to_dict().items() if k != "seed"}
    params.update(init=meta.init, shape=meta.shape, observation=meta.observation)
    results: list[InversionResult | None] = [None] * len(targets)
    for n in sorted(set(lengths)):
        rows = [row for row, k in enumerate(lengths) if k == n]
        for start in range(0, len(rows), config.max_batch_size):
            chunk = rows[start : start + config.max_batch_size]
            t0 = time.perf_counter()
            pred = generate(net, obs[chunk, :m], n, meta)
            toks = torch.tensor(pred, dtype=torch.long, device=model.device)
            slack = screen_slack(model)
            batch = BatchTargets.from_set(targets, np.asarray(chunk), model.device, slack)
            found = hard_match(model, targets.objective, toks, batch, targets.atol, targets.rtol)
            per = (time.perf_counter() - t0) / len(chunk)
            for j, row in enumerate(chunk):
                true = None if targets.true_tokens is None else list(targets.true_tokens[row])
                res = InversionResult(
                    sample_id=targets.sample_ids[row],
                    tokens=pred[j],
                    true_tokens=true,
                    text=model.decode(pred[j]),
                    found=bool(found[j]),
                    exact=None if true is None else pred[j] == true,
                    lengths_tried=[n],
                    steps=1,
                    seconds=per,
                    final_loss=float("nan"),
                    predicted_length=n,
                    algorithm="inverter",
                    seed=config.seed,
                    params=params,
                )
                results[row] = res
                if on_result is not None:
                    on_result(res)
    return [r for r in results if r is not None]
