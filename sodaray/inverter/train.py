"""Training the inverter: AdamW with linear warm-up then a constant rate (the paper's text
inverter settings by default), validation loss and exact rate per epoch, best-validation
checkpoint, resumable from the last epoch's checkpoint.

A plain torch loop rather than the HF Trainer: the Trainer's checkpoint format pickles optimiser
state, and this loop keeps resume on safetensors + a JSON state, with nothing to unpickle."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from sodaray.inverter.data import build_pairs, encode_targets
from sodaray.inverter.model import InverterMeta, build_model, load_inverter, save_inverter
from sodaray.models import LoadedModel

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

    def validate(self) -> None:
        from sodaray.inverter.model import SHAPES
        from sodaray.validation import check_fields_finite

        check_fields_finite(self)  # NaN passes every range check below
        if self.shape not in SHAPES:
            raise ValueError(
                f"unknown inverter shape {self.shape!r}; choose one of {', '.join(SHAPES)}"
            )
        if not self.lr > 0:
            raise ValueError(f"lr must be positive, not {self.lr}")
        if self.weight_decay < 0 or self.warmup_steps < 0:
            raise ValueError("weight_decay and warmup_steps must be non-negative")
        if self.max_seconds is not None and not self.max_seconds > 0:
            raise ValueError(f"max_seconds must be positive, not {self.max_seconds}")
        if not 0 < self.val_fraction < 1:
            raise ValueError(f"val_fraction must be in (0, 1), not {self.val_fraction}")
        for name in ("per_length", "output_tokens", "epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        if not self.lengths or min(self.lengths) < 1:
            raise ValueError("lengths must be positive")


def _exact_rate(net, enc: torch.Tensor, inputs: list[list[int]], meta: InverterMeta) -> float:
    pred = generate(net, enc, max(len(x) for x in inputs), meta)
    return sum(p[: len(x)] == x for p, x in zip(pred, inputs, strict=True)) / len(inputs)


@torch.no_grad()
def generate(net, enc: torch.Tensor, length: int, meta: InverterMeta) -> list[list[int]]:
    """Greedy decoding of `length` tokens, eos and pad masked out (the length is given)."""
    net.eval()
    out = net.generate(
        input_ids=enc,
        attention_mask=torch.ones_like(enc),
        max_new_tokens=length,
        min_new_tokens=length,
        do_sample=False,
        num_beams=1,
        bad_words_ids=[[meta.pad_id], [meta.eos_id]],
    )
    return [row[1 : length + 1] for row in out.tolist()]  # drop the decoder start token


# What the training pairs and the network depend on: a resume must not change them.
FIXED_ON_RESUME = ("lengths", "per_length", "output_tokens", "val_fraction", "shape", "seed")


def check_resumable(cfg: TrainConfig, out: Path) -> None:
    """A folder holding a run made with other data or shape settings is refused, by name."""
    path = out / "train_config.json"
    if not (out / "state.json").is_file() or not path.is_file():
        return
    before = json.loads(path.read_text())
    now = asdict(cfg)
    now["lengths"] = list(now["lengths"])
    for name in FIXED_ON_RESUME:
        if name in before and before[name] != now[name]:
            raise ValueError(
                f"{out} holds a run with {name}={before[name]!r}, not {now[name]!r}: "
                "resume with the same setting or choose another --out"
            )


def train_inverter(model: LoadedModel, cfg: TrainConfig, out: str | Path) -> dict:
    """Train (or resume) into `out`: `out/last` each epoch, `out/best` on a better val loss."""
    cfg.validate()
    out = Path(out)
    check_resumable(cfg, out)
    from sodaray.validation import check_context

    check_context(model, max(cfg.lengths), cfg.output_tokens)
    state_path = out / "state.json"
    torch.manual_seed(cfg.seed)
    inputs, cont = build_pairs(
        model, list(cfg.lengths), cfg.per_length, cfg.output_tokens, cfg.seed
    )
    meta = InverterMeta(
        model.vocab_size, cfg.output_tokens, cfg.shape, "random (T5-Small-shaped config, no hub)"
    )
    perm = torch.randperm(len(inputs), generator=torch.Generator().manual_seed(cfg.seed))
    n_val = max(1, int(len(inputs) * cfg.val_fraction))
    val_idx, train_idx = perm[:n_val], perm[n_val:]
    labels = encode_targets(inputs, meta.pad_id, meta.eos_id)
    val_inputs = [inputs[i] for i in val_idx.tolist()]

    state = {"epoch": 0, "best_val": float("inf"), "history": [], "seconds": 0.0}
    if state_path.is_file():
        state = json.loads(state_path.read_text())
        net, _ = load_inverter(out / "last")
        log.info("resuming from epoch %d", state["epoch"])
    else:
        net = build_model(model.vocab_size, cfg.shape)
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / max(1, cfg.warmup_steps))
    )
    if state_path.is_file() and (out / "optim.safetensors").is_file():
        _load_optim(opt, sched, out / "optim.safetensors", state)
    (out).mkdir(parents=True, exist_ok=True)
    (out / "train_config.json").write_text(json.dumps(asdict(cfg), indent=2))

    gen = torch.Generator().manual_seed(cfg.seed + state["epoch"])
    for epoch in range(state["epoch"], cfg.epochs):
        t0 = time.perf_counter()
        net.train()
        order = train_idx[torch.randperm(len(train_idx), generator=gen)]
        batches = range(0, len(order), cfg.batch_size)
        total = 0.0
        for start in tqdm(batches, desc=f"epoch {epoch + 1}/{cfg.epochs}", leave=False):
            idx = order[start : start + cfg.batch_size]
            loss = net(input_ids=cont[idx], labels=labels[idx]).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            total += float(loss.detach()) * len(idx)
        net.eval()
        with torch.no_grad():
            val_loss = float(net(input_ids=cont[val_idx], labels=labels[val_idx]).loss)
        exact = _exact_rate(net, cont[val_idx], val_inputs, meta)
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
        state_path.write_text(json.dumps(state, indent=2))
        if cfg.max_seconds is not None and state["seconds"] >= cfg.max_seconds:
            log.info("time budget reached after epoch %d", epoch + 1)
            break
    return state


def _save_optim(opt, sched, path: Path, state: dict) -> None:
    """AdamW moments as safetensors (no pickle); step counts go in the JSON state."""
    tensors = {}
    for i, st in enumerate(opt.state_dict()["state"].values()):
        tensors[f"{i}.exp_avg"] = st["exp_avg"].contiguous()
        tensors[f"{i}.exp_avg_sq"] = st["exp_avg_sq"].contiguous()
        state["adam_step"] = float(st["step"])
    state["sched_step"] = sched.last_epoch
    save_file(tensors, str(path))


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
