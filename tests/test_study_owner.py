"""One owner per study while it runs (issue 58): each `tune` run records itself in its study and
names itself in each trial it asks (`tuner.owner.RunOwner`). A second run on a study whose first
is live joins it (its own trials, none of the first's touched: it used to fail them as "left
running by an earlier run", and the first then died on "Trial#1 has already finished"); a
RUNNING trial is failed and tried again only once its run is known to be over. Storage URLs
that cannot work are one line before anything runs. Real Optuna journals, real processes
(a live one is a real `sleep`), real `sodaray tune` subprocesses with stories260K."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from conftest import STORIES, one_line_error

from sodaray.experiment.owner import boot_id, process_start
from sodaray.tuner import load_tuning
from sodaray.tuner.owner import RUN_ATTR, TRIAL_RUN_ATTR, RunOwner, ask_trial
from sodaray.tuner.storage import open_storage
from sodaray.tuner.study import open_study

pytestmark = pytest.mark.skipif(not STORIES.is_dir(), reason="stories260K not present")
ROOT = Path(__file__).resolve().parents[1]
RUNNING = optuna.trial.TrialState.RUNNING


def tuning_file(tmp_path: Path, **overrides) -> Path:
    spec = {
        "name": "owned",
        "model": {"id": str(STORIES), "num_cpus": 1},
        # Length-3 inputs are not found in a few steps: a trial runs its whole budget.
        "data": {"build": {"dataset": "random", "lengths": "3", "per_length": 2, "seed": 0}},
        "algorithm": "soda",
        "fixed": {"max_batch_size": 16},
        "space": {"learning_rate": {"type": "float", "low": 0.03, "high": 0.3, "log": True}},
        "max_steps": 5,
        "trials": 1,
        "checkpoints": 2,
        "sampler": "random",
        "pruner": "none",
    }
    spec.update(overrides)
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.fixture
def live_process():
    """A real process of this host that outlives the test's checks: a live run's driver."""
    proc = subprocess.Popen(["sleep", "300"])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def record_of(pid: int, **extra) -> dict:
    """A run record as `RunOwner` writes one, for process `pid` of this host."""
    record = {"host": socket.gethostname(), "pid": pid, "since": time.time(), "seen": time.time()}
    boot, start = boot_id(), process_start(pid)
    if boot is not None and start is not None:
        record.update(boot=boot, start=start)
    return {**record, **extra}


def add_run(study, key: str, record: dict) -> None:
    study.set_user_attr(RUN_ATTR + key, record)


def running_trial_of(study, spec, key: str | None):
    trial = study.ask(spec.distributions())
    if key is not None:
        trial.set_user_attr(TRIAL_RUN_ATTR, key)
    return trial.number


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_live_runs_trials_are_left_alone_and_a_dead_ones_are_rescued(tmp_path, live_process):
    spec = load_tuning(tuning_file(tmp_path))
    url = str(tmp_path / "study.journal")
    study, _ = open_study(spec, url, "s")
    add_run(study, "live", record_of(live_process))
    add_run(study, "dead", record_of(dead_pid()))
    add_run(study, "ended", record_of(live_process, ended=time.time()))
    add_run(study, "far", {**record_of(1), "host": "elsewhere"})  # seen just now
    add_run(study, "far-stale", {**record_of(1), "host": "elsewhere", "seen": time.time() - 3600})
    add_run(study, "reused", {**record_of(live_process), "start": -1})
    numbers = {
        key: running_trial_of(study, spec, key)
        for key in ("live", "dead", "ended", "far", "far-stale", "reused", "unrecorded", None)
    }
    _, stale = open_study(spec, url, "s")
    rescued = {k for k, n in numbers.items() if n in stale}
    # A live process of this host, or one of another host seen recently: not touched. A trial
    # naming no run is left too while a run is live (it may be that run's, just asked).
    assert rescued == {"dead", "ended", "far-stale", "reused", "unrecorded"}
    trials = optuna.load_study(study_name="s", storage=open_storage(url)).trials
    for key, number in numbers.items():
        assert (trials[number].state == RUNNING) == (key not in rescued), key
    # Each rescued trial's point is enqueued once (by the one run that failed it).
    waiting = [t for t in trials if t.state == optuna.trial.TrialState.WAITING]
    assert len(waiting) == len(rescued)


def test_a_trial_naming_no_run_is_rescued_when_no_run_is_live(tmp_path):
    spec = load_tuning(tuning_file(tmp_path))
    url = str(tmp_path / "study.journal")
    study, _ = open_study(spec, url, "s")
    add_run(study, "dead", record_of(dead_pid()))
    number = running_trial_of(study, spec, None)
    _, stale = open_study(spec, url, "s")
    assert stale == [number]


def test_a_run_joining_a_live_one_proposes_other_points(tmp_path, live_process):
    """Two runs opening a study at the same trial count were seeded alike: a run that finds
    another live one takes its own number into its seed."""
    spec = load_tuning(tuning_file(tmp_path))
    alone, _ = open_study(spec, str(tmp_path / "a.journal"), "s")
    first = [ask_trial(alone, spec.distributions()).params["learning_rate"] for _ in range(3)]
    joined_url = str(tmp_path / "b.journal")
    study, _ = open_study(spec, joined_url, "s")
    add_run(study, "live", record_of(live_process))
    owner = RunOwner.new()
    study, _ = open_study(spec, joined_url, "s", owner=owner)
    assert list(owner.others) == ["live"]
    second = [ask_trial(study, spec.distributions()).params["learning_rate"] for _ in range(3)]
    assert not set(first) & set(second)


def test_an_interrupted_runs_trials_are_failed_marked_and_enqueued(tmp_path):
    from sodaray.tuner.owner import INTERRUPTED_ATTR, abandon_trials

    spec = load_tuning(tuning_file(tmp_path))
    url = str(tmp_path / "study.journal")
    owner = RunOwner.new()
    study, _ = open_study(spec, url, "s", owner=owner)
    trials = [ask_trial(study, spec.distributions(), owner) for _ in range(2)]
    study.tell(trials[0], 0.5)  # finished before the stop: kept as it is
    assert abandon_trials(study, trials, {"learning_rate"}, "stopped by SIGTERM") == [1]
    owner.end(study)
    study = optuna.load_study(study_name="s", storage=open_storage(url))
    states = [t.state.name for t in study.trials]
    assert states == ["COMPLETE", "FAIL", "WAITING"]
    assert study.trials[1].user_attrs[INTERRUPTED_ATTR] == "stopped by SIGTERM"
    assert study.trials[1].user_attrs[TRIAL_RUN_ATTR] == owner.key
    assert study.user_attrs[RUN_ATTR + owner.key]["ended"] > 0
    # The next run takes the enqueued point first.
    again, stale = open_study(spec, url, "s")
    assert stale == []
    assert ask_trial(again, spec.distributions()).params == study.trials[1].params


def sodaray(args: list[str], cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "sodaray", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_running(journal: Path, proc: subprocess.Popen, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        if journal.is_file():
            study = optuna.load_study(study_name="owned", storage=open_storage(str(journal)))
            if study.get_trials(deepcopy=False, states=(RUNNING,)):
                return
        time.sleep(0.5)
    raise AssertionError("the first run had no RUNNING trial in time")


@pytest.mark.benchmark  # 81 s: run with `-m benchmark`
def test_a_second_tune_on_a_live_study_joins_it_and_touches_none_of_its_trials(tmp_path):
    """The issue's case: the second run used to fail the first's live trials and run their
    points again, and the first then ended in exit 2. Now the first ends 0 with none of its
    trials failed, and the second joins (0), one line naming the live run."""
    tuning_file(tmp_path)
    args = ["tune", "t.yaml", "--out", "o", "--trials", "1", "max_steps=1500"]
    first = sodaray(args, tmp_path)
    try:
        wait_for_running(tmp_path / "o" / "owned" / "study.journal", first, 240)
        second = sodaray(args, tmp_path)
        out2, err2 = second.communicate(timeout=400)
        out1, err1 = first.communicate(timeout=400)
    finally:
        first.kill()
    assert first.returncode == 0, err1
    assert second.returncode in (0, 2), err2
    assert "Traceback" not in err1 + err2 and "already finished" not in err1 + err2
    if second.returncode == 2:
        assert len(err2.strip().splitlines()) == 1, err2
    joined = [line for line in out2.splitlines() if line.startswith("joined the study")]
    assert len(joined) == 1 and f"pid {first.pid}" in joined[0], out2
    study = optuna.load_study(
        study_name="owned", storage=open_storage(str(tmp_path / "o" / "owned" / "study.journal"))
    )
    states = [t.state.name for t in study.trials]
    assert states == ["COMPLETE", "COMPLETE"], states
    owners = [t.user_attrs[TRIAL_RUN_ATTR] for t in study.trials]
    assert len(set(owners)) == 2  # one trial each
    points = [t.params["learning_rate"] for t in study.trials]
    assert len(set(points)) == 2  # never each other's point
    assert "left running by an earlier run" not in out1 + out2


def test_an_empty_storage_is_refused_in_one_line(tmp_path, capsys):
    """`--storage "$DB"` with DB unset silently became the local journal: a cluster's study on
    one node's disk. Refused in one line, whether the parser or the tuner sees it first."""
    from sodaray.tuner.storage import storage_url

    path = tuning_file(tmp_path)
    err = one_line_error(["tune", str(path), "--out", str(tmp_path / "o"), "--storage", ""], capsys)
    assert "storage" in err and "empty" in err
    spec = load_tuning(path)
    with pytest.raises(ValueError, match=r"--storage is empty \(an unset variable\?\)"):
        storage_url(spec, tmp_path, "")
    with pytest.raises(ValueError, match="storage is empty"):
        storage_url(spec, tmp_path, "  ")
    assert not (tmp_path / "o").exists()


DRIVERS = [
    ("postgresql://u:secret@127.0.0.1/db", "psycopg", "pip install 'psycopg[binary]'"),
    ("postgresql+psycopg2://u@127.0.0.1/db", "psycopg2", "pip install 'psycopg2-binary'"),
    ("mysql://u@127.0.0.1/db", "MySQLdb", "pip install 'mysqlclient'"),
    ("mysql+pymysql://u@127.0.0.1/db", "pymysql", "pip install 'PyMySQL'"),
]


@pytest.mark.parametrize("url, module, advice", DRIVERS)
def test_a_missing_database_driver_is_one_line_naming_its_package(
    tmp_path, capsys, url, module, advice
):
    """Optuna's RDB storage ended in an ImportError traceback ("Failed to import DB access
    module"), naming no package; now one line, exit 2, before the model or Ray, the password
    hidden."""
    if importlib.util.find_spec(module) is not None:
        pytest.skip(f"{module} is installed here")
    path = tuning_file(tmp_path)
    args = ["tune", str(path), "--out", str(tmp_path / "o"), "--storage", url]
    err = one_line_error(args, capsys)
    assert advice in err and "is not installed" in err
    assert "secret" not in err
    assert not (tmp_path / "o").exists()
