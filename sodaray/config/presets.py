"""The paper's SODA hyperparameters per model, with each model's hub id.

Values are those of the authors' released configs (AdrSkapars/inversion_optimisation,
`inv_configs.py`), which their runs were launched with; where the paper's appendix disagrees, a
preset follows the config and says so in its `note` (`qwen2.5-3b-paper` keeps the appendix's
learning rate). A preset YAML (as `sodaray tune` writes it) is read by `load_preset_file`;
beside SODA's knobs it may set how candidates are compared (`objective: {space: centred}`), read
by `load_preset_objective`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sodaray.config.configfile import read_yaml
from sodaray.config.validation import make_objective
from sodaray.errors import first_line
from sodaray.io.paths import brief
from sodaray.objective.objectives import PRESET_FIELDS


@dataclass(frozen=True)
class Preset:
    name: str
    hub_id: str
    soda: dict[str, Any] = field(default_factory=dict)
    note: str = ""


_KNOBS = "learning_rate decay beta1 beta2 temperature reset_period reinit_period".split()


def _soda(lr, decay, b1, b2, tau=0.05, t1=50, t2=1500) -> dict[str, Any]:
    return dict(zip(_KNOBS, (lr, decay, b1, b2, tau, t1, t2), strict=True))


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        Preset("tinystories-33m", "roneneldan/TinyStories-33M", _soda(0.065, 0.9, 0.9, 0.995)),
        Preset("gpt2-small", "openai-community/gpt2", _soda(0.02, 0.98, 0.93, 0.997)),
        Preset("gpt2-xl", "openai-community/gpt2-xl", _soda(0.03, 0.96, 0.93, 0.995)),
        Preset("qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B", _soda(0.03, 0.98, 0.9, 0.995)),
        Preset(
            "qwen2.5-3b",
            "Qwen/Qwen2.5-3B",
            _soda(0.03, 0.97, 0.9, 0.995, tau=0.07),
            note="learning rate 0.03 from the authors' config; the paper's appendix prints 0.3",
        ),
        Preset(
            "qwen2.5-3b-paper",
            "Qwen/Qwen2.5-3B",
            _soda(0.3, 0.97, 0.9, 0.995, tau=0.07),
            note="the paper appendix's learning rate 0.3 (the authors' config has 0.03)",
        ),
        Preset(
            "pythia-1.4b-tdc",
            "TDC2023/trojan-base-pythia-1.4b-test-phase",
            _soda(0.025, 0.98, 0.9, 0.995, t1=75),
            note="the TDC-2023 trojan detection base model (Pythia-1.4B architecture), "
            "test-phase release; the authors' config names only pythia-1.4b",
        ),
    ]
}


def get_preset(name: str) -> Preset:
    key = name.lower()
    if key not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[key]


# A preset file is a flat mapping of SODA parameters, or these sections (`soda`: SODA's
# parameters, `params`: another algorithm's, never both); any other key is refused by name.
SECTIONS = ("soda", "params", "objective", "note", "model")


def _read_preset(path: str | Path) -> dict[str, Any]:
    """A preset YAML's mapping, checked for its shape, or a one-line error naming the file."""
    data = read_yaml(path, "preset")
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a preset file must be a mapping of parameters")
    if "soda" not in data and "params" not in data:
        if "objective" in data:  # a flat mapping is parameters only: say where they go
            raise ValueError(
                f"{path}: a preset with an `objective:` section puts its parameters under "
                "`soda:` (or `params:`)"
            )
        return data
    if "soda" in data and "params" in data:
        raise ValueError(f"{path}: give `soda:` or `params:`, not both (one would be dropped)")
    unknown = [str(k) for k in data if k not in SECTIONS]
    if unknown:
        raise ValueError(
            f"{path}: {brief(unknown[0])} is not a preset section "
            f"(a preset file has {', '.join(SECTIONS)})"
        )
    for key in ("note", "model"):
        if key in data and not isinstance(data[key], str):
            raise ValueError(f"{path}: {key} must be a string, not {brief(data[key])}")
    return data


def load_preset_file(path: str | Path) -> dict[str, Any]:
    """SODA parameters from a preset YAML: either a flat mapping or one under `soda:` (or
    `params:`)."""
    data = _read_preset(path)
    params = data.get("soda", data.get("params", data))
    if not isinstance(params, dict):
        section = "soda" if "soda" in data else "params"
        raise ValueError(f"{path}: '{section}' must be a mapping of parameters")
    return dict(params)


def load_preset_objective(path: str | Path) -> dict[str, Any]:
    """The objective settings a preset YAML carries under `objective:` (none: {}), coerced and
    checked: only `PRESET_FIELDS` (how candidates are compared, e.g. `space: centred`), each a
    valid value. They are defaults: an objective field a sweep, tuning file or command line
    sets itself wins."""
    data = _read_preset(path)
    if "soda" not in data and "params" not in data:
        return {}  # a flat mapping is SODA parameters only
    section = data.get("objective") or {}
    if not isinstance(section, dict):
        raise ValueError(f"{path}: 'objective' must be a mapping of objective fields")
    unknown = sorted(str(k) for k in section if k not in PRESET_FIELDS)
    if unknown:
        raise ValueError(
            f"{path}: objective.{unknown[0]} is not a preset setting "
            f"(a preset may set {', '.join(PRESET_FIELDS)})"
        )
    try:
        objective = make_objective(dict(section))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: objective: {first_line(exc)}") from exc
    return {k: getattr(objective, k) for k in section}


def preset_params(
    algorithm: str, preset: str | None = None, preset_file: str | Path | None = None
) -> dict[str, Any]:
    """The parameters a preset name and/or preset file give `algorithm` (the file's win).
    Presets hold SODA's knobs only, so other algorithms get none: a sweep may pair one model
    entry's preset with GCG rows, which keep their own defaults."""
    if algorithm != "soda":
        return {}
    params = dict(get_preset(preset).soda) if preset else {}
    if preset_file:
        params.update(load_preset_file(preset_file))
    return params
