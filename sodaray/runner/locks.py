"""A job's lock: the one driver that runs a job at a time, judged live by `experiment.owner`.

A driver holds `.sodaray/jobs/<job>/job.lock` (its record, `experiment.owner.me`, refreshed
while it runs) for every job it runs; a second driver on the same folder skips those jobs, and
breaks a lock that is not a lock (a JSON list, garbage: broken with a warning, never obeyed nor
a traceback) or whose owner is gone (`experiment.owner.owner_gone`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

from sodaray.errors import first_line
from sodaray.experiment.owner import me, owner_gone, record_problem
from sodaray.io.files import read_json
from sodaray.io.writes import LINK, REGULAR, OutputFolder

log = logging.getLogger(__name__)

LOCK_FILE = "job.lock"


def _mine(owner: dict[str, Any]) -> bool:
    return owner["host"] == socket.gethostname() and owner["pid"] == os.getpid()


def lock_state(folder: Path) -> tuple[dict[str, Any] | None, str | None]:
    """A job's lock: (its live owner, None) when another driver holds it; (None, why) when a
    lock is there but stale or invalid (to break); (None, None) when there is none or it is
    this process's own."""
    path = folder / LOCK_FILE
    if not path.exists() and not path.is_symlink():
        return None, None
    try:
        owner = read_json(path, "lock file")
        age = time.time() - path.stat().st_mtime
    except FileNotFoundError:  # released between the two looks
        return None, None
    except (OSError, ValueError) as exc:  # not a regular file, too large, not JSON
        return None, f"not a lock ({first_line(exc)})"
    problem = record_problem(owner)
    if problem is not None:
        return None, f"not a lock: {problem}"
    if _mine(owner):
        return None, None
    why = owner_gone(owner, age)
    return (None, why) if why is not None else (owner, None)


def acquire_lock(folder: Path, out: OutputFolder | None = None) -> dict[str, Any] | None:
    """Take the job's lock; returns the other live owner instead when there is one. The lock
    is written whole and linked into place only where nothing is (`write_file`'s
    `exclusive`): no reader sees it half written, which it could not tell from garbage.
    `out`: the output folder, below which nothing may be a link (default: `folder`)."""
    out = OutputFolder(folder) if out is None else out
    path = folder / LOCK_FILE
    text = json.dumps(me()) + "\n"
    for _ in range(2):
        if out.write(path, text, exclusive=True):
            return None
        owner, why = lock_state(folder)
        if owner is not None:
            return owner
        if why is not None:  # else it is this process's own (or just released): taken again
            log.warning("breaking the lock %s: %s", path, why)
        if out.what_is_at(path) in (REGULAR, LINK, None):  # a link is removed itself
            out.remove(path)
        else:  # a folder, a FIFO, a device in its place: moved aside and kept, never deleted
            out.move(path, path.with_name(f"{LOCK_FILE}.{os.getpid()}.invalid"))
    return lock_state(folder)[0] or {"host": "?"}


def release_lock(folder: Path, out: OutputFolder | None = None) -> None:
    """Remove the job's lock if it is this process's own (`out`: as `acquire_lock`'s)."""
    path = folder / LOCK_FILE
    try:
        owner = read_json(path, "lock file")
    except (OSError, ValueError):
        return
    if record_problem(owner) is None and _mine(owner):
        (OutputFolder(folder) if out is None else out).remove(path)


def refresh_locks(folders: list[Path], out: OutputFolder | None = None) -> None:
    """Touch each held lock (a regular file only: a link's target is never touched; `out`: as
    `acquire_lock`'s, by default each lock's own folder)."""
    for folder in folders:
        with contextlib.suppress(OSError, ValueError):
            (OutputFolder(folder) if out is None else out).touch(folder / LOCK_FILE)
