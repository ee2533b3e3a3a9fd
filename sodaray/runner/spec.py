"""Sweep files: YAML -> validated dataclasses -> jobs (the cartesian product).

Every job is one (model, dataset, algorithm variant, objective, seed, length); its settings hash
to `config_hash`, which names its results folder, so a changed setting never mixes with old
shards. Validation happens on load: a bad field is a one-line `SweepError` naming the file and
the field, before Ray starts.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import re
from dataclasses import dataclass, field, fields
from math import prod
from pathlib import Path
from typing import Any

from sodaray.api import ALGORITHMS
from sodaray.config.configfile import read_document
from sodaray.config.families import Defaults
from sodaray.config.fields import (
    Fail,
    check_grid,
    check_positive,
    coerce_scalars,
    entries,
    grid,
    grid_size,
    known_fields,
)
from sodaray.config.validation import AT_LEAST_1
from sodaray.experiment.spec import (
    DatasetSpec,
    ModelSpec,
    SweepError,
    algorithm_config,
    check_top,
    expand_objective,
    model_defaults,
    objective_config,
    parse_dataset,
    parse_model,
    parse_objective,
    preset_base,
)
from sodaray.io.paths import brief
from sodaray.objective.objectives import Objective
from sodaray.objective.observations import observation
from sodaray.results import config_hash
from sodaray.search.engine.base import SearchConfig


@dataclass(frozen=True)
class Job:
    sweep: str
    model: ModelSpec
    dataset: DatasetSpec
    algorithm: str
    variant: str  # algorithm label with its grid values
    search: SearchConfig  # the full, validated algorithm config (preset and defaults applied)
    objective: Objective
    length: str  # "fixed" (the true length), "auto", or an assumed length ("3")
    max_length: int
    samples_per_length: int | None
    limit: int | None
    shard_size: int
    # A dataset file's hash, set when planning: its rows decide results, not its path.
    dataset_hash: str | None = None
    # The family defaults the model entry got for naming no preset (None: it named one). Not
    # hashed: their effect is in `search` and `objective`.
    defaults: Defaults | None = field(default=None, compare=False)
    # Set when planning, where an earlier run wrote this same job with its model or a build's
    # source named by another path to the same place: that run's job name and spellings
    # (`runner.jobs`), so the job keeps its folder and hash.
    spelled: dict[str, Any] | None = field(default=None, compare=False)

    def config(self) -> dict[str, Any]:
        """Everything that decides this job's results (hashed into its folder name)."""
        model, dataset = self.model.identity(), self.dataset.identity()
        if self.dataset_hash is not None:
            dataset = {"name": self.dataset.name, "hash": self.dataset_hash}
        if self.spelled:
            model["id"] = self.spelled.get("model", model["id"])
            if "source" in self.spelled and dataset.get("build"):
                dataset["build"] = {**dataset["build"], "source": self.spelled["source"]}
        return {
            "model": model,
            "dataset": dataset,
            "algorithm": self.algorithm,
            "params": self.search.to_dict(),
            "objective": self.objective.identity(),
            "length": self.length,
            "max_length": self.max_length,
            "samples_per_length": self.samples_per_length,
            "limit": self.limit,
            "shard_size": self.shard_size,
        }

    @functools.cached_property
    def config_hash(self) -> str:
        return config_hash(self.config())

    @functools.cached_property
    def name(self) -> str:
        if self.spelled and "name" in self.spelled:
            return str(self.spelled["name"])
        obj = self.objective
        what = observation(obj.kind).label(obj)
        if obj.fluency_weight:
            what += f"-flu{obj.fluency_weight:g}"
        parts = [self.model.label, self.dataset.name, self.variant, what, f"s{self.search.seed}"]
        if self.length.isdigit():
            parts.append(f"L{self.length}")
        # No `=` (readers take `key=value` folders for hive partitions), nor a leading `.` or
        # `_` (readers pass over such folders as hidden).
        slug = re.sub(r"[^A-Za-z0-9_.+-]+", "-", "_".join(parts)).strip("-").lstrip("._-")
        slug = slug or "job"
        return f"{slug}-{self.config_hash[:8]}"


@dataclass(frozen=True)
class AlgorithmEntry:
    """An `algorithms:` entry: an algorithm, its parameters, a `grid` of values to try (each
    combination a variant) and its own step budget (None: the sweep's `max_steps`)."""

    name: str
    label: str = ""  # the variant label's stem (default: the name)
    params: dict[str, Any] = field(default_factory=dict)
    grid: dict[str, list[Any]] = field(default_factory=dict)
    max_steps: int | None = field(default=None, metadata=AT_LEAST_1)

    def variants(self) -> list[tuple[str, dict[str, Any]]]:
        """(label, parameters) of each grid combination: `soda-lr0.1-decay0.9`."""
        out = []
        for values in grid(self.grid):
            suffix = "".join(f"-{k}{_short(v)}" for k, v in values.items())
            out.append(((self.label or self.name) + suffix, {**self.params, **values}))
        return out


MAX_LENGTH = 10  # the longest input a length search (`length: auto`) tries, by default


@dataclass
class Sweep:
    name: str
    path: Path
    description: str = ""
    models: list[ModelSpec] = field(default_factory=list)
    datasets: list[DatasetSpec] = field(default_factory=list)
    algorithms: list[AlgorithmEntry] = field(default_factory=list)
    # Each objective entry's own fields, its grid expanded (a job's adds its model's preset).
    objectives: list[dict[str, Any]] = field(default_factory=list)
    max_steps: int = field(default=2000, metadata=AT_LEAST_1)  # entries without their own
    seeds: list[int] = field(default_factory=lambda: [0])
    samples_per_length: int | None = field(default=None, metadata=AT_LEAST_1)
    shard_size: int = field(default=100, metadata=AT_LEAST_1)
    length: str = "fixed"
    max_length: int = field(default=MAX_LENGTH, metadata=AT_LEAST_1)  # `length: auto`'s only
    # Assumed lengths (`length: [1, 2, 3]`): each a job searching every sample at that length.
    assumed_lengths: list[int] = field(default_factory=list)
    # The command line's KEY=VALUE overrides, as given (the jobs carry their final values).
    overrides: list[str] = field(default_factory=list)

    def quick(self, max_steps: int | None) -> Sweep:
        """This sweep as a quick look: named NAME-quick (its own results folder) and, with
        `max_steps`, every step budget capped at it."""
        cap = max_steps or self.max_steps
        entries = [
            dataclasses.replace(e, max_steps=min(e.max_steps or self.max_steps, cap))
            for e in self.algorithms
        ]
        return dataclasses.replace(
            self, name=f"{self.name}-quick", algorithms=entries, max_steps=min(self.max_steps, cap)
        )

    def length_modes(self) -> list[str]:
        return [str(n) for n in self.assumed_lengths] or [self.length]

    def jobs(self, *, limit: int | None = None, model: str | None = None) -> list[Job]:
        """The cartesian product. `model` replaces the file's models (one replica, its
        resources from the first model entry); `limit` caps samples per job."""
        models = self.models if model is None else [self.models[0].with_id(model)]
        # Entries can make one job twice (a preset's `space: centred` beside an entry saying
        # it): one folder, run once.
        jobs: dict[str, Job] = {}
        variants = [(e, *v) for e in self.algorithms for v in e.variants()]
        # Once per model (and entry), not per job: each reads the model's config, a preset file.
        family = {id(m): model_defaults(m) for m in models}
        bases = {(e.name, id(m)): preset_base(e.name, m) for e in self.algorithms for m in models}
        numbered = list(enumerate(self.objectives))
        objectives = {(i, id(m)): objective_config(o, m) for i, o in numbered for m in models}
        # A variant's config on a model, made once; its other seeds are that config re-seeded.
        made: dict[tuple[int, int], SearchConfig] = {}
        axes = (models, self.datasets, enumerate(variants), numbered, self.seeds)
        axes += (self.length_modes(),)
        for m, ds, (k, (entry, variant, params)), (i, _), seed, length in itertools.product(*axes):
            if m.datasets and ds.name not in m.datasets:
                continue
            steps = entry.max_steps or self.max_steps
            config = made.get((k, id(m)))
            if config is None:
                base = bases[entry.name, id(m)]
                config = algorithm_config(entry.name, params, m, seed=seed, steps=steps, base=base)
                made[k, id(m)] = config
            elif config.seed != seed:
                config = dataclasses.replace(config, seed=seed)
            job = Job(
                sweep=self.name,
                model=m,
                dataset=ds,
                algorithm=entry.name,
                variant=variant,
                search=config,
                objective=objectives[i, id(m)],
                length=length,
                # Read by a length search alone: any other job hashes the default.
                max_length=self.max_length if length == "auto" else MAX_LENGTH,
                samples_per_length=self.samples_per_length,
                limit=limit,
                shard_size=self.shard_size,
                defaults=family[id(m)],
            )
            jobs.setdefault(job.name, job)
        return list(jobs.values())


def _short(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


# ---- loading and validation -------------------------------------------------------------------
MAX_JOBS = 100_000  # jobs one sweep may make: counted before any is built
# The fields that name files, read from the sweep file's folder (`sodaray.io.paths.in_file`).
PATH_FIELDS = ("models.*.id", "models.*.preset_file", "datasets.*.path", "datasets.*.build.source")
TOP_KEYS = {f.name for f in fields(Sweep)} - {"path", "assumed_lengths", "overrides"}
ALGORITHM_KEYS = {f.name for f in fields(AlgorithmEntry)}


def load_sweep(
    path: str | Path, model: str | None = None, overrides: list[str] | tuple = ()
) -> Sweep:
    """Read and validate a sweep file; every job it makes is checked before returning. `model`
    (`--model`) replaces every entry's model before the check (a file whose own model path does
    not exist here still runs on it); `overrides` (`KEY=VALUE`) are applied first."""
    data, path = read_document(path, "sweep", SweepError, overrides, PATH_FIELDS)
    sweep = parse_sweep(data, path, model=model)
    sweep.overrides = list(overrides)
    return sweep


def parse_sweep(data: Any, path: Path, model: str | None = None) -> Sweep:
    """A sweep file's `data` (read from `path`) as a checked `Sweep` (`model`: `load_sweep`'s)."""
    fail, name = check_top(
        data, path, SweepError, TOP_KEYS, ("name", "models", "datasets", "algorithms")
    )
    models, datasets = _models_datasets(data, path, model, fail)
    algorithms = [
        _algorithm_entry(e, f"algorithms[{i}]", fail)
        for i, e in enumerate(entries(data, "algorithms", fail))
    ]
    objectives = [
        o
        for i, e in enumerate(data.get("objectives") or [{"kind": "logits"}])
        for o in _objective_entry(e, f"objectives[{i}]", fail)
    ]
    assumed = _assumed_lengths(data.get("length"), fail)
    if assumed is not None:  # the field holds them, not a mode
        data = {k: v for k, v in data.items() if k != "length"}
    scalars = ("description", "max_steps", "samples_per_length", "shard_size", "length")
    scalars += ("max_length",)
    values = coerce_scalars(Sweep, {k: data[k] for k in scalars if k in data}, fail)  # 1e3: 1000
    entries_ = dict(models=models, datasets=datasets, algorithms=algorithms, objectives=objectives)
    sweep = Sweep(name, path, **entries_, assumed_lengths=assumed or [], **values)
    if "seeds" in data:
        sweep.seeds = _seeds(data["seeds"], fail)
    per_model = (len(objectives), len(sweep.seeds), len(sweep.length_modes()))
    per_model += (sum(grid_size(e.grid) for e in algorithms),)
    jobs = sum(m.datasets and len(m.datasets) or len(datasets) for m in models) * prod(per_model)
    if jobs > MAX_JOBS:
        raise fail("name", f"the sweep makes {jobs:,} jobs (at most {MAX_JOBS:,})")
    if sweep.length not in ("fixed", "auto"):
        why = f"'fixed', 'auto' or assumed lengths (N or [N, ...]), not {sweep.length!r}"
        raise fail("length", why)
    _check_configs(sweep, fail)
    return sweep


def _models_datasets(
    data: dict[str, Any], path: Path, model: str | None, fail: Fail
) -> tuple[list[ModelSpec], list[DatasetSpec]]:
    """The `models:` and `datasets:` entries, each name once, every dataset a model names
    there; relative paths in them are read from the file's folder."""
    base = path.parent.resolve()
    models = [
        parse_model(e, f"models[{i}]", fail, model, base=base)
        for i, e in enumerate(entries(data, "models", fail))
    ]
    datasets = [
        parse_dataset(e, f"datasets[{i}]", fail, base=base)
        for i, e in enumerate(entries(data, "datasets", fail))
    ]
    names = [d.name for d in datasets]
    _unique(names, "datasets", fail)
    # A model's `name` labels its jobs, rows and overrides (entries that name none may share
    # an id: their settings, so their hashes, differ).
    _unique([m.name for m in models], "models", fail)
    for i, m in enumerate(models):
        for n in [n for n in m.datasets if n not in names][:1]:
            raise fail(f"models[{i}].datasets", f"no dataset entry named {n!r} (have {names})")
    return models, datasets


def _assumed_lengths(value: Any, fail: Fail) -> list[int] | None:
    """`length:` as assumed lengths (an int or a list of ints, each its own job, a wrong length
    allowed), or None where it names a mode (`fixed`, `auto`)."""
    if not isinstance(value, (int, list)) or isinstance(value, bool):
        return None
    assumed = value if isinstance(value, list) else [value]
    for n in assumed:
        check_positive(n, "length", fail)
    if len(set(assumed)) != len(assumed):
        raise fail("length", f"assumed lengths repeat: {assumed}")
    return list(assumed)


def _seeds(value: Any, fail: Fail) -> list[int]:
    """`seeds:`, an integer or a list of distinct integers in [0, 2**63)."""
    seeds = [value] if isinstance(value, int) and not isinstance(value, bool) else value
    ints = isinstance(seeds, list) and all(type(s) is int for s in seeds)
    if not (ints and seeds):
        raise fail("seeds", f"a list of integers, not {brief(seeds)}")
    if len(set(seeds)) != len(seeds):  # two jobs would share one folder and its locks
        raise fail("seeds", f"repeat: {brief(seeds)}")
    for seed in seeds:
        if not 0 <= seed < 2**63:
            raise fail("seeds", f"each in [0, 2**63), not {seed}")
    return seeds


def _check_configs(sweep: Sweep, fail: Fail) -> None:
    """Every algorithm variant and objective entry made on each model with its preset, so a
    bad parameter fails now (a family's defaults wait for `jobs()`)."""
    for i, entry in enumerate(sweep.algorithms):
        steps = entry.max_steps or sweep.max_steps
        bases: dict[int, dict[str, Any]] = {}  # a model's preset, read once for every variant
        for (_, params), m in itertools.product(entry.variants(), sweep.models):
            try:
                if id(m) not in bases:
                    bases[id(m)] = preset_base(entry.name, m, defaults=False)
                seed, base = sweep.seeds[0], bases[id(m)]
                algorithm_config(entry.name, params, m, seed=seed, steps=steps, base=base)
            except (TypeError, ValueError) as exc:
                raise fail(f"algorithms[{i}]", str(exc).removeprefix("config: ")) from exc
    for (i, m), obj in itertools.product(enumerate(sweep.models), sweep.objectives):
        try:  # a preset's settings with each objective entry: `space: centred` and top_k 1 clash
            objective_config(obj, m, defaults=False)
        except (TypeError, ValueError) as exc:
            raise fail(f"models[{i}].preset_file", f"{exc} (with objective {obj})") from exc


def _unique(labels: list[str], where: str, fail: Fail) -> None:
    """Refuse two entries of `where` that share a (non-empty) label."""
    for i, label in enumerate(labels):
        if label and label in labels[:i]:
            first = labels.index(label)
            raise fail(where, f"{where}[{first}] and {where}[{i}] are both named {label!r}")


def _objective_entry(entry: Any, where: str, fail: Fail) -> list[dict[str, Any]]:
    """An objective entry's combinations. A `huber_delta` no combination reads (each one's loss
    mse) is refused: it cannot change a run, so it was most likely meant for a huber entry."""
    entry = parse_objective(entry, where, fail)
    combos = expand_objective(entry)
    gridded = entry.get("grid") or {}
    if ("huber_delta" in entry or "huber_delta" in gridded) and not any(
        o.get("loss", "huber") == "huber" for o in combos
    ):
        key = "huber_delta" if "huber_delta" in entry else "grid.huber_delta"
        raise fail(f"{where}.{key}", "is read by loss: huber alone, and this entry's loss is mse")
    return combos


def _algorithm_entry(entry: dict[str, Any], where: str, fail: Fail) -> AlgorithmEntry:
    known_fields(entry, ALGORITHM_KEYS, where, fail)
    if entry.get("name") not in ALGORITHMS:
        choose = ", ".join(ALGORITHMS)
        raise fail(f"{where}.name", f"unknown algorithm {entry.get('name')!r} (choose {choose})")
    for key in ("params", "grid"):
        if not isinstance(entry.get(key) or {}, dict):
            raise fail(f"{where}.{key}", "must be a mapping")
    for key in ("max_steps", "seed"):
        if key in (entry.get("params") or {}) or key in (entry.get("grid") or {}):
            why = "set it beside `params` (max_steps) or with `seeds`"
            raise fail(f"{where}.params.{key}", why)
    check_grid(entry.get("grid") or {}, f"{where}.grid", fail)
    values = {k: v for k, v in entry.items() if v is not None}
    return AlgorithmEntry(**coerce_scalars(AlgorithmEntry, values, fail, where))
