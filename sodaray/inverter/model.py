"""The inverter network: a T5 encoder-decoder whose vocabulary is the target model's own.

No pretrained T5 weights can be fetched here, so the network is initialised from a
T5-Small-shaped config (or a smaller shape for CPU budgets). Sharing the LLM's vocabulary means
the output needs no re-tokenisation: it is truncated to the requested length directly."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from transformers import T5Config, T5ForConditionalGeneration

log = logging.getLogger(__name__)

META = "inverter.json"

# d_model, d_ff, layers, heads: "small" is T5-Small's shape; the others fit 2-core CPU budgets.
SHAPES: dict[str, tuple[int, int, int, int]] = {
    "small": (512, 2048, 6, 8),
    "mini": (256, 1024, 4, 4),
    "micro": (128, 512, 3, 4),
    "tiny": (64, 128, 2, 2),
}


@dataclass
class InverterMeta:
    """What a checkpoint folder needs besides the weights to be used on a target model."""

    llm_vocab_size: int
    output_tokens: int  # length of the observed continuation the encoder reads
    shape: str
    init: str  # "random (T5-Small-shaped config, no hub weights)" or a checkpoint path

    @property
    def pad_id(self) -> int:
        return self.llm_vocab_size

    @property
    def eos_id(self) -> int:
        return self.llm_vocab_size + 1


def build_model(llm_vocab_size: int, shape: str = "small") -> T5ForConditionalGeneration:
    """A randomly initialised T5 of the named shape over the LLM's vocabulary + pad + eos."""
    if shape not in SHAPES:
        raise ValueError(f"unknown inverter shape {shape!r}; choose one of {', '.join(SHAPES)}")
    d_model, d_ff, layers, heads = SHAPES[shape]
    cfg = T5Config(
        vocab_size=llm_vocab_size + 2,
        d_model=d_model,
        d_ff=d_ff,
        d_kv=d_model // heads,
        num_layers=layers,
        num_decoder_layers=layers,
        num_heads=heads,
        pad_token_id=llm_vocab_size,
        eos_token_id=llm_vocab_size + 1,
        decoder_start_token_id=llm_vocab_size,
    )
    return T5ForConditionalGeneration(cfg)


def save_inverter(path: str | Path, net: T5ForConditionalGeneration, meta: InverterMeta) -> None:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    net.save_pretrained(path)  # safetensors: no pickle
    (path / META).write_text(json.dumps(asdict(meta), indent=2))


def load_inverter(path: str | Path) -> tuple[T5ForConditionalGeneration, InverterMeta]:
    path = Path(path)
    if not (path / META).is_file():
        raise ValueError(f"{path} is not an inverter checkpoint (no {META})")
    meta = InverterMeta(**json.loads((path / META).read_text()))
    net = T5ForConditionalGeneration.from_pretrained(path)
    net.eval()
    return net, meta
