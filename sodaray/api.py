"""`invert`: the one entry point the CLI and the replicas call, over the search engine."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

from sodaray.inverter.run import InverterConfig, run_inverter
from sodaray.model.loaded import LoadedModel
from sodaray.objective.targets import TargetSet
from sodaray.search.embedding import EmbeddingConfig
from sodaray.search.engine.base import InversionResult, SearchConfig
from sodaray.search.engine.executor import policy_for
from sodaray.search.engine.loop import Engine
from sodaray.search.engine.work import Work
from sodaray.search.gcg import GcgConfig
from sodaray.search.soda.config import SodaConfig

# The one algorithm registry: name -> config class (a step-wise one names its batch type).
ALGORITHMS: dict[str, type[SearchConfig]] = {
    "soda": SodaConfig,
    "gcg": GcgConfig,
    "embedding": EmbeddingConfig,
    "inverter": InverterConfig,  # a learned model: one forward pass, not a step-wise search
}

Length = int | Literal["auto"] | None


def make_config(
    algorithm: str = "soda", params: dict[str, Any] | None = None, *, source: str = "config"
) -> SearchConfig:
    """An algorithm's config from a name and a mapping of parameters (validated)."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {', '.join(ALGORITHMS)}")
    return ALGORITHMS[algorithm].from_dict(dict(params or {}), source=source)


def length_plans(
    model: LoadedModel, targets: TargetSet, length: Length, max_length: int = 10
) -> list[Sequence[int]]:
    """The lengths each target is searched at, in order. None: its true length (known when the
    targets were made from inputs); an int: that length; "auto": 1..`max_length`, keeping the
    first that matches. The longest must fit the model's context (checked before planning)."""
    from sodaray.config.capacity import check_context

    if length is None:
        if targets.true_tokens is None:
            raise ValueError("the input length is unknown: pass length=N or length='auto'")
        plans: list[Sequence[int]] = [(len(t),) for t in targets.true_tokens]
    elif length == "auto":
        if max_length < 1:
            raise ValueError("max_length must be at least 1")
        check_context(model, max_length, targets.objective.output_tokens)
        plans = [range(1, max_length + 1)] * len(targets)
    elif isinstance(length, int) and not isinstance(length, bool) and length >= 1:
        plans = [(length,)] * len(targets)
    else:
        raise ValueError(f"length must be a positive integer or 'auto', not {length!r}")
    longest = max((plan[-1] for plan in plans), default=1)
    check_context(model, longest, targets.objective.output_tokens)
    return plans


def invert(
    model: LoadedModel,
    targets: TargetSet,
    config: SearchConfig | None = None,
    *,
    length: Length = None,
    max_length: int = 10,
    on_result: Callable[[InversionResult], None] | None = None,
    on_target: Callable[[int, InversionResult], None] | None = None,
    on_batch: Callable[[int], None] | None = None,
    policy: str | None = None,
    executor: str | None = None,
) -> list[InversionResult]:
    """Recover the inputs behind `targets`; results come back in target order.

    `length` as `length_plans` takes it; targets of every length share the batch. Callbacks run
    as each target finishes: `on_result(result)`, and `on_target(row, result)` with the target's
    row in `targets`; `on_batch(active)` at every step with the number of searches whose step it
    read. `executor`: how a SODA step runs (`sodaray.search.engine.executor.EXECUTORS`; None:
    "graph" on CUDA, eager elsewhere), bringing its scheduler policy (`policy_for`); `policy`:
    one of `sodaray.search.engine.scheduler.POLICIES` in its place.
    """
    config = config or SodaConfig()
    policy_for(executor, policy)  # both checked before any work, and for every algorithm
    if config.algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {config.algorithm!r}")
    plans = length_plans(model, targets, length, max_length)

    def delivered(row: int, result: InversionResult) -> None:
        if on_result is not None:
            on_result(result)
        if on_target is not None:
            on_target(row, result)

    if isinstance(config, InverterConfig):  # its first guess stands: one length per target
        by_row = [plan[-1] if length == "auto" else plan[0] for plan in plans]
        results = run_inverter(model, targets, config, by_row, on_result)
        for row, res in enumerate(results if on_target else ()):  # every row at once
            on_target(row, res)
        return results
    engine = Engine(model, on_batch=on_batch, policy=policy, executor=executor)
    work = Work(targets, config, plans, on_result=delivered)
    engine.submit(work)
    engine.run()
    return work.ordered()
