"""`invert`: the one entry point the CLI, the runner and the tuner call."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import torch

from sodaray.inverter.run import InverterConfig, _NoBatch, run_inverter
from sodaray.models import LoadedModel
from sodaray.search.base import BatchSearch, InversionResult, SearchConfig
from sodaray.search.embedding import EmbeddingBatch, EmbeddingConfig
from sodaray.search.gcg import GcgBatch, GcgConfig
from sodaray.search.pool import run_pool
from sodaray.search.soda import SodaBatch, SodaConfig
from sodaray.targets import TargetSet

log = logging.getLogger(__name__)

# algorithm name -> (config class, batch-state class)
ALGORITHMS: dict[str, tuple[type[SearchConfig], Callable[..., BatchSearch]]] = {
    "soda": (SodaConfig, SodaBatch),
    "gcg": (GcgConfig, GcgBatch),
    "embedding": (EmbeddingConfig, EmbeddingBatch),
    "inverter": (InverterConfig, _NoBatch),  # one forward pass, dispatched before the pool
}


def make_config(
    algorithm: str = "soda", params: dict[str, Any] | None = None, *, source: str = "config"
) -> SearchConfig:
    """An algorithm's config from a name and a mapping of parameters (validated)."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {', '.join(ALGORITHMS)}")
    return ALGORITHMS[algorithm][0].from_dict(dict(params or {}), source=source)


def invert(
    model: LoadedModel,
    targets: TargetSet,
    config: SearchConfig | None = None,
    *,
    length: int | Literal["auto"] | None = None,
    max_length: int = 10,
    on_result: Callable[[InversionResult], None] | None = None,
    on_step: Callable[[int, int], None] | None = None,
    on_target: Callable[[int, InversionResult], None] | None = None,
    on_batch: Callable[[int], None] | None = None,
) -> list[InversionResult]:
    """Recover the inputs behind `targets`; results come back in target order.

    `length`: None searches each target at its true length (known when the targets were made
    from inputs); an int searches that length; "auto" tries 1..`max_length`, shortest first,
    and keeps the first length that matches. `on_result` is called as each target finishes;
    `on_step(length, step)` after every step of the batch searching that length (the tuner
    reports pruning checkpoints from it; an exception raised there stops the search).
    `on_target(row, result)` is `on_result` with the target's row in `targets`, for callers
    that batch several sources whose sample ids repeat (the sweep runner's shard streams).
    `on_batch(active)` runs after every step with the number of searches that step advanced
    (the batch occupancy is `active / config.max_batch_size`).
    """
    config = config or SodaConfig()
    algo = config.algorithm
    if algo not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algo!r}")
    batch_cls = ALGORITHMS[algo][1]
    n_targets = len(targets)
    if length is None:
        if targets.true_tokens is None:
            raise ValueError("the input length is unknown: pass length=N or length='auto'")
        lengths = [len(t) for t in targets.true_tokens]
        plan = [lengths]
    elif length == "auto":
        if max_length < 1:
            raise ValueError("max_length must be at least 1")
        from sodaray.validation import check_context

        check_context(model, max_length, targets.objective.output_tokens)  # before the plan
        plan = [[L] * n_targets for L in range(1, max_length + 1)]
    elif isinstance(length, int) and length >= 1:
        plan = [[length] * n_targets]
    else:
        raise ValueError(f"length must be a positive integer or 'auto', not {length!r}")

    if algo == "inverter":  # a learned model, not a step-wise search: its first guess stands
        by_row = plan[0] if length != "auto" else [max_length] * n_targets
        results = run_inverter(model, targets, config, by_row, on_result)  # type: ignore[arg-type]
        if on_target is not None:  # one forward pass: every row finishes at once
            for row, res in enumerate(results):
                on_target(row, res)
        return results

    from sodaray.validation import check_context, check_state_memory

    for stage in plan:  # before any allocation: lengths fit the model, the state fits memory
        for n in sorted(set(stage)):
            check_context(model, n, targets.objective.output_tokens)
            batch = min(config.max_batch_size, sum(1 for x in stage if x == n))
            check_state_memory(model, batch, n, algo)
    generator = torch.Generator(device=model.device).manual_seed(config.seed)
    collector = _Collector(model, targets, config, on_result, on_target)
    pending = list(range(n_targets))
    for stage_index, stage in enumerate(plan):
        collector.last_stage = stage_index == len(plan) - 1
        collector.retry = []
        by_length: dict[int, list[int]] = {}
        for row in pending:
            by_length.setdefault(stage[row], []).append(row)
        for n, rows in sorted(by_length.items()):
            group = targets.subset(rows)
            slots = _Slots(len(rows), config.max_batch_size, on_batch)
            run_pool(
                lambda slots, group=group, n=n: batch_cls(
                    model, group, n, config, slots, generator
                ),
                len(rows),
                max_steps=config.max_steps,
                max_batch_size=config.max_batch_size,
                max_seconds=config.max_seconds,
                on_finished=lambda *out, rows=rows, n=n, slots=slots: collector.finished(
                    rows, n, *out, slots=slots
                ),
                device=model.device,
                on_step=None
                if on_step is None and on_batch is None
                else slots.step_hook(n, on_step),
            )
        pending = sorted(collector.retry)
        if not pending:
            break
    results = collector.results
    return [results[i] for i in range(n_targets)]


class _Slots:
    """The pool's batch size step by step, for `on_batch`: it starts at min(cap, targets) and,
    as `run_pool` refills freed slots from its queue in the same step, stays at min(cap, targets
    not yet finished), so counting finished targets is enough (no hook inside the pool)."""

    def __init__(self, targets: int, cap: int, report: Callable[[int], None] | None) -> None:
        self.left, self.cap, self.report = targets, cap, report
        self.active = min(cap, targets)

    def finished(self, count: int) -> None:
        self.left -= count

    def step_hook(
        self, length: int, on_step: Callable[[int, int], None] | None
    ) -> Callable[[int], None]:
        def stepped(step: int) -> None:
            # `run_pool` calls this after the step's finished slots were delivered: the step
            # just taken ran `active` searches; the next one runs what is left, up to the cap.
            if self.report is not None:
                self.report(self.active)
            self.active = min(self.cap, self.left)
            if on_step is not None:
                on_step(length, step)

        return stepped


class _Collector:
    """Turns finished pool slots into results; with auto length, unfound rows try again."""

    def __init__(self, model, targets, config, on_result, on_target=None) -> None:
        self.model, self.targets, self.config, self.on_result = model, targets, config, on_result
        self.on_target = on_target
        self.results: dict[int, InversionResult] = {}
        self.params = {k: v for k, v in config.to_dict().items() if k != "seed"}
        self.retry: list[int] = []
        self.last_stage = True

    def finished(self, rows, n, local, tokens, found, loss, steps, seconds, slots=None) -> None:
        if slots is not None:
            slots.finished(len(local))
        targets = self.targets
        for j, i in enumerate(local):
            row = rows[int(i)]
            prev = self.results.get(row)
            true = targets.true_tokens[row] if targets.true_tokens is not None else None
            toks = [int(t) for t in tokens[j]]
            res = InversionResult(
                sample_id=targets.sample_ids[row],
                tokens=toks,
                text=self.model.decode(toks),
                found=bool(found[j]),
                exact=None if true is None else toks == list(true),
                steps=int(steps[j]) + (prev.steps if prev else 0),
                seconds=float(seconds[j]) + (prev.seconds if prev else 0.0),
                final_loss=float(loss[j]),
                predicted_length=n,
                algorithm=self.config.algorithm,
                seed=self.config.seed,
                true_tokens=None if true is None else list(true),
                lengths_tried=(prev.lengths_tried if prev else []) + [n],
                params=self.params,
            )
            self.results[row] = res
            if not res.found and not self.last_stage:
                self.retry.append(row)
            else:
                if self.on_result is not None:
                    self.on_result(res)
                if self.on_target is not None:
                    self.on_target(row, res)


def summarize(results: list[InversionResult]) -> dict[str, float]:
    """Counts for logs and progress lines."""
    found = np.array([r.found for r in results], dtype=bool)
    exact = np.array([bool(r.exact) for r in results], dtype=bool)
    return {"n": len(results), "found": int(found.sum()), "exact": int(exact.sum())}
