"""Sweep throughput on this machine: two cases.

    python benchmarks/bench_sweep.py [--case quickstart|stream|all] [--per-length 8] [--steps 300]

`quickstart`: the quickstart sweep with 1 and 2 CPU actors. One line per actor count:
samples/s over the whole run (actor start-up and model loads included), and the driver's
overhead per shard (time outside the worker's `invert` call: transfers, the driver's Parquet
write; the median excludes each actor's first shard, which also pays for the actor's start-up).

`stream` (issue 15): samples that differ in difficulty (random inputs, lengths 1-10 mixed,
`--stream-steps` 600), small shards (`--shard-size` 10) against a larger batch
(`--batch` 64), one CPU actor; run one shard per actor call (before) and streamed (after), in
one run. One line per mode: wall time (actor start-up included), sample-steps/s over it, the
mean batch occupancy (searches per step / max_batch_size, over every step) and found / exact
with 95% Wilson intervals; then the ratios.
"""

from __future__ import annotations

import argparse
import logging
import statistics
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
    parser.add_argument("--case", choices=["quickstart", "stream", "all"], default="all")
    parser.add_argument("--stream-per-length", type=int, default=40)
    parser.add_argument("--stream-steps", type=int, default=600)
    parser.add_argument("--shard-size", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)

    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        if args.case in ("quickstart", "all"):
            quickstart(args)
        if args.case in ("stream", "all"):
            stream_case(args)
    finally:
        ray.shutdown()


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
            run = run_sweep(sweep, Path(tmp) / "out", stream=False)
            wall = time.perf_counter() - t0
        samples = sum(d.samples for d in run.done)
        first: set[int] = set()
        steady = []
        for d in run.done:
            if d.pid in first:
                steady.append(d.overhead)
            first.add(d.pid)
        overhead = statistics.median(steady) if steady else float("nan")
        print(
            f"quickstart actors={actors}  {samples / wall:6.2f} samples/s  "
            f"({samples} samples, {len(run.done)} shards, {wall:.1f}s)  "
            f"driver overhead/shard {1000 * overhead:.0f} ms (median)",
            flush=True,
        )


def stream_case(args: argparse.Namespace) -> None:
    from sodaray.metrics import wilson_interval
    from sodaray.runner import load_sweep, run_sweep

    spec = {
        "name": "stream",
        "models": [{"id": str(ROOT.parent / "shared/models/stories260K"), "num_cpus": 1}],
        "datasets": [
            {
                "name": "random",
                "build": {
                    "dataset": "random",
                    "lengths": "1-10",
                    "per_length": args.stream_per_length,
                    "seed": 1,
                },
            }
        ],
        "algorithms": [{"name": "soda", "params": {"max_batch_size": args.batch}}],
        "objectives": [{"kind": "logits"}],
        "max_steps": args.stream_steps,
        "shard_size": args.shard_size,
    }
    walls = {}
    rates = {}
    for stream in (False, True):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "sweep.yaml"
            path.write_text(yaml.safe_dump(spec))
            sweep = load_sweep(path)
            t0 = time.perf_counter()
            run = run_sweep(sweep, Path(tmp) / "out", stream=stream)
            wall = time.perf_counter() - t0
        n = sum(d.samples for d in run.done)
        found = sum(d.found for d in run.done)
        exact = sum(d.exact for d in run.done)
        steps = sum(d.sample_steps for d in run.done)
        occupancy = run.occupancy or 0.0
        walls[stream], rates[stream] = wall, steps / wall
        f_lo, f_hi = wilson_interval(found, n)
        e_lo, e_hi = wilson_interval(exact, n)
        mode = "streamed        " if stream else "one-shard/call  "
        print(
            f"stream-case {mode} wall {wall:6.1f}s  {steps / wall:7.0f} sample-steps/s  "
            f"occupancy {100 * occupancy:5.1f}%  found {found}/{n} [{f_lo:.3f}, {f_hi:.3f}]  "
            f"exact {exact}/{n} [{e_lo:.3f}, {e_hi:.3f}]  ({len(run.done)} shards, "
            f"{steps} sample-steps)",
            flush=True,
        )
    print(
        f"stream-case ratio: wall {walls[False] / walls[True]:.2f}x shorter, "
        f"sample-steps/s {rates[True] / rates[False]:.2f}x",
        flush=True,
    )


if __name__ == "__main__":
    main()
