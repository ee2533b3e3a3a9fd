"""SODA: Sparse One-hot Discrete Adam (Algorithm 1 of "GPT, But Backwards", Skapars et al. 2025).

Per target, auxiliary inputs Z (n x V) start at zero. Each step:
  1. relaxed one-hots softmax(Z / tau) @ E are fed as inputs_embeds;
  2. the loss against the observed output is differentiated with respect to Z;
  3. Adam without bias correction (by default), then multiplicative decay Z *= lambda;
  4. hard-max check: argmax(Z) tokens go through the model; a match stops that target;
  5. every t1 of its own steps the Adam moments reset; every t2 steps Z is also re-drawn from
     N(0, 0.1^2).
The whole batch is one (B, n, V) state; schedules count each slot's own steps.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from sodaray.models import LoadedModel
from sodaray.objectives import context_embeds, objective_loss
from sodaray.search.adam import adam_step
from sodaray.search.base import BatchState, SearchConfig, StepOutcome
from sodaray.search.denormals import flush_denormals
from sodaray.targets import TargetSet


@dataclass
class SodaConfig(SearchConfig):
    """SODA's knobs, defaulting to the paper's TinyStories-33M values.

    The four switches reproduce the paper's ablation rows: `bias_correction` (off in SODA),
    `use_decay` (off means lambda = 1), `use_resets` (moment resets every `reset_period`
    steps) and `use_reinit` (re-draw Z every `reinit_period` steps).
    """

    learning_rate: float = 0.065
    decay: float = 0.9
    beta1: float = 0.9
    beta2: float = 0.995
    eps: float = 1e-8
    temperature: float = 0.05
    reset_period: int = 50
    reinit_period: int = 1500
    reinit_std: float = 0.1
    bias_correction: bool = False
    use_decay: bool = True
    use_resets: bool = True
    use_reinit: bool = True
    # Arithmetic of the gradient pass only: "bfloat16" (a bf16 copy of the model; AMX/tensor
    # cores) or "tf32" (CUDA matmuls). The hard-max check always runs at the model's own
    # precision, so every reported match is exact; trajectories differ from float32.
    precision: str = "float32"
    # "sum": each sample is optimised on its own loss (Algorithm 1 as written; a sample's
    # trajectory does not depend on its batch). "mean": the authors' code, one loss averaged
    # over the samples in the batch, so each gradient is 1/B of its own. Adam is blind to the
    # scale of a gradient except through eps, so "mean" acts as eps * B: with B in the hundreds
    # the many low-probability coordinates fall under eps and move in proportion to their
    # gradient instead of by about `learning_rate` each (see RESULTS.md, issue 14).
    loss_reduction: str = "sum"

    algorithm = "soda"
    display_name = "SODA"
    # The ablation switches: SODA's value and the label of a row that changes it.
    SWITCHES: ClassVar[dict[str, tuple[bool, str]]] = {
        "bias_correction": (False, "+ bias correction"),
        "use_decay": (True, "− decay"),
        "use_resets": (True, "− resets"),
        "use_reinit": (True, "− re-init"),
    }

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
        if self.reset_period < 1 or self.reinit_period < 1:
            raise ValueError("reset_period and reinit_period must be at least 1")
        if self.precision not in ("float32", "tf32", "bfloat16"):
            raise ValueError(f"precision must be float32, tf32 or bfloat16, not {self.precision!r}")
        if self.loss_reduction not in ("sum", "mean"):
            raise ValueError(f"loss_reduction must be sum or mean, not {self.loss_reduction!r}")
        if self.eps <= 0 or self.reinit_std < 0:
            raise ValueError("eps must be positive and reinit_std non-negative")

    @classmethod
    def from_preset(cls, name: str, **overrides: object) -> SodaConfig:
        """The paper's hyperparameters for a named model (see `sodaray.presets`)."""
        from sodaray.presets import get_preset

        params = dict(get_preset(name).soda)
        params.update(overrides)
        return cls(**params)


_REINIT_STREAM = 0x50DA  # separates SODA's reinitialisation draws from any other keyed stream


def keyed_normal(shape: tuple[int, ...], seed: int, sample_id: int, draw: int) -> Tensor:
    """Standard normal draws that depend only on (seed, sample id, draw number).

    Drawn on the CPU, so the values do not depend on the device either; the caller moves them.
    Sample ids are hashed into the key as unsigned 64-bit words (negative ids wrap).
    """
    key = [int(seed) % 2**64, int(sample_id) % 2**64, int(draw) % 2**64, _REINIT_STREAM]
    state = np.random.SeedSequence(key).generate_state(2, dtype=np.uint32)
    gen = torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))
    return torch.randn(shape, generator=gen)


@contextlib.contextmanager
def _tf32(enabled: bool):
    """TF32 CUDA matmuls inside the block only (never for the hard-max check)."""
    if not enabled or not torch.cuda.is_available():
        yield
        return
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


class Workspace:
    """Two (B, n, V) buffers reused every step: the probabilities and the gradient.

    A fresh tensor that size is a new mmap each step, and touching its pages costs as much as
    the softmax itself; reusing them made the softmax 3.7x and its backward 1.8x faster.
    """

    def __init__(self) -> None:
        self.probs: Tensor | None = None
        self.grad: Tensor | None = None

    def fit(self, like: Tensor) -> None:
        if self.probs is None or self.probs.shape != like.shape:
            self.probs = torch.empty_like(like)
            self.grad = torch.empty_like(like)


class RelaxedEmbedding(torch.autograd.Function):
    """softmax(Z / tau) @ E as one explicit 2-D matmul each way, in the workspace's buffers.

    Backward needs only dZ: dP = dX @ E^T (one matmul), then the softmax backward and the 1/tau
    scale in place. Saves the probabilities (needed by the backward anyway) and nothing else.
    The in-place and out= kernels are the same ones autograd runs, so values are bit-identical.
    """

    @staticmethod
    def forward(ctx, z: Tensor, embedding: Tensor, temperature: float, ws: Workspace) -> Tensor:
        ws.fit(z)
        probs = torch.div(z, temperature, out=ws.probs)
        torch.ops.aten._softmax.out(probs, -1, False, out=probs)
        ctx.save_for_backward(probs, embedding)
        ctx.temperature, ctx.ws = temperature, ws
        flat = probs.view(-1, probs.shape[-1]).to(embedding.dtype)
        return (flat @ embedding).view(*probs.shape[:-1], embedding.shape[-1])

    @staticmethod
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor, None, None, None]:
        probs, embedding = ctx.saved_tensors
        g = grad_out.reshape(-1, grad_out.shape[-1]).to(embedding.dtype)
        grad = ctx.ws.grad
        if embedding.dtype == grad.dtype:
            torch.mm(g, embedding.T, out=grad.view(-1, grad.shape[-1]))
        else:  # bfloat16 gradient pass: the product comes back in its own dtype
            grad.copy_((g @ embedding.T).view(grad.shape))
        torch.ops.aten._softmax_backward_data.out(grad, probs, -1, probs.dtype, grad_input=grad)
        # div, not multiply by 1/tau: bit-identical to autograd's, so outcomes do not move.
        return grad.div_(ctx.temperature), None, None, None


class SodaBatch(BatchState):
    """The (B, n, V) SODA state of one batch of equal-length targets."""

    def __init__(
        self,
        model: LoadedModel,
        targets: TargetSet,
        length: int,
        config: SodaConfig,
        slots: int,
        generator: torch.Generator,
    ) -> None:
        super().__init__(model, targets, length, config, slots, generator)
        shape = (slots, length, model.vocab_size)
        dev = model.device
        self.z = torch.zeros(shape, device=dev, dtype=torch.float32)
        self.m = torch.zeros_like(self.z)
        self.v = torch.zeros_like(self.z)
        # Steps since the moments were last zeroed (for the optional bias correction).
        self.moment_age = np.zeros(slots, dtype=np.int64)
        # The target row each slot holds: its sample id keys the slot's reinitialisations.
        self.slot_rows = np.zeros(slots, dtype=np.int64)
        self.workspace = Workspace()

    # ---- pool protocol --------------------------------------------------------------------------
    def add(self, slots: Tensor, rows: np.ndarray) -> None:
        self.z[slots] = 0.0
        self.m[slots] = 0.0
        self.v[slots] = 0.0
        host_slots = slots.cpu().numpy()
        self.moment_age[host_slots] = 0
        self.slot_rows[host_slots] = rows
        self.add_targets(slots, rows)

    def keep(self, slots: Tensor) -> None:
        self.z, self.m, self.v = self.z[slots], self.m[slots], self.v[slots]
        self.keep_targets(slots)
        host_slots = slots.cpu().numpy()
        self.moment_age = self.moment_age[host_slots]
        self.slot_rows = self.slot_rows[host_slots]

    def step(self, steps_after: np.ndarray) -> StepOutcome:
        grad, loss = self.gradient()
        self.moment_age += 1
        self.update(grad, self.moment_age)
        tokens = self.z.max(-1).indices  # argmax (same ties), 2x faster on CPU
        found = self.check(tokens)
        self.apply_schedules(steps_after)
        return StepOutcome(found=found, tokens=tokens, loss=loss)

    # ---- the algorithm --------------------------------------------------------------------------
    def gradient(self) -> tuple[Tensor, Tensor]:
        """d loss / d Z for every slot (slots are independent: the batch loss is their sum)."""
        z = self.z.detach().requires_grad_(True)
        tau = self.cfg.temperature
        model = self.model.for_precision(self.cfg.precision)
        # The relaxed pass may flush denormals (faster; it moves values below 1.2e-38 only); the
        # hard-max check runs outside it, so every reported match is exact.
        with torch.enable_grad(), _tf32(self.cfg.precision == "tf32"), flush_denormals(z.device):
            embeds = RelaxedEmbedding.apply(z, model.embedding_matrix, tau, self.workspace)
            embeds = model.relaxed_embeds(embeds)
            hidden = model.hidden(context_embeds(model, embeds, self.batch))
            probs = None
            if self.objective.fluency_weight > 0:  # the penalty differentiates the probs too
                probs = torch.softmax(z / tau, dim=-1)
            loss = objective_loss(model, self.objective, hidden, self.n, self.batch, probs)
            total = loss.sum() if self.cfg.loss_reduction == "sum" else loss.mean()
            (grad,) = torch.autograd.grad(total, z)
        return grad, loss.detach()

    @torch.no_grad()
    def update(self, grad: Tensor, moment_age: np.ndarray) -> None:
        """Adam (no bias correction unless switched on), then multiplicative decay, in place.

        `grad` is consumed: its memory is reused for the denominator.
        """
        c = self.cfg
        step = None
        if c.bias_correction:
            step = torch.as_tensor(moment_age, device=self.z.device, dtype=torch.float32)
        adam_step(
            self.z,
            grad,
            self.m,
            self.v,
            learning_rate=c.learning_rate,
            beta1=c.beta1,
            beta2=c.beta2,
            eps=c.eps,
            step=step,
        )
        if c.use_decay and c.decay != 1.0:
            self.z.mul_(c.decay)

    @torch.no_grad()
    def apply_schedules(self, steps_after: np.ndarray) -> None:
        c = self.cfg
        reset = (
            (steps_after % c.reset_period == 0)
            if c.use_resets
            else np.zeros_like(steps_after, bool)
        )
        reinit = (steps_after % c.reinit_period == 0) if c.use_reinit else np.zeros_like(reset)
        zero_moments = np.flatnonzero(reset | reinit)
        if len(zero_moments):
            idx = torch.as_tensor(zero_moments, device=self.z.device)
            self.m[idx] = 0.0
            self.v[idx] = 0.0
            self.moment_age[zero_moments] = 0
        redraw = np.flatnonzero(reinit)
        if len(redraw):
            # Keyed by (seed, sample id, draw number), not by the order a shared generator is
            # consumed in, so a sample follows the same trajectory whatever its batch
            # neighbours, its slot, or the actor a retried shard lands on.
            fresh = torch.stack(
                [
                    keyed_normal(
                        (self.n, self.z.shape[-1]),
                        c.seed,
                        self.targets.sample_ids[int(self.slot_rows[slot])],
                        int(steps_after[slot]) // c.reinit_period,
                    )
                    for slot in redraw
                ]
            ).to(self.z.device)
            self.z[torch.as_tensor(redraw, device=self.z.device)] = fresh * c.reinit_std
