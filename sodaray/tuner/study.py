"""The study side of `sodaray tune`: its storage, sampler and pruner, opening or resuming it, a
trial's value, and what a study leaves behind (the best preset, its plots). Only the driver
opens the storage, through Optuna's public API: any storage Optuna takes (a journal file,
SQLite, PostgreSQL or MySQL) works on a cluster, and no storage port is served."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import socket
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from sodaray.errors import first_line
from sodaray.experiment.waits import CHECK_SECONDS
from sodaray.io.files import check_sqlite_url, parse_json, what_is
from sodaray.io.paths import brief
from sodaray.io.writes import (
    LINK,
    UnsafeWrite,
    move_file,
    prepare_file,
    remove_file,
    what_is_at,
    write_file,
)
from sodaray.objective.objectives import PRESET_FIELDS, Objective
from sodaray.tuner.spec import TuningSpec

log = logging.getLogger(__name__)


def storage_url(spec: TuningSpec, out: Path, override: str | None = None) -> str:
    """An RDB URL as given (`override`, else the file's), else a journal file
    (OUT/<name>/study.journal). An empty one is refused: it is an unset variable
    (`--storage "$DB"`), and the local journal in its place put a cluster's study on one
    node's disk."""
    url = spec.storage if override is None else override
    if url is None:
        return str(out / "study.journal")
    if not url.strip():
        where = "--storage" if override is not None else f"{spec.path}: storage"
        raise ValueError(
            f"{where} is empty (an unset variable?): give an Optuna storage URL or a journal "
            "file, or leave it out for OUT/<name>/study.journal"
        )
    return url


def check_storage(spec: TuningSpec, out: str | Path, override: str | None = None) -> None:
    """The study's storage as given (`storage_url`), before anything runs: not empty, and an
    RDB URL of a kind SQLAlchemy knows whose driver is installed."""
    url = storage_url(spec, Path(out), override)
    if "://" in url:
        _check_rdb_url(url)


def open_storage(url: str, base: Path | None = None):
    """Optuna storage for a URL: RDB (`postgresql://`, `sqlite:///`, ...) or a journal file.
    Optuna opens a journal by name itself, so it is checked by the rule for every file
    sodaray writes first (`writes`): its folders below `base` (the folder the user gave;
    default: the journal's own) made and none a link, the journal a regular file (made empty
    when missing) whose lines are within bounds (`check_journal`), and its lock nothing or
    the link Optuna makes (`check_journal_lock`: anything else moved aside, a stale link
    broken, so that opening waits at most about `CHECK_SECONDS`)."""
    if "://" in url:
        _check_rdb_url(url)
        return url  # Optuna's RDB storage takes the URL itself
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock

    journal = Path(url)
    base = journal.parent if base is None else base
    kind = what_is(url)  # opening a FIFO to append to it waits for a reader for ever
    if kind not in (None, "a regular file"):
        raise ValueError(f"{url} is {kind}, not a study journal")
    prepare_file(base, journal)  # by the rule: no link below `base`, nor at the journal
    if kind is not None:
        check_journal(url)
    check_journal_lock(journal, base)
    # A lock not refreshed for `CHECK_SECONDS` is broken (Optuna's default: 30 s).
    lock = JournalFileSymlinkLock(url, grace_period=int(CHECK_SECONDS))
    with unreadable_storage(url):  # JournalStorage replays the journal as it opens it
        return JournalStorage(JournalFileBackend(url, lock_obj=lock))


@contextlib.contextmanager
def unreadable_storage(url: str) -> Iterator[None]:
    """Optuna replays a journal's entries unchecked: one it did not write (an `op_code` of
    another version, an entry without its fields) fails deep inside it, as the storage opens
    or as a study is made in it. One line instead."""
    try:
        yield
    except (KeyError, TypeError, IndexError, AssertionError, UnicodeError) as exc:
        raise ValueError(
            f"{shown_url(url)}: a study storage this Optuna cannot read ({type(exc).__name__}: "
            f"{first_line(exc)})"
        ) from exc
    except json.JSONDecodeError as exc:  # a journal line Optuna cannot parse
        raise ValueError(f"{shown_url(url)}: not a study journal Optuna can read ({exc})") from exc
    except Exception as exc:
        # SQLAlchemy's errors (a file that is not a SQLite database, a server that refuses)
        # name no database: the URL, its password hidden, says which.
        if type(exc).__module__.partition(".")[0] != "sqlalchemy":
            raise
        raise ValueError(f"storage {shown_url(url)}: {first_line(exc)}") from exc


def shown_url(url: str) -> str:
    """An RDB URL as it may be printed: its password hidden (a journal path: as given)."""
    if "://" not in url:
        return url
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL SQLAlchemy reads: nothing of it shown past the scheme
        return url.partition("://")[0] + "://..."


# How long a journal's last line may stay cut short: a live driver appends a line in one write
# under Optuna's lock (milliseconds), so one still unfinished after this was left by a driver
# that stopped mid-write.
CUT_LINE_SECONDS = 2.0


def check_journal(url: str) -> None:
    """Every line of a journal file is what Optuna writes there: a JSON object (held to
    `files.MAX_NESTING`, as every JSON sodaray reads) with an integer `op_code`. Optuna parses
    each line without a bound and replays it unchecked: a line of '[' * 100000 ended in a
    RecursionError, a list or a string in a TypeError. A last line with no newline after it is
    waited for (`CUT_LINE_SECONDS`: a live driver may be writing it), then refused: one left by a
    driver stopped mid-write is skipped by Optuna's reader, but its next entry is appended to
    it, and that joined line makes the whole journal unreadable."""
    deadline = time.monotonic() + CUT_LINE_SECONDS
    while True:
        with open(url, "rb") as f:
            lines = f.read().split(b"\n")
        if not lines[-1].strip() or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if number == len(lines):  # no newline after it: cut short
            raise ValueError(
                f"{url}: line {number} is cut short (no newline after it: a driver stopped "
                "mid-write?); Optuna would append the next entry to it and make the journal "
                "unreadable: remove that last line to resume the study"
            )
        try:
            op = parse_json(line, "")
        except ValueError as exc:
            raise ValueError(f"{url}: line {number}{exc}: not a study journal") from exc
        if not isinstance(op, dict) or type(op.get("op_code")) is not int:
            raise ValueError(f"{url}: line {number} is not a journal entry Optuna writes")


JOURNAL_LOCK = ".lock"  # what Optuna's journal lock adds to the journal's name


def check_journal_lock(journal: Path, base: Path) -> None:
    """The journal's lock as Optuna's symlink lock leaves it: a symbolic link to the journal,
    held while a driver appends (milliseconds). A link to anything else is not Optuna's and is
    refused (`writes`: sodaray never acts through a link it did not make). Anything else there
    (a directory, a FIFO, a device, a file) is not a lock, and Optuna waited 30 s before it
    renamed it away (a directory: in silence); a link older than `CHECK_SECONDS` was left by a
    driver that died mid-write. Either is moved aside or removed with a warning, by the rule
    for writes below `base`, so opening the study waits at most about `CHECK_SECONDS`."""
    lock = journal.with_name(journal.name + JOURNAL_LOCK)  # Optuna's JournalFileSymlinkLock
    kind = what_is_at(base, lock)
    if kind is None:
        return
    if kind == LINK:
        target = os.readlink(lock)
        if os.path.abspath(target) != os.path.abspath(journal):
            raise UnsafeWrite(
                f"{lock} is a symbolic link to {brief(target)}, not Optuna's lock of "
                f"{journal} (a link to it); remove it"
            )
        age = time.time() - lock.lstat().st_mtime
        if age > CHECK_SECONDS:
            log.warning("breaking the study journal's lock %s: left %.0f s ago", lock, age)
            remove_file(base, lock)  # the link itself
        return
    aside = lock.with_name(f"{lock.name}.{os.getpid()}.invalid")
    log.warning("%s is %s, not a journal lock: moved to %s", lock, kind, aside)
    move_file(base, lock, aside)  # kept, never deleted (a device, a FIFO, a folder)


# The package to install for each database driver SQLAlchemy names (its module): Optuna's
# RDB storage said only "Failed to import DB access module" in a traceback.
DRIVER_PACKAGES = {
    "psycopg": "psycopg[binary]",
    "psycopg2": "psycopg2-binary",
    "pg8000": "pg8000",
    "asyncpg": "asyncpg",
    "MySQLdb": "mysqlclient",
    "pymysql": "PyMySQL",
    "mysql": "mysql-connector-python",
    "mariadb": "mariadb",
    "oracledb": "oracledb",
    "cx_Oracle": "cx_Oracle",
    "pyodbc": "pyodbc",
    "pymssql": "pymssql",
}


def _check_rdb_url(url: str) -> None:
    """An RDB URL whose database kind SQLAlchemy knows and whose driver is installed (the
    connection is tried later): one line naming the package to install when it is not."""
    check_sqlite_url(url, "storage")
    try:
        from sqlalchemy.engine import make_url

        parsed = make_url(url)
        dialect = parsed.get_dialect()
    except ImportError as exc:
        raise ValueError(f"storage {url}: {exc} (install the database driver)") from exc
    except Exception as exc:  # SQLAlchemy's ArgumentError, NoSuchModuleError
        raise ValueError(
            f"storage {url}: {first_line(exc)} (an Optuna RDB URL: sqlite:///study.db, "
            "postgresql://user@host/db, ...)"
        ) from exc
    shown = parsed.render_as_string(hide_password=True)
    try:
        load = getattr(dialect, "import_dbapi", None) or dialect.dbapi  # SQLAlchemy 2; 1.4
        load()
    except ImportError as exc:
        module = (getattr(exc, "name", None) or "").split(".")[0]
        package = DRIVER_PACKAGES.get(module, module or parsed.get_driver_name())
        raise ValueError(
            f"storage {shown}: its database driver {parsed.get_driver_name()} is not "
            f"installed ({first_line(exc)}): pip install '{package}'"
        ) from exc


def make_sampler(spec: TuningSpec, trials_so_far: int = 0, salt: int = 0):
    """The study's sampler, seeded from (seed, trials so far): a resumed study proposes new
    points instead of replaying the first run's (a new study keeps the file's seed). `salt`
    (a run's own number) joins them where another run is live on the study: two runs that
    opened it at the same count would otherwise propose the same points."""
    import numpy as np
    import optuna

    seed = spec.seed
    # Not the grid's: its seed shuffles the grid, and its first trials take points by their
    # number in that order; another seed's order gave a resumed study's trials points it had
    # tried (the resume repeated a trial). Optuna's grid sampler skips running points.
    if (trials_so_far or salt) and spec.sampler != "grid":
        entropy = [spec.seed, trials_so_far, *([salt] if salt else [])]
        seed = int(np.random.SeedSequence(entropy).generate_state(1)[0])
    if spec.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if spec.sampler == "grid":
        space = {p.name: p.grid_values() for p in spec.space}
        return _grid_sampler()(space, seed=seed)
    if spec.sampler == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed)
    import warnings

    with warnings.catch_warnings():  # experimental in Optuna 4-5: not the user's concern
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        # Several trials share a replica's batch, so several run at once: the constant liar
        # keeps TPE from proposing the running ones' neighbourhood again.
        return optuna.samplers.TPESampler(seed=seed, constant_liar=True)


def _grid_sampler() -> type:
    """Optuna's grid sampler, less its stop: once its grid is covered it calls `study.stop()`,
    which works only inside `study.optimize`; sodaray asks and tells trials, so the grid run
    ended in a RuntimeError and wrote no best preset. `run_tuning` runs only the points left
    (`grid_left`) instead."""
    import optuna

    class GridSampler(optuna.samplers.GridSampler):
        def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
            return None

    return GridSampler


def grid_left(spec: TuningSpec, study: Any) -> tuple[int, int]:
    """(points in the grid, trials a grid study has left to run): its enqueued trials, and the
    points no trial has taken (finished in any state, as Optuna's grid sampler counts them,
    running, or enqueued)."""
    import itertools

    import optuna

    names = [p.name for p in spec.space]
    waiting = optuna.trial.TrialState.WAITING
    taken, queued = set(), 0
    for t in study.get_trials(deepcopy=False):
        params = t.params or t.system_attrs.get("fixed_params") or {}
        queued += t.state == waiting
        if set(params) >= set(names):
            taken.add(tuple(params[n] for n in names))
    grid = set(itertools.product(*(p.grid_values() for p in spec.space)))
    return len(grid), queued + len(grid - taken)


SPEC_HASH_ATTR = "sodaray.spec_hash"
PLACES_HASH_ATTR = "sodaray.places_hash"  # the same, paths by where they lead (`places_hash`)


def spec_hash(spec: TuningSpec) -> str:
    """What makes trials comparable: model, data, algorithm, objective, fixed values, space,
    steps, metric, checkpoints and seed (not trials, sampler, pruner or storage)."""
    from sodaray.results import config_hash

    return config_hash(_identity(spec))


def places_hash(spec: TuningSpec) -> str:
    """`spec_hash` with each local path replaced by where it leads on this machine
    (`experiment.spec.places`): one value for a tuning file whose model or data is written
    relative in one run and absolute, or through a link, in another."""
    from sodaray.experiment.spec import places
    from sodaray.results import config_hash

    identity = _identity(spec)
    where = places(spec.model, spec.data)
    model, data = dict(identity["model"]), dict(identity["data"])
    if "model" in where:
        model.pop("id")
    if "path" in where:
        data.pop("path")
    if "source" in where and isinstance(data.get("build"), dict):
        data["build"] = {k: v for k, v in data["build"].items() if k != "source"}
    return config_hash({**identity, "model": model, "data": data, "places": where})


def _identity(spec: TuningSpec) -> dict[str, Any]:
    """What `spec_hash` hashes."""
    # A preset file by what it holds, not where it is: a study whose preset file was edited
    # (the same path) got the old study's hash, and its next `tune` added trials to the old
    # study; one moved elsewhere keeps its study.
    preset = {"preset": [spec.model.preset, preset_content(spec.model.preset_location)]}
    # With no preset, what the model's family defaults change in the trials, only where they
    # change something: a study they leave as it was keeps its hash.
    effect = spec.defaults_effect()
    return {
        # Named only when given, so files without a preset keep their studies' hashes.
        **(preset if spec.model.preset or spec.model.preset_file else {}),
        **({"defaults": effect} if effect else {}),
        # Only where a trial's check changed with it, so other studies keep their hashes.
        **({"confirm": "both"} if spec.confirms_raw() else {}),
        "model": spec.model.identity(),
        "data": spec.data.identity(),
        "algorithm": spec.algorithm,
        "objective": spec.objective,
        "fixed": spec.fixed,
        "space": [dataclasses.asdict(p) for p in spec.space],
        "steps": spec.max_steps,  # the key older studies' hashes were made with
        "metric": spec.metric,
        "checkpoints": spec.checkpoints,
        "seed": spec.seed,
    }


def preset_content(path: str | None) -> dict[str, Any] | None:
    """A preset file's values as a study's identity takes them: its parameters and objective
    settings (None without a file)."""
    if path is None:
        return None
    from sodaray.config.presets import load_preset_file, load_preset_objective

    return {"params": load_preset_file(path), "objective": load_preset_objective(path)}


RUN_ATTR = "sodaray.run:"  # a study's user attribute per run: its driver (RunOwner.record)
TRIAL_RUN_ATTR = "sodaray.run"  # a trial's user attribute: the run that asked it (its key)
INTERRUPTED_ATTR = "interrupted"  # a trial's: why its run stopped it (it is run again)


@dataclasses.dataclass
class RunOwner:
    """A `tune` run's driver as its study records it: one study user attribute per run
    (`RUN_ATTR` + `key`: host, pid, boot id and process start, as a sweep's job lock holds
    them, and when it was last seen), and each trial it asks stamped with `key`. Another run
    opening the study leaves a RUNNING trial alone while its run's driver lives, and fails it
    (its parameters tried again) once that driver is known to be over: same host, its process
    gone, another process now, or from before a restart; another host, not seen for
    `owner.STALE_SECONDS` (a live driver renews its record every `owner.REFRESH_SECONDS`):
    `experiment.owner`'s judgment, as a sweep's job lock gets; or its record says it ended."""

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
        self.others = {
            key: record
            for key, record in run_records(study).items()
            if key != self.key and self.gone(key, record) is None
        }
        return self.others

    def refresh(self, study: Any) -> None:
        """The record's `seen` time renewed, at most every `LOCK_REFRESH_SECONDS`."""
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

    def stamp(self, trial: Any) -> None:
        trial.set_user_attr(TRIAL_RUN_ATTR, self.key)

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
    return {
        name[len(RUN_ATTR) :]: value
        for name, value in study.user_attrs.items()
        if name.startswith(RUN_ATTR)
    }


def open_study(
    spec: TuningSpec,
    url: str,
    study_name: str,
    storage: Any = None,
    owner: RunOwner | None = None,
) -> tuple[Any, list[int]]:
    """Create or resume the study in `storage` (default: `open_storage(url)`): refuse one made
    by a different tuning file, record this run in it (`owner`, default a new `RunOwner`),
    re-seed the sampler from the trials so far (and, where another run is live on the study,
    this run's own number, so that the two never propose the same points), and fail (then
    retry) trials left RUNNING by a run known to be over (`rescue_trials`). A live run's
    trials are never touched: this run joins the study beside it, asking its own trials.
    Returns the study and the numbers of the trials it failed."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with unreadable_storage(url):
        study = optuna.create_study(
            study_name=study_name,
            storage=open_storage(url) if storage is None else storage,
            sampler=make_sampler(spec),
            pruner=make_pruner(spec),
            direction="maximize",
            load_if_exists=True,
        )
    key, where = spec_hash(spec), places_hash(spec)
    recorded = study.user_attrs.get(SPEC_HASH_ATTR)
    if recorded is not None and PLACES_HASH_ATTR not in study.user_attrs and recorded == key:
        study.set_user_attr(PLACES_HASH_ATTR, where)  # a study from before places were kept
    if recorded is None:
        study.set_user_attr(SPEC_HASH_ATTR, key)
        study.set_user_attr(PLACES_HASH_ATTR, where)
        # What the study is, for optuna-dashboard and `optuna studies` (the hash is for us).
        for name, value in study_attrs(spec).items():
            study.set_user_attr(name, value)
    elif recorded != key and study.user_attrs.get(PLACES_HASH_ATTR) != where:
        raise ValueError(
            f"study {study_name!r} in {url} was made by another tuning file (model, data, "
            "algorithm, objective, space, steps, metric or seed differ); give this one its own "
            "study_name or storage"
        )
    owner = RunOwner.new() if owner is None else owner
    others = owner.register(study)  # before the trials are counted: see `make_sampler`
    trials = study.get_trials(deepcopy=False)
    if trials or others:
        study.sampler = make_sampler(spec, len(trials), owner.salt if others else 0)
    # The preset opens a new study once: the earliest of runs starting together enqueues it.
    first = all(r.get("since", 0) > owner.record["since"] for r in others.values())
    if not trials and first and spec.start_params():
        study.enqueue_trial(spec.start_params())
    return study, rescue_trials(study, spec, owner, others)


def rescue_trials(
    study: Any, spec: TuningSpec, owner: RunOwner, others: dict[str, Any]
) -> list[int]:
    """Fail the RUNNING trials whose run is over (`RunOwner.gone`), their parameters tried
    again (when its driver got as far as sampling them all). A trial that names no run (an
    older sodaray's, or one whose driver died between asking it and naming itself) is left
    alone while another run is live: it may be that run's. Two runs rescuing at once fail a
    trial once: the second is told it is finished, and leaves it."""
    import optuna

    runs = run_records(study)
    names = {p.name for p in spec.space}
    stale = []
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        run = t.user_attrs.get(TRIAL_RUN_ATTR)
        if run is None:
            why = None if others else "it names no run"
        elif not isinstance(run, str) or run == owner.key:
            continue
        else:
            why = owner.gone(run, runs.get(run))
        if why is None:
            continue
        log.info("trial %d was left running (its run: %s): failed, tried again", t.number, why)
        try:
            study.tell(t.number, state=optuna.trial.TrialState.FAIL)
        except (optuna.exceptions.UpdateFinishedTrialError, RuntimeError, ValueError):
            continue  # another run failed it first
        if set(t.params) >= names:
            study.enqueue_trial(t.params, skip_if_exists=False)
        stale.append(t.number)
    return stale


def abandon_trials(study: Any, trials: Sequence[Any], names: set[str], why: str) -> list[int]:
    """This run's RUNNING `trials` failed, marked with `why` (`INTERRUPTED_ATTR`), and their
    parameters (when they hold all of `names`) enqueued: a run stopped by a signal or an error
    leaves none RUNNING, and the next run tries them again. Returns their numbers."""
    import optuna

    done = []
    for trial in trials:
        try:
            trial.set_user_attr(INTERRUPTED_ATTR, why)
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
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
            owner.stamp(trial)
        return trial
    except BaseException:
        running = (optuna.trial.TrialState.RUNNING,)
        for t in study.get_trials(deepcopy=False, states=running):
            if t.number not in before:
                study.tell(t.number, state=optuna.trial.TrialState.FAIL)
        raise


def make_pruner(spec: TuningSpec):
    """The study's pruner. The resource successive halving and Hyperband allot is the step
    budget: their first rung is the first checkpoint's steps, and each next rung doubles it
    (reduction factor 2, so that a study's few checkpoints, evenly spaced, meet the rungs at
    steps 1, 2 and 4 times the first). A trial goes on past a rung while its value there is in
    the better half of those reported there so far (the first always does: Optuna's
    `bootstrap_count` would prune every trial that reaches a rung before enough others have)."""
    import optuna

    first = checkpoint_steps(spec.max_steps, spec.checkpoints)[0]
    if spec.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=0)
    if spec.pruner == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=first, reduction_factor=2)
    if spec.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(
            min_resource=first, max_resource=spec.max_steps, reduction_factor=2
        )
    return optuna.pruners.NopPruner()


def checkpoint_steps(max_steps: int, count: int) -> tuple[int, ...]:
    """The steps at which a trial reports to the pruner: `count` evenly spaced, the last at
    its budget."""
    return tuple(sorted({max(1, -(-(j + 1) * max_steps // count)) for j in range(count)}))


SIGNALS = ("loss", "tokens", "exact")


def checkpoint_value(
    signal: str, exact: int, total: int, losses: Sequence[float], shares: Sequence[float]
) -> float:
    """What a checkpoint reports to the pruner (maximised): the exact rate at the checkpoint,
    ties broken by the samples' mean relaxed loss there (`loss`: as `exact_then_loss` breaks
    a trial's) or by their mean share of true tokens in place (`tokens`). Either tie-break is
    below one sample's worth of exact rate, so the value never ranks fewer finds above more;
    unlike the exact rate alone, it differs between trials before any has found anything.
    Without per-sample values (an algorithm that reports none), the exact rate."""
    if signal == "loss" and losses:
        return trial_value("exact_then_loss", exact, total, 0.0, list(losses))
    if signal == "tokens" and shares:
        return exact / total + (sum(shares) / len(shares)) / (total + 1)
    return exact / total


# What each metric's value is, as an axis or a column says it (the plots, the leaderboard).
METRIC_LABELS = {
    "exact": "exact rate (share of validation samples recovered exactly)",
    "exact_per_second": "exact inversions per second of search",
    "exact_then_loss": "exact rate, ties broken by the mean final loss (exact_then_loss)",
}


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


def write_preset(spec: TuningSpec, best, path: Path, base: Path | None = None) -> Path:
    """The best parameters as a preset YAML (`sodaray invert --preset-file`, sweeps'
    `preset_file:`), written by the rule for writes (`base`: the folder the user gave,
    default the file's own)."""
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
    # How the trial compared candidates (the file's `objective` with any tuned `objective.*`),
    # where it is not the default: a preset tuned under `space: centred` is used so.
    objective = dataclasses.asdict(spec.objective_for(best.params))
    default = dataclasses.asdict(Objective())
    settings = {k: objective[k] for k in PRESET_FIELDS if objective[k] != default[k]}
    if settings:  # not SODA parameters: kept apart so the file loads as a preset
        doc["objective"] = settings
    write_file(path.parent if base is None else base, path, yaml.safe_dump(doc, sort_keys=False))
    return path
