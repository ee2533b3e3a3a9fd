"""`sodaray sweep run|status`: the command-line face of the runner."""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from typing import Any


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
    run.add_argument(
        "--mlflow",
        metavar="URI",
        help="log each job's summary to this MLflow tracking URI when the run ends "
        "(sqlite:///mlflow.db, http://HOST:5000; needs pip install 'sodaray[mlflow]')",
    )
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
    track = None
    if args.mlflow:
        from sodaray.runner.tracking import sweep_logger

        track = sweep_logger(args.mlflow)  # the URI is checked before anything runs
    progress = _Progress(sweep.name)

    def on_start(run, samples: int) -> None:
        print(
            f"sweep {sweep.name}: {run.jobs} jobs, {run.shards_total} shards "
            f"({run.shards_skipped} already done), {samples} samples to run",
            file=sys.stderr,
        )
        for name in run.locked:
            print(f"  skipped {name}: another driver is running it", file=sys.stderr)
        for name in run.corrupt:
            print(f"  {name}: shard file was invalid, set aside; recomputing", file=sys.stderr)
        progress.start(run.job_samples, bars=bool(samples) and sys.stderr.isatty())

    try:
        run = run_sweep(
            sweep,
            args.out,
            address=args.address,
            limit=args.limit,
            model=args.model,
            max_attempts=args.max_attempts,
            on_start=on_start,
            on_shard=progress.shard,
        )
    except SweepInterrupted as stop:
        progress.close()
        if track is not None:
            track(sweep.name, f"{args.out}/{sweep.name}")
        print(
            f"interrupted: {len(stop.run.done)} shards finished in this run are kept; "
            "run the same command again to continue",
            file=sys.stderr,
        )
        return 130
    progress.close()
    if track is not None:
        track(sweep.name, f"{args.out}/{sweep.name}")
    _print_status(sweep_status(f"{args.out}/{sweep.name}"))
    occupancy = run.occupancy
    shown = "" if occupancy is None else f", mean batch occupancy {100 * occupancy:.0f}%"
    print(f"{len(run.done)} shards run in {run.seconds:.0f}s, {run.shards_skipped} skipped{shown}")
    for failure in run.failed:
        print(
            f"FAILED {failure.job} shard {failure.shard} after {failure.attempts} tries: "
            f"{failure.error}"
        )
    return 1 if run.failed else 0


class _Progress:
    """`sweep run`'s progress: on a terminal one bar per job (samples done / total, found so
    far, sample-steps/s) under a line with the batch occupancy; otherwise one line per shard.
    Bars move when a shard's file is written: streamed shards finish one by one."""

    def __init__(self, sweep: str) -> None:
        self.sweep = sweep
        self.bars: dict[str, Any] = {}
        self.status: Any = None
        self.found: dict[str, int] = defaultdict(int)
        self.sample_steps: dict[str, int] = defaultdict(int)
        self.done: list[Any] = []
        self.started = time.perf_counter()

    def start(self, job_samples: dict[str, int], bars: bool) -> None:
        self.started = time.perf_counter()
        if not bars:
            return
        from tqdm import tqdm

        self.status = tqdm(total=0, bar_format="{desc}", position=0, file=sys.stderr)
        self.status.set_description_str(f"{self.sweep}: batch occupancy -")
        width = max(len(job) for job in job_samples)
        for i, (job, total) in enumerate(job_samples.items(), start=1):
            self.bars[job] = tqdm(
                total=total, unit="sample", desc=f"{job:<{width}}", position=i, file=sys.stderr
            )

    def shard(self, done) -> None:
        from sodaray.runner.run import mean_occupancy

        self.done.append(done)
        self.found[done.job] += done.found
        self.sample_steps[done.job] += done.sample_steps
        rate = self.sample_steps[done.job] / max(time.perf_counter() - self.started, 1e-9)
        window = mean_occupancy([done])
        mean = mean_occupancy(self.done)
        now = "-" if window is None else f"{100 * window:.0f}%"
        overall = "-" if mean is None else f"{100 * mean:.0f}%"
        bar = self.bars.get(done.job)
        if bar is None:
            print(
                f"  {done.job} shard {done.shard}: {done.samples} samples, {done.found} found, "
                f"{done.exact} exact ({done.seconds:.1f}s; batch occupancy {now}, "
                f"mean {overall})",
                file=sys.stderr,
            )
            return
        bar.update(done.samples)
        bar.set_postfix_str(f"found {self.found[done.job]}, {rate:,.0f} sample-steps/s")
        self.status.set_description_str(
            f"{self.sweep}: batch occupancy {now} (since the last shard), mean {overall}"
        )

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()
        if self.status is not None:
            self.status.close()


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
    from sodaray.errors import first_line
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
                    print(f"  no calibration for {job.model.label}: {first_line(exc)}")
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
        raise ValueError(f"no sweep jobs (.sodaray/jobs/*/job.json) under {args.out}")
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
