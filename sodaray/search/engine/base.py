"""What every search algorithm shares: the run-level config fields, the per-target result, the
batch protocol the engine drives (`BatchSearch`), and the base of the equal-length batches
(`UniformBatch`: GCG and embedding search; SODA's batch mixes lengths and configs)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np
import torch
from torch import Tensor

from sodaray.model.loaded import LoadedModel
from sodaray.objective.observations import SCREEN_SLACK, BatchTargets, screen_slack
from sodaray.objective.scoring import Layout, check_candidates, context_embeds, objective_loss
from sodaray.objective.targets import TargetSet
from sodaray.search.engine.slots import Buffers

if TYPE_CHECKING:
    from sodaray.search.engine.executor import Executor

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
    # Fields added after results were written, and the value that means "as before": left out
    # of `to_dict` at that value, so a job's hash (and its results folder) stays what it was.
    NEUTRAL: ClassVar[dict[str, Any]] = {}
    display_name = "base"  # its name in reports
    # Steps a sample may take: `max_steps` for a search; an algorithm that answers in one pass
    # (the learned inverter) says 1, so a sweep plan does not count its `max_steps` as work.
    stepwise: ClassVar[bool] = True

    def batch_type(self) -> type[BatchSearch] | None:
        """The batch the engine runs this algorithm's searches in (None: not a step-wise
        search, as the learned inverter)."""
        return None

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
        from sodaray.config.validation import check_fields_finite

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
        from sodaray.config.fields import plain  # `asdict`, faster: a job's hash takes it

        neutral = self.NEUTRAL
        return {k: v for k, v in plain(self).items() if k not in neutral or v != neutral[k]}

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "config") -> SearchConfig:
        """Build from a mapping (YAML), naming the unknown field on error."""
        for old in sorted(set(data) & set(cls.RENAMED)):
            raise ValueError(
                f"{source}: {cls.algorithm} parameter {old!r} is now {cls.RENAMED[old]!r}"
            )
        from sodaray.config.validation import coerce_fields, field_names

        known = set(field_names(cls))
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(
                f"{source}: unknown {cls.algorithm} parameter {unknown[0]!r} "
                f"(known: {', '.join(sorted(known))})"
            )
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


@dataclass(frozen=True)
class SlotEntry:
    """One search entering a batch: target `row` of `targets`, searched at `length` tokens with
    `config`."""

    targets: TargetSet
    row: int
    length: int
    config: SearchConfig

    @property
    def sample_id(self) -> int:
        return int(self.targets.sample_ids[self.row])


@dataclass
class StepOutcome:
    """One step of a batch: which slots matched, their relaxed loss, and what the step's
    forward pass computed (sequence positions, padding included) against what the slots' own
    sequences hold. A batch whose `lag` is k reports the step k before the one it just ran."""

    found: np.ndarray  # (B,) bool, on the host
    loss: Tensor | np.ndarray  # (B,)
    positions: int = 0
    useful: int = 0
    # The slots this outcome covers, where a batch reports steps late (`lag`): those that
    # took that step (None: every slot, this step).
    settled: np.ndarray | None = None


class EngineSettings(Protocol):
    """What a batch may read of the engine that makes it (`BatchSearch.create`): whether inputs
    of different lengths may share a pass, the scheduler's policy and the step's executor."""

    mix_lengths: bool
    policy: str
    executor: Executor


class BatchSearch:
    """A batch of searches in slots 0..B-1, driven by the engine: searches enter at the end
    (`add`), every slot advances one step at a time, and finished ones leave by a removal plan
    (`slots.removal_plan`). Everything the engine may ask of a batch is declared here, with
    the default an equal-length, one-config batch takes."""

    # Any length and any config of the algorithm in one batch (else one config and length).
    mixes_lengths: ClassVar[bool] = False
    # Steps an outcome takes to reach the host: `step` reports the step `lag` before its own.
    lag: ClassVar[int] = 0

    @classmethod
    def refuse(cls, model: LoadedModel, config: SearchConfig) -> None:
        """Raise ValueError where `config` cannot run on `model` (checked on the caller's
        thread, so a bad config fails its own work)."""

    @classmethod
    def create(
        cls, model: LoadedModel, config: SearchConfig, length: int, engine: EngineSettings
    ) -> BatchSearch:
        """A new batch for `config`'s searches at `length` on the engine's executor."""
        generator = torch.Generator(device=model.device).manual_seed(config.seed)
        return cls(model, config, length, generator)  # type: ignore[call-arg]

    @classmethod
    def family(cls, config: SearchConfig, targets: TargetSet) -> list[Any]:
        """What searches must share to share a batch beyond the algorithm (batches of one
        family share one capacity): here the config, the objective and the tolerance."""
        tolerance = [targets.atol, targets.rtol]
        return [config.to_dict(), asdict(targets.objective), tolerance]

    def add(self, entries: Sequence[SlotEntry]) -> None:
        """Start fresh searches for `entries` in new slots B..B+k-1."""
        raise NotImplementedError

    def step(self, steps_after: np.ndarray) -> StepOutcome:
        """Advance every slot by one step; `steps_after` is each slot's own count after it."""
        raise NotImplementedError

    def remove(self, left: int, holes: np.ndarray, movers: np.ndarray) -> None:
        """Drop slots by a removal plan."""
        raise NotImplementedError

    def candidates(self, slots: np.ndarray) -> list[list[int]]:
        """The candidates the last step checked for `slots`."""
        raise NotImplementedError

    def close(self) -> None:
        """The batch is done: anything it holds beyond its tensors goes."""


class UniformBatch(BatchSearch):
    """The base of equal-length, one-config batches: the model, the observed rows of the
    targets in the slots, their last candidates, and the hard-max check. A subclass's per-slot
    state (`start`) lives in `self.slots` beside the observed rows, entering and leaving here."""

    def __init__(
        self, model: LoadedModel, config: SearchConfig, length: int, generator: torch.Generator
    ) -> None:
        self.model, self.cfg, self.n, self.generator = model, config, length, generator
        self.slots = Buffers()
        self.objective: Any = None
        self.atol = self.rtol = 0.0
        self.current: Tensor | None = None  # (B, n) candidates of the last step

    def start(self, entries: Sequence[SlotEntry]) -> dict[str, Tensor]:
        """The algorithm's state for new slots (subclasses)."""
        return {}

    def add(self, entries: Sequence[SlotEntry]) -> None:
        if not entries:
            return
        if any(e.length != self.n or e.config != self.cfg for e in entries):
            raise ValueError("a uniform batch holds one length and one config")
        first = entries[0].targets
        if self.objective is None:
            self.objective, self.atol, self.rtol = first.objective, first.atol, first.rtol
        dev = self.model.device
        rows = observed_rows(entries, dev, screen_slack(self.model))
        last = torch.full((len(entries), self.n), -1, dtype=torch.long, device=dev)
        self.slots.append({**rows.fields(), "last": last, **self.start(entries)})

    def remove(self, left: int, holes: np.ndarray, movers: np.ndarray) -> None:
        self.slots.remove(left, holes, movers)
        if self.current is not None:
            self.current = self.current[: max(left, 0)]  # refreshed by the next step

    @property
    def batch(self) -> BatchTargets:
        """The observed rows of the live slots."""
        s = self.slots
        return BatchTargets(
            *(s[name] if name in s else None for name in BatchTargets.FIELDS)  # type: ignore[arg-type]
        )

    def loss(self, embeds: Tensor, batch: BatchTargets, probs: Tensor | None = None) -> Tensor:
        """Each input's loss (k,) from its embedded tokens `embeds` (k, n, d) against `batch`,
        their observed rows (`probs`: the fluency penalty's one-hots, (k * n, V))."""
        hidden = self.model.hidden(context_embeds(self.model, embeds, batch))
        layout = Layout.uniform(len(embeds), self.n, embeds.device)
        return objective_loss(self.model, self.objective, hidden, layout, batch, probs)

    @torch.no_grad()
    def check(self, tokens: Tensor) -> Tensor:
        """The hard-max check (found mask), run only for slots whose tokens changed since their
        last check. An unchanged candidate already failed, so skipping it changes no outcome."""
        self.current = tokens
        found = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
        last = self.slots["last"]
        changed = (tokens != last).any(1).nonzero().squeeze(1)
        if len(changed):
            layout = Layout.uniform(len(changed), self.n, tokens.device)
            flat, rest = tokens[changed].reshape(-1), (self.batch, changed, self.atol, self.rtol)
            found[changed] = check_candidates(self.model, self.objective, layout, flat, *rest)
            last[changed] = tokens[changed]
        return found

    def candidates(self, slots: np.ndarray) -> list[list[int]]:
        assert self.current is not None
        return self.current[torch.as_tensor(slots, device=self.current.device)].tolist()

    def outcome(self, found: Tensor, loss: Tensor) -> StepOutcome:
        width = len(self.model.prefix_ids) + self.n + self.objective.output_tokens - 1
        positions = len(self.slots) * width
        return StepOutcome(found.cpu().numpy(), loss.detach(), positions, positions)


def observed_rows(
    entries: Sequence[SlotEntry], device: torch.device, slack: float = SCREEN_SLACK
) -> BatchTargets:
    """The observed rows of `entries` in order, from however many target sets they come
    (`slack`: the match check's screen's, see `observations.screen_slack`)."""
    by_set: dict[int, tuple[TargetSet, list[int], list[int]]] = {}
    for i, e in enumerate(entries):
        _, where, rows = by_set.setdefault(id(e.targets), (e.targets, [], []))
        where.append(i)
        rows.append(e.row)
    parts = [
        (w, BatchTargets.from_set(t, np.asarray(r), device, slack)) for t, w, r in by_set.values()
    ]
    if len(parts) == 1:
        return parts[0][1]
    order = torch.as_tensor(np.argsort(np.concatenate([w for w, _ in parts])), device=device)
    merged = {}
    for name in BatchTargets.FIELDS:
        pieces = [getattr(b, name) for _, b in parts]
        nones = sum(p is None for p in pieces)
        if 0 < nones < len(pieces):
            raise ValueError(f"targets in one batch differ in {name}")
        merged[name] = None if nones else torch.cat(pieces)[order]
    return BatchTargets(**merged)


_STREAMS = {"reinit": 0x50DA, "start": 0x57A7}  # keep each kind of keyed draw apart


def keyed_generator(seed: int, sample_id: int, draw: int, stream: str) -> torch.Generator:
    """A CPU generator that depends only on (seed, sample id, draw number, stream): a sample's
    random draws do not depend on its batch neighbours, its slot, or the actor it runs on.
    Sample ids are hashed into the key as unsigned 64-bit words (negative ids wrap)."""
    key = [int(seed) % 2**64, int(sample_id) % 2**64, int(draw) % 2**64, _STREAMS[stream]]
    state = np.random.SeedSequence(key).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))
