"""Error messages as the one line a user reads, and text read from files or the command line
shown as data (never as layout: a line break, a tab or a terminal escape in a label). A leaf:
every layer may import it."""

from __future__ import annotations


def first_line(exc: BaseException) -> str:
    """An error's message as one line (its type when the message is empty). A YAML error's
    first line is its context ("while constructing a mapping"): its problem and where are the
    line a user needs."""
    problem, mark = getattr(exc, "problem", None), getattr(exc, "problem_mark", None)
    if isinstance(problem, str) and problem:
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        return problem.strip().splitlines()[0] + where
    text = str(exc).strip()
    return text.splitlines()[0].strip() if text else type(exc).__name__


def last_line(exc: BaseException) -> str:
    """The last line of an error's message: a Ray task error's message is the remote traceback,
    whose last line is the error itself (its repr when the message is empty)."""
    text = str(exc).strip()
    return text.splitlines()[-1].strip() if text else repr(exc)


def shown(text: object, limit: int | None = None) -> str:
    """`text` as one printable line: each non-printable character (line break, tab, terminal
    escape, Unicode separator) as its Python escape (`\\n`, `\\x1b`), so a label read from a file
    never splits a table or message; `limit`: cut to that many characters, ending in `...`."""
    text = str(text)
    if not text.isprintable():
        text = "".join(
            c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text
        )
    if limit is not None and len(text) > limit:
        text = text[: max(limit - 3, 0)] + "..."
    return text
