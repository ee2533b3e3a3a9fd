"""A hand-written mutation pass over the engine: does the fast test set notice each fault?

    python benchmarks/mutants.py                 # every engine mutant, one line each
    python benchmarks/mutants.py --only found    # mutants whose name contains "found"
    python benchmarks/mutants.py --set loops     # the sweep and tuning loops (Ray; minutes each)

Each mutant is one textual edit to a file of `sodaray/` (the kind of slip a refactor makes: a
dropped term, a flipped comparison, a lost reset). The committed tree is copied beside this
checkout (tests find `../shared` by path), the edit applied, and the fast tests below run with
`-x`; "killed" names the first failing test, "SURVIVED" means no fast test noticed. The tree is
never edited in place, so a run cannot leave a mutant behind. Before any test runs, every
mutant of the set is looked up in HEAD: one whose target text is not there exactly once (the
code it meant has moved or changed), or a test file that is gone, stops the script with one
line and exit status 2.
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
    "tests/test_replicas.py",
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
        "m.lerp_(grad, weight1)",
        "m.mul_(1 - weight1).add_(grad)",
    ),
    Mutant(
        "adam: eps dropped",
        "sodaray/search/adam.py",
        "denom.add_(eps)",
        "denom.add_(1e-30)",
    ),
    Mutant(
        "adam: bias correction on beta1 only",
        "sodaray/search/adam.py",
        "denom.div_(second.sqrt())",
        "denom.div_(1.0)",
    ),
    Mutant(
        "soda: decay never applied",
        "sodaray/search/soda/step.py",
        "    if decays:  # x * 1.0 is x",
        "    if not decays:  # x * 1.0 is x",
    ),
    Mutant(
        "soda: moments never reset",
        "sodaray/search/soda/step.py",
        'zero = torch.remainder(step, state.column("hi", "reset", rows)) == 0',
        'zero = torch.remainder(step, state.column("hi", "reset", rows)) == -1',
    ),
    Mutant(
        "soda: re-init off by one step",
        "sodaray/search/soda/batch.py",
        'due = np.flatnonzero(self.state.due("reinit", steps_after))',
        'due = np.flatnonzero(self.state.due("reinit", steps_after + 1))',
    ),
    Mutant(
        "soda: temperature ignored in the gradient",
        "sodaray/search/soda/relaxed.py",
        "return grad.div_(ctx.temperature), None, None, None",
        "return grad, None, None, None",
    ),
    Mutant(
        "pool: every result reported as found",
        "sodaray/search/engine/pool.py",
        'int(s["row"][slot]), bool(out.found[slot])',
        'int(s["row"][slot]), True',
    ),
    Mutant(
        "pool: max_seconds ignored",
        "sodaray/search/engine/pool.py",
        '| (now >= s["deadline"])',
        "| (now < 0)",
    ),
    Mutant(
        "pool: admitted search starts at the running slots' step count",
        "sodaray/search/engine/pool.py",
        '("steps", 0),\n                ("settled", 0),',
        '("steps", self.slot["steps"].max(initial=0)),\n'
        '                ("settled", self.slot["settled"].max(initial=0)),',
    ),
    Mutant(
        "invert: steps of earlier auto lengths dropped",
        "sodaray/search/engine/loop.py",
        "steps, seconds, tried = steps + prior_steps, seconds + prior_seconds,",
        "steps, seconds, tried = steps, seconds + prior_seconds,",
    ),
    Mutant(
        "invert: exact compares only the first token",
        "sodaray/search/engine/loop.py",
        "exact=None if true is None else tokens == true,",
        "exact=None if true is None else tokens[:1] == true[:1],",
    ),
    Mutant(
        "logits: match ignores rtol",
        "sodaray/objective/observations.py",
        "return torch.isclose(pred, observed, atol=atol, rtol=rtol).flatten(1)",
        "return torch.isclose(pred, observed, atol=atol, rtol=1.0).flatten(1)",
    ),
    Mutant(
        "logits: match checks one position only",
        "sodaray/objective/observations.py",
        "return _close(logits, values, atol, rtol, slack).all(1)",
        "return _close(logits[:, :1], values[:, :1], atol, rtol, slack).all(1)",
    ),
    Mutant(
        "logits: top-k set not checked",
        "sodaray/objective/observations.py",
        "return close & (own == indices.sort(-1).values).flatten(1).all(1)",
        "return close & (own == own).flatten(1).all(1)",
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
        "return (logits.argmax(-1) == observed).all(1)",
        "return (logits.argmax(-1) == observed)[:, 0]",
    ),
    Mutant(
        "text: loss on the max, not the gap",
        "sodaray/objective/observations.py",
        "return (logp.amax(-1) - lp_true).clamp_min(1e-12).mean(1)",
        "return (-lp_true).clamp_min(1e-12).mean(1)",
    ),
    Mutant(
        "objective: observed positions shifted by one",
        "sodaray/objective/scoring.py",
        "return rows[:, None], prefix + lengths[:, None] - 1 + steps",
        "return rows[:, None], prefix + lengths[:, None] - 2 + steps",
    ),
    Mutant(
        "objective: continuation context dropped",
        "sodaray/objective/scoring.py",
        "    if m > 1:\n        after = p + layout.lengths",
        "    if m > 10**9:\n        after = p + layout.lengths",
    ),
]


# Faults in the loops over Ray: the actor group every sweep and study runs on
# (`experiment/group.py`) and the replica under it (`experiment/replica.py`), the sweep's shard
# bookkeeping (`runner/run.py`'s `_Shards`), the study's trials (`tuner/run.py`, and
# `tuner/owner.py`'s rescue of a dead run's trials): a lost retry, a miscounted try, a wrong
# state told.
LOOP_MUTANTS = [
    Mutant(
        "runner: a failed unit never retried",
        "sodaray/experiment/group.py",
        "final = bad_input or tries >= self.max_attempts",
        "final = True",
    ),
    Mutant(
        "runner: tries not counted (a failing unit retried forever)",
        "sodaray/experiment/group.py",
        "tries = self.attempts[unit.key] = self.attempts.get(unit.key, 0) + 1",
        "tries = self.attempts[unit.key] = 1",
    ),
    Mutant(
        "runner: a unit its dying engine left unfinished is not a failure",
        "sodaray/experiment/replica.py",
        "        if work.error is not None:  # only a dying engine",
        "        if False:  # only a dying engine",
    ),
    Mutant(
        "runner: an earlier run's error file kept after success",
        "sodaray/runner/run.py",
        "        plan.out.remove(error_path(plan.meta, index))\n        head =",
        "        head =",
    ),
    Mutant(
        "runner: a failed shard leaves no error file",
        "sodaray/runner/run.py",
        "plan.out.write(error_path(plan.meta, index), text)",
        "plan.out.write(plan.meta / 'ignored.json', text)",
    ),
    Mutant(
        "runner: occupancy counts not passed on",
        "sodaray/runner/run.py",
        "occupancy = (output.slot_steps, output.capacity_steps, output.batch_steps)",
        "occupancy = (0, output.capacity_steps, output.batch_steps)",
    ),
    Mutant(
        "tuner: a dead run's trial not enqueued again",
        "sodaray/tuner/owner.py",
        "            study.enqueue_trial(params, skip_if_exists=False)\n",
        "            pass\n",
    ),
    Mutant(
        "tuner: a retried trial counted as a failed one",
        "sodaray/tuner/run.py",
        "            if not output.final:\n                return None",
        "            if False:\n                return None",
    ),
    Mutant(
        "tuner: a pruned trial told as complete",
        "sodaray/tuner/run.py",
        "        if unit.key in self.pruned:\n",
        "        if False:\n",
    ),
    Mutant(
        "tuner: trial attributes not set",
        "sodaray/tuner/run.py",
        "            trial.set_user_attr(name, attr)",
        "            pass",
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


def unapplicable(mutants: list[Mutant], tests: list[str], base: Path) -> str | None:
    """Why the run cannot measure anything (None: it can): a test file missing from `base`, or
    a mutant whose target text is not in its file exactly once (moved code would otherwise
    count as a survivor, or a no-op as a kill)."""
    for test in tests:
        if not (base / test).is_file():
            return f"{test}: no such test file in HEAD"
    for mutant in mutants:
        target = base / mutant.path
        count = target.read_text().count(mutant.old) if target.is_file() else 0
        if count != 1:
            where = mutant.path if target.is_file() else f"{mutant.path} (no such file)"
            return f"mutant {mutant.name!r}: its target text occurs {count} times in {where}"
    return None


def run(mutant: Mutant, base: Path, timeout: float, tests: list[str]) -> tuple[str, float]:
    tree = Path(tempfile.mkdtemp(prefix="mutant-", dir=ROOT.parent))
    try:
        shutil.copytree(base, tree, dirs_exist_ok=True)
        target = tree / mutant.path
        target.write_text(target.read_text().replace(mutant.old, mutant.new))
        env = dict(os.environ, PYTHONPATH=str(tree))
        cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider"]
        cmd += ["-p", "no:xdist", *tests]
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
    chosen = [m for m in mutants if args.only in m.name]
    if not chosen:
        print(f"mutants.py: no {args.set} mutant's name contains {args.only!r}", file=sys.stderr)
        raise SystemExit(2)
    base = Path(tempfile.mkdtemp(prefix="mutant-base-", dir=ROOT.parent))
    try:
        # The committed tree only (no .venv, no results): git archive of HEAD.
        archive = subprocess.run(
            ["git", "archive", "HEAD"], cwd=ROOT, capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
        # Every mutant is checked against HEAD before any test runs: one that no longer
        # applies is refused, not reported.
        why = unapplicable(mutants, tests, base)
        if why is not None:
            print(f"mutants.py: {why}; retarget it to the code as it is now", file=sys.stderr)
            raise SystemExit(2)
        # The unmutated tree first: a mutant can only count as killed if this passes.
        baseline = Mutant("baseline", "sodaray/api.py", "def invert(", "def invert(")
        outcome, wall = run(baseline, base, args.timeout, tests)
        print(f"{'baseline (no change)':50s} {outcome}  ({wall:.0f}s)", flush=True)
        if outcome != "SURVIVED":
            raise SystemExit("the fast tests fail on the unmutated tree; nothing to measure")
        survived = 0
        for mutant in chosen:
            outcome, wall = run(mutant, base, args.timeout, tests)
            survived += outcome == "SURVIVED"
            print(f"{mutant.name:50s} {outcome}  ({wall:.0f}s)", flush=True)
        print(f"# {len(chosen) - survived} of {len(chosen)} mutants killed by {', '.join(tests)}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
