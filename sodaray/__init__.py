"""sodaray: search-based language-model inversion (SODA and baselines) at cluster scale.

The public names are imported on first use (PEP 562), so that `sodaray --help`,
`sodaray --version` and tools that only read results do not pay for importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sodaray._lazy import lazy_attributes

if TYPE_CHECKING:  # static checkers and IDEs see the real names
    from sodaray.api import ALGORITHMS, invert, make_config
    from sodaray.modelfiles import ModelLoadError
    from sodaray.models import LoadedModel, load_model, wrap_model
    from sodaray.objectives import Objective
    from sodaray.presets import PRESETS, get_preset
    from sodaray.results import RunContext, read_results, result_rows
    from sodaray.search.base import InversionResult, SearchConfig
    from sodaray.search.embedding import EmbeddingConfig
    from sodaray.search.gcg import GcgConfig
    from sodaray.search.soda import SodaConfig
    from sodaray.targets import (
        TargetSet,
        make_targets,
        read_logits_file,
        targets_from_logits,
        targets_from_text,
    )

__version__ = "0.1.0"

_LAZY: dict[str, str] = {
    "ALGORITHMS": "sodaray.api",
    "EmbeddingConfig": "sodaray.search.embedding",
    "GcgConfig": "sodaray.search.gcg",
    "InversionResult": "sodaray.search.base",
    "LoadedModel": "sodaray.models",
    "ModelLoadError": "sodaray.modelfiles",
    "Objective": "sodaray.objectives",
    "PRESETS": "sodaray.presets",
    "RunContext": "sodaray.results",
    "SearchConfig": "sodaray.search.base",
    "SodaConfig": "sodaray.search.soda",
    "TargetSet": "sodaray.targets",
    "get_preset": "sodaray.presets",
    "invert": "sodaray.api",
    "load_model": "sodaray.models",
    "make_config": "sodaray.api",
    "make_targets": "sodaray.targets",
    "read_logits_file": "sodaray.targets",
    "read_results": "sodaray.results",
    "result_rows": "sodaray.results",
    "targets_from_logits": "sodaray.targets",
    "targets_from_text": "sodaray.targets",
    "wrap_model": "sodaray.models",
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
    {
        "api",
        "errors",
        "metrics",
        "models",
        "objectives",
        "observations",
        "presets",
        "results",
        "scoring",
        "search",
        "targets",
        "validation",
    }
)


__getattr__, __dir__ = lazy_attributes("sodaray", globals(), _LAZY, _SUBMODULES)
