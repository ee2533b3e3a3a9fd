"""What the scheduler costs at scales no machine here runs: found-step distributions from real
result files, replayed through the old scheduler and the new one, for a sweep file at full scale.

    python benchmarks/simulate_scale.py --results DIR [--sweep sweeps/models.yaml]
        [--costs h100|FILE] [--precision float32]

Inputs. From DIR (any result rows `sodaray.read_results` takes): per input length, each sample's
outcome as (found, steps / max_steps): the share found and when, relative to its budget. A length
the file lacks takes the nearest length it has. From the sweep file: its models, lengths, inputs
per length, step budget and `max_batch_size`. Each model's FLOPs per sample-step come from its
shape (`sodaray.costs.flops`).

Schedulers, each a replica per model with a batch of `max_batch_size` slots:
- old (2401ef3): one length at a time; a length's samples fill the batch (up to its size), and
  the next length starts only when the last sample of this one has finished (its tail runs
  alone). A step is one pass at that length.
- new (this tree): every length in one batch; a slot freed by a found sample (or a finished
  budget) takes the next waiting sample (in the order sweeps submit: by length) at the next
  step; each step the slots are split into passes by `sodaray.search.engine.scheduler.plan_passes`,
  each
  pass padded to its longest input.

Device time of a pass: its floor (what a pass costs however few samples it holds: kernel
launches, dispatch, per layer and besides) plus its samples' FLOPs (padded) at the device's rate
on a batch's work, both from measured costs (`sodaray.costs.devices`: `--costs h100`, issue 41's
H100 figures, by default; or a costs file from `bench_invert.py --suite gpu --out FILE`). The
engine's own split uses the same costs (the floor over the per-position time, in positions).
Also printed: `flat`, every step costing a full batch (the latency-bound extreme: time follows
batch-steps). One row per model: batch-steps, passes, occupancy and device-hours, old and new,
and their ratios.
"""

from __future__ import annotations

import argparse
import heapq
import sys
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sodaray.costs.devices import load_costs  # noqa: E402
from sodaray.costs.flops import KNOWN_SHAPES  # noqa: E402
from sodaray.data.build import parse_lengths  # noqa: E402
from sodaray.search.engine.scheduler import plan_passes  # noqa: E402

Run = tuple[int, dict[int, int]]  # (steps, active slots by input length)


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


def old_scheduler(work: dict[int, np.ndarray], batch: int) -> list[Run]:
    """Runs of steps with the same slots: one length at a time, a length's samples in batches
    of `batch`, the next batch of that length when this one has drained."""
    runs: list[Run] = []
    for n, steps in sorted(work.items()):
        for start in range(0, len(steps), batch):
            chunk = np.sort(steps[start : start + batch])
            prev = 0
            for i, s in enumerate(chunk):  # between finishing points, len(chunk) - i active
                if s > prev:
                    runs.append((int(s - prev), {n: len(chunk) - i}))
                    prev = s
    return runs


def new_scheduler(work: dict[int, np.ndarray], batch: int) -> list[Run]:
    """The same for the mixed batch: FIFO by length (the order sweeps submit), a freed slot
    refilled at once."""
    queue = [(n, int(s)) for n in sorted(work) for s in work[n]]
    running: list[tuple[int, int, int]] = []  # (ends at, seq, length)
    active: dict[int, int] = {}
    now, nxt, runs = 0, 0, []
    while nxt < len(queue) or running:
        while nxt < len(queue) and len(running) < batch:
            n, s = queue[nxt]
            heapq.heappush(running, (now + s, nxt, n))
            active[n] = active.get(n, 0) + 1
            nxt += 1
        end = running[0][0]
        if end > now:
            runs.append((end - now, dict(active)))
            now = end
        while running and running[0][0] == now:
            _, _, n = heapq.heappop(running)
            active[n] -= 1
            if not active[n]:
                del active[n]
    return runs


def step_seconds(
    active: dict[int, int], split: bool, flops, latency: float, rate: float, fixed: int
) -> tuple[float, int]:
    """(device seconds, passes) of one step over `active` slots: one pass (old: one length),
    or the engine's split by cost (new)."""
    if not split:
        ((n, count),) = active.items()
        return latency + count * flops(n) / rate, 1
    lengths = np.repeat(np.array(list(active)), list(active.values()))
    per_position = flops(int(lengths.max())) / (fixed + int(lengths.max())) / rate
    overhead = latency / per_position  # positions, as `passes.pass_overhead` measures it
    seconds, passes = 0.0, plan_passes(lengths, fixed, overhead)
    for p in passes:
        seconds += latency + len(p) * flops(int(lengths[p].max())) / rate
    return seconds, len(passes)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", required=True, help="a results folder: found-step distributions")
    p.add_argument("--sweep", default=str(ROOT / "sweeps" / "models.yaml"))
    p.add_argument("--costs", default="h100", help="built-in device costs (h100) or a costs file")
    p.add_argument("--precision", default="float32", help="the steps' arithmetic (float32)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    costs = load_costs(args.costs)
    rates = costs.at(args.precision)
    dist = distributions(args.results)
    doc = yaml.safe_load(Path(args.sweep).read_text())
    build = doc["datasets"][0]["build"]
    lengths, per_length = parse_lengths(str(build["lengths"])), int(build["per_length"])
    budget = int(doc["max_steps"])
    batch = int(doc["algorithms"][0].get("params", {}).get("max_batch_size", per_length))
    outputs = int(doc.get("objectives", [{}])[0].get("output_tokens", 1))
    fixed = outputs  # positions besides the input: a BOS and the outputs but the last
    found = {n: float(np.mean(d < 1.0)) for n, d in sorted(dist.items())}
    print(
        f"# inputs: {args.results}: found share by length "
        + ", ".join(f"{n}: {v:.0%}" for n, v in found.items())
        + f"; sweep {Path(args.sweep).name}: lengths {lengths[0]}-{lengths[-1]} x {per_length}, "
        f"{budget:,} steps, batch {batch}; {costs.device} costs ({costs.source}), "
        f"{args.precision if args.precision in costs.precisions else 'float32'}: "
        f"a pass {1000 * rates.pass_seconds:g} ms + "
        f"{1000 * rates.layer_seconds:g} ms per layer, work at "
        f"{rates.flops_per_second / 1e12:g} TFLOP/s"
    )
    rng = np.random.default_rng(args.seed)
    work = {n: np.maximum(1, np.ceil(draw(dist, n, per_length, rng) * budget)) for n in lengths}
    schedules = {"old": old_scheduler(work, batch), "new": new_scheduler(work, batch)}
    rate = rates.flops_per_second
    total = {"old": [0.0, 0.0], "new": [0.0, 0.0]}
    for model in doc["models"]:
        shape = KNOWN_SHAPES.get(model["id"])
        if shape is None:
            print(f"{model.get('name', model['id'])}: shape unknown offline, skipped")
            continue

        def flops(n: int, shape=shape) -> float:
            return shape.step_flops(n, outputs)

        latency = rates.floor(shape.layers)  # a pass's floor for this model's depth
        row = []
        for name, runs in schedules.items():
            steps = sum(r[0] for r in runs)
            occupancy = sum(r[0] * sum(r[1].values()) for r in runs) / (steps * batch)
            seconds = passes = 0.0
            for count, active in runs:
                t, k = step_seconds(active, name == "new", flops, latency, rate, fixed)
                seconds, passes = seconds + count * t, passes + count * k
            # flat: every step costs a full batch at its longest length (latency-bound extreme)
            full = sum(r[0] * batch * flops(max(r[1])) for r in runs) / rate
            total[name][0] += seconds / 3600
            total[name][1] += full / 3600
            row.append((steps, int(passes), occupancy, seconds / 3600, full / 3600))
        (so, po, oo, ho, fo), (sn, pn, on, hn, fn) = row
        print(
            f"{model.get('name', model['id']):<16} old: {so:>9,} steps, {po:>9,} passes, "
            f"occupancy {oo:6.1%}, {ho:9,.1f} h ({fo:9,.1f} h flat) | new: {sn:>9,} steps, "
            f"{pn:>9,} passes, occupancy {on:6.1%}, {hn:9,.1f} h ({fn:9,.1f} h flat) | "
            f"old/new {ho / hn:.2f}x ({fo / fn:.2f}x flat)"
        )
    (ho, fo), (hn, fn) = total["old"], total["new"]
    print(
        f"total {costs.device}-hours: old {ho:,.1f} ({fo:,.1f} flat); new {hn:,.1f} "
        f"({fn:,.1f} flat); old/new {ho / hn:.2f}x ({fo / fn:.2f}x flat)"
    )


if __name__ == "__main__":
    main()
