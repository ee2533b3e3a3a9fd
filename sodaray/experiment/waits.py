"""The one rule for waits on something outside sodaray: a check of a tracking URI (`--mlflow`), a
cluster address (`--address`) or a lock ends within about `CHECK_SECONDS`, in one line.

Why: `sweep run ... --mlflow http://127.0.0.1:1` was still retrying after 120 s (MLflow retries
a request 7 times, backing off), an `--address` whose port accepts connections and never
answers took Ray three minutes to give up on, a FIFO named as a study's journal made `tune`
wait for ever, and anything in the place of the journal's lock 30 s. A check runs its call in
a daemon thread and stops waiting for it after `CHECK_SECONDS`: whatever the library does
meanwhile (a name lookup, a retry loop), the command ends with one line. A leaf: every layer
may import it.
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
