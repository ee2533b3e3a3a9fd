"""Checks at the edges, shared by the CLI, sweep and tuning files and the library's configs.

- YAML read with the number forms YAML 1.2 and people write (`1e-3`, `1E-3`, `.5`, `5.`);
  YAML 1.1 reads `1e-3` as a string.
- Values coerced by their dataclass field's type (`float` takes `1e-3` and `3`, `int` takes
  `5.0`), NaN and infinity refused (`nan <= 0` is false, so they pass every range check), and
  held to the bounds the field declares (`field(metadata={"min": 1})`): a rule lives on its field.
- Output paths checked before the work that produces them; memory estimated before allocating.
"""

from __future__ import annotations

import functools
import math
import os
import re
import types
import typing
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

import yaml

from sodaray.io.files import MAX_NESTING, nesting_problem
from sodaray.io.paths import brief
from sodaray.objective.objectives import Objective


# ---- YAML -------------------------------------------------------------------------------------
class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads `1e-3`, `1E-3`, `1e3` and `2.5e3` as floats (YAML 1.2)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+
        |[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?
        |[-+]?[0-9][0-9_]*\.[0-9_]*)$""",
        re.X,
    ),
    list("-+0123456789."),
)


def _construct_mapping(loader: _Loader, node: yaml.MappingNode, deep: bool = False) -> Any:
    """A mapping whose keys are unique: YAML's own rule, which PyYAML does not enforce (the last
    of two `max_steps:` lines silently won)."""
    seen: dict[Any, yaml.Node] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # `<<: *base` merges keys; later keys may override them, as YAML says
        key = loader.construct_object(key_node, deep=True)
        try:
            first = seen.setdefault(key, key_node)
        except TypeError:  # an unhashable key: SafeConstructor says so itself
            continue
        if first is not key_node:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"found duplicate key {key!r} (first at line {first.start_mark.line + 1})",
                key_node.start_mark,
            )
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_Loader.add_constructor("tag:yaml.org,2002:map", lambda loader, node: _map(loader, node))


def _map(loader: _Loader, node: yaml.MappingNode) -> Any:
    data: dict[Any, Any] = {}
    yield data
    data.update(_construct_mapping(loader, node))


# A document whose aliases expand it beyond this many nodes, and beyond `ALIAS_GROWTH` nodes per
# character of its text, is refused: 359 bytes of nested aliases made a grid of 4.8 million
# variants (a "billion laughs" document), and formatting one of its values ran out of memory.
MAX_NODES = 100_000
ALIAS_GROWTH = 50


def _compose_node(loader: _Loader, parent: Any, index: Any) -> Any:
    """PyYAML composes a node by recursing into its children: `[` * 100000 ended in a
    RecursionError. Refused once the document nests more than `MAX_NESTING` levels."""
    depth = getattr(loader, "_depth", 0) + 1
    if depth > MAX_NESTING:
        mark = loader.peek_event().start_mark
        raise yaml.composer.ComposerError(None, None, nesting_problem(depth), mark)
    loader._depth = depth
    try:
        return yaml.SafeLoader.compose_node(loader, parent, index)
    finally:
        loader._depth = depth - 1


_Loader.compose_node = _compose_node  # type: ignore[method-assign]


def yaml_load(text: str) -> Any:
    """`yaml.safe_load` with YAML 1.2 floats, duplicate keys refused, and bounds: at most
    `MAX_NESTING` levels deep (as written, and as its aliases expand it), no node that contains
    itself, and a limit on how far aliases may expand the document; raises `yaml.YAMLError` on
    bad YAML, tags or any of these."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        limit = max(MAX_NODES, ALIAS_GROWTH * len(text))
        size = _expanded_size(node, limit)
        if size > limit:
            raise yaml.YAMLError(
                f"its aliases expand it to {size:,} nodes (at most {limit:,}); "
                "write the values out, or use fewer nested aliases"
            )
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _expanded_size(root: yaml.Node, limit: int) -> int:
    """Nodes in the document as its aliases expand it, counted without expanding it (each node
    once: an alias is the node it names), in a loop (no recursion: aliases may chain nodes
    deeper than Python recurses). Raises `yaml.YAMLError` where the expanded document nests
    more than `MAX_NESTING` levels or a node contains itself (`&a [*a]`). Stops counting once
    past `limit`."""
    done: dict[int, tuple[int, int]] = {}  # id -> (expanded size, depth)
    open_: set[int] = set()  # the nodes on the path being walked
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            kids = [done[id(k)] for k in _children(node)]
            size = 1 + sum(s for s, _ in kids)
            depth = (1 + max((d for _, d in kids), default=0)) if _children(node) else 0
            open_.discard(key)
            if depth > MAX_NESTING:
                raise yaml.YAMLError(f"its aliases make it {nesting_problem(depth)}")
            if size > limit:
                return size
            done[key] = (size, depth)
            continue
        if key in done:
            continue
        if key in open_:
            raise yaml.YAMLError("a node contains itself (a recursive alias such as &a [*a])")
        open_.add(key)
        stack.append((node, True))
        stack.extend((k, False) for k in _children(node) if id(k) not in done)
    return done[id(root)][0]


# ---- comma-separated lists on the command line ---------------------------------------------------
_WHOLE = re.compile(r"[0-9]+")  # ASCII digits: int() also takes "1_0", " 1" and other scripts


def split_list(text: str, what: str = "", example: str = "1,2,3") -> list[str]:
    """The items of a comma-separated list (`--tokens 1,2,3`, `--format md,csv`), each stripped
    of the spaces around it. An empty item is refused, not dropped: `1,,2` is a typo whose
    meaning is unknown, and dropping it ran `[1, 2]` as if it were what was meant. `what`
    starts the message ("lengths"; argparse names the flag itself)."""
    prefix = f"{what} " if what else ""
    if not text.strip():
        raise ValueError(f"{prefix}is empty" if what else f"empty: give {example}")
    items = [item.strip() for item in text.split(",")]
    if "" in items:
        raise ValueError(f"{prefix}{text!r} has an empty item between commas; write {example}")
    return items


def parse_int_list(text: str, what: str = "") -> list[int]:
    """Non-negative integers from a comma-separated list (`split_list`'s rule); an item that is
    not one integer in ASCII digits is refused: `"1 2"` used to lose its space and run as
    `[12]`."""
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
    if typing.get_origin(hint) is list:
        return True, (typing.get_args(hint) or (Any,))[0]
    return False, None


@functools.lru_cache(maxsize=1024)  # hints are few; `get_origin` per value was a plan's cost
def _kinds(hint: Any) -> tuple[frozenset[type], bool, tuple[Any, ...] | None]:
    """The plain types a hint allows, whether None is allowed, and Literal choices."""
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return frozenset(), False, typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        kinds: frozenset[type] = frozenset()
        optional = False
        literal: tuple[Any, ...] | None = None
        for arg in typing.get_args(hint):
            if arg is type(None):
                optional = True
                continue
            k, _, lit = _kinds(arg)
            kinds |= k
            literal = lit if lit is not None else literal
        return kinds, optional, literal
    if isinstance(hint, type):
        return frozenset({hint}), False, None
    return frozenset(), False, None


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
    if bool in kinds:
        if type(value) is int and value in (0, 1):
            return bool(value)
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be true or false, not {brief(value)}")
        return value
    if float in kinds:
        number = _number(name, value, "a number")
        check_finite(name, number)
        return float(number) if int not in kinds or isinstance(number, float) else number
    if int in kinds:
        number = _number(name, value, "an integer")
        check_finite(name, number)
        if isinstance(number, float):
            if not number.is_integer():
                raise ValueError(f"{name} must be an integer, not {brief(value)}")
            number = int(number)
        return number
    if str in kinds and not isinstance(value, str):
        raise ValueError(f"{name} must be a string, not {brief(value)}")
    return value


def _number(name: str, value: Any, what: str) -> int | float:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be {what}, not {brief(value)}")
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        text = value.strip().replace("_", "")
        try:
            return int(text)
        except ValueError:
            pass
        try:
            return float(text)
        except ValueError:
            pass
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
    """A dataclass's field types and metadata, read once per class: `get_type_hints` evaluates
    every annotation's string each call, and a sweep of 100,000 jobs made 300,000 calls (a
    `sweep plan` spent 20 of its 38 s there)."""
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
        value = getattr(obj, name)
        if type(value) is float and not math.isfinite(value):
            check_finite(name, value)


def check_objective(objective: Any) -> None:
    """What `Objective` itself does not check: finite numbers, non-negative tolerances."""
    check_fields_finite(objective)
    for name in ("atol", "rtol"):
        value = getattr(objective, name)
        if value is not None and value < 0:
            raise ValueError(f"{name} must be non-negative, not {value}")


def make_objective(data: dict[str, Any]) -> Objective:
    """An `Objective` from a mapping (YAML, CLI), coerced by field type and checked."""
    unknown = sorted(set(data) - {f.name for f in fields(Objective)})
    if unknown:
        raise ValueError(f"unknown objective field {unknown[0]!r}")
    objective = Objective(**coerce_fields(Objective, data))
    check_objective(objective)
    return objective


# ---- output paths -----------------------------------------------------------------------------
def check_output_file(path: str | Path, what: str = "--out") -> Path:
    """A file we are about to write: not a directory, its folder creatable and writable, and
    nothing there but a regular file (a link, a device node, a FIFO): said before the work,
    as `writes.write_file` would refuse it after."""
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
    probe = folder if str(folder) else Path(".")
    while not probe.exists():  # the nearest existing ancestor must be a writable folder
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise ValueError(f"{label}: {probe} is a file, not a folder")
    if probe.exists() and not os.access(probe, os.W_OK | os.X_OK):
        raise ValueError(f"{label}: folder {probe} is not writable")


# ---- devices ----------------------------------------------------------------------------------
def check_device(text: str) -> None:
    """A device this machine has: cpu, cuda[:i] (with CUDA), mps (with MPS)."""
    import torch

    try:
        device = torch.device(text)
    except (RuntimeError, ValueError) as exc:
        raise ValueError(f"--device {text}: not a device (cpu, cuda, cuda:1, mps)") from exc
    if device.type == "cpu":
        return
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"--device {text}: CUDA is not available on this machine")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(
                f"--device {text}: this machine has {torch.cuda.device_count()} CUDA device(s)"
            )
        return
    if device.type == "mps" and torch.backends.mps.is_available():
        return
    raise ValueError(f"--device {text}: not available here (use cpu or cuda)")


# ---- memory -----------------------------------------------------------------------------------
def available_memory() -> int | None:
    """Bytes of memory available to a new allocation on this machine (None when unknown)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, AttributeError):
        return None


def check_memory(
    needed: float, what: str, available: int | None = None, hint: str = "make it smaller"
) -> None:
    """Refuse before allocating when `needed` bytes exceed what the machine has."""
    available = available_memory() if available is None else available
    if available is not None and needed > available:
        raise MemoryBudgetError(
            f"{what} needs about {format_bytes(needed)} but only {format_bytes(available)} "
            f"is available; {hint}"
        )


class MemoryBudgetError(ValueError):
    """A size whose memory exceeds what the machine (or device) has."""


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


# Bytes per float32 (B, n, V) buffer, times the buffers an algorithm keeps: SODA holds Z, Adam's
# two moments, the probabilities and the gradient; GCG its one-hot gradient and candidates.
STATE_BUFFERS = 5


def dataset_bytes(lengths: list[int], per_length: int) -> float:
    """Rough peak memory of building a dataset: Python rows (ids, text, labels) and Arrow copy."""
    return float(per_length) * sum(400 + 80 * n for n in lengths)


def state_bytes(batch: int, length: int, vocab: int) -> float:
    return float(STATE_BUFFERS) * 4 * batch * length * vocab


# For a model whose config names no context: longer than any model's (and bounds every plan).
MAX_POSITIONS = 1 << 20


def check_context(model: Any, length: int, output_tokens: int) -> None:
    """The fixed context, the searched input and the observed output must fit the model."""
    limit = getattr(model, "max_positions", None) or MAX_POSITIONS
    check_positions(limit, len(getattr(model, "prefix_ids", []) or []), length, output_tokens)


def check_positions(
    limit: int, fixed: int, length: int, output_tokens: int, whose: str = "the model's"
) -> None:
    """`fixed` context positions, an input of `length` and `output_tokens` observed must fit a
    context of `limit` positions (`whose` names the model in the message: "stories260K's")."""
    total = fixed + length + output_tokens
    if total > limit:
        raise ValueError(
            f"input length {length} + {output_tokens} output tokens"
            + (f" + {fixed} fixed" if fixed else "")
            + f" = {total} positions exceed {whose} context of {limit}"
        )


def device_memory(device: Any) -> int | None:
    """Free bytes on `device` (CUDA: what the driver reports; else the machine's memory)."""
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        try:
            return int(torch.cuda.mem_get_info(device)[0])
        except (RuntimeError, AssertionError):
            return None
    return available_memory()


def check_state_memory(model: Any, batch: int, length: int, algorithm: str) -> None:
    """Refuse a (B, n, V) search state that does not fit, before allocating it."""
    vocab = int(model.vocab_size)
    if algorithm == "embedding":  # (B, n, d) state; distances in vocab chunks
        vocab = int(model.embedding_matrix.shape[1]) + 8192
    check_memory(
        state_bytes(batch, length, vocab),
        f"a search state of {batch} targets x {length} positions x {vocab}",
        device_memory(model.device),
        "lower max_batch_size or the length",
    )
