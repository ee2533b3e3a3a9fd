"""How a SODA step runs: eagerly, or captured once per shape as a CUDA graph and replayed.

Executors (`EXECUTORS`):
- "graph" (the default): on CUDA, the whole step is captured once per shape with
  `torch.cuda.graph` and replayed (the weights read where they lie, every other input a
  persistent buffer the host writes between replays). The first step at a shape runs eagerly
  on a side stream (the warm-up capture asks for), then the shape is captured. A model whose
  step cannot be captured runs eagerly, with one warning. On a CPU the same function runs eagerly.
- "eager": the step's kernels one by one on every device.

The two run the same function, so on a CPU they agree bit for bit. On a GPU a captured kernel
may round otherwise than its eager twin (a trajectory of its own, repeated exactly from run to
run); the confirm never runs in a graph, so a reported match is exact either way. The
scheduler's policy follows from the executor and the device (`policy_for`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import torch

from sodaray.search.engine.scheduler import check_policy

log = logging.getLogger(__name__)
T = TypeVar("T")

EXECUTORS = ("eager", "graph")
DEFAULT_EXECUTOR = "graph"  # captured on CUDA; on a CPU the same step as "eager"
# Captured shapes kept per executor (a run uses a handful); past this the least recently used
# is dropped, and built again if it comes back.
MAX_SHAPES = 32


def resolve_executor(name: str | None) -> str:
    """The executor's name (None: the default), or a one-line error naming the choices."""
    if name is None:
        return DEFAULT_EXECUTOR
    if name not in EXECUTORS:
        raise ValueError(f"unknown executor {name!r}; choose one of {', '.join(EXECUTORS)}")
    return name


def captures(executor: str | None, device: torch.device | str | None) -> bool:
    """Whether `executor` captures steps on `device` (CUDA graphs: CUDA only)."""
    kind = torch.device(device).type if device is not None else "cpu"
    return resolve_executor(executor) == "graph" and kind == "cuda"


def policy_for(
    executor: str | None, policy: str | None = None, device: torch.device | str | None = None
) -> str:
    """The scheduler policy a run of `executor` on `device` takes: "static" where it captures
    steps, else "exact"; `policy` instead where one is given. Both checked."""
    derived = "static" if captures(executor, device) else "exact"  # checks the executor
    return check_policy(derived if policy is None else policy)


class Executor:
    """Runs a step function under one executor: eagerly, or (on CUDA, "graph") captured once per
    key and replayed. `builds` lists each capture's key and seconds (warm-up step included)."""

    def __init__(
        self, name: str | None = None, what: str = "SODA steps", max_shapes: int = MAX_SHAPES
    ) -> None:
        self.name = resolve_executor(name)
        self.what, self.max_shapes = what, max_shapes  # what it runs (for its warning)
        self._graphs: dict[Hashable, tuple[torch.cuda.CUDAGraph, Any, tuple[Any, ...]]] = {}
        self._pool: object | None = None
        self._side: torch.cuda.Stream | None = None
        self.builds: list[tuple[Hashable, float]] = []
        self.replays = 0
        self.refused: str | None = None  # why this run's steps could not be captured

    def captures(self, device: torch.device) -> bool:
        return self.refused is None and captures(self.name, device)

    def run(self, key: Hashable | None, step: Callable[[], T], device: torch.device) -> T:
        """`step()` once, and what it returns: replayed from its capture under `key`, or
        captured now (after running it eagerly as the warm-up), or eagerly (key None, or no
        capture here)."""
        if key is None or not self.captures(device):
            return step()
        held = self._graphs.pop(key, None)
        if held is not None:
            self._graphs[key] = held  # the most recently used last: the oldest goes first
            held[0].replay()
            self.replays += 1
            return held[1]
        began = time.perf_counter()
        if self._side is None:  # one warm-up stream: each new stream gets its own cuBLAS workspace
            self._side = torch.cuda.Stream(device)
        side = self._side
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            out = step()  # this step's real work, and the warm-up the capture needs
        torch.cuda.current_stream(device).wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        try:
            # Every intermediate of a step is dead when it ends (what the host reads is copied
            # out before the next replay), so the shapes' graphs share one memory pool.
            with torch.cuda.graph(graph, pool=self._pool):
                outputs = step()
        except Exception as exc:  # a model whose forward cannot be captured: eager from now
            torch.cuda.synchronize(device)
            self.refused = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            self._graphs.clear()
            self._pool = None
            log.warning(
                "%s run eagerly: this model's cannot be captured (%s)", self.what, self.refused
            )
            return out
        torch.cuda.synchronize(device)
        seconds = time.perf_counter() - began
        if len(self._graphs) >= self.max_shapes:  # others stay: the shared pool keeps a user
            self._graphs.pop(next(iter(self._graphs)))
        # The caches a step reads (attention biases, masks, zero rows, positions) are pinned
        # with its graph: a replay reads them where the capture found them.
        self._graphs[key] = (graph, outputs, pinned_caches())
        self.builds.append((key, seconds))
        shape = key[:3] if isinstance(key, tuple) else key
        held = len(self._graphs)
        log.info("captured a SODA step (shape %s) in %.2f s; %d shapes held", shape, seconds, held)
        return out

    def forget(self, owner: Hashable) -> None:
        """Drop `owner`'s captures (keys begin with their owner). Where none is left, the next
        capture takes a fresh pool: one into a pool dropped with its last graph fails."""
        for key in [k for k in self._graphs if isinstance(k, tuple) and k[:1] == (owner,)]:
            del self._graphs[key]
        if not self._graphs:
            self._pool = None


def pinned_caches() -> tuple[Any, ...]:
    """The tensors the model code caches between calls, held so that a cache cleared or
    regrown later cannot free memory a captured step reads."""
    from sodaray.model import attention, padding

    return tuple(
        tuple(cache.values())
        for cache in (attention._BIAS, attention._PREPARED, padding._ZEROS, padding._POSITIONS)
    )
