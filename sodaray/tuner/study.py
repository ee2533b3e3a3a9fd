"""`sodaray tune`: an Optuna study whose trials run on Ray actors that keep their model loaded.

The driver asks Optuna for a trial (ask/tell), hands its parameters to an idle actor, and tells
Optuna the result. The actor reports the solved fraction at step checkpoints to the study's
storage itself and stops a trial the pruner gives up on; it reaches the storage through Optuna's
gRPC storage proxy, which the driver serves, so an actor on any node needs neither the journal's
path nor the database's address and credentials. A trial whose actor dies is marked
failed and its parameters are enqueued again; trials left RUNNING by a driver that died are
marked failed (and retried) when the study is resumed.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sodaray.experiment.cluster import actor_class, check_address, ray_session
from sodaray.experiment.data import DatasetIdentity, dataset_identity, dataset_table, select_rows
from sodaray.objectives import Objective
from sodaray.results import write_table_atomic
from sodaray.search.base import SearchConfig
from sodaray.tuner.spec import TuningSpec
from sodaray.validation import first_line, last_line

log = logging.getLogger(__name__)


def storage_url(spec: TuningSpec, out: Path, override: str | None = None) -> str:
    """An RDB URL as given, else a journal file (default: OUT/<name>/study.journal)."""
    url = override or spec.storage
    if url is None:
        return str(out / "study.journal")
    return url


def open_storage(url: str):
    """Optuna storage for a URL: RDB (`postgresql://`, `sqlite:///`, ...) or a journal file."""
    if "://" in url:
        _check_rdb_url(url)
        return url  # Optuna's RDB storage takes the URL itself
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    Path(url).parent.mkdir(parents=True, exist_ok=True)
    return JournalStorage(JournalFileBackend(url))


@dataclass(frozen=True)
class StorageProxy:
    """Where trial actors reach the study's storage: Optuna's gRPC storage proxy that the driver
    serves (`serve_storage`). Actors on other nodes cannot open the driver's journal file (a
    path on the driver's disk), and a database would need its address and credentials on every
    node; the proxy needs neither."""

    host: str
    port: int

    def connect(self) -> Any:
        import warnings

        import optuna
        from optuna.storages import GrpcStorageProxy

        with warnings.catch_warnings():  # experimental in Optuna 4-5: not the user's concern
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return GrpcStorageProxy(host=self.host, port=self.port)


def serve_storage(storage: Any, host: str, tries: int = 5) -> tuple[Any, StorageProxy]:
    """Serve `storage` (the driver's own storage object, so the driver and the actors see one
    state) through Optuna's gRPC storage proxy on `host` and a free port, in gRPC's background
    threads. Returns the server (`server.stop(grace)` ends it) and its address.

    Built with the `make_server` that `optuna.storages.run_grpc_proxy_server` wraps: that
    function blocks until the server terminates and offers no way to stop it, which would leave
    a server per run in a process that tunes more than once (tests, notebooks)."""
    import socket

    from optuna.storages._grpc.server import make_server

    for attempt in range(tries):
        with socket.socket() as probe:  # a port free now; taken by another process is retried
            probe.bind((host, 0))
            port = probe.getsockname()[1]
        try:
            server = make_server(storage, host, port)
        except RuntimeError:  # gRPC could not bind it after all
            if attempt == tries - 1:
                raise
            continue
        server.start()
        log.info("study storage served at %s:%d (Optuna's gRPC proxy)", host, port)
        return server, StorageProxy(host, port)
    raise AssertionError("unreachable")


def _check_rdb_url(url: str) -> None:
    """An RDB URL whose database kind SQLAlchemy knows (the connection is tried later)."""
    try:
        from sqlalchemy.engine import make_url

        make_url(url).get_dialect()
    except ImportError as exc:
        raise ValueError(f"storage {url}: {exc} (install the database driver)") from exc
    except Exception as exc:  # SQLAlchemy's ArgumentError, NoSuchModuleError
        raise ValueError(
            f"storage {url}: {first_line(exc)} (an Optuna RDB URL: sqlite:///study.db, "
            "postgresql://user@host/db, ...)"
        ) from exc


def make_sampler(spec: TuningSpec, trials_so_far: int = 0):
    """The study's sampler, seeded from (seed, trials so far): a resumed study proposes new
    points instead of replaying the first run's (a new study keeps the file's seed)."""
    import numpy as np
    import optuna

    seed = spec.seed
    if trials_so_far:
        seed = int(np.random.SeedSequence([spec.seed, trials_so_far]).generate_state(1)[0])
    if spec.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if spec.sampler == "grid":
        space = {p.name: p.grid_values() for p in spec.space}
        return optuna.samplers.GridSampler(space, seed=seed)
    if spec.sampler == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


SPEC_HASH_ATTR = "sodaray.spec_hash"


def spec_hash(spec: TuningSpec) -> str:
    """What makes trials comparable: model, data, algorithm, objective, fixed values, space,
    steps, metric, checkpoints and seed (not trials, sampler, pruner or storage)."""
    from sodaray.results import config_hash

    preset = {"preset": [spec.model.preset, spec.model.preset_file]}
    return config_hash(
        {
            # Named only when given, so files without a preset keep their studies' hashes.
            **(preset if spec.model.preset or spec.model.preset_file else {}),
            "model": spec.model.identity(),
            "data": dataclasses.asdict(spec.data),
            "algorithm": spec.algorithm,
            "objective": spec.objective,
            "fixed": spec.fixed,
            "space": [dataclasses.asdict(p) for p in spec.space],
            "steps": spec.max_steps,  # the key older studies' hashes were made with
            "metric": spec.metric,
            "checkpoints": spec.checkpoints,
            "seed": spec.seed,
        }
    )


def open_study(
    spec: TuningSpec, url: str, study_name: str, storage: Any = None
) -> tuple[Any, list[int]]:
    """Create or resume the study in `storage` (default: `open_storage(url)`): refuse one made by
    a different tuning file, re-seed the sampler from the trials so far, and fail (then retry)
    trials a dead driver left RUNNING. Returns the study and the numbers of those stale trials."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        study_name=study_name,
        storage=open_storage(url) if storage is None else storage,
        sampler=make_sampler(spec),
        pruner=make_pruner(spec),
        direction="maximize",
        load_if_exists=True,
    )
    key = spec_hash(spec)
    recorded = study.user_attrs.get(SPEC_HASH_ATTR)
    if recorded is None:
        study.set_user_attr(SPEC_HASH_ATTR, key)
        # What the study is, for optuna-dashboard and `optuna studies` (the hash is for us).
        for name, value in study_attrs(spec).items():
            study.set_user_attr(name, value)
    elif recorded != key:
        raise ValueError(
            f"study {study_name!r} in {url} was made by another tuning file (model, data, "
            "algorithm, objective, space, steps, metric or seed differ); give this one its own "
            "study_name or storage"
        )
    trials = study.get_trials(deepcopy=False)
    if trials:
        study.sampler = make_sampler(spec, len(trials))
    if not trials and spec.start_params():  # a new study opens with the given preset
        study.enqueue_trial(spec.start_params())
    # Trials a dead driver left RUNNING: failed, and their parameters tried again (when it got
    # as far as sampling them all).
    stale = []
    names = {p.name for p in spec.space}
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        study.tell(t.number, state=optuna.trial.TrialState.FAIL)
        if set(t.params) >= names:
            study.enqueue_trial(t.params, skip_if_exists=False)
        stale.append(t.number)
    return study, stale


def ask_trial(study: Any, distributions: dict[str, Any]) -> Any:
    """`study.ask`, but a failure (storage, sampler) leaves no RUNNING trial behind."""
    import optuna

    before = {t.number for t in study.get_trials(deepcopy=False)}
    try:
        return study.ask(distributions)
    except BaseException:
        running = (optuna.trial.TrialState.RUNNING,)
        for t in study.get_trials(deepcopy=False, states=running):
            if t.number not in before:
                study.tell(t.number, state=optuna.trial.TrialState.FAIL)
        raise


def make_pruner(spec: TuningSpec):
    import optuna

    if spec.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=0)
    if spec.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner()
    return optuna.pruners.NopPruner()


# ---- the worker --------------------------------------------------------------------------------
class TrialWorker:
    """One model replica and the validation targets, both built once and reused by every trial."""

    def __init__(
        self,
        spec: TuningSpec,
        study_name: str,
        storage: StorageProxy,
        rows: dict[str, list[Any]],
        dataset: DatasetIdentity,
    ) -> None:
        from sodaray.experiment.replica import load_replica
        from sodaray.targets import make_targets

        self.spec, self.study_name, self.storage = spec, study_name, storage
        self.dataset = dataset  # the data's identity, for the rows
        self.model = load_replica(spec.model, spec.model.num_cpus)
        self.rows = rows
        self.targets = make_targets(self.model, rows["tokens"], objective=spec.objective_for({}))
        self.targets.sample_ids = list(rows["sample_id"])
        self._study = None

    def pid(self) -> int:
        import os

        return os.getpid()

    def study(self):
        import optuna

        if self._study is None:
            # The study's own pruner: `should_prune` asks the study this actor loads.
            self._study = optuna.load_study(
                study_name=self.study_name,
                storage=self.storage.connect(),
                pruner=make_pruner(self.spec),
            )
        return self._study

    def run_trial(self, number: int, config: SearchConfig, objective: Objective) -> TrialResult:
        import optuna

        from sodaray.api import invert
        from sodaray.experiment.replica import replica_rows

        study = self.study()
        trial_id = study._storage.get_trial_id_from_study_id_trial_number(study._study_id, number)
        trial = optuna.trial.Trial(study, trial_id)
        total = len(self.targets)
        checkpoints = self.spec.checkpoints
        steps = config.max_steps
        lengths = sorted(set(len(t) for t in self.rows["tokens"]))
        finished: list[Any] = []
        reported: set[int] = set()
        start = time.perf_counter()

        def on_step(length: int, step: int) -> None:
            # Report index: (which length, which checkpoint within it); the value, solved so
            # far over the whole set, is comparable across trials at the same index.
            group = lengths.index(length)
            for j in range(checkpoints):
                index = group * checkpoints + j
                if index in reported or step < (j + 1) * steps / checkpoints:
                    continue
                reported.add(index)
                exact = sum(bool(r.exact) for r in finished)
                trial.report(exact / total, index)
                if trial.should_prune():
                    raise optuna.TrialPruned(f"pruned at length {length}, step {step}")

        # Tunable objective knobs change the loss only, so the built targets are reused.
        targets = dataclasses.replace(self.targets, objective=objective)
        state, error = "complete", None
        try:
            invert(
                self.model,
                targets,
                config,
                on_result=finished.append,
                on_step=on_step,
            )
        except optuna.TrialPruned as exc:
            state, error = "pruned", str(exc)
        seconds = time.perf_counter() - start
        exact = sum(bool(r.exact) for r in finished)
        value = trial_value(
            self.spec.metric, exact, total, seconds, [r.final_loss for r in finished]
        )
        index = {sid: i for i, sid in enumerate(self.rows["sample_id"])}
        picked = [index[r.sample_id] for r in finished]
        table = replica_rows(
            self.model,
            self.spec.model,
            finished,
            objective,
            self.rows,
            picked,
            dataset=self.spec.data.name,
            sweep=f"tune:{self.spec.name}",
            job=f"trial-{number:05d}",
            **self.dataset.context(),
        )
        return TrialResult(state, value, exact, total, seconds, table, error)


@dataclass(frozen=True)
class TrialResult:
    state: str  # "complete" or "pruned"
    value: float
    exact: int
    total: int
    seconds: float
    table: Any  # the trial's result rows (a pyarrow Table)
    note: str | None


def trial_value(metric: str, exact: int, total: int, seconds: float, losses: list[float]) -> float:
    """A trial's objective value (maximised).

    `exact`: the exact rate. `exact_per_second`: exact inversions per second of search.
    `exact_then_loss`: the exact rate, ties broken by the mean final relaxed loss: the loss term
    is below one sample's worth of exact rate, so it only ranks trials that solve equally many
    (useful where a budget solves almost nothing and exact alone gives the sampler no signal).
    """
    if metric == "exact_per_second":
        return exact / max(seconds, 1e-9)
    rate = exact / total
    if metric == "exact_then_loss":
        finite = [x for x in losses if math.isfinite(x)]
        mean = sum(finite) / len(finite) if finite else math.inf
        closeness = 1.0 - math.tanh(mean) if math.isfinite(mean) else 0.0  # in [0, 1]
        return rate + closeness / (total + 1)
    return rate


# ---- the driver --------------------------------------------------------------------------------
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


def run_tuning(
    spec: TuningSpec,
    out: str | Path,
    *,
    trials: int | None = None,
    workers: int = 1,
    storage: str | None = None,
    model: str | None = None,
    address: str | None = None,
    max_attempts: int = 3,
    on_launch: Callable[[int, int], None] | None = None,
    on_trial: Callable[[TrialOutcome], None] | None = None,
    callbacks: Sequence[Callable[[Any, Any], None]] = (),
) -> TuneRun:
    """Add `trials` (default: the file's) trials to the study, `workers` at a time. `callbacks`
    are Optuna's `(study, frozen_trial)` callbacks (as `study.optimize` takes), called after each
    trial is told (e.g. `sodaray.tracking.tuning_callback`)."""
    import optuna
    import ray

    if workers < 1:
        raise ValueError(f"workers must be at least 1, not {workers}")
    check_address(address)  # fails fast, before the study and the validation data
    n_trials = spec.trials if trials is None else trials
    if n_trials < 1:
        raise ValueError(f"trials must be at least 1, not {n_trials}")
    if model is not None:  # a copy: the caller's spec keeps its model
        spec = dataclasses.replace(spec, model=spec.model.with_id(model))
    out = Path(out) / spec.name
    url = storage_url(spec, out, storage)
    out.mkdir(parents=True, exist_ok=True)
    study_name = spec.study_name or spec.name
    # One storage object for the driver and the proxy that serves the actors: one state.
    store = optuna.storages.get_storage(open_storage(url))
    study, stale = open_study(spec, url, study_name, store)
    run = TuneRun(study_name, url, out, stale_failed=stale)
    rows, identity = validation_rows(spec, study, out)
    with ray_session([spec.model.request()], address) as own_ray:
        # Actors reach the study through the proxy on this (the driver's) node: on Ray's
        # address for it, which every node reaches, unless Ray is our own local one.
        host = "127.0.0.1" if own_ray and address is None else ray.util.get_node_ip_address()
        server, proxy = serve_storage(store, host)
        # A dead worker's trial is failed and re-enqueued by the driver, not re-run by Ray.
        remote = actor_class(TrialWorker, spec.model, 0)
        loop = _Trials(spec, study, run, n_trials, max_attempts, on_launch)
        try:
            # Local paths made absolute here, where they were checked (`TuningSpec.resolved`).
            on_actors = spec.resolved()
            for _ in range(workers):
                loop.actors.append(remote.remote(on_actors, study_name, proxy, rows, identity))
            loop.drain(on_trial, callbacks)
        finally:
            for actor in loop.actors:
                ray.kill(actor, no_restart=True)
            server.stop(grace=None)

    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if complete:
        best = max(complete, key=lambda t: t.value)
        run.best_value, run.best_params = best.value, dict(best.params)
        run.preset_path = write_preset(spec, best, out / "best_preset.yaml")
    run.plots = save_plots(study, out / "plots")
    return run


def validation_rows(
    spec: TuningSpec, study: Any, out: Path
) -> tuple[dict[str, list[Any]], DatasetIdentity]:
    """The study's validation rows (built once per model into OUT/<name>/.sodaray/datasets/)
    and the data's identity; the data's hash is recorded in the study."""
    if any((out / "datasets").glob("*.parquet")):
        # Not refused: the study resumes as it was; only readers other than sodaray's trip.
        log.warning(
            "%s holds dataset copies from an older sodaray (now built into %s); delete it so "
            "that Parquet readers of %s see result rows only",
            out / "datasets",
            out / ".sodaray" / "datasets",
            out,
        )
    table = dataset_table(spec.model, spec.data, out)
    identity = dataset_identity(table)
    if identity.hash and "dataset_hash" not in study.user_attrs:
        # The rows the trials ran on: the data spec names a build, the hash its result.
        study.set_user_attr("dataset_hash", identity.hash)
    return select_rows(table, None, None), identity


class _Trials:
    """One run's trials: asked from the study, handed to idle actors, told when they return; a
    trial whose actor died is failed and its parameters enqueued again (`max_attempts` tries)."""

    def __init__(
        self,
        spec: TuningSpec,
        study: Any,
        run: TuneRun,
        n_trials: int,
        max_attempts: int,
        on_launch: Callable[[int, int], None] | None,
    ) -> None:
        self.spec, self.study, self.run = spec, study, run
        self.n_trials, self.max_attempts, self.on_launch = n_trials, max_attempts, on_launch
        self.distributions = spec.distributions()
        self.actors: list[Any] = []
        self.attempts: dict[str, int] = {}
        self.in_flight: dict[Any, tuple[int, int, dict[str, Any], float]] = {}
        self.launched = 0

    def drain(
        self,
        on_trial: Callable[[TrialOutcome], None] | None,
        callbacks: Sequence[Callable[[Any, Any], None]],
    ) -> None:
        import ray

        for slot in range(min(len(self.actors), self.n_trials)):
            self.launch(slot)
        while self.in_flight:
            ready, _ = ray.wait(list(self.in_flight), num_returns=1)
            slot, outcome = self.receive(ready[0])
            self.run.outcomes.append(outcome)
            for callback in callbacks:
                callback(self.study, self.study.get_trials(deepcopy=False)[outcome.number])
            if on_trial is not None:
                on_trial(outcome)
            if self.launched < self.n_trials:
                self.launch(slot)

    def launch(self, slot: int) -> None:
        import optuna

        trial = ask_trial(self.study, self.distributions)
        self.launched += 1
        try:
            config = self.spec.config(trial.params)
            # Wait until the worker answers (after a crash Ray is restarting it); its pid is
            # for callers that watch (or, in tests, kill) it.
            pid = wait_ready(self.actors[slot])
            objective = self.spec.objective_for(trial.params)
            ref = self.actors[slot].run_trial.remote(trial.number, config, objective)
        except BaseException:  # never leave it RUNNING with nobody working on it
            self.study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
            raise
        self.in_flight[ref] = (slot, trial.number, trial.params, time.perf_counter())
        if self.on_launch is not None:
            self.on_launch(trial.number, pid)

    def receive(self, ref: Any) -> tuple[int, TrialOutcome]:
        """A returned trial, told to the study (its rows written first); its actor's slot."""
        import optuna
        import ray

        slot, number, params, started = self.in_flight.pop(ref)
        try:
            result = ray.get(ref)
        except ray.exceptions.RayError as exc:
            message = last_line(exc)
            self.study.tell(number, state=optuna.trial.TrialState.FAIL)
            key = repr(sorted(params.items()))
            self.attempts[key] = self.attempts.get(key, 0) + 1
            if self.attempts[key] < self.max_attempts:
                self.study.enqueue_trial(params, skip_if_exists=False)
                self.launched -= 1  # the retry replaces it
            log.warning("trial %d failed (%s)", number, message)
            seconds = time.perf_counter() - started
            return slot, TrialOutcome(number, "failed", None, params, seconds, message)
        trial_file = self.run.out / "trials" / f"trial-{number:05d}.parquet"
        write_table_atomic(result.table, trial_file)
        set_trial_attrs(self.study, number, result, trial_file)
        if result.state == "pruned":
            self.study.tell(number, state=optuna.trial.TrialState.PRUNED)
        else:
            self.study.tell(number, result.value)
        outcome = TrialOutcome(
            number, result.state, result.value, params, result.seconds, result.note
        )
        return slot, outcome


def study_attrs(spec: TuningSpec) -> dict[str, Any]:
    """The study's user attributes: the model, data, algorithm, steps and fixed parameters
    (`run_tuning` adds `dataset_hash` once the data is built)."""
    return {
        "model": spec.model.id,
        "dataset": spec.data.name,
        "algorithm": spec.algorithm,
        "max_steps": spec.max_steps,
        "fixed": json.loads(json.dumps(spec.fixed, default=str)),  # JSON-safe for every storage
    }


def set_trial_attrs(study: Any, number: int, result: TrialResult, trial_file: Path) -> None:
    """A finished trial's result file and counts, set before `tell` (a finished trial is frozen),
    so the dashboard and `optuna trials` show what each trial did."""
    table = result.table
    exact = table.column("exact").to_pylist() if "exact" in table.column_names else []
    trial_id = study._storage.get_trial_id_from_study_id_trial_number(study._study_id, number)
    attrs = {
        "result_file": str(trial_file),
        "exact": int(sum(bool(x) for x in exact)),
        "total": table.num_rows,
        "seconds": round(float(result.seconds), 3),
    }
    for name, value in attrs.items():
        study._storage.set_trial_user_attr(trial_id, name, value)


def wait_ready(actor: Any, timeout: float = 600.0) -> int:
    """The actor's pid once it answers; retries while Ray restarts it."""
    import ray

    deadline = time.monotonic() + timeout
    delay = 0.2
    while True:
        try:
            return int(ray.get(actor.pid.remote()))
        except ray.exceptions.ActorUnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(2 * delay, 5.0)


def write_preset(spec: TuningSpec, best, path: Path) -> Path:
    """The best parameters as a preset YAML (`sodaray invert --preset-file`, sweeps'
    `preset_file:`)."""
    # The trial's whole config (the model's preset, `fixed`, the sampled values), so the file
    # reproduces the trial on its own; budget and batching stay the caller's.
    budget = ("max_steps", "seed", "max_batch_size", "max_seconds")
    params = {k: v for k, v in spec.config(best.params).to_dict().items() if k not in budget}
    doc = {
        "soda" if spec.algorithm == "soda" else "params": params,
        "note": (
            f"tuned by `sodaray tune {spec.path}`: trial {best.number}, {spec.metric} "
            f"{best.value:.4f} on {spec.data.name} with {spec.max_steps} steps per sample"
        ),
        "model": spec.model.id,
    }
    objective = {k: v for k, v in best.params.items() if k.startswith("objective.")}
    if objective:  # not SODA parameters: kept apart so the file loads as a preset
        doc["objective"] = {k.removeprefix("objective."): v for k, v in objective.items()}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def save_plots(study, folder: Path) -> list[Path]:
    """Optuna's history, importance and parallel-coordinate plots as PNG (matplotlib)."""
    import warnings

    import optuna

    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if len(done) < 2:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as ovm

    folder.mkdir(parents=True, exist_ok=True)
    made = []
    plots = {
        "history": ovm.plot_optimization_history,
        "importances": ovm.plot_param_importances,
        "parallel_coordinate": ovm.plot_parallel_coordinate,
    }
    for name, plot in plots.items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ax = plot(study)
            fig = ax.figure if hasattr(ax, "figure") else ax.flat[0].figure
            fig.set_size_inches(8, 5)
            fig.tight_layout()
            fig.savefig(folder / f"{name}.png", dpi=110)
            plt.close(fig)
            made.append(folder / f"{name}.png")
        except (ValueError, RuntimeError, ImportError) as exc:  # e.g. too few distinct values
            log.info("plot %s skipped: %s", name, exc)
    return made
