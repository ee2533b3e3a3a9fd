"""`sodaray data build`: evaluation datasets of token sequences for a model's tokenizer."""

from __future__ import annotations

import argparse

from sodaray.cli import CliError, Parser
from sodaray.io import jsontext


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "data",
        help="build evaluation datasets",
        description="Evaluation datasets of token sequences for one model's tokenizer.",
    )
    data_sub = p.add_subparsers(dest="data_command", required=True, parser_class=Parser)
    b = data_sub.add_parser(
        "build",
        help="build a dataset as Parquet",
        description="Build a dataset of token sequences (random, nl-id, nl-ood or privacy) for "
        "a model's tokenizer; only the tokenizer and config are loaded, never the weights. "
        "Seed 1 is the test set, seed 0 the validation set used for tuning.",
    )
    b.add_argument("--model", required=True, help="hub id, local folder, or .gguf file")
    b.add_argument("--gguf-file", help="GGUF file name inside the --model folder")
    b.add_argument("--dataset", required=True, help="random, nl-id, nl-ood or privacy")
    b.add_argument("--lengths", help="token lengths: A-B, N or 1,3,5 (default 1-10; privacy 15-24)")
    b.add_argument("--per-length", type=int, help="samples per length (default 1000; privacy 500)")
    b.add_argument("--seed", type=int, default=1, help="1: test set (default), 0: validation")
    b.add_argument(
        "--source",
        help="hf (the Hugging Face hub, default), synthetic (privacy), or a local "
        "JSONL/CSV/text file",
    )
    b.add_argument(
        "--vocab",
        choices=["tokenizer", "model"],
        help="random ids over len(tokenizer) (default, as the authors) or the config's padded "
        "vocab_size",
    )
    b.add_argument(
        "--records",
        choices=["whole", "prefix"],
        help="privacy: records whose whole text has the length (default, as the authors) or "
        "prefixes of longer records",
    )
    b.add_argument("--out", required=True, help="output Parquet file")
    b.add_argument("--json", action="store_true", help="what was written, as one JSON object")
    b.set_defaults(func=cmd_data_build)


def cmd_data_build(args: argparse.Namespace) -> int:
    from sodaray.config.validation import check_output_file
    from sodaray.data.build import DATASETS, build_dataset, parse_lengths
    from sodaray.data.store import dataset_hash, dataset_metadata, write_dataset

    lengths = parse_lengths(args.lengths) if args.lengths is not None else None
    if args.per_length is not None and args.per_length < 1:
        raise CliError(f"--per-length must be at least 1, not {args.per_length}")
    # Flags only one kind of dataset reads, refused by name where another would ignore them
    # (an unknown dataset is refused as such by the build).
    if args.vocab is not None and args.dataset in DATASETS and args.dataset != "random":
        raise CliError(
            f"--vocab is for the random dataset (ids drawn at random), not {args.dataset}"
        )
    if args.records is not None and args.dataset in DATASETS and args.dataset != "privacy":
        raise CliError(f"--records is for the privacy dataset, not {args.dataset}")
    if not 0 <= args.seed < 2**63:  # as a sweep's seeds: numpy's generators take no more
        raise CliError(f"--seed must be in [0, 2**63), not {args.seed}")
    if not args.out.endswith(".parquet"):
        raise CliError(f"--out names a Parquet file ending in .parquet, not {args.out!r}")
    check_output_file(args.out)
    table = build_dataset(
        args.model,
        args.dataset,
        lengths=lengths,
        per_length=args.per_length,
        seed=args.seed,
        source=args.source,
        gguf_file=args.gguf_file,
        vocab=args.vocab or "tokenizer",
        records=args.records or "whole",
    )
    path = write_dataset(table, args.out)
    # Where the rows came from, as the file's metadata records it: a privacy build that could
    # not reach the hub is Faker text, not ai4privacy's records, and its numbers are not the
    # paper's; a caller reading only the JSON must see that.
    info = dataset_metadata(table)["info"]
    fallback = info.get("fallback")
    if args.json:
        lengths = table.column("length").to_pylist()
        summary = {
            "path": str(path),
            "rows": len(table),
            "by_length": {str(n): lengths.count(n) for n in sorted(set(lengths))},
            "sha256": dataset_hash(table),
            "source": info.get("source"),
            "fallback": fallback,  # None, or what was used instead of --source
            "documents_reused": info.get("documents_reused", 0),
        }
        print(jsontext.dumps(summary))
        return 0
    print(f"wrote {path}: {len(table)} rows, sha256 {dataset_hash(table)}")
    print(f"  source: {info.get('source')}")
    if fallback:
        print(f"  fallback: {fallback} (the source asked for could not be read; see the warning)")
    return 0
