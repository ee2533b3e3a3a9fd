"""sodaray: search-based language-model inversion (SODA and baselines) at cluster scale."""

from sodaray.api import ALGORITHMS, invert, make_config
from sodaray.models import LoadedModel, ModelLoadError, load_model, wrap_model
from sodaray.objectives import (
    Objective,
    TargetSet,
    make_targets,
    read_logits_file,
    targets_from_logits,
    targets_from_text,
)
from sodaray.presets import PRESETS, get_preset
from sodaray.results import RunContext, read_results, result_rows
from sodaray.search.base import InversionResult, SearchConfig
from sodaray.search.embedding import EmbeddingConfig
from sodaray.search.gcg import GcgConfig
from sodaray.search.soda import SodaConfig

__version__ = "0.1.0"

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
