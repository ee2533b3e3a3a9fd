"""The study: its sampler and pruner, creating or resuming it in its storage, and the best
preset it leaves behind."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

from sodaray.io.writes import OutputFolder
from sodaray.objective.objectives import PRESET_FIELDS, Objective
from sodaray.tuner.identity import claim_study
from sodaray.tuner.owner import RunOwner, rescue_trials
from sodaray.tuner.spec import TuningSpec
from sodaray.tuner.storage import open_storage, unreadable_storage
from sodaray.tuner.values import checkpoint_steps


def open_study(
    spec: TuningSpec,
    url: str,
    study_name: str,
    storage: Any = None,
    owner: RunOwner | None = None,
) -> tuple[Any, list[int]]:
    """Create or resume the study in `storage` (default: `open_storage(url)`): refuse one made
    by a different tuning file (`claim_study`), record this run in it (`owner`, default a new
    `RunOwner`), re-seed the sampler (`make_sampler`), and fail and retry the trials left
    RUNNING by runs known to be over (`rescue_trials`); a live run's trials are never touched.
    Returns the study and the numbers of the trials it failed."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with unreadable_storage(url):
        study = optuna.create_study(
            study_name=study_name,
            storage=open_storage(url) if storage is None else storage,
            sampler=make_sampler(spec),
            pruner=make_pruner(spec),
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
    points instead of replaying the first run's (a new study keeps the file's seed). `salt`
    (a run's own number) joins them where another run is live on the study: two runs that
    opened it at the same count would otherwise propose the same points."""
    import numpy as np
    import optuna

    seed = spec.seed
    # Not the grid's: its seed shuffles the grid, and its first trials take points by their
    # number in that order, so another seed's order would repeat points already tried.
    if (trials_so_far or salt) and spec.sampler != "grid":
        entropy = [spec.seed, trials_so_far, *([salt] if salt else [])]
        seed = int(np.random.SeedSequence(entropy).generate_state(1)[0])
    if spec.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if spec.sampler == "grid":
        space = {p.name: p.grid_values() for p in spec.space}
        return _grid_sampler()(space, seed=seed)
    if spec.sampler == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed)
    import warnings

    with warnings.catch_warnings():  # experimental in Optuna 4-5: not the user's concern
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        # Several trials share a replica's batch, so several run at once: the constant liar
        # keeps TPE from proposing the running ones' neighbourhood again.
        return optuna.samplers.TPESampler(seed=seed, constant_liar=True)


def _grid_sampler() -> type:
    """Optuna's grid sampler, less its stop: once its grid is covered it calls `study.stop()`,
    which works only inside `study.optimize`, and sodaray asks and tells trials. `run_tuning`
    runs only the points left (`grid_left`) instead."""
    import optuna

    class GridSampler(optuna.samplers.GridSampler):
        def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
            return None

    return GridSampler


def grid_left(spec: TuningSpec, study: Any) -> tuple[int, int]:
    """(points in the grid, trials a grid study has left to run): its enqueued trials, and the
    points no trial has taken (finished in any state, as Optuna's grid sampler counts them,
    running, or enqueued)."""
    import itertools

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
    is the first checkpoint's steps, each next one doubles it (reduction factor 2, to meet a
    study's few evenly spaced checkpoints). A trial goes on past a rung while its value there is
    in the better half of those reported there so far (the first always does: Optuna's
    `bootstrap_count` would prune every trial that reaches a rung before enough others have)."""
    import optuna

    first = checkpoint_steps(spec.max_steps, spec.checkpoints)[0]
    if spec.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=0)
    if spec.pruner == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=first, reduction_factor=2)
    if spec.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(
            min_resource=first, max_resource=spec.max_steps, reduction_factor=2
        )
    return optuna.pruners.NopPruner()


def write_preset(spec: TuningSpec, best, path: Path, out: OutputFolder | None = None) -> Path:
    """The best parameters as a preset YAML (`sodaray invert --preset-file`, sweeps'
    `preset_file:`), written by the rule for writes (`out`: the folder the user gave,
    default the file's own)."""
    # The trial's whole config (the model's preset, `fixed`, the sampled values), so the file
    # reproduces the trial on its own; budget and batching stay the caller's.
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
    # How the trial compared candidates (the file's `objective` with any tuned `objective.*`),
    # where it is not the default: a preset tuned under `space: centred` is used so.
    objective = dataclasses.asdict(spec.objective_for(best.params))
    default = dataclasses.asdict(Objective())
    settings = {k: objective[k] for k in PRESET_FIELDS if objective[k] != default[k]}
    if settings:  # not SODA parameters: kept apart so the file loads as a preset
        doc["objective"] = settings
    out = OutputFolder(path.parent) if out is None else out
    out.write(path, yaml.safe_dump(doc, sort_keys=False))
    return path
