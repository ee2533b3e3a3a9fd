"""`sodaray report`: the paper's tables and figures from result files."""

from __future__ import annotations

import argparse
from pathlib import Path

from sodaray.cli import CliError
from sodaray.io import jsontext


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="regenerate the paper's tables and figures from result files",
        description="Tables (Markdown, LaTeX, CSV) and figures (PNG) from result Parquet files "
        "or folders; each table is generated wherever its rows are present.",
    )
    p.add_argument("results", nargs="+", help="result Parquet files or folders of them")
    p.add_argument("--out", default="report", help="output folder (default: ./report)")
    p.add_argument("--format", default="md,latex,csv", help="comma-separated: md, latex, csv")
    p.add_argument(
        "--embedding-model",
        help="sentence-embedding model folder for Cos. Sim. (default: all-MiniLM-L6-v2 from "
        "the local Hugging Face cache, skipped when absent)",
    )
    p.add_argument("--no-figures", action="store_true", help="tables only")
    p.add_argument(
        "--extrapolate",
        type=int,
        metavar="STEPS",
        help="also the budget tables and figure: exact against the step budget per model and "
        "length (Wilson intervals), extrapolated to STEPS (e.g. 100000, the paper's) by four "
        "fits with bootstrap intervals (seconds per group)",
    )
    p.add_argument("--json", action="store_true", help="what was written, as one JSON object")
    p.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from sodaray.config.validation import check_output_dir, split_list
    from sodaray.report import build_report

    if not args.format.replace(",", "").strip():
        raise CliError(f"--format names no format ({args.format!r}); give md, latex and/or csv")
    formats = split_list(args.format, "--format", "md,csv")  # `md,,csv` as --tokens 1,,2
    check_output_dir(args.out)
    model = args.embedding_model
    if model is not None and model.startswith(("/", ".", "~")):
        from sodaray.io.files import what_is

        kind = what_is(Path(model).expanduser())
        if kind is None:
            raise CliError(f"--embedding-model {model}: no such model folder")
        if kind != "a directory":
            raise CliError(f"--embedding-model {model} is {kind}, not a model folder")
    report = build_report(
        args.results,
        args.out,
        formats=formats,
        embedding_model=model,
        figures=not args.no_figures,
        extrapolate=args.extrapolate,
    )
    if args.json:
        summary = {
            "rows": report.rows,
            "tables": [t.name for t in report.tables],
            "files": [str(f) for f in report.files],
            "skipped": {s.name: s.reason for s in report.skipped},
            "notes": list(report.notes),
            "captions": dict(report.captions),
        }
        print(jsontext.dumps(summary))
        return 0
    lines = [f"{report.rows} result rows -> {len(report.tables)} tables in {args.out}"]
    lines += [f"  {path}" for path in report.files]
    lines += [f"  skipped {skipped.name}: {skipped.reason}" for skipped in report.skipped]
    print("\n".join(lines + [f"  note: {note}" for note in report.notes]))
    return 0
