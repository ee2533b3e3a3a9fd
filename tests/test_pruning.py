"""Issue 54: what a checkpoint reports (each search's loss and candidate at that very step), the
value a pruner ranks trials by, the pruners over step budgets, the sample-steps a study spent
and pruning saved, and the held-out verdict (`tune --evaluate`), on stories260K and real Ray."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import optuna
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import STORIES, one_line_error

import sodaray
from sodaray.cli import main
from sodaray.search.engine.loop import Engine
from sodaray.search.engine.work import Work
from sodaray.tuner import load_tuning, run_tuning
from sodaray.tuner.run import saved_steps
from sodaray.tuner.storage import open_storage
from sodaray.tuner.study import make_pruner
from sodaray.tuner.values import checkpoint_value, trial_value
from sodaray.tuner.verdict import mcnemar_p


def test_a_mark_is_the_search_s_loss_and_candidate_at_that_step(tiny_llama, one_thread):
    """The loss and candidate a checkpoint keeps for a running search are those the same search
    ends with when its budget is that step (its trajectory up to there is the same)."""
    tokens = [[i, (5 * i + 1) % 64, (3 * i) % 64] for i in range(6)]
    targets = sodaray.make_targets(tiny_llama, tokens)
    marks = Work(targets, sodaray.SodaConfig(max_steps=40, seed=5), [(3,)] * 6, checkpoints=(7, 20))
    engine = Engine(tiny_llama)
    engine.submit(marks)
    engine.run()
    for index, step in enumerate((7, 20)):
        short = sodaray.invert(tiny_llama, targets, sodaray.SodaConfig(max_steps=step, seed=5))
        running = {r for r, res in enumerate(short) if not res.found}
        assert running  # searches still going at the checkpoint: compared there
        assert set(marks.marks[index]) >= running
        for row in running:
            loss, candidate = marks.marks[index][row]
            assert (loss, candidate) == (
                pytest.approx(short[row].final_loss, abs=0),
                short[row].tokens,
            )
    # Every target's steps, counted once (`Work.sample_steps`).
    assert marks.sample_steps() == sum(r.steps for r in marks.results.values())


def test_a_cancelled_work_counts_the_steps_it_took():
    """The steps a cancel stopped count in the work's sample-steps (what a pruned trial spent)."""
    from conftest import tiny_model

    model = tiny_model("gpt2")
    targets = sodaray.make_targets(model, [[i, (7 * i) % 64] for i in range(5)])
    engine = Engine(model)
    work = Work(targets, sodaray.SodaConfig(max_steps=500), [(2,)] * 5, checkpoints=(30,))
    work.on_checkpoint = lambda index, step: engine.cancel(work)
    engine.submit(work)
    engine.run()
    assert work.cancelled and work.dropped_steps > 0
    taken = sum(r.steps for r in work.results.values())
    unfinished = 5 - len(work.results)
    assert unfinished  # stopped while some searched
    # Each unfinished search had taken 30 steps, and at most the lag and the cancel's step more.
    assert taken + 30 * unfinished <= work.sample_steps() <= taken + 33 * unfinished


def test_checkpoint_value_breaks_ties_below_one_sample():
    losses, shares = [0.5, 2.0, 0.0, 1.0], [1.0, 0.5, 1.0, 0.0]
    assert checkpoint_value("exact", 2, 4, losses, shares) == 0.5
    assert checkpoint_value("loss", 2, 4, losses, shares) == trial_value(
        "exact_then_loss", 2, 4, 0.0, losses
    )
    assert checkpoint_value("tokens", 2, 4, losses, shares) == 0.5 + (2.5 / 4) / 5
    assert checkpoint_value("loss", 2, 4, (), ()) == 0.5  # an algorithm that reports none
    for signal in ("loss", "tokens"):
        # One more exact input outranks any tie-break; a better tie-break ranks equal rates.
        worst = checkpoint_value(signal, 3, 4, [math.inf] * 4, [0.0] * 4)
        best = checkpoint_value(signal, 2, 4, [0.0] * 4, [1.0] * 4)
        assert worst > best > checkpoint_value(signal, 2, 4, [3.0] * 4, [0.2] * 4)


def test_pruners_take_the_step_budget_as_their_resource():
    spec = SimpleNamespace(max_steps=400, checkpoints=4)
    halving = make_pruner(SimpleNamespace(**vars(spec), pruner="successive_halving"))
    assert isinstance(halving, optuna.pruners.SuccessiveHalvingPruner)
    assert (halving._min_resource, halving._reduction_factor) == (100, 2)
    band = make_pruner(SimpleNamespace(**vars(spec), pruner="hyperband"))
    assert isinstance(band, optuna.pruners.HyperbandPruner)
    assert (band._min_resource, band._max_resource, band._reduction_factor) == (100, 400, 2)
    assert isinstance(
        make_pruner(SimpleNamespace(**vars(spec), pruner="none")), optuna.pruners.NopPruner
    )


def test_saved_steps_are_the_budget_a_cancel_left():
    unit = SimpleNamespace(samples=4, search=sodaray.SodaConfig(max_steps=100))
    table = pa.table({"steps": [10, 35]})  # two finished; two were stopped
    assert saved_steps(unit, table, 45 + 2 * 50, True) == 45 + 200 - 145
    assert saved_steps(unit, table, 145, False) == 0


def test_mcnemar_exact():
    assert mcnemar_p(0, 0) == 1.0 and mcnemar_p(3, 3) == 1.0
    assert mcnemar_p(5, 0) == pytest.approx(2 / 32) and mcnemar_p(0, 6) == pytest.approx(2 / 64)
    assert mcnemar_p(1, 4) == pytest.approx(2 * (1 + 5) / 32)


needs_stories = pytest.mark.skipif(not STORIES.is_dir(), reason="stories260K not present")


def tuning_file(tmp_path: Path, **overrides) -> Path:
    spec = {
        "name": "early",
        "model": {"id": str(STORIES), "num_cpus": 1},
        "data": {"build": {"dataset": "random", "lengths": "2-3", "per_length": 3, "seed": 0}},
        "algorithm": "soda",
        "fixed": {"max_batch_size": 32},
        "space": {
            "learning_rate": {"type": "float", "low": 0.01, "high": 0.3, "log": True},
            "temperature": {"type": "float", "low": 0.02, "high": 0.2, "log": True},
        },
        "max_steps": 40,
        "trials": 4,
        "checkpoints": 2,
        "sampler": "random",
        "pruner": "successive_halving",
    }
    spec.update(overrides)
    path = tmp_path / "tune.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@needs_stories
def test_a_study_reports_its_signal_counts_its_steps_and_gives_a_verdict(
    tmp_path, local_ray, capsys
):
    """A study on stories260K: every trial records each signal at each checkpoint and reports
    the file's (`loss`); the first checkpoint's values differ between trials; the sample-steps
    it spent are its trials' (a completed one's, its rows' steps); then `tune --evaluate`
    runs the best trial and the defaults on seed-1 inputs and prints the verdict."""
    path = tuning_file(tmp_path)
    out = tmp_path / "out"
    run = run_tuning(load_tuning(path), out, workers=2)
    study = optuna.load_study(study_name=run.study_name, storage=open_storage(run.storage))
    trials = study.get_trials(deepcopy=False)
    firsts = []
    for t in trials:
        signals = t.user_attrs["signals"]
        assert set(signals["20"]) == {"loss", "tokens", "exact"}
        assert t.intermediate_values == {int(s): v["loss"] for s, v in signals.items()}
        firsts.append(signals["20"]["loss"])
        assert t.user_attrs["sample_steps"] > 0
        rows = pq.read_table(t.user_attrs["result_file"]).to_pylist()  # a pruned one's: few
        if t.state == optuna.trial.TrialState.COMPLETE:  # every sample's steps, nothing saved
            assert t.user_attrs["sample_steps"] == sum(r["steps"] for r in rows)
            assert t.user_attrs["saved_steps"] == 0
    assert len(set(firsts)) == len(trials) == 4  # distinct before much is found
    assert min(firsts) < 1.0  # the loss's tie-break, below the rate's next step
    board_spent = sum(t.user_attrs["sample_steps"] for t in trials)
    assert main(["tune", str(path), "--out", str(out), "--trials", "1", "--json"]) == 0
    board = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    latest = optuna.load_study(study_name=run.study_name, storage=open_storage(run.storage))
    assert (
        board["sample_steps"]["spent"] == board_spent + latest.trials[-1].user_attrs["sample_steps"]
    )
    assert board["sample_steps"]["saved"] == sum(t.user_attrs["saved_steps"] for t in latest.trials)

    # The verdict: both arms on the six seed-1 inputs, rows kept, a paired test.
    assert main(["tune", str(path), "--out", str(out), "--evaluate", "--json"]) == 0
    verdict = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    best = max(
        (t for t in latest.trials if t.state == optuna.trial.TrialState.COMPLETE),
        key=lambda t: t.value,
    )
    assert verdict["trial"] == best.number and verdict["samples"] == 6
    assert verdict["data"] == "validation-test, seed 1"
    for name in ("tuned", "default"):
        arm = verdict["arms"][name]
        rows = sodaray.results.read_results(arm["rows"]).to_pylist()
        assert len(rows) == 6 and {r["dataset_seed"] for r in rows} == {1}
        assert arm["exact"] == sum(bool(r["exact"]) for r in rows)
        assert arm["interval"][0] <= arm["rate"] <= arm["interval"][1]
    assert verdict["arms"]["tuned"]["params"] == best.params
    assert verdict["p_value"] == mcnemar_p(verdict["only_tuned"], verdict["only_default"])
    assert verdict["differ"] == (verdict["p_value"] < 0.05)
    assert main(["tune", str(path), "--out", str(out), "--evaluate"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("held-out verdict on study early: its best trial")
    assert lines[1].split()[0] == "tuned" and lines[2].split()[0] == "default"
    assert "McNemar exact p" in lines[3]


@needs_stories
def test_evaluate_without_a_study_or_with_a_data_file_is_one_line(tmp_path, capsys):
    path = tuning_file(tmp_path)
    err = one_line_error(["tune", str(path), "--out", str(tmp_path / "none"), "--evaluate"], capsys)
    assert "no study to evaluate" in err and "run `sodaray tune` first" in err
    data = tmp_path / "data.pq"
    data.write_bytes(b"")
    path = tuning_file(tmp_path, data={"path": str(data)})
    err = one_line_error(["tune", str(path), "--out", str(tmp_path / "none"), "--evaluate"], capsys)
    assert "draws test inputs as the study's `data.build`" in err
