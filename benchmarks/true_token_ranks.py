"""Where the true tokens sit in SODA's Z while it searches: a probe for search ideas.

    python benchmarks/true_token_ranks.py [--model stories260k] [--lengths 2-3] [--per-length 16]
        [--steps 2000] [--preset qwen2.5-0.5b] [--threads 1]

Random inputs (seed 1) searched with a BOS and the preset, as `search_ideas.py` does. After
every hard check the probe reads each search's Z and ranks each true token in its position's
row (0 = the argmax, the token the check tries). Per length, for the searches that failed: how
many ever had every true token within the top k at once (a check of all top-k combinations
would have found those), and each failure's ranks at its last step. The probe wraps
`SodaBatch.check` in this process only; the search itself is unchanged.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cost import folder  # noqa: E402

import sodaray  # noqa: E402
from sodaray.data import parse_lengths  # noqa: E402
from sodaray.presets import preset_params  # noqa: E402
from sodaray.search import soda  # noqa: E402

TOP_K = (2, 3, 5, 10, 50)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="stories260k")
    p.add_argument("--lengths", default="2-3")
    p.add_argument("--per-length", type=int, default=16)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--preset", default="qwen2.5-0.5b")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    path = folder(args.model)
    if path is None:
        sys.exit(f"{args.model}: absent")
    model = sodaray.load_model(str(path), bos=True)
    lengths = parse_lengths(args.lengths)
    g = torch.Generator().manual_seed(1)
    tokens = [
        torch.randint(0, model.vocab_size, (n,), generator=g).tolist()
        for n in lengths
        for _ in range(args.per_length)
    ]
    targets = sodaray.make_targets(model, tokens)
    ids = [int(s) for s in targets.sample_ids]
    truth = {s: torch.tensor(t) for s, t in zip(ids, tokens, strict=True)}
    best = dict.fromkeys(ids, 1 << 30)  # over steps: the worst position's rank, at its lowest
    last: dict[int, list[int]] = {}
    check = soda.SodaBatch.check

    def probed(self: soda.SodaBatch, current: torch.Tensor):  # noqa: ANN202
        out = check(self, current)
        for s, rows in enumerate(self.slot_rows):
            sample = int(self.host["sample_id"][s])
            z = self.z[torch.as_tensor(rows, device=self.z.device)].float().cpu()
            ranks = (z > z.gather(1, truth[sample][:, None])).sum(1)
            last[sample] = ranks.tolist()
            best[sample] = min(best[sample], int(ranks.max()))
        return out

    soda.SodaBatch.check = probed
    config = sodaray.SodaConfig(
        **preset_params("soda", args.preset, None),
        max_steps=args.steps,
        max_batch_size=len(tokens),
        seed=0,
    )
    start = time.perf_counter()
    results = sodaray.invert(model, targets, config)
    print(
        f"# {args.model}, BOS, lengths {args.lengths} x {args.per_length} (seed 1), "
        f"{args.steps} steps, preset {args.preset}, {time.perf_counter() - start:.0f} s"
    )
    for n in lengths:
        rows = [(s, r) for s, r, t in zip(ids, results, tokens, strict=True) if len(t) == n]
        failed = [s for s, r in rows if not r.exact]
        within = ", ".join(f"top-{k} {sum(best[s] < k for s in failed)}" for k in TOP_K)
        print(f"L{n}: exact {len(rows) - len(failed)}/{len(rows)}; failures ever within: {within}")
        print(f"    failures' ranks at the last step: {[last[s] for s in failed]}")


if __name__ == "__main__":
    main()
