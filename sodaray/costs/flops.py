"""What a search costs in arithmetic: FLOPs per sample-step from a model's shape, and the
rates a plan takes; what those FLOPs take on a device is `sodaray.costs.devices` (measured).

A SODA sample-step is one forward pass over the sample's sequence (BOS if the model takes one,
the n relaxed input positions, the observed outputs but the last) and one backward pass to the
input only (frozen weights: 2x a forward's FLOPs), plus the update over the n x V input
parameters. A model's shape is read from its config, or from the table of the paper's models
below, so `sweep plan` works offline for them.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sodaray.io.files import parse_json

log = logging.getLogger(__name__)

UPDATE_FLOPS_PER_PARAM = 30  # softmax, its backward and Adam over each of the n x V input logits
GATED = {"llama", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "gemma3_text", "mistral", "olmo"}


@dataclass(frozen=True)
class ModelShape:
    layers: int
    width: int
    vocab: int
    mlp: int  # the MLP's inner width
    gated: bool  # three MLP matrices (SwiGLU/GeGLU) instead of two
    attention: int  # query heads x head width
    kv: int  # key/value heads x head width

    @property
    def block_params(self) -> int:
        """Parameters of the transformer blocks (no embeddings, norms neglected)."""
        attn = 2 * self.width * self.attention + 2 * self.width * self.kv
        return self.layers * (attn + (3 if self.gated else 2) * self.width * self.mlp)

    def forward_flops(self, length: int, outputs: int, bos: bool = True) -> float:
        """FLOPs of one forward pass of a sample of input length `length`, `outputs` observed."""
        tokens = length + max(outputs - 1, 0) + int(bos)  # the last output is never fed
        return (
            2 * self.block_params * tokens
            + 4 * self.layers * tokens * tokens * self.attention  # scores and their mixing
            + 2 * (length + outputs) * self.vocab * self.width  # input mixture, unembedding
        )

    def step_flops(self, length: int, outputs: int, bos: bool = True) -> float:
        """FLOPs of one SODA sample-step: a forward, a backward to the input (as much again), and
        the update over the n x V input parameters."""
        forward = self.forward_flops(length, outputs, bos)
        return 2 * forward + UPDATE_FLOPS_PER_PARAM * length * self.vocab


def lengths_tried(length: Any, max_length: int) -> int:
    """The most lengths a sample is searched at: `length: auto` tries 1..`max_length`, shortest
    first; a fixed or assumed length is one."""
    return max_length if length == "auto" else 1


def most_sample_steps(samples: int, search: Any, length: Any, max_length: int) -> int:
    """The most sample-steps `samples` can take (each its whole budget at every length it may
    be searched at): the upper bound plans quote and progress bars count down from."""
    return samples * search.step_budget() * lengths_tried(length, max_length)


def shape_from_config(config: Any) -> ModelShape:
    """A shape from a transformers config object or a config.json mapping (GPT-2, GPT-Neo,
    Llama, Qwen, Gemma, Pythia field names)."""
    get = config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)
    if get("text_config") is not None:  # multimodal wrappers keep the language model inside
        return shape_from_config(get("text_config"))

    def first(*keys: str) -> Any:
        return next((get(k) for k in keys if get(k) is not None), None)

    width = int(first("hidden_size", "n_embd", "d_model"))
    heads = int(first("num_attention_heads", "n_head", "num_heads"))
    head = int(first("head_dim") or width // heads)
    kv_heads = int(first("num_key_value_heads") or heads)
    mlp = int(first("intermediate_size", "n_inner", "ffn_dim") or 4 * width)
    layers = int(first("num_hidden_layers", "n_layer", "num_layers"))
    vocab, gated = int(get("vocab_size")), str(get("model_type", "")) in GATED
    return _shape(layers, width, vocab, mlp, gated, heads, kv_heads, head)


def _shape(layers, width, vocab, mlp, gated, heads, kv_heads, head) -> ModelShape:
    return ModelShape(layers, width, vocab, mlp, gated, heads * head, kv_heads * head)


# The paper's models, from their published configs: plans for them need no download.
KNOWN_SHAPES: dict[str, ModelShape] = {
    "roneneldan/TinyStories-33M": _shape(4, 768, 50257, 3072, False, 16, 16, 48),
    "openai-community/gpt2": _shape(12, 768, 50257, 3072, False, 12, 12, 64),
    "openai-community/gpt2-medium": _shape(24, 1024, 50257, 4096, False, 16, 16, 64),
    "openai-community/gpt2-large": _shape(36, 1280, 50257, 5120, False, 20, 20, 64),
    "openai-community/gpt2-xl": _shape(48, 1600, 50257, 6400, False, 25, 25, 64),
    "Qwen/Qwen2.5-0.5B": _shape(24, 896, 151936, 4864, True, 14, 2, 64),
    "Qwen/Qwen2.5-3B": _shape(36, 2048, 151936, 11008, True, 16, 2, 128),
    "EleutherAI/pythia-1.4b": _shape(24, 2048, 50304, 8192, False, 16, 16, 128),
}


def model_shape(model_id: str) -> ModelShape | None:
    """The shape of a model named by hub id (the table above) or local folder (its config.json),
    without loading weights; None when neither tells (a GGUF file, an unknown hub id)."""
    if model_id in KNOWN_SHAPES:
        return KNOWN_SHAPES[model_id]
    config = Path(model_id).expanduser() / "config.json"
    if config.is_file():
        try:
            return shape_from_config(parse_json(config.read_text(encoding="utf-8"), str(config)))
        except (ValueError, TypeError, KeyError) as exc:
            log.info("no shape from %s: %s", config, exc)
    return None


# The least `--rate` a plan takes: one sample-step per million seconds (11.6 days); below it
# (1e-300, a typo) estimates have hundreds of digits, or overflow, instead of a time.
MIN_RATE = 1e-6


def check_rate(rate: float | None) -> None:
    """A plan's `--rate` (sample-steps per second per replica): finite and at least `MIN_RATE`,
    else a ValueError naming `--rate`."""
    if rate is not None and not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"--rate must be a positive finite number, not {rate}")
    if rate is not None and rate < MIN_RATE:
        raise ValueError(
            f"--rate {rate:g} is below {MIN_RATE:g} sample-steps per second (one per "
            f"{1 / MIN_RATE / 86400:.1f} days): no estimate at that rate means anything"
        )


def format_duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    hours = seconds / 3600
    return f"{hours:,.1f} h" if hours >= 1 else f"{seconds / 60:,.1f} min"
