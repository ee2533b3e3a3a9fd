"""The whole SODA step as one function of the batch's buffers (issue 52), and how it runs
(`sodaray.search.engine.executor`): eagerly on a CPU, captured once per shape and replayed on CUDA.

What CI can check without a GPU: the step reads nothing back to the host and takes no shape
from data (what a CUDA capture needs), the engine's steady step makes no host round trip, the
bucketed shapes a capture runs compute what the slots' own shapes compute bit for bit (one CPU
thread), and the executor's names, defaults and policy. The `cuda` tests (skipped without a
GPU; `benchmarks/gpu_check.sh` runs them) check the captures themselves."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import STORIES, tiny_model
from torch.utils._python_dispatch import TorchDispatchMode

import sodaray
from sodaray.search.engine.base import SlotEntry
from sodaray.search.engine.executor import (
    DEFAULT_EXECUTOR,
    EXECUTORS,
    captures,
    policy_for,
    resolve_executor,
)
from sodaray.search.engine.loop import Engine
from sodaray.search.engine.work import Work
from sodaray.search.soda.batch import SodaBatch
from sodaray.search.soda.step import soda_step

# Operations that make a GPU host wait for the device (a value or a shape read back):
# ../shared/tools/syncops.py's list.
SYNC = {
    "_local_scalar_dense",
    "nonzero",
    "argwhere",
    "masked_select",
    "unique",
    "_unique",
    "_unique2",
    "unique_dim",
    "unique_consecutive",
    "repeat_interleave",
    "bincount",
    "histc",
    "item",
}
# Calls that move data between host and device on a GPU (a CPU run cannot see them at the
# dispatcher): counted by wrapping them.
CROSSINGS = ((torch.Tensor, ("cpu", "numpy", "tolist", "item")), (torch, ("as_tensor", "tensor")))


class Watch(TorchDispatchMode):
    """Counts the host-synchronising operations dispatched inside it, and (with `crossings`)
    the calls that cross between host and device."""

    def __init__(self) -> None:
        super().__init__()
        self.sync: dict[str, int] = {}
        self.crossed: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if name in SYNC:
            self.sync[name] = self.sync.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


@pytest.fixture
def crossings(monkeypatch):
    """A dict that counts each host-device crossing call made while the test runs."""
    counts: dict[str, int] = {}
    for owner, names in CROSSINGS:
        for name in names:
            real = getattr(owner, name)

            def counted(*args, _real=real, _name=name, **kwargs):
                counts[_name] = counts.get(_name, 0) + 1
                return _real(*args, **kwargs)

            monkeypatch.setattr(owner, name, counted)
    return counts


def mixed_batch(model, bucketed: bool, cfg=None) -> SodaBatch:
    rng = np.random.default_rng(0)
    tokens = [list(map(int, rng.integers(0, model.vocab_size, n))) for n in (1, 2, 3, 2, 3)]
    targets = sodaray.make_targets(model, tokens)
    cfg = cfg or sodaray.SodaConfig(bias_correction=True, temperature_end=0.02, reset_period=2)
    batch = SodaBatch(model, bucketed=bucketed)
    batch.add([SlotEntry(targets, i, len(t), cfg) for i, t in enumerate(tokens)])
    return batch


def test_executor_names_and_defaults():
    """ "graph" by default: captured on CUDA, on a CPU the same step as "eager"; each brings
    its policy (static shapes only where steps are captured), a policy asked for wins, and a
    bad name is a one-line error naming the choices."""
    assert EXECUTORS == ("eager", "graph") and DEFAULT_EXECUTOR == "graph"
    assert resolve_executor(None) == "graph"
    assert captures("graph", "cuda") and not captures("graph", "cpu")
    assert not captures("eager", "cuda")
    assert policy_for(None, None, "cpu") == "exact" and policy_for(None, None, "cuda") == "static"
    assert policy_for("eager", None, "cuda") == "exact"
    assert policy_for("graph", "exact", "cuda") == "exact"
    assert policy_for("graph") == "exact"  # no device: a CPU's
    with pytest.raises(ValueError, match=r"^unknown executor 'compiled'; choose one of eager, gr"):
        resolve_executor("compiled")
    with pytest.raises(ValueError, match="unknown executor 'jit'"):
        policy_for("jit", "exact")  # checked even when a policy is given
    gpu = SimpleNamespace(device=torch.device("cuda"))
    assert Engine(gpu).executor.name == "graph" and Engine(gpu).policy == "static"
    model = tiny_model("qwen2")
    assert SodaBatch(model).scheduler.policy == "exact"  # its eager executor's
    assert SodaBatch(model, policy="static").scheduler.policy == "static"
    targets = sodaray.make_targets(model, [[3, 5]])
    with pytest.raises(ValueError, match="unknown executor 'jit'"):
        sodaray.invert(model, targets, sodaray.SodaConfig(max_steps=2), executor="jit")
    from sodaray.cli import build_parser

    invert = build_parser()._subparsers._group_actions[0].choices["invert"]  # noqa: SLF001
    (action,) = [a for a in invert._actions if "--executor" in a.option_strings]  # noqa: SLF001
    assert tuple(action.choices) == EXECUTORS and action.default is None


@pytest.mark.parametrize("bucketed", [False, True], ids=["exact", "bucketed"])
def test_the_step_reads_nothing_back(one_thread, crossings, bucketed):
    """The step function neither reads a value back to the host nor takes a shape from data,
    nor moves anything between host and device (what `torch.cuda.graph` requires), with every
    optional part on: bias correction, annealing, decay, resets; at the slots' own shapes and
    at a capture's bucketed ones. Planning (between steps) may; the step may not. Nor does the
    screen of its tokens, once its host buffers exist (a screen's launch, but its first)."""
    model = tiny_model("qwen2")
    batch = mixed_batch(model, bucketed)
    x = batch.refresh()
    assert x.capture == bucketed and all(x.flags[:4])
    crossings.clear()
    with Watch() as watch:
        status = soda_step(batch.state, x, "float32", batch.workspace, resetting=True)
    assert watch.sync == {} and crossings == {}
    assert status.tokens.shape == (x.live,) and status.loss.shape == (x.slots,)
    state, live = batch.state, len(batch.state.row_slot)
    tokens = status.tokens[:live].numpy().copy()
    picks = np.array([0, 2, 4])
    args = (picks, picks, tokens, state.row_slot, state.row_offset, bucketed)
    for turn in range(3):  # both turns' buffers made, then one launch watched
        if turn == 2:
            crossings.clear()
            watch = Watch().__enter__()
        screened = batch.screener.launch(batch.owner, *args)
    watch.__exit__(None, None, None)
    assert watch.sync == {} and crossings == {}
    assert screened.verdicts().shape == (3,)


def test_the_check_can_fail(crossings):
    """Both guards see what they are for: a read back and a crossing."""
    with Watch() as watch:
        torch.ones(3).nonzero()
        torch.ones(2).sum().item()
    assert watch.sync == {"nonzero": 1, "_local_scalar_dense": 1}
    torch.as_tensor(np.zeros(2))
    assert crossings == {"item": 1, "as_tensor": 1}


@pytest.mark.skipif(not STORIES.is_dir(), reason="stories260K not present")
def test_a_steady_step_makes_no_host_round_trip(one_thread, crossings, stories):
    """Issue 52's bound, as `../shared/tools/syncops.py` counts it (stories260K, 24 searches of
    lengths 1-3): at most 0.25 host-synchronising operations and 2 host-device crossings per
    steady step (the difference of a run of 2S steps and one of S, over S). The step ends in a
    status the host reads a step late; the rare confirm and re-draws cross, a steady step not."""
    rng = np.random.default_rng(3)
    tokens = [list(map(int, rng.integers(0, 512, n))) for n in (1, 2, 3) for _ in range(8)]
    targets = sodaray.make_targets(stories, tokens)
    counts = []
    for steps in (20, 40):
        crossings.clear()
        cfg = sodaray.SodaConfig.from_preset("tinystories-33m", max_steps=steps, max_batch_size=64)
        with Watch() as watch:
            sodaray.invert(stories, targets, cfg)
        counts.append((sum(watch.sync.values()), sum(crossings.values())))
    sync = (counts[1][0] - counts[0][0]) / 20
    crossed = (counts[1][1] - counts[0][1]) / 20
    assert sync <= 0.25 and crossed <= 2, counts
    assert counts[0][1] > 0  # the counter sees the planning's crossings at all


def engine_at(model, bucketed: bool) -> Engine:
    """An engine whose SODA batches take a capture's bucketed shapes (eagerly, here), or the
    slots' own."""
    engine = Engine(model)
    real = engine._new_batch

    def new_batch(work, length):
        batch = real(work, length)
        batch.bucketed = bucketed
        return batch

    engine._new_batch = new_batch
    return engine


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_bucketed_shapes_compute_what_the_exact_ones_do(one_thread, arch):
    """A capture's shapes (rows and slots rounded up to buckets, padding rows and slots parked
    where nothing reads them, one pass, the inputs written in place as slots come and go) give
    every search the bits of its own shapes on one CPU thread: the CUDA path's bookkeeping,
    checked where CI runs. Searches end, enter, reset and re-draw along the way."""
    model = tiny_model(arch)
    rng = np.random.default_rng(0)
    tokens = [list(map(int, rng.integers(0, model.vocab_size, n))) for n in (1, 2, 3, 2, 1, 3, 2)]
    targets = sodaray.make_targets(model, tokens)
    cfg = sodaray.SodaConfig(
        max_steps=60, reset_period=7, reinit_period=20, seed=3, max_batch_size=3
    )
    outcomes = {}
    for bucketed in (False, True):
        engine = engine_at(model, bucketed)
        work = Work(targets, cfg, [(len(t),) for t in tokens])
        engine.submit(work)
        engine.run()
        outcomes[bucketed] = [
            (r.tokens, r.found, r.steps, float(r.final_loss).hex()) for r in work.ordered()
        ]
    assert outcomes[True] == outcomes[False]
    assert any(o[1] for o in outcomes[False]) and not all(o[1] for o in outcomes[False])


def test_a_bucketed_shape_follows_its_slots_objective(one_thread):
    """A captured shape has its objective built in: when one objective's searches end and
    another's (the same observed shape, another loss) take their slots at the same bucket, the
    step is planned (and captured) again, not replayed with the first's loss. The bucketed run
    gives each search what the exact one does, bit for bit."""
    model = tiny_model("qwen2")
    rng = np.random.default_rng(2)
    tokens = [list(map(int, rng.integers(0, model.vocab_size, 2))) for _ in range(4)]
    objectives = (sodaray.Objective(loss="huber"), sodaray.Objective(loss="mse"))
    outcomes = {}
    for bucketed in (False, True):
        engine = engine_at(model, bucketed)
        works = []
        for i, objective in enumerate(objectives):
            targets = sodaray.make_targets(model, tokens, objective=objective)
            cfg = sodaray.SodaConfig(max_steps=12 + 6 * i, seed=i, max_batch_size=4)
            works.append(Work(targets, cfg, [(2,)] * len(tokens)))
            engine.submit(works[-1])
        engine.run()
        outcomes[bucketed] = [
            [(r.tokens, r.found, r.steps, float(r.final_loss).hex()) for r in w.ordered()]
            for w in works
        ]
    assert outcomes[True] == outcomes[False]


def test_graph_on_a_cpu_is_eager_bit_for_bit(one_thread):
    """On a CPU nothing is captured: "graph" and "eager" run the same step."""
    model = tiny_model("qwen2")
    targets = sodaray.make_targets(model, [[3, 5], [9], [7, 1, 2]])
    cfg = sodaray.SodaConfig(max_steps=40, seed=1)
    runs = [
        [
            (r.tokens, r.found, r.steps, r.final_loss)
            for r in sodaray.invert(model, targets, cfg, executor=name)
        ]
        for name in ("eager", "graph")
    ]
    assert runs[0] == runs[1]


# ---- on a GPU ------------------------------------------------------------------------------------
def gpu_search(arch: str, tokens, executor: str, steps: int = 60):
    model = tiny_model(arch)
    model.model.to("cuda")
    model = sodaray.wrap_model(model.model, None, name=arch)
    targets = sodaray.make_targets(model, tokens)
    engine = Engine(model, executor=executor)

    work = Work(targets, sodaray.SodaConfig(max_steps=steps, seed=2), [(len(t),) for t in tokens])
    engine.submit(work)
    engine.run()
    return model, engine, work.ordered()


@pytest.mark.cuda
def test_a_captured_search_repeats_itself_and_its_finds_are_exact():
    """Captured once per shape and replayed: two runs give the same tokens, steps and finds,
    and every find is the true input (the confirm runs in the canonical shape, never in a
    graph)."""
    rng = np.random.default_rng(1)
    tokens = [list(map(int, rng.integers(0, 64, n))) for n in (1, 2, 2, 3) * 4]
    runs = []
    for _ in range(2):
        _, engine, results = gpu_search("qwen2", tokens, "graph")
        assert engine.executor.builds and engine.executor.replays > 0
        runs.append([(r.tokens, r.found, r.steps) for r in results])
        assert all(r.exact for r in results if r.found)
    assert runs[0] == runs[1]
    assert any(found for _, found, _ in runs[0])


@pytest.mark.cuda
@pytest.mark.parametrize("side", [False, True], ids=["after-the-step", "beside-the-step"])
def test_captured_screens_find_what_screening_every_slot_does(monkeypatch, side):
    """Screens captured per bucketed size, after the next step on its stream or (`side`) on a
    stream of their own beside it: the same tokens, steps and finds as a run that screens every
    slot at every step, and every find the true input."""
    import sodaray.search.soda.batch as soda
    import sodaray.search.soda.screen as screen_module

    monkeypatch.setattr(screen_module, "SIDE_STREAM", side)
    rng = np.random.default_rng(4)
    tokens = [list(map(int, rng.integers(0, 64, n))) for n in (1, 2, 3, 3) * 4]
    _, _, changed = gpu_search("qwen2", tokens, "graph")
    monkeypatch.setattr(soda, "changed_slots", lambda ids, *a: np.ones(len(ids), dtype=bool))
    _, _, every = gpu_search("qwen2", tokens, "graph")
    runs = [[(r.tokens, r.found, r.steps) for r in results] for results in (changed, every)]
    assert runs[0] == runs[1]
    assert any(r.found for r in changed) and all(r.exact for r in changed if r.found)


@pytest.mark.cuda
def test_a_capture_reads_the_weights_where_they_lie():
    """No weight is copied into a graph: what capturing and replaying a step allocates grows by
    far less than the weights do between two models that differ in their vocabulary alone (a
    copy would grow by the whole difference; the step's own rows grow a little, and the
    cuBLAS workspaces a capture's streams take are the same for both)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    grown, weights = [], []
    for vocab in (4096, 65536):
        torch.manual_seed(0)
        cfg = Qwen2Config(
            vocab_size=vocab,
            hidden_size=512,
            intermediate_size=512,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
        )
        model = AutoModelForCausalLM.from_config(cfg).to("cuda")
        model = sodaray.wrap_model(model, None, name=f"q{vocab}")
        weights.append(sum(p.numel() * p.element_size() for p in model.model.parameters()))
        targets = sodaray.make_targets(model, [[5]])
        engine = Engine(model, executor="graph")
        engine.submit(Work(targets, sodaray.SodaConfig(max_steps=4), [(1,)]))
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()  # the peak from here, not since the process began
        engine.run()
        grown.append(torch.cuda.max_memory_allocated() - before)
        assert engine.executor.builds and engine.executor.replays > 0
        del engine, model
    assert grown[1] - grown[0] < (weights[1] - weights[0]) / 4, (grown, weights)


@pytest.mark.cuda
def test_a_model_that_cannot_be_captured_runs_eagerly():
    """GPT-Neo's attention copies a host scalar to the device on every forward: its step is
    refused by the capture, with one warning, and runs eagerly with the same finds."""
    tokens = [[3, 4], [5, 6], [7, 8]]
    _, graph, found = gpu_search("gpt-neo", tokens, "graph", steps=30)
    _, _, eager = gpu_search("gpt-neo", tokens, "eager", steps=30)
    assert graph.executor.refused is not None and not graph.executor.builds
    assert [r.tokens for r in found] == [r.tokens for r in eager]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
