"""The match check's cost in a search (issue 37): stories260K, 64 random inputs of lengths 1-3 in
one batch, the tinystories-33m preset, one CPU thread. Prints one line: finds, canonical
confirms during the search, and the search's wall seconds.

    python benchmarks/bench_match_check.py [STEPS]      # default 200

For before/after figures time the whole command A/B with `farm-bench` (the search alone is
printed too). Run it alone: on 2 cores anything else moves the figure.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

import sodaray
from sodaray.model.loaded import LoadedModel

STORIES = Path(__file__).resolve().parents[2] / "shared" / "models" / "stories260K"


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    torch.set_num_threads(1)
    model = sodaray.load_model(str(STORIES), device="cpu")
    gen = torch.Generator().manual_seed(0)
    tokens = [torch.randint(0, 512, (1 + i % 3,), generator=gen).tolist() for i in range(64)]
    targets = sodaray.make_targets(model, tokens)
    confirms = [0]
    canonical = LoadedModel.canonical_logits

    def counted(self, sequences, m):  # the confirm stage: one canonical forward a sequence
        confirms[0] += len(sequences)
        return canonical(self, sequences, m)

    LoadedModel.canonical_logits = counted
    config = sodaray.SodaConfig.from_preset(
        "tinystories-33m", max_steps=steps, max_batch_size=64, seed=1
    )
    start = time.perf_counter()
    results = sodaray.invert(model, targets, config)
    took = time.perf_counter() - start
    found = sum(r.found for r in results)
    exact = sum(bool(r.exact) for r in results)
    print(
        f"steps {steps}: found {found} exact {exact} of 64, "
        f"{confirms[0]} canonical confirms, search {took:.2f} s"
    )


if __name__ == "__main__":
    main()
