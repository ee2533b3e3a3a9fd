"""sodaray: search-based language-model inversion (SODA and baselines) at cluster scale.

The public names are imported on first use (PEP 562), so that `sodaray --help`,
`sodaray --version` and tools that only read results do not pay for importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sodaray._lazy import lazy_attributes

if TYPE_CHECKING:  # static checkers and IDEs see the real names (exported by `__all__`)
    from sodaray.api import ALGORITHMS, invert, make_config  # noqa: F401
    from sodaray.config.presets import PRESETS, get_preset  # noqa: F401
    from sodaray.io.modelfiles import ModelLoadError  # noqa: F401
    from sodaray.model.load import load_model  # noqa: F401
    from sodaray.model.loaded import LoadedModel, wrap_model  # noqa: F401
    from sodaray.objective.objectives import Objective  # noqa: F401
    from sodaray.objective.targets import (  # noqa: F401
        TargetSet,
        make_targets,
        read_logits_file,
        targets_from_logits,
        targets_from_text,
    )
    from sodaray.results import RunContext, read_results, result_rows  # noqa: F401
    from sodaray.search.embedding import EmbeddingConfig  # noqa: F401
    from sodaray.search.engine.base import InversionResult, SearchConfig  # noqa: F401
    from sodaray.search.gcg import GcgConfig  # noqa: F401
    from sodaray.search.soda.config import SodaConfig  # noqa: F401

__version__ = "0.1.0"

_MODULES = {  # the module that defines each public name
    "sodaray.api": "ALGORITHMS invert make_config",
    "sodaray.config.presets": "PRESETS get_preset",
    "sodaray.io.modelfiles": "ModelLoadError",
    "sodaray.model.load": "load_model",
    "sodaray.model.loaded": "LoadedModel wrap_model",
    "sodaray.objective.objectives": "Objective",
    "sodaray.objective.targets": "TargetSet make_targets read_logits_file targets_from_logits "
    "targets_from_text",
    "sodaray.results": "RunContext read_results result_rows",
    "sodaray.search.embedding": "EmbeddingConfig",
    "sodaray.search.engine.base": "InversionResult SearchConfig",
    "sodaray.search.gcg": "GcgConfig",
    "sodaray.search.soda.config": "SodaConfig",
}
_LAZY = {name: module for module, names in _MODULES.items() for name in names.split()}
__all__ = sorted([*_LAZY, "__version__"])

# Submodules that `import sodaray` used to load as a side effect (`sodaray.results.x` kept working).
_SUBMODULES = frozenset("api config costs errors io model objective report results search".split())

__getattr__, __dir__ = lazy_attributes("sodaray", globals(), _LAZY, _SUBMODULES)
