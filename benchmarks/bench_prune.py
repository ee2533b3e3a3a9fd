"""Issue 54: which early value ranks trials, and which pruner spends least for the best value.

    python benchmarks/bench_prune.py TUNING_FILE [KEY=VALUE ...] [--trials 12] [--workers 1]
        [--pruners none,median,successive_halving,hyperband] [--signal loss] [--out DIR]

One study per pruner, each from scratch in its own folder, with the same file, seed and trial
count (`sodaray tune FILE ... --json`, one process and Ray session each). Then:

- from the unpruned study (`none`, which runs every trial to its budget and records every
  signal's value at every checkpoint: the trial attribute `signals`), per signal: how many
  distinct values the first checkpoint reported across trials, and Spearman's rank correlation
  of the first checkpoint's value with the trial's final value (what an early ranking is for);
- per study: the best value, the best trial's exact count with its Wilson interval, the
  sample-steps spent and saved, the wall time, and whether its best value lies within the
  unpruned study's best trial's interval (same number of samples), and spent/unpruned spent.

One line per figure, as each comes.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rho with average ranks for ties (nan when either side is constant)."""

    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        out = [0.0] * len(v)
        i = 0
        while i < len(v):
            j = i
            while j + 1 < len(v) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2
            i = j + 1
        return out

    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    vx = math.sqrt(sum((a - mx) ** 2 for a in rx))
    vy = math.sqrt(sum((b - my) ** 2 for b in ry))
    return cov / (vx * vy) if vx and vy else math.nan


def run_study(args: argparse.Namespace, pruner: str) -> tuple[dict, float, Path]:
    out = Path(args.out) / pruner
    cmd = [
        sys.executable,
        "-m",
        "sodaray",
        "tune",
        args.tuning,
        *args.overrides,
        f"pruner={pruner}",
        f"signal={args.signal}",
        "--trials",
        str(args.trials),
        "--workers",
        str(args.workers),
        "--out",
        str(out),
        "--json",
    ]
    began = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - began
    if proc.returncode != 0:
        sys.exit(f"{pruner}: exit {proc.returncode}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1]), wall, out


def trials_of(board: dict) -> list:
    import optuna

    from sodaray.tuner.storage import open_storage

    study = optuna.load_study(study_name=board["study"], storage=open_storage(board["storage"]))
    return study.get_trials(deepcopy=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tuning")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--pruners", default="none,median,successive_halving,hyperband")
    parser.add_argument("--signal", default="loss")
    parser.add_argument("--out", default="/tmp/bench-prune")
    args = parser.parse_args()

    from sodaray.report.metrics import proportion

    sys.path.insert(0, str(ROOT))
    reference = None  # the unpruned study's best: (value, low, high, spent)
    for pruner in args.pruners.split(","):
        board, wall, _ = run_study(args, pruner)
        trials = trials_of(board)
        done = [t for t in trials if t.state.name == "COMPLETE"]
        best = max(done, key=lambda t: t.value)
        samples = int(best.user_attrs["samples"])
        rate = proportion(int(best.user_attrs["exact"]), samples)
        spent, saved = board["sample_steps"]["spent"], board["sample_steps"]["saved"]
        states = ", ".join(f"{v} {k}" for k, v in board["states"].items())
        print(
            f"{pruner}: best value {best.value:.4f} (trial {best.number}, exact "
            f"{rate.k}/{rate.n}, {rate.percent()}), {states}; sample-steps spent {spent:,}, "
            f"saved {saved:,}; wall {wall:.0f} s",
            flush=True,
        )
        if pruner == "none":
            reference = (best.value, rate.low, rate.high, spent)
            for signal in ("exact", "loss", "tokens"):
                first, final = [], []
                for t in done:
                    values = t.user_attrs.get("signals", {})
                    if values:
                        step = min(values, key=int)
                        first.append(values[step][signal])
                        final.append(t.value)
                distinct = len(set(first))
                rho = spearman(first, final) if first else math.nan
                print(
                    f"  signal {signal}: first checkpoint {distinct} distinct values over "
                    f"{len(first)} trials; Spearman with the final value {rho:.2f}",
                    flush=True,
                )
        elif reference is not None:
            value, low, high, ref_spent = reference
            inside = best.user_attrs["exact"] / samples >= low
            print(
                f"  against none: best exact rate {'within' if inside else 'below'} the "
                f"unpruned best's interval ({100 * low:.1f}-{100 * high:.1f}%), best value "
                f"{best.value:.4f} vs {value:.4f}; spent {spent / ref_spent:.2f} of its "
                "sample-steps",
                flush=True,
            )


if __name__ == "__main__":
    main()
