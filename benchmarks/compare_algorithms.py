"""SODA vs GCG vs embedding search at the same wall-clock budget per target.

    python benchmarks/compare_algorithms.py --per-length 20 --lengths 1-5 --seconds 20

Random inputs (seed 1, uniform over the vocabulary) of each length on
../shared/models/stories260K (or --model), full next-token logits observed. Each algorithm runs
with its default (paper) parameters, no step limit, and `max_seconds` per target; prints one line
per algorithm and length and a Markdown table of exact rates.
"""

from __future__ import annotations

import argparse
import logging
import time
import warnings
from pathlib import Path

import numpy as np
import torch

import sodaray

SHARED = Path(__file__).resolve().parents[2] / "shared"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=str(SHARED / "models/stories260K"))
    parser.add_argument("--lengths", default="1-5")
    parser.add_argument("--per-length", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=20.0, help="wall-clock budget per target")
    parser.add_argument("--algorithms", default="soda,gcg,embedding")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    torch.set_num_threads(args.threads)

    lo, hi = (int(x) for x in args.lengths.split("-"))
    model = sodaray.load_model(args.model)
    rng = np.random.default_rng(1)
    tokens = [
        rng.integers(0, model.vocab_size, n).tolist()
        for n in range(lo, hi + 1)
        for _ in range(args.per_length)
    ]
    targets = sodaray.make_targets(model, tokens)
    print(
        f"# model={args.model} lengths={lo}-{hi} per_length={args.per_length} "
        f"budget={args.seconds}s/target threads={args.threads}",
        flush=True,
    )
    table: dict[str, dict[int, float]] = {}
    for algo in args.algorithms.split(","):
        config = sodaray.make_config(
            algo,
            {
                "max_steps": 10**9,
                "max_seconds": args.seconds,
                "max_batch_size": args.per_length,
                "seed": 0,
            },
        )
        t0 = time.perf_counter()
        results = sodaray.invert(model, targets, config)
        wall = time.perf_counter() - t0
        table[algo] = {}
        for n in range(lo, hi + 1):
            rows = [r for r in results if r.predicted_length == n]
            exact = sum(bool(r.exact) for r in rows) / len(rows)
            found = sum(r.found for r in rows) / len(rows)
            steps = np.mean([r.steps for r in rows])
            table[algo][n] = exact
            print(
                f"{algo:>10} n={n}  exact {exact:6.1%}  found {found:6.1%}  "
                f"mean steps {steps:8.1f}",
                flush=True,
            )
        overall = sum(bool(r.exact) for r in results) / len(results)
        table[algo][0] = overall
        print(f"{algo:>10} all  exact {overall:6.1%}  wall {wall:.0f}s", flush=True)
    header = "| algorithm | " + " | ".join(f"n={n}" for n in range(lo, hi + 1)) + " | all |"
    print("\n" + header + "\n|" + "---|" * (hi - lo + 3))
    for algo, row in table.items():
        cells = " | ".join(f"{row[n]:.0%}" for n in range(lo, hi + 1))
        print(f"| {algo} | {cells} | {row[0]:.0%} |")


if __name__ == "__main__":
    main()
