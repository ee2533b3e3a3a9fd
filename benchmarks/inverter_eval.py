"""Issue 17: the trained inverter vs SODA and GCG at equal wall time on stories260K, seed-1
Random inputs, text objective (the greedy continuation the text inverter observes).

    python benchmarks/inverter_eval.py CHECKPOINT --per-length 20 --train-seconds 960 \\
        [--budget inference|amortised|both] [--algorithms soda,gcg] [--threads 1]

The inverter runs first; its wall time (checkpoint load + decoding + the hard-match check) sets
the searches' budget. "inference": the same total wall time as the inverter's inference;
"amortised": the inverter's inference plus its training time (`--train-seconds`, the whole
`train-inverter` command), i.e. training amortised over this test set only. The searches run
one batch per length (`max_batch_size` = per-length), so the targets of a batch share the CPU:
each target's `max_seconds` (its time in the batch) is per-length x the per-target share, and
the whole run takes about the same wall time as the inverter's. `max_steps` is lifted so time
binds. One line per run: Exact and Found with Wilson 95% intervals, Partial as the token-level
share correct (Wilson, tokens counted as trials) and as the per-sample mean with its standard
error, and the measured wall seconds.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import sodaray
from sodaray.api import make_config
from sodaray.data.build import random_samples
from sodaray.report.metrics import mean_se, proportion
from sodaray.search.engine.base import InversionResult

MODEL = "../shared/models/stories260K"
LENGTHS = [1, 2, 3, 4, 5]


def summarise(name: str, res: list[InversionResult], wall: float, extra: str = "") -> dict:
    """One line of Exact / Found / Partial with intervals; returns the same as a dict."""
    n = len(res)
    exact = proportion(sum(bool(r.exact) for r in res), n)
    found = proportion(sum(bool(r.found) for r in res), n)
    hits = [sum(p == t for p, t in zip(r.tokens, r.true_tokens or [], strict=False)) for r in res]
    lengths = [len(r.true_tokens or r.tokens) for r in res]  # the true length, not the guess
    total = sum(lengths)
    tokens = proportion(sum(hits), total)
    per_sample = mean_se([h / n_ for h, n_ in zip(hits, lengths, strict=True)])
    print(
        f"{name}: n={n} exact={exact.k} {exact.percent()} found={found.k} {found.percent()} "
        f"partial_tokens={tokens.k}/{total} {tokens.percent()} "
        f"partial_mean={per_sample.percent()} wall={wall:.1f}s{extra}",
        flush=True,
    )
    return {
        "name": name,
        "n": n,
        "exact": exact.k,
        "found": found.k,
        "tokens_right": tokens.k,
        "tokens": total,
        "partial_mean": per_sample.value,
        "wall": wall,
        "by_length": {
            n_: sum(bool(r.exact) for r, m in zip(res, lengths, strict=True) if m == n_)
            for n_ in sorted(set(lengths))
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--per-length", type=int, default=20)
    ap.add_argument(
        "--train-seconds", type=float, default=0.0, help="wall of the train-inverter command"
    )
    ap.add_argument("--budget", choices=["inference", "amortised", "both"], default="both")
    ap.add_argument("--algorithms", default="soda,gcg")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--json", help="append one JSON line per run to this file")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model = sodaray.load_model(a.model)
    inputs = [s[2] for s in random_samples(model.vocab_size, LENGTHS, a.per_length, 1)]
    obj = sodaray.Objective(kind="text", output_tokens=10)
    targets = sodaray.make_targets(model, inputs, objective=obj)
    rows = []

    t0 = time.perf_counter()
    res = sodaray.invert(model, targets, make_config("inverter", {"checkpoint": a.checkpoint}))
    infer = time.perf_counter() - t0
    rows.append(summarise("inverter", res, infer, f" train={a.train_seconds:.0f}s"))

    budgets = []
    if a.budget in ("inference", "both"):
        budgets.append(("inference", infer))
    if a.budget in ("amortised", "both"):
        if a.train_seconds <= 0:
            ap.error("--budget amortised needs --train-seconds")
        budgets.append(("amortised", infer + a.train_seconds))
    for label, total in budgets:
        share = total / len(inputs)  # wall seconds per target, as the inverter spent them
        per_target = share * a.per_length  # time in a batch of per-length targets
        for name in a.algorithms.split(","):
            params = {
                "max_seconds": per_target,
                "max_batch_size": a.per_length,
                "max_steps": 10**8,
            }
            t0 = time.perf_counter()
            res = sodaray.invert(model, targets, make_config(name, params))
            wall = time.perf_counter() - t0
            steps = sum(r.steps for r in res) / len(res)
            rows.append(
                summarise(
                    f"{name}@{label}",
                    res,
                    wall,
                    f" budget={total:.1f}s max_seconds={per_target:.2f} mean_steps={steps:.0f}",
                )
            )
    if a.json:
        with open(a.json, "a") as fh:
            for row in rows:
                fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
