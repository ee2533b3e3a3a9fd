"""SODA throughput: sample-steps/s, achieved GFLOP/s and peak memory, one line per case.

    python benchmarks/bench_invert.py                    # the issue-7 table + B-scaling cases
    python benchmarks/bench_invert.py --suite scaling    # n, B and vocabulary sweep
    python benchmarks/bench_invert.py --case neo:3:64    # one case: model:n:B
    python benchmarks/bench_invert.py --authors-cmd "python run_authors.py {length} {B} {steps}"
    python3 benchmarks/bench_invert.py --suite gpu --device cuda --out benchmarks/gpu-costs.yaml

`--suite gpu` (issue 41) measures what a step costs, in one process, per case and precision
(float32, tf32 on CUDA, and bfloat16 unless --precision names one): ms/step (a steady step: two
runs of different lengths, the difference over the extra steps), kernels per step (torch.profiler
with CUDA activity; the same difference), host-device copies per step, the GPU-busy share (the
union of the kernels' and copies' time over the wall of a profiled run), achieved TFLOP/s
(the FLOPs `sodaray.costs.flops` counts), and its share of the bf16 matrix peak measured in the same
run (an 8192^3 bf16 product timed with CUDA events); with --authors-cmd, the authors' code on
each neo case in the same run. Then the ratios, and the per-pass and per-position costs fit to the
measured steps (`fit_costs` below), written to --out as a costs file that
`sodaray sweep plan|run --costs FILE` reads. Cases on CUDA: neo (TinyStories-33M shape) n=10 at
B=1, 8, 64, 256, 1000; qwen (Qwen2.5-0.5B shape: vocab 151936, 24 layers) n=3 at B=64, 256,
1000. On CPU (`--device cpu`) the same suite runs on stories260K, n=3, B=1 and 8: profiler CPU
ops (leaf aten ops that do work) stand for kernels, their busy share and a bf16 CPU matmul
peak are computed the same way, and the costs file is a CPU one (`kind: cpu`, for replicas of
`--threads` threads). It imports neither Ray nor Optuna (the GPU machines have neither).

`--authors-cmd` times the authors' implementation in the same run, interleaved case by case, so
the comparison does not depend on how fast the shared machine is that hour. The command runs
outside this repository (their code is not part of sodaray) and must print one JSON line with
`sample_steps_per_s`; benchmarks/RESULTS.md says how it was set up.

Models: `neo` is a randomly initialised TinyStories-33M-shaped GPT-Neo (hidden 768, 4 layers, 16
heads, vocab 50257, window 256, alternating global/local attention, initializer_range 0.1, so that
nothing is solved within the run); `qwen` a randomly initialised Qwen2.5-0.5B-shaped Qwen2
(hidden 896, 24 layers, 14 heads / 2 KV heads, MLP 4864, vocab 151936, tied embeddings);
`stories` is ../shared/models/stories260K (vocab 512); `smollm` is the SmolLM2-135M GGUF (vocab
49152). FLOPs per sample-step are `sodaray.costs.flops`'s, from the model's config. Targets:
torch.manual_seed(1), randint(0, V, (B, n)); the paper's TinyStories-33M preset; outside the gpu
suite every case runs in its own process so peak memory is its own.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"

# The authors' implementation on this 2-core machine (issue 7), sample-steps/s, and the goals.
REFERENCE = {
    ("neo", 3, 1): (1.8, 6),
    ("neo", 3, 8): (12.6, 40),
    ("neo", 3, 64): (28.2, 90),
    ("neo", 10, 64): (10.2, 30),
}

SUITES = {
    "default": [
        "neo:3:1",
        "neo:3:8",
        "neo:3:64",
        "neo:10:64",
        "neo:10:1",
        "neo:10:256",
        "stories:10:1",
        "stories:10:64",
        "stories:10:256",
    ],
    "scaling": [
        f"{m}:{n}:{b}" for m in ("stories", "neo") for n in (1, 3, 10, 20) for b in (1, 8, 64, 256)
    ]
    + ["smollm:3:8", "smollm:10:8"],
    "gpu": [f"neo:10:{b}" for b in (1, 8, 64, 256, 1000)]
    + [f"qwen:3:{b}" for b in (64, 256, 1000)],
    "memory": ["neo:10:1000"],
}
GPU_SUITE_ON_CPU = ["stories:3:1", "stories:3:8"]  # the gpu suite's reduced form (CI, no GPU)
PRECISIONS = ("float32", "bfloat16")
# On CUDA also tf32 (float32 state, tensor-core products): the H200 run of 2026-11-26 showed
# float32's products on the SIMT cores (sm80_xmma ..._ffma kernels), and tf32 was not measured.
CUDA_PRECISIONS = ("float32", "tf32", "bfloat16")
PROFILED_STEPS = 10  # steps under the profiler (beyond a 2-step run subtracted)
# Profiler CPU ops that move no data or only describe it (../shared/tools/opcount.py's list):
# the ops left are the CPU form of "kernels per step".
FREE_OPS = frozenset(
    "aten::" + name
    for name in (
        "view as_strided empty empty_strided t transpose reshape _reshape_alias expand slice "
        "select unsqueeze squeeze detach alias _unsafe_view permute resolve_conj resolve_neg "
        "lift_fresh result_type size stride numel is_nonzero item _local_scalar_dense split "
        "chunk narrow unbind view_as contiguous empty_like _to_copy to unflatten flatten "
        "expand_as _has_compatible_shallow_copy_type"
    ).split()
) | {"detach"}


# Qwen2.5 shapes (hidden, MLP, layers, heads; 2 KV heads, vocab 151936, tied): the scaling
# study's 0.5B and 3B ends, from the released configs.
QWEN_SHAPES = {
    "qwen": (896, 4864, 24, 14, "qwen2.5-0.5b-shape"),
    "qwen3b": (2048, 11008, 36, 16, "qwen2.5-3b-shape"),
}


def build_model(name: str, device: str, dtype: str):
    import torch

    import sodaray

    if name == "neo":
        from transformers import AutoModelForCausalLM, GPTNeoConfig

        torch.manual_seed(0)
        cfg = GPTNeoConfig(
            vocab_size=50257,
            hidden_size=768,
            num_layers=4,
            num_heads=16,
            attention_types=[[["global", "local"], 2]],
            window_size=256,
            max_position_embeddings=2048,
            initializer_range=0.1,
        )
        model = AutoModelForCausalLM.from_config(cfg).to(device)
        if dtype != "float32":
            model = model.to(getattr(torch, dtype))
        return sodaray.wrap_model(model, None, name="tinystories-33m-shape")
    if name == "neollama":  # the neo shape as a Llama: an attention a CUDA graph can capture
        from transformers import AutoModelForCausalLM, LlamaConfig

        torch.manual_seed(0)
        cfg = LlamaConfig(
            vocab_size=50257,
            hidden_size=768,
            intermediate_size=3072,
            num_hidden_layers=4,
            num_attention_heads=16,
            num_key_value_heads=16,
            max_position_embeddings=2048,
            initializer_range=0.1,
        )
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(cfg)
        if dtype != "float32":
            model = model.to(getattr(torch, dtype))
        return sodaray.wrap_model(model, None, name="neo-shape-llama")
    if name in QWEN_SHAPES:
        from transformers import AutoModelForCausalLM, Qwen2Config

        torch.manual_seed(0)
        hidden, mlp, layers, heads, label = QWEN_SHAPES[name]
        cfg = Qwen2Config(
            vocab_size=151936,
            hidden_size=hidden,
            intermediate_size=mlp,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=2,
            max_position_embeddings=32768,
            tie_word_embeddings=True,
        )
        with torch.device(device):  # 0.5B-3B parameters: initialised where they will run
            model = AutoModelForCausalLM.from_config(cfg)
        if dtype != "float32":
            model = model.to(getattr(torch, dtype))
        return sodaray.wrap_model(model, None, name=label)
    if name == "stories":
        return sodaray.load_model(str(SHARED / "models/stories260K"), device=device, dtype=dtype)
    if name == "smollm":
        path = SHARED / "models/smollm2-135m-instruct-q4_1/SmolLM2-135M-Instruct.Q4_1.gguf"
        return sodaray.load_model(str(path), device=device, dtype=dtype)
    raise SystemExit(f"unknown model {name!r}")


def flops_per_sample_step(model, n: int, m: int = 1) -> float:
    """FLOPs of one SODA sample-step as the cost model counts them (`sodaray.costs.flops`: a
    forward,
    a backward to the input, the update), from the model's config."""
    from sodaray.costs.flops import shape_from_config

    shape = shape_from_config(model.model.config)
    return shape.step_flops(n, m, bos=bool(model.prefix_ids))


def matmul_gflops(device: str) -> float:
    """Measured fp32 matmul rate, the ceiling the achieved rate is compared with."""
    import torch

    size = 8192 if device.startswith("cuda") else 2048
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)
    for _ in range(2):
        a @ b
    reps = 20 if device.startswith("cuda") else 5
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return 2 * size**3 * reps / (time.perf_counter() - t0) / 1e9


def run_case(spec: str, steps: int, device: str, dtype: str, precision: str) -> dict:
    import torch

    import sodaray

    name, n, batch = spec.split(":")
    n, batch = int(n), int(batch)
    model = build_model(name, device, dtype)
    torch.manual_seed(1)
    tokens = torch.randint(0, model.vocab_size, (batch, n)).tolist()
    targets = sodaray.make_targets(model, tokens)

    def preset(max_steps: int) -> sodaray.SodaConfig:
        return sodaray.SodaConfig.from_preset(
            "tinystories-33m", max_steps=max_steps, max_batch_size=batch, precision=precision
        )

    config = preset(steps)
    sodaray.invert(model, targets, preset(2))  # warm-up
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    results = sodaray.invert(model, targets, config)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    sample_steps = sum(r.steps for r in results)
    rate = sample_steps / seconds
    flops = flops_per_sample_step(model, n)
    if device.startswith("cuda"):
        peak = torch.cuda.max_memory_allocated() / 2**30
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return {
        "case": spec,
        "model": name,
        "n": n,
        "B": batch,
        "V": model.vocab_size,
        "steps": steps,
        "seconds": seconds,
        "sample_steps_per_s": rate,
        "ms_per_step": 1000 * seconds / steps,
        "gflops": rate * flops / 1e9,
        "peak_gib": peak,
        "found": sum(r.found for r in results),
        "device": device,
        "dtype": dtype,
        "precision": precision,
    }


def time_authors(template: str, spec: str, steps: int) -> float | None:
    """Sample-steps/s of the authors' code for one case, from the external command's JSON."""
    _, n, batch = spec.split(":")
    cmd = template.format(length=n, n=n, B=batch, steps=steps)  # {n}: the older name of {length}
    proc = subprocess.run(cmd, shell=True, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no JSON line"])[-1]
        print(f"{spec}: authors' command FAILED: {tail}", flush=True)
        return None
    return float(json.loads(lines[-1])["sample_steps_per_s"])


def matrix_peak(device: str, dtype: str = "bfloat16") -> float:
    """A large matrix product's rate (FLOP/s) here, best of three timings: on CUDA timed with
    CUDA events (no host in the measurement), on CPU with the wall clock."""
    import torch

    cuda = device.startswith("cuda")
    size, reps = (8192, 20) if cuda else (256, 3)
    a = torch.randn(size, size, device=device, dtype=getattr(torch, dtype))
    b = torch.randn(size, size, device=device, dtype=getattr(torch, dtype))
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(3):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                a @ b
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1000)
        else:
            t0 = time.perf_counter()
            for _ in range(reps):
                a @ b
            best = min(best, time.perf_counter() - t0)
    return 2 * size**3 * reps / best


def busy_seconds(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by any of `intervals` (microseconds): overlaps counted once."""
    total, end = 0.0, float("-inf")
    for lo, hi in sorted(intervals):
        if hi > end:
            total += hi - max(lo, end)
            end = hi
    return total / 1e6


def profiled(run, cuda: bool) -> dict[str, float]:
    """`run()` under torch.profiler: kernels (on CPU: leaf ops that do work), host-device
    copies, busy seconds (union of their times) and the profiled wall."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        run()
        wall = time.perf_counter() - t0
    events = prof.events()
    if cuda:
        work = [e for e in events if e.device_type == DeviceType.CUDA]
        copies = [e for e in work if e.name.startswith(("Memcpy", "Memset"))]
        kernels = len(work) - len(copies)
    else:
        work = [
            e
            for e in events
            if e.name.startswith("aten::") and e.name not in FREE_OPS and not e.cpu_children
        ]
        copies = []  # no host-device copies on a CPU
        kernels = len(work)
    spans = [(e.time_range.start, e.time_range.end) for e in work]
    return {"kernels": kernels, "copies": len(copies), "busy": busy_seconds(spans), "wall": wall}


def measure_case(
    model,
    spec: str,
    steps: int,
    device: str,
    precision: str,
    peak: float,
    policy: str,
    executor: str = "graph",
) -> dict:
    """One case of the gpu suite: a steady step's time, kernels, busy share and FLOP rate."""
    import torch

    import sodaray

    name, n, batch = spec.split(":")
    n, batch = int(n), int(batch)
    cuda = device.startswith("cuda")
    torch.manual_seed(1)
    tokens = torch.randint(0, model.vocab_size, (batch, n)).tolist()
    targets = sodaray.make_targets(model, tokens)

    def run(k: int) -> tuple[float, int]:
        config = sodaray.SodaConfig.from_preset(
            "tinystories-33m", max_steps=k, max_batch_size=batch, precision=precision
        )
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        results = sodaray.invert(model, targets, config, policy=policy, executor=executor)
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t0, sum(r.steps for r in results)

    run(2)  # warm-up: first-call costs (allocations, kernels chosen)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    (short, short_steps), (long, long_steps) = run(2), run(2 + steps)
    # A steady step: what `steps` more steps add (a run's set-up cancels out).
    seconds = max(long - short, 1e-9) / steps
    samples = max(long_steps - short_steps, 0) / steps  # sample-steps per step
    extra = min(PROFILED_STEPS, steps)
    few = profiled(lambda: run(2), cuda)
    many = profiled(lambda: run(2 + extra), cuda)
    per = {k: (many[k] - few[k]) / extra for k in few}
    flops = flops_per_sample_step(model, n)
    rate = samples / seconds
    if cuda:
        memory = torch.cuda.max_memory_allocated() / 2**30
    else:
        memory = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return {
        "case": spec,
        "model": name,
        "n": n,
        "B": batch,
        "precision": precision,
        "policy": policy,
        "executor": executor,
        "ms_per_step": 1000 * seconds,
        "samples_per_step": samples,
        "sample_steps_per_s": rate,
        "kernels_per_step": per["kernels"],
        "copies_per_step": per["copies"] if cuda else None,
        # Over the longer profiled run (its set-up included): a difference of two noisy
        # shares can leave [0, 1]; kernel counts are exact, so theirs is a difference.
        "busy_share": many["busy"] / many["wall"],
        "flops_per_sample_step": flops,
        "tflops": rate * flops / 1e12,
        "share_of_peak": rate * flops / peak,
        "peak_gib": memory,
    }


def short_device_name(device: str) -> str:
    """A name for `DEVICE-hours`: the GPU's family when it is one sodaray knows, else gpu."""
    if not device.startswith("cuda"):
        return "cpu"
    import torch

    full = torch.cuda.get_device_name(torch.device(device)).lower()
    return next((k for k in ("h200", "h100", "a100", "l40s", "l4", "a10g") if k in full), "gpu")


# ---- fitting device costs (`sodaray.costs.devices`) to measured steps ---------------------------
@dataclass(frozen=True)
class MeasuredStep:
    """One measured step time: `batch` samples of input length `length` on a model of `shape`,
    all in `passes` passes (one: a batch of one length)."""

    label: str
    shape: Any  # sodaray.costs.flops.ModelShape
    length: int
    batch: float
    precision: str
    ms: float
    outputs: int = 1
    bos: bool = False
    passes: int = 1
    held_out: bool = False  # not used by the fit of the built-in constants: it tests them

    @property
    def flops(self) -> float:
        return self.batch * self.shape.step_flops(self.length, self.outputs, self.bos)

    def predicted_ms(self, costs) -> float:
        rate = costs.at(self.precision)
        floor = self.passes * rate.floor(self.shape.layers)
        return 1000 * (floor + self.flops / rate.flops_per_second)


def built_in_steps(device: str) -> tuple[MeasuredStep, ...]:
    """The measured steps a packaged costs file (`sodaray/costs/DEVICE.yaml`) was fit to
    (`measured.rows`, whose shapes `measured.shapes` names; `held_out` rows left out)."""
    from importlib.resources import files

    from sodaray.config.yamltext import yaml_load
    from sodaray.costs.flops import KNOWN_SHAPES

    text = files("sodaray.costs").joinpath(f"{device}.yaml").read_text(encoding="utf-8")
    measured = yaml_load(text)["measured"]
    shapes = {key: KNOWN_SHAPES[model] for key, model in measured["shapes"].items()}
    return tuple(MeasuredStep(**{**r, "shape": shapes[r["shape"]]}) for r in measured["rows"])


def fit_costs(steps: Sequence[MeasuredStep]) -> dict:
    """Per precision: the three `PrecisionCosts` constants that best predict `steps` (least
    squares on the relative error; each constant non-negative, one that would go negative left
    out and the rest refit). Measurements of one depth cannot tell the per-layer floor from the
    rest: the floor is then all per layer."""
    import numpy as np

    from sodaray.costs.devices import PrecisionCosts

    out = {}
    for precision in sorted({s.precision for s in steps}):
        rows = [s for s in steps if s.precision == precision]
        x = np.array([[s.passes, s.passes * s.shape.layers, s.flops] for s in rows], float)
        y = np.array([s.ms / 1000 for s in rows])
        a, b = x / y[:, None], np.ones(len(rows))  # relative: every row counts alike
        best: tuple[float, np.ndarray] | None = None
        # The rate column always stays; with one depth, "all per layer" is tried before "all
        # besides the layers" and wins the tie (it carries to other depths).
        for keep in ((0, 1, 2), (1, 2), (0, 2), (2,)):
            cols = a[:, keep]
            scale = np.abs(cols).max(axis=0)  # FLOPs ~1e12 beside counts ~1: condition it
            if np.linalg.matrix_rank(cols / scale) < len(keep):
                continue
            coef, *_ = np.linalg.lstsq(cols / scale, b, rcond=None)
            coef = coef / scale
            if (coef < 0).any():
                continue
            residual = float(np.sum((cols @ coef - b) ** 2))
            if best is None or residual < best[0] - 1e-9:  # a tie keeps the earlier
                full = np.zeros(3)
                full[list(keep)] = coef
                best = (residual, full)
        if best is None or best[1][2] <= 0:
            raise ValueError(f"{precision}: the measured steps fit no positive rate")
        p, per_layer, inverse_rate = best[1]
        out[precision] = PrecisionCosts(float(p), float(per_layer), float(1 / inverse_rate))
    return out


@dataclass
class Fit:
    """A fit and how well it predicts the steps it was fit on (and any held out)."""

    costs: Any  # sodaray.costs.devices.DeviceCosts
    # "label precision" -> predicted / measured - 1
    errors: dict[str, float] = field(default_factory=dict)


def fit_device(steps: Sequence[MeasuredStep], device: str, kind: str, source: str) -> Fit:
    """`DeviceCosts` fit to the steps not held out, and every step's relative error."""
    from sodaray.costs.devices import DeviceCosts

    costs = DeviceCosts(device, kind, fit_costs([s for s in steps if not s.held_out]), source)
    errors = {
        f"{s.label} {s.precision}": s.predicted_ms(costs) / s.ms - 1
        for s in steps
        if s.precision in costs.precisions
    }
    return Fit(costs, errors)


def gpu_suite(args, device: str) -> None:
    """`--suite gpu`: every case in this process, one line each, the ratios, and the costs."""
    import datetime

    import torch
    import yaml

    from sodaray.costs.devices import costs_to_data
    from sodaray.costs.flops import shape_from_config
    from sodaray.search.engine.executor import policy_for, resolve_executor

    cuda = device.startswith("cuda")
    executor = resolve_executor(args.executor)
    # The executor's on this device where none was asked for, as `invert` would take it.
    policy = policy_for(executor, args.policy, device)
    cases = args.case or (SUITES["gpu"] if cuda else GPU_SUITE_ON_CPU)
    default = CUDA_PRECISIONS if cuda else PRECISIONS
    precisions = [args.precision] if args.precision else list(default)
    if "float32" not in precisions:  # every costs table holds float32 (the fallback)
        precisions.insert(0, "float32")
    full = torch.cuda.get_device_name(torch.device(device)) if cuda else "cpu"
    peak = matrix_peak(device)
    unit = "kernels" if cuda else "cpu-ops"
    print(
        f"# gpu suite: device={device} ({full}) torch={torch.__version__} threads={args.threads} "
        f"steps={args.steps} executor={executor} policy={policy} "
        f"measured bf16 matrix peak {peak / 1e12:.4g} TFLOP/s",
        flush=True,
    )
    rows, measured, authors = [], [], {}
    current: tuple[str, object] | None = None
    model = None
    for spec in cases:
        name = spec.split(":")[0]
        if args.authors_cmd and name == "neo":
            authors[spec] = time_authors(args.authors_cmd, spec, args.steps)
        if current is None or current[0] != name:
            current = model = None  # the last model goes before the next one is built
            if cuda:
                torch.cuda.empty_cache()
            current = (name, build_model(name, device, args.dtype))
        model = current[1]
        for precision in precisions:
            row = measure_case(model, spec, args.steps, device, precision, peak, policy, executor)
            copies = "-" if row["copies_per_step"] is None else f"{row['copies_per_step']:.0f}"
            theirs = authors.get(spec)
            row["authors_same_run"] = theirs
            extra = ""
            if theirs:
                times = row["sample_steps_per_s"] / theirs
                extra += f"  authors {theirs:,.0f} sample-steps/s  x{times:.2f}"
            print(
                f"{spec:>14} {precision:<8} {row['ms_per_step']:8.1f} ms/step  "
                f"{row['sample_steps_per_s']:9,.0f} sample-steps/s  "
                f"{row['kernels_per_step']:6.0f} {unit}/step  "
                f"{copies} copies/step  "
                f"busy {100 * row['busy_share']:5.1f}%  {row['tflops']:8.3g} TFLOP/s  "
                f"{100 * row['share_of_peak']:5.2f}% of bf16 peak  peak {row['peak_gib']:.2f} GiB"
                f"{extra}",
                flush=True,
            )
            rows.append(row)
            measured.append(
                MeasuredStep(
                    f"{spec}",
                    shape_from_config(model.model.config),
                    row["n"],
                    row["samples_per_step"],
                    precision,
                    row["ms_per_step"],
                    bos=bool(model.prefix_ids),
                )
            )
            if args.json:
                with open(args.json, "a") as fh:
                    fh.write(json.dumps({**row, "device": device}) + "\n")
    by = {(r["case"], r["precision"]): r for r in rows}
    for spec in cases:
        base = by.get((spec, "float32"))
        parts = [
            f"{p} x{base['ms_per_step'] / by[(spec, p)]['ms_per_step']:.2f}"
            for p in precisions
            if p != "float32" and (spec, p) in by and base
        ]
        if authors.get(spec):
            parts += [
                f"x authors ({p}) {by[(spec, p)]['sample_steps_per_s'] / authors[spec]:.2f}"
                for p in precisions
                if (spec, p) in by
            ]
        if parts:
            print(f"# ratios {spec}: speed vs float32: " + ", ".join(parts), flush=True)
    when = datetime.date.today().isoformat()
    source = f"bench_invert.py --suite gpu on {full}, {when}, torch {torch.__version__}"
    source += f", policy={policy}, executor={executor}"
    if not cuda:
        source += f", threads={args.threads}"
    try:
        fit = fit_device(measured, short_device_name(device), "gpu" if cuda else "cpu", source)
    except ValueError as exc:  # noise left no positive rate (a CPU under load): say so, no file
        print(f"# costs: no fit ({exc}); nothing written", flush=True)
        return
    for precision, c in fit.costs.precisions.items():
        print(
            f"# costs ({precision}): a pass {1000 * c.pass_seconds:.2f} ms + "
            f"{1000 * c.layer_seconds:.3f} ms per layer; the samples' work at "
            f"{c.flops_per_second / 1e12:.3g} TFLOP/s",
            flush=True,
        )
    print(
        "# costs fit, predicted/measured - 1: "
        + ", ".join(f"{k} {100 * e:+.1f}%" for k, e in fit.errors.items()),
        flush=True,
    )
    if args.out:
        data = {
            **costs_to_data(fit.costs),
            "measured": {  # kept in the file, not read back
                "device_name": full,
                "bf16_matrix_peak_flops": peak,
                "steps": args.steps,
                "rows": [
                    {
                        k: row[k]
                        for k in (
                            "case",
                            "precision",
                            "ms_per_step",
                            "samples_per_step",
                            "kernels_per_step",
                            "busy_share",
                            "tflops",
                            "share_of_peak",
                            "authors_same_run",
                        )
                    }
                    for row in rows
                ],
            },
        }
        header = (
            "# sodaray device costs (sodaray.costs.devices): a step = passes x (pass_seconds + "
            "layers x layer_seconds)\n# + the samples' FLOPs / flops_per_second. Written by "
            "benchmarks/bench_invert.py --suite gpu.\n"
        )
        Path(args.out).write_text(header + yaml.safe_dump(data, sort_keys=False))
        print(f"# wrote {args.out}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--suite", choices=sorted(SUITES), default="default")
    parser.add_argument("--case", action="append", help="model:n:B (repeatable)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default="float32", help="model weights")
    parser.add_argument(
        "--precision",
        choices=("float32", "tf32", "bfloat16"),
        help="SODA gradient-pass precision (default float32; the gpu suite: float32, tf32 on CUDA, "
        "and bfloat16)",
    )
    parser.add_argument(
        "--policy",
        choices=("exact", "static"),
        help="--suite gpu: the scheduler's policy in place of the executor's (static where "
        "steps are captured, else exact); static pads each pass to the bucketed batch and width "
        "of sodaray.search.engine.scheduler.CAPTURE_SHAPES",
    )
    parser.add_argument(
        "--executor",
        choices=("eager", "graph"),
        help="--suite gpu: how a SODA step runs (default graph: captured once per shape on "
        "CUDA and replayed, eager elsewhere; each run captures its shapes in its first steps)",
    )
    parser.add_argument("--out", help="--suite gpu: write the fit costs here (YAML)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="also append JSON lines to this file")
    parser.add_argument(
        "--authors-cmd",
        help="command timing the authors' code for one case, with {length} (the input length), {B} "
        "and {steps} filled in ({n} as {length}); "
        "it must print a JSON line with sample_steps_per_s (run before each neo case)",
    )
    parser.add_argument("--_child", help=argparse.SUPPRESS)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args._child:
        import logging
        import warnings

        warnings.filterwarnings("ignore")
        logging.disable(logging.WARNING)
        print(json.dumps(run_case(args._child, args.steps, device, args.dtype, args.precision)))
        return
    if args.suite == "gpu":
        gpu_suite(args, device)
        return
    args.precision = args.precision or "float32"

    ceiling = matmul_gflops(device)
    print(
        f"# device={device} threads={args.threads} dtype={args.dtype} steps={args.steps} "
        f"torch={torch.__version__} matmul_ceiling={ceiling:.1f} GFLOP/s",
        flush=True,
    )
    for spec in args.case or SUITES[args.suite]:
        authors = None
        if args.authors_cmd and spec.startswith("neo:"):
            authors = time_authors(args.authors_cmd, spec, args.steps)
        env = dict(os.environ, TRANSFORMERS_VERBOSITY="error", HF_HUB_DISABLE_PROGRESS_BARS="1")
        cmd = [
            sys.executable,
            __file__,
            "--_child",
            spec,
            "--steps",
            str(args.steps),
            "--device",
            device,
            "--dtype",
            args.dtype,
            "--threads",
            str(args.threads),
            "--precision",
            args.precision,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            tail = proc.stderr.strip().splitlines()[-1:] or ["?"]
            print(f"{spec}: FAILED {tail[0]}", flush=True)
            continue
        row = json.loads(proc.stdout.strip().splitlines()[-1])
        row["ceiling_gflops"] = ceiling
        key = (row["model"], row["n"], row["B"])
        rate = row["sample_steps_per_s"]
        extra = ""
        if key in REFERENCE and device == "cpu":
            ref, goal = REFERENCE[key]
            extra = f" issue: authors={ref} goal={goal} x_goal={rate / goal:.2f}"
        if authors is not None:
            row["authors_same_run"] = authors
            extra += f" | same run: authors={authors:.1f} x_authors={rate / authors:.2f}"
            if key in REFERENCE and device == "cpu":
                # The goal is a multiple of the authors' rate; apply it to this run's rate.
                extra += f" x_goal={rate / (authors * goal / ref):.2f}"
        print(
            f"{spec:>16}  V={row['V']:>5}  {row['sample_steps_per_s']:8.1f} sample-steps/s  "
            f"{row['ms_per_step']:8.1f} ms/step  {row['gflops']:7.1f} GFLOP/s "
            f"({100 * row['gflops'] / ceiling:4.1f}% of matmul)  peak {row['peak_gib']:.2f} GiB"
            f"{extra}",
            flush=True,
        )
        if args.json:
            with open(args.json, "a") as fh:
                fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
