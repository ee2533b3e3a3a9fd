"""Full-vocabulary passes per SODA step of the CUDA path's fused step, counted on a CPU.

The fused step (`sodaray.search.soda.fused_step`) runs as it would on CUDA, its Triton kernels under
Triton's interpreter on CPU tensors (a pass count does not depend on B or on the device). The
unit is `../shared/tools/vocabpasses.py`'s: bytes of every operand whose last dimension is the
vocabulary V (model weights aside), read or written, over the bytes of one float32 (T x V)
tensor (T = B*n relaxed rows). Aten operations are counted as that tool counts them (the same
dispatch rules); a Triton kernel is invisible to aten, so each launch adds the bytes of its own
vocabulary operands (`fused.VocabTraffic`), and the aten operations the interpreter runs inside
a launch (copies of its operands) are left out. The same model as that tool's: a Qwen2-shaped
random model with the real vocabulary (151,936), one layer, n=3, the qwen2.5-0.5b preset;
B=8 by default (that tool's); the difference of two runs (2 and 6 steps) over 4, so steady
steps only. About 2 minutes on a 2-core CPU.

usage (project root, its venv):
  python benchmarks/vocab_passes.py --shape qwen [--precision bfloat16|float32|tf32] [--eager]
prints a breakdown per operation, then `vocabulary passes per step: N`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter

os.environ["TRITON_INTERPRET"] = "1"  # before Triton compiles anything

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

import sodaray  # noqa: E402
from sodaray.search.soda import kernels as fused  # noqa: E402

SHAPES = {"qwen": 151936, "small": 5003}
SKIP = {
    "view", "_unsafe_view", "as_strided", "t", "transpose", "expand", "slice", "select",
    "detach", "alias", "reshape", "permute", "unsqueeze", "squeeze", "empty", "empty_like",
    "empty_strided", "split", "unbind", "narrow",
}  # fmt: skip


class Count(TorchDispatchMode):
    """Bytes of vocabulary-wide aten operands per operation (vocabpasses.py's rules)."""

    def __init__(self, vocab: int, rows: int, weights: set[int]) -> None:
        super().__init__()
        self.vocab, self.rows, self.weights = vocab, rows, weights
        self.bytes: Counter[str] = Counter()

    def _size(self, t: object) -> int:
        if not isinstance(t, torch.Tensor) or t.dim() == 0 or t.shape[-1] != self.vocab:
            return 0
        if t.untyped_storage().data_ptr() in self.weights:
            return 0
        return t.element_size() * t.numel()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        if name in SKIP or getattr(fused.VocabTraffic.local, "inside", False):
            return out
        ins, _ = tree_flatten((args, {k: v for k, v in kwargs.items() if k != "out"}))
        outs, _ = tree_flatten(out)
        if not name.endswith("_") and "out" in kwargs:
            outs = tree_flatten(kwargs["out"])[0]
        total = sum(self._size(t) for t in ins) + sum(self._size(t) for t in outs)
        if total:
            self.bytes[f"aten.{name}"] += total
        return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen")
    parser.add_argument("--precision", choices=["float32", "tf32", "bfloat16"], default="bfloat16")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--eager", action="store_true", help="count the eager step instead")
    args = parser.parse_args()
    if not fused.available():
        print("vocab_passes: error: the triton package is not installed", file=sys.stderr)
        return 2
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.set_num_threads(min(2, torch.get_num_threads()))
    torch.manual_seed(0)
    vocab, n = SHAPES[args.shape], 3
    batch = args.batch
    rows = batch * n
    cfg = Qwen2Config(
        vocab_size=vocab, hidden_size=96, intermediate_size=192, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
        tie_word_embeddings=True,
    )  # fmt: skip
    hf = AutoModelForCausalLM.from_config(cfg)
    lm = sodaray.wrap_model(hf, None, name=f"{args.shape}-shape")
    weights = {q.untyped_storage().data_ptr() for q in hf.parameters()}
    # The gradient pass's copy of the model at its precision: its weights are weights too.
    weights |= {
        q.untyped_storage().data_ptr() for q in lm.for_precision(args.precision).model.parameters()
    }
    inputs = torch.randint(0, vocab, (batch, n), generator=torch.Generator().manual_seed(1))
    targets = sodaray.make_targets(lm, inputs.tolist())
    mode = "off" if args.eager else "on"

    def config(steps: int) -> sodaray.SodaConfig:
        return sodaray.SodaConfig.from_preset(
            "qwen2.5-0.5b",
            max_steps=steps,
            max_batch_size=batch,
            precision=args.precision,
            fused=mode,
        )

    def count(steps: int) -> Counter[str]:
        counter = Count(vocab, rows, weights)
        with fused.counting() as log, counter:
            sodaray.invert(lm, targets, config(steps))
        for name, size in log:
            counter.bytes[name] += size
        return counter.bytes

    sodaray.invert(lm, targets, config(2))  # warm: the interpreter, the model's copies
    short, long = count(2), count(6)
    unit = 4 * rows * vocab
    per_step = {k: (long[k] - short[k]) / 4 / unit for k in set(short) | set(long)}
    print(
        f"{'eager' if args.eager else 'fused'} step, {args.shape} shape (V {vocab}), "
        f"{args.precision}, B={batch}, n={n}: float32 (T x V) passes per step by operation"
    )
    for name, passes in sorted(per_step.items(), key=lambda kv: -kv[1]):
        if abs(passes) >= 0.005:
            print(f"  {passes:6.2f}  {name}")
    print(f"vocabulary passes per step: {sum(per_step.values()):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
