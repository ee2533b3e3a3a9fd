"""Issue 38's search idea: after a SODA search ends unfound, check every single-token change of its
final input, one position at a time (first position first: where real models' failures are),
against SODA given the same budget.

    python benchmarks/position_scan.py --results /work/results/confirm --job 72ef1994 \
        --model ../shared/models/stories260K --preset tinystories-33m --space centred

Takes the true inputs of a finished job's rows (`--job`: part of its name), or fresh random
inputs of lengths 1-3 x 16 (`--seed`: inputs the idea was not chosen on), and in one process,
one thread: (1) SODA with `--steps` as the job ran it; (2) the scan of each unfound search's
final input: position by position, all V tokens there, every candidate decided by the product's
exact check (`hard_match`: the screen, then the canonical confirm, both spaces); (3) the equal
budget: SODA with `--steps` less the scan's mean cost in sample-steps (its seconds over the
seconds of one sample-step of run 1), then the scan. One line per variant: exact by length.
A scan's cost is V candidates' forwards per position, whatever the search found: on a
vocabulary of 512 that is a few hundred sample-steps, on 49,152 to 262,144 tens of thousands.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import torch

import sodaray
from sodaray.objective.objectives import Objective
from sodaray.objective.observations import BatchTargets
from sodaray.objective.scoring import hard_match


def scan(model, targets, row: int, tokens: list[int], chunk: int) -> tuple[list[int] | None, int]:
    """The first single-token change of `tokens` (position 0 first) that the exact check takes,
    and the candidates checked."""
    batch = BatchTargets.from_set(targets, np.asarray([row]), model.device)
    vocab, checked = model.vocab_size, 0
    for i in range(len(tokens)):
        for start in range(0, vocab, chunk):
            ids = torch.arange(start, min(start + chunk, vocab))
            cands = torch.tensor([tokens] * len(ids))
            cands[:, i] = ids
            rows = torch.zeros(len(ids), dtype=torch.long)
            ok = hard_match(
                model, targets.objective, cands, batch, targets.atol, targets.rtol, rows
            )
            checked += len(ids)
            if ok.any():
                return cands[int(ok.nonzero()[0])].tolist(), checked
    return None, checked


def sign_test(wins: int, losses: int) -> float:
    """Two-sided exact binomial p-value of `wins` against `losses` at even odds."""
    n, k = wins + losses, min(wins, losses)
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def scan_cost(shape: str, device: str, chunk: int) -> None:
    """One line: a position's scan (all V tokens, nothing found: a random target) against one
    SODA sample-step, length 2, no BOS, on `device`."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_invert import build_model

    from sodaray.search.engine.scan import position_scan

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    model = build_model(shape, device, "float32")
    targets = sodaray.make_targets(model, [[11, 12] for _ in range(64)])
    config = sodaray.SodaConfig(max_steps=10, max_batch_size=64)
    sodaray.invert(model, targets, sodaray.SodaConfig(max_steps=2, max_batch_size=64))
    sync()
    t0 = time.perf_counter()
    results = sodaray.invert(model, targets, config)
    sync()
    per_step = (time.perf_counter() - t0) / sum(r.steps for r in results)
    t0 = time.perf_counter()
    hit = position_scan(model, targets, 0, [13, 14], chunk=chunk)
    sync()
    seconds = (time.perf_counter() - t0) / 2  # two positions
    print(
        f"scan cost {shape} on {device}: a position's {model.vocab_size:,} candidates in "
        f"{seconds:.2f} s, a SODA sample-step (B=64, length 2) {1e3 * per_step:.2f} ms: "
        f"{seconds / per_step:,.0f} sample-steps a position (found: {hit is not None})"
    )


def scan_case(args: argparse.Namespace) -> None:
    """One failure (its true and found inputs) scanned on `--model`, against a SODA sample-step."""
    from sodaray.search.engine.scan import position_scan

    true, found = ([int(t) for t in part.split(",")] for part in args.case.split(":"))
    model = sodaray.load_model(args.model, device="cpu", bos=not args.no_bos)
    many = [[100 + i + j for j in range(len(true))] for i in range(16)]
    timing = sodaray.make_targets(model, many, objective=Objective(space=args.space))
    config = sodaray.SodaConfig.from_preset(args.preset, max_steps=20)
    sodaray.invert(model, timing, sodaray.SodaConfig.from_preset(args.preset, max_steps=2))
    t0 = time.perf_counter()
    results = sodaray.invert(model, timing, config)
    per_step = (time.perf_counter() - t0) / sum(r.steps for r in results)
    targets = sodaray.make_targets(model, [true], objective=Objective(space=args.space))
    t0 = time.perf_counter()
    hit = position_scan(model, targets, 0, found, chunk=args.chunk)
    seconds = time.perf_counter() - t0
    print(
        f"scan of {found} (true {true}): {hit} in {seconds:.0f} s = {seconds / per_step:,.0f} "
        f"sample-steps at {1e3 * per_step:.1f} ms a sample-step (16 searches, length {len(true)})"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", help="take the true inputs of a finished job's rows")
    p.add_argument("--job", default="", help="part of the job's name whose inputs to take")
    p.add_argument(
        "--seed", type=int, help="instead: fresh random inputs, lengths 1-3 x 16 (this seed)"
    )
    p.add_argument("--model", help="the model the inputs are inverted on")
    p.add_argument(
        "--cost-shape",
        choices=["neo", "qwen"],
        help="instead: time one position's scan and a SODA sample-step, length 2, on "
        "bench_invert.py's random model of this shape (what a GPU lease can measure)",
    )
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--case",
        help="instead: TRUE:FOUND token ids (31645,27013:26516,27013): scan that one failure, "
        "and time a SODA sample-step of 16 searches of its length, on --model",
    )
    p.add_argument("--preset", default="tinystories-33m")
    p.add_argument("--space", default="centred")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--no-bos", action="store_true")
    p.add_argument("--chunk", type=int, default=512, help="candidates per checked batch")
    p.add_argument(
        "--also", type=int, action="append", default=[], help="another SODA budget before a scan"
    )
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.cost_shape:
        return scan_cost(args.cost_shape, args.device, args.chunk)
    if not args.model:
        raise SystemExit("give --model (or --cost-shape)")
    if args.case:
        return scan_case(args)
    import pandas as pd

    from sodaray.results import result_files

    model = sodaray.load_model(args.model, device="cpu", bos=not args.no_bos)
    if args.seed is not None:  # as a sweep's `random` dataset with `vocab: model` draws them
        rng = np.random.default_rng(args.seed)
        inputs = [
            rng.integers(0, model.vocab_size, size=n).tolist() for n in (1, 2, 3) for _ in range(16)
        ]
    else:
        if not args.results:
            raise SystemExit("give --results (and --job) or --seed")
        rows = pd.concat([pd.read_parquet(f) for f in result_files(args.results)])
        rows = rows[rows["job"].str.contains(args.job, regex=False)].sort_values("sample_id")
        inputs = [list(map(int, t)) for t in rows["true_tokens"]]
    objective = Objective(space=args.space)
    targets = sodaray.make_targets(model, inputs, objective=objective)

    def search(steps: int):
        config = sodaray.SodaConfig.from_preset(args.preset, max_steps=steps, max_batch_size=96)
        t0 = time.perf_counter()
        results = sodaray.invert(model, targets, config)
        return results, time.perf_counter() - t0

    def exact_by_length(found: list[list[int] | None]) -> str:
        parts = []
        for n in sorted({len(t) for t in inputs}):
            idx = [i for i, t in enumerate(inputs) if len(t) == n]
            parts.append(f"{sum(found[i] == inputs[i] for i in idx)}/{len(idx)}")
        hits = sum(f == t for f, t in zip(found, inputs, strict=True))
        return f"exact {' '.join(parts)} (all {hits}/{len(inputs)})"

    def scanned(results) -> tuple[list[list[int] | None], float, int, int]:
        out, seconds, checked, scans = [], 0.0, 0, 0
        for i, r in enumerate(results):
            if r.found:
                out.append(r.tokens)
                continue
            t0 = time.perf_counter()
            hit, n = scan(model, targets, i, r.tokens, args.chunk)
            seconds += time.perf_counter() - t0
            checked, scans = checked + n, scans + 1
            out.append(hit)
        return out, seconds, checked, scans

    base, base_s = search(args.steps)
    sample_steps = sum(r.steps for r in base)
    per_step = base_s / sample_steps
    print(
        f"SODA {args.steps} steps: {exact_by_length([r.tokens if r.found else None for r in base])}"
        f", {sample_steps:,} sample-steps in {base_s:.1f} s ({1e3 * per_step:.3f} ms each)"
    )
    found, scan_s, checked, scans = scanned(base)
    cost = scan_s / max(scans, 1) / per_step
    print(
        f"SODA {args.steps} + scan: {exact_by_length(found)}; {scans} scans, {checked:,} "
        f"candidates in {scan_s:.1f} s: {cost:.0f} sample-steps a scan"
    )
    equal = max(1, round(args.steps - cost))
    for steps in [equal, *args.also]:
        short, short_s = search(steps)
        found, scan_s2, _, scans2 = scanned(short)
        spent = sum(r.steps for r in short) * per_step + scan_s2
        label = " (equal budget)" if steps == equal else ""
        # Paired on the same inputs: the ones only one variant recovers, and the exact
        # two-sided sign test (McNemar's) on them.
        plain = [r.found and r.tokens == t for r, t in zip(base, inputs, strict=True)]
        mine = [f == t for f, t in zip(found, inputs, strict=True)]
        wins = sum(m and not b for m, b in zip(mine, plain, strict=True))
        losses = sum(b and not m for m, b in zip(mine, plain, strict=True))
        print(
            f"SODA {steps} + scan{label}: {exact_by_length(found)}; {scans2} scans; "
            f"{short_s + scan_s2:.1f} s against {base_s:.1f} s for SODA {args.steps} alone "
            f"(priced at run 1's rate: {spent:.1f} s); paired: {wins} inputs only it recovers, "
            f"{losses} only SODA {args.steps} does, sign test p = {sign_test(wins, losses):.2g}"
        )


if __name__ == "__main__":
    main()
