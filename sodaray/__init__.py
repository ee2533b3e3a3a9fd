"""sodaray: search-based language-model inversion (SODA and baselines) at cluster scale.

The public names are imported on first use (PEP 562), so that `sodaray --help`,
`sodaray --version` and tools that only read results do not pay for importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sodaray._lazy import lazy_attributes

if TYPE_CHECKING:  # static checkers and IDEs see the real names
    from sodaray.api import ALGORITHMS, invert, make_config
    from sodaray.config.presets import PRESETS, get_preset
    from sodaray.io.modelfiles import ModelLoadError
    from sodaray.model.load import load_model
    from sodaray.model.loaded import LoadedModel, wrap_model
    from sodaray.objective.objectives import Objective
    from sodaray.objective.targets import (
        TargetSet,
        make_targets,
        read_logits_file,
        targets_from_logits,
        targets_from_text,
    )
    from sodaray.results import RunContext, read_results, result_rows
    from sodaray.search.embedding import EmbeddingConfig
    from sodaray.search.engine.base import InversionResult, SearchConfig
    from sodaray.search.gcg import GcgConfig
    from sodaray.search.soda.config import SodaConfig

__version__ = "0.1.0"

_LAZY: dict[str, str] = {
    "ALGORITHMS": "sodaray.api",
    "EmbeddingConfig": "sodaray.search.embedding",
    "GcgConfig": "sodaray.search.gcg",
    "InversionResult": "sodaray.search.engine.base",
    "LoadedModel": "sodaray.model.loaded",
    "ModelLoadError": "sodaray.io.modelfiles",
    "Objective": "sodaray.objective.objectives",
    "PRESETS": "sodaray.config.presets",
    "RunContext": "sodaray.results",
    "SearchConfig": "sodaray.search.engine.base",
    "SodaConfig": "sodaray.search.soda.config",
    "TargetSet": "sodaray.objective.targets",
    "get_preset": "sodaray.config.presets",
    "invert": "sodaray.api",
    "load_model": "sodaray.model.load",
    "make_config": "sodaray.api",
    "make_targets": "sodaray.objective.targets",
    "read_logits_file": "sodaray.objective.targets",
    "read_results": "sodaray.results",
    "result_rows": "sodaray.results",
    "targets_from_logits": "sodaray.objective.targets",
    "targets_from_text": "sodaray.objective.targets",
    "wrap_model": "sodaray.model.loaded",
}

__all__ = [
    "ALGORITHMS",
    "EmbeddingConfig",
    "GcgConfig",
    "PRESETS",
    "InversionResult",
    "LoadedModel",
    "ModelLoadError",
    "Objective",
    "RunContext",
    "SearchConfig",
    "SodaConfig",
    "TargetSet",
    "__version__",
    "get_preset",
    "invert",
    "load_model",
    "make_config",
    "make_targets",
    "read_logits_file",
    "read_results",
    "result_rows",
    "targets_from_logits",
    "targets_from_text",
    "wrap_model",
]


# Submodules that `import sodaray` used to load as a side effect (`sodaray.results.x` kept working).
_SUBMODULES = frozenset(
    {"api", "config", "costs", "errors", "io", "model", "objective", "report", "results", "search"}
)


__getattr__, __dir__ = lazy_attributes("sodaray", globals(), _LAZY, _SUBMODULES)
