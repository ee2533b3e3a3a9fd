"""A model's replicas on Ray and the units in flight on them: the one execution loop under sweeps
and studies.

Each replica is a threaded Ray actor (`ReplicaWorker`) that takes units as they come; the group
keeps enough of them in flight on each (at least `min_units`, and samples for `fill` batches)
that its engine's batch refills from the next unit while the last one's slow samples run. Units
stream back checkpoints and rows (`Checkpoint`, `Finished`), and a replica's progress
(`Progress`, on one of its units' streams). One failure policy: a unit whose
own input is bad (a ValueError or TypeError raised for it) fails at once, alone; a unit lost
with its replica (the actor died; Ray restarts it) or to another error is tried again, up to
`max_attempts` tries. A unit's failure that is not its input's fault asks every replica whether
it is there: one that Ray says is dead for good gets no more units, and when all are (the
driver's Ray node is gone: killed, crashed, interrupted) the group raises `ReplicasLost` rather
than fail every unit left in turn at once, so the caller stops with its unfinished work still to
do on a resume. Ray places the actors and moves the work; this module only decides which
replica gets the next unit.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sodaray.errors import last_line
from sodaray.experiment.cluster import actor_class
from sodaray.experiment.replica import ReplicaWorker
from sodaray.experiment.spec import ModelSpec
from sodaray.experiment.work import Checkpoint, Finished, Progress, Unit

log = logging.getLogger(__name__)

MAX_UNITS = 64  # units in flight on one replica (each holds one of its threads)
RESTART_WAIT_S = 120.0  # a restarted replica reloads its model before it answers


@dataclass(frozen=True)
class Failure:
    """A unit's try failed: `final` once it will not be tried again (its input is bad, or it
    has had `attempts` = max_attempts tries)."""

    key: str
    attempts: int
    error: str
    final: bool


Event = Checkpoint | Progress | Finished | Failure  # a Progress holds other units' counts too


class ReplicasLost(ConnectionError):
    """Every replica of a group is dead for good: the work in flight is not the units' fault
    and is left for a resume (a ConnectionError: the command's one-line error)."""


class ActorGroup:
    """The replicas of one model entry and the units in flight on them."""

    def __init__(
        self,
        spec: ModelSpec,
        *,
        max_attempts: int = 3,
        fill: float = 2.0,
        min_units: int = 2,
        replicas: int | None = None,
    ) -> None:
        remote = actor_class(ReplicaWorker, spec, MAX_UNITS + 4)  # + cancel and pid calls
        count = spec.replicas if replicas is None else replicas
        # Local paths made absolute once, here where they were checked: an actor on another
        # node starts in that node's working directory.
        on_actors = spec.resolved()
        self.actors = [remote.remote(on_actors, spec.num_cpus) for _ in range(count)]
        self.model = spec.label
        self.max_attempts, self.fill, self.min_units = max_attempts, fill, min_units
        self.waiting: deque[Unit] = deque()
        self.running: dict[Any, tuple[Unit, int]] = {}  # a call's stream -> (unit, replica)
        self.attempts: dict[str, int] = {}
        self.dead: set[int] = set()  # replicas Ray says will not come back

    def __len__(self) -> int:
        """Units waiting or in flight."""
        return len(self.waiting) + len(self.running)

    def submit(self, unit: Unit) -> None:
        self.waiting.append(unit)
        self.dispatch()

    def room(self, unit: Unit) -> bool:
        """Whether some replica would take `unit` now."""
        return any(self._takes(i, unit) for i in range(len(self.actors)))

    def _takes(self, replica: int, unit: Unit) -> bool:
        if replica in self.dead:
            return False
        units = [u for u, i in self.running.values() if i == replica]
        samples = sum(u.samples for u in units)
        if len(units) >= MAX_UNITS:
            return False
        return len(units) < self.min_units or samples + unit.samples <= self.fill * (
            unit.search.max_batch_size
        )

    def dispatch(self) -> None:
        """Hand waiting units to replicas with room, the least loaded first."""
        while self.waiting:
            unit = self.waiting[0]
            free = [i for i in range(len(self.actors)) if self._takes(i, unit)]
            if not free:
                return
            load = {i: sum(u.samples for u, j in self.running.values() if j == i) for i in free}
            replica = min(free, key=lambda i: (load[i], i))
            self.waiting.popleft()
            call = self.actors[replica].run.options(num_returns="streaming")
            self.running[call.remote(unit)] = (unit, replica)

    def cancel(self, key: str) -> bool:
        """Stop a unit: a waiting one is dropped (returns True: no event will come for it); a
        running one yields its rows so far, marked cancelled."""
        for unit in list(self.waiting):
            if unit.key == key:
                self.waiting.remove(unit)
                return True
        for unit, replica in self.running.values():
            if unit.key == key:
                self.actors[replica].cancel.remote(key)
        return False

    def receive(self, stream: Any) -> tuple[Unit, Event] | None:
        """The next output of a ready call (None: it ended)."""
        import ray

        unit, _ = self.running[stream]
        try:
            output = ray.get(next(stream))
        except StopIteration:
            self._ended(stream)
            return None
        except ray.exceptions.RayError as exc:
            self.running.pop(stream, None)
            return unit, self._failed(unit, exc)
        if isinstance(output, Finished):
            self._ended(stream)
        return unit, output

    def _ended(self, stream: Any) -> None:
        self.running.pop(stream, None)
        self.dispatch()

    def _failed(self, unit: Unit, exc: BaseException) -> Failure:
        tries = self.attempts[unit.key] = self.attempts.get(unit.key, 0) + 1
        bad_input = isinstance(getattr(exc, "cause", None), (ValueError, TypeError))
        message = last_line(exc)
        final = bad_input or tries >= self.max_attempts
        if not bad_input:  # before the retry is handed out: not to a replica gone for good
            self._check_replicas(unit.key, message)
        if not final:
            log.warning("%s failed (%s); trying it again", unit.key, message)
            self.waiting.appendleft(unit)
        self.dispatch()
        return Failure(unit.key, tries, message, final)

    def _check_replicas(self, key: str, message: str) -> None:
        """Ask every replica for its pid (a bounded wait: a restarting one reloads its model).
        One that Ray says is dead for good gets no more units, and when every replica is, the
        group raises `ReplicasLost`. One that is only slow to answer (a large model reloading
        on a far node) is still counted on: Ray holds the retry until it is back."""
        import ray

        calls: dict[Any, int] = {}
        for i, actor in enumerate(self.actors):
            if i in self.dead:
                continue
            try:
                calls[actor.pid.remote()] = i
            except Exception as exc:  # Ray itself is gone: nothing can reach this replica
                self.dead.add(i)
                log.warning("replica %d cannot be asked: %s", i, last_line(exc))
        if calls:
            # The bounded wait for a lost replica's restart too, so a retry is not spent on an
            # actor that is still coming back.
            ready, late = ray.wait(list(calls), num_returns=len(calls), timeout=RESTART_WAIT_S)
            for ref in late:
                log.warning("replica %d did not answer in %.0f s", calls[ref], RESTART_WAIT_S)
            for ref in ready:
                try:
                    ray.get(ref)
                except ray.exceptions.ActorDiedError as exc:
                    self.dead.add(calls[ref])
                    log.warning("replica %d is dead: %s", calls[ref], last_line(exc))
                except ray.exceptions.RayError as exc:
                    log.warning("replica %d did not answer: %s", calls[ref], last_line(exc))
        if len(self.dead) == len(self.actors):
            raise ReplicasLost(
                f"every replica of {self.model} is gone ({key}: {message}); its work is left "
                "unfinished: run the command again to resume"
            )

    def pids(self) -> list[int]:
        """Each replica's process id, once it answers (for callers that watch it)."""
        import ray

        return [int(pid) for pid in ray.get([a.pid.remote() for a in self.actors])]

    def kill(self) -> None:
        """End the replicas (their resources go back to Ray); a second call does nothing."""
        import ray

        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors = []


def next_event(
    groups: Iterable[ActorGroup], timeout: float | None = None
) -> tuple[ActorGroup, Unit, Event] | None:
    """The next output of any group's calls, within `timeout` seconds (None: none came, or a
    call ended without one)."""
    import ray

    owner = {stream: g for g in groups for stream in g.running}
    if not owner:
        return None
    ready, _ = ray.wait(list(owner), num_returns=1, timeout=timeout)
    if not ready:
        return None
    group = owner[ready[0]]
    got = group.receive(ready[0])
    return None if got is None else (group, *got)
