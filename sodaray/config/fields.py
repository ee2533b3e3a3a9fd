"""Checks every config file's fields go through, whatever the file (sweep, tuning, preset).

Each takes a `fail(where, message)` made by `failer`, so an error is one line naming the file
and the field (`sweep.yaml: algorithms[0].grid.lr: ...`): names known, types and bounds by the
dataclass the entry becomes (`sodaray.config.validation.coerce_fields`), grids counted before
they are built, names that become paths checked by `sodaray.io.paths.component`.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sodaray.config.validation import coerce_fields, field_names
from sodaray.io.paths import brief, component

Fail = Callable[[str, str], ValueError]


def failer(path: Path, error: type[ValueError]) -> Fail:
    """`fail(where, message)`: the one-line error for a field of the file at `path`."""
    return lambda where, message: error(f"{path}: {where}: {message}")


def path_name(value: Any, where: str, fail: Fail) -> str:
    """A name from the file that becomes part of a path (`sodaray.io.paths.component`)."""
    try:
        return component(value, "it")
    except ValueError as exc:
        raise fail(where, str(exc).removeprefix("it ")) from exc


def coerce_scalars(cls: type, values: dict[str, Any], fail, where: str = "") -> dict[str, Any]:
    """Fields (of the entry at `where`; default: the file's top level) by `cls`'s field types
    and declared bounds, each error naming its field."""
    out, prefix = {}, f"{where}." if where else ""
    for key, value in values.items():
        try:
            out[key] = coerce_fields(cls, {key: value})[key]
        except ValueError as exc:
            raise fail(prefix + key, str(exc).removeprefix(f"{key} ")) from exc
    return out


# Variants one grid may make: counted before anything is built (a grid of nine ten-value keys
# is a 300-byte file and a billion variants).
MAX_VARIANTS = 10_000


def grid(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    keys = list(grid)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*grid.values())]


def grid_size(grid: dict[str, list[Any]]) -> int:
    """How many combinations `grid` makes, without making them."""
    return math.prod(len(values) for values in grid.values())


def entries(data: dict, key: str, fail) -> list[dict[str, Any]]:
    entries = data[key]
    if not isinstance(entries, list) or not entries:
        raise fail(key, "a non-empty list")
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise fail(f"{key}[{i}]", "must be a mapping")
    return entries


# Keys of older files -> their names now (one name per thing: the step budget is max_steps in
# files, configs and on the command line).
RENAMED_KEYS = {"steps": "max_steps"}


def known_fields(entry: dict, known: set[str], where: str, fail) -> None:
    prefix = f"{where}." if where else ""
    for old, new in RENAMED_KEYS.items():
        if old in entry and new in known:
            raise fail(f"{prefix}{old}", f"renamed: use `{new}`")
    unknown = sorted(map(str, set(entry) - known))
    if unknown:
        field_ = brief(unknown[0]).strip("'")
        raise fail(f"{prefix}{field_}", f"unknown field (known: {', '.join(sorted(known))})")


def check_grid(grid: Any, where: str, fail) -> None:
    if not isinstance(grid, dict):
        raise fail(where, f"a mapping of field to a list of values, not {brief(grid)}")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise fail(f"{where}.{brief(key)}", "a grid entry is a non-empty list of values")
    count = grid_size(grid)
    if count > MAX_VARIANTS:
        raise fail(where, f"a grid of {count:,} variants (at most {MAX_VARIANTS:,})")


def check_positive(value: Any, where: str, fail) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise fail(where, f"a positive integer, not {value!r}")


# ---- dataclasses as plain data ------------------------------------------------------------------
_SCALARS = (int, float, str, bool, type(None))


def plain(obj: Any) -> dict[str, Any]:
    """`dataclasses.asdict(obj)`: the same dict (nested dataclasses, lists, tuples and dicts
    copied as it copies them), without its deep copy of every number and string: every job's
    hash in a plan takes its config's and objective's fields."""
    return {name: _plain(getattr(obj, name)) for name in field_names(type(obj))}


def _plain(value: Any) -> Any:
    if type(value) in _SCALARS:
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return plain(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple, as asdict
        return type(value)(*[_plain(v) for v in value])
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, dict):
        return type(value)((_plain(k), _plain(v)) for k, v in value.items())
    return copy.deepcopy(value)
