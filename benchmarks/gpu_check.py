"""Issue 52's GPU figures in one process, each printed the moment it is measured, in the
Done-when's order, within a time budget (a lease is 15 minutes, start-up included).

    source .device/setup.sh && python3 benchmarks/gpu_check.py [--budget 330] [--authors-cmd ...]
    python benchmarks/gpu_check.py --device cpu --quick      # the same stages, tiny, here

Stages (each under its own deadline; one that runs out prints so and the next begins):
0. The fused vocabulary kernels (issue 60), first: Qwen2.5-0.5B shape, n=3, bf16, captured,
   B=1000 then B=64, the fused step (`fused: on`) and the same run's unfused one: ms per steady
   step, the ratio to its roofline (the vocabulary passes `benchmarks/vocab_passes.py` counts,
   at the copy bandwidth measured here, plus the step's FLOPs at the bf16 peak measured here),
   and CUDA kernels per step (eager executor, torch.profiler). Goals: <= 28 ms at B=1000,
   <= 10 ms and <= 1,200 kernels at B=64. A kernel that fails to compile shows here first.
1. Qwen2.5-0.5B shape, n=3, B=64: ms per steady step, captured ("graph") in float32, tf32 and
   bf16, and eager in float32 and tf32 as the same run's baseline. The goal: <= 20 ms, match
   check included (it is: every step screens, and confirms what passes).
2. The same shape at B=1000: ms/step and achieved TFLOP/s against the bf16 matrix peak measured
   in this run (an 8192^3 bf16 product). The goal: >= 30% of it.
3. TinyStories-33M shape (GPT-Neo), n=10, B=1000: sample-steps/s against the authors'
   `onehot_search` in the same run (`--authors-cmd`, as bench_invert.py's). The goal: >= 20x.
4. 1,000 random inputs of lengths 1-10 on the neo shape, 200 steps: exact inputs the match check
   did not report (goal 0), and a second run's tokens against the first's; the same on a
   Llama of the neo shape, whose step can be captured (GPT-Neo's cannot: its attention copies
   a host scalar to the device on every forward).
5. ms/step at B=256 for the neo, Qwen2.5-0.5B and Qwen2.5-3B shapes (a scaling study's step).

A steady step is the difference of two runs on one engine (so its captures are built once)
over the extra steps; the set-up outside the timed steps (recording targets, captures) is timed
and printed. Targets beyond 64 are the first 64 repeated (recording each alone, in the canonical
shape, costs a forward each): the step's arithmetic does not depend on which inputs it holds.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
BEGAN = time.perf_counter()


class OutOfTime(Exception):
    pass


def say(text: str) -> None:
    print(f"[{time.perf_counter() - BEGAN:6.1f}s] {text}", flush=True)


@contextmanager
def deadline(seconds: float, label: str):
    """Raise OutOfTime inside the block after `seconds` (checked between Python bytecodes)."""

    def fire(*_):
        raise OutOfTime(label)

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(max(int(seconds), 1))
    try:
        yield
    except OutOfTime:
        say(f"{label}: out of its {seconds:.0f} s")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def targets_for(model, n: int, batch: int, seed: int = 1):
    """`batch` targets of length n that no search reaches: the first min(batch, 64)
    recorded, then repeated."""
    import torch

    import sodaray

    torch.manual_seed(seed)
    first = min(batch, 64)
    tokens = torch.randint(0, model.vocab_size, (first, n)).tolist()
    targets = sodaray.make_targets(model, tokens)
    if batch > first:
        targets = targets.subset(np.arange(batch) % first)
        targets.sample_ids = list(range(batch))
    # No search may end early (a timed step is every slot's): one observed logit moved.
    targets.observed_values[:, 0, 0] += 1.0
    return targets


def steady(
    model, targets, executor: str, precision: str, device: str, steps: int, fused: str = "off"
) -> dict:
    """ms per steady step on one engine: a run of 3 steps, then of 3 + `steps`; and the share
    of slot-steps whose tokens the match check screened (those a step changed)."""
    import sodaray
    from sodaray.search.engine.loop import Engine
    from sodaray.search.engine.work import Work
    from sodaray.search.soda.screen import Screener

    engine = Engine(model, executor=executor)
    n = len(targets.true_tokens[0])
    cfg = sodaray.SodaConfig.from_preset(
        "tinystories-33m", max_batch_size=len(targets), precision=precision, fused=fused
    )
    screens: dict[int, Screener] = {}
    screened = [0]
    real = Screener.launch

    def counted(self, owner, picks, *rest):
        screens[id(self)] = self
        screened[0] += len(picks)
        return real(self, owner, picks, *rest)

    def run(k: int) -> float:
        import dataclasses

        work = Work(targets, dataclasses.replace(cfg, max_steps=k), [(n,)] * len(targets))
        sync(device)
        began = time.perf_counter()
        engine.submit(work)
        engine.run()
        sync(device)
        return time.perf_counter() - began

    Screener.launch = counted
    try:
        first = run(3)  # its captures are built here
        mark = screened[0]
        short = run(3)
        in_short, mark = screened[0] - mark, screened[0]
        long = run(3 + steps)
        in_long = screened[0] - mark
    finally:
        Screener.launch = real
    ex = engine.executor
    builds = ex.builds + [b for s in screens.values() for b in s.executor.builds]
    return {
        "ms": 1000 * max(long - short, 1e-9) / steps,
        "first_s": first,
        "captures": len(builds),
        "capture_s": sum(s for _, s in builds),
        "refused": ex.refused,
        "screened": (in_long - in_short) / (len(targets) * steps),
    }


def line(case: str, precision: str, executor: str, r: dict, extra: str = "") -> str:
    how = executor if r["refused"] is None else f"{executor}->eager (not capturable)"
    built = f"; {r['captures']} captures in {r['capture_s']:.2f} s" if r["captures"] else ""
    return (
        f"{case} {precision:<8} {how:<10} {r['ms']:8.2f} ms/step{extra}, "
        f"{100 * r['screened']:.0f}% of slots screened a step "
        f"(first run {r['first_s']:.1f} s{built})"
    )


def bf16_peak(device: str) -> float:
    """FLOP/s of an 8192^3 bf16 product here (median of 10, CUDA events)."""
    import torch

    if not device.startswith("cuda"):
        return float("nan")
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    return 2 * 8192**3 / float(np.median(times))


# Float32 (T x V) passes per step, bf16 (`benchmarks/vocab_passes.py --shape qwen`; the eager
# step's from ../shared/tools/vocabpasses.py, counted in float32).
PASSES = {"on": 9.3, "off": 41.1}


def bandwidth(device: str) -> float:
    """Bytes/s of a 2 GiB device-to-device copy here (read + write; median of 5)."""
    import torch

    if not device.startswith("cuda"):
        return float("nan")
    a = torch.empty(2**29, device=device)
    b = torch.empty_like(a)
    times = []
    for _ in range(6):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        b.copy_(a)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    return 2 * a.numel() * 4 / float(np.median(times[1:]))


def kernels_per_step(model, targets, precision: str, device: str, fused: str) -> float:
    """CUDA kernels a steady step launches (eager executor: a graph replay hides them)."""

    if not device.startswith("cuda"):
        return float("nan")
    from torch.profiler import ProfilerActivity, profile

    counts = []
    for steps in (2, 6):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            steady(model, targets, "eager", precision, device, steps, fused)
        counts.append(sum(e.count for e in prof.key_averages() if e.device_type.name == "CUDA"))
    # steady() runs 3, 3 and 3 + steps steps: the difference of the two profiles is 4 steps.
    return (counts[1] - counts[0]) / 4


def stage_fused(args, models, peak: float) -> None:
    from bench_invert import flops_per_sample_step

    model = models("qwen")
    bw = bandwidth(args.device)
    say(f"copy bandwidth measured here: {bw / 1e12:.2f} TB/s")
    flops = flops_per_sample_step(model, 3)
    vocab = model.vocab_size
    for batch in (16,) if args.quick else (1000, 64):
        targets = targets_for(model, 3, batch)
        rows = 3 * batch
        for fused in ("on", "off"):
            try:
                r = steady(model, targets, "graph", "bfloat16", args.device, 8, fused)
            except OutOfTime:
                raise
            except Exception as exc:
                say(f"qwen:3:{batch} bf16 fused={fused} FAILED: {type(exc).__name__}: {exc}"[:300])
                continue
            bound = PASSES[fused] * 4 * rows * vocab / bw + batch * flops / peak
            extra = f", roofline {1000 * bound:.2f} ms (x{r['ms'] / (1000 * bound):.1f})"
            if batch == 64:
                k = kernels_per_step(model, targets, "bfloat16", args.device, fused)
                extra += f", {k:.0f} kernels/step"
            say(line(f"qwen:3:{batch} fused={fused}", "bfloat16", "graph", r, extra))


def stage_qwen64(args, models) -> None:
    model = models("qwen")
    t0 = time.perf_counter()
    targets = targets_for(model, 3, 64)
    say(f"qwen:3:64 targets recorded in {time.perf_counter() - t0:.1f} s")
    import sodaray.search.soda.screen as screen_module

    for executor, precision, side in (
        ("graph", "tf32", False),
        ("graph", "tf32", True),
        ("graph", "bfloat16", False),
        ("graph", "bfloat16", True),
        ("graph", "float32", False),
        ("eager", "float32", False),
        ("eager", "tf32", False),
    ):
        where = ", screens on a side stream" if side else ""
        screen_module.SIDE_STREAM = side
        try:
            r = steady(model, targets, executor, precision, args.device, args.steps)
        except OutOfTime:
            raise
        except Exception as exc:  # one line lost (the side stream is new), not the stage
            failed = f"{type(exc).__name__}: {exc}"
            say(f"qwen:3:64 {precision} {executor}{where} FAILED: {failed}"[:300])
            continue
        finally:
            screen_module.SIDE_STREAM = False
        say(line("qwen:3:64", precision, executor, r, where))


def stage_qwen1000(args, models, peak: float) -> None:
    from bench_invert import flops_per_sample_step

    model = models("qwen")
    batch = 16 if args.quick else 1000
    t0 = time.perf_counter()
    targets = targets_for(model, 3, batch)
    say(f"qwen:3:{batch} targets in {time.perf_counter() - t0:.1f} s")
    flops = flops_per_sample_step(model, 3)
    for executor, precision in (("graph", "bfloat16"), ("graph", "tf32"), ("eager", "tf32")):
        r = steady(model, targets, executor, precision, args.device, max(args.steps // 3, 4))
        rate = batch / (r["ms"] / 1000) * flops
        share = f", {rate / 1e12:.1f} TFLOP/s = {100 * rate / peak:.1f}% of the bf16 peak"
        say(line(f"qwen:3:{batch}", precision, executor, r, share))


def stage_neo1000(args, models) -> None:
    model = models("neo")
    batch = 16 if args.quick else 1000
    targets = targets_for(model, 10, batch)
    ours = {}
    for precision in ("tf32", "float32"):
        r = steady(model, targets, "graph", precision, args.device, max(args.steps // 3, 4))
        ours[precision] = batch / (r["ms"] / 1000)
        say(
            line(
                f"neo:10:{batch}",
                precision,
                "graph",
                r,
                f" = {ours[precision]:,.0f} sample-steps/s",
            )
        )
    if not args.authors_cmd:
        say("authors: no --authors-cmd")
        return
    cmd = args.authors_cmd.format(n=10, B=batch, steps=6)
    out = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=150)
    try:
        theirs = json.loads(out.stdout.strip().splitlines()[-1])["sample_steps_per_s"]
    except (ValueError, IndexError, KeyError):
        say(f"authors: failed: {(out.stderr or out.stdout)[-300:]}")
        return
    ratio = "  ".join(f"{p} x{v / theirs:.1f}" for p, v in ours.items())
    say(f"neo:10:{batch} authors {theirs:,.0f} sample-steps/s (same run); sodaray {ratio}")


def stage_rows(args, models) -> None:
    import torch

    import sodaray

    count = 40 if args.quick else 1000
    for name in ("neo", "neollama"):
        model = models(name)
        rng = np.random.default_rng(5)
        tokens = [
            list(map(int, rng.integers(0, model.vocab_size, 1 + i % 10))) for i in range(count)
        ]
        t0 = time.perf_counter()
        targets = sodaray.make_targets(model, tokens)
        say(f"{name}: {count} targets of lengths 1-10 recorded in {time.perf_counter() - t0:.1f} s")
        cfg = sodaray.SodaConfig.from_preset(
            "tinystories-33m",
            max_steps=20 if args.quick else 200,
            max_batch_size=count,
            fused=args.fused,
        )
        runs = []
        for _ in range(2):
            sync(args.device)
            t0 = time.perf_counter()
            results = sodaray.invert(model, targets, cfg)
            sync(args.device)
            runs.append(results)
            exact = sum(bool(r.exact) for r in results)
            found = sum(r.found for r in results)
            missed = sum(bool(r.exact) and not r.found for r in results)
            false = sum(r.found and not r.exact for r in results)
            say(
                f"{name} {count} rows (fused={args.fused}): {found} found, {exact} exact, "
                f"{missed} exact-not-found, {false} found-not-exact, "
                f"{time.perf_counter() - t0:.1f} s"
            )
        same = [a.tokens for a in runs[0]] == [b.tokens for b in runs[1]]
        say(f"{name}: a second run's tokens equal the first's: {same}")
        del model
        torch.cuda.empty_cache() if args.device.startswith("cuda") else None


def stage_scaling(args, models) -> None:
    import torch

    batch = 16 if args.quick else 256
    names = ("neo", "qwen") if args.quick else ("neo", "qwen", "qwen3b")
    for name in names:
        model = models(name)
        targets = targets_for(model, 3, batch)
        for precision in ("tf32", "bfloat16"):
            r = steady(model, targets, "graph", precision, args.device, max(args.steps // 3, 4))
            say(line(f"{name}:3:{batch}", precision, "graph", r))
        del model, targets
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--budget", type=float, default=330.0, help="seconds for all stages")
    p.add_argument("--steps", type=int, default=30, help="timed steps at B=64")
    p.add_argument("--authors-cmd", help="as bench_invert.py's: {n} {B} {steps}")
    p.add_argument("--quick", action="store_true", help="tiny batches (a CPU dry run)")
    p.add_argument("--stages", default="012345")
    p.add_argument("--fused", default="off", help="stage 4's SODA `fused` setting: off, auto, on")
    args = p.parse_args()
    if not args.device.startswith("cuda"):  # the fused kernels on a CPU: Triton's interpreter
        import os

        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch
    from bench_invert import QWEN_SHAPES, build_model

    if args.device.startswith("cuda"):
        say(f"gpu_check on {torch.cuda.get_device_name()}, torch {torch.__version__}")
    cache: dict[str, object] = {}

    def models(name: str):
        if name not in cache:
            cache.clear()  # one model at a time on the device
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()
            t0 = time.perf_counter()
            if args.quick:
                cache[name] = tiny(name)
            else:
                cache[name] = build_model(name, args.device, "float32")
            say(f"model {name} built in {time.perf_counter() - t0:.1f} s")
        return cache[name]

    assert set(QWEN_SHAPES) >= {"qwen", "qwen3b"}
    peak = bf16_peak(args.device)
    say(f"bf16 matrix peak measured here: {peak / 1e12:.0f} TFLOP/s")
    shares = {"0": 0.25, "1": 0.18, "2": 0.2, "3": 0.22, "4": 0.25, "5": 0.15}
    stages = {
        "0": ("fused kernels, qwen bf16", lambda: stage_fused(args, models, peak)),
        "1": ("qwen B=64", lambda: stage_qwen64(args, models)),
        "2": ("qwen B=1000", lambda: stage_qwen1000(args, models, peak)),
        "3": ("neo B=1000 vs authors", lambda: stage_neo1000(args, models)),
        "4": ("1,000 rows", lambda: stage_rows(args, models)),
        "5": ("B=256 scaling", lambda: stage_scaling(args, models)),
    }
    for i, key in enumerate(args.stages):
        label, run = stages[key]
        left = args.budget - (time.perf_counter() - BEGAN)
        if left < 10:
            say(f"stage {key} ({label}): skipped, the budget is spent")
            continue
        # Its share of what is left, and half as much again: time a stage leaves goes on.
        share = shares[key] / sum(shares[k] for k in args.stages[i:])
        with deadline(min(left, 1.5 * share * left), f"stage {key} ({label})"):
            try:
                run()
            except Exception as exc:  # one stage lost, not the rest
                import traceback

                tail = traceback.format_exc().strip().splitlines()[-6:]
                say(f"stage {key} ({label}) FAILED: {type(exc).__name__}: {exc}"[:400])
                print("\n".join(tail), flush=True)
    say(f"gpu_check done in {time.perf_counter() - BEGAN:.0f} s")


def tiny(name: str):
    """A small model of `name`'s family, on the CPU (`--quick`: the stages' code, quickly)."""
    import torch
    from transformers import AutoModelForCausalLM, GPTNeoConfig, LlamaConfig, Qwen2Config

    import sodaray

    torch.manual_seed(0)
    shape = dict(vocab_size=512, hidden_size=64, num_attention_heads=4, max_position_embeddings=64)
    if name == "neo":
        cfg = GPTNeoConfig(num_layers=2, attention_types=[[["global", "local"], 1]], **shape)
    elif name == "neollama":
        cfg = LlamaConfig(intermediate_size=128, num_hidden_layers=2, **shape)
    else:
        cfg = Qwen2Config(
            intermediate_size=128, num_hidden_layers=2, num_key_value_heads=2, **shape
        )
    return sodaray.wrap_model(AutoModelForCausalLM.from_config(cfg), None, name=f"tiny-{name}")


if __name__ == "__main__":
    main()
