"""SODA throughput: sample-steps/s, achieved GFLOP/s and peak memory, one line per case.

    python benchmarks/bench_invert.py                    # the issue-7 table + B-scaling cases
    python benchmarks/bench_invert.py --suite scaling    # n, B and vocabulary sweep
    python benchmarks/bench_invert.py --suite gpu        # B in {64, 256, 1000}, n=10 (on CUDA)
    python benchmarks/bench_invert.py --case neo:3:64    # one case: model:n:B
    python benchmarks/bench_invert.py --authors-cmd "python run_authors.py {length} {B} {steps}"

`--authors-cmd` times the authors' implementation in the same run, interleaved case by case, so
the comparison does not depend on how fast the shared machine is that hour. The command runs
outside this repository (their code is not part of sodaray) and must print one JSON line with
`sample_steps_per_s`; benchmarks/RESULTS.md says how it was set up.

Models: `neo` is a randomly initialised TinyStories-33M-shaped GPT-Neo (hidden 768, 4 layers, 16
heads, vocab 50257, window 256, alternating global/local attention, initializer_range 0.1, so that
nothing is solved within the run); `stories` is ../shared/models/stories260K (vocab 512); `smollm`
is the SmolLM2-135M GGUF (vocab 49152). Targets: torch.manual_seed(1), randint(0, V, (B, n)); the
paper's TinyStories-33M preset; every case runs in its own process so peak memory is its own.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

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
    "gpu": ["neo:10:64", "neo:10:256", "neo:10:1000"],
    "memory": ["neo:10:1000"],
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
    if name == "stories":
        return sodaray.load_model(str(SHARED / "models/stories260K"), device=device, dtype=dtype)
    if name == "smollm":
        path = SHARED / "models/smollm2-135m-instruct-q4_1/SmolLM2-135M-Instruct.Q4_1.gguf"
        return sodaray.load_model(str(path), device=device, dtype=dtype)
    raise SystemExit(f"unknown model {name!r}")


def body_params(model) -> int:
    """Parameters used per position outside the embedding and unembedding matrices."""
    emb = model.embedding_matrix
    skip = {emb.data_ptr(), model.model.get_output_embeddings().weight.data_ptr()}
    return sum(
        p.numel()
        for p in model.model.parameters()
        if p.data_ptr() not in skip and p.dim() > 1 and p.shape[0] != 2048
    )


def flops_per_sample_step(model, n: int, m: int = 1) -> float:
    """FLOPs one SODA step needs for one sample, not counting the hard check (which runs only
    when the argmax changed, and is then screened by a probe), so achieved GFLOP/s is a lower
    bound: relaxed product fwd + its input gradient 2 * 2nVd; body fwd + input-only bwd
    2 * 2(n+m-1)P; unembedding at the m observed positions fwd + bwd 2 * 2mVd.
    """
    V, d = model.embedding_matrix.shape
    P = body_params(model)
    L = n + m - 1
    return float(2 * (2 * n * V * d) + 2 * (2 * L * P) + 2 * (2 * m * V * d))


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--suite", choices=sorted(SUITES), default="default")
    parser.add_argument("--case", action="append", help="model:n:B (repeatable)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default="float32", help="model weights")
    parser.add_argument("--precision", default="float32", help="SODA gradient-pass precision")
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
