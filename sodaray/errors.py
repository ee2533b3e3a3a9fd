"""Error messages as the one line a user reads. A leaf: every layer may import it."""

from __future__ import annotations


def first_line(exc: BaseException) -> str:
    """An error's message as one line (its type when the message is empty)."""
    text = str(exc).strip()
    return text.splitlines()[0].strip() if text else type(exc).__name__


def last_line(exc: BaseException) -> str:
    """The last line of an error's message: a Ray task error's message is the remote traceback,
    whose last line is the error itself (its repr when the message is empty)."""
    text = str(exc).strip()
    return text.splitlines()[-1].strip() if text else repr(exc)
