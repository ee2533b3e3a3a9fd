"""YAML as config files are read: YAML 1.2 floats, duplicate keys refused, and bounds on how deep a
document nests and how far its aliases expand it."""

from __future__ import annotations

import re
from typing import Any

import yaml

from sodaray.io.files import MAX_NESTING, nesting_problem


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


def _map(loader: _Loader, node: yaml.MappingNode) -> Any:
    """A mapping whose keys are unique: YAML's own rule, which PyYAML does not enforce (the last
    of two `max_steps:` lines would silently win)."""
    data: dict[Any, Any] = {}
    yield data
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
    data.update(yaml.SafeLoader.construct_mapping(loader, node))


_Loader.add_constructor("tag:yaml.org,2002:map", _map)


# A document whose aliases expand it beyond this many nodes, and beyond `ALIAS_GROWTH` nodes per
# character of its text, is refused (a "billion laughs" document).
MAX_NODES = 100_000
ALIAS_GROWTH = 50


def _compose_node(loader: _Loader, parent: Any, index: Any) -> Any:
    """PyYAML composes a node by recursing into its children (`[` * 100000 would end in a
    RecursionError): refused once the document nests more than `MAX_NESTING` levels."""
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
    """`yaml.safe_load` with YAML 1.2 floats, duplicate keys refused, at most `MAX_NESTING`
    levels deep (as written and as aliases expand it), no node that contains itself, and a limit
    on how far aliases expand it; `yaml.YAMLError` on bad YAML, tags or any of these."""
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
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


def _expanded_size(root: yaml.Node, limit: int) -> int:
    """Nodes in the document as its aliases expand it, counted without expanding it and without
    recursion (aliases may chain deeper than Python recurses), stopping once past `limit`.
    `yaml.YAMLError` where it nests more than `MAX_NESTING` levels or a node contains itself."""
    done: dict[int, tuple[int, int]] = {}  # id -> (expanded size, depth)
    open_: set[int] = set()  # the nodes on the path being walked
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            kids = [done[id(k)] for k in _children(node)]
            size = 1 + sum(s for s, _ in kids)
            depth = 1 + max(d for _, d in kids) if kids else 0
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
