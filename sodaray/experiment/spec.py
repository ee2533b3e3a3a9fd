"""Entries shared by sweep and tuning files, parsed once into dataclasses.

A model entry (`ModelSpec`), a dataset entry (`DatasetSpec`), an objective mapping, and the one
place a model's preset meets an algorithm entry's parameters (`algorithm_config`). Every check
raises through a `fail(where, message)` the caller makes with `failer`, so an error is one line
naming the file and the field, whichever file kind it came from.
"""

from __future__ import annotations

import itertools
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from sodaray.api import make_config
from sodaray.objectives import Objective
from sodaray.paths import brief, component
from sodaray.presets import PRESETS, load_preset_file, preset_params
from sodaray.search.base import SearchConfig
from sodaray.validation import AT_LEAST_1, coerce_fields, make_objective

Fail = Callable[[str, str], ValueError]


class SpecError(ValueError):
    """An invalid experiment file: the message names the file and the field."""

    kind = "experiment"


class SweepError(SpecError):
    """An invalid sweep file."""

    kind = "sweep"


class TuningError(SpecError):
    """An invalid tuning file."""

    kind = "tuning"


def failer(path: Path, error: type[SpecError]) -> Fail:
    """`fail(where, message)`: the one-line error for a field of the file at `path`."""
    return lambda where, message: error(f"{path}: {where}: {message}")


@dataclass(frozen=True)
class ModelSpec:
    id: str  # hub id, local folder, or .gguf file
    name: str = ""  # label in job names and results (default: the id's last part)
    preset: str | None = None  # paper preset for SODA's parameters on this model
    preset_file: str | None = None  # or a preset YAML (e.g. from `sodaray tune`)
    gguf_file: str | None = None
    dtype: Literal["float32", "bfloat16"] = "float32"
    bos: bool | None = None
    trust_remote_code: bool = False
    # Resources one replica needs (Ray places actors by them); fractional GPUs share a device.
    num_gpus: float = field(default=0.0, metadata={"min": 0})
    num_cpus: float = field(default=1.0, metadata={"above": 0})
    replicas: int = field(default=1, metadata=AT_LEAST_1)
    # Inputs of every length in one batch, split into passes by cost (the default), or a pass
    # per length; results are the same bit for bit either way (see `sodaray.search.passes`).
    mix_lengths: bool = True
    # Sweeps only: the dataset entries (by name) this model runs on; empty: every one.
    datasets: list[str] = field(default_factory=list, hash=False)
    # Not a file field: where actors load the model from, set on the driver by `resolved()` to
    # the absolute path of the local folder or file `id` names (None: a hub id). An actor on
    # another node runs in that node's working directory, where `../models/x` is another folder
    # or none; `id` itself stays as given, since job hashes and result rows carry it.
    source: str | None = None

    @property
    def label(self) -> str:
        return self.name or Path(self.gguf_file or self.id.rstrip("/")).name.removesuffix(".gguf")

    @property
    def location(self) -> str:
        """Where the model is loaded from here: `id` with `~` and environment variables
        (`$SODARAY_REAL_MODELS/qwen/model.gguf`) expanded; a hub id as it is."""
        return expand_path(self.id)

    def with_id(self, model: str) -> ModelSpec:
        """Another model (`--model`) on this entry's resources and dtype; presets dropped."""
        return ModelSpec(
            id=model,
            num_gpus=self.num_gpus,
            num_cpus=self.num_cpus,
            replicas=self.replicas,
            dtype=self.dtype,
            mix_lengths=self.mix_lengths,
        )

    def resolved(self) -> ModelSpec:
        """This entry as it crosses to Ray actors, resolved here on the driver, where its paths
        were checked: `source` the model's absolute path, `preset_file` absolute (hub ids and
        preset names stay as they are)."""
        return replace(
            self,
            source=local_path(self.id),
            preset_file=local_path(self.preset_file) or self.preset_file,
        )

    def request(self) -> tuple[str, float, float]:
        """What one replica asks Ray for, as the resource checks take it: (label, CPUs, GPUs)."""
        return (f"model {self.label}", self.num_cpus, self.num_gpus)

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


def expand_path(path: str) -> str:
    """`path` with `~` and `$NAME` / `${NAME}` expanded, so a file can name a model folder
    that lies elsewhere on each machine. An unset variable is an error, not a literal `$`."""
    expanded = os.path.expandvars(os.path.expanduser(path))
    unset = re.search(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", expanded)
    if unset:
        raise ValueError(f"environment variable {unset.group(1)} is not set (in {path})")
    return expanded


def local_path(path: str | None) -> str | None:
    """`path` as an absolute path when it names a file or folder here, else None (a hub id).
    Made absolute without following symlinks: a link that every node mounts stays that link."""
    if not path:
        return None
    expanded = expand_path(path)
    return os.path.abspath(expanded) if os.path.exists(expanded) else None


MODEL_KEYS = {f.name for f in fields(ModelSpec)} - {"source"}
DATASET_KEYS = {f.name for f in fields(DatasetSpec)}
BUILD_KEYS = {"dataset", "lengths", "per_length", "seed", "source", "vocab", "records"}
OBJECTIVE_KEYS = {f.name for f in fields(Objective)} | {"grid"}


def check_top(
    data: Any, path: Path, error: type[SpecError], known: set[str], required: tuple[str, ...]
) -> tuple[Fail, str]:
    """What every sweep and tuning file is checked for first: a mapping of known fields, the
    required ones present, a name usable as a folder. Returns the file's `fail` and its name."""
    fail = failer(path, error)
    if not isinstance(data, dict):
        raise error(f"{path}: a {error.kind} file is a mapping of fields")
    known_fields(data, known, "", fail)
    for field_ in required:
        if field_ not in data:
            raise fail(field_, "required field missing")
    name = data["name"]
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise fail("name", f"use letters, digits, '.', '_' or '-', not {brief(name)}")
    return fail, path_name(name, "name", fail)


def path_name(value: Any, where: str, fail: Fail) -> str:
    """A name from the file that becomes part of a path (`sodaray.paths.component`)."""
    try:
        return component(value, "it")
    except ValueError as exc:
        raise fail(where, str(exc).removeprefix("it ")) from exc


def coerce_scalars(cls: type, values: dict[str, Any], fail, where: str = "") -> dict[str, Any]:
    """Fields (of the entry at `where`; default: the file's top level) by `cls`'s field types
    and declared bounds, each error naming its field."""
    out, prefix = {}, f"{where}." if where else ""
    for key, value in values.items():
        try:
            out[key] = coerce_fields(cls, {key: value})[key]
        except ValueError as exc:
            raise fail(prefix + key, str(exc).removeprefix(f"{key} ")) from exc
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


def algorithm_config(
    algorithm: str, params: dict[str, Any], model: ModelSpec, *, seed: int, steps: int
) -> SearchConfig:
    """The one place presets are applied: the model entry's preset (SODA's knobs), then the
    entry's own parameters, then the file's step budget and seed; validated."""
    preset_file = model.preset_file and expand_path(model.preset_file)
    merged = {**preset_params(algorithm, model.preset, preset_file), **params}
    return make_config(algorithm, {**merged, "max_steps": steps, "seed": seed})


def parse_model(entry: Any, where: str, fail: Fail, model: str | None = None) -> ModelSpec:
    """A model entry (a mapping, or a bare id); `model` (`--model`) replaces its id first."""
    if isinstance(entry, str):
        entry = {"id": entry}
    if not isinstance(entry, dict):
        raise fail(where, "a mapping with an `id` (hub id, folder or .gguf)")
    known_fields(entry, MODEL_KEYS, where, fail)
    if "id" not in entry:
        raise fail(f"{where}.id", "required field missing")
    spec = ModelSpec(**coerce_scalars(ModelSpec, entry, fail, where))  # num_gpus: .nan refused
    if spec.name:
        path_name(spec.name, f"{where}.name", fail)  # it names the model's dataset files
    if model is not None:
        spec = spec.with_id(model)
        where = f"--model (for {where})"
    check_model(spec, where, fail)
    return spec


def parse_dataset(entry: Any, where: str, fail: Fail, default_name: str = "") -> DatasetSpec:
    if not isinstance(entry, dict):
        raise fail(where, "a mapping: `path` to a built dataset, or `build` (a spec)")
    known_fields(entry, DATASET_KEYS, where, fail)
    return check_dataset(DatasetSpec(**{"name": default_name, **entry}), where, fail)


def parse_objective(entry: Any, where: str, fail: Fail) -> dict[str, Any]:
    """An objective mapping (with an optional `grid` of values), coerced by field type; every
    combination it expands to is checked."""
    if not isinstance(entry, dict):
        raise fail(where, "a mapping of objective fields")
    known_fields(entry, OBJECTIVE_KEYS, where, fail)
    check_grid(entry.get("grid") or {}, f"{where}.grid", fail)
    entry = _coerce_objective(entry, where, fail)
    for objective in expand_objective(entry):
        try:
            make_objective(objective)  # with finite, non-negative tolerances
        except (TypeError, ValueError) as exc:
            raise fail(where, str(exc)) from exc
    return entry


def expand_objective(entry: dict[str, Any]) -> list[dict[str, Any]]:
    base = {k: v for k, v in entry.items() if k != "grid"}
    return [{**base, **values} for values in grid(entry.get("grid") or {})]


# Variants one grid may make, and jobs one sweep: counted before anything is built (a grid of
# nine ten-value keys is a 300-byte file and a billion variants).
MAX_VARIANTS = 10_000
MAX_JOBS = 100_000


def grid(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    keys = list(grid)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*grid.values())]


def grid_size(grid: dict[str, list[Any]]) -> int:
    """How many combinations `grid` makes, without making them."""
    return math.prod(len(values) for values in grid.values())


def entries(data: dict, key: str, fail) -> list[dict[str, Any]]:
    entries = data[key]
    if not isinstance(entries, list) or not entries:
        raise fail(key, "a non-empty list")
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise fail(f"{key}[{i}]", "must be a mapping")
    return entries


# Keys of older files -> their names now (one name per thing: the step budget is max_steps in
# files, configs and on the command line).
RENAMED_KEYS = {"steps": "max_steps"}


def known_fields(entry: dict, known: set[str], where: str, fail) -> None:
    prefix = f"{where}." if where else ""
    for old, new in RENAMED_KEYS.items():
        if old in entry and new in known:
            raise fail(f"{prefix}{old}", f"renamed: use `{new}`")
    unknown = sorted(map(str, set(entry) - known))
    if unknown:
        field_ = brief(unknown[0]).strip("'")
        raise fail(f"{prefix}{field_}", f"unknown field (known: {', '.join(sorted(known))})")


def check_grid(grid: Any, where: str, fail) -> None:
    if not isinstance(grid, dict):
        raise fail(where, f"a mapping of field to a list of values, not {brief(grid)}")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise fail(f"{where}.{brief(key)}", "a grid entry is a non-empty list of values")
    count = grid_size(grid)
    if count > MAX_VARIANTS:
        raise fail(where, f"a grid of {count:,} variants (at most {MAX_VARIANTS:,})")


def check_positive(value: Any, where: str, fail) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise fail(where, f"a positive integer, not {value!r}")


def check_model(spec: ModelSpec, where: str, fail) -> None:
    try:
        location = spec.location
        preset_file = spec.preset_file and expand_path(spec.preset_file)
    except ValueError as exc:
        raise fail(where, str(exc)) from exc
    looks_local = spec.id.startswith(("/", "./", "../", "~", "$")) or spec.id.endswith(".gguf")
    if looks_local and not Path(location).exists():
        shown = spec.id if location == spec.id else f"{spec.id} ({location})"
        raise fail(f"{where}.id", f"no such model folder or file: {shown}")
    if spec.preset is not None and spec.preset not in PRESETS:
        raise fail(
            f"{where}.preset", f"unknown preset {spec.preset!r} (choose {', '.join(PRESETS)})"
        )
    if spec.preset is not None and spec.preset_file is not None:
        raise fail(where, "give `preset` or `preset_file`, not both")
    if preset_file:
        try:
            load_preset_file(preset_file)
        except (OSError, ValueError) as exc:
            raise fail(f"{where}.preset_file", str(exc)) from exc


def check_dataset(spec: DatasetSpec, where: str, fail) -> DatasetSpec:
    if spec.name == "":
        raise fail(f"{where}.name", "required field missing")
    path_name(spec.name, f"{where}.name", fail)  # it names the dataset's cache file
    if (spec.path is None) == (spec.build is None):
        raise fail(where, "give exactly one of `path` (a built dataset) or `build` (a spec)")
    if spec.path is not None and not isinstance(spec.path, str):
        raise fail(f"{where}.path", f"a file name, not {brief(spec.path)}")
    try:
        location = expand_path(spec.path) if spec.path is not None else None
    except ValueError as exc:
        raise fail(f"{where}.path", str(exc)) from exc
    if location is not None and not Path(location).is_file():
        raise fail(
            f"{where}.path",
            f"no such dataset file: {spec.path} "
            "(build it with `sodaray data build`, or give a `build` spec)",
        )
    if spec.build is not None:
        if not isinstance(spec.build, dict):
            raise fail(f"{where}.build", "must be a mapping")
        known_fields(spec.build, BUILD_KEYS, f"{where}.build", fail)
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
