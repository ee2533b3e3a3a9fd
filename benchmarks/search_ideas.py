"""Search ideas the paper does not have, against SODA as it is, at the same step budget.

    python benchmarks/search_ideas.py [--model stories260k] [--lengths 1-3] [--per-length 16]
        [--seed 1] [--steps 600] [--preset NAME] [--threads 1] [--ideas temperature,restarts]

Every variant searches the same random inputs (drawn with `--seed` from the model's
vocabulary) with the same seed and step budget, so each sample may take at most the same
sample-steps; one line per variant: exact by length with 95% Wilson intervals, and the
sample-steps it took. Outcomes do not depend on the machine's load (only the seconds do).

Ideas (`--ideas`, each a group of variants beside the preset as it is):
- `temperature`: `temperature_end`, geometric annealing from the preset's temperature, or from a
  higher start, to a lower end over the budget.
- `restarts`: k independent restarts of each target inside its budget, as re-draws of Z (and of
  the moments) every `steps / k` steps. A re-draw keeps nothing of the search before it (the
  decay acts on Z, not on a step count), so k sequential restarts of `steps / k` steps and k
  restarts side by side in idle batch slots, the first to match winning, have the same outcome
  distribution at the same sample-steps; on a GPU, where idle slots cost nothing, the side-by-side
  form would only finish sooner.
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
from sodaray.config.presets import preset_params  # noqa: E402
from sodaray.data.build import parse_lengths
from sodaray.report import metrics  # noqa: E402

# Each variant: factors of the preset's temperature ("start", "end") or a number of restarts.
IDEAS: dict[str, dict[str, dict[str, float]]] = {
    "temperature": {
        "anneal x -> x/5": {"end": 0.2},
        "anneal 2x -> x/5": {"start": 2.0, "end": 0.2},
        "anneal 4x -> x": {"start": 4.0, "end": 1.0},
    },
    "restarts": {f"{k} restarts": {"restarts": k} for k in (1, 2, 4, 8)},
}


def variant_params(base: dict, v: dict[str, float], steps: int) -> dict:
    """The preset's parameters with one variant applied."""
    params = dict(base)
    tau = float(base.get("temperature", sodaray.SodaConfig().temperature))
    if "end" in v:
        params["temperature"] = tau * v.get("start", 1.0)
        params["temperature_end"] = tau * v["end"]
    if "restarts" in v:
        params["reinit_period"] = max(1, steps // int(v["restarts"]))
        params["use_reinit"] = True
    return params


def search_arguments(p: argparse.ArgumentParser, lengths: str, steps: int) -> None:
    """The options every search probe here shares: which model, inputs, budget and preset."""
    p.add_argument("--model", default="stories260k")
    p.add_argument("--lengths", default=lengths)
    p.add_argument("--per-length", type=int, default=16)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--preset", default="qwen2.5-0.5b")
    p.add_argument("--threads", type=int, default=1)


def random_problem(args: argparse.Namespace):  # noqa: ANN201
    """(model with a BOS, lengths, drawn inputs, their targets) for `search_arguments`."""
    torch.set_num_threads(args.threads)
    path = folder(args.model)
    if path is None:
        sys.exit(f"{args.model}: absent")
    model = sodaray.load_model(str(path), bos=True)
    lengths = parse_lengths(args.lengths)
    g = torch.Generator().manual_seed(args.seed)
    tokens = [
        torch.randint(0, model.vocab_size, (n,), generator=g).tolist()
        for n in lengths
        for _ in range(args.per_length)
    ]
    return model, lengths, tokens, sodaray.make_targets(model, tokens)


def timed_search(model, targets, params: dict, steps: int):  # noqa: ANN001, ANN201
    """(results, seconds) of SODA with `params`, every target in one batch, seed 0."""
    config = sodaray.SodaConfig(**params, max_steps=steps, max_batch_size=len(targets), seed=0)
    start = time.perf_counter()
    results = sodaray.invert(model, targets, config)
    return results, time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    search_arguments(p, lengths="1-3", steps=600)
    p.add_argument(
        "--ideas", default="temperature,restarts", help="comma-separated: " + ", ".join(IDEAS)
    )
    args = p.parse_args()
    model, lengths, tokens, targets = random_problem(args)
    base = preset_params("soda", args.preset, None)
    tau = float(base.get("temperature", sodaray.SodaConfig().temperature))
    print(
        f"# {args.model}, BOS, lengths {args.lengths} x {args.per_length} (seed {args.seed}), "
        f"{args.steps} steps, preset {args.preset} (temperature {tau:g})"
    )
    unknown = set(args.ideas.split(",")) - set(IDEAS)
    if unknown:
        sys.exit(f"--ideas: unknown {sorted(unknown)}; choose from {', '.join(IDEAS)}")
    variants = {"preset as it is": {}}
    for idea in args.ideas.split(","):
        variants.update(IDEAS[idea])
    for name, v in variants.items():
        results, seconds = timed_search(
            model, targets, variant_params(base, v, args.steps), args.steps
        )
        cells = []
        for n in lengths:
            hits = [r.exact for r, t in zip(results, tokens, strict=True) if len(t) == n]
            rate = metrics.proportion(sum(hits), len(hits))
            cells.append(f"L{n} {sum(hits):2d}/{len(hits)} [{rate.low:.2f},{rate.high:.2f}]")
        steps = sum(r.steps for r in results)
        print(f"{name:16s} {'  '.join(cells)}  sample-steps {steps:,}  ({seconds:.0f}s)")


if __name__ == "__main__":
    main()
