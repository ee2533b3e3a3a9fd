"""The inverter network: a T5 encoder-decoder whose vocabulary is the target model's own.

No pretrained T5 weights can be fetched here, so the network is initialised from a
T5-Small-shaped config (or a smaller shape for CPU budgets). Sharing the LLM's vocabulary means
the output needs no re-tokenisation: it is truncated to the requested length directly.

Two observations, as in the paper's appendix (after Morris et al. 2023):
- "text": the observed output tokens enter the encoder as its input ids.
- "logits": each observed position's log-probabilities, minus a unigram vector kept as a running
  mean of the training batches (weight `unigram_beta`, 0.01), are cut into `pieces` (64) equal
  slices (zero-padded), and an MLP (hidden `mlp_hidden`; the paper's 32768) maps each slice to
  one encoder input embedding: 64 encoder tokens per observed position.
"""

from __future__ import annotations

import functools
import logging
import math
import shutil
import tempfile
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import BinaryIO

import torch
from safetensors.torch import load_file, save
from torch import Tensor, nn
from transformers import T5Config, T5ForConditionalGeneration

from sodaray.errors import first_line
from sodaray.io import jsontext
from sodaray.io.files import read_json_object, what_is
from sodaray.io.writes import write_file

log = logging.getLogger(__name__)

META = "inverter.json"
LOGITS_ENCODER = "logits_encoder.safetensors"
OBSERVATIONS = ("text", "logits")
# What `save_inverter` writes in a checkpoint folder (the first three by transformers).
CHECKPOINT_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    META,
    LOGITS_ENCODER,
)

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
    output_tokens: int  # observed positions the encoder reads
    shape: str
    init: str  # "random (T5-Small-shaped config, no hub weights)" or a checkpoint path
    observation: str = "text"  # or "logits"
    pieces: int = 64  # logits: slices of the vocabulary, one encoder token each
    mlp_hidden: int = 0  # logits: hidden width of the slice MLP
    unigram_beta: float = 0.01  # logits: weight of each training batch in the unigram mean

    @property
    def pad_id(self) -> int:
        return self.llm_vocab_size

    @property
    def eos_id(self) -> int:
        return self.llm_vocab_size + 1


class LogitsEncoder(nn.Module):
    """Observed logits (B, m, V) -> encoder input embeddings (B, m * pieces, d_model)."""

    def __init__(self, vocab: int, d_model: int, pieces: int, hidden: int, beta: float) -> None:
        super().__init__()
        if pieces < 1 or hidden < 1 or not 0 < beta <= 1:
            raise ValueError("pieces and mlp_hidden must be positive, unigram_beta in (0, 1]")
        self.vocab, self.pieces, self.beta = vocab, pieces, beta
        self.width = math.ceil(vocab / pieces)
        self.mlp = nn.Sequential(
            nn.Linear(self.width, hidden), nn.GELU(), nn.Linear(hidden, d_model)
        )
        self.register_buffer("unigram", torch.zeros(vocab))
        self.register_buffer("unigram_set", torch.zeros(()))

    def forward(self, logits: Tensor) -> Tensor:
        if logits.dim() != 3 or logits.shape[-1] != self.vocab:
            raise ValueError(
                f"the logits inverter reads (batch, positions, {self.vocab}) logits, "
                f"not {tuple(logits.shape)}"
            )
        x = logits.float().log_softmax(-1)  # the same for raw, centred and log-prob spaces
        if self.training:
            with torch.no_grad():
                batch = x.mean(dim=(0, 1))
                if not bool(self.unigram_set):  # the first batch sets it
                    self.unigram.copy_(batch)
                    self.unigram_set.fill_(1.0)
                else:
                    self.unigram.mul_(1 - self.beta).add_(batch, alpha=self.beta)
        x = torch.nan_to_num(x - self.unigram, nan=0.0, posinf=0.0, neginf=0.0)
        b, m, v = x.shape
        x = nn.functional.pad(x, (0, self.pieces * self.width - v))
        return self.mlp(x.reshape(b, m * self.pieces, self.width))


class Inverter(nn.Module):
    """The T5 and, for observed logits, the encoder that turns them into input embeddings."""

    def __init__(self, t5: T5ForConditionalGeneration, meta: InverterMeta) -> None:
        super().__init__()
        self.t5, self.meta = t5, meta
        self.logits_encoder: LogitsEncoder | None = None
        if meta.observation == "logits":
            self.logits_encoder = LogitsEncoder(
                meta.llm_vocab_size,
                t5.config.d_model,
                meta.pieces,
                meta.mlp_hidden,
                meta.unigram_beta,
            )

    def encoder_inputs(self, obs: Tensor) -> dict[str, Tensor]:
        """Token ids (B, m) for text, logits (B, m, V) for logits: T5 encoder keyword inputs."""
        if self.logits_encoder is None:
            return {"input_ids": obs, "attention_mask": torch.ones_like(obs)}
        emb = self.logits_encoder(obs)
        mask = torch.ones(emb.shape[:2], dtype=torch.long, device=emb.device)
        return {"inputs_embeds": emb, "attention_mask": mask}

    def forward(self, obs: Tensor, labels: Tensor) -> Tensor:
        """The teacher-forced cross-entropy of the labels (the input, then eos)."""
        return self.t5(**self.encoder_inputs(obs), labels=labels).loss


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


def build_inverter(meta: InverterMeta) -> Inverter:
    if meta.observation not in OBSERVATIONS:
        raise ValueError(
            f"unknown observation {meta.observation!r}; choose one of {', '.join(OBSERVATIONS)}"
        )
    return Inverter(build_model(meta.llm_vocab_size, meta.shape), meta)


def save_inverter(
    path: str | Path, net: Inverter, meta: InverterMeta, base: str | Path | None = None
) -> None:
    """A checkpoint folder: the T5 (safetensors: no pickle), the logits encoder and
    `inverter.json`, each file by the rule for every file sodaray writes (`writes`; `base`:
    the folder the user gave, default `path`'s parent). transformers writes by name, so the T5
    is saved into a fresh temporary folder and copied from there."""
    path = Path(path)
    base = path.parent if base is None else base
    with tempfile.TemporaryDirectory(prefix="sodaray-t5-") as tmp:
        net.t5.save_pretrained(tmp)
        for file in sorted(Path(tmp).iterdir()):
            write_file(base, path / file.name, functools.partial(_copy, file))
    if net.logits_encoder is not None:
        tensors = {k: v.detach().contiguous() for k, v in net.logits_encoder.state_dict().items()}
        write_file(base, path / LOGITS_ENCODER, save(tensors))
    write_file(base, path / META, jsontext.dumps(asdict(meta), indent=2))


def _copy(source: Path, f: BinaryIO) -> None:
    with source.open("rb") as src:
        shutil.copyfileobj(src, f, 1 << 20)


def read_meta(path: Path) -> InverterMeta:
    """A checkpoint's `inverter.json`, checked as any file read back from disk: a regular
    file of at most `MAX_CONFIG_BYTES` holding an object of `InverterMeta`'s fields, each of
    its type (a JSON list there ended in a traceback)."""
    from sodaray.config.validation import coerce_fields

    data = read_json_object(path, "inverter checkpoint file")
    known = fields(InverterMeta)
    unknown = sorted(str(k) for k in data if k not in {f.name for f in known})
    missing = [f.name for f in known if f.name not in data and f.default is MISSING]
    if unknown or missing:
        what = f"unknown field {unknown[0]!r}" if unknown else f"no {missing[0]!r}"
        raise ValueError(f"{path}: not an inverter checkpoint file ({what})")
    try:
        return InverterMeta(**coerce_fields(InverterMeta, data))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: {first_line(exc)}") from exc


def load_inverter(path: str | Path) -> tuple[Inverter, InverterMeta]:
    path = Path(path)
    if what_is(path) not in ("a directory", None):
        raise ValueError(f"{path} is {what_is(path)}, not an inverter checkpoint folder")
    if what_is(path / META) is None:
        raise ValueError(f"{path} is not an inverter checkpoint (no {META})")
    meta = read_meta(path / META)
    if meta.observation not in OBSERVATIONS:
        raise ValueError(f"{path}: unknown observation {meta.observation!r}")
    t5 = T5ForConditionalGeneration.from_pretrained(path)
    net = Inverter(t5, meta)
    if net.logits_encoder is not None:
        if not (path / LOGITS_ENCODER).is_file():
            raise ValueError(f"{path} is a logits inverter without {LOGITS_ENCODER}")
        net.logits_encoder.load_state_dict(load_file(str(path / LOGITS_ENCODER)))
    net.eval()
    return net, meta
