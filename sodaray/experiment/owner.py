"""Who runs a piece of work, and whether that driver still lives: the record a sweep's job lock
and a tuning study's run entry both hold, and the one judgment of it both apply.

A record names its driver (host, pid, and on Linux the boot and the process's start time), so
that a reused pid or a record from before a reboot is not taken for a live driver. On another
host only the record's age tells (a live driver renews it every `REFRESH_SECONDS`; one not
renewed for `STALE_SECONDS` is over).
"""

from __future__ import annotations

import itertools
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from sodaray.io.paths import brief

REFRESH_SECONDS = 30.0  # how often a live driver renews its record
STALE_SECONDS = 300.0  # a record from another host not renewed for this long: its driver is over


def _proc(pid: int | str, name: str) -> str | None:
    try:
        with open(f"/proc/{pid}/{name}", encoding="utf-8", errors="replace") as f:
            return f.read(1 << 16)
    except OSError:
        return None


def boot_id() -> str | None:
    """This machine's boot (Linux), or None where unknown."""
    text = _proc("sys/kernel/random", "boot_id")
    return text.strip() if text else None


def process_start(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot, /proc/PID/stat field 22); None if unknown."""
    text = _proc(pid, "stat")
    if not text or ")" not in text:
        return None
    fields_ = text.rsplit(")", 1)[1].split()  # after the command, which may hold spaces
    try:
        return int(fields_[19])
    except (IndexError, ValueError):
        return None


def pid_alive(pid: int) -> bool:
    """Whether a process `pid` exists on this machine (anyone's)."""
    try:
        os.kill(pid, 0)
    except PermissionError:  # alive, someone else's
        return True
    except (ProcessLookupError, OverflowError, ValueError):  # gone, or not a pid this system has
        return False
    return True


def me() -> dict[str, Any]:
    """This process's record: host, pid, since, and (Linux) boot and start; `command`, what
    runs, for a person reading it."""
    record: dict[str, Any] = dict(host=socket.gethostname(), pid=os.getpid(), since=time.time())
    boot, start = boot_id(), process_start(os.getpid())
    if boot is not None and start is not None:
        record.update(boot=boot, start=start)
    # The arguments up to the first option (its value may be a credential: `--mlflow URI`).
    words = itertools.takewhile(lambda arg: not arg.startswith("-"), sys.argv[1:])
    record["command"] = " ".join([Path(sys.argv[0]).name if sys.argv else "?", *words])[:200]
    return record


def record_problem(record: Any) -> str | None:
    """Why `record` is not one `me()` writes, or None."""
    if not isinstance(record, dict):
        return f"it holds {type(record).__name__}, not a JSON object"
    if not isinstance(record.get("host"), str) or not record["host"]:
        return "it names no host"
    pid = record.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid < 1:
        return f"its pid is {brief(pid)}, not a process id"
    number = (int, float)
    for key, kind in (("boot", str), ("start", int), ("since", number), ("seen", number)):
        if key in record and (not isinstance(record[key], kind) or isinstance(record[key], bool)):
            return f"its {key} is {brief(record[key])}"
    return None


def describe_owner(record: dict[str, Any]) -> str:
    """`host pid N since YYYY-MM-DD HH:MM:SS`, for a message about who holds a thing."""
    since, when = record.get("since"), ""
    if isinstance(since, (int, float)) and not isinstance(since, bool) and since > 0:
        when = time.strftime(" since %Y-%m-%d %H:%M:%S", time.localtime(since))
    return f"{record.get('host', '?')} pid {record.get('pid', '?')}{when}"


def owner_gone(record: dict[str, Any], age: float) -> str | None:
    """Why the driver of a valid record (`record_problem` None) is over, or None while it may
    live. `age`: seconds since the record was last renewed (what tells on another host).
    Same host: gone, another process now (the pid reused), or from before a restart; a record
    with no start time (hand-written, or an older sodaray's) must at least name a sodaray run.
    This process's own record is live."""
    pid = record["pid"]
    where = f"{record['host']} pid {pid}"
    if record["host"] != socket.gethostname():
        return f"{where} has not renewed it for {age:.0f} s" if age > STALE_SECONDS else None
    if pid == os.getpid():
        return None
    if "boot" in record and record["boot"] != boot_id():
        return f"{where} ran before this machine restarted"
    if not pid_alive(pid):
        return f"{where} is gone"
    start = process_start(pid)
    if "start" in record and start is not None and start != record["start"]:
        return f"{where} is another process now (the pid was reused)"
    command = _proc(pid, "cmdline")
    if "start" not in record and command is not None and "sodaray" not in command:
        shown = command.replace("\0", " ").strip()[:60] or "?"
        return f"{where} is not a sodaray run ({shown})"
    return None
