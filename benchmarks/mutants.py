"""A hand-written mutation pass over the engine: does the fast test set notice each fault?

    python benchmarks/mutants.py                 # every engine mutant, one line each
    python benchmarks/mutants.py --only found    # mutants whose name contains "found"
    python benchmarks/mutants.py --set loops     # the sweep and tuning loops (Ray; minutes each)

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


# The tests that drive the runner's and the tuner's loops on a real local Ray.
LOOP_TESTS = [
    "tests/test_runner.py",
    "tests/test_stream.py",
    "tests/test_resume.py",
    "tests/test_tuner.py",
    "tests/test_study_resume.py",
    "tests/test_experiment_layer.py",
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
        "sodaray/search/soda/batch.py",
        "if c.use_decay and c.decay != 1.0:",
        "if c.use_decay and c.decay == 1.0:",
    ),
    Mutant(
        "soda: moments never reset",
        "sodaray/search/soda/batch.py",
        "(steps_after % c.reset_period == 0)\n            if c.use_resets",
        "(steps_after % c.reset_period == -1)\n            if c.use_resets",
    ),
    Mutant(
        "soda: re-init off by one step",
        "sodaray/search/soda/batch.py",
        "reinit = (steps_after % c.reinit_period == 0)",
        "reinit = ((steps_after + 1) % c.reinit_period == 0)",
    ),
    Mutant(
        "soda: temperature ignored in the gradient",
        "sodaray/search/soda/batch.py",
        "return grad.div_(ctx.temperature), None, None, None",
        "return grad, None, None, None",
    ),
    Mutant(
        "pool: every result reported as found",
        "sodaray/search/engine/pool.py",
        "found = out.found.cpu().numpy()",
        "found = out.found.cpu().numpy() | True",
    ),
    Mutant(
        "pool: max_seconds ignored",
        "sodaray/search/engine/pool.py",
        "done |= (time.perf_counter() - started) >= max_seconds",
        "done |= (time.perf_counter() - started) < 0",
    ),
    Mutant(
        "pool: refilled slot keeps the old step count",
        "sodaray/search/engine/pool.py",
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
        "sodaray/objective/observations.py",
        "close = torch.isclose(full, values, atol=atol, rtol=rtol).flatten(1).all(1)",
        "close = torch.isclose(full, values, atol=atol, rtol=1.0).flatten(1).all(1)",
    ),
    Mutant(
        "logits: match checks one position only",
        "sodaray/objective/observations.py",
        "close = torch.isclose(full, values, atol=atol, rtol=rtol).flatten(1).all(1)",
        "close = torch.isclose(full, values, atol=atol, rtol=rtol)[:, 0].all(-1)",
    ),
    Mutant(
        "logits: top-k set not checked",
        "sodaray/objective/observations.py",
        "close &= (own == indices.sort(-1).values).flatten(1).all(1)",
        "close &= (own == own).flatten(1).all(1)",
    ),
    Mutant(
        "logits: huber delta ignored",
        "sodaray/objective/observations.py",
        'reduction="none", delta=objective.huber_delta',
        'reduction="none", delta=1.0',
    ),
    Mutant(
        "text: match checks the first output token only",
        "sodaray/objective/observations.py",
        "return (model.unembed(hidden).argmax(-1) == batch.continuation[rows]).all(1)",
        "return (model.unembed(hidden).argmax(-1) == batch.continuation[rows])[:, 0]",
    ),
    Mutant(
        "text: loss on the max, not the gap",
        "sodaray/objective/observations.py",
        "return (logp.amax(-1) - lp_true).clamp_min(1e-12).mean(1)",
        "return (-lp_true).clamp_min(1e-12).mean(1)",
    ),
    Mutant(
        "objective: observed positions shifted by one",
        "sodaray/objective/objectives.py",
        "start = len(model.prefix_ids) + n - 1",
        "start = len(model.prefix_ids) + n - 2",
    ),
    Mutant(
        "objective: continuation context dropped",
        "sodaray/objective/objectives.py",
        "if batch.continuation.shape[1] > 1:",
        "if batch.continuation.shape[1] > 10**9:",
    ),
]


# Faults in the loops over Ray (`runner/execute.py`'s `_Dispatch`, `tuner/study.py`'s `_Trials`)
# and what they share (`experiment/`): a lost retry, a miscounted try, a wrong state told.
LOOP_MUTANTS = [
    Mutant(
        "runner: a failed call's shards never retried",
        "sodaray/runner/execute.py",
        "        if retry:\n            self.queues[call.key].append(retry)",
        "        if False:\n            self.queues[call.key].append(retry)",
    ),
    Mutant(
        "runner: tries not counted (a failing shard retried forever)",
        "sodaray/runner/execute.py",
        "tries = self.attempts[key] = self.attempts.get(key, 0) + 1",
        "tries = self.attempts[key] = 1",
    ),
    Mutant(
        "runner: a call ending with shards left is not a failure",
        "sodaray/runner/execute.py",
        "            if call.left:  # the generator ended",
        "            if False:  # the generator ended",
    ),
    Mutant(
        "runner: an earlier run's error file kept after success",
        "sodaray/runner/execute.py",
        "        error_path(plan.meta, index).unlink(missing_ok=True)\n        done",
        "        done",
    ),
    Mutant(
        "runner: a failed shard leaves no error file",
        "sodaray/runner/execute.py",
        "                error_path(plan.meta, index).write_text(",
        "                (plan.meta / 'ignored.json').write_text(",
    ),
    Mutant(
        "runner: occupancy counts not passed on",
        "sodaray/runner/execute.py",
        "            output.slot_steps,\n            output.batch_steps,",
        "            0,\n            output.batch_steps,",
    ),
    Mutant(
        "tuner: a dead actor's trial not enqueued again",
        "sodaray/tuner/study.py",
        "                self.study.enqueue_trial(params, skip_if_exists=False)",
        "                pass",
    ),
    Mutant(
        "tuner: a retried trial counted as a new one",
        "sodaray/tuner/study.py",
        "                self.launched -= 1  # the retry replaces it",
        "                pass",
    ),
    Mutant(
        "tuner: a pruned trial told as complete",
        "sodaray/tuner/study.py",
        '        if result.state == "pruned":',
        "        if False:",
    ),
    Mutant(
        "tuner: trial attributes not set",
        "sodaray/tuner/study.py",
        "        set_trial_attrs(self.study, number, result, trial_file)",
        "        pass",
    ),
    Mutant(
        "replica rows: a trial's texts not matched to its results",
        "sodaray/experiment/replica.py",
        "values if values is None or picked is None else [values[i] for i in picked]",
        "values",
    ),
    Mutant(
        "replica rows: the loaded model's name instead of the entry's id",
        "sodaray/experiment/replica.py",
        "    run.model = spec.id\n",
        "",
    ),
]

SETS = {"engine": (MUTANTS, FAST_TESTS), "loops": (LOOP_MUTANTS, LOOP_TESTS)}


def run(mutant: Mutant, base: Path, timeout: float, tests: list[str]) -> tuple[str, float]:
    tree = Path(tempfile.mkdtemp(prefix="mutant-", dir=ROOT.parent))
    try:
        shutil.copytree(base, tree, dirs_exist_ok=True)
        target = tree / mutant.path
        text = target.read_text()
        if text.count(mutant.old) != 1:
            return f"NOT APPLIED (the text occurs {text.count(mutant.old)} times)", 0.0
        target.write_text(text.replace(mutant.old, mutant.new))
        env = dict(os.environ, PYTHONPATH=str(tree))
        cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
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
    parser.add_argument("--set", choices=sorted(SETS), default="engine", help="which mutants")
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args()
    mutants, tests = SETS[args.set]
    base = Path(tempfile.mkdtemp(prefix="mutant-base-", dir=ROOT.parent))
    try:
        # The committed tree only (no .venv, no results): git archive of HEAD.
        archive = subprocess.run(
            ["git", "archive", "HEAD"], cwd=ROOT, capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
        # The unmutated tree first: a mutant can only count as killed if this passes.
        baseline = Mutant("baseline", "sodaray/api.py", "def invert(", "def invert(")
        outcome, wall = run(baseline, base, args.timeout, tests)
        print(f"{'baseline (no change)':50s} {outcome}  ({wall:.0f}s)", flush=True)
        if outcome != "SURVIVED":
            raise SystemExit("the fast tests fail on the unmutated tree; nothing to measure")
        survived = 0
        chosen = [m for m in mutants if args.only in m.name]
        for mutant in chosen:
            outcome, wall = run(mutant, base, args.timeout, tests)
            survived += outcome == "SURVIVED"
            print(f"{mutant.name:50s} {outcome}  ({wall:.0f}s)", flush=True)
        print(f"# {len(chosen) - survived} of {len(chosen)} mutants killed by {', '.join(tests)}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
