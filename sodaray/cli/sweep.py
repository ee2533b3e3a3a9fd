"""`sodaray sweep run|plan|status`: the command-line face of the runner."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys

from sodaray.costs.flops import format_duration
from sodaray.errors import first_line, shown
from sodaray.io import jsontext

log = logging.getLogger(__name__)

WAIT_HELP = (
    "on a cluster, seconds to wait while none of a model's replicas can be placed (nodes an "
    "autoscaler adds, resources other work holds); default 0: a model no node can hold stops "
    "the run at once, and one waiting for room stops it after 30 s"
)
OVERRIDE_HELP = (
    "KEY=VALUE overrides of the file's fields, in the file's own names (max_steps=500, "
    "models.qwen.bos=true, algorithms.soda.grid.temperature=[0.07]); validated as the file"
)
COSTS_HELP = (
    "measured step costs: a costs file (YAML, as `benchmarks/bench_invert.py --suite gpu "
    "--out FILE` writes it; kind gpu prices the GPU jobs, kind cpu the CPU jobs) or a "
    "built-in device (h100: measured on an H100; h200: measured on an H200)"
)


def add_mlflow_options(p: argparse.ArgumentParser, parent: str, child: str, when: str) -> None:
    """`--mlflow` and `--mlflow-experiment` of a command logging a `parent` run (`sweep`,
    `study`) with a `child` run each; `when`: when it logs them, or empty."""
    p.add_argument(
        "--mlflow",
        metavar="URI",
        help=f"log the {parent} (a parent run) and each {child} (a child run) to this MLflow "
        f"tracking URI{when} (sqlite:///mlflow.db, http://HOST:5000; needs pip install "
        "'sodaray[mlflow]'; see them with `mlflow ui --backend-store-uri URI`)",
    )
    parents = {"study": "studies"}.get(parent, f"{parent}s")
    p.add_argument(
        "--mlflow-experiment",
        metavar="NAME",
        help=f"the MLflow experiment (default: the {parent}'s name); give several {parents} one "
        "to compare them in one table",
    )


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="run a sweep file on Ray; show a results folder's status")
    cmds = p.add_subparsers(dest="sweep_command", required=True, parser_class=type(p))
    run = cmds.add_parser(
        "run",
        help="run every shard of a sweep that has no result file yet",
        description="Run a sweep on Ray: locally without --address (the embedded default), "
        "on a cluster with --address auto or ADDR. Rerunning resumes: finished shards are "
        "skipped.",
        epilog="Progress (stderr; on a terminal): a bar per job: sample-steps taken / the most "
        "they can take (each sample's whole budget at each length it may try; found samples "
        "stop early, so the total shrinks), time so far, sample-steps per second over the last "
        "30 s, the most time left at that rate, samples finished and found. Above the bars, "
        "the batch occupancy: the share of the batch slots that held a search, over the last "
        "10 s and overall ('no step yet' while the replicas load their model). In a log: a "
        "line per finished shard, and one per running job each minute. The README's 'Progress "
        "lines' explains each number.",
    )
    run.add_argument("sweep", help="sweep YAML file")
    run.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help=OVERRIDE_HELP)
    run.add_argument("--out", default="results", help="results folder (default: ./results)")
    run.add_argument(
        "--address",
        help="Ray cluster address: auto, or HOST:PORT, or ray://... (default: RAY_ADDRESS if "
        "set, else a fresh local Ray for this run)",
    )
    run.add_argument("--wait-for-nodes", type=float, default=0.0, metavar="SECONDS", help=WAIT_HELP)
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
        "--keep-every",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="write a running shard's ended searches at most this often (0: as each ends), so "
        "a run stopped mid-shard loses only the searches still running (default 30)",
    )
    run.add_argument(
        "--json", action="store_true", help="the run's outcome as one JSON object on stdout"
    )
    add_mlflow_options(run, "sweep", "job", " when the run ends")
    run.add_argument(
        "--costs",
        metavar="FILE_OR_DEVICE",
        help=f"{COSTS_HELP}: the run's wall is compared with the plan's (default: h100 for the "
        "GPU jobs; CPU jobs only with a CPU costs file)",
    )
    run.set_defaults(func=cmd_sweep_run)
    plan = cmds.add_parser(
        "plan",
        help="jobs, samples, the most sample-steps and the time a sweep can take",
        description="Before anything runs: every job's samples, step budget and most "
        "sample-steps (searches stop found samples early, so this is an upper bound), and its "
        "time: GPU jobs from measured step costs (a floor per pass, a rate for the samples' "
        "FLOPs; --costs), CPU jobs at a rate (sample-steps per second per replica) given with "
        "--rate or measured by a short calibration on this machine.",
    )
    plan.add_argument("sweep", help="sweep YAML file")
    plan.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help=OVERRIDE_HELP)
    plan.add_argument(
        "--rate", type=float, help="sample-steps per second per replica, every job (no costs)"
    )
    plan.add_argument(
        "--no-calibrate", action="store_true", help="no rate: counts only, no time estimate"
    )
    plan.add_argument("--limit", type=int, help="as `sweep run --limit`")
    plan.add_argument("--max-steps", type=int, help="as `sweep run --max-steps`")
    plan.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    plan.add_argument("--model", help="as `sweep run --model`")
    plan.add_argument(
        "--costs", metavar="FILE_OR_DEVICE", default="h100", help=f"{COSTS_HELP} (default h100)"
    )
    plan.add_argument("--json", action="store_true", help="the plan as one JSON object")
    plan.set_defaults(func=cmd_sweep_plan)
    status = cmds.add_parser("status", help="done / pending / failed shards per job")
    status.add_argument("out", help="results folder (or one sweep's folder in it)")
    status.add_argument("--json", action="store_true", help="one JSON object per job")
    status.set_defaults(func=cmd_sweep_status)


def cmd_sweep_run(args: argparse.Namespace) -> int:
    from sodaray.cli.progress import SweepProgress
    from sodaray.config.validation import check_output_dir
    from sodaray.costs.devices import load_costs
    from sodaray.experiment import stops
    from sodaray.experiment.cluster import Cluster
    from sodaray.runner import SweepInterrupted, load_sweep, run_sweep, sweep_status

    # A bad --max-attempts or --wait-for-nodes is one line before the sweep file loads.
    cluster = Cluster(args.address, args.max_attempts, args.wait_for_nodes)
    if not 0 <= args.keep_every <= 86_400:  # NaN too
        raise ValueError(f"--keep-every must be 0 to 86400 seconds, not {args.keep_every}")
    # Validated before Ray starts.
    sweep = _quick(load_sweep(args.sweep, model=args.model, overrides=args.overrides), args)
    check_output_dir(args.out)
    defaults = _family_defaults(sweep.jobs(limit=args.limit, model=args.model), args.json)
    track = None
    if args.mlflow is not None:  # the URI is checked before anything runs (an empty one too)
        from sodaray.cli.tracking.sweep import sweep_logger

        track = sweep_logger(sweep, args)
    progress = SweepProgress(sweep.name)
    planned: dict = {}
    on_start = _on_start(sweep.name, load_costs(args.costs or "h100"), planned, progress)
    folder = f"{args.out}/{sweep.name}"
    stopped = False
    try:
        run = run_sweep(
            sweep,
            args.out,
            cluster=cluster,
            limit=args.limit,
            model=args.model,
            keep_every=args.keep_every,
            on_start=on_start,
            on_shard=progress.shard,
            on_progress=progress.job,
        )
    except SweepInterrupted as stop:
        run, stopped = stop.run, True
    progress.close()
    if track is not None:
        track(folder)
    if stopped:  # what the run kept is logged; the stop's exit code (130, 143 or 129)
        print(
            f"interrupted: {len(run.done)} shards finished in this run are kept, and the "
            "searches that ended in unfinished shards; run the same command again to continue",
            file=sys.stderr,
        )
        return stops.exit_code()
    jobs = sweep_status(folder)
    # Work left undone is not success: a failed shard, or a job another driver holds (its
    # shards are not done when this run ends; exit 0 read as "complete" to a script).
    incomplete = 1 if run.failed or run.locked else 0
    check = None
    if planned and run.done:
        from sodaray.runner.plan import check_run

        check = check_run(planned, run)
    if args.json:
        summary = {  # what ran, what was skipped or failed, and every job's status
            "sweep": sweep.name,
            "jobs": run.jobs,
            "shards_total": run.shards_total,
            "shards_run": len(run.done),
            "shards_skipped": run.shards_skipped,
            "samples_kept": run.kept,
            "seconds": round(run.seconds, 3),
            "occupancy": run.occupancy,
            "failed": [dataclasses.asdict(f) for f in run.failed],
            "locked": run.locked,
            "lock_owners": run.lock_owners,
            "status": [_job(j) for j in jobs],
            "plan": check,
            "defaults": defaults,
        }
        print(jsontext.dumps(summary))
        return incomplete
    _print_status(jobs)
    occupancy = run.occupancy
    busy = "" if occupancy is None else f", mean batch occupancy {100 * occupancy:.0f}%"
    print(f"{len(run.done)} shards run in {run.seconds:.0f}s, {run.shards_skipped} skipped{busy}")
    if check is not None and check["planned_seconds"] > 0:
        print(_plan_line(check))
    for failure in run.failed:
        print(
            f"FAILED {failure.job} shard {failure.shard} after {failure.attempts} tries: "
            f"{failure.error}"
        )
    for name in run.locked:
        print(
            f"NOT RUN {name}: another driver holds its lock ({run.lock_owners.get(name, '?')}); "
            "run the command again once it ends"
        )
    return incomplete


def _on_start(name: str, costs, planned: dict, progress):
    """`run_sweep`'s `on_start`: the jobs with work to do priced into `planned` (by the costs, no
    calibration) to hold the run's wall against; what the run will do, skips or set aside said
    on stderr; the bars started."""

    def on_start(run, samples: int) -> None:
        from sodaray.runner.plan import plan_sweep

        try:
            planned.update(
                plan_sweep(run.pending_jobs, rate=None, measure=False, costs=costs, say=log.info)
            )
        except Exception as exc:  # a price is a by-product: the run goes on without it
            log.warning("no plan to hold the run against: %s", first_line(exc))
        lines = [
            f"sweep {name}: {run.jobs} jobs, {run.shards_total} shards "
            f"({run.shards_skipped} already done), {samples} samples to run"
        ]
        lines += [
            f"  skipped {job}: another driver is running it ({run.lock_owners.get(job, '?')})"
            for job in run.locked
        ]
        lines += [f"  {job}: file was invalid, set aside; recomputing" for job in run.corrupt]
        if run.kept:
            lines.append(f"  {run.kept} samples of unfinished shards ended in an earlier run: kept")
        print("\n".join(lines), file=sys.stderr)
        progress.start(run, bars=bool(samples) and sys.stderr.isatty())

    return on_start


def _plan_line(check: dict) -> str:
    """The run against its plan, in one line (`plan.check_run`)."""
    searching = check["searching_seconds"] or 0.0
    startup = check.get("planned_startup_seconds") or 0.0
    counted = f" ({startup:.1f} s of it start-up)" if startup else ""
    line = (
        f"plan ({shown(', '.join(check['priced_by']))} costs): "
        f"{check['planned_seconds']:.1f} s at most "
        f"for these samples{counted}, {check['as_run_seconds']:.1f} s of search for the steps "
        "they took; measured "
        f"{check['wall_seconds']:.1f} s wall, {searching:.1f} s searching (after "
        f"{check['wall_seconds'] - searching:.1f} s of start-up): searching/plan "
        f"{check['searching_over_planned']:.2f}, wall/plan {check['wall_over_planned']:.2f}"
    )
    if check["unpriced_jobs"]:
        line += f" ({len(check['unpriced_jobs'])} jobs not priced: CPU jobs need a CPU --costs)"
    return line


def _family_defaults(jobs, as_json: bool) -> dict[str, dict]:
    """The family defaults each model entry without a preset got, by label; without --json said
    on stdout (stderr keeps an error to one line)."""
    defaults = {j.model.label: j.defaults.to_dict() for j in jobs if j.defaults is not None}
    if not as_json:
        for label, chosen in defaults.items():
            print(f"model {label}: {chosen['why']}", flush=True)
    return defaults


def _job(status) -> dict:
    """A job's status as JSON holds it."""
    return {**dataclasses.asdict(status), "pending": status.pending}


def _quick(sweep, args: argparse.Namespace):
    """A quick look (`--max-steps` / `--limit`) as its own sweep, NAME-quick, so its results,
    status and report never mix with the full run's."""
    if args.steps is not None:
        raise ValueError("--steps is now --max-steps (the step budget has one name)")
    for name, value in (("--max-steps", args.max_steps), ("--limit", args.limit)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be at least 1, not {value}")
    return sweep if args.max_steps is None and args.limit is None else sweep.quick(args.max_steps)


def cmd_sweep_plan(args: argparse.Namespace) -> int:
    from sodaray.costs.devices import load_costs
    from sodaray.costs.flops import check_rate
    from sodaray.runner import load_sweep
    from sodaray.runner.plan import check_jobs_fit, plan_sweep

    check_rate(args.rate)
    if args.rate is not None and args.no_calibrate:
        # --no-calibrate is "no rate, counts only": with a rate given, one of the two is ignored.
        raise ValueError(
            "--rate and --no-calibrate contradict: --rate prices every job, --no-calibrate "
            "prices none; give one"
        )
    costs = load_costs(args.costs)
    sweep = _quick(load_sweep(args.sweep, model=args.model, overrides=args.overrides), args)
    jobs = sweep.jobs(limit=args.limit, model=args.model)
    check_jobs_fit(jobs, sweep.path)  # inputs beyond a model's context: refused, as `run` does
    defaults = _family_defaults(jobs, args.json)
    say = (lambda line: print(line, file=sys.stderr)) if args.json else print
    plan = plan_sweep(jobs, rate=args.rate, measure=not args.no_calibrate, costs=costs, say=say)
    if args.json:
        print(jsontext.dumps({"sweep": sweep.name, **plan, "defaults": defaults}))
        return 0
    rows, width = plan["jobs"], max(len(shown(r["job"])) for r in plan["jobs"])
    print(f"sweep {sweep.name}: {len(rows)} jobs")
    for line in priced_lines(plan["costs"], {r["kind"] for r in rows}, "jobs"):
        print(line)
    print(
        f"{'job':<{width}}  samples  max steps  max sample-steps    PFLOPs  priced by    "
        "rate/s  device-h  est. wall"
    )
    for r in rows:
        pf = "-" if r["flops"] is None else f"{r['flops'] / 1e15:,.1f}"
        hours = "-" if r["device_seconds"] is None else f"{r['device_seconds'] / 3600:,.2f}"
        rate = "-" if r["rate"] is None else f"{r['rate']:,.0f}"
        print(
            f"{shown(r['job']):<{width}}  {r['samples']:>7,}  {r['max_steps']:>9,}  "
            f"{r['sample_steps']:>16,}  {pf:>8}  {shown(r['priced_by']):<11}  {rate:>6}  "
            f"{hours:>8}  {r['estimate']}"
        )
    t = plan["total"]
    print(f"total: {t['samples']:,} samples, at most {t['sample_steps']:,} sample-steps")
    startup = "start-up not counted"
    if t.get("startup_seconds"):
        startup = f"{t['startup_seconds']:.0f} s of start-up counted, once per model"
    wall = f"jobs one after another, each job's shards across its replicas; {startup}"
    for line in estimate_lines(t, wall):
        print(line)
    if t["unpriced"]:
        print(
            f"{t['unpriced']} jobs without a price: pass --rate SAMPLE_STEPS_PER_SECOND "
            "(or --costs FILE for CPU jobs, measured by bench_invert.py --suite gpu --device cpu)"
        )
    return 0


def priced_lines(costs: dict, kinds: set[str], what: str) -> list[str]:
    """Which costs priced a plan's `kinds` of work (`experiment.estimate.describe_tables`)."""
    return [
        f"{name} {what} priced by {shown(costs[kind]['device'])} costs: "
        f"{shown(costs[kind]['source'])}"
        for kind, name in (("gpu", "GPU"), ("cpu", "CPU"))
        if kind in kinds and kind in costs
    ]


def estimate_lines(total: dict, wall: str) -> list[str]:
    """A plan's time (`experiment.estimate.Totals`), as `sweep plan` and `tune --dry-run` print
    it: GPU- and CPU-hours over every replica, and the wall (`wall`: how it adds up)."""
    lines = [
        f"estimate: {total[f'{kind}_hours']:,.2f} {kind.upper()}-hours (every sample running "
        "its full budget; a replica sharing a GPU counted as if alone)"
        for kind in ("gpu", "cpu")
        if total[f"{kind}_hours"]
    ]
    if total["wall_seconds"]:
        lines.append(f"estimate: {format_duration(total['wall_seconds'])} of wall ({wall})")
    return lines


def cmd_sweep_status(args: argparse.Namespace) -> int:
    from sodaray.runner import sweep_status

    jobs = sweep_status(args.out)
    if not jobs:
        raise ValueError(f"no sweep jobs (.sodaray/jobs/*/job.json) under {args.out}")
    if args.json:  # JSON Lines: one job a line, for jq and scripts
        print("\n".join(jsontext.dumps(_job(j)) for j in jobs))
    else:
        _print_status(jobs)
    return 0


def _print_status(jobs) -> None:
    width = max(len(shown(j.job)) for j in jobs) if jobs else 10
    print(f"{'job':<{width}}  done  pending  failed  samples  found  exact")
    for j in jobs:
        rate = f"{100 * j.exact / j.samples_done:.1f}%" if j.samples_done else "-"
        print(
            f"{shown(j.job):<{width}}  {j.done:>4}  {j.pending:>7}  {j.failed:>6}  "
            f"{j.samples_done:>7}  {j.found:>5}  {j.exact:>5} ({rate})"
        )
    for j in jobs:
        if j.kept:
            print(
                f"{shown(j.job)}: {j.kept} samples of unfinished shards kept; the next run "
                "keeps them"
            )
