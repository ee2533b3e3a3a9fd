"""The executor (`sodaray.search.executor`): what runs SODA's transformer passes. The promise
tested here: the replayed path ("graph", torch.compile's trace of the pass, forward and backward,
built once per static shape) gives the eager path's results bit for bit on a CPU, and takes the
static policy's shapes; names it does not know are one-line errors everywhere they enter."""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import pytest
import torch
from conftest import tiny_model

import sodaray
from sodaray.search.executor import (
    DEFAULT_EXECUTOR,
    EXECUTORS,
    MAX_SHAPES,
    Executor,
    backend,
    default_policy,
    resolve_executor,
)
from sodaray.search.scheduler import MIN_BATCH


def test_names_backends_and_policies():
    """Eager by default; each replaying executor's torch.compile backend per device (a CUDA
    graph on a GPU, the eager kernels from the trace on a CPU); the static policy under any
    executor that builds a step per shape."""
    assert DEFAULT_EXECUTOR == "eager" and resolve_executor(None) == "eager"
    assert EXECUTORS == ("eager", "graph", "compiled")
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert backend("eager", cpu) is None and backend("eager", cuda) is None
    assert backend("graph", cpu) == ("aot_eager", None)
    assert backend("graph", cuda) == ("cudagraphs", None)
    assert backend("compiled", cpu) == ("inductor", None)
    assert backend("compiled", cuda) == ("inductor", "reduce-overhead")
    assert [default_policy(e) for e in EXECUTORS] == ["exact", "static", "static"]
    with pytest.raises(ValueError, match=r"^unknown executor 'fast'; choose one of eager, graph"):
        resolve_executor("fast")


def test_the_engine_and_invert_check_their_executor():
    """The engine takes the executor's policy unless one is asked for; a bad name fails before
    any work, from the engine, from `invert`, and from the CLI's choices (the same names)."""
    from sodaray.cli import build_parser
    from sodaray.search.engine import Engine

    gpu = SimpleNamespace(device=torch.device("cuda"))  # all the constructor reads of a model
    assert Engine(gpu).executor.name == "eager" and Engine(gpu).policy == "exact"
    assert Engine(gpu, executor="graph").policy == "static"
    assert Engine(gpu, executor="graph", policy="exact").policy == "exact"
    with pytest.raises(ValueError, match="unknown executor"):
        Engine(gpu, executor="cuda-graph")
    model = tiny_model("qwen2")
    targets = sodaray.make_targets(model, [[3, 5]])
    for policy in (None, "exact"):  # checked whether or not a policy is asked for
        with pytest.raises(ValueError, match="unknown executor 'jit'"):
            cfg = sodaray.SodaConfig(max_steps=2)
            sodaray.invert(model, targets, cfg, executor="jit", policy=policy)
    parser = build_parser()
    invert = next(
        a
        for a in parser._subparsers._group_actions[0].choices["invert"]._actions  # noqa: SLF001
        if "--executor" in a.option_strings
    )
    assert tuple(invert.choices) == EXECUTORS and invert.default is None


def static(batch: int) -> bool:
    return batch >= MIN_BATCH and batch & (batch - 1) == 0


def search(model, tokens, cfg, executor: str):
    """The engine under `executor`, after searching `tokens`' targets at their true lengths,
    and each result's (tokens, found, steps, final loss)."""
    from sodaray.search.engine import Engine, Work

    engine = Engine(model, executor=executor)
    work = Work(sodaray.make_targets(model, tokens), cfg, [(len(t),) for t in tokens])
    engine.submit(work)
    engine.run()
    return engine, [(r.tokens, r.found, r.steps, r.final_loss) for r in work.ordered()]


@pytest.mark.parametrize("kind", ["qwen2", "gpt-neo"])
def test_the_replayed_pass_gives_the_eager_results(kind, one_thread):
    """Mixed-length searches with resets, re-draws and finds, run eagerly and through the
    "graph" executor (its pass traced once per static shape and replayed): the same tokens,
    finds, steps and losses, bit for bit. The replayed path really ran: it saw only static
    shapes (power-of-two batches), and torch.compile built graphs for them. Qwen2 takes the
    width-invariant attention (lengths share a pass, widths padded); GPT-Neo keeps its own, so
    it runs one pass per length."""
    from torch._dynamo.utils import counters

    model = tiny_model(kind)
    tokens = [[(7 * i + 3 * j) % 64 for j in range(1 + i % 3)] for i in range(9)]
    cfg = sodaray.SodaConfig(max_steps=60, reinit_period=25, reset_period=10, seed=5)
    outcomes, engines = {}, {}
    graphs = counters["stats"]["unique_graphs"]
    for executor in ("eager", "graph"):
        engines[executor], outcomes[executor] = search(model, tokens, cfg, executor)
    assert outcomes["graph"] == outcomes["eager"]
    assert any(o[1] for o in outcomes["eager"]) and not all(o[1] for o in outcomes["eager"])
    assert engines["eager"].executor.shapes == set()  # eager builds nothing
    shapes = engines["graph"].executor.shapes
    # A static batch, plus the padding item a pass of every slot carries for the guard row.
    assert shapes and all(static(b) or static(b - 1) for b, *_ in shapes)
    # One build per shape: nothing in the pass (the attention's bias cache) makes a shape
    # build twice.
    assert counters["stats"]["unique_graphs"] - graphs == len(shapes)


def test_the_cuda_backend_traces_and_marks_steps_on_a_cpu_too(one_thread, monkeypatch):
    """What "graph" builds on a GPU (the `cudagraphs` backend, a step mark before each step's
    passes), here on a CPU: the backend traces the pass, forward and backward, then skips the
    capture (it counts each skip), and the eager results stand. This covers the choice of
    backend, the trace and the step marks; the capture, its memory pool and its replays need
    a GPU (`benchmarks/gpu_session.sh` stage 1, which prints the skips and the inputs copied)."""
    from torch._dynamo.utils import counters

    import sodaray.search.executor as executor_module

    real = executor_module.backend
    monkeypatch.setattr(
        executor_module, "backend", lambda name, device: real(name, torch.device("cuda"))
    )
    marks = []
    real_mark = torch.compiler.cudagraph_mark_step_begin
    monkeypatch.setattr(
        torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1) or real_mark()
    )
    model = tiny_model("qwen2")
    tokens = [[(5 * i + 2 * j) % 64 for j in range(1 + i % 3)] for i in range(6)]
    cfg = sodaray.SodaConfig(max_steps=30, reinit_period=12, seed=3)
    outcomes, counts = {}, {}
    skips = counters["inductor"]["cudagraph_skips"]
    for executor in ("eager", "graph"):
        engine, outcomes[executor] = search(model, tokens, cfg, executor)
        counts[executor] = (len(marks), engine.take_occupancy().steps)
        marks.clear()
    assert outcomes["graph"] == outcomes["eager"]
    steps = counts["graph"][1]
    # A mark before every step after the first, whose pass built the graphs (nothing before it
    # to mark); none under eager.
    assert counts["eager"][0] == 0 and steps > 1 and counts["graph"] == (steps - 1, steps)
    assert counters["inductor"]["cudagraph_skips"] > skips  # the backend ran, and skipped


def test_an_executor_builds_each_module_once(one_thread):
    """One build per module, however many calls and shapes; eager runs the module itself."""
    model = tiny_model("qwen2")
    module = model.model.base_model
    ex = Executor("graph")
    x = torch.randn(MIN_BATCH, 3, model.model.config.hidden_size)
    first = ex.run(module, x, use_cache=False).last_hidden_state
    again = ex.run(module, x, use_cache=False).last_hidden_state
    wider = ex.run(module, torch.randn(MIN_BATCH, 4, x.shape[-1]), use_cache=False)
    assert len(ex._built) == 1  # noqa: SLF001
    assert torch._dynamo.config.recompile_limit >= MAX_SHAPES  # the static shapes fit
    assert ex.shapes == {(MIN_BATCH, 3, x.shape[-1]), (MIN_BATCH, 4, x.shape[-1])}
    assert torch.equal(first, again) and wider.last_hidden_state.shape[1] == 4
    eager = Executor().run(module, x, use_cache=False).last_hidden_state
    assert torch.equal(eager, first)


@pytest.mark.skipif(
    not any(shutil.which(c) for c in ("c++", "g++", "clang++")),
    reason="inductor compiles C++ on a CPU: no C++ compiler here",
)
def test_compiled_fuses_the_update_once_for_any_row_count(one_thread):
    """Under "compiled", SODA's Adam-and-decay update is one inductor build, whatever the row
    count (searches come and go); its values are eager's up to rounding (a fused kernel rounds
    otherwise). Under the others it is the eager function itself."""
    from torch._dynamo.utils import counters

    from sodaray.search.soda import _adam_decay

    assert Executor("eager").fused(_adam_decay) is _adam_decay
    assert Executor("graph").fused(_adam_decay) is _adam_decay
    ex = Executor("compiled")
    graphs = counters["stats"]["unique_graphs"]
    gen = torch.Generator().manual_seed(0)
    for rows in (5, 7, 12):
        state = [torch.randn(rows, 64, generator=gen) for _ in range(4)]  # z, grad, m, v
        state[3].abs_()  # a second moment
        column = [torch.rand(rows, 1, generator=gen) * 0.1 + 0.01 for _ in range(5)]
        eager = [t.clone() for t in state]
        _adam_decay(*eager, *column, None)
        ex.fused(_adam_decay)(*state, *column, None)
        for got, want in zip(state[:1] + state[2:], eager[:1] + eager[2:], strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        assert not torch.equal(state[0], eager[0] * 0)  # it moved
    assert len(ex._fused) == 1  # noqa: SLF001
    assert 1 <= counters["stats"]["unique_graphs"] - graphs <= 2


@pytest.mark.skipif(
    not any(shutil.which(c) for c in ("c++", "g++", "clang++")),
    reason="inductor compiles C++ on a CPU: no C++ compiler here",
)
def test_compiled_searches_are_reproducible(one_thread):
    """The "compiled" executor end to end (inductor's pass and fused update): two engines, the
    same results, and inputs found (the match check, eager, confirms them)."""
    model = tiny_model("qwen2")
    tokens = [[(11 * i) % 64] for i in range(4)]  # one length: one shape to build
    cfg = sodaray.SodaConfig(max_steps=40, seed=2)
    outcomes = [search(model, tokens, cfg, "compiled")[1] for _ in range(2)]
    assert outcomes[0] == outcomes[1]
    assert any(found for _, found, _, _ in outcomes[0])
