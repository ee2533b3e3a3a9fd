"""Operations a SODA step launches outside the model's layers, per model shape (issue 41).

The count `../shared/tools/opcount.py` makes (torch.profiler on CPU, ops that do work, views and
allocations left out, over 10 steps after a warm-up; B=64, n=10), for a 1-layer and a 2-layer
model of each shape in one run: outside = 2 * ops(1 layer) - ops(2 layers). `neo` is the
TinyStories-33M shape (GPT-Neo, eager attention; opcount.py's own model), `qwen` a narrow
Qwen2 (the width-invariant attention path real Llama, Qwen2 and Gemma 3 models take).
A step's operations are a proxy for the kernels it launches on a GPU.

    python benchmarks/step_ops.py [--shape neo|qwen ...] [--bos]

`--bos`: a one-token prefix before every input (token 1), as real models are searched with a BOS.
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import AutoModelForCausalLM, GPTNeoConfig, Qwen2Config

import sodaray

# opcount.py's list of operations that launch no work.
FREE = {
    *"view as_strided empty empty_strided t transpose reshape _reshape_alias expand slice".split(),
    *"select unsqueeze squeeze detach alias _unsafe_view permute resolve_conj resolve_neg".split(),
    *"lift_fresh result_type size stride numel is_nonzero item _local_scalar_dense split".split(),
    *"chunk narrow unbind view_as contiguous empty_like _to_copy to unflatten flatten".split(),
    *"expand_as _has_compatible_shallow_copy_type".split(),
}
FREE = {f"aten::{name}" for name in FREE} | {"detach"}


def model(shape: str, layers: int, small: bool = False) -> tuple[sodaray.LoadedModel, str, int]:
    """A randomly initialised model of `shape` with `layers` layers; `small`: the same
    architecture at small widths (the same operations, for tests)."""
    torch.manual_seed(0)
    if shape == "neo":
        vocab = 1024 if small else 50257
        cfg = GPTNeoConfig(
            vocab_size=vocab,
            hidden_size=64 if small else 768,
            num_layers=layers,
            num_heads=4 if small else 16,
            attention_types=[[["global"], layers]],
            window_size=256,
            max_position_embeddings=2048,
            initializer_range=0.1,
            bos_token_id=vocab - 1,  # GPT-Neo's default, 50256, is outside a small vocabulary
            eos_token_id=vocab - 1,
        )
        preset = "tinystories-33m"
    else:
        vocab = 1024 if small else 4096
        cfg = Qwen2Config(
            vocab_size=vocab,
            hidden_size=64 if small else 128,
            intermediate_size=128 if small else 256,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
        )
        preset = "qwen2.5-0.5b"
    lm = sodaray.wrap_model(AutoModelForCausalLM.from_config(cfg), None, name=shape)
    return lm, preset, vocab


def ops_per_step(shape: str, layers: int, bos: bool = False, small: bool = False) -> float:
    """Operations a step launches, the mean over ten steps after three (B=64, n=10; `small`:
    B=96, n=4, a batch that clears any row-invariance threshold on any thread count)."""
    lm, preset, vocab = model(shape, layers, small)
    lm.prefix_ids = [1] if bos else []
    batch, length = (96, 4) if small else (64, 10)
    inputs = torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(1))
    targets = sodaray.make_targets(lm, inputs.tolist())

    def run(steps: int) -> int:
        config = sodaray.SodaConfig.from_preset(preset, max_steps=steps, max_batch_size=batch)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            sodaray.invert(lm, targets, config)
        return sum(
            1
            for e in prof.events()
            if e.name.startswith("aten::") and e.name not in FREE and not e.cpu_children
        )

    sodaray.invert(lm, targets, sodaray.SodaConfig.from_preset(preset, max_steps=2))
    return (run(13) - run(3)) / 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", action="append", choices=["neo", "qwen"])
    parser.add_argument("--bos", action="store_true", help="a one-token prefix (a BOS)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for shape in args.shape or ["neo", "qwen"]:
        one, two = ops_per_step(shape, 1, args.bos), ops_per_step(shape, 2, args.bos)
        label = f"{shape}+bos" if args.bos else shape
        print(
            f"{label:>8}  ops/step 1 layer {one:.0f}  2 layers {two:.0f}  "
            f"outside the layers {2 * one - two:.0f}  per layer {two - one:.0f}"
        )


if __name__ == "__main__":
    main()
