"""SODA: Sparse One-hot Discrete Adam (Algorithm 1 of "GPT, But Backwards", Skapars et al. 2025).

Per target, auxiliary inputs Z (n x V) start at zero. Each step:
  1. relaxed one-hots softmax(Z / tau) @ E are fed as inputs_embeds;
  2. the loss against the observed output is differentiated with respect to Z;
  3. Adam without bias correction (by default), then multiplicative decay Z *= lambda;
  4. hard-max check: argmax(Z) tokens go through the model; a match stops that target;
  5. every t1 of its own steps the Adam moments reset; every t2 steps Z is also re-drawn from
     N(0, 0.1^2).

One batch holds searches of any input length, any SODA config and any objective that observes
the same shape (`Objective.shape`): the state is packed as rows, Z (T, V) with T the sum of the
slots' lengths, so no row is padding; every hyperparameter, schedule and step counter is the
slot's own; the loss is grouped by objective. Only the transformer passes pad (at the end of
each sequence, see `sodaray.scoring`); the slots are split into passes of similar lengths by
cost (`sodaray.search.passes`). A search's trajectory depends on its own config, target and
(seed, sample id), not on what shares its batch or its pass: bit for bit on one CPU thread
(width-invariant attention, `sodaray.attention`; row-invariant matmuls, `models.pad_rows`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from sodaray.attention import invariant
from sodaray.models import LoadedModel, invariant_rows, pad_rows, padding_items
from sodaray.objectives import Objective
from sodaray.observations import BatchTargets, screen_slack
from sodaray.scoring import (
    Layout,
    check_sequences,
    objective_loss,
    prepared_sequences,
    sequence_embeds,
    slot_rows,
)
from sodaray.search.adam import Hyper, adam_step
from sodaray.search.base import (
    SearchConfig,
    SlotEntry,
    StepOutcome,
    keyed_generator,
    observed_rows,
)
from sodaray.search.denormals import flush_denormals
from sodaray.search.executor import Executor
from sodaray.search.passes import pass_overhead
from sodaray.search.scheduler import Scheduler
from sodaray.search.slots import Buffers, apply_plan, removal_plan


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
    # Not in the paper: when a search ends its budget unfound, check every single-token change
    # of its final input, position by position (`sodaray.search.scan`): up to length x V exact
    # checks after the budget, so give it a smaller `max_steps` to compare at equal cost. Won at
    # equal budget on stories260K (V 512); costs several budgets per position at V 49,152 on a
    # CPU (benchmarks/RESULTS.md, issue 38). Off: out of the job hash.
    scan_positions: bool = False

    algorithm = "soda"
    display_name = "SODA"
    NEUTRAL: ClassVar[dict[str, Any]] = {"temperature_end": None, "scan_positions": False}
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
        if self.temperature_end is not None and self.temperature_end <= 0:
            raise ValueError(f"temperature_end must be positive, not {self.temperature_end}")
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


def keyed_normal(shape: tuple[int, ...], seed: int, sample_id: int, draw: int) -> Tensor:
    """Standard normal draws that depend only on (seed, sample id, draw number).

    Drawn on the CPU, so the values do not depend on the device either; the caller moves them.
    """
    return torch.randn(shape, generator=keyed_generator(seed, sample_id, draw, "reinit"))


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
    """Two (T, V) buffers reused every step, the probabilities and the gradient (and the
    argmax's two (T, 1) outputs).

    A fresh tensor that size is a new mmap each step, and touching its pages costs as much as
    the softmax itself; reusing them made the softmax 3.7x and its backward 1.8x faster. They
    keep spare rows, so a batch whose row count changes as searches come and go reallocates
    only when it outgrows them.

    `padded` is `probs` with `pad` zero rows after it, the rows `pad_rows` would append for the
    product with the embedding: kept zero in the buffer (the softmax writes only `probs`), so a
    step neither copies the (T, V) probabilities into a padded tensor nor launches that copy.
    """

    def __init__(self) -> None:
        self._probs: Tensor | None = None
        self._grad: Tensor | None = None
        self._zeroed: tuple[int, int] | None = None  # buffer rows known to hold zeros
        self._max: tuple[Tensor, Tensor] | None = None  # the argmax's (T, 1) values and indices
        self.probs: Tensor | None = None
        self.grad: Tensor | None = None
        self.padded: Tensor | None = None

    def fit(self, like: Tensor, pad: int = 0) -> None:
        rows = like.shape[0]
        buf = self._probs
        if buf is None or buf.shape[0] < rows + pad or buf.shape[1:] != like.shape[1:]:
            old = buf.shape[0] if buf is not None else 0
            spare = (max(rows + pad, 2 * old), *like.shape[1:])
            self._probs = like.new_empty(spare)
            self._grad = like.new_empty(spare)
            self._zeroed = None
        assert self._probs is not None and self._grad is not None
        if not pad:
            self._zeroed = None  # this step's probabilities may cover any rows
        elif self._zeroed != (rows, rows + pad):
            self._probs[rows : rows + pad].zero_()
            self._zeroed = (rows, rows + pad)
        self.probs, self.grad = self._probs[:rows], self._grad[:rows]
        self.padded = self._probs[: rows + pad]

    def argmax(self, z: Tensor) -> Tensor:
        """(T,) the index of each row's largest value, the first among ties (`Tensor.max`'s).
        Into kept (T, 1) buffers: a fresh max over a dimension that is then squeezed launched
        four more operations (two resizes of each output) every step, and took longer."""
        shape = (z.shape[0], 1)
        if self._max is None or self._max[0].shape != shape or self._max[0].device != z.device:
            self._max = (z.new_empty(shape), z.new_empty(shape, dtype=torch.long))
        torch.max(z, -1, keepdim=True, out=self._max)
        return self._max[1][:, 0]


def annealed_temperature(
    start: np.ndarray, end: np.ndarray, step: np.ndarray, budget: np.ndarray
) -> np.ndarray:
    """`temperature_end`'s schedule: tau_t = start * (end / start) ** (t / T), geometric from
    `start` at a search's step 0 to `end` at its last step T (held there after)."""
    return start * (end / start) ** (np.minimum(step, budget) / budget)


def _aten_out(name: str) -> Any:
    """The `out=` overload of an ATen kernel, or None where this torch lacks it. These are the
    kernels autograd itself runs for softmax (so outcomes match `torch.softmax` bit for bit),
    written into the workspace's buffers; they are not public API, so a torch without them
    takes the public path (`tests/test_soda_kernels.py` fails if the pinned torch does, and
    `benchmarks/bench_kernels.py` measures what the public path costs)."""
    try:
        return getattr(torch.ops.aten, name).out
    except (AttributeError, RuntimeError):
        return None


SOFTMAX_OUT = _aten_out("_softmax")
SOFTMAX_BACKWARD_OUT = _aten_out("_softmax_backward_data")


class RelaxedEmbedding(torch.autograd.Function):
    """softmax(Z / tau) @ E as one explicit 2-D matmul each way, in the workspace's buffers.

    Z is (T, V), packed rows; tau a float or a (T, 1) column (each row its slot's temperature).
    Backward needs only dZ: dP = dX @ E^T (one matmul), then the softmax backward and the 1/tau
    scale in place. Saves the probabilities (needed by the backward anyway) and nothing else.
    The in-place and out= kernels are the same ones autograd runs, so values are bit-identical.
    """

    @staticmethod
    def forward(ctx, z: Tensor, embedding: Tensor, temperature: Hyper, ws: Workspace) -> Tensor:
        same = embedding.dtype == z.dtype  # then the product reads the workspace's zero rows
        ws.fit(z, padding_items(len(z), z.device) if same else 0)
        probs = torch.div(z, temperature, out=ws.probs)
        if SOFTMAX_OUT is not None:
            SOFTMAX_OUT(probs, -1, False, out=probs)
        else:  # the public path: a temporary the size of `probs`, then copied back
            probs.copy_(torch.softmax(probs, -1))
        ctx.save_for_backward(probs, embedding)
        ctx.temperature, ctx.ws = temperature, ws
        padded = ws.padded if same else pad_rows(probs.to(embedding.dtype))
        return (padded @ embedding)[: len(probs)]

    @staticmethod
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor, None, None, None]:
        probs, embedding = ctx.saved_tensors
        g = grad_out.to(embedding.dtype)
        grad = ctx.ws.grad
        if len(g) >= invariant_rows(g.device) and embedding.dtype == grad.dtype:
            torch.mm(g, embedding.T, out=grad)
        else:  # few rows (padded: see `invariant_rows`), or a bfloat16 pass: copied in after
            grad.copy_((pad_rows(g) @ embedding.T)[: len(g)])
        if SOFTMAX_BACKWARD_OUT is not None:
            SOFTMAX_BACKWARD_OUT(grad, probs, -1, probs.dtype, grad_input=grad)
        else:  # the public path: dP -> P * (dP - <dP, P>), not bit-identical to the kernel
            grad.sub_(torch.linalg.vecdot(grad, probs).unsqueeze(-1)).mul_(probs)
        # div, not multiply by 1/tau: bit-identical to autograd's, so outcomes do not move.
        return grad.div_(ctx.temperature), None, None, None


@dataclass
class _Hyper:
    """The step's hyperparameters, each row its slot's value as a (T, 1) column (the betas as
    their 1 - beta, rounded to float32 once from float64: see `adam_step`)."""

    learning_rate: Tensor
    one_minus_beta1: Tensor
    one_minus_beta2: Tensor
    eps: Tensor
    temperature: Tensor
    decay: Tensor | None  # None: no slot decays


@dataclass
class Pass:
    """One transformer pass of a step: its slots (host indices; None: every slot), their
    layout, their packed rows, the slots as a tensor, and the batch size and input width it
    runs at (the scheduler's shape: padding slots and positions are zeros)."""

    slots: np.ndarray | None
    layout: Layout
    rows: Tensor | None
    index: Tensor | None
    batch: int
    width: int


# Per-slot host arrays, kept in slot order beside the batch's tensors.
_SLOT_ARRAYS = {
    "length": np.int64,
    "learning_rate": np.float64,
    "beta1": np.float64,
    "beta2": np.float64,
    "eps": np.float64,
    "temperature": np.float64,
    "temperature_end": np.float64,  # = temperature where it stays constant
    "budget": np.int64,  # max_steps: the annealing's length
    "tau": np.float64,  # the temperature of the slot's next step
    "decay": np.float64,  # 1.0 where use_decay is off
    "reset": np.int64,  # 0: no resets
    "reinit": np.int64,  # 0: no re-draws
    "reinit_std": np.float64,
    "bias": bool,
    "mean": bool,  # loss_reduction "mean": the slot's loss is averaged over its config's slots
    "config": np.int64,  # index into `self.configs`
    "group": np.int64,  # index into `self.groups`: the slot's objective and tolerance
    "seed": np.int64,
    "sample_id": np.int64,
    "age": np.int64,  # steps since the slot's moments were last zeroed
}


def _adam_decay(
    z: Tensor,
    grad: Tensor,
    m: Tensor,
    v: Tensor,
    learning_rate: Tensor,
    one_minus_beta1: Tensor,
    one_minus_beta2: Tensor,
    eps: Tensor,
    decay: Tensor | None,
    correction: tuple[Tensor, Tensor] | None,
) -> None:
    """SODA's update in place: Adam, then the multiplicative decay (one function of tensors, so
    that the "compiled" executor fuses the two into one kernel)."""
    adam_step(
        z,
        grad,
        m,
        v,
        learning_rate=learning_rate,
        one_minus_beta1=one_minus_beta1,
        one_minus_beta2=one_minus_beta2,
        eps=eps,
        correction=correction,
    )
    if decay is not None:
        z.mul_(decay)


class SodaBatch:
    """SODA searches of any lengths and configs in one batch: slot b holds `length[b]` rows of
    the packed state Z, m, v (T, V). `precision` (the gradient pass's arithmetic) is the one
    setting the whole batch shares; `mix_lengths` False keeps each pass to one length."""

    mixes_lengths: ClassVar[bool] = True

    def __init__(
        self,
        model: LoadedModel,
        precision: str = "float32",
        mix_lengths: bool = True,
        policy: str = "exact",
        executor: Executor | None = None,
    ) -> None:
        self.model, self.precision = model, precision
        self.executor = executor if executor is not None else Executor()
        # Lengths share a pass only where that changes no result (`sodaray.attention`).
        mix = mix_lengths and model.for_precision(precision).invariant
        self.scheduler = Scheduler(policy, pass_overhead(model) if mix else 0.0, mix)
        self.slots = Buffers()  # observed rows, per slot
        self.rows = Buffers(guard=1)  # z, m, v (T, V) and the last checked token, per row
        self.host = {name: np.zeros(0, dtype=kind) for name, kind in _SLOT_ARRAYS.items()}
        self.row_slot = np.zeros(0, dtype=np.int64)
        self.row_offset = np.zeros(0, dtype=np.int64)
        # The host's side of the hard-max check: each row's last checked token (-1: none yet)
        # and each slot's observed continuation but its last token, so the check's sequences
        # are built on the host, in one copy to the device.
        self.row_last = np.zeros(0, dtype=np.int64)
        # Each slot's sequences the match check's confirm turned down (`check_sequences`).
        self.misses = np.empty(0, dtype=object)
        self.context = np.zeros((0, 0), dtype=np.int64)
        self.configs: dict[str, int] = {}
        self.groups: list[tuple[Objective, float, float]] = []
        self.workspace = Workspace()
        self.current: np.ndarray | None = None  # (T,) candidates of the last step
        self._seed: Tensor | None = None  # ones: the backward's seed (`_ones`)
        self._dirty = True
        self.layout: Layout | None = None
        self.passes: list[Pass] = []

    def __len__(self) -> int:
        return len(self.slots)

    @property
    def z(self) -> Tensor:
        return self.rows["z"]

    # ---- entering and leaving -------------------------------------------------------------------
    def add(self, entries: Sequence[SlotEntry]) -> None:
        if not entries:
            return
        dev, vocab = self.model.device, self.model.vocab_size
        first_slot, first_row = len(self.slots), len(self.rows)
        values: dict[str, list[Any]] = {name: [] for name in _SLOT_ARRAYS}
        for e in entries:
            c = e.config
            if not isinstance(c, SodaConfig) or c.precision != self.precision:
                raise ValueError("a SODA batch holds SODA configs of one precision")
            key = repr(sorted(c.to_dict().items()))
            group = (e.targets.objective, e.targets.atol, e.targets.rtol)
            if group not in self.groups:
                self.groups.append(group)
            for name, value in (
                ("length", e.length),
                ("learning_rate", c.learning_rate),
                ("beta1", c.beta1),
                ("beta2", c.beta2),
                ("eps", c.eps),
                ("temperature", c.temperature),
                (
                    "temperature_end",
                    c.temperature if c.temperature_end is None else c.temperature_end,
                ),
                ("budget", c.max_steps),
                ("tau", c.temperature),
                ("decay", c.decay if c.use_decay else 1.0),
                ("reset", c.reset_period if c.use_resets else 0),
                ("reinit", c.reinit_period if c.use_reinit else 0),
                ("reinit_std", c.reinit_std),
                ("bias", c.bias_correction),
                ("mean", c.loss_reduction == "mean"),
                ("config", self.configs.setdefault(key, len(self.configs))),
                ("group", self.groups.index(group)),
                ("seed", c.seed),
                ("sample_id", e.sample_id),
                ("age", 0),
            ):
                values[name].append(value)
        for name, kind in _SLOT_ARRAYS.items():
            self.host[name] = np.concatenate([self.host[name], np.asarray(values[name], kind)])
        lengths = np.asarray(values["length"], dtype=np.int64)
        total = int(lengths.sum())
        self.slots.append(observed_rows(entries, dev, screen_slack(self.model)).fields())
        self.rows.append(
            {
                "z": torch.zeros((total, vocab), device=dev),
                "m": torch.zeros((total, vocab), device=dev),
                "v": torch.zeros((total, vocab), device=dev),
            }
        )
        self.row_last = np.concatenate([self.row_last, np.full(total, -1, dtype=np.int64)])
        misses = np.empty(len(entries), dtype=object)
        misses[:] = [set() for _ in entries]
        self.misses = np.concatenate([self.misses, misses])
        context = np.stack([e.targets.continuation[e.row, :-1].numpy() for e in entries])
        before = self.context if len(self.context) else self.context.reshape(0, context.shape[1])
        self.context = np.concatenate([before, context])
        self.row_slot = np.concatenate(
            [self.row_slot, np.repeat(np.arange(first_slot, first_slot + len(entries)), lengths)]
        )
        self.row_offset = np.concatenate(
            [self.row_offset, np.concatenate([np.arange(n) for n in lengths])]
        )
        assert len(self.row_slot) == first_row + total
        self._dirty = True

    def remove(self, left: int, holes: np.ndarray, movers: np.ndarray) -> None:
        count = len(self.slots)
        kept = np.zeros(count, dtype=bool)
        kept[:left] = True
        kept[holes] = False
        kept[movers] = True
        row_left, row_holes, row_movers = removal_plan(
            len(self.row_slot), np.flatnonzero(~kept[self.row_slot])
        )
        self.rows.remove(row_left, row_holes, row_movers)
        renumber = np.arange(count)
        renumber[movers] = holes
        self.row_slot = renumber[apply_plan(self.row_slot, row_left, row_holes, row_movers)]
        self.row_offset = apply_plan(self.row_offset, row_left, row_holes, row_movers)
        self.row_last = apply_plan(self.row_last, row_left, row_holes, row_movers)
        self.context = apply_plan(self.context, left, holes, movers)
        self.misses = apply_plan(self.misses, left, holes, movers)
        self.slots.remove(left, holes, movers)
        for name in self.host:
            self.host[name] = apply_plan(self.host[name], left, holes, movers)
        self.current = None
        self._dirty = True

    def candidates(self, slots: np.ndarray) -> list[list[int]]:
        assert self.current is not None
        return [self.current[self.slot_rows[s]].tolist() for s in slots]

    def refresh(self) -> None:
        """What follows from who is in the batch, rebuilt after slots came or went (each step
        calls it; cheap when nothing changed)."""
        if not self._dirty:
            return
        dev, h = self.model.device, self.host
        count = len(self.slots)
        row_slot = torch.as_tensor(self.row_slot, device=dev)
        lengths = torch.as_tensor(h["length"], device=dev)
        offsets = torch.as_tensor(self.row_offset, device=dev)
        self.layout = Layout(lengths, row_slot, offsets, int(h["length"].max(initial=1)))
        self.slot_rows = slot_rows(self.row_slot, self.row_offset, count)
        self.passes = []
        for plan in self.scheduler.passes(h["length"], self.fixed) if count else []:
            if len(plan.slots) == count:
                self.passes.append(Pass(None, self.layout, None, None, plan.batch, plan.width))
                continue
            idx = torch.as_tensor(plan.slots, device=dev)
            layout, rows = self.layout.select(idx)
            self.passes.append(Pass(plan.slots, layout, rows, idx, plan.batch, plan.width))

        per_row = self.per_row
        decay = h["decay"]
        self.hyper = _Hyper(
            per_row(h["learning_rate"]),
            (1.0 - per_row(h["beta1"], torch.float64)).float(),
            (1.0 - per_row(h["beta2"], torch.float64)).float(),
            per_row(h["eps"]),
            per_row(h["tau"]),
            None if (decay == 1.0).all() else per_row(decay),  # x * 1.0 is x: skipping is exact
        )
        self.weights = None  # "sum": every slot's own loss; "mean": over the config's slots
        if h["mean"].any():
            counts = np.bincount(h["config"], minlength=len(self.configs))[h["config"]]
            weights = np.where(h["mean"], 1.0 / counts, 1.0)
            self.weights = torch.as_tensor(weights, dtype=torch.float32, device=dev)
        groups = np.unique(h["group"])
        self.fluency = any(self.groups[g][0].fluency_weight > 0 for g in groups)
        self._dirty = False

    def per_row(self, values: np.ndarray, dtype: torch.dtype = torch.float32) -> Tensor:
        """A per-slot value as a column over the rows. Always a column, even where every slot
        agrees: the same arithmetic whatever shares the batch (a float operand takes other
        kernels, which round differently). One more entry for the guard row the elementwise
        ops run over (its value: any)."""
        column = np.append(values[self.row_slot], values[:1] if len(values) else 1.0)
        return torch.as_tensor(column, dtype=dtype, device=self.model.device)[:, None]

    # ---- one step -------------------------------------------------------------------------------
    def step(self, steps_after: np.ndarray) -> StepOutcome:
        self.refresh()
        assert self.layout is not None
        grad, loss = self.gradient()
        self.host["age"] += 1
        self.update(grad)
        tokens = self.workspace.argmax(self.z)
        found = self.check(tokens)
        self.apply_schedules(steps_after)
        fixed = self.fixed
        positions = sum(p.batch * (fixed + p.width) for p in self.passes)
        return StepOutcome(
            found,
            loss,
            positions=positions,
            useful=len(self.slots) * fixed + len(self.row_slot),
        )

    @property
    def fixed(self) -> int:
        """Sequence positions besides the input: the prefix and the observed continuation
        but its last token (one objective shape per batch, so one count)."""
        return len(self.model.prefix_ids) + self.groups[0][0].output_tokens - 1

    def gradient(self) -> tuple[Tensor, Tensor]:
        """d loss / d Z for every row and the guard row after them (its gradient is +-0: only a
        padding item, whose outputs no loss reads, takes its relaxed input); slots are
        independent, the batch loss is their sum. One transformer pass per group of
        `self.passes`, all in one backward."""
        self.refresh()
        assert self.layout is not None
        z = self.rows.guarded("z").detach().requires_grad_(True)
        tau = self.hyper.temperature
        self.executor.step_begin()
        model = self.model.for_precision(self.precision)
        # The relaxed pass may flush denormals (faster; it moves values below 1.2e-38 only); the
        # hard-max check runs outside it, so every reported match is exact.
        with (
            torch.enable_grad(),
            _tf32(self.precision == "tf32"),
            flush_denormals(z.device),
            invariant(),
        ):
            # The live rows and the guard row after them: the single pass parks the guard's in
            # a padding item, so no slice enters the graph (its backward would fill and copy).
            rows = RelaxedEmbedding.apply(z, model.embedding_matrix, tau, self.workspace)
            rows = model.relaxed_embeds(rows)
            probs = torch.softmax(z / tau, dim=-1)[: len(self.row_slot)] if self.fluency else None
            continuation = self.slots["continuation"]
            loss = None
            for p in self.passes:
                if p.slots is None:  # one pass holds every slot
                    embeds = sequence_embeds(
                        model, p.layout, rows, continuation, p.width, p.batch, spare=1
                    )
                    hidden = model.hidden(embeds, prepadded=True, executor=self.executor)
                    loss = self.slot_loss(model, hidden, p, probs)
                    break
                embeds = sequence_embeds(
                    model, p.layout, rows[p.rows], continuation[p.index], p.width, p.batch
                )
                hidden = model.hidden(embeds, prepadded=True, executor=self.executor)
                part = self.slot_loss(model, hidden, p, None if probs is None else probs[p.rows])
                if loss is None:
                    loss = part.new_zeros(len(self.slots))
                loss = loss.index_put((p.index,), part)
            assert loss is not None
            # d(sum of w * loss) / d loss is w: seeding the backward with it is the same
            # arithmetic as summing first, without the sum, its seed and the product.
            seed = self.weights if self.weights is not None else self._ones(len(loss))
            (grad,) = torch.autograd.grad(loss, z, grad_outputs=seed.to(loss.dtype))
        return grad, loss.detach()

    def _ones(self, count: int) -> Tensor:
        """`count` ones (a view of one kept vector: the backward only reads its seed)."""
        if self._seed is None or len(self._seed) < count:
            self._seed = torch.ones(max(count, 64), device=self.model.device)
        return self._seed[:count]

    def slot_loss(
        self, model: LoadedModel, hidden: Tensor, p: Pass, probs: Tensor | None
    ) -> Tensor:
        """The loss of a pass's slots, each under its own objective (computed once per
        objective in the pass)."""
        layout = p.layout
        batch = self.observed if p.slots is None else self.observed.select(p.index)
        group = self.host["group"] if p.slots is None else self.host["group"][p.slots]
        present = np.unique(group)
        if len(present) == 1:
            objective = self.groups[int(present[0])][0]
            return objective_loss(model, objective, hidden, layout, batch, probs)
        loss = None
        for g in present:
            idx = torch.as_tensor(np.flatnonzero(group == g), device=hidden.device)
            sub, rows = layout.select(idx, layout.longest)
            part = objective_loss(
                model,
                self.groups[int(g)][0],
                hidden[idx],
                sub,
                batch.select(idx),
                None if probs is None else probs[rows],
            )
            if loss is None:
                loss = part.new_zeros(layout.batch)
            loss = loss.index_put((idx,), part)
        assert loss is not None
        return loss

    @property
    def observed(self) -> BatchTargets:
        """The observed rows of the live slots."""
        s = self.slots
        return BatchTargets(*(s[name] if name in s else None for name in BatchTargets.FIELDS))

    @torch.no_grad()
    def update(self, grad: Tensor) -> None:
        """Adam (bias-corrected only for the slots that ask), then multiplicative decay, in
        place. `grad` (the rows, and the guard row after them) is consumed."""
        self.refresh()
        if len(grad) == len(self.row_slot):  # no guard row given: a zero one
            grad = torch.cat([grad, grad.new_zeros((1, grad.shape[1]))])
        h, host = self.hyper, self.host
        correction = None
        if host["bias"].any():
            rows = np.append(self.row_slot, 0)  # the guard row: any slot's values
            age = host["age"][rows].astype(np.float64)
            on = host["bias"][rows]
            b1, b2 = host["beta1"][rows], host["beta2"][rows]
            dev = self.z.device
            first = np.where(on, 1 - b1**age, 1.0)
            second = np.where(on, 1 - b2**age, 1.0)
            correction = (
                torch.as_tensor(first, dtype=torch.float32, device=dev)[:, None],
                torch.as_tensor(second, dtype=torch.float32, device=dev)[:, None],
            )
        # with the guard row: see `Buffers`
        self.executor.fused(_adam_decay)(
            self.rows.guarded("z"),
            grad,
            self.rows.guarded("m"),
            self.rows.guarded("v"),
            h.learning_rate,
            h.one_minus_beta1,
            h.one_minus_beta2,
            h.eps,
            h.decay,
            correction,
        )

    @torch.no_grad()
    def check(self, tokens: Tensor) -> np.ndarray:
        """The hard-max check (found mask, on the host), run only for slots whose tokens
        changed since their last check: an unchanged candidate already failed."""
        count, dev = len(self.slots), tokens.device
        # A copy: on a CPU `tokens` is the workspace's buffer, which the next step overwrites.
        self.current = current = tokens.cpu().numpy().copy()
        changed_rows = current != self.row_last
        self.row_last = current.copy()
        changed = np.bincount(self.row_slot, weights=changed_rows, minlength=count) > 0
        found = np.zeros(count, dtype=bool)
        lengths = self.host["length"]
        for g in np.unique(self.host["group"][changed]):
            slots = np.flatnonzero(changed & (self.host["group"] == g))
            objective, atol, rtol = self.groups[g]
            # Each candidate's input, its continuation but the last token, then zeros.
            extra = self.context.shape[1]
            seqs = np.zeros((len(slots), int(lengths[slots].max()) + extra), dtype=np.int64)
            index = np.full(count, -1)
            index[slots] = np.arange(len(slots))
            rows = np.flatnonzero(index[self.row_slot] >= 0)
            seqs[index[self.row_slot[rows]], self.row_offset[rows]] = current[rows]
            after = lengths[slots][:, None] + np.arange(extra)
            seqs[np.arange(len(slots))[:, None], after] = self.context[slots]
            every = len(slots) == count  # then candidate c is row c: no lookups
            match = check_sequences(
                self.model,
                objective,
                prepared_sequences(self.model, seqs, dev),
                lengths[slots],  # on the host: the observed positions are planned there
                self.observed,
                None if every else torch.as_tensor(slots, device=dev),
                atol,
                rtol,
                misses=self.misses[slots],
                prepared=True,
            )
            found[slots] = match.cpu().numpy()
        return found

    @torch.no_grad()
    def apply_schedules(self, steps_after: np.ndarray) -> None:
        """Each slot's own moment resets (every `reset_period` of its steps) and re-draws of Z
        (every `reinit_period`, with its moments reset too)."""
        self.refresh()
        h = self.host
        if (h["temperature_end"] != h["temperature"]).any():  # a constant slot stays: x * 1**y
            h["tau"] = annealed_temperature(
                h["temperature"], h["temperature_end"], steps_after, h["budget"]
            )
            self.hyper.temperature = self.per_row(h["tau"])
        reset = (h["reset"] > 0) & (steps_after % np.maximum(h["reset"], 1) == 0)
        reinit = (h["reinit"] > 0) & (steps_after % np.maximum(h["reinit"], 1) == 0)
        zero = np.flatnonzero(reset | reinit)
        if not len(zero):
            return
        dev = self.z.device
        rows = torch.as_tensor(np.concatenate([self.slot_rows[s] for s in zero]), device=dev)
        self.rows["m"][rows] = 0.0
        self.rows["v"][rows] = 0.0
        h["age"][zero] = 0
        redraw = np.flatnonzero(reinit)
        if len(redraw):
            # Keyed by (seed, sample id, draw number), not by the order a shared generator is
            # consumed in, so a sample follows the same trajectory whatever its batch
            # neighbours, its slot, or the actor a retried shard lands on.
            vocab = self.z.shape[-1]
            fresh = torch.cat(
                [
                    keyed_normal(
                        (int(h["length"][s]), vocab),
                        int(h["seed"][s]),
                        int(h["sample_id"][s]),
                        int(steps_after[s]) // int(h["reinit"][s]),
                    )
                    * float(h["reinit_std"][s])
                    for s in redraw
                ]
            )
            where = np.concatenate([self.slot_rows[s] for s in redraw])
            self.z[torch.as_tensor(where, device=dev)] = fresh.to(dev)
