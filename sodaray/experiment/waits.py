"""The one rule for waits on something outside sodaray: a check of a tracking URI (`--mlflow`), a
cluster address (`--address`) or a lock ends within about `CHECK_SECONDS`, in one line.

Libraries retry for minutes (MLflow's requests, Ray's connect loop) or wait for ever (a FIFO as
a journal): a check runs its call in a daemon thread and stops waiting for it after
`CHECK_SECONDS`, so the command ends with one line. A leaf: every layer may import it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

CHECK_SECONDS = 10.0  # a check of a URI, an address or a lock gives up after this long


def within(call: Callable[[], T], what: str, seconds: float = CHECK_SECONDS) -> T:
    """`call()`'s value, or its error, if it ends within `seconds`; else a TimeoutError (an
    OSError: one line at the command line) saying that `what` did not answer. The call goes on
    in its daemon thread, unwaited for."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=run, name=f"sodaray check: {what}"[:60], daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise TimeoutError(f"{what}: no answer within {seconds:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]
