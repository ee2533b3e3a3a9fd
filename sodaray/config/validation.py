"""Checks at the edges, shared by the CLI, sweep and tuning files and the library's configs.

- Values coerced by their dataclass field's type (`float` takes `1e-3` and `3`, `int` takes
  `5.0`), NaN and infinity refused (`nan <= 0` is false, so they pass every range check), and
  held to the bounds the field declares (`field(metadata={"min": 1})`): a rule lives on its field.
- Comma-separated lists from the command line, and output paths checked before the work that
  produces them.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import re
import types
import typing
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

from sodaray.io.paths import brief
from sodaray.objective.objectives import Objective

# ---- comma-separated lists on the command line ---------------------------------------------------
_WHOLE = re.compile(r"[0-9]+")  # ASCII digits: int() also takes "1_0", " 1" and other scripts


def split_list(text: str, what: str = "", example: str = "1,2,3") -> list[str]:
    """The stripped items of a comma-separated list (`--tokens 1,2,3`); an empty item (`1,,2`) is
    refused, not dropped. `what` starts the message ("lengths"; argparse names the flag)."""
    prefix = f"{what} " if what else ""
    if not text.strip():
        raise ValueError(f"{prefix}is empty" if what else f"empty: give {example}")
    items = [item.strip() for item in text.split(",")]
    if "" in items:
        raise ValueError(f"{prefix}{text!r} has an empty item between commas; write {example}")
    return items


def parse_int_list(text: str, what: str = "") -> list[int]:
    """Non-negative integers from a comma-separated list (`split_list`'s rule); an item that is
    not one integer in ASCII digits is refused (`"1 2"` is not `[12]`)."""
    items = split_list(text, what)
    for item in items:
        if not _WHOLE.fullmatch(item):
            where = f" (in {text!r})" if item != text.strip() else ""
            raise ValueError(
                f"{what + ' ' if what else ''}{item!r}{where} is not a non-negative integer; "
                "separate numbers with commas: 1,2,3"
            )
    return [int(item) for item in items]


# ---- numbers by field type --------------------------------------------------------------------
def check_finite(name: str, value: Any) -> None:
    """NaN and infinity pass every range check; refuse them by name."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, not {value}")


@functools.lru_cache(maxsize=1024)
def _list_of(hint: Any) -> tuple[bool, Any]:
    """Whether a hint is `list[...]`, and its item's hint."""
    is_list = typing.get_origin(hint) is list
    return is_list, (typing.get_args(hint) or (Any,))[0] if is_list else None


@functools.lru_cache(maxsize=1024)  # hints are few, values many
def _kinds(hint: Any) -> tuple[frozenset[type], bool, tuple[Any, ...] | None]:
    """The plain types a hint allows, whether None is allowed, and Literal choices."""
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return frozenset(), False, typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        parts = [_kinds(arg) for arg in typing.get_args(hint) if arg is not type(None)]
        literal = next((lit for _, _, lit in reversed(parts) if lit is not None), None)
        kinds = frozenset[type]().union(*(k for k, _, _ in parts))
        return kinds, type(None) in typing.get_args(hint), literal
    return frozenset({hint} if isinstance(hint, type) else ()), False, None


def coerce_value(name: str, value: Any, hint: Any) -> Any:
    """`value` as the field's type: numbers from numeric strings and ints for floats,
    integral floats for ints; NaN, infinity, bools for numbers and non-numbers refused."""
    is_list, item = _list_of(hint)
    if is_list:
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{name} must be a list, not {brief(value)}")
        return [coerce_value(f"{name}[{i}]", v, item) for i, v in enumerate(value)]
    kinds, optional, literal = _kinds(hint)
    kind = type(value)
    if kind in kinds and (kind is not float or math.isfinite(value)):
        return value  # already the field's type (a float field's int is made a float below)
    if value is None:
        if optional:
            return None
        raise ValueError(f"{name} must be set, not null")
    if literal is not None and not kinds:
        if value not in literal:
            choices = ", ".join(map(str, literal))
            raise ValueError(f"{name} must be one of {choices}, not {brief(value)}")
        return value
    if bool in kinds:  # a bool value returned above
        if type(value) is int and value in (0, 1):
            return bool(value)
        raise ValueError(f"{name} must be true or false, not {brief(value)}")
    if float in kinds or int in kinds:
        number = _number(name, value, "a number" if float in kinds else "an integer")
        check_finite(name, number)
        if float in kinds:
            return float(number) if int not in kinds or isinstance(number, float) else number
        if isinstance(number, float) and not number.is_integer():
            raise ValueError(f"{name} must be an integer, not {brief(value)}")
        return int(number) if isinstance(number, float) else number
    if str in kinds and not isinstance(value, str):
        raise ValueError(f"{name} must be a string, not {brief(value)}")
    return value


def _number(name: str, value: Any, what: str) -> int | float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        text = value.strip().replace("_", "")
        for parse in (int, float):
            with contextlib.suppress(ValueError):
                return parse(text)
    raise ValueError(f"{name} must be {what}, not {brief(value)}")


def coerce_fields(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """A copy of `data` with each value coerced by `cls`'s (a dataclass) field type and checked
    against the bounds the field declares (`field(metadata=AT_LEAST_1)`); keys that are not
    fields are left for the caller to report."""
    hints, meta = _field_rules(cls)
    return {
        k: in_bounds(k, coerce_value(k, v, hints[k]), meta[k]) if k in meta and k in hints else v
        for k, v in data.items()
    }


@functools.cache
def _field_rules(cls: type) -> tuple[dict[str, Any], dict[str, Any]]:
    """A dataclass's field types and metadata, read once per class (`get_type_hints` is slow)."""
    assert is_dataclass(cls)
    return typing.get_type_hints(cls), {f.name: f.metadata for f in fields(cls)}


# Bounds a dataclass field declares in its metadata: `min` inclusive, `above` exclusive.
AT_LEAST_1 = {"min": 1}  # counts and step budgets


def in_bounds(name: str, value: Any, bounds: typing.Mapping[str, Any]) -> Any:
    """`value` (None passes) within the field's declared bounds."""
    if value is not None and "min" in bounds and value < bounds["min"]:
        raise ValueError(f"{name} must be at least {bounds['min']}, not {brief(value)}")
    if value is not None and "above" in bounds and not value > bounds["above"]:
        raise ValueError(f"{name} must be above {bounds['above']}, not {brief(value)}")
    return value


@functools.cache
def field_names(cls: type) -> tuple[str, ...]:
    """A dataclass's field names, read once per class."""
    return tuple(f.name for f in fields(cls))


def check_fields_finite(obj: Any) -> None:
    """Every float field of a dataclass instance is finite."""
    for name in field_names(type(obj)):
        if type(value := getattr(obj, name)) is float:
            check_finite(name, value)


def make_objective(data: dict[str, Any]) -> Objective:
    """An `Objective` from a mapping (YAML, CLI), coerced by field type and checked for what
    `Objective` itself does not check: finite numbers, non-negative tolerances."""
    unknown = sorted(set(data) - set(field_names(Objective)))
    if unknown:
        raise ValueError(f"unknown objective field {unknown[0]!r}")
    objective = Objective(**coerce_fields(Objective, data))
    check_fields_finite(objective)
    for name in ("atol", "rtol"):
        if (value := getattr(objective, name)) is not None and value < 0:
            raise ValueError(f"{name} must be non-negative, not {value}")
    return objective


# ---- output paths -----------------------------------------------------------------------------
def check_output_file(path: str | Path, what: str = "--out") -> Path:
    """A file we are about to write: not a directory, its folder creatable and writable, nothing
    there but a regular file: refused before the work, as `writes.write_file` would after."""
    from sodaray.io.writes import REGULAR, refusal, what_is_at

    if not str(path).strip():  # Path("") is ".", a folder: say what is wrong
        raise ValueError(f"{what}: empty path")
    path = Path(path).expanduser()
    kind = what_is_at(path.parent, path) if path.parent.is_dir() else None
    if kind not in (None, REGULAR, "a directory"):
        raise ValueError(f"{what} {refusal(path, kind)}")
    if path.is_dir():
        raise ValueError(f"{what} {path}: is a directory, not a file")
    _check_writable_folder(path.parent, f"{what} {path}")
    return path


def check_output_dir(path: str | Path, what: str = "--out") -> Path:
    """A folder we are about to write into: not a file, creatable and writable."""
    if not str(path).strip():  # Path("") is the working folder: never what was meant
        raise ValueError(f"{what}: empty path")
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"{what} {path}: exists and is not a folder")
    _check_writable_folder(path, f"{what} {path}")
    return path


def _check_writable_folder(folder: Path, label: str) -> None:
    probe = folder
    while not probe.exists() and probe.parent != probe:  # the nearest existing ancestor
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise ValueError(f"{label}: {probe} is a file, not a folder")
    if probe.exists() and not os.access(probe, os.W_OK | os.X_OK):
        raise ValueError(f"{label}: folder {probe} is not writable")
