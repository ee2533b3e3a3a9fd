"""Entries shared by sweep and tuning files, parsed once into dataclasses.

A model entry (`ModelSpec`), a dataset entry (`DatasetSpec`), an objective mapping, and where a
model's preset, or its family's defaults (`model_defaults`), meets an algorithm's parameters
(`algorithm_config`) and an objective's fields (`objective_config`). Every check raises through
the `fail(where, message)` of `failer`: one line naming the file and the field.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from sodaray.api import make_config
from sodaray.config import families
from sodaray.config.fields import (
    Fail,
    check_grid,
    coerce_scalars,
    failer,
    grid,
    known_fields,
    path_name,
)
from sodaray.config.presets import PRESETS, load_preset_file, load_preset_objective
from sodaray.config.validation import AT_LEAST_1, coerce_fields, make_objective
from sodaray.errors import first_line
from sodaray.io.files import check_model_files, regular_file
from sodaray.io.paths import brief, expand_path, in_file, local_path, looked_for, same_spelling
from sodaray.objective.objectives import Objective
from sodaray.search.engine.base import SearchConfig


class SpecError(ValueError):
    """An invalid experiment file: the message names the file and the field."""

    kind = "experiment"


class SweepError(SpecError):
    """An invalid sweep file."""

    kind = "sweep"


class TuningError(SpecError):
    """An invalid tuning file."""

    kind = "tuning"


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
    # per length; results are the same bit for bit either way (see `sodaray.search.engine.passes`).
    mix_lengths: bool = True
    # How each replica runs a SODA step (`sodaray.search.engine.executor`): captured once per shape
    # and replayed as a CUDA graph on a GPU ("graph", the default; eagerly on a CPU), or eager.
    executor: Literal["eager", "graph"] = "graph"
    # Sweeps only: the dataset entries (by name) this model runs on; empty: every one.
    datasets: list[str] = field(default_factory=list, hash=False)
    # Not file fields. `source`: the absolute path actors load a local model from (`resolved()`:
    # another node's working directory differs; `id`, which job hashes carry, stays as given).
    # `base`: the folder relative paths are read from (`in_file`; None: the current directory).
    source: str | None = None
    base: str | None = field(default=None, compare=False)

    @functools.cached_property  # frozen: asked for every job of a plan
    def label(self) -> str:
        # The last part as `same_spelling` writes it: `m/`, `m/.` and `x/../m` are labelled `m`.
        named = Path(os.path.normpath(self.gguf_file or self.id)).name
        return self.name or named.removesuffix(".gguf")

    @property
    def location(self) -> str:
        """Where the model is loaded from here: `id` with `~` and environment variables
        (`$SODARAY_REAL_MODELS/qwen/model.gguf`) expanded, a relative path read from the folder
        of the file that names it (`in_file`); a hub id as it is."""
        return in_file(self.id, self.base) if self.is_local() else expand_path(self.id)

    @property
    def preset_location(self) -> str | None:
        """Where `preset_file` is read from (by the same rule as `id`); None without one."""
        return in_file(self.preset_file, self.base) if self.preset_file else None

    def with_id(self, model: str) -> ModelSpec:
        """Another model (`--model`) on this entry's resources and dtype; presets dropped, so
        it gets its own family's defaults (`model_defaults`)."""
        kept = ("num_gpus", "num_cpus", "replicas", "dtype", "mix_lengths", "executor")
        return ModelSpec(id=model, **{k: getattr(self, k) for k in kept})

    def resolved(self) -> ModelSpec:
        """This entry as it crosses to Ray actors, resolved here on the driver, where its paths
        were checked: `source` the model's absolute path, `preset_file` absolute (hub ids and
        preset names stay as they are)."""
        return replace(
            self,
            source=local_path(self.location),
            preset_file=local_path(self.preset_location) or self.preset_file,
        )

    def load_here(self, where: str | None = None, **options: Any) -> Any:
        """The model, loaded in this process from `where` (default: its `location`) with the
        entry's options and `options` (`device`: default CUDA when there is one, else CPU)."""
        from sodaray.model.load import load_model

        return load_model(
            where or self.location,
            gguf_file=self.gguf_file,
            dtype=self.dtype,
            bos=self.bos,
            trust_remote_code=self.trust_remote_code,
            **options,
        )

    def request(self) -> tuple[str, float, float]:
        """What one replica asks Ray for, as the resource checks take it: (label, CPUs, GPUs)."""
        return (f"model {self.label}", self.num_cpus, self.num_gpus)

    def weights(self) -> dict[str, Any]:
        """Which model this is, as what it computes from (a dataset built for its tokenizer
        depends on this and nothing else). A local path by one spelling (`same_spelling`): `m/`
        and `./m` are the model `m` is; a hub id as written."""
        out = {k: getattr(self, k) for k in ("id", "gguf_file", "dtype", "bos")}
        if self.is_local():
            out["id"] = same_spelling(self.id, self.base)
        if self.gguf_file:
            out["gguf_file"] = same_spelling(self.gguf_file, self.location)
        return out

    def is_local(self) -> bool:
        """Whether `id` names a local folder or file (written as a path, or one that exists)
        rather than a hub id."""
        try:
            return looks_local(self.id) or os.path.exists(in_file(self.id, self.base))
        except ValueError:  # an unset variable: not a hub id either
            return True

    def identity(self) -> dict[str, Any]:
        """What decides results (resources do not). The executor only where it is not the
        default: on a GPU a replayed step may round otherwise than an eager one, and on a CPU the
        two are the same step (jobs from before it existed keep their hashes)."""
        executor = {} if self.executor == "graph" else {"executor": self.executor}
        return {**self.weights(), **executor}


@dataclass(frozen=True)
class DatasetSpec:
    name: str  # label in results: random, nl-id, nl-ood, privacy, or your own
    path: str | None = None  # a built dataset Parquet file
    build: dict[str, Any] | None = None  # or a build spec: dataset, lengths, per_length, seed, ...
    # Not a file field: the folder `path` and a build's `source` are read from (as ModelSpec's).
    base: str | None = field(default=None, compare=False)

    @property
    def location(self) -> str | None:
        """Where the dataset file is read from here (`in_file`); None for a build spec."""
        return None if self.path is None else in_file(self.path, self.base)

    def source_location(self) -> str | None:
        """A build's `source` where it is read from: a file by the rule for paths, the hub
        (`hf`) and `synthetic` as they are, None without one."""
        source = (self.build or {}).get("source")
        if not isinstance(source, str) or source in SOURCE_KEYWORDS:
            return source
        return in_file(source, self.base)

    def identity(self) -> dict[str, Any]:
        """What the entry says (not its folder), its paths by one spelling (`same_spelling`)."""
        build = self.build
        source = (build or {}).get("source")
        if isinstance(source, str) and source not in SOURCE_KEYWORDS:
            build = {**build, "source": same_spelling(source, self.base)}
        path = self.path if self.path is None else same_spelling(self.path, self.base)
        return {"name": self.name, "path": path, "build": build}


SOURCE_KEYWORDS = ("hf", "synthetic")  # a build `source` that names no file


def places(model: ModelSpec, dataset: DatasetSpec) -> dict[str, str]:
    """Where a model and a dataset's files lie on this machine, links and `..` resolved: the
    model (a local one), the dataset file, a build's source file ({}: a hub model, a built
    set). What tells two spellings of one run apart from two runs where a path's spelling
    (relative, absolute, through a link) differs: not hashed, compared."""
    found: dict[str, str] = {}
    with contextlib.suppress(OSError, ValueError):
        if model.is_local():
            found["model"] = os.path.realpath(model.location)
        if dataset.location is not None and os.path.isfile(dataset.location):
            found["path"] = os.path.realpath(dataset.location)
        source = dataset.source_location()  # None without a build
        if source is not None and os.path.isfile(source):
            found["source"] = os.path.realpath(source)
    return found


def looks_local(model_id: str) -> bool:
    """Whether a model id is written as a path (`./x`, `../x`, `/x`, `~`, `$VAR/x`, `x.gguf`)
    rather than a hub id; a bare `org/name` is local only where such a folder exists."""
    return model_id.startswith(("/", "./", "../", "~", "$")) or model_id.endswith(".gguf")


MODEL_KEYS = {f.name for f in fields(ModelSpec)} - {"source", "base"}
DATASET_KEYS = {f.name for f in fields(DatasetSpec)} - {"base"}
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
    name = path_name(name, "name", fail)
    if name.startswith((".", "_")):  # the rows' folder: readers would pass over it as hidden
        raise fail(
            "name",
            f"must not start with '.' or '_' ({name!r}): readers (pyarrow, DuckDB) take such "
            "a folder for hidden and would not read its rows",
        )
    return fail, name


@contextlib.contextmanager
def _failing(fail: Fail, where: str, errors: Any = ValueError) -> Iterator[None]:
    """An error of the block (`errors`) raised again as `fail(where, its message)`."""
    try:
        yield
    except errors as exc:
        raise fail(where, str(exc)) from exc


def model_defaults(model: ModelSpec) -> families.Defaults | None:
    """The defaults of a model entry that names no preset: its family's, by the `model_type`
    its config gives, read on the driver from the model's files (`sodaray.config.families`; weights
    never loaded). None when the entry names a preset, which is then used alone."""
    if model.preset is not None or model.preset_file is not None:
        return None
    try:
        return families.defaults_for(families.model_type_of(model.location, model.gguf_file))
    except ValueError as exc:
        raise ValueError(f"model {model.label}: {first_line(exc)}") from exc


def algorithm_config(
    algorithm: str,
    params: dict[str, Any],
    model: ModelSpec,
    *,
    seed: int,
    steps: int,
    defaults: bool = True,
    base: dict[str, Any] | None = None,
) -> SearchConfig:
    """The one place presets are applied: the model entry's preset, or with none its family's
    (`model_defaults`), then the entry's own parameters, then the file's step budget and seed;
    validated. `defaults=False` leaves the family out (a file's own values are checked before
    any model file is read). `base`: `preset_base(algorithm, model, defaults)`, made already."""
    base = preset_base(algorithm, model, defaults) if base is None else base
    return make_config(algorithm, {**base, **params, "max_steps": steps, "seed": seed})


def preset_base(algorithm: str, model: ModelSpec, defaults: bool = True) -> dict[str, Any]:
    """What `algorithm_config` starts from for `model`: its preset's values, or its family's."""
    family = model_defaults(model) if defaults else None
    return families.starting_params(algorithm, family, model.preset, model.preset_location)


def objective_config(
    entry: dict[str, Any], model: ModelSpec, *, defaults: bool = True
) -> Objective:
    """The one place a preset's objective settings are applied: the model entry's preset file's
    `objective:` (e.g. `space: centred`), or with no preset its family's space (`defaults`, as
    in `algorithm_config`), then the objective entry's own fields, which win; validated."""
    family = model_defaults(model) if defaults else None
    start = families.starting_objective(entry, family, model.preset_location)
    return make_objective({**start, **entry})


def parse_model(
    entry: Any, where: str, fail: Fail, model: str | None = None, base: Path | None = None
) -> ModelSpec:
    """A model entry (a mapping, or a bare id) of a file in the folder `base`; `model`
    (`--model`, read from the current directory) replaces its id first."""
    if isinstance(entry, str):
        entry = {"id": entry}
    if not isinstance(entry, dict):
        raise fail(where, "a mapping with an `id` (hub id, folder or .gguf)")
    known_fields(entry, MODEL_KEYS, where, fail)
    if "id" not in entry:
        raise fail(f"{where}.id", "required field missing")
    spec = ModelSpec(**coerce_scalars(ModelSpec, entry, fail, where))  # num_gpus: .nan refused
    spec = replace(spec, base=None if base is None else str(base))
    if spec.name:
        path_name(spec.name, f"{where}.name", fail)  # it names the model's dataset files
    if model is not None:
        spec = spec.with_id(model)
        where = f"--model (for {where})"
    with _failing(fail, where):
        location, preset_file = spec.location, spec.preset_location
    if looks_local(spec.id) and not Path(location).exists():
        raise fail(f"{where}.id", f"no such model folder or file: {looked_for(spec.id, spec.base)}")
    with _failing(fail, f"{where}.id"):  # a folder without a model fails here, not on replicas
        check_model_files(location, spec.gguf_file)
    if spec.preset is not None and spec.preset not in PRESETS:
        choose = ", ".join(PRESETS)
        raise fail(f"{where}.preset", f"unknown preset {spec.preset!r} (choose {choose})")
    if spec.preset is not None and spec.preset_file is not None:
        raise fail(where, "give `preset` or `preset_file`, not both")
    if preset_file:
        if not Path(preset_file).is_file():
            shown = looked_for(str(spec.preset_file), spec.base)
            raise fail(f"{where}.preset_file", f"no such preset file: {shown}")
        with _failing(fail, f"{where}.preset_file", (OSError, ValueError)):
            check_preset_params(load_preset_file(preset_file), preset_file)
            load_preset_objective(preset_file)
    return spec


def parse_dataset(
    entry: Any, where: str, fail: Fail, default_name: str = "", base: Path | None = None
) -> DatasetSpec:
    """A dataset entry of a file in the folder `base` (its relative paths are read from it)."""
    if not isinstance(entry, dict):
        raise fail(where, "a mapping: `path` to a built dataset, or `build` (a spec)")
    known_fields(entry, DATASET_KEYS, where, fail)
    spec = DatasetSpec(**{"name": default_name, **entry}, base=None if base is None else str(base))
    if spec.name == "":
        raise fail(f"{where}.name", "required field missing")
    path_name(spec.name, f"{where}.name", fail)  # it names the dataset's cache file
    if (spec.path is None) == (spec.build is None):
        raise fail(where, "give exactly one of `path` (a built dataset) or `build` (a spec)")
    if spec.path is not None and not isinstance(spec.path, str):
        raise fail(f"{where}.path", f"a file name, not {brief(spec.path)}")
    with _failing(fail, f"{where}.path"):
        location = spec.location
    if location is not None and not Path(location).exists():
        raise fail(
            f"{where}.path",
            f"no such dataset file: {looked_for(spec.path or '', spec.base)} "
            "(build it with `sodaray data build`, or give a `build` spec)",
        )
    if location is not None:
        with _failing(fail, f"{where}.path"):  # a directory or a FIFO: say what it is
            regular_file(location, "dataset file")
    if spec.build is not None:
        if not isinstance(spec.build, dict):
            raise fail(f"{where}.build", "must be a mapping")
        from sodaray.data.build import BUILD_KEYS, BuildSpecError, check_build_spec

        known_fields(spec.build, BUILD_KEYS, f"{where}.build", fail)
        try:
            spec = replace(spec, build=check_build_spec(spec.build, spec.name))
            source = spec.source_location()
        except BuildSpecError as exc:
            raise fail(f"{where}.build.{exc.key}", str(exc)) from exc
        except ValueError as exc:  # an unset environment variable
            raise fail(f"{where}.build.source", str(exc)) from exc
        if source is not None and not isinstance(source, str):
            raise fail(f"{where}.build.source", f"a file, hf or synthetic, not {brief(source)}")
        if source not in (None, *SOURCE_KEYWORDS) and not Path(source).is_file():
            shown = looked_for(spec.build["source"], spec.base)
            raise fail(f"{where}.build.source", f"no such source file: {shown}")
    return spec


def parse_objective(entry: Any, where: str, fail: Fail) -> dict[str, Any]:
    """An objective mapping (with an optional `grid` of values), coerced by field type; every
    combination it expands to is checked."""
    if not isinstance(entry, dict):
        raise fail(where, "a mapping of objective fields")
    known_fields(entry, OBJECTIVE_KEYS, where, fail)
    check_grid(entry.get("grid") or {}, f"{where}.grid", fail)
    with _failing(fail, where):  # by field type, grid values too; NaN refused
        out = coerce_fields(Objective, {k: v for k, v in entry.items() if k != "grid"})
        if entry.get("grid"):
            out["grid"] = {
                k: [coerce_fields(Objective, {k: v})[k] for v in values]
                for k, values in entry["grid"].items()
            }
    for objective in expand_objective(out):
        with _failing(fail, where, (TypeError, ValueError)):
            make_objective(objective)  # with finite, non-negative tolerances
    return out


def expand_objective(entry: dict[str, Any]) -> list[dict[str, Any]]:
    base = {k: v for k, v in entry.items() if k != "grid"}
    return [{**base, **values} for values in grid(entry.get("grid") or {})]


def check_preset_params(params: dict[str, Any], path: str | Path) -> None:
    """Every key of a preset file's parameters a SODA parameter (values are checked where they
    are applied), else one line naming the file: a sweep or tuning file given as a preset was
    refused later, by a message that named no file."""
    from sodaray.search.soda.config import SodaConfig

    known = {f.name for f in fields(SodaConfig)} | set(SodaConfig.RENAMED)
    unknown = [k for k in params if k not in known]
    if unknown:
        raise ValueError(
            f"{path}: {brief(unknown[0])} is not a SODA parameter (a preset file holds SODA's "
            "parameters, flat or under `soda:`; not a sweep or tuning file)"
        )
