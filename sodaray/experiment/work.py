"""What crosses between the driver and a replica: a unit of work (a sweep's shard, a study's trial)
and what the replica streams back for it: its checkpoints, the replica's progress, the rows of
searches that have ended while others run, and at its end all its rows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sodaray.costs.flops import most_sample_steps
from sodaray.objective.objectives import Objective
from sodaray.search.engine.base import SearchConfig


@dataclass(frozen=True)
class Unit:
    """Samples to invert with one config: the dataset rows themselves (replicas need no shared
    filesystem), how long to search each (`length`: "fixed", "auto" or an assumed length such
    as "3"), the steps at which to report (`checkpoints`), and the context the result rows
    carry (`sodaray.results.RunContext` fields)."""

    key: str  # unique among the units of one run
    rows: dict[str, list[Any]]
    search: SearchConfig
    objective: Objective
    length: str = "fixed"
    max_length: int = 10
    checkpoints: tuple[int, ...] = ()
    context: dict[str, Any] = field(default_factory=dict)
    # Seconds between `Kept` items, the rows of searches ended since the last one (None: none).
    keep_every: float | None = None

    @property
    def samples(self) -> int:
        return len(self.rows["sample_id"])

    @property
    def length_mode(self) -> str:
        """The result rows' `length_mode`: fixed, auto or assumed."""
        return "assumed" if self.length.isdigit() else self.length

    @property
    def most_sample_steps(self) -> int:
        """The most sample-steps the unit can take (`sodaray.costs.flops.most_sample_steps`)."""
        return most_sample_steps(self.samples, self.search, self.length, self.max_length)


@dataclass(frozen=True)
class Checkpoint:
    """Every sample of a unit has finished or taken `step` steps: the counts of those finished
    within `step` steps, and each sample's loss and share of its true tokens there (its last
    step's for one that finished); the same whatever else shared the replica's batch."""

    key: str
    index: int
    step: int
    found: int
    exact: int
    total: int
    losses: tuple[float, ...] = ()
    shares: tuple[float, ...] = ()  # of each sample's positions, those holding its true token


@dataclass(frozen=True)
class UnitProgress:
    """One unit's counts so far: the sample-steps its samples have taken, the samples finished
    and found, and `most`, the most sample-steps it can come to (finished samples at the steps
    they took, the rest at their whole budget): it equals `sample_steps` at the end."""

    key: str
    sample_steps: int
    finished: int
    found: int
    most: int


@dataclass(frozen=True)
class Progress:
    """A replica's units in flight, every second or so while its engine steps
    (`experiment.replica`): one item on the stream of its oldest unit, holding every unit's
    counts. The occupancy counts are as `Finished`'s: the replica's since its previous output."""

    units: tuple[UnitProgress, ...]
    pid: int
    slot_steps: int = 0
    capacity_steps: int = 0
    batch_steps: int = 0


@dataclass(frozen=True)
class Kept:
    """Rows (a pyarrow Table) of a unit's searches that ended since its previous `Kept`, sent
    while the rest still run (`Unit.keep_every`); its `Finished` holds them again."""

    key: str
    table: Any


@dataclass(frozen=True)
class Finished:
    """A unit's result rows (a pyarrow Table): all of them, or for a cancelled unit those that
    finished before; `seconds`, its time on the replica. The occupancy counts are the replica's
    since its previous output: searches stepped against the slots its batches offered."""

    key: str
    table: Any
    seconds: float
    pid: int
    cancelled: bool = False
    slot_steps: int = 0
    capacity_steps: int = 0
    batch_steps: int = 0
    sample_steps: int = 0  # the unit's own: its samples' steps, a cancel's stopped ones too
