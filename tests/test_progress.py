"""Issue 39: progress from inside a shard. Replicas stream their units' sample-steps and finished
samples about once a second (`experiment.replica`); `sweep run`'s bars, `tune`'s trial bar and
`invert`'s bar move with them. Real Ray, real stories260K, real engines; the bars are tqdm's."""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from conftest import STORIES, tiny_model

from sodaray.cli.progress import InvertProgress, SweepProgress, TrialProgress
from sodaray.experiment.work import UnitProgress
from sodaray.results import read_results
from sodaray.runner import load_sweep, run_sweep
from sodaray.runner.run import JobProgress, ShardDone, SweepRun
from sodaray.search.soda.batch import SodaBatch
from sodaray.tuner import load_tuning, run_tuning

needs_stories = pytest.mark.skipif(not STORIES.is_dir(), reason="stories260K not present")


@pytest.fixture(scope="module")
def own_ray():
    """A local Ray of 2 CPUs in its own temporary folder (other Ray instances may share the
    machine); stopped, and the folder removed, after the module."""
    import ray

    temp = tempfile.mkdtemp(prefix="sr-progress-", dir="/tmp")  # short: Ray's socket paths
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=temp)
    yield
    ray.shutdown()
    shutil.rmtree(temp, ignore_errors=True)


def write_sweep(tmp_path: Path, max_steps: int) -> Path:
    """One job of one shard: a random length-4 input, which stories260K does not find within
    2,000 steps, so the shard runs its whole budget."""
    spec = {
        "name": "p",
        "models": [{"id": str(STORIES), "num_cpus": 1, "replicas": 1}],
        "datasets": [
            {"name": "random", "build": {"dataset": "random", "lengths": "4", "per_length": 1}}
        ],
        "algorithms": [{"name": "soda"}],
        "objectives": [{"kind": "logits"}],
        "max_steps": max_steps,
        "shard_size": 1,
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@needs_stories
@pytest.mark.slow
def test_a_2000_step_shard_moves_the_progress_line_ten_times_before_its_rows_land(
    tmp_path, own_ray
):
    """The done-when of issue 39: the bar `sweep run` draws (fed what the driver receives)
    moves at least 10 times before the one shard's rows are written."""
    sweep = load_sweep(write_sweep(tmp_path, max_steps=2000))
    bars = SweepProgress("p")
    seen: list[tuple[int, int, int]] = []  # the bar's n and total, the samples finished
    landed: list[int] = []  # how many updates had come when the shard's rows were written

    def on_start(run: SweepRun, samples: int) -> None:
        assert samples == 1
        bars.start(run, bars=True)

    def on_progress(p: JobProgress) -> None:
        bars.job(p)
        bar = bars.bars[p.job]
        seen.append((bar.n, bar.total, p.finished))

    def on_shard(done: ShardDone) -> None:
        bars.shard(done)
        landed.append(len(seen))

    run = run_sweep(
        sweep, tmp_path / "out", on_start=on_start, on_shard=on_shard, on_progress=on_progress
    )
    bars.close()
    assert not run.failed and len(run.done) == 1 and landed
    rows = read_results(tmp_path / "out" / "p").to_pylist()
    assert [r["steps"] for r in rows] == [2000]  # the shard ran its whole budget
    before = seen[: landed[0]]
    moves = [b for a, b in zip([(0, 2000, 0)] + before, before, strict=False) if b[0] > a[0]]
    assert len(moves) >= 10, before
    # Counted in sample-steps out of the most the one sample can take, never past it.
    assert all(0 <= n <= total == 2000 and finished == 0 for n, total, finished in before)
    assert [n for n, _, _ in before] == sorted(n for n, _, _ in before)
    assert seen[-1] == (2000, 2000, 1)  # the rows' own count at the end
    (job,) = run.progress.values()
    assert (job.sample_steps, job.most, job.finished, job.found) == (2000, 2000, 1, 0)
    # The occupancy the progress items carry adds up with the rows': one slot-step a step. The
    # batch stepped `lag` more times: a SODA batch reads a step's status while it runs the
    # next, and the screen of its tokens while it runs the one after.
    assert run.slot_steps == 2000 and run.batch_steps == 2000 + SodaBatch.lag == 2002
    assert 0 < run.occupancy < 1  # one search in a batch of more slots


@needs_stories
def test_a_sample_found_early_takes_its_unused_budget_off_the_total(tmp_path, own_ray):
    """Found samples stop early: the job's most sample-steps shrinks to what they took."""
    spec = yaml.safe_load(write_sweep(tmp_path, max_steps=300).read_text())
    spec["datasets"][0]["build"].update(lengths="1", per_length=3)
    spec["shard_size"] = 3
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(spec))
    seen: list[JobProgress] = []
    run = run_sweep(
        load_sweep(tmp_path / "sweep.yaml"),
        tmp_path / "out",
        on_progress=lambda p: seen.append(JobProgress(**p.__dict__)),
    )
    rows = read_results(tmp_path / "out" / "p").to_pylist()
    steps = sum(r["steps"] for r in rows)
    assert any(r["found"] for r in rows) and steps < 900  # stories260K finds length-1 inputs
    assert seen[0].most <= 900 and seen[-1].most == seen[-1].sample_steps == steps
    assert seen[-1].found == sum(r["found"] for r in rows) and seen[-1].finished == 3
    assert all(p.sample_steps <= p.most for p in seen)
    assert run.slot_steps == steps


@needs_stories
def test_tune_reports_running_trials_before_they_end(tmp_path, own_ray):
    """`tune`'s progress: each trial's counts arrive while it runs, and its bar moves with them
    (a share of a trial before any trial has ended)."""
    spec = {
        "name": "p",
        "model": {"id": str(STORIES), "num_cpus": 1},
        "data": {"build": {"dataset": "random", "lengths": "4", "per_length": 2, "seed": 0}},
        "algorithm": "soda",
        "space": {"learning_rate": {"type": "float", "low": 0.03, "high": 0.3, "log": True}},
        "max_steps": 200,
        "trials": 1,
        "checkpoints": 1,
    }
    (tmp_path / "tune.yaml").write_text(yaml.safe_dump(spec))
    bar = TrialProgress("p", 1, bars=True)
    shown: list[float] = []  # the bar's n before the trial ended
    counts: list[tuple[int, UnitProgress]] = []

    def on_progress(number: int, c: UnitProgress) -> None:
        counts.append((number, c))
        bar.progress(number, c)
        shown.append(bar.bar.n)

    run = run_tuning(
        load_tuning(tmp_path / "tune.yaml"),
        tmp_path / "out",
        on_progress=on_progress,
        on_trial=bar.trial,
    )
    assert [o.state for o in run.outcomes] == ["complete"]
    assert len(counts) >= 2 and {n for n, _ in counts} == {0}
    assert all(c.most == 400 and 0 <= c.sample_steps <= 400 for _, c in counts)
    assert any(0 < n < 1 for n in shown)  # a share of the one trial, before it ended
    assert bar.bar.n == 1 and "last #0 complete" in bar.bar.postfix
    bar.close()


def test_engine_steps_taken_counts_every_sample_step_across_lengths(tiny_llama, one_thread):
    """`Engine.steps_taken` at each step equals the searches stepped before it, with targets
    that move on to their next length (`length="auto"`), and the results' steps at the end."""
    from sodaray.api import length_plans
    from sodaray.objective.targets import make_targets
    from sodaray.search.engine.loop import Engine
    from sodaray.search.engine.work import Work
    from sodaray.search.soda.config import SodaConfig

    targets = make_targets(tiny_llama, [[5, 9, 3], [7], [11, 2]])
    config = SodaConfig(max_steps=6, max_batch_size=2)
    stepped: list[int] = [0]
    checked: list[tuple[int, int]] = []
    engine: Engine

    def on_batch(active: int) -> None:
        checked.append((engine.steps_taken().get(work, 0), stepped[0]))
        stepped[0] += active

    engine = Engine(tiny_llama, on_batch=on_batch)
    plans = length_plans(tiny_llama, targets, "auto", 3)
    work = Work(targets, config, plans)
    engine.submit(work)
    engine.run()
    assert len(checked) > 6 and all(taken == before for taken, before in checked)
    assert sum(r.steps for r in work.results.values()) == stepped[0]
    assert any(len(r.lengths_tried) > 1 for r in work.results.values())  # next lengths ran


def test_sweep_bars_count_sample_steps_and_explain_the_occupancy(capsys):
    """A bar per job in sample-steps out of the most they can take, with the rate over the
    recent past, the most time left at it and the samples finished and found; above them the
    batch occupancy, recent and overall."""
    run = SweepRun()
    run.progress = {"job-a": JobProgress("job-a", 4, 400), "job-b": JobProgress("job-b", 2, 200)}
    progress = SweepProgress("s")
    progress.start(run, bars=True)
    assert "no step yet" in progress.status.desc
    run.slot_steps, run.capacity_steps = 150, 200
    a = run.progress["job-a"]
    a.sample_steps, a.most, a.finished, a.found = 100, 330, 1, 1
    progress.job(a)  # the first report: no rate yet
    bar = progress.bars["job-a"]
    assert (bar.n, bar.total) == (100, 330)
    assert bar.postfix == "? sample-steps/s, 1/4 samples finished, 1 found"
    assert "batch occupancy 75% in the last 10 s, 75% overall" in progress.status.desc
    time.sleep(0.2)
    a.sample_steps = 150
    run.slot_steps, run.capacity_steps = 250, 400  # 100 of the last 200 slots
    progress.job(a)
    assert re.fullmatch(
        r"[\d.]+ sample-steps/s, at most \d+ s left, 1/4 samples finished, 1 found", bar.postfix
    ), bar.postfix
    assert "batch occupancy 62% in the last 10 s, 62% overall" in progress.status.desc
    progress.close()
    assert "150/330 sample-steps" in capsys.readouterr().err


def test_sweep_lines_in_a_log(capsys, monkeypatch):
    """Not a terminal: a line per finished shard, and a line per running job at most every
    PLAIN_SECONDS, with its rate and the most time it has left."""
    import sodaray.cli.progress as progress_module

    run = SweepRun()
    run.progress = {"job-a": JobProgress("job-a", 4, 4000)}
    lines = SweepProgress("s")
    lines.start(run, bars=False)
    a = run.progress["job-a"]
    a.sample_steps = 100
    lines.job(a)
    assert capsys.readouterr().err == ""  # not a minute yet
    monkeypatch.setattr(progress_module, "PLAIN_SECONDS", 0.0)
    run.slot_steps, run.capacity_steps = 100, 400
    a.sample_steps = 1000
    lines.job(a)
    err = capsys.readouterr().err
    assert "job-a: 1,000 of at most 4,000 sample-steps (25%), " in err
    assert "sample-steps/s, at most" in err and "; 0/4 samples finished, 0 found; " in err
    assert "batch occupancy 25% in the last 10 s, 25% overall" in err
    lines.shard(ShardDone("job-a", 1, 2, 1, 0, 0.5, 1, 100))
    assert "job-a shard 1: 2 samples, 1 found, 0 exact (0.5s)" in capsys.readouterr().err


def test_invert_bar_counts_sample_steps_and_drops_a_found_target_s_unused_budget(
    capsys, one_thread
):
    from sodaray.api import invert
    from sodaray.objective.targets import make_targets
    from sodaray.search.soda.config import SodaConfig

    model = tiny_model("gpt2")
    targets = make_targets(model, [[5], [7, 3]])
    bar = InvertProgress(len(targets), 50, stepwise=True)
    assert bar.bar.total == 100
    results = invert(
        model,
        targets,
        SodaConfig(max_steps=50),
        on_result=bar.result,
        on_batch=bar.step,
    )
    taken = sum(r.steps for r in results)
    assert taken < 100  # a target found early: its unused budget left the total
    assert bar.bar.n == bar.bar.total == taken
    assert bar.bar.postfix.endswith(f"2/2 targets finished, {sum(r.found for r in results)} found")
    bar.close()
    assert "inverting" in capsys.readouterr().err
