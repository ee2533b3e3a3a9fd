"""`sodaray sweep run|status`: the command-line face of the runner."""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict


def add_sweep_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="run a sweep file on Ray; show a results folder's status")
    cmds = p.add_subparsers(dest="sweep_command", required=True, parser_class=type(p))
    run = cmds.add_parser(
        "run",
        help="run every shard of a sweep that has no result file yet",
        description="Run a sweep on Ray: locally without --address (the embedded default), "
        "on a cluster with --address auto or ADDR. Rerunning resumes: finished shards are "
        "skipped.",
    )
    run.add_argument("sweep", help="sweep YAML file")
    run.add_argument("--out", default="results", help="results folder (default: ./results)")
    run.add_argument("--address", help="Ray cluster address: auto, or HOST:PORT, or ray://...")
    run.add_argument("--limit", type=int, help="cap the samples per job (a quick look)")
    run.add_argument("--model", help="run the sweep's jobs on this model (hub id, folder, .gguf)")
    run.add_argument("--max-attempts", type=int, default=3, help="tries per shard (default 3)")
    run.set_defaults(func=cmd_sweep_run)
    status = cmds.add_parser("status", help="done / pending / failed shards per job")
    status.add_argument("out", help="results folder (or one sweep's folder in it)")
    status.add_argument("--json", action="store_true", help="one JSON object per job")
    status.set_defaults(func=cmd_sweep_status)


def cmd_sweep_run(args: argparse.Namespace) -> int:
    from sodaray.runner import SweepInterrupted, load_sweep, run_sweep, sweep_status

    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be at least 1, not {args.limit}")
    if args.max_attempts < 1:
        raise ValueError(f"--max-attempts must be at least 1, not {args.max_attempts}")
    sweep = load_sweep(args.sweep, model=args.model)  # validated before Ray starts
    from sodaray.validation import check_output_dir

    check_output_dir(args.out)
    bar = None
    counts: dict[str, int] = defaultdict(int)

    def on_start(run, samples: int) -> None:
        nonlocal bar
        print(
            f"sweep {sweep.name}: {run.jobs} jobs, {run.shards_total} shards "
            f"({run.shards_skipped} already done), {samples} samples to run",
            file=sys.stderr,
        )
        for name in run.locked:
            print(f"  skipped {name}: another driver is running it", file=sys.stderr)
        for name in run.corrupt:
            print(f"  {name}: shard file was invalid, set aside; recomputing", file=sys.stderr)
        if samples and sys.stderr.isatty():
            from tqdm import tqdm

            bar = tqdm(total=samples, unit="sample", desc=sweep.name, file=sys.stderr)

    def on_shard(done) -> None:
        counts["found"] += done.found
        counts["exact"] += done.exact
        counts["samples"] += done.samples
        if bar is not None:
            bar.update(done.samples)
            bar.set_postfix(found=counts["found"], exact=counts["exact"])
        else:
            print(
                f"  {done.job} shard {done.shard}: {done.samples} samples, {done.found} found, "
                f"{done.exact} exact ({done.seconds:.1f}s)",
                file=sys.stderr,
            )

    try:
        run = run_sweep(
            sweep,
            args.out,
            address=args.address,
            limit=args.limit,
            model=args.model,
            max_attempts=args.max_attempts,
            on_start=on_start,
            on_shard=on_shard,
        )
    except SweepInterrupted as stop:
        if bar is not None:
            bar.close()
        print(
            f"interrupted: {len(stop.run.done)} shards finished in this run are kept; "
            "run the same command again to continue",
            file=sys.stderr,
        )
        return 130
    if bar is not None:
        bar.close()
    _print_status(sweep_status(f"{args.out}/{sweep.name}"))
    print(f"{len(run.done)} shards run in {run.seconds:.0f}s, {run.shards_skipped} skipped")
    for failure in run.failed:
        print(
            f"FAILED {failure.job} shard {failure.shard} after {failure.attempts} tries: "
            f"{failure.error}"
        )
    return 1 if run.failed else 0


def cmd_sweep_status(args: argparse.Namespace) -> int:
    from sodaray.runner import sweep_status

    jobs = sweep_status(args.out)
    if not jobs:
        raise ValueError(f"no sweep jobs (job.json) under {args.out}")
    if args.json:
        import dataclasses
        import json

        for j in jobs:  # JSON Lines: one job a line, for jq and scripts
            print(json.dumps({**dataclasses.asdict(j), "pending": j.pending}))
        return 0
    _print_status(jobs)
    return 0


def _print_status(jobs) -> None:
    width = max(len(j.job) for j in jobs) if jobs else 10
    print(f"{'job':<{width}}  done  pending  failed  samples  found  exact")
    for j in jobs:
        rate = f"{100 * j.exact / j.samples_done:.1f}%" if j.samples_done else "-"
        print(
            f"{j.job:<{width}}  {j.done:>4}  {j.pending:>7}  {j.failed:>6}  {j.samples_done:>7}  "
            f"{j.found:>5}  {j.exact:>5} ({rate})"
        )
