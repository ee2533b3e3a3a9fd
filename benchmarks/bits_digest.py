"""One line that changes if any bit of a search's outcome does: run it on two trees to show a
change moved nothing (issue 41's operation cuts). Searches stories260K with a BOS (12 inputs of
lengths 1-3, raw and centred logits, 300 steps with re-draws, one thread) and prints the finds
and a digest of every result's tokens, find, steps and final loss (as float hex).

    python benchmarks/bits_digest.py                       # this tree
    PYTHONPATH=/path/to/other/tree python benchmarks/bits_digest.py
    python benchmarks/bits_digest.py --executor graph     # the replayed pass: eager's digest
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import torch

import sodaray
from sodaray.search.engine.executor import EXECUTORS

STORIES = Path(__file__).resolve().parents[2] / "shared" / "models" / "stories260K"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(STORIES), help="a model folder (stories260K)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument(
        "--executor",
        choices=EXECUTORS,
        help="what runs SODA's passes (default: the engine's, eager; a tree before executors "
        "existed takes no such option)",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = sodaray.load_model(args.model, bos=True)
    inputs = [[(37 * i + 11 * j) % 500 + 3 for j in range(1 + i % 3)] for i in range(12)]
    outcomes = []
    for space in ("raw", "centred"):
        targets = sodaray.make_targets(model, inputs, objective=sodaray.Objective(space=space))
        config = sodaray.SodaConfig.from_preset(
            "tinystories-33m", max_steps=args.steps, reinit_period=120, seed=2
        )
        extra = {} if args.executor is None else {"executor": args.executor}
        for r in sodaray.invert(model, targets, config, **extra):
            outcomes.append((r.tokens, r.found, r.steps, float(r.final_loss).hex()))
    digest = hashlib.sha256(repr(outcomes).encode()).hexdigest()[:16]
    label = f" executor {args.executor}" if args.executor else ""
    print(
        f"sodaray {sodaray.__file__}{label}: {sum(o[1] for o in outcomes)} found, digest {digest}"
    )


if __name__ == "__main__":
    main()
