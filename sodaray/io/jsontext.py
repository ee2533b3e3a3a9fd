"""JSON for people and their tools: what `--json` prints and the `.json` files users read.

Python's `json.dumps` writes a float that is not finite as `NaN` or `Infinity`, which strict
parsers (`jq`, Go, Rust) refuse. Every JSON sodaray prints goes through `dumps`: each
non-finite float becomes `null`, and the text is held to strict JSON. A leaf: every layer may
import it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

MAX_DEPTH = 200  # deeper than any output sodaray builds; a cycle or runaway nesting stops here


def finite(value: Any, default: Callable[[Any], Any] | None = None, _depth: int = 0) -> Any:
    """`value` with every float that is not finite replaced by None, through dicts, lists and
    tuples (a tuple becomes a list, as JSON writes it). A numpy scalar or array is taken as its
    Python value; another object goes through `default` (as `json.dumps`'s `default`) when given,
    else is left for `json.dumps` to refuse."""
    if _depth > MAX_DEPTH:
        raise ValueError(f"JSON output nested more than {MAX_DEPTH} levels deep")
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, str | int | bool):
        return value
    if isinstance(value, Mapping):
        return {k: finite(v, default, _depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v, default, _depth + 1) for v in value]
    if type(value).__module__ == "numpy" and hasattr(value, "tolist"):  # a scalar or array
        return finite(value.tolist(), default, _depth + 1)
    if default is not None:
        return finite(default(value), None, _depth + 1)
    return value


def dumps(value: Any, *, default: Callable[[Any], Any] | None = None, **options: Any) -> str:
    """`value` as strict JSON text (`json.dumps` with `options`): non-finite floats as null
    (`finite`), and any other NaN or infinity refused rather than written."""
    import json

    return json.dumps(finite(value, default), allow_nan=False, default=default, **options)
