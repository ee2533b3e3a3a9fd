"""Sweep throughput on this machine: the quickstart sweep with 1 and 2 CPU actors.

    python benchmarks/bench_sweep.py [--per-length 8] [--steps 300]

Prints one line per actor count: samples/s over the whole run (actor start-up and model loads
included), and the driver's overhead per shard (time outside the worker's `invert` call:
transfers, the driver's Parquet write; the median excludes each actor's first shard, which also
pays for the actor's start-up).
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
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)

    import ray

    from sodaray.runner import load_sweep, run_sweep

    spec = yaml.safe_load((ROOT / "sweeps/quickstart.yaml").read_text())
    spec["models"][0]["id"] = str(ROOT.parent / "shared/models/stories260K")
    spec["datasets"][0]["build"]["per_length"] = args.per_length
    spec["steps"] = args.steps
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
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
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
