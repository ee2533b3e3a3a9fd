"""The scheduler (`sodaray.search.engine.scheduler`): its plans, as pure functions, and the one
promise
the engine makes about them: a policy changes the shapes a step runs at, never a result."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import tiny_model
from soda_ops import passes

import sodaray
from sodaray.search.engine.scheduler import (
    CAPTURE_SHAPES,
    CaptureShapes,
    Scheduler,
    admit,
    capacity,
    pick_replica,
    plan_passes,
    static_batch,
    static_rows,
    static_width,
)

MIN_BATCH = CAPTURE_SHAPES.min_batch


def test_plan_passes_picks_the_cheapest_split():
    """Cost of a split: overhead per pass + slots x (fixed + the pass's longest length)."""
    lengths = np.array([1] * 30 + [10] * 2)

    def cost(passes, overhead, fixed=1):
        return sum(overhead + len(p) * (fixed + lengths[p].max()) for p in passes)

    # Cheap passes: the two long inputs get their own (30 x 2 + 2 x 11 + 2 x 5 = 92 < 352).
    two = plan_passes(lengths, 1, 5.0)
    assert sorted(len(p) for p in two) == [2, 30] and cost(two, 5.0) == 92
    # Dear passes (GPU-like): one pass for all, padding included (300 + 352 < 600 + 82).
    one = plan_passes(lengths, 1, 300.0)
    assert len(one) == 1 and cost(one, 300.0) < cost(two, 300.0)
    # Without mixing, one pass per length whatever the overhead; every slot exactly once.
    split = plan_passes(np.array([3, 1, 3, 2]), 1, 1e6, mix=False)
    assert [sorted(p.tolist()) for p in split] == [[1], [3], [0, 2]]
    assert plan_passes(np.array([], dtype=np.int64), 1, 1.0) == []


def test_exact_passes_run_at_their_own_shape():
    lengths = np.array([3, 1, 3, 2, 9])
    plans = Scheduler("exact", overhead=0.0).passes(lengths, fixed=1)
    assert sorted(np.concatenate([p.slots for p in plans]).tolist()) == [0, 1, 2, 3, 4]
    for p in plans:
        assert p.batch == len(p.slots) and p.width == lengths[p.slots].max()


def test_static_passes_come_in_few_shapes_that_hold_their_slots():
    """Over 2,000 random batches (1-1,000 slots of lengths 1-40), the static policy runs every
    pass at a batch that is a power of two from MIN_BATCH and a width that is a power of two up
    to the table's width step or a multiple of it, at least the pass's own: few shapes in all,
    each built once and replayed. A short input's width at most doubles."""
    rng = np.random.default_rng(0)
    shapes = set()
    dear = Scheduler("static", overhead=1e6)  # a GPU's pass: one for everything
    for _ in range(2000):
        lengths = rng.integers(1, 41, size=int(rng.integers(1, 1001)))
        (plan,) = dear.passes(lengths, fixed=2)
        count, longest = len(plan.slots), int(lengths.max())
        assert plan.batch >= max(count, MIN_BATCH) and plan.batch < 2 * max(count, MIN_BATCH)
        assert plan.batch & (plan.batch - 1) == 0
        assert plan.width == static_width(longest) >= longest
        shapes.add((plan.batch, plan.width))
    assert len(shapes) <= 8 * 7  # batches 8..1024; widths 1, 2, 4, 8, 16, 32, 48
    widths = {longest: static_width(longest) for longest in range(1, 50)}
    assert {widths[n] for n in range(1, 17)} == {1, 2, 4, 8, 16}
    assert all(n <= w < 2 * n for n, w in widths.items() if n <= CAPTURE_SHAPES.width_step)
    assert [widths[n] for n in (17, 32, 33, 48, 49)] == [32, 32, 48, 48, 64]
    # A model whose attention is not width-invariant keeps each pass at its own width.
    plans = Scheduler("static", overhead=1e6, mix=False).passes(np.array([2, 5, 5]), fixed=1)
    assert [(p.batch, p.width) for p in plans] == [(8, 2), (8, 5)]


def test_the_capture_shapes_table_keeps_its_buckets():
    """`CAPTURE_SHAPES`, and the functions that answer from it, round every count to the buckets
    a captured step has run at (written out here): a change to either is a change of shapes."""
    assert CAPTURE_SHAPES == CaptureShapes(
        min_batch=8, min_rows=8, rows_per_doubling=8, width_step=16
    )
    batches = [8, 16, 32, 64, 128, 256, 512, 1024]
    rows = [8, 9, 10, 11, 12, 13, 14, 15, 16, 18, 20, 22, 24, 26, 28, 30, 32]
    rows += [36, 40, 44, 48, 52, 56, 60, 64, 72, 80, 88, 96, 104, 112, 120, 128]
    widths = [1, 2, 4, 8, 16, 32, 48, 64, 80, 96]
    for function, buckets in ((static_batch, batches), (static_rows, rows), (static_width, widths)):
        for n in range(1, buckets[-1] + 1):  # the smallest bucket that holds n
            assert function(n) == min(b for b in buckets if b >= n), (function.__name__, n)
    assert (static_batch(0), static_rows(0), static_width(0)) == (8, 8, 1)
    big = {1025: 2048, 4097: 8192}
    assert {n: static_batch(n) for n in big} == big
    big = {129: 144, 257: 288, 1000: 1024, 1025: 1152, 4097: 4608}
    assert {n: static_rows(n) for n in big} == big
    big = {100: 112, 1000: 1008, 1009: 1024}
    assert {n: static_width(n) for n in big} == big
    with pytest.raises(ValueError, match="rows_per_doubling must be a power of two, not 6"):
        CaptureShapes(rows_per_doubling=6)


def test_admission_follows_arrival_across_pools():
    # Three pools' waiting arrivals; five free slots go to arrivals 0..4 wherever they wait.
    assert admit(5, [[0, 3, 9], [1, 2], [4, 5, 6]]) == [2, 2, 1]
    assert admit(0, [[0], [1]]) == [0, 0]
    assert admit(10, [[0], []]) == [1, 0]  # fewer waiting than free
    assert admit(3, []) == []


def test_capacity_and_replica_choice():
    assert capacity([64, 256, 8]) == 256 and capacity([]) == 0
    assert pick_replica({0: 10, 1: 3, 2: 3}) == 1  # least loaded, lowest index on a tie
    assert pick_replica({}) is None
    with pytest.raises(ValueError, match="policy must be one of"):
        Scheduler("fastest")


def note_shapes(engine) -> set:
    """The (batch, width) of every pass `engine` runs from now on, filled as it steps."""
    seen: set = set()

    def note(_active: int) -> None:
        for pool in engine.pools.values():
            seen.update((p.batch, p.width) for p in passes(pool.batch))

    engine.on_batch = note
    return seen


@pytest.mark.parametrize("kind", ["qwen2", "gpt-neo"])
def test_static_shapes_change_no_result(kind, one_thread):
    """The same mixed-length searches under the exact policy and the static one (passes padded
    to a power-of-two batch and, where the attention allows, a power-of-two width): the same tokens,
    finds, steps and losses, bit for bit (one thread, as a CPU replica runs). GPT-Neo keeps its
    own attention, so its passes are padded in the batch only."""
    from sodaray.search.engine.loop import Engine
    from sodaray.search.engine.work import Work

    model = tiny_model(kind)
    tokens = [[(7 * i + 3 * j) % 64 for j in range(1 + i % 5)] for i in range(13)]
    targets = sodaray.make_targets(model, tokens)
    cfg = sodaray.SodaConfig(max_steps=120, reinit_period=40, reset_period=15, seed=5)
    outcomes, shapes = {}, {}
    for policy in ("exact", "static"):
        engine = Engine(model, policy=policy)
        work = Work(targets, cfg, [(len(t),) for t in tokens])
        engine.submit(work)
        shapes[policy] = note_shapes(engine)
        engine.run()
        outcomes[policy] = [(r.tokens, r.found, r.steps, r.final_loss) for r in work.ordered()]
    assert outcomes["static"] == outcomes["exact"]
    assert any(o[1] for o in outcomes["exact"]) and not all(o[1] for o in outcomes["exact"])
    assert all(b >= MIN_BATCH and b & (b - 1) == 0 for b, _ in shapes["static"])
    assert shapes["static"] != shapes["exact"]


def test_the_policy_follows_the_executor_and_invert_takes_another(one_thread, monkeypatch):
    """Static shapes are padding until a step is captured and replayed (an H100 step took 2.5x
    at Qwen n=3, B=1000), so the engine runs each pass at its own shape unless its steps are
    captured (the "graph" executor on CUDA) or another policy is asked for; `invert(policy=...)`
    reaches the engine, and a policy it does not know is a one-line error."""
    from sodaray.search.engine.loop import Engine

    model = tiny_model("qwen2")
    assert Engine(model).policy == "exact"
    assert Engine(model, executor="eager").policy == "exact"
    # A model on a GPU, as the engine's constructor sees it (it reads nothing else there):
    # captured there by default, so a few static shapes; eager, each pass at its own.
    gpu = SimpleNamespace(device=torch.device("cuda"))
    assert Engine(gpu).policy == "static"
    assert Engine(gpu, executor="eager").policy == "exact"
    targets = sodaray.make_targets(model, [[3, 5, 7], [9]])
    cfg = sodaray.SodaConfig(max_steps=3, seed=1)
    with pytest.raises(ValueError, match="policy must be one of exact, static, not 'fastest'"):
        sodaray.invert(model, targets, cfg, policy="fastest")
    real = Engine.__init__
    engines: list = []

    def watched(self, *args, **kwargs):  # the real engine, its passes' shapes noted each step
        real(self, *args, **kwargs)
        engines.append(note_shapes(self))

    monkeypatch.setattr(Engine, "__init__", watched)
    widths = {}
    for policy in (None, "static"):
        sodaray.invert(model, targets, cfg, policy=policy)
        widths[policy] = engines.pop()
    assert widths[None] == {(2, 3)}
    assert widths["static"] == {(MIN_BATCH, 4)}
