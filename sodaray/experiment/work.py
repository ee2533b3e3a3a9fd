"""What crosses between the driver and a replica: a unit of work (a sweep's shard, a study's trial)
and what the replica streams back for it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sodaray.objectives import Objective
from sodaray.search.base import SearchConfig


@dataclass(frozen=True)
class Unit:
    """Samples to invert with one config: the dataset rows themselves (token ids, ids, texts, PII
    labels: replicas need no shared filesystem), how long to search each (`length`: "fixed",
    "auto" or an assumed length such as "3"), the steps at which to report progress
    (`checkpoints`), and the context the result rows carry (`sodaray.results.RunContext` fields:
    dataset, sweep, job, config_hash, shard, model_name and the dataset's identity)."""

    key: str  # unique among the units of one run
    rows: dict[str, list[Any]]
    search: SearchConfig
    objective: Objective
    length: str = "fixed"
    max_length: int = 10
    checkpoints: tuple[int, ...] = ()
    context: dict[str, Any] = field(default_factory=dict)

    @property
    def samples(self) -> int:
        return len(self.rows["sample_id"])

    @property
    def length_mode(self) -> str:
        """The result rows' `length_mode`: fixed, auto or assumed."""
        return "assumed" if self.length.isdigit() else self.length


@dataclass(frozen=True)
class Checkpoint:
    """Every sample of a unit has finished or taken `step` steps: the counts of those that
    finished within `step` steps (the same whatever else shared the replica's batch)."""

    key: str
    index: int
    step: int
    found: int
    exact: int
    total: int


@dataclass(frozen=True)
class Finished:
    """A unit's result rows (a pyarrow Table): all of them, or, for a cancelled unit, those that
    finished before. `seconds` is the unit's time on the replica; the occupancy counts are the
    replica's since its previous output (any unit's): searches stepped (`slot_steps`) against
    the slots its batches offered (`capacity_steps`), over `batch_steps` steps."""

    key: str
    table: Any
    seconds: float
    pid: int
    cancelled: bool = False
    slot_steps: int = 0
    capacity_steps: int = 0
    batch_steps: int = 0
