"""A study journal whose last line has no newline: one a live driver is still writing is
waited for, one left by a driver stopped mid-write is refused in one line naming the file
(Optuna would append the next entry to it and the journal would no longer read). Real Optuna
journal storage."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import optuna
import pytest

from sodaray.tuner.storage import CUT_LINE_SECONDS, open_storage


def a_journal(tmp_path: Path) -> tuple[Path, bytes]:
    """A real journal of one study, and its bytes."""
    journal = tmp_path / "study.journal"
    optuna.create_study(study_name="s", storage=open_storage(str(journal)))
    return journal, journal.read_bytes()


def test_a_last_line_cut_short_is_refused_naming_the_journal(tmp_path):
    journal, whole = a_journal(tmp_path)
    journal.write_bytes(whole + b'{"op_code": 4, "wor')
    start = time.monotonic()
    with pytest.raises(ValueError, match=r"study\.journal: line 2 is cut short") as caught:
        open_storage(str(journal))
    assert "\n" not in str(caught.value)
    assert time.monotonic() - start >= CUT_LINE_SECONDS  # waited for a writer first
    assert journal.read_bytes() == whole + b'{"op_code": 4, "wor'  # left as it was


def test_a_last_line_a_live_driver_finishes_is_waited_for(tmp_path):
    journal, whole = a_journal(tmp_path)
    study = optuna.load_study(study_name="s", storage=open_storage(str(journal)))
    study.ask()  # a second entry: the one written in two parts below
    entries = journal.read_bytes()
    last = entries[len(whole) :]
    journal.write_bytes(whole + last[:5])  # the entry's first bytes: a write under way

    def finish() -> None:
        time.sleep(CUT_LINE_SECONDS / 4)
        with journal.open("ab") as f:
            f.write(last[5:])

    writer = threading.Thread(target=finish)
    writer.start()
    try:
        storage = open_storage(str(journal))
    finally:
        writer.join()
    trials = optuna.load_study(study_name="s", storage=storage).trials
    assert [t.state.name for t in trials] == ["RUNNING"]
