"""Where the true tokens sit in SODA's Z while it searches: a probe for search ideas.

    python benchmarks/true_token_ranks.py [--model stories260k] [--lengths 2-3] [--per-length 16]
        [--seed 1] [--steps 2000] [--preset qwen2.5-0.5b] [--threads 1]

Random inputs (`--seed`) searched with a BOS and the preset, as `search_ideas.py` does. After
every step of every search, up to its budget, the probe reads its Z and ranks each true token
in its position's row (0 = the argmax, the token the screen tries). Per length, for the
searches that failed: how many ever had every true token within the top k at once (a check of
all top-k combinations would have found those), and each failure's ranks at its last step.

The probe wraps `SodaBatch.redraw` in this process only; the search itself is unchanged.
`SodaBatch.step` calls it once per step, after the update whose argmax the screen tries and
before any re-draw of Z: the Z the step's candidates come from. The steps a batch runs past a
search's end (its outcome is read `lag` steps late) are not counted: a failure's last step is
its budget's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from search_ideas import random_problem, search_arguments, timed_search  # noqa: E402

from sodaray.config.presets import preset_params  # noqa: E402
from sodaray.search.soda import batch as soda  # noqa: E402

TOP_K = (2, 3, 5, 10, 50)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    search_arguments(p, lengths="2-3", steps=2000)
    args = p.parse_args()
    model, lengths, tokens, targets = random_problem(args)
    ids = [int(s) for s in targets.sample_ids]
    truth = {s: torch.tensor(t) for s, t in zip(ids, tokens, strict=True)}
    best = dict.fromkeys(ids, 1 << 30)  # over steps: the worst position's rank, at its lowest
    last: dict[int, list[int]] = {}
    redraw = soda.SodaBatch.redraw

    def probed(self: soda.SodaBatch, steps_after: np.ndarray) -> None:
        state = self.state
        for s, rows in enumerate(state.slot_rows()):
            if steps_after[s] > args.steps:  # a step past the search's end: dropped
                continue
            sample = int(state.host["sample_id"][s])
            z = state.z[torch.as_tensor(rows, device=state.z.device)].float().cpu()
            ranks = (z > z.gather(1, truth[sample][:, None])).sum(1)
            last[sample] = ranks.tolist()
            best[sample] = min(best[sample], int(ranks.max()))
        redraw(self, steps_after)

    soda.SodaBatch.redraw = probed
    params = preset_params("soda", args.preset, None)
    results, seconds = timed_search(model, targets, params, args.steps)
    print(
        f"# {args.model}, BOS, lengths {args.lengths} x {args.per_length} (seed {args.seed}), "
        f"{args.steps} steps, preset {args.preset}, {seconds:.0f} s"
    )
    for n in lengths:
        rows = [(s, r) for s, r, t in zip(ids, results, tokens, strict=True) if len(t) == n]
        failed = [s for s, r in rows if not r.exact]
        within = ", ".join(f"top-{k} {sum(best[s] < k for s in failed)}" for k in TOP_K)
        print(f"L{n}: exact {len(rows) - len(failed)}/{len(rows)}; failures ever within: {within}")
        print(f"    failures' ranks at the last step: {[last[s] for s in failed]}")


if __name__ == "__main__":
    main()
