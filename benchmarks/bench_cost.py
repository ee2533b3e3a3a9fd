"""The cost model (`sodaray.costs.flops`) against measured CPU rates: for each real model here, a
SODA
search's sample-steps per second on one thread beside the rate the model's FLOPs predict at this
CPU's float32 matmul peak (one thread) and a stated efficiency.

    python benchmarks/bench_cost.py [--models stories260k,smollm2-135m,gemma3-270m,qwen2.5-0.5b]
        [--length 3] [--batch 16] [--steps 20] [--efficiency 0.5]

One line per model: measured rate, predicted rate, and their ratio (the check: within 2x).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import real_models  # noqa: E402

import sodaray  # noqa: E402
from sodaray.costs.flops import model_shape  # noqa: E402

STORIES = real_models.SHARED / "models" / "stories260K"


def cpu_peak_flops(threads: int = 1, size: int = 1024, repeats: int = 5) -> float:
    """This CPU's float32 matmul rate on `threads` threads: the 'peak' a CPU plan is checked
    against (a large matmul is as close to peak as torch gets here)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(size, size), torch.randn(size, size)
        a @ b  # warm-up
        start = time.perf_counter()
        for _ in range(repeats):
            a @ b
        return 2 * size**3 * repeats / (time.perf_counter() - start)
    finally:
        torch.set_num_threads(before)


def folder(name: str) -> Path | None:
    if name == "stories260k":
        return STORIES if STORIES.is_dir() else None
    source = real_models.model_sources().get(name)
    return None if source is None else real_models.plain_copy(name, *source)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="stories260k,smollm2-135m,gemma3-270m,qwen2.5-0.5b")
    p.add_argument("--length", type=int, default=3)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--efficiency", type=float, default=0.5, help="stated share of the CPU peak")
    args = p.parse_args()
    torch.set_num_threads(1)  # a CPU replica's thread count (num_cpus: 1)
    peak = cpu_peak_flops(threads=1)
    print(
        f"# cpu float32 matmul peak, 1 thread: {peak / 1e9:.1f} GFLOP/s; "
        f"stated efficiency {args.efficiency}"
    )
    for name in args.models.split(","):
        path = folder(name)
        if path is None:
            print(f"{name}: absent, skipped")
            continue
        model = sodaray.load_model(str(path), bos=True)
        shape = model_shape(str(path))
        assert shape is not None, path
        tokens = torch.randint(
            0,
            model.vocab_size,
            (args.batch, args.length),
            generator=torch.Generator().manual_seed(0),
        ).tolist()
        targets = sodaray.make_targets(model, tokens)
        config = sodaray.SodaConfig(max_steps=2, max_batch_size=args.batch)
        sodaray.invert(model, targets, config)  # warm-up
        start = time.perf_counter()
        results = sodaray.invert(
            model, targets, sodaray.SodaConfig(max_steps=args.steps, max_batch_size=args.batch)
        )
        seconds = time.perf_counter() - start
        measured = sum(r.steps for r in results) / seconds
        flops = shape.step_flops(args.length, 1, bos=True)
        predicted = peak * args.efficiency / flops
        print(
            f"{name}: {flops / 1e9:.3f} GFLOP/sample-step; measured {measured:,.1f} "
            f"sample-steps/s, predicted {predicted:,.1f}; measured/predicted "
            f"{measured / predicted:.2f} (achieved {flops * measured / peak:.0%} of peak)"
        )


if __name__ == "__main__":
    main()
