"""How a command stops: SIGINT (Ctrl-C), SIGTERM (`kill`, Slurm, `docker stop`) and SIGHUP (a
closed terminal, a lost SSH session) alike. Each raises `Stop`, a KeyboardInterrupt, in the main
thread, so every layer's Ctrl-C path (stop launching, keep what finished, shut Ray down) runs for
all three; the command prints its one "interrupted" line and exits `exit_code()`: 128 plus the
signal's number (130, 143, 129), as a shell reports a process the signal ended.

`ray.init` installs Ray's own handlers for SIGTERM in the driver: `reinstall()`, called once Ray
is up, puts this module's handlers back. A leaf: every layer may import it.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

Handler = Callable[[int, FrameType | None], Any]

# Ray's native failure handler (installed by `ray.init` as the driver connects) answers SIGTERM
# with "*** SIGTERM received ... PC: @", a stack dump and no cleanup. Ray reads this variable
# when it is imported: set before, no native handler is installed (`sodaray.cli` sets it first).
NO_NATIVE_HANDLER = "RAY_DISABLE_FAILURE_SIGNAL_HANDLER"


def stop_signals() -> tuple[signal.Signals, ...]:
    """The signals that stop a command cleanly, those this platform has (no SIGHUP on Windows)."""
    return tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))


class Stop(KeyboardInterrupt):
    """A stop signal arrived: `signum` says which."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Interrupted(KeyboardInterrupt):
    """A run (a sweep's, a study's) stopped by a signal: what it finished is kept; `run` holds
    its record so far (`SweepRun`, `TuneRun`: a study's holds the trials it `abandoned`)."""

    def __init__(self, run: Any) -> None:
        super().__init__("interrupted")
        self.run = run


# The handlers in force, innermost last (a command may install its own for a stretch), and the
# stop signals received since the outermost was installed.
_handlers: list[Handler] = []
_received: list[int] = []


def _raise(signum: int, frame: FrameType | None) -> None:
    raise Stop(signum)


def _install(handler: Handler) -> None:
    for sig in stop_signals():
        signal.signal(sig, handler)


def _push(handler: Handler) -> Handler:
    """`handler` in force, innermost, noting the signals it gets; returns what was installed."""

    def record(signum: int, frame: FrameType | None) -> Any:
        _received.append(signum)
        return handler(signum, frame)

    _handlers.append(record)
    _install(record)
    return record


@contextlib.contextmanager
def handled(handler: Handler = _raise) -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP call `handler(signum, frame)` for the block (default: raise
    `Stop`), then the handlers before it are back. Outside the main thread (where Python
    takes no handler) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if not _handlers:
        _received.clear()
    previous = {sig: signal.getsignal(sig) for sig in stop_signals()}
    wrapped = _push(handler)
    try:
        yield
    finally:
        _handlers.remove(wrapped)
        for sig, old in previous.items():
            # A handler set from C (Ray's) reads back as None: the default then, as before.
            signal.signal(sig, old if old is not None else signal.SIG_DFL)


def reinstall() -> None:
    """This module's handler in force again for the stop signals (after `ray.init`, whose
    native handler took SIGTERM); nothing when none was installed or off the main thread."""
    if _handlers and threading.current_thread() is threading.main_thread():
        _install(_handlers[-1])


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """The stop signals only noted for the block (Ray's shutdown: cut short, it leaves Ray's
    processes behind); one that came is raised as `Stop` once it ends, unless the block is
    ending in an error of its own."""
    if not _handlers or threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []
    outer = _handlers[-1]
    held = _push(lambda signum, frame: noted.append(signum))
    try:
        yield
    finally:
        _handlers.remove(held)
        _install(outer)
    if noted and sys.exc_info()[1] is None:
        raise Stop(noted[0])


def stopped_by(signum: int) -> Stop:
    """The `Stop` for a signal that reached us by another way than these handlers (Ray's own
    handler, mid-start), recorded as received so that `exit_code()` says which."""
    _received.append(signum)
    return Stop(signum)


def last_signal() -> int | None:
    """The last stop signal received while handlers were installed, or None."""
    return _received[-1] if _received else None


def exit_code() -> int:
    """A stopped command's exit status: 128 + the signal's number (SIGINT 130, SIGTERM 143,
    SIGHUP 129); 130 when none was seen (a KeyboardInterrupt raised otherwise)."""
    return 128 + (last_signal() or signal.SIGINT)


def signal_name() -> str:
    """The signal that stopped the command, as `SIGTERM` (SIGINT when none was seen)."""
    return signal.Signals(last_signal() or signal.SIGINT).name
