"""A hand-written mutation pass over the engine: does the fast test set notice each fault?

    python benchmarks/mutants.py                 # every mutant, one line each
    python benchmarks/mutants.py --only found    # mutants whose name contains "found"

Each mutant is one textual edit to a file of `sodaray/` (the kind of slip a refactor makes: a
dropped term, a flipped comparison, a lost reset). The committed tree is copied beside this
checkout (tests find `../shared` by path), the edit applied, and the fast tests below run with
`-x`; "killed" names the first failing test, "SURVIVED" means no fast test noticed. The tree is
never edited in place, so a run cannot leave a mutant behind.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FAST_TESTS = [
    "tests/test_search_steps.py",
    "tests/test_adam.py",
    "tests/test_update_rule.py",
    "tests/test_objectives.py",
    "tests/test_invert.py",
    "tests/test_reported_results.py",
]


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    old: str
    new: str


MUTANTS = [
    Mutant(
        "adam: no first-moment decay",
        "sodaray/search/adam.py",
        "m.mul_(beta1).add_(grad, alpha=1 - beta1)",
        "m.mul_(beta1).add_(grad)",
    ),
    Mutant(
        "adam: eps dropped",
        "sodaray/search/adam.py",
        "denom = torch.sqrt(v, out=grad).add_(eps)",
        "denom = torch.sqrt(v, out=grad).add_(1e-30)",
    ),
    Mutant(
        "adam: bias correction on beta1 only",
        "sodaray/search/adam.py",
        "denom = torch.div(v, (1 - beta2**step).view(per_slot), out=grad)",
        "denom = torch.div(v, (1 - 0 * beta2**step).view(per_slot), out=grad)",
    ),
    Mutant(
        "soda: decay never applied",
        "sodaray/search/soda.py",
        "if c.use_decay and c.decay != 1.0:",
        "if c.use_decay and c.decay == 1.0:",
    ),
    Mutant(
        "soda: moments never reset",
        "sodaray/search/soda.py",
        "(steps_after % c.reset_period == 0)\n            if c.use_resets",
        "(steps_after % c.reset_period == -1)\n            if c.use_resets",
    ),
    Mutant(
        "soda: re-init off by one step",
        "sodaray/search/soda.py",
        "reinit = (steps_after % c.reinit_period == 0)",
        "reinit = ((steps_after + 1) % c.reinit_period == 0)",
    ),
    Mutant(
        "soda: temperature ignored in the gradient",
        "sodaray/search/soda.py",
        "return grad.div_(ctx.temperature), None, None, None",
        "return grad, None, None, None",
    ),
    Mutant(
        "pool: every result reported as found",
        "sodaray/search/pool.py",
        "found = out.found.cpu().numpy()",
        "found = out.found.cpu().numpy() | True",
    ),
    Mutant(
        "pool: max_seconds ignored",
        "sodaray/search/pool.py",
        "done |= (time.perf_counter() - started) >= max_seconds",
        "done |= (time.perf_counter() - started) < 0",
    ),
    Mutant(
        "pool: refilled slot keeps the old step count",
        "sodaray/search/pool.py",
        "steps[refill] = 0",
        "steps[refill] = steps[refill]",
    ),
    Mutant(
        "invert: steps of earlier auto lengths dropped",
        "sodaray/api.py",
        "steps=int(steps[j]) + (prev.steps if prev else 0)",
        "steps=int(steps[j])",
    ),
    Mutant(
        "invert: exact compares only the first token",
        "sodaray/api.py",
        "exact=None if true is None else toks == list(true)",
        "exact=None if true is None else toks[:1] == list(true)[:1]",
    ),
    Mutant(
        "logits: match ignores rtol",
        "sodaray/observations.py",
        "close = torch.isclose(full, values, atol=atol, rtol=rtol).flatten(1).all(1)",
        "close = torch.isclose(full, values, atol=atol, rtol=1.0).flatten(1).all(1)",
    ),
    Mutant(
        "logits: match checks one position only",
        "sodaray/observations.py",
        "close = torch.isclose(full, values, atol=atol, rtol=rtol).flatten(1).all(1)",
        "close = torch.isclose(full, values, atol=atol, rtol=rtol)[:, 0].all(-1)",
    ),
    Mutant(
        "logits: top-k set not checked",
        "sodaray/observations.py",
        "close &= (own == indices.sort(-1).values).flatten(1).all(1)",
        "close &= (own == own).flatten(1).all(1)",
    ),
    Mutant(
        "logits: huber delta ignored",
        "sodaray/observations.py",
        'reduction="none", delta=objective.huber_delta',
        'reduction="none", delta=1.0',
    ),
    Mutant(
        "text: match checks the first output token only",
        "sodaray/observations.py",
        "return (model.unembed(hidden).argmax(-1) == batch.continuation[rows]).all(1)",
        "return (model.unembed(hidden).argmax(-1) == batch.continuation[rows])[:, 0]",
    ),
    Mutant(
        "text: loss on the max, not the gap",
        "sodaray/observations.py",
        "return (logp.amax(-1) - lp_true).clamp_min(1e-12).mean(1)",
        "return (-lp_true).clamp_min(1e-12).mean(1)",
    ),
    Mutant(
        "objective: observed positions shifted by one",
        "sodaray/objectives.py",
        "start = len(model.prefix_ids) + n - 1",
        "start = len(model.prefix_ids) + n - 2",
    ),
    Mutant(
        "objective: continuation context dropped",
        "sodaray/objectives.py",
        "if batch.continuation.shape[1] > 1:",
        "if batch.continuation.shape[1] > 10**9:",
    ),
]


def run(mutant: Mutant, base: Path, timeout: float) -> tuple[str, float]:
    tree = Path(tempfile.mkdtemp(prefix="mutant-", dir=ROOT.parent))
    try:
        shutil.copytree(base, tree, dirs_exist_ok=True)
        target = tree / mutant.path
        text = target.read_text()
        if text.count(mutant.old) != 1:
            return f"NOT APPLIED (the text occurs {text.count(mutant.old)} times)", 0.0
        target.write_text(text.replace(mutant.old, mutant.new))
        env = dict(os.environ, PYTHONPATH=str(tree))
        cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *FAST_TESTS]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(
                cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            return "killed (timeout)", time.perf_counter() - t0
        wall = time.perf_counter() - t0
        if proc.returncode == 0:
            return "SURVIVED", wall
        failed = [ln for ln in proc.stdout.splitlines() if ln.startswith("FAILED")]
        return f"killed by {failed[0].split()[1] if failed else 'an error'}", wall
    finally:
        shutil.rmtree(tree, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="run mutants whose name contains this")
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="mutant-base-", dir=ROOT.parent))
    try:
        # The committed tree only (no .venv, no results): git archive of HEAD.
        archive = subprocess.run(
            ["git", "archive", "HEAD"], cwd=ROOT, capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
        # The unmutated tree first: a mutant can only count as killed if this passes.
        outcome, wall = run(
            Mutant("baseline", "sodaray/api.py", "def invert(", "def invert("), base, args.timeout
        )
        print(f"{'baseline (no change)':50s} {outcome}  ({wall:.0f}s)", flush=True)
        if outcome != "SURVIVED":
            raise SystemExit("the fast tests fail on the unmutated tree; nothing to measure")
        survived = 0
        chosen = [m for m in MUTANTS if args.only in m.name]
        for mutant in chosen:
            outcome, wall = run(mutant, base, args.timeout)
            survived += outcome == "SURVIVED"
            print(f"{mutant.name:50s} {outcome}  ({wall:.0f}s)", flush=True)
        print(f"# {len(chosen) - survived} of {len(chosen)} mutants killed by the fast tests")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
