"""Whether the relaxed pass's precision changes what SODA finds (issue 52: "precision by
measurement"), one line per case and precision: found, exact, wall and sample-steps/s, from
one process, same targets, same seed.

    python3 benchmarks/precision_finds.py --device cuda --case stories:3:256:300
    python benchmarks/precision_finds.py --device cpu --case stories:2:16:100

The match check runs at the model's own precision whatever the relaxed pass uses, so a reported
find is exact in every row; what precision can change is the search's trajectory, hence the
found count. Cases are model:n:B:steps (bench_invert.py's models: stories, neo, qwen, qwen3b);
targets are torch.manual_seed(1) randint inputs of length n; the paper's TinyStories preset.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--case", action="append", help="model:n:B:steps (repeatable)")
    p.add_argument("--precision", action="append", choices=("float32", "tf32", "bfloat16"))
    p.add_argument("--executor", default=None)
    args = p.parse_args()
    import torch
    from bench_invert import build_model

    import sodaray

    precisions = args.precision or ["float32", "tf32", "bfloat16"]
    for spec in args.case or ["stories:3:64:200"]:
        name, n, batch, steps = spec.split(":")
        n, batch, steps = int(n), int(batch), int(steps)
        model = build_model(name, args.device, "float32")
        torch.manual_seed(1)
        vocab = model.vocab_size
        tokens = torch.randint(0, vocab, (batch, n)).tolist()
        targets = sodaray.make_targets(model, tokens)
        for precision in precisions:
            config = sodaray.SodaConfig.from_preset(
                "tinystories-33m", max_steps=steps, max_batch_size=batch, precision=precision
            )
            sodaray.invert(
                model, targets, dataclasses.replace(config, max_steps=2), executor=args.executor
            )
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            results = sodaray.invert(model, targets, config, executor=args.executor)
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            wall = time.perf_counter() - t0
            found = sum(r.found for r in results)
            exact = sum(bool(r.exact) for r in results)
            sample_steps = sum(r.steps for r in results)
            print(
                f"precision_finds {spec} {precision:<8} found {found}/{batch} exact {exact} "
                f"wall {wall:.1f} s  {sample_steps / wall:,.0f} sample-steps/s",
                flush=True,
            )
        del model
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
