"""Where the paper and the authors' code disagree: the text-loss and fluency-penalty forms.

    python benchmarks/paper_options.py --per-length 40 --steps 400
    python benchmarks/paper_options.py --model SMOLLM2.gguf --per-length 8 --steps 200
    python benchmarks/paper_options.py --model SMOLLM2.gguf --per-length 8 --skip text \
        --fluency-steps 300 --batch 16 --bos on

Held-out validation split (seed 0; test sets use seed 1). Text loss: random inputs of lengths
1-2, 5 output tokens observed as text, SODA with each form (`prob`: Eq. 5; `logprob`: the
authors' code). Fluency: TinyStories validation sentences (nl-id, --fluency-lengths, needs
../shared/data/tinystories_valid.jsonl), all logits of 1 output observed, weight 9e-3, each
form (`argmax`: the paper's; `relaxed`). Prints counts found and exact, and a Markdown table.
"""

from __future__ import annotations

import argparse
import logging
import time
import warnings
from pathlib import Path

import torch

import sodaray
from sodaray.data.build import build_dataset, parse_lengths

SHARED = Path(__file__).resolve().parents[2] / "shared"
VALIDATION_SEED = 0


def tokens_of(model_path: str, dataset: str, lengths: str, per_length: int, source=None):
    table = build_dataset(
        model_path, dataset, lengths, per_length, VALIDATION_SEED, source, progress=False
    )
    return table.column("tokens").to_pylist()


def run(model, tokens, objective, steps: int, batch: int) -> tuple[int, int, float]:
    targets = sodaray.make_targets(model, tokens, objective=objective)
    config = sodaray.SodaConfig(max_steps=steps, max_batch_size=batch, seed=0)
    start = time.perf_counter()
    results = sodaray.invert(model, targets, config)
    seconds = time.perf_counter() - start
    return sum(r.found for r in results), sum(bool(r.exact) for r in results), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=str(SHARED / "models/stories260K"))
    parser.add_argument("--per-length", type=int, default=40)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch", type=int, default=80)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--skip", default="", help="comma list: text, fluency")
    parser.add_argument("--fluency-lengths", default="2-3")
    parser.add_argument("--fluency-steps", type=int, default=1000)
    parser.add_argument(
        "--bos",
        choices=["auto", "on", "off"],
        default="auto",
        help="a BOS before the input (auto: as the tokenizer does). SmolLM2 and Qwen without one "
        "put the input's first token in an attention sink (RESULTS.md, issue 14)",
    )
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    torch.set_num_threads(args.threads)
    bos = {"auto": None, "on": True, "off": False}[args.bos]
    model = sodaray.load_model(args.model, device="cpu", bos=bos)
    name = Path(args.model).name
    rows: list[tuple[str, str, int, int, int, float]] = []
    skip = set(args.skip.split(","))
    if "text" not in skip:
        tokens = tokens_of(args.model, "random", "1-2", args.per_length)
        for form in ("logprob", "prob"):
            objective = sodaray.Objective(kind="text", output_tokens=5, text_loss=form)
            found, exact, seconds = run(model, tokens, objective, args.steps, args.batch)
            rows.append(("text_loss", form, len(tokens), found, exact, seconds))
            print(
                f"{name} text_loss={form}: {found}/{len(tokens)} found, {exact} exact, "
                f"{seconds:.0f}s",
                flush=True,
            )
    source = SHARED / "data/tinystories_valid.jsonl"
    if "fluency" not in skip and source.is_file():
        lengths = args.fluency_lengths
        tokens = tokens_of(args.model, "nl-id", lengths, args.per_length, str(source))
        assert all(len(t) in parse_lengths(lengths) for t in tokens)
        for form in ("argmax", "relaxed", "off"):
            weight = 0.0 if form == "off" else 9e-3
            objective = sodaray.Objective(
                fluency_weight=weight, **({} if form == "off" else {"fluency_form": form})
            )
            found, exact, seconds = run(model, tokens, objective, args.fluency_steps, args.batch)
            rows.append(("fluency_form", form, len(tokens), found, exact, seconds))
            print(
                f"{name} fluency_form={form}: {found}/{len(tokens)} found, {exact} exact, "
                f"{seconds:.0f}s",
                flush=True,
            )
    print(f"\n| model | option | form | inputs | found | exact | seconds |\n|{'---|' * 7}")
    for option, form, n, found, exact, seconds in rows:
        print(f"| {name} | {option} | {form} | {n} | {found} | {exact} | {seconds:.0f} |")


if __name__ == "__main__":
    main()
