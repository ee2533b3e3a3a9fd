"""A model's replicas on Ray and the units in flight on them: the one execution loop under sweeps
and studies.

Each replica is a threaded Ray actor (`ReplicaWorker`) kept with enough units in flight (at
least `min_units`, and samples for `fill` batches) that its engine's batch refills from the next
unit while the last one's slow samples run. Units stream back `Checkpoint`, `Kept`, `Finished`
and the replica's `Progress`. One failure policy: a unit whose own input is bad (a ValueError or
TypeError raised for it) fails at once, alone; one lost with its replica or to another error is
tried again, up to `max_attempts` tries, after every replica is asked whether it is there: one
whose engine thread died is restarted by Ray, one dead for good gets no more units, and when all
are the group raises `ReplicasLost`, leaving the work for a resume.

Each replica runs in a placement group of its own and gets units only once Ray has placed it; a
run none of whose replicas is placed for `Placement.stall_s` seconds stops (`NotPlaced`).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sodaray.errors import last_line
from sodaray.experiment.cluster import Placement, describe, replicas_to_make
from sodaray.experiment.replica import EngineStopped, ReplicaWorker
from sodaray.experiment.spec import ModelSpec
from sodaray.experiment.work import Checkpoint, Finished, Kept, Progress, Unit
from sodaray.search.engine.scheduler import pick_replica

log = logging.getLogger(__name__)

MAX_UNITS = 64  # units in flight on one replica (each holds one of its threads)
RESTART_WAIT_S = 120.0  # a restarted replica reloads its model before it answers
RESTART_POLL_S = 0.5  # between questions to a replica that is restarting
PLACE_SETTLE_S = 5.0  # for a new group's replicas that have room to be placed


@dataclass(frozen=True)
class Failure:
    """A unit's try failed: `final` once it will not be tried again (its input is bad, or it
    has had `attempts` = max_attempts tries)."""

    key: str
    attempts: int
    error: str
    final: bool


# A Progress holds other units' counts too.
Event = Checkpoint | Progress | Kept | Finished | Failure


class ReplicasLost(ConnectionError):
    """Every replica of a group is dead for good: the work in flight is not the units' fault
    and is left for a resume (a ConnectionError: the command's one-line error)."""


class NotPlaced(ReplicasLost):
    """No replica of a run could be placed within the wait: its work is left for a resume."""


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
        placement: Placement | None = None,
    ) -> None:
        import ray
        from ray.util import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy as InGroup

        self.model = spec.label
        self.request = describe(spec.num_cpus, spec.num_gpus)
        self.placement = placement or Placement()
        asked = spec.replicas if replicas is None else replicas
        count = replicas_to_make(*spec.request(), asked, self.placement)
        bundle = {"CPU": spec.num_cpus, **({"GPU": spec.num_gpus} if spec.num_gpus else {})}
        # A placement group per replica: Ray says when it is placed, and keeps it over restarts.
        self.reserved: list[Any] = [placement_group([bundle]) for _ in range(count)]
        remote = ray.remote(ReplicaWorker)
        sent = spec.resolved()  # paths made absolute here, where they were checked
        options = {  # restarted whenever it dies; a failed call is ours to judge, never re-run
            "num_cpus": spec.num_cpus,
            "num_gpus": spec.num_gpus,
            "max_restarts": -1,
            "max_task_retries": 0,
            "max_concurrency": MAX_UNITS + 4,  # + cancel, health
        }
        self.actors = [
            remote.options(**options, scheduling_strategy=InGroup(pg)).remote(sent, spec.num_cpus)
            for pg in self.reserved
        ]
        self.placing: dict[Any, int] = {pg.ready(): i for i, pg in enumerate(self.reserved)}
        self.placed: set[int] = set()
        self.waiting_since = time.monotonic()  # when the group last had no replica to run on
        self.max_attempts, self.fill, self.min_units = max_attempts, fill, min_units
        self.waiting: deque[Unit] = deque()
        self.running: dict[Any, tuple[Unit, int]] = {}  # a call's stream -> (unit, replica)
        self.attempts: dict[str, int] = {}
        self.dead: set[int] = set()  # replicas Ray says will not come back
        # Those with room are placed within moments: the first units then spread over them all.
        self.wait_placed(min(PLACE_SETTLE_S, self.placement.stall_s))

    def __len__(self) -> int:
        """Units waiting or in flight."""
        return len(self.waiting) + len(self.running)

    @property
    def serving(self) -> set[int]:
        """Replicas placed and not dead: those that take units."""
        return self.placed - self.dead

    def submit(self, unit: Unit) -> None:
        self.waiting.append(unit)
        self.dispatch()

    def room(self, unit: Unit) -> bool:
        """Whether some replica would take `unit` now."""
        return any(self._takes(i, unit) for i in range(len(self.actors)))

    def _takes(self, replica: int, unit: Unit) -> bool:
        units = [u for u, i in self.running.values() if i == replica]
        if replica not in self.serving or len(units) >= MAX_UNITS:
            return False
        samples = sum(u.samples for u in units) + unit.samples
        return len(units) < self.min_units or samples <= self.fill * unit.search.max_batch_size

    def dispatch(self) -> None:
        """Hand waiting units to replicas with room, the least loaded first."""
        while self.waiting:
            unit = self.waiting[0]
            free = [i for i in range(len(self.actors)) if self._takes(i, unit)]
            load = {i: sum(u.samples for u, j in self.running.values() if j == i) for i in free}
            replica = pick_replica(load)
            if replica is None:
                return
            self.waiting.popleft()
            call = self.actors[replica].run.options(num_returns="streaming")
            self.running[call.remote(unit)] = (unit, replica)

    def now_placed(self, ref: Any) -> None:
        """A replica's placement group is placed (`ref`, from `placing`): it takes units."""
        replica = self.placing.pop(ref)
        self.placed.add(replica)
        log.info("replica %d of %s placed", replica, self.model)
        self.dispatch()

    def wait_placed(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for the replicas not yet placed (for callers that need
        them before they hand out work; the event loop takes placements as they come)."""
        import ray

        if not self.placing:
            return
        ready, _ = ray.wait(list(self.placing), num_returns=len(self.placing), timeout=timeout)
        for ref in ready:
            self.now_placed(ref)

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
            output = None
        except ray.exceptions.RayError as exc:
            self.running.pop(stream, None)
            return unit, self._failed(unit, exc)
        if output is None or isinstance(output, Finished):  # the call has ended
            self.running.pop(stream, None)
            self.dispatch()
        return None if output is None else (unit, output)

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
        """Ask every placed replica whether it can work, within `RESTART_WAIT_S`. One whose
        engine thread has died is restarted and waited for; one Ray says is dead for good gets
        no more units and gives back its resources, and when every placed replica is, with none
        waiting for room, the group raises `ReplicasLost`. One only slow to answer (reloading)
        is still counted on: Ray holds the retry until it is back."""
        import ray
        from ray.util import remove_placement_group

        restarting = getattr(ray.exceptions, "ActorUnavailableError", ())
        deadline = time.monotonic() + RESTART_WAIT_S
        asking, restarted = set(self.serving), set()
        while asking:
            calls: dict[Any, int] = {}
            for i in sorted(asking):
                try:
                    calls[self.actors[i].health.remote()] = i
                except Exception as exc:  # Ray itself is gone: nothing can reach this replica
                    self.dead.add(i)
                    asking.discard(i)
                    log.warning("replica %d cannot be asked: %s", i, last_line(exc))
            left = max(0.0, deadline - time.monotonic())
            ready, late = ray.wait(list(calls), num_returns=len(calls), timeout=left)
            for ref in late:
                log.warning("replica %d did not answer in %.0f s", calls[ref], RESTART_WAIT_S)
                asking.discard(calls[ref])
            for ref in ready:
                i = calls[ref]
                try:
                    ray.get(ref)
                    asking.discard(i)
                except ray.exceptions.ActorDiedError as exc:
                    self.dead.add(i)
                    asking.discard(i)
                    log.warning("replica %d is dead: %s", i, last_line(exc))
                except ray.exceptions.RayError as exc:
                    if isinstance(getattr(exc, "cause", None), EngineStopped):
                        if i not in restarted:  # a kill takes a moment: it may answer again
                            log.warning("replica %d: %s; restarting it", i, last_line(exc))
                            ray.kill(self.actors[i], no_restart=False)
                            restarted.add(i)
                    elif not isinstance(exc, restarting):
                        log.warning("replica %d did not answer: %s", i, last_line(exc))
                        asking.discard(i)
            if asking and time.monotonic() >= deadline:
                for i in sorted(asking):
                    log.warning("replica %d is not back after %.0f s", i, RESTART_WAIT_S)
                break
            if asking:
                time.sleep(RESTART_POLL_S)
        for i in self.dead & self.placed:
            if self.reserved[i] is not None:  # its resources go to replicas waiting for room
                remove_placement_group(self.reserved[i])
                self.reserved[i] = None
        if not self.serving and not self.placing:
            raise ReplicasLost(
                f"every replica of {self.model} is gone ({key}: {message}); its work is left "
                "unfinished: run the command again to resume"
            )

    def pids(self) -> list[int]:
        """Each placed replica's process id, once it answers."""
        import ray

        calls = [self.actors[i].pid.remote() for i in sorted(self.serving)]
        return [int(pid) for pid in ray.get(calls)]

    def kill(self) -> None:
        """End the replicas and give their resources back to Ray; a second call does nothing."""
        import ray
        from ray.util import remove_placement_group

        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        for reserved in self.reserved:
            if reserved is not None:
                remove_placement_group(reserved)
        self.actors, self.reserved, self.placing = [], [], {}


def _check_placement(groups: list[ActorGroup]) -> float | None:
    """While any group of the run has a replica to run on, the others wait their turn (a model
    whose work is done gives its resources back); when none has, a group that has waited
    longer than its `stall_s` stops the run (`NotPlaced`). Returns the seconds left until the
    first group would, or None."""
    now = time.monotonic()
    live = [g for g in groups if g.actors]
    if any(g.serving for g in live):
        for group in live:
            group.waiting_since = now
        return None
    left = {group: group.placement.stall_s - (now - group.waiting_since) for group in live}
    for group, seconds in left.items():
        if seconds <= 0:
            import ray

            free = ray.available_resources()
            room = ", ".join(f"{free.get(k, 0.0):g} {k}" for k in ("CPU", "GPU"))
            raise NotPlaced(
                f"no replica of {group.model} (each asks {group.request}) could be placed within "
                f"{group.placement.stall_s:g} s: the cluster has {room} free; its work is left "
                "unfinished: free or add resources and run the command again, or give "
                "--wait-for-nodes SECONDS"
            )
    return min(left.values(), default=None)


def next_event(
    groups: Iterable[ActorGroup], timeout: float | None = None
) -> tuple[ActorGroup, Unit, Event] | None:
    """The next output of any group's calls, within `timeout` seconds (None: none came, a
    call ended without one, or a replica was placed). Raises `NotPlaced` when no replica of
    any group has been placed for too long, `ReplicasLost` when work is left and nothing can
    ever take it."""
    import ray

    groups = list(groups)
    owner = {stream: g for g in groups for stream in g.running}
    placing = {ref: g for g in groups for ref in g.placing}
    left = _check_placement(groups)
    if not owner and not placing:
        stuck = [g for g in groups if g.waiting]
        if stuck:
            raise ReplicasLost(
                f"every replica of {stuck[0].model} is gone; its work is left unfinished: run "
                "the command again to resume"
            )
        return None
    timeout = min((t for t in (timeout, left) if t is not None), default=None)
    ready, _ = ray.wait([*owner, *placing], num_returns=1, timeout=timeout)
    if not ready:
        _check_placement(groups)
        return None
    if ready[0] in placing:
        placing[ready[0]].now_placed(ready[0])
        return None
    group = owner[ready[0]]
    got = group.receive(ready[0])
    return None if got is None else (group, *got)
