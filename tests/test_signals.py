"""Every stop is a clean stop (issue 58): SIGTERM (`kill`, Slurm, `docker stop`) and SIGHUP (a
closed terminal) do what Ctrl-C does. SIGTERM used to end `sweep run` in Ray's native
"*** SIGTERM received ... PC: @" dump (exit 15) and `tune` in exit 134, with no "interrupted"
line. Now each of `sweep run`, `tune` and `invert` stops launching, keeps what finished, prints
one "interrupted" line and exits 128 + the signal's number, leaves no Ray process of its own,
and a resume completes with every row once. A small signal fuzz sends signals at random moments
(seeded) and checks the rows after each; two `sweep run` on one folder at once share it by its
job locks. Real subprocesses, real Ray, real stories260K, real Parquet and Optuna journals."""

from __future__ import annotations

import os
import random
import re
import select
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import optuna
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import STORIES

pytestmark = [
    pytest.mark.skipif(not STORIES.is_dir(), reason="stories260K not present"),
    pytest.mark.slow,
]
ROOT = Path(__file__).resolve().parents[1]
SAMPLES = 6
SWEEP = f"""name: s
models: [{{id: "{STORIES}", num_cpus: 1}}]
datasets: [{{name: random, build: {{dataset: random, lengths: "3", per_length: {SAMPLES}}}}}]
algorithms: [{{name: soda}}]
max_steps: 60
shard_size: 2
"""
NATIVE_DUMP = ("PC: @", "SIGTERM received", "Traceback", "*** ")
CODES = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}


def start(args: list[str], cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0"}
    return subprocess.Popen(
        [sys.executable, "-m", "sodaray", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def first_line(proc: subprocess.Popen, seconds: float = 180) -> str:
    """The command's first line on stdout (printed once it has read its input: its signal
    handlers are in place by then)."""
    ready, _, _ = select.select([proc.stdout], [], [], seconds)
    assert ready, "nothing printed"
    return proc.stdout.readline()


def ray_processes(pid: int) -> list[str]:
    """Command lines of the processes of the Ray session driver `pid` started (Ray names its
    session folder session_<date>_<time>_<driver pid>)."""
    mark = re.compile(rf"session_[0-9_-]+_{pid}(/|\b)")
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if mark.search(command):
            found.append(command[:120])
    return found


def no_ray_left(pid: int, seconds: float = 20) -> None:
    """Ray's processes of the run are gone within `seconds` of its end."""
    deadline = time.monotonic() + seconds
    while ray_processes(pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert ray_processes(pid) == []


def signalled(args: list[str], cwd: Path, sig: int, delay: float) -> tuple[int, str, str]:
    """Run `sodaray ARGS`, send `sig` `delay` seconds after its first line, and return its exit
    code, stdout and stderr; its Ray must be gone after."""
    proc = start(args, cwd)
    try:
        head = first_line(proc)
        time.sleep(delay)
        if proc.poll() is None:
            proc.send_signal(sig)
        out, err = proc.communicate(timeout=240)
    finally:
        proc.kill()
    no_ray_left(proc.pid)
    return proc.returncode, head + out, err


def check_clean_stop(code: int, err: str, sig: int) -> None:
    """Exit 128 + the signal's number with one "interrupted" line, no dump; or, where the
    command ended before the signal came, a clean end."""
    assert not any(mark in err for mark in NATIVE_DUMP), err
    if code in (0, 1):  # it had finished: nothing to stop
        return
    assert code == CODES[sig], err
    lines = [line for line in err.splitlines() if "interrupted" in line]
    assert len(lines) == 1, err


def sample_counts(root: Path) -> Counter:
    """How many times each sample's row is in the sweep's shard files and kept files."""
    counts: Counter = Counter()
    for path in sorted(root.rglob("shard-*.parquet")) + sorted(root.rglob("shard-*.kept.pq")):
        counts.update(pq.read_table(path, columns=["sample_id"])["sample_id"].to_pylist())
    return counts


def check_rows_once(root: Path, complete: bool) -> None:
    counts = sample_counts(root)
    assert all(n == 1 for n in counts.values()), counts
    if complete:
        assert len(counts) == SAMPLES and not list(root.rglob("shard-*.kept.pq")), counts


def test_a_signal_at_a_random_moment_stops_a_sweep_cleanly_and_a_resume_completes(tmp_path):
    """The fuzz: signals at random moments of successive runs on one folder (each resuming the
    last), rows checked after each; then a resume completes with every row once."""
    (tmp_path / "s.yaml").write_text(SWEEP)
    run = ["sweep", "run", "s.yaml", "--out", "o", "--keep-every", "1"]
    rng = random.Random(58)
    cases = [signal.SIGTERM, signal.SIGHUP, signal.SIGINT]
    for sig in cases:
        delay = rng.uniform(0.0, 10.0)
        code, _, err = signalled(run, tmp_path, sig, delay)
        check_clean_stop(code, err, sig)
        check_rows_once(tmp_path / "o" / "s", complete=False)
    proc = start(run, tmp_path)
    _, err = proc.communicate(timeout=400)
    assert proc.returncode == 0, err
    check_rows_once(tmp_path / "o" / "s", complete=True)


def test_sigterm_mid_search_is_143_with_the_finished_shards_kept(tmp_path):
    """Not a moment left to chance: SIGTERM once the first shard's file is written, while the
    others run."""
    (tmp_path / "s.yaml").write_text(SWEEP)
    proc = start(["sweep", "run", "s.yaml", "--out", "o"], tmp_path)
    try:
        first_line(proc)
        deadline = time.monotonic() + 240
        while not list((tmp_path / "o").rglob("shard-*.parquet")):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=240)
    finally:
        proc.kill()
    no_ray_left(proc.pid)
    if proc.returncode == 0:
        pytest.skip("the sweep ended before the signal (a loaded machine)")
    assert proc.returncode == 143, err
    assert not any(mark in err for mark in NATIVE_DUMP), err
    [line] = [line for line in err.splitlines() if "interrupted" in line]
    assert line.startswith("interrupted: ") and "shards finished in this run are kept" in line
    check_rows_once(tmp_path / "o" / "s", complete=False)
    assert sample_counts(tmp_path / "o" / "s")


def test_two_sweep_runs_on_one_folder_at_once_run_each_row_once(tmp_path):
    (tmp_path / "s.yaml").write_text(SWEEP)
    run = ["sweep", "run", "s.yaml", "--out", "o"]
    first, second = start(run, tmp_path), start(run, tmp_path)
    out1, err1 = first.communicate(timeout=400)
    out2, err2 = second.communicate(timeout=400)
    for code, err in ((first.returncode, err1), (second.returncode, err2)):
        # 0: it ran the job; 1: the other driver held it (said so in a line)
        assert code in (0, 1) and "Traceback" not in err, err
    assert 0 in (first.returncode, second.returncode), err1 + err2
    if 1 in (first.returncode, second.returncode):
        assert "another driver is running it" in err1 + err2
    proc = start(run, tmp_path)  # whatever either left, the next run completes it
    _, err = proc.communicate(timeout=400)
    assert proc.returncode == 0, err
    check_rows_once(tmp_path / "o" / "s", complete=True)


TUNING = {
    "name": "sig",
    "model": {"id": str(STORIES), "num_cpus": 1},
    "data": {"build": {"dataset": "random", "lengths": "3", "per_length": 2, "seed": 0}},
    "algorithm": "soda",
    "fixed": {"max_batch_size": 16},
    "space": {"learning_rate": {"type": "float", "low": 0.03, "high": 0.3, "log": True}},
    "max_steps": 600,
    "trials": 2,
    "checkpoints": 2,
    "sampler": "random",
    "pruner": "none",
}


def study_trials(tmp_path: Path) -> list:
    from sodaray.tuner.storage import open_storage

    journal = str(tmp_path / "o" / "sig" / "study.journal")
    return optuna.load_study(study_name="sig", storage=open_storage(journal)).trials


# SIGHUP's tune run is a benchmark (`-m benchmark`): the same path as SIGTERM's, and the suite's
# SIGHUP cases are the fuzz's and test_hostile_round's.
@pytest.mark.parametrize(
    "sig",
    [signal.SIGTERM, pytest.param(signal.SIGHUP, marks=pytest.mark.benchmark)],
    ids=["SIGTERM", "SIGHUP"],
)
def test_a_signal_stops_tune_cleanly_and_its_running_trials_run_again(tmp_path, sig):
    from sodaray.tuner.owner import INTERRUPTED_ATTR

    (tmp_path / "t.yaml").write_text(yaml.safe_dump(TUNING))
    journal = tmp_path / "o" / "sig" / "study.journal"
    proc = start(["tune", "t.yaml", "--out", "o"], tmp_path)
    try:
        first_line(proc)
        deadline = time.monotonic() + 240
        while not (journal.is_file() and b'"op_code":4' in journal.read_bytes()):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)  # a trial was asked: it runs now
        time.sleep(random.Random(int(sig)).uniform(0.0, 3.0))
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=240)
    finally:
        proc.kill()
    no_ray_left(proc.pid)
    if proc.returncode == 0:
        pytest.skip("the study ended before the signal (a loaded machine)")
    check_clean_stop(proc.returncode, err, sig)
    states = Counter(t.state.name for t in study_trials(tmp_path))
    assert "RUNNING" not in states, states
    stopped = [t for t in study_trials(tmp_path) if INTERRUPTED_ATTR in t.user_attrs]
    assert all(t.user_attrs[INTERRUPTED_ATTR] == f"stopped by {sig.name}" for t in stopped)
    assert states.get("WAITING", 0) == len(stopped) == states.get("FAIL", 0)
    if not stopped:
        return
    # The resume runs the stopped trials' points first, and ends with none left waiting.
    again = start(["tune", "t.yaml", "--out", "o", "--trials", str(len(stopped))], tmp_path)
    _, err = again.communicate(timeout=400)
    assert again.returncode == 0, err
    trials = study_trials(tmp_path)
    assert not [t for t in trials if t.state.name in ("RUNNING", "WAITING")]
    rerun = {t.params["learning_rate"] for t in trials if t.state.name == "COMPLETE"}
    assert {t.params["learning_rate"] for t in stopped} <= rerun


def test_sigterm_stops_invert_with_one_line_and_143(tmp_path):
    tokens = ",".join(str(t) for t in (311, 45, 402, 99, 250, 17, 388, 461))  # not found soon
    args = ["invert", "--model", str(STORIES), "--tokens", tokens, "--max-steps", "100000"]
    code, _, err = signalled(args, tmp_path, signal.SIGTERM, 1.0)
    assert code == 143, err
    assert err.strip().splitlines() == ["interrupted: 0 of 1 targets finished"], err


def test_one_handler_for_the_three_signals_and_ray_shutdown_is_not_cut_short():
    """`stops`: SIGINT, SIGTERM and SIGHUP raise `Stop` alike, exit 128 + the number; the
    handlers before are back after; a signal during `deferred` (Ray's shutdown) waits for its
    end and is raised then."""
    from sodaray.experiment import stops

    before = {sig: signal.getsignal(sig) for sig in stops.stop_signals()}
    for sig, code in CODES.items():
        with pytest.raises(stops.Stop) as caught, stops.handled():
            os.kill(os.getpid(), sig)
            time.sleep(1)  # the handler runs here
        assert caught.value.signum == sig and stops.exit_code() == code
    ran = []
    with pytest.raises(stops.Stop), stops.handled():
        with stops.deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)
            ran.append("after the signal")  # not cut short
    assert ran == ["after the signal"] and stops.signal_name() == "SIGTERM"
    assert {sig: signal.getsignal(sig) for sig in stops.stop_signals()} == before


@pytest.mark.benchmark  # 161 s: run with `-m benchmark`
def test_sigterm_to_the_whole_process_group_ends_in_bounded_time(tmp_path):
    """Slurm and `timeout` signal every process of the job: Ray's raylet ends with the driver,
    and ending the replicas then waited in Ray's core for ever, where no handler runs (a
    second SIGTERM did nothing). Now that wait is bounded: exit 143, the "interrupted" line,
    no Ray process left, the rows kept once."""
    (tmp_path / "s.yaml").write_text(SWEEP)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "sodaray", "sweep", "run", "s.yaml", "--out", "o"]
        + ["--keep-every", "1", "max_steps=100000"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a batch job's
    )
    try:
        first_line(proc)
        deadline = time.monotonic() + 240
        while not list((tmp_path / "o").rglob("shard-*.kept.pq")):  # searches are running
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=90)  # the bound, start-up and Ray's shutdown
    finally:
        proc.kill()
    no_ray_left(proc.pid)
    assert proc.returncode == 143, err
    assert not any(mark in err for mark in NATIVE_DUMP), err
    assert len([line for line in err.splitlines() if "interrupted" in line]) == 1, err
    check_rows_once(tmp_path / "o" / "s", complete=False)
