"""`sodaray tune`: an Optuna study whose trials are units of work on a model's replicas.

The driver asks a trial, hands its samples to the actor group as one unit, reports each
checkpoint, cancels the unit when the pruner says so, and tells Optuna the outcome once the
trial's rows are written; a trial whose replica died runs again in the same trial. Each run ends
only its own trials: stopped by a signal or an error, it fails its running trials, marked
`interrupted`, and enqueues their parameters for the next run.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sodaray.errors import first_line
from sodaray.experiment import stops
from sodaray.experiment.cluster import Cluster, check_address, ray_session
from sodaray.experiment.data import DatasetIdentity, dataset_rows
from sodaray.experiment.group import ActorGroup, Failure, next_event
from sodaray.experiment.owner import describe_owner
from sodaray.experiment.spec import TuningError
from sodaray.experiment.work import Checkpoint, Finished, Kept, Progress, Unit, UnitProgress
from sodaray.io.paths import inside
from sodaray.io.writes import OutputFolder
from sodaray.report.study import PLOTS, save_plots
from sodaray.results import write_table_atomic
from sodaray.tuner import values
from sodaray.tuner.owner import RunOwner, abandon_trials, ask_trial
from sodaray.tuner.spec import OBJECTIVE_PREFIX, TuningSpec
from sodaray.tuner.storage import open_storage, storage_url
from sodaray.tuner.study import best_trial, grid_left, open_study, write_preset

log = logging.getLogger(__name__)

PRESET_FILE = "best_preset.yaml"
MAX_CHECKED_TRIALS = 1000  # trial files checked before a run: the next ones, at most so many


@dataclass
class TrialOutcome:
    number: int
    state: str  # complete | pruned | failed
    value: float | None
    params: dict[str, Any]
    seconds: float = 0.0
    error: str | None = None


@dataclass
class TuneRun:
    study_name: str
    storage: str
    out: Path
    outcomes: list[TrialOutcome] = field(default_factory=list)
    stale_failed: list[int] = field(default_factory=list)
    best_value: float | None = None
    best_params: dict[str, Any] | None = None
    preset_path: Path | None = None
    plots: list[Path] = field(default_factory=list)
    plots_skipped: dict[str, str] = field(default_factory=dict)  # plot name -> why not made
    # A grid study: its points and the trials it had left as this run began (None: not a grid).
    grid: tuple[int, int] | None = None
    asked: int = 0  # the trials this run was asked for
    joined: list[str] = field(default_factory=list)  # other runs live on the study as it opened
    abandoned: list[int] = field(default_factory=list)  # trials failed as it stopped, enqueued
    # OUT, the folder the user gave (default: `out`'s parent): every file the run writes is
    # written below it by the rule for writes, never through a link.
    output: OutputFolder = field(init=False)

    def __post_init__(self) -> None:
        self.output = OutputFolder(self.out.parent)


def run_tuning(
    spec: TuningSpec,
    out: str | Path,
    *,
    trials: int | None = None,
    workers: int = 1,
    storage: str | None = None,
    model: str | None = None,
    cluster: Cluster = Cluster(),
    on_launch: Callable[[int, list[int]], None] | None = None,
    on_trial: Callable[[TrialOutcome], None] | None = None,
    callbacks: Sequence[Callable[[Any, Any], None]] = (),
    on_progress: Callable[[int, UnitProgress], None] | None = None,
) -> TuneRun:
    """Add `trials` (default: the file's) trials to the study on `workers` replicas of the
    model. `on_launch(number, pids)` runs as each trial is handed out; `callbacks` are Optuna's
    `(study, frozen_trial)` callbacks, called after each trial is told; `on_progress(number,
    counts)` with a running trial's counts, about once a second. `cluster`: the Ray to run on,
    each trial's tries, and how long to wait for room there."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, not {workers}")
    check_address(cluster.address)  # fails fast, before the study and the validation data
    n_trials = spec.trials if trials is None else trials
    if n_trials < 1:
        raise ValueError(f"trials must be at least 1, not {n_trials}")
    spec = spec.on_model(model)  # a copy: the caller's spec keeps its model
    study, owner, run = _open_study(spec, OutputFolder(Path(out)), storage, n_trials)
    loop: _Trials | None = None
    try:
        if spec.sampler == "grid":
            run.grid = grid_left(spec, study)
            n_trials = min(n_trials, run.grid[1])
        run.output.check(study_files(run.out, len(study.get_trials(deepcopy=False)), n_trials))
        rows, identity = validation_rows(spec, study, run.out, run.output)
        check_rows_fit(spec, rows)  # before any actor starts: every trial would fail on it
        if n_trials:  # a covered grid runs none: no Ray, no actor
            with study_replicas(spec, workers, cluster) as group:
                loop = _Trials(
                    spec, study, run, rows, identity, group, on_launch, on_progress, owner
                )
                loop.drain(n_trials, on_trial, callbacks)
    except BaseException as exc:
        # Its running trials are this run's to end: failed and enqueued to run again, and its
        # ownership of the study ended; a second signal meanwhile waits, leaving none RUNNING.
        with stops.deferred():
            if loop is not None and loop.live:
                why = f"the run stopped: {first_line(exc)}"
                if isinstance(exc, KeyboardInterrupt):
                    why = f"stopped by {stops.signal_name()}"
                live = [trial for trial, _ in loop.live.values()]
                with contextlib.suppress(Exception):  # the storage may be what failed
                    names = {p.name for p in spec.space}
                    run.abandoned = abandon_trials(study, live, names, why)
            with contextlib.suppress(Exception):
                owner.end(study)
        if isinstance(exc, KeyboardInterrupt):
            raise stops.Interrupted(run) from exc
        raise
    owner.end(study)
    _save_outcome(spec, study, run)
    return run


def _open_study(
    spec: TuningSpec, output: OutputFolder, storage: str | None, n_trials: int
) -> tuple[Any, RunOwner, TuneRun]:
    """The study in its folder under `output`, opened by this run as a new owner, and this
    run's record of it."""
    out = study_folder(output.base, spec)
    url = storage_url(spec, out, storage)
    output.make_folder(out)
    study_name = spec.study_name or spec.name
    # The default journal lies in the study's folder; a storage the user named is theirs.
    journal_out = output if storage is None and spec.storage is None else None
    owner = RunOwner.new()
    study, stale = open_study(spec, url, study_name, open_storage(url, journal_out), owner)
    run = TuneRun(study_name, url, out, stale_failed=stale, asked=n_trials)
    run.output = output
    run.joined = [describe_owner(r) for r in owner.others.values()]
    return study, owner, run


def _save_outcome(spec: TuningSpec, study: Any, run: TuneRun) -> None:
    """The study's best trial as a preset and its plots, in the study's folder."""
    best = best_trial(study)
    if best is not None:
        run.best_value, run.best_params = best.value, dict(best.params)
        run.preset_path = write_preset(spec, best, run.out / PRESET_FILE, run.output)
    label = values.METRIC_LABELS[spec.metric]
    plots = run.out / "plots"
    run.plots, skipped = save_plots(study, plots, label, metric=spec.metric, out=run.output)
    run.plots_skipped = {s.name: s.reason for s in skipped}


@contextlib.contextmanager
def study_replicas(spec: TuningSpec, workers: int, cluster: Cluster) -> Iterator[ActorGroup]:
    """`workers` replicas of the study's model on Ray (`cluster`), each taking a batch's worth
    of trials (or arms) and the next one waiting; ended on the way out (`ray_session`)."""
    with ray_session([spec.model.request()], cluster) as (placement, groups):
        group = ActorGroup(
            spec.model,
            max_attempts=cluster.max_attempts,
            fill=1.0,
            min_units=1,
            replicas=workers,
            placement=placement,
        )
        groups.append(group)  # ended by `ray_session`, however the block ends
        yield group


def study_folder(out: str | Path, spec: TuningSpec) -> Path:
    """Where a study writes: OUT/<name>/."""
    return inside(out, spec.name)


def study_files(folder: Path, first: int, trials: int) -> list[Path]:
    """The files a run of `trials` trials from trial number `first` writes in its study's
    folder, checked before any trial runs (not after the trials' hours)."""
    plots = [folder / "plots" / f"{name}.png" for name in PLOTS]
    shown = range(first, first + min(trials, MAX_CHECKED_TRIALS))
    return [folder / PRESET_FILE, *plots, *(trial_file(folder, n) for n in shown)]


def trial_file(folder: Path, number: int) -> Path:
    return folder / "trials" / f"trial-{number:05d}.parquet"


def validation_rows(
    spec: TuningSpec, study: Any, folder: Path, output: OutputFolder | None = None
) -> tuple[dict[str, list[Any]], DatasetIdentity]:
    """The study's validation rows (built once per model into `folder`, OUT/<name>; `output`:
    OUT, default `folder`'s parent) and the data's identity. The data's hash is recorded in the
    study, and a study whose trials ran on other rows is refused: its values would not compare."""
    rows, identity = dataset_rows(spec.model, spec.data, folder, output)
    recorded = study.user_attrs.get("dataset_hash")
    if identity.hash and isinstance(recorded, str) and recorded != identity.hash:
        raise TuningError(
            f"{spec.path}: the study's trials ran on other data (hash {recorded[:16]}, this "
            f"data's is {identity.hash[:16]}); give this data its own study_name or storage"
        )
    if identity.hash and "dataset_hash" not in study.user_attrs:
        study.set_user_attr("dataset_hash", identity.hash)
    return rows, identity


def check_rows_fit(spec: TuningSpec, rows: dict[str, list[Any]]) -> None:
    """The validation inputs and the observed outputs (a tuned `output_tokens` at its largest)
    fit the model's context, where its local config says it: one line naming the file."""
    from sodaray.experiment.context import check_fits

    longest = max(rows["length"], default=0)
    outputs = [spec.objective_for({}).output_tokens]
    for param in spec.space:
        if param.name == f"{OBJECTIVE_PREFIX}output_tokens":
            outputs += [v for v in (param.high, *(param.choices or [])) if isinstance(v, int)]
    what = f"{spec.path}: data has inputs of length {longest}"
    check_fits(spec.model, longest, max(outputs), TuningError, what)


def study_unit(
    spec: TuningSpec,
    params: dict[str, Any],
    rows: dict[str, list[Any]],
    identity: DatasetIdentity,
    *,
    job: str,
    sweep: str,
    data: str | None = None,
    checkpoints: tuple[int, ...] = (),
) -> Unit:
    """`rows` (of `data`, default the study's) to search at `params`, as the unit `job` of
    `sweep` (the context its result rows carry)."""
    context = identity.context(spec.data.name if data is None else data, sweep, job)
    search, objective = spec.config(params), spec.objective_for(params)
    return Unit(
        key=job,
        rows=rows,
        search=search,
        objective=objective,
        checkpoints=checkpoints,
        context=context,
    )


def saved_steps(unit: Unit, table: Any, spent: int, cancelled: bool) -> int:
    """The sample-steps a cancel saved a trial at most: what its samples could have taken
    (unfinished ones their whole budget) beyond what it spent; 0 for one not cancelled."""
    if not cancelled:
        return 0
    taken = sum(int(x) for x in table.column("steps").to_pylist())
    most = taken + (unit.samples - table.num_rows) * unit.search.step_budget()
    return max(0, most - spent)


@dataclass
class _Trials:
    """One run's trials: asked from the study while a replica has room for one, reported at
    their checkpoints, told when their rows come back."""

    spec: TuningSpec
    study: Any
    run: TuneRun
    rows: dict[str, list[Any]]
    identity: DatasetIdentity
    group: ActorGroup
    on_launch: Callable[[int, list[int]], None] | None = None
    on_progress: Callable[[int, UnitProgress], None] | None = None
    owner: RunOwner = field(default_factory=RunOwner.new)
    live: dict[str, tuple[Any, float]] = field(default_factory=dict)  # key -> (trial, started)
    reported: dict[str, set[int]] = field(default_factory=dict)
    signals: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)  # key -> step
    pruned: set[str] = field(default_factory=set)
    distributions: dict[str, Any] = field(init=False)  # the space's, made once per run

    def __post_init__(self) -> None:
        self.distributions = self.spec.distributions()

    def drain(
        self,
        n_trials: int,
        on_trial: Callable[[TrialOutcome], None] | None,
        callbacks: Sequence[Callable[[Any, Any], None]],
    ) -> None:
        launched = 0
        while launched < n_trials or self.live:
            self.owner.refresh(self.study)  # other runs on the study see this one live
            while launched < n_trials and self.group.room(self.unit(None)):
                self.launch()
                launched += 1
            event = next_event([self.group])
            outcome = None if event is None else self.receive(event[1], event[2])
            if outcome is None:
                continue
            self.run.outcomes.append(outcome)
            for callback in callbacks:
                callback(self.study, self.study.get_trials(deepcopy=False)[outcome.number])
            if on_trial is not None:
                on_trial(outcome)

    def unit(self, trial: Any) -> Unit:
        """A trial's samples as a unit (`trial` None: a stand-in to size one)."""
        spec, number = self.spec, -1 if trial is None else trial.number
        params = {} if trial is None else trial.params
        steps = values.checkpoint_steps(spec.max_steps, spec.checkpoints)
        sweep, job = f"tune:{spec.name}", f"trial-{number:05d}"
        return study_unit(
            spec, params, self.rows, self.identity, job=job, sweep=sweep, checkpoints=steps
        )

    def launch(self) -> None:
        import optuna

        trial = ask_trial(self.study, self.distributions, self.owner)
        try:
            unit = self.unit(trial)
            self.group.submit(unit)
        except BaseException:  # never leave it RUNNING with nobody working on it
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            raise
        self.live[unit.key] = (trial, time.perf_counter())
        self.reported[unit.key] = set()
        if self.on_launch is not None:
            self.on_launch(trial.number, self.group.pids())

    def receive(self, unit: Unit, output: Any) -> TrialOutcome | None:
        """A checkpoint (reported; cancelled if the pruner says so), or a trial's end: its rows
        written, its attributes set, then told in its own state."""
        import optuna

        if isinstance(output, Progress):  # every trial's on its replica, on one trial's stream
            for counts in output.units:
                live = self.live.get(counts.key)  # one that ended meanwhile is not running
                if live is not None and self.on_progress is not None:
                    self.on_progress(live[0].number, counts)
            return None
        if isinstance(output, Kept):  # a trial's rows are written whole, at its end
            return None
        trial, started = self.live[unit.key]
        if isinstance(output, Checkpoint):
            if output.step not in self.reported[unit.key]:  # a retried trial reports again
                self.reported[unit.key].add(output.step)
                got = (output.exact, output.total, output.losses, output.shares)
                reports = {name: values.checkpoint_value(name, *got) for name in values.SIGNALS}
                # Every signal's value, for a reader choosing one (`benchmarks/bench_prune.py`).
                signals = self.signals.setdefault(unit.key, {})
                signals[str(output.step)] = reports
                trial.set_user_attr("signals", signals)
                trial.report(reports[self.spec.signal], output.step)
                if unit.key not in self.pruned and trial.should_prune():
                    self.pruned.add(unit.key)
                    self.group.cancel(unit.key)
            return None
        seconds = time.perf_counter() - started
        if isinstance(output, Failure) and not output.final:
            return None  # tried again by the group, in this trial
        del self.live[unit.key]
        self.signals.pop(unit.key, None)  # its values were set on the trial as they came
        if isinstance(output, Failure):
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            log.warning("trial %d failed (%s)", trial.number, output.error)
            return TrialOutcome(trial.number, "failed", None, trial.params, seconds, output.error)
        assert isinstance(output, Finished)
        table = output.table
        path = trial_file(self.run.out, trial.number)
        write_table_atomic(table, path, self.run.output)
        exact = sum(bool(x) for x in table.column("exact").to_pylist())
        losses = table.column("final_loss").to_pylist()
        value = values.trial_value(self.spec.metric, exact, unit.samples, output.seconds, losses)
        # Set before `tell` (a finished trial is frozen): what the dashboard shows of each trial.
        for name, attr in (
            ("result_file", str(path)),
            ("exact", exact),
            ("total", table.num_rows),  # a pruned trial's: the samples that finished
            ("samples", unit.samples),  # the samples it was given
            ("seconds", round(float(output.seconds), 3)),
            ("sample_steps", output.sample_steps),  # what it spent, a pruned one's too
            ("saved_steps", saved_steps(unit, table, output.sample_steps, output.cancelled)),
        ):
            trial.set_user_attr(name, attr)
        if unit.key in self.pruned:
            self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            note = f"pruned at step {max(self.reported[unit.key])}"
            return TrialOutcome(trial.number, "pruned", value, trial.params, seconds, note)
        self.study.tell(trial, value)
        return TrialOutcome(trial.number, "complete", value, trial.params, seconds)
