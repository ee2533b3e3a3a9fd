"""`sodaray train-inverter`: train the learned inversion baseline on a model's own outputs."""

from __future__ import annotations

import argparse
import logging
import math
import os

from sodaray.io import jsontext


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train-inverter",
        help="train a T5 inverter on a model's own outputs (the learned baseline)",
        description="Train a T5 encoder-decoder (T5-Small-shaped config, random init) to map "
        "a model's greedy continuation (--observation text) or its observed logits "
        "(--observation logits) back to its Random input; resumes from OUT/last.",
    )
    p.add_argument("--model", required=True, help="hub id or local folder of the target model")
    p.add_argument("--out", required=True, help="checkpoint folder (best/ and last/ inside)")
    p.add_argument("--lengths", default="1-5", help="input lengths, e.g. 1-5 or 1,2,3")
    p.add_argument("--per-length", type=int, default=2000, help="Random samples per length")
    p.add_argument(
        "--observation",
        choices=["text", "logits"],
        default="text",
        help="what the inverter reads: the observed tokens (text objective) or the observed "
        "logits (logits objective; unigram-adapted, 64 slices through an MLP)",
    )
    p.add_argument(
        "--output-tokens",
        type=int,
        help="observed positions per sample (default: 10 for text, 1 for logits)",
    )
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch-size", type=int, help="default: 160 for text, 80 for logits")
    p.add_argument("--lr", type=float, help="default: 1e-3 for text, 2e-4 for logits")
    p.add_argument("--weight-decay", type=float, help="default: 0.05 text, 0.025 logits")
    p.add_argument(
        "--mlp-hidden",
        type=int,
        help="logits: hidden width of the slice MLP (default 1024; the paper's 32768 is for a GPU)",
    )
    p.add_argument("--warmup-steps", type=int, default=1000)
    p.add_argument("--shape", default="small", help="small (T5-Small), mini, micro or tiny")
    p.add_argument("--max-seconds", type=float, help="stop after the epoch crossing this")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--threads",
        type=int,
        help="torch CPU threads (1 is often fastest on a busy machine; default: torch's)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="the run's outcome as one JSON object (checkpoints, epochs, best and last epoch, "
        "history) instead of a line per epoch",
    )
    p.set_defaults(func=cmd_train_inverter)


MLP_HIDDEN = 1024  # --mlp-hidden when not given


def check_threads(threads: int | None) -> None:
    """`--threads`, before torch hands it to its OpenMP pool (100,000,000 threads, each with its
    own stack, ended the process in a segmentation fault): at least 1, at most four per CPU this
    process may run on and never fewer than 256 (room for a count sane on another node, or in a
    container that shows fewer CPUs than it runs on)."""
    if threads is None:
        return
    if threads < 1:
        raise ValueError(f"--threads must be at least 1, not {threads}")
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity on macOS and Windows
        cpus = os.cpu_count() or 1
    if threads > max(256, 4 * cpus):
        raise ValueError(
            f"--threads {threads} is more than this machine can run: at most "
            f"{max(256, 4 * cpus)} (four per CPU, at least 256)"
        )


def cmd_train_inverter(args: argparse.Namespace) -> int:
    from pathlib import Path

    from sodaray.config.capacity import check_context, check_device
    from sodaray.data.build import parse_lengths
    from sodaray.inverter.train import PAPER_DEFAULTS, TrainConfig, check_resumable, train_inverter
    from sodaray.io.files import check_model_files
    from sodaray.model.load import load_model

    if args.mlp_hidden is not None and args.observation != "logits":
        raise ValueError(
            "--mlp-hidden sizes the logits encoder's MLP: it is for --observation logits"
        )
    check_device(args.device)  # `--device tpu`: one line, before anything loads
    paper = PAPER_DEFAULTS[args.observation]  # where these four flags are not given
    cfg = TrainConfig(
        lengths=tuple(parse_lengths(args.lengths)),
        per_length=args.per_length,
        output_tokens=paper["output_tokens"] if args.output_tokens is None else args.output_tokens,
        epochs=args.epochs,
        batch_size=paper["batch_size"] if args.batch_size is None else args.batch_size,
        lr=paper["lr"] if args.lr is None else args.lr,
        weight_decay=paper["weight_decay"] if args.weight_decay is None else args.weight_decay,
        warmup_steps=args.warmup_steps,
        shape=args.shape,
        seed=args.seed,
        max_seconds=args.max_seconds,
        observation=args.observation,
        mlp_hidden=MLP_HIDDEN if args.mlp_hidden is None else args.mlp_hidden,
    )
    cfg.validate()  # before the model loads: a bad value fails in a second, not a minute
    check_resumable(cfg, Path(args.out))
    check_threads(args.threads)
    check_model_files(os.path.expanduser(args.model))  # a FIFO, a folder without weights
    logging.info("loading %s", args.model)
    model = load_model(args.model, device=args.device)
    check_context(model, max(cfg.lengths), cfg.output_tokens)
    if args.threads is not None:  # only once every check passed: it is process-wide
        import torch

        torch.set_num_threads(args.threads)

    def show(row: dict) -> None:
        print(
            f"epoch {row['epoch']}/{cfg.epochs}: train loss {row['train_loss']:.4f}, val loss "
            f"{row['val_loss']:.4f}, val exact {row['val_exact']:.1%} ({row['seconds']:.0f} s)",
            flush=True,
        )

    state = train_inverter(model, cfg, args.out, None if args.json else show)
    summary = outcome(state, cfg.epochs, Path(args.out))
    best = summary["best_epoch"]
    if args.json:
        print(jsontext.dumps(summary))
    elif not summary["history"]:
        print(f"nothing trained: {args.out} holds no epoch")
    elif best is None:
        print(
            f"{summary['epochs_done']} of {cfg.epochs} epochs in {args.out}; no epoch had a "
            "finite validation loss (training diverged): no best checkpoint"
        )
    else:
        print(
            f"{summary['epochs_done']} of {cfg.epochs} epochs in {args.out}; best val loss "
            f"{best['val_loss']:.4f} (val exact {best['val_exact']:.1%}) at epoch "
            f"{best['epoch']}: {summary['best']}"
        )
    return 0


def outcome(state: dict, epochs: int, out) -> dict:
    """What `train-inverter --json` prints: where the checkpoints are, how far training got,
    the best epoch (by validation loss, the one `best/` holds) and every epoch's row."""
    history = state.get("history") or []
    # An epoch whose validation loss is not finite (diverged; null once read back from JSON)
    # is never best, and `best/` is written only for a finite one.
    finite = [r for r in history if isinstance(r.get("val_loss"), int | float)]
    ranked = [r for r in finite if math.isfinite(r["val_loss"])]
    best = min(ranked, key=lambda r: r["val_loss"]) if ranked else None
    return {
        "out": str(out),
        "best": str(out / "best") if best is not None else None,
        "last": str(out / "last") if history else None,
        "epochs_done": int(state.get("epoch", 0)),
        "epochs": epochs,
        "seconds": state.get("seconds", 0.0),
        "best_epoch": best,
        "last_epoch": history[-1] if history else None,
        "history": history,
    }
