"""`sodaray tune`: the command-line face of the tuner."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from sodaray.cli.sweep import COSTS_HELP, WAIT_HELP, add_mlflow_options
from sodaray.errors import shown
from sodaray.io import jsontext


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tune",
        help="tune an algorithm's parameters with Optuna, trials on Ray actors",
        description="Run (or resume: the same command again adds trials) an Optuna study from "
        "a tuning file. Writes OUT/<name>/: study.journal, trials/*.parquet, best_preset.yaml, "
        "plots/*.png.",
        epilog="Progress (stderr; on a terminal): a bar of trials, each running trial counted "
        "as its share of its most sample-steps (found samples stop early), the most time left "
        "at the rate of the last 30 s, the running trials (#number share), and the last trial "
        "to end (#number, state, value of the file's metric). The README's 'Progress lines' "
        "explains each number.",
    )
    p.add_argument("tuning", help="tuning YAML file")
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="overrides of the file's fields, in its own names (max_steps=500, "
        "space.temperature.high=0.3, model.bos=true); validated as the file",
    )
    p.add_argument("--trials", type=int, help="trials to add (default: the file's `trials`)")
    p.add_argument("--workers", type=int, default=1, help="trials at once, one actor each")
    p.add_argument("--storage", help="Optuna storage URL (default: a journal file in --out)")
    p.add_argument("--out", default="tuning-runs", help="output folder (default: ./tuning-runs)")
    p.add_argument("--model", help="tune on this model instead (hub id, folder, .gguf)")
    p.add_argument(
        "--address",
        help="Ray cluster address: auto, HOST:PORT or ray://... (default: RAY_ADDRESS if set, "
        "else a fresh local Ray for this run)",
    )
    p.add_argument("--wait-for-nodes", type=float, default=0.0, metavar="SECONDS", help=WAIT_HELP)
    p.add_argument("--json", action="store_true", help="the leaderboard as one JSON object")
    p.add_argument(
        "--evaluate",
        action="store_true",
        help="the held-out verdict on the study in --out: its best trial and the model's "
        "defaults on inputs it never saw (data.build's next seed), at its step budget; each "
        "exact rate with its Wilson interval, and McNemar's paired test of the difference "
        "(rows in OUT/<name>/verdict/); runs no trial",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="check the tuning file and print the study it describes and what it will cost at "
        "most (JSON); run nothing",
    )
    est = p.add_argument_group("the --dry-run estimate (as `sweep plan`)")
    est.add_argument(
        "--rate", type=float, help="sample-steps per second per worker: a time (no costs)"
    )
    est.add_argument(
        "--calibrate",
        action="store_true",
        help="a CPU model's rate measured here (loads the model, runs a few steps) when no "
        "--rate or CPU --costs prices it",
    )
    est.add_argument(
        "--costs", metavar="FILE_OR_DEVICE", default="h100", help=f"{COSTS_HELP} (default h100)"
    )
    add_mlflow_options(p, "study", "trial", "")
    p.set_defaults(func=cmd_tune)


def cmd_tune(args: argparse.Namespace) -> int:
    from functools import partial

    from sodaray.cli.progress import TrialProgress
    from sodaray.cli.sweep import estimate_lines, priced_lines
    from sodaray.config.validation import check_output_dir
    from sodaray.costs.devices import load_costs
    from sodaray.costs.flops import check_rate
    from sodaray.experiment import stops
    from sodaray.experiment.cluster import Cluster
    from sodaray.experiment.spec import model_defaults
    from sodaray.tuner import load_tuning, run_tuning
    from sodaray.tuner.storage import check_storage

    for name, value in (("--trials", args.trials), ("--workers", args.workers)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be at least 1, not {value}")
    # Options that contradict, or that this mode never reads (--rate and --calibrate price the
    # --dry-run estimate only), refused before anything loads.
    if args.evaluate and args.dry_run:
        raise ValueError(
            "--evaluate and --dry-run contradict: --evaluate runs the verdict, --dry-run runs "
            "nothing; give one"
        )
    for name, given in (("--rate", args.rate is not None), ("--calibrate", args.calibrate)):
        if given and not args.dry_run:
            raise ValueError(f"{name} prices the --dry-run estimate only: add --dry-run")
    spec = load_tuning(args.tuning, args.overrides)  # validated before Ray starts
    check_output_dir(args.out)
    check_storage(spec, args.out, args.storage)  # empty, unknown, its driver missing
    check_rate(args.rate)
    costs = load_costs(args.costs)
    # What a verdict and a run share; the cluster is made (and checked) as either starts:
    # --dry-run never reads these options.
    shared = {"storage": args.storage, "model": args.model, "workers": args.workers}
    cluster = partial(Cluster, args.address, wait_for_nodes=args.wait_for_nodes)
    if args.evaluate:  # the verdict's lines, or with --json its object
        from sodaray.tuner.verdict import evaluate

        verdict = evaluate(spec, args.out, cluster=cluster(), **shared)
        lines = [jsontext.dumps(verdict.to_dict(), default=str)] if args.json else verdict.lines()
        print("\n".join(lines))
        return 0
    if args.dry_run:
        study = describe(spec, args, costs)
        print(jsontext.dumps(study, default=str))
        estimate = study["estimate"]  # in `sweep plan`'s words (stderr: stdout is its JSON)
        lines = priced_lines(estimate["costs"], {estimate["kind"]}, "trials")
        lines.append(
            f"total: {estimate['trials']} trials x {estimate['samples']:,} samples, at most "
            f"{estimate['sample_steps']:,} sample-steps"
        )
        lines += estimate_lines(estimate, "the trials across the workers; start-up not counted")
        if estimate["wall_seconds"] is None:
            lines.append(
                "no price: pass --rate SAMPLE_STEPS_PER_SECOND, --calibrate, or --costs FILE for "
                "a CPU model (measured by bench_invert.py --suite gpu --device cpu)"
            )
        print("\n".join(lines), file=sys.stderr)
        return 0
    model = spec.on_model(args.model).model
    defaults = model_defaults(model)  # read once here: a config that cannot be read stops now
    if defaults is not None and not args.json:  # with --json: the leaderboard's `defaults`
        print(f"model {model.label}: {defaults.why()}", flush=True)
    tracker = None
    if args.mlflow is not None:  # the URI is checked before anything runs (an empty one too)
        from sodaray.cli.tracking.study import StudyTracker

        tracker = StudyTracker(spec, args)
    progress = TrialProgress(spec.name, spec.trials if args.trials is None else args.trials)
    hooks = {"on_trial": progress.trial, "on_progress": progress.progress}
    hooks["callbacks"] = [] if tracker is None else [tracker.trial]
    try:
        run = run_tuning(spec, args.out, trials=args.trials, cluster=cluster(), **shared, **hooks)
    except KeyboardInterrupt as exc:  # its tracker stopped, one line on what is kept
        if tracker is not None:
            tracker.stop()
        left = exc.run.abandoned if isinstance(exc, stops.Interrupted) else []
        again = f"; running trials {left} failed, to run again" if left else ""
        print(
            f"interrupted: finished trials are in the study{again}; run again to resume",
            file=sys.stderr,
        )
        return stops.exit_code()  # 130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP
    finally:
        progress.close()
    return _finish(args, run, tracker, defaults)


def _finish(args: argparse.Namespace, run, tracker, defaults) -> int:
    """The study after the run, as a leaderboard (and to MLflow); 1 when every trial failed."""
    board = leaderboard(run)
    if tracker is not None:
        tracker.finish(run, board)
    if args.json:
        print(jsontext.dumps({**board, "defaults": defaults and defaults.to_dict()}))
    else:
        if run.joined:
            live = f"live run{'s' * (len(run.joined) > 1)}"
            print(f"joined the study beside its {live}: " + "; ".join(run.joined))
        if run.grid is not None and run.grid[1] < run.asked:  # no more trials than points left
            points, left = run.grid
            trials = f"{left:,} trial{'s' * (left != 1)}"
            print(
                f"the grid has {left:,} of its {points:,} points left: ran {trials}"
                if left
                else f"the grid's {points:,} points are all tried: nothing more to run"
            )
        print_leaderboard(run, board)
    failure = no_trial_completed(run)
    if failure is not None:
        print(f"sodaray: error: {failure}", file=sys.stderr)
        return 1
    return 0


def describe(spec, args: argparse.Namespace, costs) -> dict[str, Any]:
    """`--dry-run`: what `tune` would run (each parameter's range as sampled, overrides applied),
    where it would write, and the most it will cost, priced by `costs` as `sweep plan` prices."""
    from sodaray.experiment.spec import model_defaults
    from sodaray.io.paths import inside
    from sodaray.tuner.plan import plan_study
    from sodaray.tuner.values import checkpoint_steps

    spec = spec.on_model(args.model)  # as `run_tuning` runs it
    trials = spec.trials if args.trials is None else args.trials
    defaults = model_defaults(spec.model)
    return {
        "study": spec.name,
        "folder": str(inside(args.out, spec.name)),
        "model": spec.model.id,
        # The family defaults of a model that names no preset (null: it names one).
        "defaults": None if defaults is None else defaults.to_dict(),
        "algorithm": spec.algorithm,
        "trials": trials,
        "sampler": spec.sampler,
        "pruner": spec.pruner,
        # What each checkpoint reports to the pruner, and at which steps.
        "signal": spec.signal,
        "checkpoints": list(checkpoint_steps(spec.max_steps, spec.checkpoints)),
        "metric": spec.metric,
        "max_steps": spec.max_steps,
        "space": {p.name: p.describe() for p in spec.space},
        "estimate": plan_study(
            spec,
            trials=trials,
            costs=costs,
            workers=args.workers,
            rate=args.rate,
            calibrate=args.calibrate,
        ),
    }


def no_trial_completed(run) -> str | None:
    """One line when this run's trials all failed (exit 1, whatever the study held before: on a
    cluster, how a storage or path the nodes cannot reach shows itself), else None. A run whose
    trials were all pruned (the pruner at work, not an error) succeeds."""
    if not run.outcomes or any(o.state != "failed" for o in run.outcomes):
        return None
    errors = sorted({o.error for o in run.outcomes if o.error})
    detail = f"; first error: {errors[0]}" if errors else ""
    return f"all {len(run.outcomes)} trials of this run failed{detail}"


def leaderboard(run, top: int = 10) -> dict[str, Any]:
    """The study after this run: state counts, the `top` completed trials, preset and plots."""
    import optuna

    from sodaray.report.study import leaderboard as board
    from sodaray.tuner.storage import open_storage

    study = optuna.load_study(study_name=run.study_name, storage=open_storage(run.storage))
    return {
        **board(study, top),
        "storage": run.storage,
        "stale_failed": list(run.stale_failed),
        # Other runs live on the study as this one opened it: it ran beside them.
        "joined": list(run.joined),
        "best_preset": str(run.preset_path) if run.preset_path else None,
        "plots": [str(p) for p in run.plots],
        "plots_skipped": dict(run.plots_skipped),
        # A grid study: its points, and how many it had left when the run began.
        "grid": None if run.grid is None else {"points": run.grid[0], "left": run.grid[1]},
    }


def print_leaderboard(run, board: dict[str, Any]) -> None:
    print(
        f"study {board['study']} ({board['storage']}): {board['trials']} trials: "
        + ", ".join(f"{v} {k}" for k, v in board["states"].items())
    )
    if run.stale_failed:
        print(
            f"  trials {run.stale_failed} were left running by an earlier run, now over: "
            "marked failed, retried"
        )
    for t in board["top"]:  # a categorical choice may hold a line break: shown as data
        params = ", ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={shown(v)}"
            for k, v in t["params"].items()
        )
        print(f"{t['rank']:>3}. trial {t['trial']:>4}  {t['value']:.4f}  {params}")
    steps = board["sample_steps"]
    if steps["spent"]:
        share = steps["saved"] / (steps["spent"] + steps["saved"])
        print(
            f"sample-steps: {steps['spent']:,} spent, {steps['saved']:,} saved by pruning at "
            f"most ({share:.0%} of what the trials could have taken)"
        )
    if run.preset_path:
        print(f"best preset: {run.preset_path}")
    for plot in run.plots:
        print(f"plot: {plot}")
    for name, reason in run.plots_skipped.items():
        print(f"plot {name} skipped: {reason}")
