"""Issue 17: the trained inverter vs SODA on stories260K, seed-1 Random inputs, text objective.

python benchmarks/inverter_eval.py CHECKPOINT [--per-length 20] [--soda-seconds 2]
"""

from __future__ import annotations

import argparse
import time

import sodaray
from sodaray.api import make_config
from sodaray.data.build import _random_samples

MODEL = "../shared/models/stories260K"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("--per-length", type=int, default=20)
    ap.add_argument("--soda-seconds", type=float, default=2.0)
    ap.add_argument("--model", default=MODEL)
    a = ap.parse_args()
    model = sodaray.load_model(a.model)
    inputs = [s[2] for s in _random_samples(model.vocab_size, [1, 2, 3, 4, 5], a.per_length, 1)]
    obj = sodaray.Objective(kind="text", output_tokens=10)
    targets = sodaray.make_targets(model, inputs, objective=obj)
    for name, params in (
        ("inverter", {"checkpoint": a.checkpoint}),
        ("soda", {"max_seconds": a.soda_seconds, "max_batch_size": 100}),
    ):
        t0 = time.perf_counter()
        res = sodaray.invert(model, targets, make_config(name, params))
        secs = time.perf_counter() - t0
        exact = sum(bool(r.exact) for r in res)
        found = sum(r.found for r in res)
        partial = sum(
            sum(p == t for p, t in zip(r.tokens, r.true_tokens, strict=True)) / r.predicted_length
            for r in res
        ) / len(res)
        print(
            f"{name}: n={len(res)} exact={exact} found={found} partial={partial:.3f} "
            f"wall={secs:.1f}s"
        )


if __name__ == "__main__":
    main()
