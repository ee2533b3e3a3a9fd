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
    run.add_argument(
        "--max-steps",
        type=int,
        help="cap every step budget (a quick look: results in NAME-quick)",
    )
    run.add_argument("--steps", type=int, help=argparse.SUPPRESS)  # renamed: refused by name
    run.add_argument("--max-attempts", type=int, default=3, help="tries per shard (default 3)")
    run.set_defaults(func=cmd_sweep_run)
    plan = cmds.add_parser(
        "plan",
        help="jobs, samples, the most sample-steps and the time a sweep can take",
        description="Before anything runs: every job's samples, step budget and most "
        "sample-steps (searches stop found samples early, so this is an upper bound), and "
        "device-hours at a rate (sample-steps per second per device) given with --rate or "
        "measured by a short calibration on this machine.",
    )
    plan.add_argument("sweep", help="sweep YAML file")
    plan.add_argument("--rate", type=float, help="sample-steps per second (skips calibration)")
    plan.add_argument(
        "--no-calibrate", action="store_true", help="no rate: counts only, no time estimate"
    )
    plan.add_argument("--limit", type=int, help="as `sweep run --limit`")
    plan.add_argument("--max-steps", type=int, help="as `sweep run --max-steps`")
    plan.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    plan.add_argument("--model", help="as `sweep run --model`")
    plan.set_defaults(func=cmd_sweep_plan)
    status = cmds.add_parser("status", help="done / pending / failed shards per job")
    status.add_argument("out", help="results folder (or one sweep's folder in it)")
    status.add_argument("--json", action="store_true", help="one JSON object per job")
    status.set_defaults(func=cmd_sweep_status)


def cmd_sweep_run(args: argparse.Namespace) -> int:
    from sodaray.runner import SweepInterrupted, load_sweep, run_sweep, sweep_status

    if args.max_attempts < 1:
        raise ValueError(f"--max-attempts must be at least 1, not {args.max_attempts}")
    sweep = load_sweep(args.sweep, model=args.model)  # validated before Ray starts
    sweep = _quick(sweep, args, args.limit)
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


def _quick(sweep, args: argparse.Namespace, limit: int | None):
    """A quick look (`--max-steps` / `--limit`) as its own sweep, NAME-quick, so its results,
    status and report never mix with the full run's."""
    if args.steps is not None:
        raise ValueError("--steps is now --max-steps (the step budget has one name)")
    steps = args.max_steps
    if steps is not None and steps < 1:
        raise ValueError(f"--max-steps must be at least 1, not {steps}")
    if limit is not None and limit < 1:
        raise ValueError(f"--limit must be at least 1, not {limit}")
    if steps is None and limit is None:
        return sweep
    return sweep.quick(steps)


def cmd_sweep_plan(args: argparse.Namespace) -> int:
    from sodaray.runner import load_sweep
    from sodaray.runner.plan import calibrate, format_duration, job_cost

    if args.rate is not None and not args.rate > 0:
        raise ValueError(f"--rate must be a positive number, not {args.rate}")
    sweep = _quick(load_sweep(args.sweep, model=args.model), args, args.limit)
    jobs = sweep.jobs(limit=args.limit, model=args.model)
    costs = [job_cost(job) for job in jobs]
    rates: dict[str, float | str] = {}
    width = max(len(c.job) for c in costs)
    print(f"sweep {sweep.name}: {len(jobs)} jobs")
    print(f"{'job':<{width}}  samples  max steps  max sample-steps  rate/s  est. time")
    totals = {"samples": 0, "sample_steps": 0, "gpu": 0.0, "cpu": 0.0}
    unknown = 0
    unloadable: set[str] = set()  # models that failed to load: not tried again per job
    for job, cost in zip(jobs, costs, strict=True):
        key = json_key(job, cost)
        if key not in rates:
            if args.rate is not None:
                rates[key] = args.rate
            elif args.no_calibrate or job.model.label in unloadable:
                rates[key] = "-"
            else:
                try:
                    rates[key] = calibrate(job, cost)
                except Exception as exc:  # a model not loadable here: say why, go on
                    print(f"  no calibration for {job.model.label}: {exc}".splitlines()[0])
                    unloadable.add(job.model.label)
                    rates[key] = "-"
        rate = rates[key]
        totals["samples"] += cost.samples
        totals["sample_steps"] += cost.sample_steps
        if isinstance(rate, float):
            seconds = cost.sample_steps / rate
            totals["gpu" if cost.num_gpus > 0 else "cpu"] += seconds / 3600
            est, shown = format_duration(seconds), f"{rate:,.0f}"
        else:
            unknown += 1
            est, shown = "-", "-"
        print(
            f"{cost.job:<{width}}  {cost.samples:>7,}  {cost.max_steps:>9,}  "
            f"{cost.sample_steps:>16,}  {shown:>6}  {est}"
        )
    print(f"total: {totals['samples']:,} samples, at most {totals['sample_steps']:,} sample-steps")
    if totals["gpu"]:
        print(f"estimate: {totals['gpu']:,.1f} GPU-hours (one device per job at a time)")
    if totals["cpu"]:
        print(f"estimate: {totals['cpu']:,.2f} CPU-hours (num_gpus 0 jobs)")
    if unknown:
        print(f"{unknown} jobs without a rate: pass --rate SAMPLE_STEPS_PER_SECOND")
    return 0


def json_key(job, cost) -> str:
    """Jobs that cost the same per sample-step share one calibration."""
    import json

    obj = job.objective
    return json.dumps(
        [
            job.model.identity(),
            job.algorithm,
            obj.kind,
            obj.output_tokens,
            bool(obj.fluency_weight),
            cost.batch_size,
            sorted(cost.samples_by_length),
        ],
        default=str,
    )


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
