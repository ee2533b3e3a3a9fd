"""What an auditor observed and how a candidate is scored against it: the `Objective` settings.

Two observations are supported, as in the paper:
- `logits`: the target's logits at the last input position, all of them or the top-k (values
  and indices), optionally at `output_tokens` positions, with the target's own greedy
  continuation as fixed context after the input;
- `text`: the target's greedy continuation of `output_tokens` tokens (paper Eq. 5).
An optional fluency penalty (paper Eq. 6) adds the candidate's mean negative log-likelihood.

Settings only, and a leaf of the package: each kind's recording, loss and check live in
`sodaray.objective.observations`; scoring a batch of candidates in `sodaray.objective.scoring`.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from typing import Literal

ObjectiveKind = Literal["logits", "text"]
KINDS: tuple[str, ...] = ("logits", "text")
LossKind = Literal["huber", "mse"]
# Text loss: "logprob" (the authors' code) is the mean over output positions of max log-prob -
# the observed token's log-prob, clamped at 1e-12; "prob" is the paper's Eq. 5, the sum of
# probability differences. The default found more on held-out validation inputs.
TextLoss = Literal["logprob", "prob"]
TEXT_LOSSES: tuple[str, ...] = ("logprob", "prob")
# Fluency penalty: "argmax" (paper Eq. 6, the authors' code) is the NLL of the relaxed input's
# argmax tokens; "relaxed" the cross-entropy of each relaxed one-hot with the prediction.
FluencyForm = Literal["argmax", "relaxed"]
FLUENCY_FORMS: tuple[str, ...] = ("argmax", "relaxed")
# Where observed logits are compared: as emitted, centred (each position's mean subtracted, as
# TransformerLens' `center_unembed` the authors load with), or as log-probabilities (what APIs
# and llama.cpp show). Defined in `observations.observed_in_space` / `predicted_in_space`.
ObservationSpace = Literal["raw", "centred", "logprobs"]
SPACES: tuple[str, ...] = ("raw", "centred", "logprobs")
# How a match in centred or log-probability space is confirmed: in that space alone (the
# authors' code), or also against the raw logits where known ("both"): a near-collision can
# pass in one space and fail in the other, while a true input reproduces the raw logits bit
# for bit. The default turned down every false find on held-out inputs.
Confirm = Literal["space", "both"]
CONFIRMS: tuple[str, ...] = ("space", "both")
# How a candidate is compared, which a preset file may carry beside SODA's knobs
# (`sodaray.config.presets`); what is observed and the tolerances stay the caller's.
PRESET_FIELDS: tuple[str, ...] = ("space", "loss", "huber_delta", "fluency_weight")
HUBER_DELTA = 1.0  # `huber_delta`'s default (read by `loss: huber` alone)


@dataclass(frozen=True)
class Objective:
    """How a candidate is scored and when it counts as found.

    `top_k=None` observes all logits. `space` is where the loss and the match check compare
    logits (`centred` over the k observed values for top-k; `logprobs` over the vocabulary).
    `confirm="both"` also holds a non-raw match to the raw logits where the targets know them
    (recorded by sodaray; a file's logits may carry an offset). `atol`/`rtol` None: the paper's
    tolerance for the model's size (1e-4 under 100M parameters, 1e-3 above).
    """

    kind: ObjectiveKind = "logits"
    top_k: int | None = None
    space: ObservationSpace = "raw"
    output_tokens: int = 1
    loss: LossKind = "huber"
    huber_delta: float = HUBER_DELTA
    fluency_weight: float = 0.0
    text_loss: TextLoss = "logprob"
    fluency_form: FluencyForm = "argmax"
    confirm: Confirm = "both"
    atol: float | None = None
    rtol: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            kinds = " or ".join(repr(k) for k in KINDS)
            raise ValueError(f"objective must be {kinds}, not {self.kind!r}")
        if self.loss not in ("huber", "mse"):
            raise ValueError(f"loss must be 'huber' or 'mse', not {self.loss!r}")
        if self.output_tokens < 1:
            raise ValueError(f"output_tokens must be at least 1, not {self.output_tokens}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be at least 1, not {self.top_k}")
        if self.space not in SPACES:
            raise ValueError(f"space must be one of {', '.join(SPACES)}, not {self.space!r}")
        if self.kind == "text" and self.top_k is not None:
            raise ValueError("top_k applies to the logits objective only")
        if self.kind == "text" and self.space != "raw":
            raise ValueError("space applies to the logits objective only (text: leave it raw)")
        if self.kind == "logits" and self.space == "centred" and self.top_k == 1:
            raise ValueError(
                "centred top-1 logits are always 0: observe top_k >= 2 or another space"
            )
        if self.huber_delta <= 0:
            raise ValueError("huber_delta must be positive")
        if self.fluency_weight < 0:
            raise ValueError("fluency_weight must be non-negative")
        if self.text_loss not in TEXT_LOSSES:
            raise ValueError(f"text_loss must be logprob or prob, not {self.text_loss!r}")
        if self.fluency_form not in FLUENCY_FORMS:
            raise ValueError(f"fluency_form must be argmax or relaxed, not {self.fluency_form!r}")
        if self.confirm not in CONFIRMS:
            raise ValueError(f"confirm must be space or both, not {self.confirm!r}")

    @property
    def confirm_applies(self) -> bool:
        """Whether `confirm` plays a part: logits compared in a space other than raw."""
        return self.kind == "logits" and self.space != "raw"

    @property
    def confirms_raw(self) -> bool:
        """Whether a match is also held to the raw logits (where the targets know them)."""
        return self.confirm_applies and self.confirm == "both"

    def identity(self) -> dict[str, object]:
        """The settings that decide a job's results, for its hash: every field, but `confirm`
        only where it changes the check (raw logits and text have one space), so a job whose
        check is unchanged keeps the hash it had before the field existed; and `huber_delta`
        as its default under `loss: mse`, which never reads it (a tuning space that samples
        both, or a preset's delta under an entry's mse, makes no other job)."""
        return dict(self._identity)  # a copy: the caller's to change

    @functools.cached_property  # frozen, and shared by a sweep's jobs: made once
    def _identity(self) -> dict[str, object]:
        fields = asdict(self)
        if not self.confirms_raw:
            del fields["confirm"]
        if self.loss == "mse":  # the default, not dropped: an mse job keeps its older hash
            fields["huber_delta"] = HUBER_DELTA
        return fields

    def shape(self) -> tuple[str, int | None, str, int]:
        """What decides the shape of the observed rows and how a match is checked: candidates
        whose objectives differ only in the loss (huber or mse, its delta, the fluency weight
        and form, the text loss) can share one batch."""
        return (self.kind, self.top_k, self.space, self.output_tokens)
