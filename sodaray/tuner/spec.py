"""Tuning files (`tuning/*.yaml`): a model, validation data, an algorithm, fixed parameters, the
search space, and how Optuna searches it. Validated on load: a bad field is a one-line
`TuningError` naming the file and the field."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from sodaray.api import ALGORITHMS
from sodaray.config.configfile import read_document
from sodaray.config.fields import coerce_scalars, known_fields
from sodaray.config.presets import PRESETS, preset_params
from sodaray.config.validation import AT_LEAST_1
from sodaray.experiment.spec import (
    DatasetSpec,
    ModelSpec,
    TuningError,
    algorithm_config,
    check_top,
    model_defaults,
    objective_config,
    parse_dataset,
    parse_model,
    parse_objective,
)
from sodaray.io.paths import in_file, looked_for
from sodaray.objective.objectives import Objective
from sodaray.search.engine.base import SearchConfig


@dataclass(frozen=True)
class ParamSpace:
    name: str
    type: Literal["float", "int", "categorical"]
    low: int | float | None = None  # int | float: an int bound stays an int (the study's hash)
    high: int | float | None = None
    log: bool = False
    step: int | float | None = field(default=None, metadata={"above": 0})
    choices: list[Any] | None = None

    def distribution(self):
        import optuna.distributions as d

        if self.type == "categorical":
            return d.CategoricalDistribution(self.choices)
        if self.type == "int":
            step = int(self.step or 1)
            return d.IntDistribution(int(self.low), int(self.high), log=self.log, step=step)
        return d.FloatDistribution(float(self.low), float(self.high), log=self.log, step=self.step)

    def holds(self, value: Any) -> bool:
        """Whether the study can sample `value`: one of the choices, or in the range and on its
        step."""
        if self.type == "categorical":
            return value in (self.choices or [])
        if not self.low <= value <= self.high:
            return False
        off = value - self.low
        return self.step is None or abs(round(off / self.step) * self.step - off) < 1e-9

    def describe(self) -> dict[str, Any]:
        """The range as the study samples it, for a reader (`tune --dry-run`)."""
        if self.type == "categorical":
            return {"type": self.type, "choices": list(self.choices or [])}
        step = self.step if self.type == "float" else int(self.step or 1)
        return dict(type=self.type, low=self.low, high=self.high, log=self.log, step=step)

    def grid_count(self) -> int:
        """How many values the grid sampler tries, counted without making them."""
        if self.type == "categorical":
            return len(self.choices or [])
        return int(round((self.high - self.low) / (self.step or 1))) + 1

    def grid_values(self) -> list[Any]:
        """The values the grid sampler tries (categorical choices, or low..high by step)."""
        if self.type == "categorical":
            return list(self.choices or [])
        count = self.grid_count()
        values = [self.low + i * (self.step or 1) for i in range(count)]
        return [int(v) for v in values] if self.type == "int" else [round(v, 12) for v in values]


@dataclass
class TuningSpec:
    name: str
    path: Path
    model: ModelSpec
    data: DatasetSpec
    algorithm: str = "soda"
    objective: dict[str, Any] = field(default_factory=lambda: {"kind": "logits"})
    fixed: dict[str, Any] = field(default_factory=dict)
    space: list[ParamSpace] = field(default_factory=list)
    max_steps: int = field(default=600, metadata=AT_LEAST_1)
    trials: int = field(default=20, metadata=AT_LEAST_1)
    metric: Literal["exact", "exact_per_second", "exact_then_loss"] = "exact"
    sampler: Literal["tpe", "random", "grid", "cmaes"] = "tpe"
    pruner: Literal["median", "successive_halving", "hyperband", "none"] = "successive_halving"
    checkpoints: int = field(default=4, metadata=AT_LEAST_1)  # pruning reports per input length
    # What a checkpoint reports to the pruner (the study's value stays `metric`'s).
    signal: Literal["loss", "tokens", "exact"] = "loss"
    seed: int = 0
    storage: str | None = None
    study_name: str | None = None
    description: str = ""
    # A preset (name or YAML file) whose values open a new study as its first trial.
    start_from: str | None = None

    def config(self, params: dict[str, Any], *, defaults: bool = True) -> SearchConfig:
        """The algorithm's full config for a trial's sampled `params` (objective ones aside):
        the model's preset (or its family's defaults), then `fixed`, then the sampled values."""
        algo = {k: v for k, v in params.items() if not k.startswith(OBJECTIVE_PREFIX)}
        algo, steps, seed = {**self.fixed, **algo}, self.max_steps, self.seed
        return algorithm_config(
            self.algorithm, algo, self.model, seed=seed, steps=steps, defaults=defaults
        )

    def objective_for(self, params: dict[str, Any], *, defaults: bool = True) -> Objective:
        """The objective with the model's preset settings (or its family's), then the file's
        `objective`, then a trial's `objective.*` parameters applied."""
        n = len(OBJECTIVE_PREFIX)
        over = {k[n:]: v for k, v in params.items() if k.startswith(OBJECTIVE_PREFIX)}
        return objective_config({**self.objective, **over}, self.model, defaults=defaults)

    def confirms_raw(self) -> bool:
        """Whether any trial holds a match to the raw logits as well as its space (see
        `Objective.confirm`): its hash says so, since it changes what counts as found."""
        base = self.objective_for({})
        searched = {p.name for p in self.space} | set(self.fixed)
        spaces = OBJECTIVE_PREFIX + "space" in searched
        return base.confirm == "both" and base.kind == "logits" and (base.confirms_raw or spaces)

    def defaults_effect(self) -> dict[str, Any]:
        """What the model's family defaults change in this study's trials (the study's hash
        takes it): the knobs neither `fixed` nor the space sets, and the objective settings the
        file leaves unset, where they differ from the built-in default ({}: none)."""
        family = model_defaults(self.model)
        if family is None:
            return {}
        searched = {p.name for p in self.space} | set(self.fixed)
        builtin = self.config({}, defaults=False).to_dict()
        knobs = family.params(self.algorithm).items()
        knobs = {k: v for k, v in knobs if k not in searched and builtin.get(k) != v}
        plain = dataclasses.asdict(self.objective_for({}, defaults=False))
        settings = {k: v for k, v in family.objective(self.objective).items() if plain.get(k) != v}
        effect = {"params": knobs, "objective": settings}
        return {k: v for k, v in effect.items() if v}

    def on_model(self, model: str | None) -> TuningSpec:
        """This study on another model (`--model`), or this spec itself when `model` is None."""
        return self if model is None else replace(self, model=self.model.with_id(model))

    def distributions(self) -> dict[str, Any]:
        return {p.name: p.distribution() for p in self.space}

    def start_params(self) -> dict[str, Any]:
        """`start_from`'s values for the parameters in the space (those inside its ranges)."""
        if self.start_from is None:
            return {}
        named = self.start_from in PRESETS
        # A preset file by the rule for paths in files: read from the tuning file's folder.
        where = None if named else in_file(self.start_from, self.path.parent.resolve())
        values = preset_params("soda", self.start_from if named else None, where)
        found = [(p, values.get(p.name)) for p in self.space]
        return {p.name: v for p, v in found if v is not None and p.holds(v)}


TOP_KEYS = {f.name for f in fields(TuningSpec)} - {"path"}
# The fields that name files, read from the tuning file's folder (`sodaray.io.paths.in_file`).
PATH_FIELDS = ("model.id", "model.preset_file", "data.path", "data.build.source", "start_from")
MAX_GRID = 100_000  # points the grid sampler may try: counted before any is made
# Objective knobs a trial may vary: they change the loss, not the observed targets.
OBJECTIVE_PREFIX = "objective."
TUNABLE_OBJECTIVE = ("fluency_weight", "huber_delta", "loss")
PARAM_KEYS = {"type", "low", "high", "log", "step", "choices"}


def load_tuning(path: str | Path, overrides: list[str] | tuple = ()) -> TuningSpec:
    """Read and validate a tuning file (every parameter range is checked against the
    algorithm's config); `overrides` (`KEY=VALUE`) applied first."""
    data, path = read_document(path, "tuning", TuningError, overrides, PATH_FIELDS)
    fail, name = check_top(data, path, TuningError, TOP_KEYS, ("name", "model", "data", "space"))
    base = path.parent.resolve()  # relative paths in the file are read from its folder
    model = parse_model(data["model"], "model", fail, base=base)
    if model.datasets:
        raise fail("model.datasets", "a study has one `data` entry; `datasets` is for sweeps")
    data_spec = parse_dataset(data["data"], "data", fail, default_name="validation", base=base)
    algorithm = data.get("algorithm", "soda")
    if algorithm not in ALGORITHMS:
        choose = ", ".join(ALGORITHMS)
        raise fail("algorithm", f"unknown algorithm {algorithm!r} (choose {choose})")
    objective = parse_objective(data.get("objective") or {"kind": "logits"}, "objective", fail)
    if "grid" in objective:
        raise fail("objective.grid", "a study searches `space`; objective grids are for sweeps")
    space_entry = data["space"]
    if not isinstance(space_entry, dict) or not space_entry:
        raise fail("space", "a non-empty mapping of parameter name to its range")
    space = [_param(name_, entry, f"space.{name_}", fail) for name_, entry in space_entry.items()]
    parsed = ("name", "model", "data", "algorithm", "objective", "space")
    scalars = {k: v for k, v in data.items() if k not in parsed}
    scalars = coerce_scalars(TuningSpec, scalars, fail)  # max_steps: 1e3 is 1000
    spec = TuningSpec(name, path, model, data_spec, algorithm, objective, space=space, **scalars)
    _check_sampler(spec, fail)
    if spec.start_from is not None:
        _check_start_from(spec, base, fail)
    _check_values(spec, fail)
    return spec


def _check_sampler(spec: TuningSpec, fail) -> None:
    """The sampler can run: cmaes installed; a grid's every range stepped, and the grid within
    `MAX_GRID` points."""
    if spec.sampler == "cmaes":
        try:
            import cmaes  # noqa: F401
        except ImportError as exc:
            why = "cmaes needs the `cmaes` package (pip install 'sodaray[cmaes]')"
            raise fail("sampler", why) from exc
    if spec.sampler != "grid":
        return
    points = 1
    for p in spec.space:
        if p.type == "float" and p.step is None:
            raise fail(f"space.{p.name}", "the grid sampler needs a `step` (or `choices`)")
        count = p.grid_count()
        if count > MAX_GRID:
            raise fail(f"space.{p.name}", f"a grid of {count:,} values (at most {MAX_GRID:,})")
        points *= count
    if points > MAX_GRID:
        raise fail("space", f"a grid of {points:,} points (at most {MAX_GRID:,})")


def _check_start_from(spec: TuningSpec, base: Path, fail) -> None:
    """`start_from` names a preset or a preset file (read from `base`) that loads."""
    if spec.start_from not in PRESETS:
        try:
            where = in_file(spec.start_from, base)
        except ValueError as exc:  # an unset environment variable
            raise fail("start_from", str(exc)) from exc
        if not Path(where).is_file():
            shown = looked_for(spec.start_from, base)
            raise fail("start_from", f"no such preset: {shown} (a preset name or YAML file)")
    try:
        spec.start_params()
    except (OSError, ValueError) as exc:
        raise fail("start_from", f"{exc} (a preset name or a preset YAML file)") from exc


def _check_values(spec: TuningSpec, fail) -> None:
    """`fixed` and every range's ends are values the algorithm's config (or, for
    `objective.*`, the objective) accepts; the model's preset fits the file's objective."""
    if not isinstance(spec.fixed, dict):
        raise fail("fixed", "a mapping of parameter name to value")
    for key in ("max_steps", "seed"):
        if key in spec.fixed or any(p.name == key for p in spec.space):
            raise fail(f"fixed.{key}", f"set it with the file's own `{key}`")
    for p in spec.space:
        samples = p.choices if p.type == "categorical" else [p.low, p.high]
        objective = p.name.startswith(OBJECTIVE_PREFIX)
        if objective and p.name.removeprefix(OBJECTIVE_PREFIX) not in TUNABLE_OBJECTIVE:
            why = f"tunable objective fields: {', '.join(TUNABLE_OBJECTIVE)}"
            raise fail(f"space.{p.name}", why)
        check, prefix = (spec.objective_for, "") if objective else (spec.config, "config: ")
        for value in samples:
            try:
                check({p.name: value}, defaults=False)
            except (TypeError, ValueError) as exc:
                raise fail(f"space.{p.name}", str(exc).removeprefix(prefix)) from exc
    # A family's defaults wait for the study's run (or `--dry-run`), which read the model's
    # config; every family's values are valid.
    # The model's preset settings under the file's objective: a clash is the preset's.
    for check, where in ((spec.config, "fixed"), (spec.objective_for, "model.preset_file")):
        try:
            check({}, defaults=False)
        except (TypeError, ValueError) as exc:
            raise fail(where, str(exc).removeprefix("config: ")) from exc


def _param(name: str, entry: Any, where: str, fail) -> ParamSpace:
    if not isinstance(entry, dict):
        shape = "{type: float|int|categorical, low, high, log, step}"
        raise fail(where, f"a mapping: {shape} or {{type: categorical, choices: [...]}}")
    known_fields(entry, PARAM_KEYS, where, fail)
    kind = entry.get("type", "categorical" if "choices" in entry else "float")
    p = ParamSpace(name, **coerce_scalars(ParamSpace, {**entry, "type": kind}, fail, where))
    if p.type == "categorical":
        if not p.choices:
            raise fail(f"{where}.choices", "a non-empty list")
        return ParamSpace(name, p.type, choices=p.choices)  # a range's fields do not apply
    for key in ("low", "high"):
        if getattr(p, key) is None:
            raise fail(f"{where}.{key}", "required field missing (a number)")
    if not p.low < p.high:
        raise fail(where, f"low ({p.low}) must be below high ({p.high})")
    if p.log and p.low <= 0:
        raise fail(f"{where}.low", "a log-scale range must start above 0")
    if p.log and p.step is not None:
        raise fail(f"{where}.step", "log scale and step cannot be combined (Optuna's rule)")
    if p.type == "int" and not all(float(v).is_integer() for v in (p.low, p.high)):
        raise fail(where, "an int range needs integer low and high")
    if p.type == "int" and p.step is not None and not float(p.step).is_integer():
        # int(0.5) is 0: the range became `step: 0`, silently
        raise fail(f"{where}.step", f"an int range's step is a whole number, not {p.step}")
    return replace(p, choices=None)
