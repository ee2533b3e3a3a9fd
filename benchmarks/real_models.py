"""SODA on real trained models of the paper's kind: found and exact rates with Wilson intervals.

    bash ../shared/models/fetch-real-models.sh          # once: Qwen2.5-0.5B and Gemma-3-270M GGUFs
    python benchmarks/real_models.py --models qwen2.5-0.5b --lengths 1-3 --per-length 16 \\
        --steps 2000 --bos on                    # sodaray's best configuration (RESULTS.md)
    python benchmarks/real_models.py --models qwen2.5-0.5b --lengths 1 --bos off   # the paper's

The best configuration measured (issue 14) is the paper's preset with raw logits and a BOS
before the input; without one the input sits in Qwen's and SmolLM2's position-0 attention sink.

Models: `qwen2.5-0.5b` and `gemma3-270m` (from `fetch-real-models.sh`, in $SODARAY_REAL_MODELS
or ~/.cache/sodaray-real-models) and `smollm2-135m` (../shared). A GGUF is de-quantised once
(1.5-2.5 minutes on 2 cores) and saved beside it as a plain safetensors folder (`NAME-plain/`)
that later runs load in seconds. Models that are absent are skipped with a note.

Inputs: random token ids (seed 1), uniform over the ids the tokenizer can produce
(`len(tokenizer)`; Qwen's config pads its vocabulary to 151936 with 271 ids no text maps to).

Configs (`--configs`, comma-separated): `paper` is the paper's Qwen-2.5-0.5B preset (the paper
gives none for SmolLM2 or Gemma); `+KEY=VALUE` adds an algorithm parameter, `+centred` /
`+logprobs` change the observation space, e.g. `paper+loss_reduction=mean+centred`. Prints one
line per model, config and length, then a Markdown table; the paper's Qwen-2.5-0.5B row
(99.9 / 96.2 / 93.2 exact at lengths 1 / 2 / 3, up to 100K steps) is printed beside it.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
import warnings
from pathlib import Path

import numpy as np
import torch

import sodaray
from sodaray.report.metrics import wilson_interval

SHARED = Path(__file__).resolve().parents[2] / "shared"
PAPER_QWEN = {1: 99.9, 2: 96.2, 3: 93.2}
SPACES = ("raw", "centred", "logprobs")


def real_models_dir() -> Path:
    default = Path.home() / ".cache" / "sodaray-real-models"
    return Path(os.environ.get("SODARAY_REAL_MODELS", default))


def model_sources() -> dict[str, tuple[Path, str]]:
    """name -> (folder holding the GGUF, GGUF file name)."""
    real = real_models_dir()
    return {
        "qwen2.5-0.5b": (real / "qwen2.5-0.5b", "model.gguf"),
        "gemma3-270m": (real / "gemma3-270m", "model.gguf"),
        "smollm2-135m": (
            SHARED / "models" / "smollm2-135m-instruct-q4_1",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
    }


def plain_copy(name: str, folder: Path, gguf: str) -> Path | None:
    """A plain safetensors copy of a GGUF model, made once (de-quantising is slow)."""
    plain = real_models_dir() / f"{name}-plain"
    if (plain / "config.json").is_file():
        return plain
    if not (folder / gguf).is_file():
        return None
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"# de-quantising {folder / gguf} once into {plain} ...", flush=True)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.save_pretrained(plain)
    tokenizer.save_pretrained(plain)
    return plain


def parse_config(spec: str, steps: int, batch: int) -> tuple[sodaray.SodaConfig, str]:
    """`paper+key=value+centred` -> (SodaConfig, observation space)."""
    parts = spec.split("+")
    if parts[0] != "paper":
        raise SystemExit(f"config {spec!r}: must start with 'paper'")
    params: dict[str, object] = {}
    space = "raw"
    for part in parts[1:]:
        if part in SPACES:
            space = part
            continue
        key, _, value = part.partition("=")
        if not value:
            raise SystemExit(f"config {spec!r}: {part!r} is not KEY=VALUE or a space")
        params[key] = value if key in ("loss_reduction", "precision") else float(value)
        for int_key in ("reset_period", "reinit_period"):
            if key == int_key:
                params[key] = int(float(value))
    config = sodaray.SodaConfig.from_preset(
        "qwen2.5-0.5b", max_steps=steps, max_batch_size=batch, seed=0, **params
    )
    return config, space


@torch.no_grad()
def probe(model: sodaray.LoadedModel, ids: int, count: int = 48) -> str:
    """How much the observed logits depend on the input: the mean |difference| between the
    logits of `count` random single tokens, raw and centred, median over pairs; then the same
    for the token after one random token of context. A flat map (small differences) leaves the
    relaxed loss almost nothing to descend on."""
    gen = torch.Generator().manual_seed(3)
    first = torch.randint(0, ids, (count, 1), generator=gen)
    context = torch.randint(0, ids, (count, 1), generator=gen)
    parts = []
    for label, tokens in (("1 token", first), ("after 1 token", torch.cat([context, first], 1))):
        logits = model.token_logits(tokens)[:, -1].float()
        pairs = torch.triu_indices(count, count, 1)
        raw = (logits[pairs[0]] - logits[pairs[1]]).abs().mean(1).median()
        centred = logits - logits.mean(1, keepdim=True)
        cen = (centred[pairs[0]] - centred[pairs[1]]).abs().mean(1).median()
        parts.append(f"{label}: |dlogit| {raw:.2f} (centred {cen:.2f})")
    return "; ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="qwen2.5-0.5b,smollm2-135m,gemma3-270m")
    parser.add_argument("--lengths", default="1-3")
    parser.add_argument("--per-length", type=int, default=16)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--configs", default="paper")
    parser.add_argument("--batch", type=int, default=64, help="max_batch_size")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--bos",
        choices=["auto", "on", "off"],
        default="auto",
        help="a BOS token before the input: as the tokenizer does for plain text (auto), or "
        "forced. Without one the input sits at position 0, which Qwen and SmolLM2 treat as an "
        "attention sink whose output hardly depends on the token (RESULTS.md, issue 14)",
    )
    parser.add_argument(
        "--probe", action="store_true", help="only measure how input-dependent the outputs are"
    )
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    torch.set_num_threads(args.threads)
    lo, _, hi = args.lengths.partition("-")  # "1-3" or a single length, "2"
    lo, hi = int(lo), int(hi or lo)
    configs = {spec: parse_config(spec, args.steps, args.batch) for spec in args.configs.split(",")}
    rows = []
    sources = model_sources()
    for name in args.models.split(","):
        if name not in sources:
            raise SystemExit(f"unknown model {name!r}; choose from {', '.join(sources)}")
        path = plain_copy(name, *sources[name])
        if path is None:
            print(f"# {name}: absent (run ../shared/models/fetch-real-models.sh); skipped")
            continue
        bos = {"auto": None, "on": True, "off": False}[args.bos]
        model = sodaray.load_model(str(path), device="cpu", bos=bos)
        ids = len(model.tokenizer) if model.tokenizer is not None else model.vocab_size
        ids = min(ids, model.vocab_size)
        rng = np.random.default_rng(1)
        # Drawn from length 1 up whatever --lengths says, so `--lengths 3` runs the same inputs
        # as the n=3 row of `--lengths 1-3` (a run can be split without changing its inputs).
        drawn = {n: rng.integers(0, ids, (args.per_length, n)).tolist() for n in range(1, hi + 1)}
        inputs = {n: drawn[n] for n in range(lo, hi + 1)}
        print(
            f"# {name}: {model.num_parameters / 1e6:.0f}M parameters, vocabulary "
            f"{model.vocab_size} ({ids} tokenizer ids), prefix {model.prefix_ids}, "
            f"tolerance {model.default_tolerance:g}, threads {args.threads}",
            flush=True,
        )
        if args.probe:
            print(f"{name} bos={args.bos} prefix {model.prefix_ids}: {probe(model, ids)}")
            continue
        for spec, (config, space) in configs.items():
            objective = sodaray.Objective(space=space)
            for n, tokens in inputs.items():
                targets = sodaray.make_targets(model, tokens, objective=objective)
                start = time.perf_counter()
                results = sodaray.invert(model, targets, config)
                seconds = time.perf_counter() - start
                found = sum(r.found for r in results)
                exact = sum(bool(r.exact) for r in results)
                at = sorted(r.steps for r in results if r.found)
                lo_f, hi_f = wilson_interval(found, len(results))
                lo_e, hi_e = wilson_interval(exact, len(results))
                print(
                    f"{name} bos={args.bos} {spec} n={n}: found {found}/{len(results)} "
                    f"({100 * lo_f:.0f}-{100 * hi_f:.0f}%), exact {exact}/{len(results)} "
                    f"({100 * lo_e:.0f}-{100 * hi_e:.0f}%), budget {args.steps} steps, "
                    f"found at steps {at}, {seconds:.0f}s",
                    flush=True,
                )
                rows.append((f"{name} bos={args.bos}", spec, n, exact, len(results), lo_e, hi_e))
    if not rows:
        return
    print("\n| model | config | n | exact (Wilson 95%) | paper Qwen-2.5-0.5B |")
    print("|---|---|---|---|---|")
    for name, spec, n, exact, total, lo_e, hi_e in rows:
        paper = f"{PAPER_QWEN[n]}%" if n in PAPER_QWEN else ""
        print(
            f"| {name} | {spec} | {n} | {exact}/{total} ({100 * lo_e:.0f}–{100 * hi_e:.0f}%) "
            f"| {paper} |"
        )


if __name__ == "__main__":
    main()
