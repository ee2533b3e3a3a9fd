"""What a study is: the hashes that say which tuning files may add trials to it, recorded in
the study with the attributes that describe it to Optuna's tools."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from sodaray.tuner.spec import TuningSpec

SPEC_HASH_ATTR = "sodaray.spec_hash"
PLACES_HASH_ATTR = "sodaray.places_hash"  # the same, paths by where they lead (`places_hash`)


def spec_hash(spec: TuningSpec) -> str:
    """What makes trials comparable: model, data, algorithm, objective, fixed values, space,
    steps, metric, checkpoints and seed (not trials, sampler, pruner or storage)."""
    from sodaray.results import config_hash

    return config_hash(_identity(spec))


def places_hash(spec: TuningSpec) -> str:
    """`spec_hash` with each local path replaced by where it leads on this machine
    (`experiment.spec.places`): one value for a tuning file whose model or data is written
    relative in one run and absolute, or through a link, in another."""
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
    """What `spec_hash` hashes. A preset file counts by what it holds, not where it is (an
    edited one makes another study, a moved one keeps its study); the model family's defaults
    only where they change a trial. Optional entries are named only when they apply, so that
    studies they do not concern keep their hashes."""
    preset = {"preset": [spec.model.preset, preset_content(spec.model.preset_location)]}
    effect = spec.defaults_effect()
    return {
        **(preset if spec.model.preset or spec.model.preset_file else {}),
        **({"defaults": effect} if effect else {}),
        **({"confirm": "both"} if spec.confirms_raw() else {}),
        "model": spec.model.identity(),
        "data": spec.data.identity(),
        "algorithm": spec.algorithm,
        "objective": spec.objective,
        "fixed": spec.fixed,
        "space": [dataclasses.asdict(p) for p in spec.space],
        "steps": spec.max_steps,
        "metric": spec.metric,
        "checkpoints": spec.checkpoints,
        "seed": spec.seed,
    }


def preset_content(path: str | None) -> dict[str, Any] | None:
    """A preset file's values as a study's identity takes them: its parameters and objective
    settings (None without a file)."""
    if path is None:
        return None
    from sodaray.config.presets import load_preset_file, load_preset_objective

    return {"params": load_preset_file(path), "objective": load_preset_objective(path)}


def claim_study(study: Any, spec: TuningSpec, url: str, study_name: str) -> None:
    """Mark a new `study` as `spec`'s (its hashes and what it is), or refuse one made by a
    different tuning file: neither its `spec_hash` nor its `places_hash` matches. A study that
    holds only the spec hash, and this spec's, gets its places hash."""
    key, where = spec_hash(spec), places_hash(spec)
    recorded = study.user_attrs.get(SPEC_HASH_ATTR)
    if recorded is not None and PLACES_HASH_ATTR not in study.user_attrs and recorded == key:
        study.set_user_attr(PLACES_HASH_ATTR, where)
    if recorded is None:
        # What the study is, for optuna-dashboard and `optuna studies` (the hashes are for us;
        # `run_tuning` adds `dataset_hash` once the data is built).
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
