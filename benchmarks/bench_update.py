"""SODA's Adam-and-decay update over the (T, V) state: eager (eight passes over it) against the
"compiled" executor's one fused inductor kernel (`Executor.fused`), in one run, one line each.

    python benchmarks/bench_update.py                          # CPU, T=25 rows of Qwen's vocab
    python3 benchmarks/bench_update.py --device cuda --rows 3000 --repeats 8  # Qwen n=3, B=1000
"""

from __future__ import annotations

import argparse
import time

import torch

from sodaray.search.executor import Executor
from sodaray.search.soda import _adam_decay


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rows", type=int, default=25, help="T: the batch's input tokens")
    parser.add_argument("--vocab", type=int, default=151936, help="V (Qwen2.5's by default)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    gen = torch.Generator().manual_seed(0)
    shape = (args.rows, args.vocab)
    grad = torch.randn(shape, generator=gen).to(dev)
    column = [torch.full((args.rows, 1), value, device=dev) for value in (0.065, 0.1, 0.005, 1e-8)]
    decay = torch.full((args.rows, 1), 0.9, device=dev)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    finals, times = {}, {}
    for name in ("eager", "compiled"):
        update = Executor(name).fused(_adam_decay)
        z = torch.randn(shape, generator=torch.Generator().manual_seed(1)).to(dev)
        m, v = torch.zeros_like(z), torch.zeros_like(z)
        for _ in range(3):  # warm-up: the build, first-touch pages
            update(z, grad.clone(), m, v, *column, decay, None)
        spare = [grad.clone() for _ in range(args.repeats)]  # consumed: one each, made before
        sync()
        t0 = time.perf_counter()
        for g in spare:
            update(z, g, m, v, *column, decay, None)
        sync()
        times[name] = (time.perf_counter() - t0) / args.repeats
        finals[name] = z.cpu()
    gib = args.rows * args.vocab * 4 / 2**30
    diff = (finals["eager"] - finals["compiled"]).abs().max().item()
    print(
        f"update T={args.rows} V={args.vocab} ({gib:.3f} GiB a tensor) on {args.device}, "
        f"{args.repeats} updates: eager {1e3 * times['eager']:.2f} ms, fused "
        f"{1e3 * times['compiled']:.2f} ms, x{times['eager'] / times['compiled']:.2f}; "
        f"max difference after {args.repeats + 3} updates {diff:.3g}"
    )


if __name__ == "__main__":
    main()
