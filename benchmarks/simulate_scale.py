"""What the scheduler costs at scales no machine here runs: found-step distributions from real
result files, replayed through the old scheduler and the new one, for a sweep file at full scale.

    python benchmarks/simulate_scale.py --results DIR [--sweep sweeps/models.yaml]
        [--device h100] [--efficiency 0.3]

Inputs. From DIR (any result rows `sodaray.read_results` takes): per input length, each sample's
outcome as (found, steps / max_steps): the share found and when, relative to its budget. A length
the file lacks takes the nearest length it has. From the sweep file: its models, lengths, inputs
per length, step budget, `max_batch_size` and shard size. Each model's FLOPs per sample-step come
from its shape (`sodaray.cost`).

Schedulers, each a replica per model with a batch of `max_batch_size` slots:
- old: one length at a time; a length's samples fill the batch (up to its size), and the next
  length starts only when the last sample of this one has finished (its tail runs alone).
- new: every length in one batch, padded to the longest input in it; a slot freed by a found
  sample (or a finished budget) takes the next waiting sample at the next step.

Device time per step, two bounds (the truth lies between): `flat`, a step costs what a full
batch costs whatever its occupancy (on a GPU a step costs about the same from 100 to 1,000
samples: latency-bound), so time follows batch-steps; `compute`, a step costs the FLOPs of the
samples in it (padded to the batch's longest length for the new scheduler), so time follows
sample-steps. One row per model: batch-steps, occupancy, and device-hours under both bounds, old
and new, and their ratios.
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import sys
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sodaray.cost import DEFAULT_EFFICIENCY, KNOWN_SHAPES, device_seconds  # noqa: E402
from sodaray.data import parse_lengths  # noqa: E402


def distributions(folder: str) -> dict[int, np.ndarray]:
    """Per length: each sample's finishing point as a fraction of its budget (1.0: not found)."""
    from sodaray import read_results

    df = read_results(folder).to_pandas()
    out = {}
    for n, group in df.groupby("length"):
        frac = np.where(group["found"], group["steps"] / group["max_steps"], 1.0)
        out[int(n)] = np.clip(frac.astype(float), 0, 1)
    return out


def draw(dist: dict[int, np.ndarray], n: int, count: int, rng: np.random.Generator) -> np.ndarray:
    lengths = sorted(dist)
    nearest = min(lengths, key=lambda k: (abs(k - n), k))
    return rng.choice(dist[nearest], size=count, replace=True)


def old_scheduler(work: dict[int, np.ndarray], batch: int) -> list[tuple[int, int, int]]:
    """(batch-steps, active slots, longest length) runs: one length at a time, a length's
    samples in batches of `batch`, the next batch of that length when this one has drained."""
    runs = []
    for n, steps in sorted(work.items()):
        for start in range(0, len(steps), batch):
            chunk = np.sort(steps[start : start + batch])
            prev = 0
            for i, s in enumerate(chunk):  # between finishing points, len(chunk) - i active
                if s > prev:
                    runs.append((int(s - prev), len(chunk) - i, n))
                    prev = s
    return runs


def new_scheduler(work: dict[int, np.ndarray], batch: int) -> list[tuple[int, int, int]]:
    """The same as runs for the mixed batch: FIFO by length (the order sweeps submit), a
    freed slot refilled at once; each run's cost is padded to the longest length in it."""
    queue = [(n, int(s)) for n in sorted(work) for s in work[n]]
    running: list[tuple[int, int, int]] = []  # (ends at, seq, length)
    lengths: list[int] = []  # sorted lengths in the batch
    now, nxt, runs = 0, 0, []
    while nxt < len(queue) or running:
        while nxt < len(queue) and len(running) < batch:
            n, s = queue[nxt]
            heapq.heappush(running, (now + s, nxt, n))
            bisect.insort(lengths, n)
            nxt += 1
        end = running[0][0]
        if end > now:
            runs.append((end - now, len(running), lengths[-1]))
            now = end
        while running and running[0][0] == now:
            _, _, n = heapq.heappop(running)
            lengths.pop(bisect.bisect_left(lengths, n))
    return runs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", required=True, help="a results folder: found-step distributions")
    p.add_argument("--sweep", default=str(ROOT / "sweeps" / "models.yaml"))
    p.add_argument("--device", default="h100")
    p.add_argument("--efficiency", type=float, default=DEFAULT_EFFICIENCY)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    dist = distributions(args.results)
    doc = yaml.safe_load(Path(args.sweep).read_text())
    build = doc["datasets"][0]["build"]
    lengths, per_length = parse_lengths(str(build["lengths"])), int(build["per_length"])
    budget = int(doc["max_steps"])
    batch = int(doc["algorithms"][0].get("params", {}).get("max_batch_size", per_length))
    outputs = int(doc.get("objectives", [{}])[0].get("output_tokens", 1))
    found = {n: float(np.mean(d < 1.0)) for n, d in sorted(dist.items())}
    print(
        f"# inputs: {args.results}: found share by length "
        + ", ".join(f"{n}: {v:.0%}" for n, v in found.items())
        + f"; sweep {Path(args.sweep).name}: lengths {lengths[0]}-{lengths[-1]} x {per_length}, "
        f"{budget:,} steps, batch {batch}; {args.device} at {args.efficiency:.0%} of peak"
    )
    rng = np.random.default_rng(args.seed)
    work = {n: np.maximum(1, np.ceil(draw(dist, n, per_length, rng) * budget)) for n in lengths}
    total = {"old": [0.0, 0.0], "new": [0.0, 0.0]}
    for model in doc["models"]:
        shape = KNOWN_SHAPES.get(model["id"])
        if shape is None:
            print(f"{model.get('name', model['id'])}: shape unknown offline, skipped")
            continue
        row = []
        for name, runs in (
            ("old", old_scheduler(work, batch)),
            ("new", new_scheduler(work, batch)),
        ):
            steps = sum(r[0] for r in runs)
            occupancy = sum(r[0] * r[1] for r in runs) / (steps * batch)
            # flat: every step costs a full batch at the length it is padded to
            full = sum(r[0] * batch * shape.step_flops(r[2], outputs) for r in runs)
            flat = device_seconds(full, args.device, "float32", args.efficiency) / 3600
            flops = sum(r[0] * r[1] * shape.step_flops(r[2], outputs) for r in runs)
            compute = device_seconds(flops, args.device, "float32", args.efficiency) / 3600
            total[name][0] += flat
            total[name][1] += compute
            row.append((name, steps, occupancy, flat, compute))
        (_, so, oo, fo, co), (_, sn, on, fn, cn) = row
        print(
            f"{model.get('name', model['id']):<16} old: {so:>9,} batch-steps, occupancy "
            f"{oo:6.1%}, {fo:9,.1f} h flat, {co:9,.1f} h compute | new: {sn:>9,} batch-steps, "
            f"occupancy {on:6.1%}, {fn:9,.1f} h flat, {cn:9,.1f} h compute | "
            f"old/new {fo / fn:.2f}x flat, {co / cn:.2f}x compute"
        )
    (fo, co), (fn, cn) = total["old"], total["new"]
    print(
        f"total {args.device}-hours: old {fo:,.1f} flat / {co:,.1f} compute; new {fn:,.1f} flat "
        f"/ {cn:,.1f} compute; old/new {fo / fn:.2f}x flat, {co / cn:.2f}x compute"
    )


if __name__ == "__main__":
    main()
