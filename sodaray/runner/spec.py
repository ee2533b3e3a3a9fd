"""Sweep files: YAML -> validated dataclasses -> jobs (the cartesian product).

A sweep names models, datasets, algorithms (with parameters and an optional `grid` of values to
try), objectives (also with an optional `grid`), the step budget, seeds, samples per length and
the shard size. Every job is one (model, dataset, algorithm variant, objective, seed); its
settings hash to `config_hash`, which names its results folder, so a changed setting never mixes
with old shards. Validation happens on load: a bad field is a one-line `SweepError` naming the
file and the field, before Ray starts.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from sodaray.api import ALGORITHMS, make_config
from sodaray.objectives import Objective
from sodaray.presets import PRESETS, get_preset, load_preset_file
from sodaray.results import config_hash
from sodaray.validation import coerce_fields, make_objective, yaml_load


class SweepError(ValueError):
    """An invalid sweep file: the message names the file and the field."""


@dataclass(frozen=True)
class ModelSpec:
    id: str  # hub id, local folder, or .gguf file
    name: str = ""  # label in job names and results (default: the id's last part)
    preset: str | None = None  # paper preset for SODA's parameters on this model
    preset_file: str | None = None  # or a preset YAML (e.g. from `sodaray tune`)
    gguf_file: str | None = None
    dtype: str = "float32"
    bos: bool | None = None
    trust_remote_code: bool = False
    # Resources one replica needs (Ray places actors by them); fractional GPUs share a device.
    num_gpus: float = 0.0
    num_cpus: float = 1.0
    replicas: int = 1

    @property
    def label(self) -> str:
        return self.name or Path(self.gguf_file or self.id.rstrip("/")).name.removesuffix(".gguf")

    def with_id(self, model: str) -> ModelSpec:
        """Another model (`--model`) on this entry's resources and dtype; presets dropped."""
        return ModelSpec(
            id=model,
            num_gpus=self.num_gpus,
            num_cpus=self.num_cpus,
            replicas=self.replicas,
            dtype=self.dtype,
        )

    def identity(self) -> dict[str, Any]:
        """What decides results (resources do not)."""
        return {k: getattr(self, k) for k in ("id", "gguf_file", "dtype", "bos")}


@dataclass(frozen=True)
class DatasetSpec:
    name: str  # label in results: random, nl-id, nl-ood, privacy, or your own
    path: str | None = None  # a built dataset Parquet file
    build: dict[str, Any] | None = (
        None  # or a build spec: dataset, lengths, per_length, seed, source
    )


@dataclass(frozen=True)
class Job:
    sweep: str
    model: ModelSpec
    dataset: DatasetSpec
    algorithm: str
    variant: str  # algorithm label with its grid values
    params: dict[str, Any]  # the full, validated algorithm config (preset and defaults applied)
    objective: dict[str, Any]
    length: str  # "fixed" (the true length), "auto", or an assumed length ("3")
    max_length: int
    samples_per_length: int | None
    limit: int | None
    shard_size: int
    # A dataset file's `sodaray.dataset.hash`, set when planning: its rows decide results, not
    # its path (a file rebuilt in place with other rows makes a new job).
    dataset_hash: str | None = None

    def config(self) -> dict[str, Any]:
        """Everything that decides this job's results (hashed into its folder name)."""
        return {
            "model": self.model.identity(),
            "dataset": asdict(self.dataset)
            if self.dataset_hash is None
            else {"name": self.dataset.name, "hash": self.dataset_hash},
            "algorithm": self.algorithm,
            "params": self.params,
            "objective": self.objective,
            "length": self.length,
            "max_length": self.max_length,
            "samples_per_length": self.samples_per_length,
            "limit": self.limit,
            "shard_size": self.shard_size,
        }

    @property
    def config_hash(self) -> str:
        return config_hash(self.config())

    @property
    def name(self) -> str:
        obj = self.objective
        if obj["kind"] == "text":
            what = f"text{obj['output_tokens']}"
        else:
            what = (
                "all" if obj["top_k"] is None else f"top{obj['top_k']}"
            ) + f"x{obj['output_tokens']}"
        if obj.get("space", "raw") != "raw":
            what += f"-{obj['space']}"
        if obj["fluency_weight"]:
            what += f"-flu{obj['fluency_weight']:g}"
        parts = [self.model.label, self.dataset.name, self.variant, what, f"s{self.params['seed']}"]
        if self.length.isdigit():
            parts.append(f"L{self.length}")
        slug = re.sub(r"[^A-Za-z0-9_.=+-]+", "-", "_".join(parts)).strip("-")
        return f"{slug}-{self.config_hash[:8]}"


@dataclass
class Sweep:
    name: str
    path: Path
    description: str = ""
    models: list[ModelSpec] = field(default_factory=list)
    datasets: list[DatasetSpec] = field(default_factory=list)
    algorithms: list[dict[str, Any]] = field(default_factory=list)
    objectives: list[dict[str, Any]] = field(default_factory=list)
    steps: int = 2000
    seeds: list[int] = field(default_factory=lambda: [0])
    samples_per_length: int | None = None
    shard_size: int = 100
    length: str = "fixed"
    max_length: int = 10
    # Assumed lengths: each one a job searching every sample at that length, whatever its true
    # length (the paper's length table; `length: [1, 2, 3]` in the file).
    assumed_lengths: list[int] = field(default_factory=list)

    def quick(self, steps: int | None) -> Sweep:
        """This sweep as a quick look: named NAME-quick (its own results folder) and, with
        `steps`, every step budget capped at it."""
        entries = [
            {**e, "steps": min(int(e.get("steps", self.steps)), steps)} if steps else e
            for e in self.algorithms
        ]
        return dataclasses.replace(
            self,
            name=f"{self.name}-quick",
            algorithms=entries,
            steps=min(self.steps, steps) if steps else self.steps,
        )

    def length_modes(self) -> list[str]:
        return [str(n) for n in self.assumed_lengths] or [self.length]

    def jobs(self, *, limit: int | None = None, model: str | None = None) -> list[Job]:
        """The cartesian product. `model` replaces the file's models (one replica, its
        resources from the first model entry); `limit` caps samples per job."""
        models = self.models
        if model is not None:
            models = [self.models[0].with_id(model)]
        jobs = []
        for m, ds, (algo, variant, params, steps), obj, seed, length in itertools.product(
            models,
            self.datasets,
            self._variants(),
            self._objectives(),
            self.seeds,
            self.length_modes(),
        ):
            config = self._algorithm_config(algo, params, m, seed, steps)
            jobs.append(
                Job(
                    self.name,
                    m,
                    ds,
                    algo,
                    variant,
                    config,
                    obj,
                    length,
                    self.max_length,
                    self.samples_per_length,
                    limit,
                    self.shard_size,
                )
            )
        return jobs

    # ---- expansion --------------------------------------------------------------------------
    def _variants(self) -> list[tuple[str, str, dict[str, Any], int]]:
        out = []
        for entry in self.algorithms:
            for values in _grid(entry.get("grid") or {}):
                label = entry.get("label") or entry["name"]
                if values:
                    label += "-" + "-".join(f"{k}={_short(v)}" for k, v in values.items())
                params = {**(entry.get("params") or {}), **values}
                out.append((entry["name"], label, params, entry.get("steps", self.steps)))
        return out

    def _objectives(self) -> list[dict[str, Any]]:
        out = []
        for entry in self.objectives:
            base = {k: v for k, v in entry.items() if k != "grid"}
            for values in _grid(entry.get("grid") or {}):
                out.append(asdict(Objective(**{**base, **values})))
        return out

    def _algorithm_config(
        self, algo: str, params: dict[str, Any], model: ModelSpec, seed: int, steps: int
    ) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        if algo == "soda" and model.preset:
            merged.update(get_preset(model.preset).soda)
        if algo == "soda" and model.preset_file:
            merged.update(load_preset_file(model.preset_file))
        merged.update(params)
        merged.update(max_steps=steps, seed=seed)
        return make_config(algo, merged).to_dict()


def _short(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _grid(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    keys = list(grid)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*grid.values())]


# ---- loading and validation -------------------------------------------------------------------
TOP_KEYS = {f.name for f in fields(Sweep)} - {"path", "assumed_lengths"}
MODEL_KEYS = {f.name for f in fields(ModelSpec)}
DATASET_KEYS = {f.name for f in fields(DatasetSpec)}
BUILD_KEYS = {"dataset", "lengths", "per_length", "seed", "source", "vocab", "records"}
ALGORITHM_KEYS = {"name", "label", "params", "grid", "steps"}  # steps: this entry's budget
OBJECTIVE_KEYS = {f.name for f in fields(Objective)} | {"grid"}


def read_config_file(path: str | Path, kind: str, error: type[ValueError]) -> tuple[Any, Path]:
    """A YAML config file's data (safe_load), with one-line errors naming the file."""
    path = Path(path)
    if not path.is_file():
        raise error(f"{path}: no such {kind} file")
    try:
        data = yaml_load(path.read_text(encoding="utf-8"))  # YAML 1.2 numbers: 1e-3 a float
    except yaml.YAMLError as exc:
        raise error(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from exc
    return data, path


def check_name(data: dict[str, Any], fail) -> str:
    name = data["name"]
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise fail("name", f"use letters, digits, '.', '_' or '-', not {name!r}")
    return name


def load_sweep(path: str | Path, model: str | None = None) -> Sweep:
    """Read and validate a sweep file; every job it makes is checked before returning. `model`
    (`--model`) replaces every entry's model before the check, so a file whose own model path
    does not exist here (a relative path, another machine's folder) still runs on `model`."""
    return parse_sweep(*read_config_file(path, "sweep", SweepError), model=model)


def parse_sweep(data: Any, path: Path, model: str | None = None) -> Sweep:
    def fail(where: str, message: str) -> SweepError:
        return SweepError(f"{path}: {where}: {message}")

    if not isinstance(data, dict):
        raise SweepError(f"{path}: a sweep file is a mapping of fields")
    _known(data, TOP_KEYS, "", fail)
    for required in ("name", "models", "datasets", "algorithms"):
        if required not in data:
            raise fail(required, "required field missing")
    name = check_name(data, fail)

    models = []
    for i, entry in enumerate(_entries(data, "models", fail)):
        where = f"models[{i}]"
        _known(entry, MODEL_KEYS, where, fail)
        if "id" not in entry:
            raise fail(f"{where}.id", "required field missing")
        try:
            spec = ModelSpec(**coerce_fields(ModelSpec, entry))  # num_gpus: .nan refused
        except (TypeError, ValueError) as exc:
            raise fail(where, str(exc)) from exc
        if model is not None:
            spec = spec.with_id(model)
            where = f"--model (for {where})"
        check_model(spec, where, fail)
        models.append(spec)

    datasets = []
    for i, entry in enumerate(_entries(data, "datasets", fail)):
        where = f"datasets[{i}]"
        _known(entry, DATASET_KEYS, where, fail)
        datasets.append(check_dataset(DatasetSpec(**entry), where, fail))

    algorithms = []
    for i, entry in enumerate(_entries(data, "algorithms", fail)):
        where = f"algorithms[{i}]"
        _known(entry, ALGORITHM_KEYS, where, fail)
        if entry.get("name") not in ALGORITHMS:
            raise fail(
                f"{where}.name",
                f"unknown algorithm {entry.get('name')!r} (choose {', '.join(ALGORITHMS)})",
            )
        for key in ("params", "grid"):
            if not isinstance(entry.get(key) or {}, dict):
                raise fail(f"{where}.{key}", "must be a mapping")
        for key in ("max_steps", "seed"):
            if key in (entry.get("params") or {}) or key in (entry.get("grid") or {}):
                raise fail(f"{where}.params.{key}", "set it with the sweep's `steps` / `seeds`")
        _check_grid(entry.get("grid") or {}, f"{where}.grid", fail)
        if "steps" in entry:
            _check_positive(entry["steps"], f"{where}.steps", fail)
        algorithms.append(entry)

    objectives = []
    for i, entry in enumerate(data.get("objectives") or [{"kind": "logits"}]):
        where = f"objectives[{i}]"
        if not isinstance(entry, dict):
            raise fail(where, "must be a mapping")
        _known(entry, OBJECTIVE_KEYS, where, fail)
        _check_grid(entry.get("grid") or {}, f"{where}.grid", fail)
        entry = _coerce_objective(entry, where, fail)
        objectives.append(entry)

    assumed: list[int] = []
    if isinstance(data.get("length"), (int, list)) and not isinstance(data["length"], bool):
        # An int or a list of ints: assumed lengths, each its own job (a wrong length allowed).
        assumed = data["length"] if isinstance(data["length"], list) else [data["length"]]
        for n in assumed:
            _check_positive(n, "length", fail)
        if len(set(assumed)) != len(assumed):
            raise fail("length", f"assumed lengths repeat: {assumed}")
        data = {k: v for k, v in data.items() if k != "length"}
    scalars = {
        k: data[k]
        for k in (
            "description",
            "steps",
            "samples_per_length",
            "shard_size",
            "length",
            "max_length",
        )
        if k in data
    }
    scalars = coerce_scalars(Sweep, scalars, fail)  # steps: 1e3 is 1000
    sweep = Sweep(
        name=name,
        path=path,
        models=models,
        datasets=datasets,
        algorithms=algorithms,
        objectives=objectives,
        assumed_lengths=list(assumed),
        **scalars,
    )
    if "seeds" in data:
        seeds = data["seeds"]
        seeds = [seeds] if isinstance(seeds, int) else seeds
        if not (isinstance(seeds, list) and seeds and all(isinstance(s, int) for s in seeds)):
            raise fail("seeds", "a list of integers")
        sweep.seeds = seeds
    _check_positive(sweep.steps, "steps", fail)
    _check_positive(sweep.shard_size, "shard_size", fail)
    _check_positive(sweep.max_length, "max_length", fail)
    if sweep.samples_per_length is not None:
        _check_positive(sweep.samples_per_length, "samples_per_length", fail)
    if sweep.length not in ("fixed", "auto"):
        raise fail(
            "length", f"'fixed', 'auto' or assumed lengths (N or [N, ...]), not {sweep.length!r}"
        )

    # Expand once so every algorithm parameter and objective value is checked now.
    for i, entry in enumerate(objectives):
        base = {k: v for k, v in entry.items() if k != "grid"}
        for values in _grid(entry.get("grid") or {}):
            try:
                make_objective({**base, **values})  # with finite, non-negative tolerances
            except (TypeError, ValueError) as exc:
                raise fail(f"objectives[{i}]", str(exc)) from exc
    for i, entry in enumerate(algorithms):
        for values in _grid(entry.get("grid") or {}):
            for m in models:
                try:
                    sweep._algorithm_config(
                        entry["name"],
                        {**(entry.get("params") or {}), **values},
                        m,
                        sweep.seeds[0],
                        entry.get("steps", sweep.steps),
                    )
                except (TypeError, ValueError) as exc:
                    message = str(exc).removeprefix("config: ")
                    raise fail(f"algorithms[{i}]", message) from exc
    return sweep


def coerce_scalars(cls: type, values: dict[str, Any], fail) -> dict[str, Any]:
    """Top-level fields by `cls`'s field types, each error naming its field."""
    out = {}
    for key, value in values.items():
        try:
            out[key] = coerce_fields(cls, {key: value})[key]
        except ValueError as exc:
            raise fail(key, str(exc).removeprefix(f"{key} ")) from exc
    return out


def _coerce_objective(entry: dict[str, Any], where: str, fail) -> dict[str, Any]:
    """Objective fields (and their grid values) as the field types say; NaN refused."""
    try:
        out = coerce_fields(Objective, {k: v for k, v in entry.items() if k != "grid"})
        if entry.get("grid"):
            out["grid"] = {
                k: [coerce_fields(Objective, {k: v})[k] for v in values]
                for k, values in entry["grid"].items()
            }
    except ValueError as exc:
        raise fail(where, str(exc)) from exc
    return out


def _entries(data: dict, key: str, fail) -> list[dict[str, Any]]:
    entries = data[key]
    if not isinstance(entries, list) or not entries:
        raise fail(key, "a non-empty list")
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise fail(f"{key}[{i}]", "must be a mapping")
    return entries


def _known(entry: dict, known: set[str], where: str, fail) -> None:
    unknown = sorted(set(entry) - known)
    if unknown:
        prefix = f"{where}." if where else ""
        raise fail(f"{prefix}{unknown[0]}", f"unknown field (known: {', '.join(sorted(known))})")


def _check_grid(grid: dict, where: str, fail) -> None:
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise fail(f"{where}.{key}", "a grid entry is a non-empty list of values")


def _check_positive(value: Any, where: str, fail) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise fail(where, f"a positive integer, not {value!r}")


def check_model(spec: ModelSpec, where: str, fail) -> None:
    looks_local = spec.id.startswith(("/", "./", "../", "~")) or spec.id.endswith(".gguf")
    if looks_local and not Path(spec.id).expanduser().exists():
        raise fail(f"{where}.id", f"no such model folder or file: {spec.id}")
    if spec.preset is not None and spec.preset not in PRESETS:
        raise fail(
            f"{where}.preset", f"unknown preset {spec.preset!r} (choose {', '.join(PRESETS)})"
        )
    if spec.preset is not None and spec.preset_file is not None:
        raise fail(where, "give `preset` or `preset_file`, not both")
    if spec.preset_file is not None:
        try:
            load_preset_file(spec.preset_file)
        except (OSError, ValueError) as exc:
            raise fail(f"{where}.preset_file", str(exc)) from exc
    if spec.dtype not in ("float32", "bfloat16"):
        raise fail(f"{where}.dtype", f"float32 or bfloat16, not {spec.dtype!r}")
    if not isinstance(spec.num_gpus, (int, float)) or spec.num_gpus < 0:
        raise fail(f"{where}.num_gpus", f"a non-negative number, not {spec.num_gpus!r}")
    if not isinstance(spec.num_cpus, (int, float)) or spec.num_cpus <= 0:
        raise fail(f"{where}.num_cpus", f"a positive number, not {spec.num_cpus!r}")
    _check_positive(spec.replicas, f"{where}.replicas", fail)


def check_dataset(spec: DatasetSpec, where: str, fail) -> DatasetSpec:
    if not spec.name:
        raise fail(f"{where}.name", "required field missing")
    if (spec.path is None) == (spec.build is None):
        raise fail(where, "give exactly one of `path` (a built dataset) or `build` (a spec)")
    if spec.path is not None and not Path(spec.path).expanduser().is_file():
        raise fail(
            f"{where}.path",
            f"no such dataset file: {spec.path} "
            "(build it with `sodaray data build`, or give a `build` spec)",
        )
    if spec.build is not None:
        if not isinstance(spec.build, dict):
            raise fail(f"{where}.build", "must be a mapping")
        _known(spec.build, BUILD_KEYS, f"{where}.build", fail)
        from sodaray.data import DATASETS, parse_lengths
        from sodaray.data.build import VOCABS

        kind = spec.build.get("dataset", spec.name)
        if kind == "random":
            # Written out so the job hash and the dataset cache key say which vocabulary the ids
            # came from (files built before the option drew from the padded vocab_size).
            vocab = spec.build.get("vocab", "tokenizer")
            if vocab not in VOCABS:
                raise fail(f"{where}.build.vocab", f"{' or '.join(VOCABS)}, not {vocab!r}")
            spec = DatasetSpec(spec.name, spec.path, {**spec.build, "vocab": vocab})
        if kind == "privacy":
            # Written out, as `vocab` above: sets built before the option took prefixes.
            records = spec.build.get("records", "whole")
            if records not in ("whole", "prefix"):
                raise fail(f"{where}.build.records", f"whole or prefix, not {records!r}")
            spec = DatasetSpec(spec.name, spec.path, {**spec.build, "records": records})
        if kind not in DATASETS:
            raise fail(
                f"{where}.build.dataset", f"unknown dataset {kind!r} (choose {', '.join(DATASETS)})"
            )
        if "lengths" in spec.build:
            try:
                parse_lengths(str(spec.build["lengths"]))
            except ValueError as exc:
                raise fail(f"{where}.build.lengths", str(exc)) from exc
        for key in ("per_length", "seed"):
            value = spec.build.get(key, 1)
            if not isinstance(value, int) or value < (1 if key == "per_length" else 0):
                raise fail(
                    f"{where}.build.{key}",
                    f"a {'positive' if key == 'per_length' else 'non-negative'} integer, "
                    f"not {value!r}",
                )
    return spec
