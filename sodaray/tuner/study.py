"""The study: what it is (the hashes that say which tuning files may add trials to it, recorded
in the study with the attributes that describe it to Optuna's tools), its sampler and pruner,
creating or resuming it in its storage, and the best preset it leaves behind."""

from __future__ import annotations

import dataclasses
import itertools
import json
import warnings
from pathlib import Path
from typing import Any

import yaml

from sodaray.io.writes import OutputFolder
from sodaray.objective.objectives import PRESET_FIELDS, Objective
from sodaray.tuner.owner import RunOwner, rescue_trials
from sodaray.tuner.spec import TuningSpec
from sodaray.tuner.storage import open_storage, unreadable_storage
from sodaray.tuner.values import checkpoint_steps

SPEC_HASH_ATTR = "sodaray.spec_hash"
PLACES_HASH_ATTR = "sodaray.places_hash"  # the same, paths by where they lead (`places_hash`)


def spec_hash(spec: TuningSpec) -> str:
    """What makes trials comparable: model, data, algorithm, objective, fixed values, space,
    steps, metric, checkpoints and seed (not trials, sampler, pruner or storage)."""
    from sodaray.results import config_hash

    return config_hash(_identity(spec))


def places_hash(spec: TuningSpec) -> str:
    """`spec_hash` with each local path replaced by where it leads on this machine: one value
    for a tuning file whose model or data is written relative in one run and absolute, or
    through a link, in another."""
    from sodaray.experiment.spec import places
    from sodaray.results import config_hash

    identity = _identity(spec)
    where = places(spec.model, spec.data)
    model, data = dict(identity["model"]), dict(identity["data"])
    if "model" in where:
        model.pop("id")
    if "path" in where:
        data.pop("path")
    if "source" in where and isinstance(data.get("build"), dict):
        data["build"] = {k: v for k, v in data["build"].items() if k != "source"}
    return config_hash({**identity, "model": model, "data": data, "places": where})


def _identity(spec: TuningSpec) -> dict[str, Any]:
    """What `spec_hash` hashes. A preset file counts by what it holds, not where it is; the
    model family's defaults only where they change a trial. Optional entries are named only
    when they apply, so that studies they do not concern keep their hashes."""
    preset = [spec.model.preset, preset_content(spec.model.preset_location)]
    optional = {
        "preset": preset if spec.model.preset or spec.model.preset_file else None,
        "defaults": spec.defaults_effect() or None,
        "confirm": "both" if spec.confirms_raw() else None,
    }
    return {
        **{name: value for name, value in optional.items() if value is not None},
        "model": spec.model.identity(),
        "data": spec.data.identity(),
        "algorithm": spec.algorithm,
        "objective": spec.objective,
        "fixed": spec.fixed,
        "steps": spec.max_steps,
        "space": [dataclasses.asdict(p) for p in spec.space],
        "metric": spec.metric,
        "checkpoints": spec.checkpoints,
        "seed": spec.seed,
    }


def preset_content(path: str | None) -> dict[str, Any] | None:
    """A preset file's parameters and objective settings (None without a file)."""
    if path is None:
        return None
    from sodaray.config.presets import load_preset_file, load_preset_objective

    return {"params": load_preset_file(path), "objective": load_preset_objective(path)}


def claim_study(study: Any, spec: TuningSpec, url: str, study_name: str) -> None:
    """Mark a new `study` as `spec`'s (its hashes and what it is), or refuse one made by a
    different tuning file (neither hash matches). A study that holds only this spec's hash
    gets its places hash."""
    key, where = spec_hash(spec), places_hash(spec)
    recorded = study.user_attrs.get(SPEC_HASH_ATTR)
    if recorded is not None and PLACES_HASH_ATTR not in study.user_attrs and recorded == key:
        study.set_user_attr(PLACES_HASH_ATTR, where)
    if recorded is None:  # what the study is, for optuna-dashboard and `optuna studies`
        attrs = {
            SPEC_HASH_ATTR: key,
            PLACES_HASH_ATTR: where,
            "model": spec.model.id,
            "dataset": spec.data.name,
            "algorithm": spec.algorithm,
            "max_steps": spec.max_steps,
            "fixed": json.loads(json.dumps(spec.fixed, default=str)),  # JSON-safe everywhere
        }
        for name, value in attrs.items():
            study.set_user_attr(name, value)
    elif recorded != key and study.user_attrs.get(PLACES_HASH_ATTR) != where:
        raise ValueError(
            f"study {study_name!r} in {url} was made by another tuning file (model, data, "
            "algorithm, objective, space, steps, metric or seed differ); give this one its own "
            "study_name or storage"
        )


def open_study(
    spec: TuningSpec, url: str, study_name: str, storage: Any = None, owner: RunOwner | None = None
) -> tuple[Any, list[int]]:
    """Create or resume the study in `storage` (default: `open_storage(url)`): refuse one made
    by a different tuning file, record this run in it (`owner`, default a new `RunOwner`),
    re-seed the sampler, and fail and retry the trials left RUNNING by runs known to be over
    (a live run's are never touched). Returns the study and the numbers of the trials failed."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with unreadable_storage(url):
        storage = open_storage(url) if storage is None else storage
        sampler, pruner = make_sampler(spec), make_pruner(spec)
        study = optuna.create_study(
            study_name=study_name,
            storage=storage,
            sampler=sampler,
            pruner=pruner,
            direction="maximize",
            load_if_exists=True,
        )
    claim_study(study, spec, url, study_name)
    owner = RunOwner.new() if owner is None else owner
    others = owner.register(study)  # before the trials are counted: see `make_sampler`
    trials = study.get_trials(deepcopy=False)
    if trials or others:
        study.sampler = make_sampler(spec, len(trials), owner.salt if others else 0)
    # The preset opens a new study once: the earliest of runs starting together enqueues it.
    first = all(r.get("since", 0) > owner.record["since"] for r in others.values())
    if not trials and first and spec.start_params():
        study.enqueue_trial(spec.start_params())
    return study, rescue_trials(study, spec, owner, others)


def make_sampler(spec: TuningSpec, trials_so_far: int = 0, salt: int = 0):
    """The study's sampler, seeded from (seed, trials so far): a resumed study proposes new
    points instead of replaying the first run's. `salt` (a run's own number) joins them where
    another run is live on the study, so that two runs propose different points."""
    import numpy as np
    import optuna

    seed = spec.seed
    # Not the grid's: its seed shuffles the grid, and another seed's order would repeat points.
    if (trials_so_far or salt) and spec.sampler != "grid":
        entropy = [spec.seed, trials_so_far, *([salt] if salt else [])]
        seed = int(np.random.SeedSequence(entropy).generate_state(1)[0])
    if spec.sampler == "grid":
        return _grid_sampler()({p.name: p.grid_values() for p in spec.space}, seed=seed)
    if spec.sampler != "tpe":
        sampler = {"random": "RandomSampler", "cmaes": "CmaEsSampler"}[spec.sampler]
        return getattr(optuna.samplers, sampler)(seed=seed)
    with warnings.catch_warnings():  # experimental in Optuna 4-5: not the user's concern
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        # Several trials share a replica's batch, so several run at once: the constant liar
        # keeps TPE from proposing the running ones' neighbourhood again.
        return optuna.samplers.TPESampler(seed=seed, constant_liar=True)


def _grid_sampler() -> type:
    """Optuna's grid sampler, less its stop (`study.stop()` works only inside `study.optimize`,
    and sodaray asks and tells trials): `run_tuning` runs only the points left instead."""
    import optuna

    class GridSampler(optuna.samplers.GridSampler):
        def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
            return None

    return GridSampler


def grid_left(spec: TuningSpec, study: Any) -> tuple[int, int]:
    """(points in the grid, trials a grid study has left to run): its enqueued trials, and the
    points no trial has taken (finished in any state, running, or enqueued)."""
    import optuna

    names = [p.name for p in spec.space]
    waiting = optuna.trial.TrialState.WAITING
    taken, queued = set(), 0
    for t in study.get_trials(deepcopy=False):
        params = t.params or t.system_attrs.get("fixed_params") or {}
        queued += t.state == waiting
        if set(params) >= set(names):
            taken.add(tuple(params[n] for n in names))
    grid = set(itertools.product(*(p.grid_values() for p in spec.space)))
    return len(grid), queued + len(grid - taken)


def make_pruner(spec: TuningSpec):
    """The study's pruner. Successive halving and Hyperband allot step budget: their first rung
    is the first checkpoint's steps, each next one doubles it. A trial goes on past a rung while
    its value there is in the better half of those reported there so far (the first always
    does)."""
    import optuna

    first = checkpoint_steps(spec.max_steps, spec.checkpoints)[0]
    if spec.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=0)
    if spec.pruner == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=first, reduction_factor=2)
    if spec.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(first, spec.max_steps, reduction_factor=2)
    return optuna.pruners.NopPruner()


def best_trial(study: Any) -> Any | None:
    """The study's completed trial of the highest value (the first of equals); None: none."""
    import optuna

    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    return max(complete, key=lambda t: t.value, default=None)


def write_preset(spec: TuningSpec, best, path: Path, out: OutputFolder | None = None) -> Path:
    """The best trial's whole config as a preset YAML, so the file reproduces the trial on its
    own (budget and batching stay the caller's); `out`: the folder the user gave."""
    budget = ("max_steps", "seed", "max_batch_size", "max_seconds")
    params = {k: v for k, v in spec.config(best.params).to_dict().items() if k not in budget}
    doc = {
        "soda" if spec.algorithm == "soda" else "params": params,
        "note": (
            f"tuned by `sodaray tune {spec.path}`: trial {best.number}, {spec.metric} "
            f"{best.value:.4f} on {spec.data.name} with {spec.max_steps} steps per sample"
        ),
        "model": spec.model.id,
    }
    # How the trial compared candidates, where it is not the default: a preset tuned under
    # `space: centred` is used so.
    objective = dataclasses.asdict(spec.objective_for(best.params))
    default = dataclasses.asdict(Objective())
    settings = {k: objective[k] for k in PRESET_FIELDS if objective[k] != default[k]}
    if settings:  # not SODA parameters: kept apart so the file loads as a preset
        doc["objective"] = settings
    out = OutputFolder(path.parent) if out is None else out
    out.write(path, yaml.safe_dump(doc, sort_keys=False))
    return path
