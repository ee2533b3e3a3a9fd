"""Issue 53: every wait has a bound. A check of a tracking URI, a cluster address or a lock ends
within about `waits.CHECK_SECONDS` (10 s) in one line, where it used to retry for minutes (an
MLflow server that never answers, a port that accepts and says nothing) or half a minute (a
directory or a stale link where Optuna's journal lock goes). Each command runs in a subprocess
with a deadline well past the bound, so a regression fails here instead of hanging the suite."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import STORIES, silent_port

from sodaray.experiment.waits import CHECK_SECONDS, within

pytestmark = pytest.mark.skipif(not STORIES.is_dir(), reason="stories260K not present")

SWEEP = f"""name: s
models: [{{id: "{STORIES}", num_cpus: 1}}]
datasets: [{{name: random, build: {{dataset: random, lengths: "1", per_length: 2}}}}]
algorithms: [{{name: soda}}]
max_steps: 5
"""
DEADLINE = 60  # seconds: past it the command is taken to hang (the old code's were minutes)


def run_cli(args: list[str], cwd: Path) -> tuple[int, str, float]:
    """`sodaray ARGS` in a subprocess: exit code, stderr, seconds taken."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "sodaray", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    return proc.returncode, proc.stderr, time.monotonic() - start


def test_within_gives_up_after_its_bound_and_passes_errors_on():
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="thing: no answer within 0.3 s"):
        within(lambda: time.sleep(5), "thing", 0.3)
    assert time.monotonic() - start < 2
    assert within(lambda: 7, "thing") == 7
    with pytest.raises(KeyError):
        within(lambda: {}["x"], "thing")


@pytest.mark.parametrize("kind", ["mlflow", "address"])
def test_a_port_that_never_answers_is_one_line_within_the_bound(tmp_path, kind):
    """The issue's `--mlflow http://127.0.0.1:1` retried for over 120 s (a refused port: now
    one try); a port that accepts and never answers held MLflow's retries, and Ray's connect
    loop three minutes. Both end in one line, the check at `CHECK_SECONDS`."""
    pytest.importorskip("mlflow" if kind == "mlflow" else "grpc")
    (tmp_path / "s.yaml").write_text(SWEEP)
    run = ["sweep", "run", "s.yaml", "--out", "o"]
    with silent_port() as port:
        option = ["--mlflow", f"http://127.0.0.1:{port}"]
        if kind == "address":
            option = ["--address", f"127.0.0.1:{port}"]
        code, err, seconds = run_cli([*run, *option], tmp_path)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    if kind == "mlflow":
        assert f"--mlflow http://127.0.0.1:{port}: no answer within 10 s" in err
    else:
        assert "accepts connections but does not answer as a Ray cluster within 10 s" in err
    # Start-up (imports, the sweep's checks) and the bound; the old code took minutes.
    assert CHECK_SECONDS <= seconds < CHECK_SECONDS + 25, seconds
    assert not (tmp_path / "o").exists()


def test_a_refused_tracking_uri_is_one_try(tmp_path):
    """The issue's case: `http://127.0.0.1:1` refuses at once; MLflow's 7 retries backing off
    made that over two minutes. One try now: one line within seconds of start-up."""
    pytest.importorskip("mlflow")
    (tmp_path / "s.yaml").write_text(SWEEP)
    args = ["sweep", "run", "s.yaml", "--out", "o", "--mlflow", "http://user:pw@127.0.0.1:1"]
    code, err, seconds = run_cli(args, tmp_path)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "--mlflow http://user:***@127.0.0.1:1:" in err and "Connection refused" in err
    assert ":pw@" not in err  # MLflow's message names the URI whole: its password is hidden
    assert seconds < CHECK_SECONDS + 15, seconds


@pytest.mark.parametrize("what", ["directory", "fifo", "file", "stale-link"])
def test_a_journal_lock_that_is_no_lock_is_set_aside_at_once(tmp_path, caplog, what):
    """Optuna's journal lock is a symbolic link held for a write's milliseconds. A directory
    there, a FIFO or a file, or a link a killed driver left, held `tune` 30 s (Optuna's grace),
    then went in silence. Each is moved aside (or the stale link removed) with a warning,
    and the study opens at once."""
    import optuna

    from sodaray.tuner.storage import open_storage

    journal = tmp_path / "study.journal"
    lock = tmp_path / "study.journal.lock"
    if what == "directory":
        lock.mkdir()
    elif what == "fifo":
        os.mkfifo(lock)
    elif what == "file":
        lock.write_text("x")
    else:
        lock.symlink_to(journal)
        old = time.time() - 3600
        os.utime(lock, (old, old), follow_symlinks=False)
    start = time.monotonic()
    with caplog.at_level(logging.WARNING):
        study = within(
            lambda: optuna.create_study(study_name="s", storage=open_storage(str(journal))),
            "opening the study",
            DEADLINE,
        )
        study.ask()
    assert time.monotonic() - start < 5
    assert not lock.exists() and not lock.is_symlink()  # released after the write
    if what == "stale-link":
        assert "breaking the study journal's lock" in caplog.text
    else:
        assert "not a journal lock: moved to" in caplog.text
        [aside] = tmp_path.glob("study.journal.lock.*.invalid")
        assert aside.exists()


def test_a_live_looking_journal_lock_is_broken_after_the_bound(tmp_path):
    """A fresh link (a driver mid-write, or one killed a moment ago) is waited for, and broken
    once it has not changed for `CHECK_SECONDS` (Optuna's own default: 30 s)."""
    import optuna

    from sodaray.tuner.storage import open_storage

    journal = tmp_path / "study.journal"
    journal.touch()
    (tmp_path / "study.journal.lock").symlink_to(journal)
    start = time.monotonic()
    within(
        lambda: optuna.create_study(study_name="s", storage=open_storage(str(journal))),
        "opening the study",
        DEADLINE,
    )
    assert CHECK_SECONDS <= time.monotonic() - start < CHECK_SECONDS + 10
