"""`sodaray tune FILE --evaluate`: the held-out verdict on a study. Its best trial's parameters
and the model's defaults (its preset, else its family's: what a run without the study uses),
both under the file's objective, on test inputs the study never saw (its `data.build` drawn
with the next seed: 1 for the paper's seed-0 validation set), at the study's step budget.
Each arm's exact rate with its Wilson interval, and whether they differ: the arms search the
same inputs, so the test is McNemar's exact test on the inputs one arm recovers and the other
does not."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sodaray.experiment.cluster import Cluster, check_address
from sodaray.experiment.data import dataset_rows
from sodaray.experiment.group import Failure, next_event
from sodaray.experiment.spec import TuningError
from sodaray.experiment.work import Finished
from sodaray.io.writes import OutputFolder
from sodaray.report.metrics import Proportion, proportion
from sodaray.results import write_table_atomic
from sodaray.tuner.run import study_folder, study_replicas, study_unit
from sodaray.tuner.spec import TuningSpec
from sodaray.tuner.storage import open_storage, storage_url
from sodaray.tuner.study import best_trial

SIGNIFICANCE = 0.05  # McNemar's p below which the arms are said to differ
VERDICT_FOLDER = "verdict"  # OUT/<name>/verdict/<arm>.parquet: each arm's result rows


@dataclass
class Arm:
    """One side of the verdict: what it ran and which test inputs it recovered exactly."""

    name: str  # tuned | default
    params: dict[str, Any]
    exact: dict[int, bool] = field(default_factory=dict)  # sample id -> exact
    rows: Path | None = None

    @property
    def rate(self) -> Proportion:
        return proportion(sum(self.exact.values()), len(self.exact))

    def to_dict(self) -> dict[str, Any]:
        r, rows = self.rate, None if self.rows is None else str(self.rows)
        interval = [r.low, r.high]
        return dict(
            exact=r.k, samples=r.n, rate=r.value, interval=interval, params=self.params, rows=rows
        )


@dataclass
class Verdict:
    study: str
    trial: int  # the best trial's number
    value: float  # its value under the study's metric
    metric: str
    data: str  # the test data's name and seed
    samples: int
    max_steps: int
    objective: dict[str, Any]
    arms: list[Arm]
    only: tuple[int, int]  # inputs only the tuned arm recovered, only the default did
    p_value: float

    @property
    def differ(self) -> bool:
        return self.p_value < SIGNIFICANCE

    def to_dict(self) -> dict[str, Any]:
        return {
            **{k: v for k, v in dataclasses.asdict(self).items() if k not in ("arms", "only")},
            "arms": {a.name: a.to_dict() for a in self.arms},
            "only_tuned": self.only[0],
            "only_default": self.only[1],
            "differ": self.differ,
        }

    def lines(self) -> list[str]:
        """The verdict as a reader reads it: the setting, each arm, the paired test."""
        out = [
            f"held-out verdict on study {self.study}: its best trial {self.trial} "
            f"({self.metric} {self.value:.4f}) against the model's defaults, on {self.data} "
            f"({self.samples} inputs the study never saw), {self.max_steps} steps each, both "
            f"under the file's objective {_objective(self.objective)}"
        ]
        for arm in self.arms:
            rate = arm.rate
            out.append(f"  {arm.name:<8} {rate.k:>4}/{rate.n:<4} exact  {rate.percent()}")
        tuned, default = self.only
        said = "they differ" if self.differ else "no difference shown"
        out.append(
            f"  paired: {tuned} found by the tuned arm alone, {default} by the default alone; "
            f"McNemar exact p = {self.p_value:.3g}: {said} at {SIGNIFICANCE:g}"
        )
        return out


def _objective(settings: dict[str, Any]) -> str:
    shown = {k: v for k, v in settings.items() if k in ("kind", "space", "loss", "output_tokens")}
    return "(" + ", ".join(f"{k}: {v}" for k, v in shown.items()) + ")"


def held_out_data(spec: TuningSpec):
    """The study's data drawn again with the next seed: inputs it never saw. Only a built data
    entry can be (a file holds what it holds)."""
    build = spec.data.build
    if not build:
        raise TuningError(
            f"{spec.path}: --evaluate draws test inputs as the study's `data.build` with the "
            f"next seed; this study's data is a file ({spec.data.path})"
        )
    build = {**build, "seed": int(build.get("seed", 0)) + 1}
    return dataclasses.replace(spec.data, name=f"{spec.data.name}-test", build=build)


def mcnemar_p(only_a: int, only_b: int) -> float:
    """McNemar's exact (binomial) two-sided p-value on the discordant pairs."""
    n = only_a + only_b
    tail = sum(math.comb(n, i) for i in range(min(only_a, only_b) + 1)) / 2**n
    return min(1.0, 2 * tail)


def evaluate(
    spec: TuningSpec,
    out: str | Path,
    *,
    storage: str | None = None,
    model: str | None = None,
    workers: int = 1,
    cluster: Cluster = Cluster(),
) -> Verdict:
    """The held-out verdict on `spec`'s study in `out` (see the module docstring); each arm's
    rows are written to OUT/<name>/verdict/<arm>.parquet."""
    import optuna

    check_address(cluster.address)
    spec = spec.on_model(model)
    data = held_out_data(spec)  # before the study: a file's data is refused at once
    out_folder = OutputFolder(Path(out))  # the folder the user gave: nothing below it is a link
    folder = study_folder(out_folder.base, spec)
    url = storage_url(spec, folder, storage)
    name = spec.study_name or spec.name
    if "://" not in url and not Path(url).is_file():
        raise TuningError(f"{spec.path}: no study to evaluate at {url}: run `sodaray tune` first")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.load_study(study_name=name, storage=open_storage(url))
    except KeyError as exc:
        raise TuningError(f"{spec.path}: no study {name!r} in {url}") from exc
    best = best_trial(study)
    if best is None:
        raise TuningError(f"{spec.path}: study {name!r} has no completed trial to evaluate")
    rows, identity = dataset_rows(spec.model, data, folder, out_folder)
    arms = [Arm("tuned", dict(best.params)), Arm("default", {})]
    sweep, tables = f"verdict:{spec.name}", {}
    units = [
        study_unit(spec, a.params, rows, identity, job=a.name, sweep=sweep, data=data.name)
        for a in arms
    ]
    with study_replicas(spec, workers, cluster) as group:
        for unit in units:
            group.submit(unit)
        while len(tables) < len(arms):
            event = next_event([group])
            unit, output = (None, None) if event is None else event[1:]
            if isinstance(output, Failure) and output.final:
                raise TuningError(f"{spec.path}: the {unit.key} arm failed: {output.error}")
            if isinstance(output, Finished):
                tables[unit.key] = output.table
    for arm in arms:
        result = tables[arm.name]
        arm.rows = folder / VERDICT_FOLDER / f"{arm.name}.parquet"
        write_table_atomic(result, arm.rows, out_folder)
        ids, exact = (result.column(c).to_pylist() for c in ("sample_id", "exact"))
        arm.exact = {int(i): bool(e) for i, e in zip(ids, exact, strict=True)}
    tuned, default = arms[0].exact, arms[1].exact
    pairs = ((tuned, default), (default, tuned))
    only = tuple(sum(a[i] and not b.get(i, False) for i in a) for a, b in pairs)
    return Verdict(
        study=name,
        trial=best.number,
        value=float(best.value),
        metric=spec.metric,
        data=f"{data.name}, seed {data.build['seed']}",
        samples=len(rows["sample_id"]),
        max_steps=spec.max_steps,
        objective=dataclasses.asdict(spec.objective_for({})),
        arms=arms,
        only=only,
        p_value=mcnemar_p(*only),
    )
