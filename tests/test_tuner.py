"""The tuner on real Ray and real Optuna journal storage, with the stories260K model."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
import yaml
from conftest import STORIES

import sodaray
from sodaray.cli import main
from sodaray.cli.tune import leaderboard, print_leaderboard
from sodaray.config.presets import load_preset_file
from sodaray.data.store import dataset_hash, read_dataset
from sodaray.tuner import load_tuning, run_tuning
from sodaray.tuner.storage import open_storage

pytestmark = pytest.mark.skipif(not STORIES.is_dir(), reason="stories260K not present")


def write_tuning(tmp_path: Path, **overrides) -> Path:
    spec = {
        "name": "tiny",
        "model": {"id": str(STORIES), "num_cpus": 1},
        "data": {"build": {"dataset": "random", "lengths": "1-2", "per_length": 3, "seed": 0}},
        "algorithm": "soda",
        "fixed": {"max_batch_size": 16},
        "space": {
            "learning_rate": {"type": "float", "low": 0.03, "high": 0.3, "log": True},
            "reset_period": {"type": "int", "low": 20, "high": 60, "step": 20},
        },
        "max_steps": 40,
        "trials": 2,
        "checkpoints": 2,
        # The median rule waits for 3 trials: a study of 2 or 3 runs each to its end.
        "pruner": "median",
    }
    spec.update(overrides)
    path = tmp_path / "tune.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def load(run) -> optuna.Study:
    return optuna.load_study(study_name=run.study_name, storage=open_storage(run.storage))


def test_small_study_completes_resumes_and_writes_a_preset(tmp_path, local_ray, capsys):
    spec = load_tuning(write_tuning(tmp_path))
    run = run_tuning(spec, tmp_path / "out", workers=2)
    assert [o.state for o in run.outcomes] == ["complete", "complete"]
    assert Path(run.storage).name == "study.journal" and Path(run.storage).is_file()
    study = load(run)
    assert len(study.trials) == 2
    # At 20 and 40 steps (2 checkpoints of 40): the exact rate, ties broken by the loss there
    # (below one sample's worth: the rate is its whole part in sixths), never falling in rate;
    # at the budget, the trial's own exact rate.
    for t in study.trials:
        assert sorted(t.intermediate_values) == [20, 40]
        early, last = (int(t.intermediate_values[s] * 6 + 1e-9) for s in (20, 40))
        assert early <= last == round(t.value * 6)
        assert t.intermediate_values == {
            int(s): v["loss"] for s, v in t.user_attrs["signals"].items()
        }
    # User attributes, for optuna-dashboard and the optuna CLI: what the study and each trial were.
    assert study.user_attrs["model"] == str(STORIES) and study.user_attrs["max_steps"] == 40
    assert study.user_attrs["fixed"] == {"max_batch_size": 16}
    assert study.user_attrs["dataset"] == "validation" and study.user_attrs["algorithm"] == "soda"
    (data_file,) = (tmp_path / "out" / "tiny" / ".sodaray" / "datasets").glob("*.pq")
    data_hash = dataset_hash(read_dataset(data_file))
    assert study.user_attrs["dataset_hash"] == data_hash
    for t in study.trials:
        result_file = Path(t.user_attrs["result_file"])
        assert result_file == tmp_path / "out" / "tiny" / "trials" / f"trial-{t.number:05d}.parquet"
        trial_rows = sodaray.results.read_results(result_file).to_pylist()
        assert t.user_attrs["total"] == len(trial_rows) == 6
        assert t.user_attrs["exact"] == sum(bool(r["exact"]) for r in trial_rows)
        assert t.user_attrs["seconds"] > 0
    # Per-sample rows for every trial, in the result schema, with the data's identity.
    rows = sodaray.results.read_results(tmp_path / "out" / "tiny" / "trials")
    assert len(rows) == 2 * 6 and set(rows["job"].to_pylist()) == {"trial-00000", "trial-00001"}
    assert set(rows["dataset_hash"].to_pylist()) == {data_hash}
    # Each row's true text is its own sample's (results come back in finishing order).
    data = read_dataset(data_file)
    texts = dict(zip(data["sample_id"].to_pylist(), data["text"].to_pylist(), strict=True))
    assert all(texts[r["sample_id"]] for r in rows.to_pylist())
    assert [r["true_text"] for r in rows.to_pylist()] == [
        texts[r["sample_id"]] for r in rows.to_pylist()
    ]
    assert set(rows["dataset_seed"].to_pylist()) == {0} and set(rows["shard"].to_pylist()) == {None}
    assert all(r.startswith("sha256:") for r in rows["model_revision"].to_pylist())
    # The trials' files are the only Parquet files: no dataset copy among them.
    parquet = {p.parent.name for p in (tmp_path / "out").rglob("*.parquet")}
    assert parquet == {"trials"}
    # The best parameters load as a SODA preset.
    params = load_preset_file(run.preset_path)
    config = sodaray.SodaConfig(**params)
    assert config.learning_rate == pytest.approx(run.best_params["learning_rate"])
    assert config.reset_period == run.best_params["reset_period"]
    # The leaderboard as JSON (`sodaray tune --json`): the best trial first.
    board = json.loads(json.dumps(leaderboard(run)))
    assert board["states"] == {"complete": 2} and len(board["top"]) == 2
    assert board["top"][0]["params"] == run.best_params
    assert board["top"][0]["value"] == pytest.approx(run.best_value)
    # Plots the README promises but 2 trials cannot make are named, with the reason.
    assert [Path(p).name for p in board["plots"]] == ["history.png"]
    assert sorted(board["plots_skipped"]) == ["importances", "parallel_coordinate"]
    assert "needs 8 completed trials" in board["plots_skipped"]["importances"]
    # The printed leaderboard says the same: counts, then the best trial first.
    print_leaderboard(run, leaderboard(run))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith(": 2 trials: 2 complete")
    assert lines[1].startswith(f"  1. trial {board['top'][0]['trial']:>4}  {run.best_value:.4f}")
    assert any(line.startswith("plot importances skipped: needs 8") for line in lines)
    # The same command again resumes: the study grows, numbering goes on.
    again = run_tuning(load_tuning(write_tuning(tmp_path)), tmp_path / "out", trials=1)
    assert [o.number for o in again.outcomes] == [2]
    assert len(load(again).trials) == 3


def test_a_trial_whose_replica_dies_runs_again_in_the_same_trial(tmp_path, local_ray):
    """Its samples' results do not depend on the replica: the trial is run again where Ray
    restarted it, reports the same checkpoints (not twice), and completes with the value an
    undisturbed run gives."""
    spec = load_tuning(write_tuning(tmp_path, max_steps=400, sampler="random"))
    killed: list[int] = []

    def kill_first(number: int, pids: list[int]) -> None:
        if not killed:
            killed.append(number)
            os.kill(pids[0], signal.SIGKILL)

    run = run_tuning(spec, tmp_path / "out", trials=1, on_launch=kill_first)
    assert killed and [(o.number, o.state) for o in run.outcomes] == [(killed[0], "complete")]
    (trial,) = load(run).trials
    assert trial.state == optuna.trial.TrialState.COMPLETE
    assert sorted(trial.intermediate_values) == [200, 400]
    calm = run_tuning(spec, tmp_path / "calm", trials=1)
    (same,) = load(calm).trials
    assert same.params == trial.params and same.value == trial.value


def test_trial_left_running_by_a_dead_driver_is_failed_on_resume(tmp_path, local_ray):
    spec = load_tuning(write_tuning(tmp_path))
    run = run_tuning(spec, tmp_path / "out", trials=1)
    study = load(run)
    orphan = study.ask(spec.distributions())  # a driver that died mid-trial
    again = run_tuning(load_tuning(write_tuning(tmp_path)), tmp_path / "out", trials=1)
    assert again.stale_failed == [orphan.number]
    trials = load(again).trials
    assert trials[orphan.number].state == optuna.trial.TrialState.FAIL
    assert trials[-1].params == orphan.params and trials[-1].state.is_finished()


BAD = [
    ({"space": {"lr": {"low": 0.1, "high": 0.2}}}, "space.lr: unknown soda parameter 'lr'"),
    ({"space": {"learning_rate": {"low": 0.3, "high": 0.1}}}, "low (0.3) must be below high"),
    ({"space": {"decay": {"type": "float", "low": 0.5, "high": 1.5}}}, "space.decay: decay"),
    (
        {"space": {"learning_rate": {"type": "normal", "low": 0, "high": 1}}},
        "space.learning_rate.type",
    ),
    ({"space": {"beta1": {"low": 0.0, "high": 0.9, "log": True}}}, "space.beta1.low"),
    ({"space": {"temperature": {"low": 0.01, "high": 0.1}}, "sampler": "grid"}, "needs a `step`"),
    ({"sampler": "bayes"}, "sampler: must be one of tpe, random, grid, cmaes, not 'bayes'"),
    (
        {"pruner": "sometimes"},
        "pruner: must be one of median, successive_halving, hyperband, none, not 'sometimes'",
    ),
    ({"signal": "vibes"}, "signal: must be one of loss, tokens, exact, not 'vibes'"),
    ({"metric": "speed"}, "metric: must be one of exact, "),
    ({"trials": 0}, "trials: must be at least 1, not 0"),
    ({"space": {}}, "space: a non-empty mapping"),
    ({"checkpoints": 0}, "checkpoints: must be at least 1, not 0"),
    (
        {"space": {"learning_rate": {"low": 0.1, "high": 0.3, "step": 0}}},
        "space.learning_rate.step: must be above 0, not 0",
    ),
    ({"space": {"learning_rate": {"high": 0.3}}}, "space.learning_rate.low: required field"),
    ({"space": {"learning_rate": {"low": "x", "high": 0.3}}}, "space.learning_rate.low: must be"),
    ({"colour": 1}, "colour: unknown field"),
    ({"model": {"id": "./no/such/model"}}, "model.id: no such model"),
    ({"space": {"objective.top_k": {"type": "int", "low": 1, "high": 5}}}, "tunable objective"),
    # Issue 53: int(0.5) made it `step: 0`, silently.
    (
        {"space": {"reset_period": {"type": "int", "low": 20, "high": 60, "step": 0.5}}},
        "space.reset_period.step: an int range's step is a whole number, not 0.5",
    ),
]


@pytest.mark.parametrize("override, message", BAD)
def test_invalid_tuning_file_is_one_line(tmp_path, capsys, override, message):
    path = write_tuning(tmp_path, **override)
    code = main(["tune", str(path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and message in err, err
    assert str(path) in err


def test_shipped_tuning_files_are_valid():
    root = Path(__file__).resolve().parents[1] / "tuning"
    cwd = os.getcwd()
    os.chdir(root.parent)
    try:
        names = []
        for path in sorted(root.glob("*.yaml")):
            spec = load_tuning(path)
            names.append(spec.name)
            assert spec.distributions()
    finally:
        os.chdir(cwd)
    assert "stories260k-soda" in names


def test_trial_value_metrics():
    from sodaray.tuner.values import trial_value

    assert trial_value("exact", 3, 10, 2.0, [0.1] * 10) == pytest.approx(0.3)
    assert trial_value("exact_per_second", 3, 10, 2.0, []) == pytest.approx(1.5)
    # Loss only breaks ties: one more exact sample always wins over any loss.
    better_loss = trial_value("exact_then_loss", 2, 10, 1.0, [0.01] * 10)
    worse_loss = trial_value("exact_then_loss", 2, 10, 1.0, [5.0] * 10)
    one_more = trial_value("exact_then_loss", 3, 10, 1.0, [50.0] * 10)
    assert worse_loss < better_loss < one_more
    assert 0.2 <= worse_loss < better_loss < 0.2 + 1 / 11


def test_start_from_opens_a_new_study_with_the_preset(tmp_path, local_ray):
    spec = load_tuning(write_tuning(tmp_path, start_from="tinystories-33m", trials=1))
    # The preset's learning rate is inside the space; its reset period (50) is off the 20-grid.
    assert spec.start_params() == {"learning_rate": 0.065}
    run = run_tuning(spec, tmp_path / "out")
    first = load(run).trials[0]
    assert first.params["learning_rate"] == 0.065 and first.params["reset_period"] in (20, 40, 60)
    with pytest.raises(ValueError, match="start_from"):
        load_tuning(write_tuning(tmp_path, start_from="no-such-preset"))


def test_a_run_whose_trials_all_failed_exits_non_zero_but_pruned_ones_are_no_error():
    """Issue 30, case 8: a resumed study whose new trials were all pruned exited 1 with
    "none of the 2 trials completed"; pruning is the pruner working. Only failures are errors."""
    from sodaray.cli.tune import no_trial_completed
    from sodaray.tuner.run import TrialOutcome, TuneRun

    run = TuneRun("s", "study.journal", Path("out"))
    assert no_trial_completed(run) is None  # nothing added (e.g. the study was already full)
    run.outcomes = [
        TrialOutcome(0, "failed", None, {}, 1.0, "KeyError: 'Record does not exist.'"),
        TrialOutcome(1, "failed", None, {}, 1.0, "KeyError: 'Record does not exist.'"),
    ]
    message = no_trial_completed(run)
    assert message is not None and "all 2 trials of this run failed" in message
    assert "Record does not exist" in message
    run.outcomes = [
        TrialOutcome(0, "pruned", 0.1, {}, 1.0, "pruned at length 1, step 150"),
        TrialOutcome(1, "pruned", 0.2, {}, 1.0, "pruned at length 1, step 150"),
    ]
    assert no_trial_completed(run) is None
    run.outcomes.append(TrialOutcome(2, "failed", None, {}, 1.0, "boom"))
    assert no_trial_completed(run) is None  # one failure beside pruned ones: a warning's job


def test_a_returned_trial_is_told_in_its_own_state_after_its_rows_are_written(tmp_path, local_ray):
    """The driver's side of a trial (`_Trials.receive`) on a real journal: a checkpoint is
    reported once; a pruned trial is told PRUNED, a completed one COMPLETE with its value, a
    failed one FAIL; each has its rows written and its attributes set first."""
    import pyarrow as pa

    from sodaray.experiment.group import Failure
    from sodaray.experiment.work import Checkpoint, Finished
    from sodaray.tuner.run import TuneRun, _Trials
    from sodaray.tuner.study import open_study

    spec = load_tuning(write_tuning(tmp_path))
    out = tmp_path / "out"
    study, _ = open_study(spec, str(out / "study.journal"), "s")

    class Group:  # the actor group's side: which trials were cancelled
        cancelled: list[str] = []

        def cancel(self, key: str) -> bool:
            self.cancelled.append(key)
            return False

    loop = _Trials(spec, study, TuneRun("s", "-", out), {"sample_id": [0, 1]}, None, Group(), None)
    states = {}
    for state, exact in (("pruned", [True, False]), ("complete", [True, True]), ("failed", [])):
        trial = study.ask(spec.distributions())
        key = f"trial-{trial.number:05d}"
        unit = SimpleNamespace(key=key, samples=2)
        loop.live[key], loop.reported[key] = (trial, 0.0), set()
        if state == "pruned":
            loop.pruned.add(key)
        for _ in range(2):  # a retried trial reports its checkpoint again: recorded once
            assert loop.receive(unit, Checkpoint(key, 0, 20, 1, 1, 2)) is None
        table = pa.table({"exact": exact, "final_loss": [0.5] * len(exact)})
        end = Failure(key, 3, "boom", True) if state == "failed" else Finished(key, table, 1.5, 1)
        outcome = loop.receive(unit, end)
        assert (outcome.number, outcome.state) == (trial.number, state)
        frozen = study.get_trials(deepcopy=False)[trial.number]
        assert frozen.intermediate_values == {20: 0.5}
        states[state] = (frozen.state, frozen.value, frozen.user_attrs.get("exact"))
        written = (out / "trials" / f"{key}.parquet").is_file()
        assert written == (state != "failed")
    # Optuna gives a pruned trial its last intermediate value (20: 0.5).
    assert states["pruned"] == (optuna.trial.TrialState.PRUNED, 0.5, 1)
    assert states["complete"] == (optuna.trial.TrialState.COMPLETE, 1.0, 2)
    assert states["failed"] == (optuna.trial.TrialState.FAIL, None, None)
    assert Group.cancelled == []  # nothing asked the pruner to stop these


def test_a_grid_study_ends_cleanly_and_a_covered_grid_runs_nothing(tmp_path, local_ray, capsys):
    """Issue 53: `tune FILE sampler=grid 'space.temperature={type: categorical, choices: [0.05,
    0.1]}' trials=2` ended in Optuna's `RuntimeError: Study.stop is supposed to be invoked
    inside an objective function` once the grid was covered, with no best preset; a resume
    repeated a trial and failed again. Now the run ends, writes the preset, and a resume of
    the covered grid says so and runs nothing (it asks Ray for nothing either)."""
    path = write_tuning(tmp_path, space={"learning_rate": {"low": 0.1, "high": 0.2}})
    out = tmp_path / "out"
    grid = ["sampler=grid", "space={temperature: {type: categorical, choices: [0.05, 0.1]}}"]
    argv = ["tune", str(path), "--out", str(out), *grid]
    assert main([*argv, "trials=2"]) == 0, capsys.readouterr().err
    assert (out / "tiny" / "best_preset.yaml").is_file()
    first = [t.params for t in load_study(out)]
    assert sorted(p["temperature"] for p in first) == [0.05, 0.1]
    capsys.readouterr()
    assert main([*argv, "trials=2"]) == 0
    printed = capsys.readouterr().out
    assert "the grid's 2 points are all tried: nothing more to run" in printed
    assert [t.params for t in load_study(out)] == first  # no trial repeated


def test_a_grid_study_resumed_takes_the_points_it_has_not_tried(tmp_path, local_ray, capsys):
    """The resumed sampler was seeded anew, which reshuffled the grid: its first trials took
    points by number in the new order, points the study had tried."""
    space = {
        "learning_rate": {"low": 0.1, "high": 0.2, "step": 0.1},
        "temperature": {"type": "categorical", "choices": [0.05, 0.1]},
    }
    path = write_tuning(tmp_path, space=space, sampler="grid", trials=3)
    out = tmp_path / "out"
    assert main(["tune", str(path), "--out", str(out)]) == 0
    assert main(["tune", str(path), "--out", str(out)]) == 0  # 3 asked, 1 left
    assert "the grid has 1 of its 4 points left: ran 1 trial" in capsys.readouterr().out
    points = [tuple(sorted(t.params.items())) for t in load_study(out)]
    assert len(points) == len(set(points)) == 4


def load_study(out: Path) -> list:
    study = optuna.load_study(
        study_name="tiny", storage=open_storage(str(out / "tiny/study.journal"))
    )
    return study.trials


def test_a_study_is_its_preset_files_values_not_its_path(tmp_path):
    """Issue 53: the study's identity hashed the path of the preset file its model names, so an
    edited preset made the next `tune` add trials to the old study. Its values decide now: an
    edit makes another study, a copy elsewhere the same."""
    from sodaray.tuner.study import spec_hash

    preset = tmp_path / "p.yaml"
    preset.write_text("soda: {temperature: 0.05}\n")
    model = {"id": str(STORIES), "preset_file": str(preset)}
    before = spec_hash(load_tuning(write_tuning(tmp_path, model=model)))
    preset.write_text("soda: {temperature: 0.5}\n")
    edited = spec_hash(load_tuning(write_tuning(tmp_path, model=model)))
    assert edited != before
    (tmp_path / "elsewhere").mkdir()
    copy = tmp_path / "elsewhere" / "p.yaml"
    copy.write_text("# the same values\nsoda: {temperature: 0.5}\n")
    moved = spec_hash(
        load_tuning(write_tuning(tmp_path, model={**model, "preset_file": str(copy)}))
    )
    assert moved == edited


def test_a_study_whose_data_changed_is_refused(tmp_path):
    """Issue 53, a cache trusted on content: the study records its data's hash; data with
    other rows under the same entry (a data file rewritten, a cache of another build) would
    add trials that do not compare with its others. One line instead."""
    from sodaray.data.build import build_dataset
    from sodaray.data.store import write_dataset
    from sodaray.experiment.spec import TuningError
    from sodaray.tuner.run import validation_rows

    path = tmp_path / "d.parquet"
    write_dataset(build_dataset(str(STORIES), "random", "1", 2, seed=0, progress=False), path)
    spec = load_tuning(write_tuning(tmp_path, data={"name": "d", "path": str(path)}))
    study = optuna.create_study(direction="maximize")
    rows, identity = validation_rows(spec, study, tmp_path / "out")
    assert study.user_attrs["dataset_hash"] == identity.hash
    write_dataset(build_dataset(str(STORIES), "random", "1", 2, seed=1, progress=False), path)
    with pytest.raises(TuningError, match="the study's trials ran on other data"):
        validation_rows(spec, study, tmp_path / "out")


JOURNALS = {
    "deep": "[" * 100_000 + "]" * 100_000 + "\n",  # a RecursionError in Optuna
    "a-list": "[1, 2]\n",  # a TypeError in Optuna
    "garbled": '{"op_code": 0, "study_name": \n{"op_code": 4}\n',
    "unknown-op": '{"op_code": 99}\n',  # an AssertionError in Optuna
}


@pytest.mark.parametrize("kind", list(JOURNALS))
def test_a_journal_optuna_did_not_write_is_one_line(tmp_path, capsys, kind):
    """Issue 53, every parser has a bound: Optuna reads a journal's lines without one and
    replays them unchecked; each of these ended in a traceback."""
    (tmp_path / "j.journal").write_text(JOURNALS[kind])
    path = write_tuning(tmp_path)
    args = ["tune", str(path), "--out", str(tmp_path / "out"), "--storage"]
    code = main([*args, str(tmp_path / "j.journal")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "j.journal" in err and "Traceback" not in err
