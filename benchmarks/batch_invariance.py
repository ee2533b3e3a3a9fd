"""What the reproducibility contract can promise (README, "What is reproducible"), measured: the
same searches alone and sharing their batch with searches of other configs, objectives and
lengths, on 1 and on 2 CPU threads; how many of them differ in anything (tokens, found, steps,
final loss) and how many end on other tokens.

    python benchmarks/batch_invariance.py            # 4 models x 48 searches, threads 1 and 2

Prints one line per (model, threads) and a total per thread count. Run alone: timings do not
matter here, but two threads on a loaded machine take long.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import sodaray  # noqa: E402
from sodaray.search.engine.loop import Engine  # noqa: E402
from sodaray.search.engine.work import Work  # noqa: E402

STORIES = ROOT.parent / "shared" / "models" / "stories260K"


def model_for(kind: str) -> sodaray.LoadedModel:
    if kind == "stories260K":
        return sodaray.load_model(str(STORIES), device="cpu")
    from conftest import tiny_model

    return tiny_model(kind)


def outcomes(model, mine, others, cfg, other_cfg, lengths, n, mixed: bool) -> list[tuple]:
    engine = Engine(model)
    work = Work(mine, cfg, [(n,)] * len(mine))
    if mixed:
        engine.submit(Work(others, other_cfg, [(k,) for k in lengths]))
    engine.submit(work)
    engine.run()
    return [(r.tokens, r.found, r.steps, r.final_loss) for r in work.ordered()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="llama,qwen2,gemma3,stories260K")
    parser.add_argument("--searches", type=int, default=48)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--threads", default="1,2")
    args = parser.parse_args()
    totals: dict[int, list[int]] = {}
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        for kind in args.models.split(","):
            model = model_for(kind)
            vocab = min(model.vocab_size, 64)
            gen = torch.Generator().manual_seed(7)
            n = 3
            tokens = torch.randint(0, vocab, (args.searches, n), generator=gen).tolist()
            mine = sodaray.make_targets(model, tokens)
            lengths = [1 + i % 6 for i in range(24)]
            others = sodaray.make_targets(
                model,
                [[(7 * i + j) % vocab for j in range(k)] for i, k in enumerate(lengths)],
                objective=sodaray.Objective(loss="mse"),
            )
            cfg = sodaray.SodaConfig(
                max_steps=args.steps, reinit_period=60, reset_period=15, seed=11
            )
            other_cfg = sodaray.SodaConfig(
                max_steps=args.steps, learning_rate=0.2, temperature=0.1, seed=2
            )
            start = time.perf_counter()
            alone = outcomes(model, mine, others, cfg, other_cfg, lengths, n, mixed=False)
            mixed = outcomes(model, mine, others, cfg, other_cfg, lengths, n, mixed=True)
            differ = sum(a != b for a, b in zip(alone, mixed, strict=True))
            tokens_differ = sum(a[0] != b[0] for a, b in zip(alone, mixed, strict=True))
            found = sum(a[1] for a in alone)
            total = totals.setdefault(threads, [0, 0, 0])
            total[0] += differ
            total[1] += tokens_differ
            total[2] += len(alone)
            print(
                f"threads={threads} {kind}: {differ}/{len(alone)} differ, "
                f"{tokens_differ} end on other tokens ({found} found alone, "
                f"{time.perf_counter() - start:.0f} s)",
                flush=True,
            )
    for threads, (differ, tokens_differ, count) in totals.items():
        print(
            f"threads={threads} total: {differ}/{count} differ, {tokens_differ} end on other tokens"
        )


if __name__ == "__main__":
    main()
