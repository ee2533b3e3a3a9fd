"""`sodaray train-inverter`: train the learned inversion baseline on a model's own outputs."""

from __future__ import annotations

import argparse
import json
import logging


def add_train_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train-inverter",
        help="train a T5 inverter on a model's own outputs (the learned baseline)",
        description="Train a T5 encoder-decoder (T5-Small-shaped config, random init) to map "
        "a model's greedy continuation back to its Random input; resumes from OUT/last.",
    )
    p.add_argument("--model", required=True, help="hub id or local folder of the target model")
    p.add_argument("--out", required=True, help="checkpoint folder (best/ and last/ inside)")
    p.add_argument("--lengths", default="1-5", help="input lengths, e.g. 1-5 or 1,2,3")
    p.add_argument("--per-length", type=int, default=2000, help="Random samples per length")
    p.add_argument("--output-tokens", type=int, default=10, help="observed tokens per sample")
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=160)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--warmup-steps", type=int, default=1000)
    p.add_argument("--shape", default="small", help="small (T5-Small), mini or tiny")
    p.add_argument("--max-seconds", type=float, help="stop after the epoch crossing this")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.set_defaults(func=cmd_train_inverter)


def cmd_train_inverter(args: argparse.Namespace) -> int:
    from sodaray.data.build import parse_lengths
    from sodaray.inverter.train import TrainConfig, train_inverter
    from sodaray.models import load_model

    cfg = TrainConfig(
        lengths=tuple(parse_lengths(args.lengths)),
        per_length=args.per_length,
        output_tokens=args.output_tokens,
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        weight_decay=args.weight_decay,
        warmup_steps=args.warmup_steps,
        shape=args.shape,
        seed=args.seed,
        max_seconds=args.max_seconds,
    )
    logging.info("loading %s", args.model)
    model = load_model(args.model, device=args.device)
    state = train_inverter(model, cfg, args.out)
    print(json.dumps(state["history"][-1] if state["history"] else {}))
    return 0
