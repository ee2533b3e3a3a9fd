"""The one rule for names read from files that become parts of paths, the check that what the
runner and tuner write lies under the output folder, and the one rule for relative paths that
sweep and tuning files name (`in_file`).

A `name` read from a file becomes a folder or file name, and `name: ".."` or `/etc/x` would
leave the output folder: `component` refuses such names where they are read, and `inside`
checks every path built from them before anything is written.
"""

from __future__ import annotations

import logging
import os
import re
import reprlib
from pathlib import Path

log = logging.getLogger(__name__)

MAX_NAME = 128  # characters: folder names stay well under the filesystems' 255 bytes


class PathEscape(ValueError):
    """A path built from names read from a file would leave the folder it belongs in."""


def component(value: object, what: str = "name") -> str:
    """`value` if it can be one path component: a non-empty string of at most `MAX_NAME`
    characters, not `.` or `..`, without `/`, `\\` or NUL. Raises ValueError saying why."""
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, not {brief(value)}")
    if not value or value.strip() != value:
        raise ValueError(
            f"{what} must be a non-empty name without surrounding spaces, not {value!r}"
        )
    if len(value) > MAX_NAME:
        raise ValueError(f"{what} must be at most {MAX_NAME} characters, not {len(value)}")
    if value in (".", "..") or any(c in value for c in "/\\\0"):
        raise ValueError(f"{what} must be a plain name (no '/', '\\', '.' or '..'), not {value!r}")
    if not value.isprintable():  # a line break or a terminal escape in a folder and a label
        raise ValueError(
            f"{what} must be printable (no line breaks or control characters), not {value!r}"
        )
    return value


def inside(base: Path | str, *parts: str) -> Path:
    """`base / parts...`, refused (PathEscape) unless it lies under `base`, `..` and symlinks
    resolved as far as the path exists."""
    base = Path(base)
    path = base.joinpath(*parts)
    if not path.resolve().is_relative_to(base.resolve()):
        raise PathEscape(f"{path} would be written outside {base}")
    return path


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxtuple = 2, 5, 5, 5
_REPR.maxstring = _REPR.maxother = 50


def brief(value: object, limit: int = 80) -> str:
    """`repr(value)` for a one-line message, shortened (a value read from a hostile file may be
    megabytes long, or a structure that YAML aliases make exponentially large: `reprlib` never
    walks more than a few levels and items of it)."""
    text = _REPR.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def expand_path(path: str) -> str:
    """`path` with `~` and `$NAME` / `${NAME}` expanded, so a file can name a model folder
    that lies elsewhere on each machine. An unset variable is an error, not a literal `$`."""
    expanded = os.path.expandvars(os.path.expanduser(path))
    if unset := re.search(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", expanded):
        raise ValueError(f"environment variable {unset.group(1)} is not set (in {path})")
    return expanded


def local_path(path: str | None) -> str | None:
    """`path` as an absolute path when it names a file or folder here, else None (a hub id).
    Made absolute without following symlinks: a link that every node mounts stays that link."""
    if not path:
        return None
    expanded = expand_path(path)
    return os.path.abspath(expanded) if os.path.exists(expanded) else None


# ---- relative paths in sweep and tuning files -------------------------------------------------
# Every path a file names (model folders, `preset_file`, a dataset's `path` and `source`,
# `start_from`, `include:`) is read, when relative, from the folder of the file that names it,
# so a sweep runs the same from any directory; command-line paths from the current directory.
RELATIVE_RULE = "a relative path in a sweep or tuning file is read from the file's folder"
_warned: set[tuple[str, str]] = set()


def in_file(path: str, folder: str | Path | None) -> str:
    """Where `path`, named in a file in `folder`, lies: `~` and `$NAME` expanded, an absolute
    path as it is, a relative one joined to `folder` (None: the command line's, read from the
    current directory). A path found only from the current directory is still taken, with a
    warning that says how to write it; where both exist the file's folder wins."""
    expanded = expand_path(path)
    if folder is None or os.path.isabs(expanded):
        return expanded
    here = os.path.join(os.fspath(folder), expanded)
    if os.path.exists(here) or not os.path.exists(expanded):
        return here
    if (path, os.fspath(folder)) not in _warned:  # once per path: `location` is asked often
        _warned.add((path, os.fspath(folder)))
        log.warning(
            "%s is not in %s but is in the current directory, where older files named paths "
            "from; read from there for now, but %s: write it as %s",
            path,
            folder,
            RELATIVE_RULE,
            os.path.relpath(os.path.abspath(expanded), folder),
        )
    return expanded


def looked_for(path: str, folder: str | Path | None) -> str:
    """How a missing path was looked for, for a one-line error: the path as written and, where
    the rule moved it, where it was looked for and the rule."""
    try:
        where = in_file(path, folder)
    except ValueError:
        return path
    if folder is None or os.path.isabs(expand_path(path)):
        return path if where == path else f"{path} ({where})"
    return f"{path} (looked for {os.path.normpath(where)}: {RELATIVE_RULE})"


def same_spelling(path: str, folder: str | Path | None = None) -> str:
    """One spelling for a local path however it was written: a trailing `/`, `./`, `//` and a
    `name/..` dropped (`os.path.normpath`), so `m/`, `./m` and `x/../m` are all `m`. `~` and
    `$NAME` stay as written (a portable name: they are what a file means on every machine).
    Where dropping a `name/..` would name another place (`name` a link elsewhere), the path keeps
    its `..` and loses only its trailing `/`. A spelling already in this form is returned as it
    is, so what hashes it (a job, a study) keeps its hash."""
    if not path or (short := os.path.normpath(path)) == path:
        return path
    if ".." in Path(path).parts:
        try:
            same = len({os.path.realpath(in_file(p, folder)) for p in (short, path)}) == 1
        except ValueError:  # an unset variable: nothing to compare on this machine
            same = False
        if not same:
            return path.rstrip("/") or "/"
    return short
