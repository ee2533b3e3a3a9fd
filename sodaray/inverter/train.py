"""Training the inverter: AdamW with linear warm-up then a constant rate (the paper's text
inverter settings by default; `PAPER_DEFAULTS` holds the logits inverter's), validation loss and
exact rate per epoch, best-validation checkpoint, resumable from the last epoch's checkpoint.

A plain torch loop rather than the HF Trainer: the Trainer's checkpoint format pickles optimiser
state, and this loop keeps resume on safetensors + a JSON state, with nothing to unpickle."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save
from tqdm import tqdm

from sodaray.inverter.data import build_pairs, encode_targets
from sodaray.inverter.model import (
    CHECKPOINT_FILES,
    Inverter,
    InverterMeta,
    build_inverter,
    load_inverter,
    save_inverter,
)
from sodaray.io import jsontext
from sodaray.io.files import read_json_object
from sodaray.io.writes import check_places, write_file
from sodaray.model.loaded import LoadedModel

log = logging.getLogger(__name__)


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
        from sodaray.config.validation import check_fields_finite
        from sodaray.inverter.model import OBSERVATIONS, SHAPES

        check_fields_finite(self)  # NaN passes every range check below
        if self.shape not in SHAPES:
            raise ValueError(
                f"unknown inverter shape {self.shape!r}; choose one of {', '.join(SHAPES)}"
            )
        if self.observation not in OBSERVATIONS:
            raise ValueError(
                f"unknown observation {self.observation!r}; choose one of {', '.join(OBSERVATIONS)}"
            )
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


@torch.no_grad()
def _val_loss(net: Inverter, obs: torch.Tensor, labels: torch.Tensor, batch: int) -> float:
    """Mean token cross-entropy over the validation rows, in batches (logits rows are wide)."""
    total, count = 0.0, 0
    for start in range(0, len(obs), 4 * batch):
        lab = labels[start : start + 4 * batch]
        n = int((lab != -100).sum())
        total += float(net(obs[start : start + 4 * batch], lab)) * n
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
    "lengths",
    "per_length",
    "output_tokens",
    "val_fraction",
    "shape",
    "seed",
    "observation",
    "mlp_hidden",
    "pieces",
)


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
    from sodaray.config.capacity import check_context

    check_context(model, max(cfg.lengths), cfg.output_tokens)
    state_path = out / "state.json"
    torch.manual_seed(cfg.seed)
    logits = cfg.observation == "logits"
    inputs, cont, seen = build_pairs(
        model, list(cfg.lengths), cfg.per_length, cfg.output_tokens, cfg.seed, keep_logits=logits
    )
    obs = seen if logits else cont  # what the encoder reads, row by row
    assert obs is not None
    meta = InverterMeta(
        model.vocab_size,
        cfg.output_tokens,
        cfg.shape,
        "random (T5-Small-shaped config, no hub)",
        observation=cfg.observation,
        pieces=cfg.pieces,
        mlp_hidden=cfg.mlp_hidden if logits else 0,
        unigram_beta=cfg.unigram_beta,
    )
    perm = torch.randperm(len(inputs), generator=torch.Generator().manual_seed(cfg.seed))
    n_val = max(1, int(len(inputs) * cfg.val_fraction))
    val_idx, train_idx = perm[:n_val], perm[n_val:]
    labels = encode_targets(inputs, meta.pad_id, meta.eos_id)
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
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / max(1, cfg.warmup_steps))
    )
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
        row = {
            "epoch": epoch + 1,
            "train_loss": total / len(train_idx),
            "val_loss": val_loss,
            "val_exact": exact,
            "seconds": state["seconds"],
        }
        state["history"].append(row)
        log.info(
            "epoch %d train %.4f val %.4f exact %.3f", epoch + 1, row["train_loss"], val_loss, exact
        )
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
        tensors[f"{i}.exp_avg"] = st["exp_avg"].contiguous()
        tensors[f"{i}.exp_avg_sq"] = st["exp_avg_sq"].contiguous()
        state["adam_step"] = float(st["step"])
    state["sched_step"] = sched.last_epoch
    write_file(path.parent, path, save(tensors))


def _load_optim(opt, sched, path: Path, state: dict) -> None:
    tensors = load_file(str(path))
    sd = opt.state_dict()
    params = sd["param_groups"][0]["params"]
    for i, p in enumerate(params):
        if f"{i}.exp_avg" in tensors:
            sd["state"][p] = {
                "step": torch.tensor(state["adam_step"]),
                "exp_avg": tensors[f"{i}.exp_avg"],
                "exp_avg_sq": tensors[f"{i}.exp_avg_sq"],
            }
    opt.load_state_dict(sd)
    sched.last_epoch = state["sched_step"]
    for g in opt.param_groups:
        g["lr"] = g["initial_lr"] * sched.lr_lambdas[0](sched.last_epoch)
