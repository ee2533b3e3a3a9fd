"""`sodaray sweep plan`: what a sweep will cost, before anything runs; and, after a run, how
its plan compares with the wall it took.

Per job: its samples (by length), the most sample-steps it can take (every sample its full
budget at every length it may try), their FLOPs from the model's shape, and its time, priced as
every plan prices (`experiment.estimate`). Searches stop a sample once it is found, so every
estimate is an upper bound; `check_run` also prices the steps a run actually took.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sodaray.costs.devices import H100, DeviceCosts
from sodaray.costs.flops import ModelShape, lengths_tried, model_shape
from sodaray.errors import first_line
from sodaray.experiment.data import dataset_lengths
from sodaray.experiment.estimate import Totals, Workload, calibrate, describe_tables, price, tables
from sodaray.runner.spec import Job


def select_counts(
    available: dict[int, int], samples_per_length: int | None, limit: int | None
) -> dict[int, int]:
    """Per-length counts the runner selects: `samples_per_length` of each length, then at most
    `limit` in all, taken evenly across lengths (as `execute.select_rows` does)."""
    counts = {n: min(k, samples_per_length or k) for n, k in sorted(available.items())}
    if limit is None or limit >= sum(counts.values()):
        return counts
    chosen = dict.fromkeys(counts, 0)
    rank = 0
    while limit > 0:
        for n in counts:  # one of each length per round, shortest first
            if limit > 0 and chosen[n] < counts[n] and rank < counts[n]:
                chosen[n] += 1
                limit -= 1
        rank += 1
    return chosen


def check_jobs_fit(jobs: list[Job], where: str | Path) -> None:
    """Every job's inputs and observed outputs fit its model's context, where the model's
    local config says it: one line naming the file, before any dataset is built or actor
    started."""
    from sodaray.experiment.context import check_fits
    from sodaray.experiment.spec import SweepError

    seen: set[str] = set()
    models: dict[int, Any] = {}  # a model's identity, once per entry (not per job)
    for job in jobs:
        _once(models, id(job.model), job.model.identity)
        shown = (job.dataset.name, job.length, job.max_length, job.samples_per_length, job.limit)
        key = json.dumps([models[id(job.model)], *shown, job.objective.output_tokens], default=str)
        if key in seen:
            continue
        seen.add(key)
        if job.length == "auto":
            longest, what = job.max_length, f"length: auto tries up to max_length {job.max_length}"
        elif job.length.isdigit():
            longest = int(job.length)
            what = f"assumed length {longest}"
        else:
            counts = select_counts(dataset_lengths(job.dataset), job.samples_per_length, job.limit)
            longest = max((n for n, k in counts.items() if k), default=0)
            what = f"dataset {job.dataset.name} has inputs of length {longest}"
        check_fits(job.model, longest, job.objective.output_tokens, SweepError, f"{where}: {what}")
    check_jobs_vocab(jobs, where)


def check_jobs_vocab(jobs: list[Job], where: str | Path) -> None:
    """Every job's observed top-k and its dataset file's token ids fit its model's vocabulary,
    where the model's local config says it: one line naming the file, before any actor starts
    (a replica would refuse them only after it loads the model)."""
    import pyarrow.compute as pc

    from sodaray.data.store import read_dataset
    from sodaray.experiment.context import config_vocab
    from sodaray.experiment.spec import SweepError

    vocabs: dict[int, int | None] = {}  # per model entry: its config read once
    seen: set[tuple[int, str]] = set()  # (model entry, dataset file) pairs checked
    for job in jobs:
        if id(job.model) not in vocabs:
            vocabs[id(job.model)] = None  # a damaged config: loading it says what is wrong
            with contextlib.suppress(ValueError):
                vocabs[id(job.model)] = config_vocab(job.model)
        vocab, top_k = vocabs[id(job.model)], job.objective.top_k
        if vocab is None:
            continue
        if top_k is not None and top_k > vocab:
            raise SweepError(
                f"{where}: objective top_k {top_k:,} is larger than the vocabulary of "
                f"{job.model.label} ({vocab:,})"
            )
        location = job.dataset.location
        if location is None or (id(job.model), location) in seen:
            continue
        seen.add((id(job.model), location))
        table = read_dataset(location)
        largest = pc.max(pc.list_flatten(table.column("tokens"))).as_py() if len(table) else None
        if largest is not None and largest >= vocab:
            built = pc.max(table.column("vocab_size")).as_py()
            raise SweepError(
                f"{where}: dataset {job.dataset.name} ({location}) holds token id {largest:,}, "
                f"outside the vocabulary of {job.model.label} ({vocab:,}); it was built for a "
                f"vocabulary of {built:,}"
            )


def job_cost(
    job: Job, shape: ModelShape | None = None, memo: dict[Any, Any] | None = None
) -> Workload:
    """`job`'s workload; `shape` (the loaded model's) where its id tells none. `memo`: what jobs
    share (a dataset's lengths, a model's shape), kept by the caller across its jobs."""
    memo = {} if memo is None else memo
    lengths = _once(memo, ("lengths", id(job.dataset)), lambda: dataset_lengths(job.dataset))
    counts = select_counts(lengths, job.samples_per_length, job.limit)
    known = _once(memo, ("shape", job.model.location), lambda: model_shape(job.model.location))
    replicas = max(1, min(job.model.replicas, math.ceil(sum(counts.values()) / job.shard_size)))
    return Workload(
        name=job.name,
        model=job.model,
        search=job.search,
        objective=job.objective,
        samples_by_length=counts,
        lengths_per_sample=lengths_tried(job.length, job.max_length),
        max_length=job.max_length,
        replicas=replicas,
        shape=known or shape,
    )


def _once(memo: dict[Any, Any], key: Any, make: Callable[[], Any]) -> Any:
    if key not in memo:
        memo[key] = make()
    return memo[key]


def plan_sweep(
    jobs: list[Job],
    *,
    rate: float | None,
    measure: bool,
    costs: DeviceCosts = H100,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """Every job's cost and time, and their totals, as plain data (`sweep plan --json`);
    `measure`: load a model here where a job needs it (a calibration, a GGUF file's shape)."""
    rates: dict[str, float | None] = {}
    loaded: dict[str, Any] = {}  # model identity -> the model (None: not loadable here)
    started: set[str] = set()  # models whose start-up a job already carries
    total = Totals()
    rows = []
    memo: dict[Any, Any] = {}  # what jobs share, worked out once (`job_cost`)
    for job in jobs:
        identity = _once(
            memo,
            ("identity", id(job.model)),
            lambda job=job: json.dumps(job.model.identity(), sort_keys=True, default=str),
        )

        def load(job: Job = job, identity: str = identity) -> Any:
            if identity not in loaded:  # once per model (a GGUF file loads for minutes)
                try:
                    loaded[identity] = job.model.load_here()
                except Exception as exc:  # a model not loadable here: say why, go on
                    say(f"  no calibration for {job.model.label}: {first_line(exc)}")
                    loaded[identity] = None
            return loaded[identity]

        def shared_rate(cost: Workload, model: Any, job: Job = job) -> float | None:
            # Jobs that cost the same per sample-step share one calibration.
            obj, lengths = job.objective, sorted(cost.samples_by_length)
            shown = [obj.kind, obj.output_tokens, bool(obj.fluency_weight), cost.batch_size]
            key = json.dumps([job.model.identity(), job.algorithm, *shown, lengths], default=str)
            if key not in rates:
                rates[key] = None
                try:
                    rates[key] = calibrate(cost, model)
                except Exception as exc:  # e.g. the batch does not fit here: say why, go on
                    say(f"  no calibration for {job.name}: {first_line(exc)}")
            return rates[key]

        cost = job_cost(job, memo=memo)
        cost, time = price(cost, costs, rate, load=load if measure else None, measure=shared_rate)
        # A model's replicas start once for all its jobs: its first priced job carries it.
        startup = 0.0
        table = tables(costs)[cost.kind]
        if time.time is not None and table is not None and identity not in started:
            started.add(identity)
            startup = table.startup_seconds
        total.add(cost, time, startup)
        shown = ("samples", "max_steps", "sample_steps", "flops", "replicas")
        row = {"job": cost.name, "model": cost.model.label, "kind": cost.kind}
        row |= {name: getattr(cost, name) for name in shown}
        rows.append({**row, **time.fields(), "startup_seconds": startup})
    return {"costs": describe_tables(costs), "jobs": rows, "total": dataclasses.asdict(total)}


def check_run(plan: dict[str, Any], run: Any) -> dict[str, Any]:
    """A run (`SweepRun`) against its plan: the plan's wall for the samples the run ran, the
    same costs applied to the steps the run took, and the measured walls (the whole run, and
    its search alone)."""
    rows = {r["job"]: r for r in plan["jobs"]}
    models: dict[str, dict[str, float]] = {}
    planned, unpriced, priced_by = 0.0, [], set()
    startup: dict[str, float] = {}  # per model: the start-up its run paid once
    for job, progress in run.progress.items():
        row, samples = rows.get(job), progress.samples
        if row is None or row["device_seconds"] is None or not row["samples"] or not samples:
            unpriced.append(job)
            continue
        share = samples / row["samples"]
        priced_by.add(row["priced_by"])
        planned += row["wall_seconds"] * share
        paid = row.get("startup_seconds") or 0.0
        startup[row["model"]] = max(startup.get(row["model"], 0.0), paid)
        sample_steps = sum(d.sample_steps for d in run.done if d.job == job)
        m = models.setdefault(row["model"], dict(floor=0.0, batch=0.0, work=0.0, replicas=1))
        m["replicas"] = max(m["replicas"], row["replicas"])
        if row["batch_steps"]:  # priced by device costs: floors per batch-step, work per sample
            m["floor"] += row["floor_seconds"] * share
            m["batch"] += row["batch_steps"] * share
            m["work"] += sample_steps * row["work_seconds"] / row["sample_steps"]
        else:  # priced by a rate
            m["work"] += sample_steps / row["rate"]
    # The batch-steps each model's replicas took (a batch holds samples of any of its jobs),
    # counted from the shards' rows and the progress items between them.
    ran = run.model_batch_steps
    as_run = sum(
        ((ran.get(model, 0) * m["floor"] / m["batch"] if m["batch"] else 0.0) + m["work"])
        / m["replicas"]
        for model, m in models.items()
    )
    searching, wall, startup_total = run.searching_seconds, run.seconds, sum(startup.values())

    def ratio(a: float | None, b: float) -> float | None:
        return a / b if a is not None and b > 0 else None

    return {
        "priced_by": sorted(priced_by),
        "planned_seconds": planned + startup_total,  # the wall: start-up, then the search
        "planned_startup_seconds": startup_total,
        "planned_search_seconds": planned,
        "as_run_seconds": as_run,
        "wall_seconds": wall,
        "searching_seconds": searching,
        "wall_over_planned": ratio(wall, planned + startup_total),
        "searching_over_planned": ratio(searching, planned),
        "searching_over_as_run": ratio(searching, as_run),
        "unpriced_jobs": unpriced,
    }
