"""What every search algorithm shares: the run-level config fields, the per-target result, and
the batch-state protocol the refilling pool drives."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar, Protocol

import numpy as np
import torch
from torch import Tensor

from sodaray.objectives import BatchTargets, hard_match
from sodaray.targets import TargetSet

# Step counters are int64 tensors and schedules multiply them; a billion steps is days per target.
MAX_STEPS = 10**9


@dataclass
class SearchConfig:
    """Fields common to all algorithms: step budget, pool size and seed."""

    max_steps: int = 2000
    max_batch_size: int = 100
    seed: int = 0
    # Optional wall-clock budget per target (time spent in the batch), for equal-time comparisons.
    max_seconds: float | None = None

    algorithm = "base"  # class attribute, overridden by each algorithm
    # Old parameter names -> new: refused with a message naming the new one.
    RENAMED: ClassVar[dict[str, str]] = {}
    display_name = "base"  # its name in reports
    # Steps a sample may take: `max_steps` for a search; an algorithm that answers in one pass
    # (the learned inverter) says 1, so a sweep plan does not count its `max_steps` as work.
    stepwise: ClassVar[bool] = True

    def step_budget(self) -> int:
        return self.max_steps if self.stepwise else 1

    @classmethod
    def variant_label(cls, params: dict[str, Any]) -> str:
        """A result row's name in reports, from its recorded parameters (an algorithm with
        named variants, as SODA's ablations, overrides this)."""
        return cls.display_name

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        from sodaray.validation import check_fields_finite

        check_fields_finite(self)  # NaN passes every range check below
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be at least 1, not {self.max_steps}")
        if self.max_steps > MAX_STEPS:
            raise ValueError(f"max_steps must be at most {MAX_STEPS}, not {self.max_steps}")
        if not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be in [0, 2**63), not {self.seed}")
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, not {self.max_batch_size}")
        if self.max_seconds is not None and self.max_seconds <= 0:
            raise ValueError(f"max_seconds must be positive, not {self.max_seconds}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "config") -> SearchConfig:
        """Build from a mapping (YAML), naming the unknown field on error."""
        for old in sorted(set(data) & set(cls.RENAMED)):
            raise ValueError(
                f"{source}: {cls.algorithm} parameter {old!r} is now {cls.RENAMED[old]!r}"
            )
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(
                f"{source}: unknown {cls.algorithm} parameter {unknown[0]!r} "
                f"(known: {', '.join(sorted(known))})"
            )
        from sodaray.validation import coerce_fields

        try:
            return cls(**coerce_fields(cls, data))
        except ValueError as exc:
            raise ValueError(f"{source}: {exc}") from exc


@dataclass
class InversionResult:
    """One target's outcome. `exact` is None when the true input is unknown."""

    sample_id: int
    tokens: list[int]
    text: str | None
    found: bool
    exact: bool | None
    steps: int
    seconds: float
    final_loss: float
    predicted_length: int  # the length searched at (the true one is len(true_tokens))
    algorithm: str
    seed: int
    true_tokens: list[int] | None = None
    lengths_tried: list[int] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)  # the algorithm's parameters

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class StepOutcome:
    """One step of a batch: which slots matched, their argmax tokens and relaxed loss."""

    found: Tensor  # (B,) bool
    tokens: Tensor  # (B, n) long
    loss: Tensor  # (B,) float


class BatchSearch(Protocol):
    """A batch of equal-length searches in slots; the pool adds, steps and compacts it."""

    def add(self, slots: Tensor, rows: np.ndarray) -> None:
        """Start fresh searches for target `rows` in `slots`."""

    def step(self, steps_after: np.ndarray) -> StepOutcome:
        """Advance every slot by one step; `steps_after` is each slot's own count after it."""

    def keep(self, slots: Tensor) -> None:
        """Drop every slot not in `slots` (the batch shrinks when the queue is empty)."""


class BatchState:
    """What every algorithm's batch holds: the model, the targets in its slots, and the tokens
    each slot last sent to the hard-max check."""

    def __init__(
        self,
        model: Any,
        targets: TargetSet,
        length: int,
        config: SearchConfig,
        slots: int,
        generator: torch.Generator,
    ) -> None:
        self.model, self.targets, self.n, self.cfg = model, targets, length, config
        self.objective = targets.objective
        self.generator = generator
        dev = model.device
        self.batch = BatchTargets.from_set(targets, np.zeros(slots, dtype=np.int64), dev)
        self.last_checked = torch.full((slots, length), -1, device=dev, dtype=torch.long)

    def add_targets(self, slots: Tensor, rows: np.ndarray) -> None:
        """Put target `rows` in `slots`, with nothing checked yet."""
        self.last_checked[slots] = -1
        self.batch.put(slots, BatchTargets.from_set(self.targets, rows, self.model.device))

    def keep_targets(self, slots: Tensor) -> None:
        self.last_checked = self.last_checked[slots]
        self.batch = self.batch.select(slots)

    @torch.no_grad()
    def check(self, tokens: Tensor) -> Tensor:
        """The hard-max check (found mask), run only for slots whose tokens changed since their
        last check. An unchanged candidate already failed, so skipping it changes no outcome."""
        found = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
        changed = (tokens != self.last_checked).any(1).nonzero().squeeze(1)
        if len(changed):
            found[changed] = hard_match(
                self.model,
                self.objective,
                tokens[changed],
                self.batch,
                self.targets.atol,
                self.targets.rtol,
                rows=changed,
            )
            self.last_checked[changed] = tokens[changed]
        return found
