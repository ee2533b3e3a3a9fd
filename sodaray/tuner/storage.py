"""A study's storage: its URL, checked before anything runs, and opened through Optuna's public
API (any RDB Optuna takes, or a journal file held to the rule for every file sodaray writes).
Light: no torch, no Optuna until a storage opens."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from sodaray.errors import first_line
from sodaray.experiment.waits import CHECK_SECONDS
from sodaray.io.files import check_sqlite_url, parse_json, shown_url, what_is
from sodaray.io.paths import brief
from sodaray.io.writes import LINK, OutputFolder, UnsafeWrite

if TYPE_CHECKING:
    from sodaray.tuner.spec import TuningSpec

log = logging.getLogger(__name__)


def storage_url(spec: TuningSpec, out: Path, override: str | None = None) -> str:
    """An RDB URL as given (`override`, else the file's), else OUT/<name>/study.journal. An
    empty one (an unset `--storage "$DB"`) is refused, not taken for a local journal."""
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


def open_storage(url: str, out: OutputFolder | None = None):
    """Optuna storage for a URL: RDB (`postgresql://`, `sqlite:///`, ...) or a journal file,
    checked first by the rule for writes below `out` (default: the journal's folder): a regular
    file of Optuna's lines, its lock nothing or Optuna's link (opening waits at most about
    `CHECK_SECONDS`)."""
    if "://" in url:
        _check_rdb_url(url)
        return url  # Optuna's RDB storage takes the URL itself
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock

    journal = Path(url)
    out = OutputFolder(journal.parent) if out is None else out
    kind = what_is(url)  # opening a FIFO to append to it waits for a reader for ever
    if kind not in (None, "a regular file"):
        raise ValueError(f"{url} is {kind}, not a study journal")
    out.prepare(journal)  # by the rule: no link below `out`, nor at the journal
    if kind is not None:
        check_journal(url)
    check_journal_lock(journal, out)
    # A lock not refreshed for `CHECK_SECONDS` is broken (Optuna's default: 30 s).
    lock = JournalFileSymlinkLock(url, grace_period=int(CHECK_SECONDS))
    with unreadable_storage(url):  # JournalStorage replays the journal as it opens it
        return JournalStorage(JournalFileBackend(url, lock_obj=lock))


@contextlib.contextmanager
def unreadable_storage(url: str) -> Iterator[None]:
    """A storage Optuna cannot read (a journal entry it did not write, a file that is not a
    database) as one line, not a failure deep inside Optuna."""
    try:
        yield
    except (KeyError, TypeError, IndexError, AssertionError, UnicodeError) as exc:
        why = f"{type(exc).__name__}: {first_line(exc)}"
        raise ValueError(
            f"{shown_url(url)}: a study storage this Optuna cannot read ({why})"
        ) from exc
    except json.JSONDecodeError as exc:  # a journal line Optuna cannot parse
        raise ValueError(f"{shown_url(url)}: not a study journal Optuna can read ({exc})") from exc
    except Exception as exc:  # SQLAlchemy's errors name no database: the URL says which
        if type(exc).__module__.partition(".")[0] != "sqlalchemy":
            raise
        raise ValueError(f"storage {shown_url(url)}: {first_line(exc)}") from exc


# How long a journal's last line may stay cut short: a live driver appends a line in one write
# under Optuna's lock, so one unfinished after this was left by a driver stopped mid-write.
CUT_LINE_SECONDS = 2.0


def check_journal(url: str) -> None:
    """Every line of a journal file is what Optuna writes there (it replays them unchecked): a
    JSON object, held to sodaray's JSON limits, with an integer `op_code`. A last line with no
    newline is waited for (`CUT_LINE_SECONDS`), then refused: Optuna would append its next
    entry to it, and that joined line makes the whole journal unreadable."""
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


def check_journal_lock(journal: Path, out: OutputFolder) -> None:
    """The journal's lock as Optuna's symlink lock leaves it: a symbolic link to the journal,
    held while a driver appends. A link to anything else is refused; a link older than
    `CHECK_SECONDS` (its driver died mid-write) is removed, and anything else there is moved
    aside, each with a warning and by the rule for writes below `out`."""
    lock = journal.with_name(journal.name + ".lock")  # Optuna's JournalFileSymlinkLock
    kind = out.what_is_at(lock)
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
            out.remove(lock)  # the link itself
        return
    aside = lock.with_name(f"{lock.name}.{os.getpid()}.invalid")
    log.warning("%s is %s, not a journal lock: moved to %s", lock, kind, aside)
    out.move(lock, aside)  # kept, never deleted (a device, a FIFO, a folder)


# The package to install for a database driver SQLAlchemy names (its module), where the two
# differ (pg8000, asyncpg, oracledb, pyodbc, ...: the module's name).
DRIVER_PACKAGES = {
    "psycopg": "psycopg[binary]",
    "psycopg2": "psycopg2-binary",
    "MySQLdb": "mysqlclient",
    "pymysql": "PyMySQL",
    "mysql": "mysql-connector-python",
}


def _check_rdb_url(url: str) -> None:
    """An RDB URL whose database kind SQLAlchemy knows and whose driver is installed: one line
    naming the package to install when it is not."""
    check_sqlite_url(url, "storage")
    try:
        from sqlalchemy.engine import make_url

        parsed = make_url(url)
        dialect = parsed.get_dialect()
    except ImportError as exc:
        raise ValueError(f"storage {url}: {exc} (install the database driver)") from exc
    except Exception as exc:  # SQLAlchemy's ArgumentError, NoSuchModuleError
        kinds = "sqlite:///study.db, postgresql://user@host/db, ..."
        raise ValueError(f"storage {url}: {first_line(exc)} (an Optuna RDB URL: {kinds})") from exc
    try:
        (getattr(dialect, "import_dbapi", None) or dialect.dbapi)()  # SQLAlchemy 2; 1.4
    except ImportError as exc:
        module, driver = (getattr(exc, "name", None) or "").split(".")[0], parsed.get_driver_name()
        package = DRIVER_PACKAGES.get(module, module or driver)
        raise ValueError(
            f"storage {shown_url(url)}: its database driver {driver} is not "
            f"installed ({first_line(exc)}): pip install '{package}'"
        ) from exc
