"""Which run owns a trial: each `tune` run recorded in its study and named in the trials it asks,
and the RUNNING trials of runs known to be over (`experiment.owner`'s judgment) failed and
tried again."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import socket
import time
from collections.abc import Sequence
from typing import Any

from sodaray.tuner.spec import TuningSpec

log = logging.getLogger(__name__)

RUN_ATTR = "sodaray.run:"  # a study's user attribute per run: its driver (RunOwner.record)
TRIAL_RUN_ATTR = "sodaray.run"  # a trial's user attribute: the run that asked it (its key)
INTERRUPTED_ATTR = "interrupted"  # a trial's: why its run stopped it (it is run again)


@dataclasses.dataclass
class RunOwner:
    """A `tune` run's driver as its study records it: one study user attribute per run
    (`RUN_ATTR` + `key`: its driver as a sweep's job lock holds it, and when it was last seen),
    and each trial it asks stamped with `key`. Its RUNNING trials are another run's to fail
    only once it is over (`gone`)."""

    key: str
    record: dict[str, Any]
    salt: int
    refreshed: float = 0.0
    others: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    @classmethod
    def new(cls) -> RunOwner:
        import secrets

        from sodaray.experiment.owner import me

        record = me()
        token = secrets.token_hex(4)  # two runs of one process (tests) are two runs
        return cls(f"{record['host']}:{record['pid']}:{token}", record, int(token, 16) or 1)

    def register(self, study: Any) -> dict[str, dict[str, Any]]:
        """Record this run in `study`; returns the other runs live on it (key -> record)."""
        self._write(study)
        runs = run_records(study).items()
        self.others = {k: r for k, r in runs if k != self.key and self.gone(k, r) is None}
        return self.others

    def refresh(self, study: Any) -> None:
        """The record's `seen` time renewed, at most every `owner.REFRESH_SECONDS`."""
        from sodaray.experiment.owner import REFRESH_SECONDS

        if time.monotonic() - self.refreshed >= REFRESH_SECONDS:
            self._write(study)

    def end(self, study: Any) -> None:
        """The run is over: its record says so (its trials are no one's now)."""
        self.record["ended"] = time.time()
        self._write(study)

    def _write(self, study: Any) -> None:
        self.record["seen"] = time.time()
        study.set_user_attr(RUN_ATTR + self.key, self.record)
        self.refreshed = time.monotonic()

    def gone(self, key: str, record: Any) -> str | None:
        """Why the run `key` (its study record) is over, or None while its driver may live."""
        from sodaray.experiment.owner import owner_gone, record_problem

        if record is None:
            return "it left no record"
        problem = record_problem(record)
        if problem is not None:
            return f"its record is not one sodaray writes: {problem}"
        if record.get("ended"):
            return "it ended"
        if record["pid"] == os.getpid() and record["host"] == socket.gethostname():
            return None if key == self.key else "an earlier run of this process"
        seen = record.get("seen", record.get("since"))
        age = time.time() - seen if isinstance(seen, (int, float)) else math.inf
        return owner_gone(record, age)


def run_records(study: Any) -> dict[str, Any]:
    """The runs recorded in `study` (key -> record), as `RunOwner.register` writes them."""
    attrs = study.user_attrs.items()
    return {name[len(RUN_ATTR) :]: value for name, value in attrs if name.startswith(RUN_ATTR)}


def rescue_trials(
    study: Any, spec: TuningSpec, owner: RunOwner, others: dict[str, Any]
) -> list[int]:
    """Fail the RUNNING trials whose run is over (`RunOwner.gone`), their parameters tried
    again. A trial that names no run (an older sodaray's, or one whose driver died between
    asking it and naming itself) is left alone while another run is live: it may be that
    run's. Two runs rescuing at once fail a trial once. Returns the trials failed."""
    import optuna

    runs = run_records(study)
    stale = []
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        run = t.user_attrs.get(TRIAL_RUN_ATTR)
        if run is None:
            why = None if others else "it names no run"
        elif not isinstance(run, str) or run == owner.key:
            continue
        else:
            why = owner.gone(run, runs.get(run))
        if why is not None:
            log.info("trial %d was left running (its run: %s): failed, tried again", t.number, why)
            stale.append(t)
    return abandon_trials(study, stale, {p.name for p in spec.space})


def abandon_trials(
    study: Any, trials: Sequence[Any], names: set[str], why: str | None = None
) -> list[int]:
    """`trials` failed, marked with `why` (`INTERRUPTED_ATTR`) when given, and their parameters
    (when they hold all of `names`) enqueued to run again; one told already (another run
    failed it first) is left. Returns the numbers of those failed."""
    import optuna

    done = []
    for trial in trials:
        try:
            if why is not None:
                trial.set_user_attr(INTERRUPTED_ATTR, why)
            study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
        except (optuna.exceptions.UpdateFinishedTrialError, RuntimeError, ValueError):
            continue  # told already
        params = dict(trial.params)
        if set(params) >= names:
            study.enqueue_trial(params, skip_if_exists=False)
        done.append(trial.number)
    return done


def ask_trial(study: Any, distributions: dict[str, Any], owner: RunOwner | None = None) -> Any:
    """`study.ask`, the trial stamped with its run (`owner`); a failure (storage, sampler)
    leaves no RUNNING trial behind."""
    import optuna

    before = {t.number for t in study.get_trials(deepcopy=False)}
    try:
        trial = study.ask(distributions)
        if owner is not None:
            trial.set_user_attr(TRIAL_RUN_ATTR, owner.key)
        return trial
    except BaseException:
        running = (optuna.trial.TrialState.RUNNING,)
        for t in study.get_trials(deepcopy=False, states=running):
            if t.number not in before:
                study.tell(t.number, state=optuna.trial.TrialState.FAIL)
        raise
