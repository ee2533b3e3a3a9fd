"""What SODA's two non-public fast paths buy, against the public path each falls back to.

    python benchmarks/bench_kernels.py [--model smollm2-135m] [--batch 16] [--length 3]
        [--steps 30] [--rounds 3] [--threads 2]

- softmax: ATen's `_softmax.out` / `_softmax_backward_data.out` into reused buffers, against
  `torch.softmax` (a new (T, V) tensor each step, copied) and the backward written with public
  ops (`sodaray.search.soda.relaxed`, where the relaxed pass reads them);
- denormals: flush-to-zero on every OpenMP thread (`GOMP_parallel` through ctypes), against
  `torch.set_flush_denormal` on the calling thread only (`sodaray.search.denormals`).

Each round runs the same search (same inputs, seed and steps) in every mode, in turn, in one
process; one line per mode: sample-steps per second (median over rounds) and its ratio to the
fast path, plus the exact matches (the public softmax backward rounds differently, so a search
may move). Threads: the torch intra-op pool, where the denormal flush matters.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cost import folder  # noqa: E402

import sodaray  # noqa: E402
from sodaray.search import denormals
from sodaray.search.soda import relaxed

FAST = (relaxed.SOFTMAX_OUT, relaxed.SOFTMAX_BACKWARD_OUT)
OPENMP = denormals._openmp_runtime  # the fast flush's lookup (None: the public path alone)


def set_mode(softmax_public: bool, flush_public: bool) -> None:
    relaxed.SOFTMAX_OUT, relaxed.SOFTMAX_BACKWARD_OUT = (None, None) if softmax_public else FAST
    denormals._openmp_runtime = (lambda: None) if flush_public else OPENMP


MODES = {
    "fast (both non-public paths)": (False, False),
    "public softmax": (True, False),
    "public denormal flush": (False, True),
    "public both": (True, True),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--length", type=int, default=3)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    path = folder(args.model)
    if path is None:
        sys.exit(f"{args.model}: absent")
    torch.set_num_threads(args.threads)
    model = sodaray.load_model(str(path), bos=True)
    tokens = torch.randint(
        0, model.vocab_size, (args.batch, args.length), generator=torch.Generator().manual_seed(0)
    ).tolist()
    targets = sodaray.make_targets(model, tokens)
    config = sodaray.SodaConfig(max_steps=args.steps, max_batch_size=args.batch)
    sodaray.invert(model, targets, sodaray.SodaConfig(max_steps=2, max_batch_size=args.batch))
    rates: dict[str, list[float]] = {mode: [] for mode in MODES}
    exact: dict[str, int] = {}
    for _ in range(args.rounds):
        for mode, (softmax_public, flush_public) in MODES.items():
            set_mode(softmax_public, flush_public)
            start = time.perf_counter()
            results = sodaray.invert(model, targets, config)
            rates[mode].append(sum(r.steps for r in results) / (time.perf_counter() - start))
            exact[mode] = sum(r.exact for r in results)
    set_mode(False, False)
    base = statistics.median(rates["fast (both non-public paths)"])
    print(
        f"# {args.model}, batch {args.batch}, length {args.length}, {args.steps} steps, "
        f"{args.threads} threads, {args.rounds} rounds (median)"
    )
    for mode, values in rates.items():
        rate = statistics.median(values)
        print(
            f"{mode:30s} {rate:8.1f} sample-steps/s  {rate / base:.2f}x of fast  "
            f"exact {exact[mode]}/{args.batch}"
        )


if __name__ == "__main__":
    main()
