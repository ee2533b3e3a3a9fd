"""How a SODA step's transformer pass runs: op by op, or built once per shape and replayed.

Executors (`EXECUTORS`):
- "eager" (the default, on every device): PyTorch runs the pass's kernels one by one, as it
  always has.
- "graph": the pass, forward and backward, is traced once per shape (torch.compile's AOT
  autograd) and replayed from the trace. On CUDA the trace replays as a CUDA graph (the
  "cudagraphs" backend): meant as one launch for the pass where the eager step launches about
  584 kernels and idles between them (issue 41); not yet measured on a GPU. That backend (torch
  2.13's source) counts no weight as a fixed address, so each replay may first copy the weights
  into the graph's memory: `bench_invert.py --executor graph` prints the inputs copied.
  Elsewhere the trace runs the same ATen kernels eager runs ("aot_eager"), so on a CPU every
  bit is eager's (`tests/test_executor.py`); what a replay saves is launches, so there it only
  costs the trace. On a GPU, the H100 prototype's
  captured step (`benchmarks/graph_step.py`) rounded otherwise than the eager one (RESULTS.md):
  a replayed search may keep its own trajectory there; the match check stays exact.
- "compiled": torch.compile's inductor (on CUDA in its "reduce-overhead" mode: fused kernels,
  replayed as CUDA graphs), and the Adam and decay update fused into one kernel over the
  (T, V) state (`fused`: eagerly it is eight passes over it). Its fused kernels round
  differently from eager's: a search is reproducible run to run, but not bit for bit the eager
  path's. On this project's 2-core CPU it made stories260K's steps faster and the Qwen2.5-0.5B
  shape's slower (benchmarks/RESULTS.md, issue 41's executors); CPUs keep "eager" by default,
  so their results stay what they were.

A build is per shape, so both run under the scheduler's "static" policy unless told otherwise
(`default_policy`, `policy_for`): a few bucketed shapes instead of one per batch size. The
hard-max check is never run through an executor: it keeps the model's own kernels, so a
reported match is exact.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from sodaray.search.scheduler import resolve_policy

log = logging.getLogger(__name__)

EXECUTORS = ("eager", "graph", "compiled")
DEFAULT_EXECUTOR = "eager"  # results identical to every earlier sodaray's; see the docstring
# Built shapes per model: torch.compile keeps a few builds of one function (8 by default) and
# runs any further shape eagerly. The static policy's shapes (powers of two from 8 up to the
# batch cap, times a few widths) fit in this.
MAX_SHAPES = 64


def resolve_executor(name: str | None) -> str:
    """The executor's name (None: the default), or a one-line error naming the choices."""
    if name is None:
        return DEFAULT_EXECUTOR
    if name not in EXECUTORS:
        raise ValueError(f"unknown executor {name!r}; choose one of {', '.join(EXECUTORS)}")
    return name


def default_policy(executor: str) -> str:
    """The scheduler policy an executor runs under when none is asked for: replaying executors
    build one step per shape, so they want the static policy's few shapes."""
    return "exact" if resolve_executor(executor) == "eager" else "static"


def policy_for(executor: str | None, policy: str | None) -> str:
    """The scheduler policy a run takes: the one asked for, else `executor`'s (both checked)."""
    executor = resolve_executor(executor)  # checked whether or not a policy was asked for
    return resolve_policy(default_policy(executor) if policy is None else policy)


def backend(executor: str, device: torch.device) -> tuple[str, str | None] | None:
    """torch.compile's (backend, mode) for `executor` on `device`; None: run eagerly."""
    executor = resolve_executor(executor)
    cuda = device.type == "cuda"
    if executor == "graph":
        return ("cudagraphs" if cuda else "aot_eager", None)
    if executor == "compiled":
        return ("inductor", "reduce-overhead" if cuda else None)
    return None


class Executor:
    """Runs a module's forward under one executor, building it once per module (and torch.compile
    once per shape under it). `shapes`: the input shapes its built modules have run at."""

    def __init__(self, name: str | None = None) -> None:
        self.name = resolve_executor(name)
        # Per module (the model, its bf16 copy): kept as long as the executor, as the engine
        # keeps its model.
        self._built: dict[nn.Module, Callable[..., Any]] = {}
        self.shapes: set[tuple[int, ...]] = set()
        self._graphs = False  # whether a build replays CUDA graphs
        self._fused: dict[Callable[..., None], Callable[..., None]] = {}

    def step_begin(self) -> None:
        """Called before each step's passes: a CUDA-graph replay may then reuse the memory of
        the last step's outputs (all read by now), and a step of several passes is one
        generation, not a new recording each (`torch.compiler.cudagraph_mark_step_begin`)."""
        if self._graphs:
            torch.compiler.cudagraph_mark_step_begin()

    @property
    def eager(self) -> bool:
        return self.name == "eager"

    def run(self, module: nn.Module, inputs: torch.Tensor, **kwargs: Any) -> Any:
        """`module(inputs_embeds=inputs, **kwargs)`, under this executor."""
        if self.eager:
            return module(inputs_embeds=inputs, **kwargs)
        fn = self._built.get(module)
        if fn is None:
            fn = self._build(module, inputs.device)
        shape = tuple(inputs.shape)
        if shape not in self.shapes:
            self.shapes.add(shape)
            if len(self.shapes) == MAX_SHAPES:  # torch.compile's limit is per function
                log.warning(
                    "executor %s: %d shapes built; torch.compile runs further ones eagerly "
                    "(fewer batch sizes or lengths per replica keep them replayed)",
                    self.name,
                    MAX_SHAPES,
                )
        return fn(inputs_embeds=inputs, **kwargs)

    def fused(self, fn: Callable[..., None]) -> Callable[..., None]:
        """`fn` (an in-place elementwise update over the (T, V) state: Adam and decay) as one
        fused kernel under "compiled", else `fn` itself. Its row count changes as searches come
        and go, so it is built for any row count (dynamic shapes), once."""
        if self.name != "compiled":
            return fn
        built = self._fused.get(fn)
        if built is None:
            built = self._fused[fn] = torch.compile(fn, backend="inductor", dynamic=True)
        return built

    def _build(self, module: nn.Module, device: torch.device) -> Callable[..., Any]:
        chosen = backend(self.name, device)
        assert chosen is not None
        name, mode = chosen
        import torch._dynamo

        # A documented torch.compile knob (its troubleshooting guide): how many shapes of one
        # function it builds before running the rest eagerly. Raised, never lowered.
        # (`cache_size_limit` before torch renamed it.)
        config = torch._dynamo.config
        limit = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
        setattr(config, limit, max(getattr(config, limit), MAX_SHAPES))
        log.info("executor %s: building %s with torch.compile(%s)", self.name, type(module), name)
        fn = torch.compile(module, backend=name, mode=mode, dynamic=False)
        self._graphs = self._graphs or name == "cudagraphs" or mode == "reduce-overhead"
        self._built[module] = fn
        return fn
