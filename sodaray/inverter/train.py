"""The learned inversion baseline's network and its training.

The network: a T5 encoder-decoder whose vocabulary is the target model's own, initialised from a
T5-Small-shaped config (no pretrained T5 weights can be fetched here; smaller shapes fit CPU
budgets); its output needs no re-tokenisation, only truncation to the requested length. Two
observations, as in the paper's appendix (after Morris et al. 2023): "text", the observed output
tokens as the encoder's input ids; "logits", each observed position's log-probabilities minus a
unigram vector (a running mean of the training batches, weight `unigram_beta`), cut into
`pieces` (64) zero-padded slices that an MLP (hidden `mlp_hidden`; the paper's 32768) maps to one
encoder input embedding each.

Training: AdamW with linear warm-up then a constant rate (the paper's text inverter settings by
default; `PAPER_DEFAULTS` holds the logits inverter's), validation loss and exact rate per epoch,
best-validation checkpoint, resumable from the last epoch's checkpoint, on pairs of Random inputs
and the target model's greedy continuation of each. A plain torch loop rather than the HF
Trainer: the Trainer's checkpoint format pickles optimiser state, and this loop keeps resume on
safetensors + a JSON state, with nothing to unpickle."""

from __future__ import annotations

import functools
import logging
import math
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import BinaryIO

import torch
from safetensors.torch import load_file, save
from torch import Tensor, nn
from tqdm import tqdm
from transformers import T5Config, T5ForConditionalGeneration

from sodaray.config.capacity import check_context
from sodaray.config.validation import check_fields_finite, coerce_fields
from sodaray.data.build import random_samples
from sodaray.errors import first_line
from sodaray.io import jsontext
from sodaray.io.files import read_json_object, what_is
from sodaray.io.writes import check_places, write_file
from sodaray.model.loaded import LoadedModel
from sodaray.objective.targets import greedy_continuation

log = logging.getLogger(__name__)

META = "inverter.json"
LOGITS_ENCODER = "logits_encoder.safetensors"
OBSERVATIONS = ("text", "logits")
T5_FILES = ("config.json", "generation_config.json", "model.safetensors")  # by transformers
CHECKPOINT_FILES = (*T5_FILES, META, LOGITS_ENCODER)  # what `save_inverter` writes

# d_model, d_ff, layers, heads: "small" is T5-Small's shape; the others fit 2-core CPU budgets.
SHAPES: dict[str, tuple[int, int, int, int]] = {
    "small": (512, 2048, 6, 8),
    "mini": (256, 1024, 4, 4),
    "micro": (128, 512, 3, 4),
    "tiny": (64, 128, 2, 2),
}


def choose(what: str, value: str, options) -> None:
    """A ValueError naming the options when `value` is not one of them."""
    if value not in options:
        raise ValueError(f"unknown {what} {value!r}; choose one of {', '.join(options)}")


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
            sizes = (meta.llm_vocab_size, t5.config.d_model, meta.pieces, meta.mlp_hidden)
            self.logits_encoder = LogitsEncoder(*sizes, meta.unigram_beta)

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


def build_inverter(meta: InverterMeta) -> Inverter:
    """A randomly initialised T5 of `meta.shape` over the LLM's vocabulary + pad + eos."""
    choose("observation", meta.observation, OBSERVATIONS)
    choose("inverter shape", meta.shape, SHAPES)
    d_model, d_ff, layers, heads = SHAPES[meta.shape]
    v = meta.llm_vocab_size
    ids = dict(pad_token_id=v, eos_token_id=v + 1, decoder_start_token_id=v)
    sizes = dict(d_model=d_model, d_ff=d_ff, d_kv=d_model // heads, num_heads=heads)
    cfg = T5Config(vocab_size=v + 2, num_layers=layers, num_decoder_layers=layers, **ids, **sizes)
    return Inverter(T5ForConditionalGeneration(cfg), meta)


def save_inverter(path: str | Path, net: Inverter, meta: InverterMeta) -> None:
    """A checkpoint folder: the T5 (safetensors: no pickle), the logits encoder and
    `inverter.json`, each file by the rule for every file sodaray writes (`writes`, below
    `path`'s parent: the folder the user gave). transformers writes by name, so the T5 is
    saved into a fresh temporary folder and copied from there."""
    path = Path(path)
    base = path.parent
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


def load_inverter(path: str | Path) -> tuple[Inverter, InverterMeta]:
    path = Path(path)
    if what_is(path) not in ("a directory", None):
        raise ValueError(f"{path} is {what_is(path)}, not an inverter checkpoint folder")
    if what_is(path / META) is None:
        raise ValueError(f"{path} is not an inverter checkpoint (no {META})")
    # `inverter.json` checked as any file read back from disk: a regular file of at most
    # `MAX_CONFIG_BYTES` holding an object of `InverterMeta`'s fields, each of its type.
    data = read_json_object(path / META, "inverter checkpoint file")
    known = fields(InverterMeta)
    unknown = sorted(str(k) for k in data if k not in {f.name for f in known})
    missing = [f.name for f in known if f.name not in data and f.default is MISSING]
    if unknown or missing:
        what = f"unknown field {unknown[0]!r}" if unknown else f"no {missing[0]!r}"
        raise ValueError(f"{path / META}: not an inverter checkpoint file ({what})")
    try:
        meta = InverterMeta(**coerce_fields(InverterMeta, data))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path / META}: {first_line(exc)}") from exc
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


@dataclass
class TrainConfig:
    lengths: tuple[int, ...] = (1, 2, 3, 4, 5)
    per_length: int = 2000
    output_tokens: int = 10
    val_fraction: float = 0.1
    epochs: int = 30
    batch_size: int = 160
    lr: float = 1e-3
    weight_decay: float = 0.05
    warmup_steps: int = 1000
    shape: str = "small"
    seed: int = 0
    max_seconds: float | None = None  # stop after the epoch that crosses this budget
    observation: str = "text"  # "text" (observed tokens) or "logits" (observed logits)
    mlp_hidden: int = 1024  # logits: the slice MLP's hidden width (the paper's: 32768)
    pieces: int = 64  # logits: vocabulary slices, one encoder token each
    unigram_beta: float = 0.01  # logits: weight of a batch in the running unigram vector

    def validate(self) -> None:
        check_fields_finite(self)  # NaN passes every range check below
        choose("inverter shape", self.shape, SHAPES)
        choose("observation", self.observation, OBSERVATIONS)
        if not 0 < self.unigram_beta <= 1:
            raise ValueError(f"unigram_beta must be in (0, 1], not {self.unigram_beta}")
        if not self.lr > 0:
            raise ValueError(f"lr must be positive, not {self.lr}")
        if self.weight_decay < 0 or self.warmup_steps < 0:
            raise ValueError("weight_decay and warmup_steps must be non-negative")
        if self.max_seconds is not None and not self.max_seconds > 0:
            raise ValueError(f"max_seconds must be positive, not {self.max_seconds}")
        if not 0 < self.val_fraction < 1:
            raise ValueError(f"val_fraction must be in (0, 1), not {self.val_fraction}")
        for name in ("per_length", "output_tokens", "epochs", "batch_size", "mlp_hidden", "pieces"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        if not self.lengths or min(self.lengths) < 1:
            raise ValueError("lengths must be positive")


def build_pairs(
    model: LoadedModel,
    lengths: list[int],
    per_length: int,
    output_tokens: int,
    seed: int,
    batch_size: int = 256,
    keep_logits: bool = False,
) -> tuple[list[list[int]], Tensor, Tensor | None]:
    """Random inputs of each length, their greedy continuations (N, output_tokens) and, with
    `keep_logits`, the logits at those positions (N, output_tokens, V): what the logits
    objective observes (with output_tokens=1, the next-token distribution)."""
    if per_length < 1 or output_tokens < 1:
        raise ValueError("per_length and output_tokens must be at least 1")
    inputs = [s[2] for s in random_samples(model.vocab_size, lengths, per_length, seed)]
    outs: list[Tensor] = []
    seen: list[Tensor] = []
    with torch.no_grad():
        for length in lengths:
            rows = [x for x in inputs if len(x) == length]
            for start in range(0, len(rows), batch_size):
                chunk = torch.tensor(rows[start : start + batch_size], device=model.device)
                cont, logits = greedy_continuation(model, chunk, output_tokens)
                outs.append(cont.cpu())
                if keep_logits:
                    seen.append(logits.float().cpu())
    # random_samples emits lengths in order, so this order matches `inputs`.
    return inputs, torch.cat(outs), torch.cat(seen) if keep_logits else None


def encode_targets(inputs: list[list[int]], eos_id: int) -> Tensor:
    """Decoder labels: the input then eos, padded with -100 (ignored by the loss)."""
    labels = torch.full((len(inputs), max(map(len, inputs)) + 1), -100, dtype=torch.long)
    for i, x in enumerate(inputs):
        labels[i, : len(x) + 1] = torch.tensor([*x, eos_id])
    return labels


@torch.no_grad()
def _val_loss(net: Inverter, obs: torch.Tensor, labels: torch.Tensor, batch: int) -> float:
    """Mean token cross-entropy over the validation rows, in batches (logits rows are wide)."""
    total, count = 0.0, 0
    for rows, lab in zip(obs.split(4 * batch), labels.split(4 * batch), strict=True):
        n = int((lab != -100).sum())
        total += float(net(rows, lab)) * n
        count += n
    return total / count


def _exact_rate(net: Inverter, obs: torch.Tensor, inputs: list[list[int]], batch: int) -> float:
    """Share of validation inputs decoded exactly, each at its own length."""
    hits = 0
    for n in sorted({len(x) for x in inputs}):
        rows = [i for i, x in enumerate(inputs) if len(x) == n]
        for start in range(0, len(rows), 4 * batch):
            chunk = rows[start : start + 4 * batch]
            pred = generate(net, obs[chunk], n, net.meta)
            hits += sum(p == inputs[i] for p, i in zip(pred, chunk, strict=True))
    return hits / len(inputs)


@torch.no_grad()
def generate(net: Inverter, obs: torch.Tensor, length: int, meta: InverterMeta) -> list[list[int]]:
    """Greedy decoding of `length` tokens, eos and pad masked out (the length is given)."""
    net.eval()
    out = net.t5.generate(
        **net.encoder_inputs(obs),
        max_new_tokens=length,
        min_new_tokens=length,
        do_sample=False,
        num_beams=1,
        bad_words_ids=[[meta.pad_id], [meta.eos_id]],
    )
    return [row[1 : length + 1] for row in out.tolist()]  # drop the decoder start token


# The paper's settings per observation (appendix, "inversion models"); the rest are shared.
PAPER_DEFAULTS: dict[str, dict[str, float | int]] = {
    "text": {"lr": 1e-3, "weight_decay": 0.05, "batch_size": 160, "output_tokens": 10},
    "logits": {"lr": 2e-4, "weight_decay": 0.025, "batch_size": 80, "output_tokens": 1},
}

# What the training pairs and the network depend on: a resume must not change them.
FIXED_ON_RESUME = (
    "lengths per_length output_tokens val_fraction shape seed observation mlp_hidden pieces"
).split()


def check_resumable(cfg: TrainConfig, out: Path) -> None:
    """A folder holding a run made with other data or shape settings is refused, by name; so
    is one where a file the run writes is a link or not a regular file (`writes`), before any
    training rather than at the first checkpoint."""
    folders = [out / "best", out / "last"]
    files = [out / n for n in ("train_config.json", "state.json", "optim.safetensors")]
    check_places(out, [*files, *(f / name for f in folders for name in CHECKPOINT_FILES)])
    path = out / "train_config.json"
    if not (out / "state.json").is_file() or not path.is_file():
        return
    before = read_json_object(path, "training settings file")  # a list: one line, not a crash
    now = asdict(cfg)
    now["lengths"] = list(now["lengths"])
    for name in FIXED_ON_RESUME:
        if name in before and before[name] != now[name]:
            raise ValueError(
                f"{out} holds a run with {name}={before[name]!r}, not {now[name]!r}: "
                "resume with the same setting or choose another --out"
            )


def train_inverter(
    model: LoadedModel,
    cfg: TrainConfig,
    out: str | Path,
    on_epoch: Callable[[dict], None] | None = None,
) -> dict:
    """Train (or resume) into `out`: `out/last` each epoch, `out/best` on a better val loss.
    `on_epoch(row)` gets each epoch's history row once its checkpoints are written."""
    cfg.validate()
    out = Path(out)
    check_resumable(cfg, out)
    check_context(model, max(cfg.lengths), cfg.output_tokens)
    state_path = out / "state.json"
    torch.manual_seed(cfg.seed)
    logits = cfg.observation == "logits"
    inputs, cont, seen = build_pairs(
        model, list(cfg.lengths), cfg.per_length, cfg.output_tokens, cfg.seed, keep_logits=logits
    )
    obs = seen if logits else cont  # what the encoder reads, row by row
    assert obs is not None
    init = "random (T5-Small-shaped config, no hub)"
    meta = InverterMeta(model.vocab_size, cfg.output_tokens, cfg.shape, init, cfg.observation)
    meta.pieces, meta.unigram_beta = cfg.pieces, cfg.unigram_beta
    meta.mlp_hidden = cfg.mlp_hidden if logits else 0
    perm = torch.randperm(len(inputs), generator=torch.Generator().manual_seed(cfg.seed))
    n_val = max(1, int(len(inputs) * cfg.val_fraction))
    val_idx, train_idx = perm[:n_val], perm[n_val:]
    labels = encode_targets(inputs, meta.eos_id)
    val_inputs = [inputs[i] for i in val_idx.tolist()]

    state = {"epoch": 0, "best_val": float("inf"), "history": [], "seconds": 0.0}
    if state_path.is_file():
        state = read_json_object(state_path, "training state file")
        if not isinstance(state.get("best_val"), int | float):  # null: no finite loss yet
            state["best_val"] = float("inf")
        net, _ = load_inverter(out / "last")
        log.info("resuming from epoch %d", state["epoch"])
    else:
        net = build_inverter(meta)
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    warmup = max(1, cfg.warmup_steps)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))
    if state_path.is_file() and (out / "optim.safetensors").is_file():
        _load_optim(opt, sched, out / "optim.safetensors", state)
    # Every file under `out`, the folder the user gave, by the rule for writes (`writes`).
    write_file(out, out / "train_config.json", jsontext.dumps(asdict(cfg), indent=2))

    gen = torch.Generator().manual_seed(cfg.seed + state["epoch"])
    for epoch in range(state["epoch"], cfg.epochs):
        t0 = time.perf_counter()
        net.train()
        order = train_idx[torch.randperm(len(train_idx), generator=gen)]
        batches = range(0, len(order), cfg.batch_size)
        total = 0.0
        for start in tqdm(batches, desc=f"epoch {epoch + 1}/{cfg.epochs}", leave=False):
            idx = order[start : start + cfg.batch_size]
            loss = net(obs[idx], labels[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            total += float(loss.detach()) * len(idx)
        net.eval()
        val_loss = _val_loss(net, obs[val_idx], labels[val_idx], cfg.batch_size)
        exact = _exact_rate(net, obs[val_idx], val_inputs, cfg.batch_size)
        state["seconds"] += time.perf_counter() - t0
        row = {"epoch": epoch + 1, "train_loss": total / len(train_idx), "val_loss": val_loss}
        row |= {"val_exact": exact, "seconds": state["seconds"]}
        state["history"].append(row)
        what = (epoch + 1, row["train_loss"], val_loss, exact)
        log.info("epoch %d train %.4f val %.4f exact %.3f", *what)
        if val_loss < state["best_val"]:
            state["best_val"] = val_loss
            save_inverter(out / "best", net, meta)
        state["epoch"] = epoch + 1
        save_inverter(out / "last", net, meta)
        _save_optim(opt, sched, out / "optim.safetensors", state)
        write_file(out, state_path, jsontext.dumps(state, indent=2))  # strict JSON: NaN as null
        if on_epoch is not None:
            on_epoch(row)
        if cfg.max_seconds is not None and state["seconds"] >= cfg.max_seconds:
            log.info("time budget reached after epoch %d", epoch + 1)
            break
    return state


def _save_optim(opt, sched, path: Path, state: dict) -> None:
    """AdamW moments as safetensors (no pickle); step counts go in the JSON state."""
    tensors = {}
    for i, st in opt.state_dict()["state"].items():  # keyed by parameter index
        tensors.update({f"{i}.{k}": st[k].contiguous() for k in ("exp_avg", "exp_avg_sq")})
        state["adam_step"] = float(st["step"])
    state["sched_step"] = sched.last_epoch
    write_file(path.parent, path, save(tensors))


def _load_optim(opt, sched, path: Path, state: dict) -> None:
    tensors = load_file(str(path))
    sd = opt.state_dict()
    for i, p in enumerate(sd["param_groups"][0]["params"]):
        if f"{i}.exp_avg" in tensors:
            moments = {k: tensors[f"{i}.{k}"] for k in ("exp_avg", "exp_avg_sq")}
            sd["state"][p] = {"step": torch.tensor(state["adam_step"]), **moments}
    opt.load_state_dict(sd)
    sched.last_epoch = state["sched_step"]
    for g in opt.param_groups:
        g["lr"] = g["initial_lr"] * sched.lr_lambdas[0](sched.last_epoch)
