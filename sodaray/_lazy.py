"""Lazy package attributes (PEP 562): names load their module on first use, so `sodaray --help`
and `import sodaray` do not pay for torch, Ray or Optuna. One loader for every package."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(
    package: str,
    namespace: dict[str, Any],
    names: Mapping[str, str],
    submodules: frozenset[str] = frozenset(),
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package`: `names` maps an attribute to the module that
    defines it (a loaded value is cached in `namespace`); `submodules` load as `package.<name>`."""

    def __getattr__(name: str) -> Any:
        if name in submodules:
            return importlib.import_module(f"{package}.{name}")
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(names))

    return __getattr__, __dir__
