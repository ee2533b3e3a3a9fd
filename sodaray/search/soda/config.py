"""SODA's configuration: the paper's knobs (Algorithm 1 of "GPT, But Backwards", Skapars et
al. 2025), their checks, the presets, and the keyed draws of a search's re-initialised Z."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from sodaray.search.engine.base import BatchSearch, SearchConfig


@dataclass
class SodaConfig(SearchConfig):
    """SODA's knobs, defaulting to the paper's TinyStories-33M values; the four switches
    (`bias_correction`, `use_decay`, `use_resets`, `use_reinit`) are its ablation rows."""

    learning_rate: float = 0.065
    decay: float = 0.9
    beta1: float = 0.9
    beta2: float = 0.995
    eps: float = 1e-8
    temperature: float = 0.05
    # Not in the paper: anneal each search's temperature geometrically from `temperature` at
    # its first step to `temperature_end` at its last (`max_steps`); None keeps it constant.
    temperature_end: float | None = None
    reset_period: int = 50
    reinit_period: int = 1500
    reinit_std: float = 0.1
    bias_correction: bool = False
    use_decay: bool = True
    use_resets: bool = True
    use_reinit: bool = True
    # Arithmetic of the gradient pass only ("bfloat16": a bf16 copy of the model; "tf32": CUDA
    # matmuls); the hard-max check runs at the model's own, so every reported match is exact.
    precision: str = "float32"
    # "sum": each sample on its own loss (Algorithm 1 as written). "mean": the authors' code,
    # one loss averaged over the config's B searches in the batch as a step runs, so each
    # gradient is 1/B of its own and Adam acts as with eps * B; a trajectory then depends on
    # its batch, by design.
    loss_reduction: str = "sum"
    # Not in the paper: a search that ends its budget unfound checks every single-token change
    # of its final input (`sodaray.search.engine.scan`: up to length x V exact checks).
    scan_positions: bool = False
    # The CUDA step's full-vocabulary passes as fused Triton kernels (`soda.kernels`): "off",
    # "auto" (on CUDA where triton imports) or "on" (else an error). Fused steps follow the
    # eager formulas, not their bits; a CPU batch stays eager under "auto", bit for bit.
    fused: str = "auto"

    algorithm = "soda"
    display_name = "SODA"
    NEUTRAL: ClassVar[dict[str, Any]] = {
        "temperature_end": None,
        "scan_positions": False,
        "fused": "auto",
    }
    # The ablation switches: SODA's value and the label of a row that changes it.
    SWITCHES: ClassVar[dict[str, tuple[bool, str]]] = {
        "bias_correction": (False, "+ bias correction"),
        "use_decay": (True, "− decay"),
        "use_resets": (True, "− resets"),
        "use_reinit": (True, "− re-init"),
    }

    def batch_type(self) -> type[BatchSearch]:
        from sodaray.search.soda.batch import SodaBatch  # loaded when a search runs

        return SodaBatch

    @classmethod
    def variant_label(cls, params: dict[str, Any]) -> str:
        """`SODA`, SODA with the switches that differ from it, or `Adam` when all do (the
        paper's plain-Adam row)."""
        diffs = [
            label
            for key, (default, label) in cls.SWITCHES.items()
            if key in params and bool(params[key]) != default
        ]
        if len(diffs) == len(cls.SWITCHES):
            return "Adam"
        return "SODA " + ", ".join(diffs) if diffs else "SODA"

    def validate(self) -> None:
        super().validate()
        if self.learning_rate <= 0:
            raise ValueError(f"learning_rate must be positive, not {self.learning_rate}")
        if not 0 < self.decay <= 1:
            raise ValueError(f"decay must be in (0, 1], not {self.decay}")
        for name in ("beta1", "beta2"):
            value = getattr(self, name)
            if not 0 <= value < 1:
                raise ValueError(f"{name} must be in [0, 1), not {value}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be positive, not {self.temperature}")
        if self.temperature_end is not None and self.temperature_end <= 0:
            raise ValueError(f"temperature_end must be positive, not {self.temperature_end}")
        if self.reset_period < 1 or self.reinit_period < 1:
            raise ValueError("reset_period and reinit_period must be at least 1")
        if self.precision not in ("float32", "tf32", "bfloat16"):
            raise ValueError(f"precision must be float32, tf32 or bfloat16, not {self.precision!r}")
        if self.loss_reduction not in ("sum", "mean"):
            raise ValueError(f"loss_reduction must be sum or mean, not {self.loss_reduction!r}")
        if self.fused not in ("off", "auto", "on"):
            raise ValueError(f"fused must be off, auto or on, not {self.fused!r}")
        if self.fused == "on":
            from sodaray.search.soda.kernels import available

            if not available():
                raise ValueError("fused: on needs the triton package (pip install triton)")
        if self.eps <= 0 or self.reinit_std < 0:
            raise ValueError("eps must be positive and reinit_std non-negative")

    @classmethod
    def from_preset(cls, name: str, **overrides: object) -> SodaConfig:
        """The paper's hyperparameters for a named model (see `sodaray.config.presets`)."""
        from sodaray.config.presets import get_preset

        return cls(**{**get_preset(name).soda, **overrides})
