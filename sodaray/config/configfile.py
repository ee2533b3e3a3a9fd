"""Sweep and tuning files as documents: read as UTF-8 YAML (with the loader's limits), shared
pieces merged in (`include:`), and `key=value` overrides from the command line applied, all
before any field is checked, so the file and the command line are validated alike and a job's
hash covers the final values.

- `include: base.yaml` (or a list), relative to the including file: read first, in order, the
  file's own keys over them (mappings merge key by key, anything else is replaced whole), to a
  depth of `MAX_DEPTH`; a file including itself is an error. An included file's relative paths
  (the fields the caller names) that exist from its folder are rewritten relative to the top
  file's, the one folder every relative path in the document is read from.
- An override `a.b.c=VALUE` sets one field; VALUE is YAML (`0.07`, `true`, `[1, 2]`). A list
  entry is named by its name, label, id or kind (`models.qwen.bos=true`) or by its index
  (`models.0.bos=true`); names may hold dots, the longest that matches wins. An override is at
  most `MAX_OVERRIDE_CHARS` characters, its key at most `MAX_NESTING` parts.
"""

from __future__ import annotations

import os
from collections.abc import Container
from pathlib import Path
from typing import Any

import yaml

from sodaray.config.yamltext import yaml_load
from sodaray.errors import first_line
from sodaray.io.files import MAX_NESTING, read_config
from sodaray.io.paths import brief, expand_path

MAX_DEPTH = 8
# A command line's KEY=VALUE: a value, not a file (Linux passes at most 128 KiB an argument).
MAX_OVERRIDE_CHARS = 1 << 16


def read_document(
    path: str | Path,
    kind: str,
    error: type[ValueError],
    overrides: list[str] | tuple = (),
    paths: tuple[str, ...] = (),
) -> tuple[Any, Path]:
    """A config file's data with its includes merged in and `overrides` applied (as the file's
    own values); one-line `error`s naming the file or the override. `paths`: the fields that
    name files (`models.*.id`; `*`: every list entry), rebased from an included file's folder."""
    path = Path(path)
    data = read_yaml(path, kind, error)
    if isinstance(data, dict):
        data = _with_includes(data, path, kind, error, (path.resolve(),), paths)
    for text in overrides if isinstance(data, dict) else ():  # else its own check says how
        try:
            data = apply_override(data, text)
        except ValueError as exc:
            raise error(f"override {brief(text)}: {exc}") from exc
    return data, path


def read_yaml(
    path: str | Path, kind: str, error: type[ValueError] = ValueError, chain: tuple[Path, ...] = ()
) -> Any:
    """A `kind` file's YAML data (`yaml_load`), one-line `error`s naming the file (and, in
    `chain`, the files that include it)."""
    where = "(included by " + str(chain[-1]) + ")" if chain else ""
    text = read_config(path, f"{kind} file", error, where)  # a regular file, size-limited
    try:
        return yaml_load(text)  # YAML 1.2 numbers (1e-3 a float), limits, unique keys
    except yaml.YAMLError as exc:
        raise error(f"{path}: not valid YAML ({first_line(exc)})") from exc


def _with_includes(
    data: dict,
    path: Path,
    kind: str,
    error: type[ValueError],
    chain: tuple[Path, ...],
    paths: tuple[str, ...] = (),
) -> dict:
    names = data.get("include")
    if names is None:
        return data
    names = [names] if isinstance(names, str) else names
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise error(f"{path}: include: a file name or a list of them, not {brief(names)}")
    for name in names:
        if "\0" in name:  # the OS refuses it with a message that names no file
            raise error(f"{path}: include: {brief(name)}: a path cannot hold a NUL byte")
    if len(chain) > MAX_DEPTH:
        raise error(f"{path}: include: more than {MAX_DEPTH} files deep")
    merged: dict = {}
    for name in names:
        child = (path.parent / Path(name).expanduser()).resolve()
        if child in chain:
            raise error(f"{path}: include: {name} includes itself")
        piece = read_yaml(child, kind, error, (*chain, path))
        if not isinstance(piece, dict):
            raise error(f"{child}: an included file is a mapping of fields")
        piece = _with_includes(piece, child, kind, error, (*chain, child), paths)
        for field in paths:
            piece = _rebase(piece, field.split("."), child.parent, path.parent.resolve())
        merged = merge(merged, piece)
    return merge(merged, {k: v for k, v in data.items() if k != "include"})


def _rebase(node: Any, parts: list[str], source: Path, target: Path) -> Any:
    """`node` with the path at `parts` rewritten from `source` to `target` (copied along it)."""
    if not parts:
        return _moved(node, source, target) if isinstance(node, str) else node
    head, rest = parts[0], parts[1:]
    if head == "*":
        return [_rebase(e, rest, source, target) for e in node] if isinstance(node, list) else node
    if isinstance(node, dict) and head in node:
        return {**node, head: _rebase(node[head], rest, source, target)}
    if isinstance(node, str) and parts == ["id"]:  # a model entry given as its bare id
        return _moved(node, source, target)
    return node


def _moved(value: str, source: Path, target: Path) -> str:
    """A relative path that exists from `source`, written relative to `target`; anything else
    (absolute, `~` and `$VAR` paths, hub ids, paths missing from `source`) as it is."""
    if value.startswith(("~", "$")) or os.path.isabs(value):
        return value
    try:
        expanded = expand_path(value)
    except ValueError:
        return value
    where = source / expanded
    return os.path.relpath(where, target) if where.exists() else value


def merge(base: dict, top: dict) -> dict:
    """`top` over `base`: mappings key by key, anything else replaced."""
    out = dict(base)
    for key, value in top.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = merge(out[key], value) if both else value
    return out


def apply_override(data: dict, text: str) -> dict:
    """`data` with one `a.b.c=VALUE` applied (a copy along the path; the rest shared)."""
    if "=" not in text:
        raise ValueError("write KEY=VALUE (e.g. max_steps=500)")
    key, _, raw = text.partition("=")
    parts = key.strip().split(".")
    if not key.strip() or any(not p for p in parts):
        raise ValueError("the key is empty or has an empty part")
    if len(parts) > MAX_NESTING:
        raise ValueError(f"the key has {len(parts):,} parts (at most {MAX_NESTING})")
    return _set(data, parts, override_value(text, raw), [])


def override_value(text: str, raw: str) -> Any:
    """The YAML value of an override `text` (`raw`: its part after `=`), held to
    `MAX_OVERRIDE_CHARS` and YAML's bounds; a one-line ValueError."""
    if len(text) > MAX_OVERRIDE_CHARS:
        raise ValueError(
            f"{len(text):,} characters (an override is at most {MAX_OVERRIDE_CHARS:,})"
        )
    try:
        return yaml_load(raw)
    except yaml.YAMLError as exc:
        raise ValueError(f"not a YAML value ({first_line(exc)})") from exc


def _set(node: Any, parts: list[str], value: Any, done: list[str]) -> Any:
    if not parts:
        return value
    where = ".".join(done) or "the file"
    if isinstance(node, dict):
        key, used = _longest(parts, node)
        key = parts[0] if key is None else key
        child = node.get(key)
        if child is None and len(parts) > used:
            child = {}  # `params.temperature=0.07` where the entry has no params yet
        return {**node, key: _set(child, parts[used:], value, [*done, key])}
    if isinstance(node, list):
        index, used = _entry(node, parts, where)
        out = list(node)
        out[index] = _set(node[index], parts[used:], value, [*done, ".".join(parts[:used])])
        return out
    raise ValueError(f"{where} is {brief(node)}, not a mapping or a list to go into")


def _longest(parts: list[str], names: Container) -> tuple[str | None, int]:
    """The longest run of `parts` joined by dots that is one of `names`, and its length."""
    for used in range(len(parts), 0, -1):
        candidate = ".".join(parts[:used])
        if candidate in names:
            return candidate, used
    return None, 1


def _entry(entries: list, parts: list[str], where: str) -> tuple[int, int]:
    """Which list entry `parts` starts with: an index, or the name of one entry."""
    if parts[0].isdigit():
        index = int(parts[0])
        if index >= len(entries):
            raise ValueError(f"{where} has {len(entries)} entries, not {index + 1}")
        return index, 1
    labels = [_labels(e) for e in entries]
    every = set().union(*labels)
    name, used = _longest(parts, every)
    if name is None:
        have = ", ".join(sorted(every)) or "none named"
        raise ValueError(f"{where} has no entry named {parts[0]!r} (have: {have})")
    hits = [i for i, names in enumerate(labels) if name in names]
    if len(hits) > 1:
        raise ValueError(f"{where}: {len(hits)} entries are named {name!r}; use an index")
    return hits[0], used


def _labels(entry: Any) -> set[str]:
    """The names an entry answers to: `name`, `label`, `kind`, a model's id and its label."""
    if isinstance(entry, str):
        return {entry}
    if not isinstance(entry, dict):
        return set()
    names = {str(entry[k]) for k in ("name", "label", "kind") if isinstance(entry.get(k), str)}
    if isinstance(ident := entry.get("id"), str):
        names |= {ident, Path(ident.rstrip("/")).name.removesuffix(".gguf")}
    return names
