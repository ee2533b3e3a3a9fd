"""A sweep's plan against its measured wall (issue 41): `sodaray sweep plan` prices a sweep,
`sodaray sweep run` runs it with the same costs, and the two are printed side by side.

    # on a GPU machine, after `source .device/setup.sh` (shared/device/README.md):
    python3 benchmarks/plan_vs_wall.py --device cuda [--costs benchmarks/gpu-costs.yaml]
    # the reduced form, here:
    python benchmarks/plan_vs_wall.py --device cpu --costs /tmp/cpu-costs.yaml

CUDA: issue 41's Ray sweep: a randomly initialised TinyStories-33M-shaped GPT-Neo
(bench_invert.py's `neo`) saved to a temporary folder, 1,000 random inputs of lengths 1-10
(ids over the config's vocabulary), SODA with the tinystories-33m preset, max_batch_size 1000,
200 steps, one replica with num_gpus 1; priced by `--costs` (default: the built-in h100).
CPU: stories260K, lengths 1-3, one replica of one CPU, priced by a CPU costs file
(`bench_invert.py --suite gpu --device cpu --threads 1 --out FILE`). `--samples` and `--steps`
change the size. Both commands run as a user runs them (`python -m sodaray`, in subprocesses);
the plan is the most the sweep can take (every sample its full budget), so "as run" (the same
costs on the steps that ran) is printed too.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

SWEEP = """name: planwall
models: [{{id: "{model}", num_gpus: {gpus}, num_cpus: 1{bos}}}]
datasets:
  - {{name: random, build: {{dataset: random, lengths: "{lengths}", per_length: {per_length},
     seed: 1, vocab: model}}}}
algorithms: [{{name: soda, params: {{max_batch_size: {batch}}}}}]
objectives: [{{kind: logits, output_tokens: 1}}]
max_steps: {steps}
shard_size: {shard}
"""


def sodaray(*args: str) -> dict:
    """One `python -m sodaray ... --json` command's JSON object."""
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    proc = subprocess.run(
        [sys.executable, "-m", "sodaray", *args, "--json"], capture_output=True, text=True, env=env
    )
    if proc.returncode != 0:
        raise SystemExit(f"sodaray {args[0]} {args[1]}: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def neo_folder(folder: Path) -> str:
    """bench_invert.py's `neo` model, saved where a sweep can name it."""
    from bench_invert import build_model

    build_model("neo", "cpu", "float32").model.save_pretrained(folder)
    return str(folder)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--costs", help="costs file or built-in device (cuda default: h100)")
    p.add_argument("--samples", type=int, help="inputs per length (cuda 100, cpu 4)")
    p.add_argument("--steps", type=int, help="step budget (cuda 200, cpu 50)")
    args = p.parse_args()
    cuda = args.device == "cuda"
    if not cuda and not args.costs:
        raise SystemExit("--device cpu needs --costs FILE: a CPU costs file")
    with tempfile.TemporaryDirectory() as tmp:
        model = (
            neo_folder(Path(tmp) / "neo")
            if cuda
            else str(ROOT.parent / "shared/models/stories260K")
        )
        sweep = Path(tmp) / "planwall.yaml"
        per_length = args.samples or (100 if cuda else 4)
        lengths = "1-10" if cuda else "1-3"
        sweep.write_text(
            SWEEP.format(
                model=model,
                gpus=1 if cuda else 0,
                bos=", bos: false" if cuda else "",  # the saved neo has no tokenizer, no BOS
                lengths=lengths,
                per_length=per_length,
                batch=1000 if cuda else 16,
                steps=args.steps or (200 if cuda else 50),
                shard=50 if cuda else 4,
            )
        )
        costs = ["--costs", args.costs] if args.costs else []
        plan = sodaray("sweep", "plan", str(sweep), "--no-calibrate", *costs)
        for job in plan["jobs"]:
            print(
                f"# plan {job['job']}: {job['samples']} samples, at most {job['sample_steps']:,} "
                f"sample-steps, {job['wall_seconds']:.1f} s of wall by {job['priced_by']} costs "
                f"({job['floor_seconds']:.1f} s of pass floors, {job['work_seconds']:.1f} s of "
                f"work, {job['batch_steps']:,.0f} batch-steps)",
                flush=True,
            )
        run = sodaray("sweep", "run", str(sweep), "--out", str(Path(tmp) / "out"), *costs)
        check = run["plan"]
        if not check or not check["planned_seconds"]:
            raise SystemExit(f"no plan to hold the run against: {check}")
        print(
            f"# run: {run['shards_run']} shards, mean batch occupancy "
            f"{100 * (run['occupancy'] or 0):.0f}%, {check['wall_seconds']:.1f} s wall, "
            f"{check['searching_seconds']:.1f} s searching",
            flush=True,
        )
        print(
            f"plan {check['planned_seconds']:.1f} s (as run {check['as_run_seconds']:.1f} s); "
            f"measured {check['searching_seconds']:.1f} s searching, {check['wall_seconds']:.1f} s "
            f"wall: searching/plan {check['searching_over_planned']:.2f}, searching/as-run "
            f"{check['searching_over_as_run']:.2f}, wall/plan {check['wall_over_planned']:.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
