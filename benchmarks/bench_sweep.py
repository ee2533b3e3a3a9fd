"""Sweep throughput on this machine.

    python benchmarks/bench_sweep.py [--baseline WORKTREE] [--case stream|quickstart|all]

`stream` (the default; issues 15 and 29): samples that differ in difficulty (random inputs,
lengths 1-10 mixed, `--stream-per-length` 40 each, `--stream-steps` 600), small shards
(`--shard-size` 10) against a larger batch (`--batch` 64), one CPU actor (one thread). Runs, each
in its own process and Ray session, in one run: the runner of `--baseline` (a worktree of an
earlier commit, e.g. `git worktree add /tmp/base 2401ef3`), then this tree with lengths mixed in
one padded batch (the default) and with a batch per length (`mix_lengths: false`). One line per
run: wall time (Ray and actor start-up included), sample-steps/s over it, the batch occupancy
(searches per step over the batch's capacity, over every step, tails included) and found /
exact with 95% Wilson intervals; then the ratios against the baseline.

`quickstart`: the quickstart sweep with 1 and 2 CPU actors: samples/s over the whole run.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
import warnings
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--per-length", type=int, default=8)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--actors", default="1,2")
    parser.add_argument("--case", choices=["quickstart", "stream", "all"], default="stream")
    parser.add_argument("--stream-per-length", type=int, default=40)
    parser.add_argument("--stream-steps", type=int, default=600)
    parser.add_argument("--shard-size", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--baseline", help="a worktree of an earlier commit, run in the same run")
    parser.add_argument("--run-one", choices=["baseline", "mixed", "split"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    if args.run_one:
        return run_one(args)
    if args.case == "stream":
        return stream_case(args)

    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        if args.case in ("quickstart", "all"):
            quickstart(args)
    finally:
        ray.shutdown()
    if args.case == "all":
        stream_case(args)


def quickstart(args: argparse.Namespace) -> None:
    from sodaray.runner import load_sweep, run_sweep

    spec = yaml.safe_load((ROOT / "sweeps/quickstart.yaml").read_text())
    spec["models"][0]["id"] = str(ROOT.parent / "shared/models/stories260K")
    spec["datasets"][0]["build"]["per_length"] = args.per_length
    spec["max_steps"] = args.steps
    for actors in (int(a) for a in args.actors.split(",")):
        spec["models"][0]["replicas"] = actors
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "sweep.yaml"
            path.write_text(yaml.safe_dump(spec))
            sweep = load_sweep(path)
            t0 = time.perf_counter()
            run = run_sweep(sweep, Path(tmp) / "out")
            wall = time.perf_counter() - t0
        samples = sum(d.samples for d in run.done)
        print(
            f"quickstart actors={actors}  {samples / wall:6.2f} samples/s  "
            f"({samples} samples, {len(run.done)} shards, {wall:.1f}s)  "
            f"occupancy {100 * (run.occupancy or 0):.0f}%",
            flush=True,
        )


def stream_spec(args: argparse.Namespace, mix_lengths: bool) -> dict:
    model = {"id": str(ROOT.parent / "shared/models/stories260K"), "num_cpus": 1}
    if not mix_lengths:
        model["mix_lengths"] = False
    build = {
        "dataset": "random",
        "lengths": "1-10",
        "per_length": args.stream_per_length,
        "seed": 1,
    }
    return {
        "name": "stream",
        "models": [model],
        "datasets": [{"name": "random", "build": build}],
        "algorithms": [{"name": "soda", "params": {"max_batch_size": args.batch}}],
        "objectives": [{"kind": "logits"}],
        "max_steps": args.stream_steps,
        "shard_size": args.shard_size,
    }


def run_one(args: argparse.Namespace) -> None:
    """One sweep run in this process (`--run-one MODE`), one JSON line out: run under whichever
    sodaray is on the path, so the runner of another commit is measured by the same code."""
    import inspect
    import json

    import ray

    from sodaray.runner import load_sweep, run_sweep

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    extra = {"stream": True} if "stream" in inspect.signature(run_sweep).parameters else {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "sweep.yaml"
        path.write_text(yaml.safe_dump(stream_spec(args, args.run_one != "split")))
        t0 = time.perf_counter()
        run = run_sweep(load_sweep(path), Path(tmp) / "out", **extra)
        wall = time.perf_counter() - t0
    ray.shutdown()
    keys = ("samples", "found", "exact", "sample_steps")
    out = {k: sum(getattr(d, k) for d in run.done) for k in keys}
    print(json.dumps({**out, "wall": wall, "occupancy": run.occupancy, "shards": len(run.done)}))


def stream_case(args: argparse.Namespace) -> None:
    """The runner as it was (`--baseline`: a worktree of an earlier commit, streamed shards),
    then this tree's engine with lengths mixed in one padded batch (the default) and with a
    batch per length, each in its own process and Ray session, in one run."""
    import json
    import os
    import subprocess
    import sys

    from sodaray.report.metrics import wilson_interval

    modes = [("mixed", None), ("split", None)]
    if args.baseline:
        modes.insert(0, ("baseline", str(Path(args.baseline).resolve())))
    got = {}
    for mode, path in modes:
        env = {**os.environ, "PYTHONPATH": path or str(ROOT)}
        # The baseline tree's own environment where it has one: an editable install's import
        # finder wins over PYTHONPATH, so this tree's Python would import this tree's sodaray.
        own = Path(path, ".venv", "bin", "python") if path else None
        cmd = [
            str(own) if own is not None and own.is_file() else sys.executable,
            str(Path(__file__).resolve()),
            "--run-one",
            mode,
            "--stream-per-length",
            str(args.stream_per_length),
            "--stream-steps",
            str(args.stream_steps),
            "--shard-size",
            str(args.shard_size),
            "--batch",
            str(args.batch),
        ]
        # cwd: Ray's workers start there and import the package from it before PYTHONPATH.
        lines = subprocess.run(
            cmd, env=env, cwd=path or ROOT, check=True, capture_output=True, text=True
        ).stdout
        r = got[mode] = json.loads(lines.strip().splitlines()[-1])
        if not r["samples"]:
            raise SystemExit(f"{mode}: no shard finished (is {path or ROOT} a sodaray tree?)")
        n, wall = r["samples"], r["wall"]
        f_lo, f_hi = wilson_interval(r["found"], n)
        e_lo, e_hi = wilson_interval(r["exact"], n)
        print(
            f"stream-case {mode:<8} wall {wall:6.1f}s  {r['sample_steps'] / wall:7.0f} "
            f"sample-steps/s  occupancy {100 * (r['occupancy'] or 0):5.1f}%  found "
            f"{r['found']}/{n} [{f_lo:.3f}, {f_hi:.3f}]  exact {r['exact']}/{n} "
            f"[{e_lo:.3f}, {e_hi:.3f}]  ({r['shards']} shards, {r['sample_steps']} sample-steps)",
            flush=True,
        )
    for mode in [m for m, _ in modes if m != "baseline"]:
        if "baseline" in got:
            base, new = got["baseline"], got[mode]
            speed = (new["sample_steps"] / new["wall"]) / (base["sample_steps"] / base["wall"])
            print(
                f"stream-case ratio {mode} vs baseline: wall {base['wall'] / new['wall']:.2f}x "
                f"shorter, sample-steps/s {speed:.2f}x, "
                f"occupancy {100 * base['occupancy']:.0f}% -> {100 * new['occupancy']:.0f}%",
                flush=True,
            )


if __name__ == "__main__":
    main()
