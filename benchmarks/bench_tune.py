"""Tuning throughput (issue 29): a study of `--trials` 8 trials x 16 inputs on stories260K,
random sampler (seed 0), no pruner, one CPU replica (one thread), in one run:

    python benchmarks/bench_tune.py [--baseline WORKTREE] [--trials 8] [--steps 300]

`baseline`: the tuner of an earlier commit (a worktree, e.g. `git worktree add /tmp/base 2401ef3`):
one trial in its replica's batch at a time. `shared`: this tree, trials sharing one replica's
batch (`max_batch_size` 128 holds all 8). `alone`: this tree with `max_batch_size` 16, so each
trial has the batch to itself. Each study runs in its own process and Ray session. One line per
study: wall time, trials per hour, each trial's exact count; then the ratios, and whether every
trial's rows (per sample: found, exact, steps, final tokens) are identical shared and alone.
The sampler proposes the same parameters in all three (same seed, same order of asks).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
STORIES = ROOT.parent / "shared" / "models" / "stories260K"


def tuning_doc(args: argparse.Namespace, batch: int) -> dict:
    return {
        "name": "bench-tune",
        "model": {"id": str(STORIES), "num_cpus": 1},
        "data": {
            "name": "random",
            "build": {"dataset": "random", "lengths": "1-4", "per_length": 4, "seed": 0},
        },
        "algorithm": "soda",
        "objective": {"kind": "logits"},
        "fixed": {"max_batch_size": batch},
        "space": {
            "learning_rate": {"type": "float", "low": 0.01, "high": 0.3, "log": True},
            "temperature": {"type": "float", "low": 0.02, "high": 0.11},
            "reset_period": {"type": "int", "low": 10, "high": 110, "step": 10},
        },
        "max_steps": args.steps,
        "trials": args.trials,
        "metric": "exact",
        "sampler": "random",
        "pruner": "none",
        "checkpoints": 2,
        "seed": 0,
    }


def run_one(args: argparse.Namespace) -> None:
    """One study in this process, under whichever sodaray is on the path; one JSON line out."""
    import pyarrow.parquet as pq
    import ray

    from sodaray.tuner import load_tuning, run_tuning

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.yaml"
        path.write_text(yaml.safe_dump(tuning_doc(args, 16 if args.run_one == "alone" else 128)))
        t0 = time.perf_counter()
        run = run_tuning(load_tuning(path), Path(tmp) / "out", trials=args.trials, workers=1)
        wall = time.perf_counter() - t0
        rows = {}
        for f in sorted((Path(tmp) / "out" / "bench-tune" / "trials").glob("*.parquet")):
            t = pq.read_table(f).to_pydict()
            cols = [c for c in ("sample_id", "found", "exact", "steps", "tokens") if c in t]
            rows[f.stem] = sorted(zip(*(map(str, t[c]) for c in cols), strict=True))
    ray.shutdown()
    outcomes = sorted((o.number, o.state, o.value, o.params) for o in run.outcomes)
    print(json.dumps({"wall": wall, "outcomes": outcomes, "rows": rows}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", help="a worktree of an earlier commit, run in the same run")
    p.add_argument("--trials", type=int, default=8)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--run-one", choices=["baseline", "shared", "alone"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.run_one:
        return run_one(args)
    modes = [("shared", str(ROOT)), ("alone", str(ROOT))]
    if args.baseline:
        modes.insert(0, ("baseline", str(Path(args.baseline).resolve())))
    got = {}
    for mode, path in modes:
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--run-one",
            mode,
            "--trials",
            str(args.trials),
            "--steps",
            str(args.steps),
        ]
        # cwd: Ray's workers start there and import the package from it before PYTHONPATH.
        env = {**os.environ, "PYTHONPATH": path}
        out = subprocess.run(
            cmd, env=env, cwd=path, check=True, capture_output=True, text=True
        ).stdout
        r = got[mode] = json.loads(out.strip().splitlines()[-1])
        values = " ".join(f"{v:.3f}" if v is not None else "-" for _, _, v, _ in r["outcomes"])
        print(
            f"tune {mode:<8} wall {r['wall']:6.1f}s  {3600 * args.trials / r['wall']:6.0f} "
            f"trials/hour  exact rate per trial: {values}",
            flush=True,
        )
    proposed = {json.dumps([o[3] for o in r["outcomes"]]) for r in got.values()}
    print(f"tune same parameters proposed in every study: {len(proposed) == 1}")
    if "baseline" in got:
        for mode in ("shared", "alone"):
            print(
                f"tune ratio {mode} vs baseline: "
                f"{got['baseline']['wall'] / got[mode]['wall']:.2f}x trials per hour",
                flush=True,
            )
    same = got["shared"]["rows"] == got["alone"]["rows"] and got["shared"]["rows"]
    print(
        f"tune identical per-trial rows shared vs alone: {bool(same)} "
        f"({len(got['shared']['rows'])} trials)"
    )


if __name__ == "__main__":
    main()
