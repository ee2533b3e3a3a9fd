"""`sodaray train-inverter` end to end through the CLI entry point on stories260K with a tiny
budget: checkpoints written, the result used by `sodaray invert`, resume from `last`, and bad
arguments ending in one line on stderr with exit code 2."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from conftest import STORIES

from sodaray.cli import main

pytestmark = pytest.mark.skipif(not STORIES.is_dir(), reason="stories260K not present")
M = str(STORIES)
TINY = [
    "--lengths",
    "1-2",
    "--per-length",
    "20",
    "--output-tokens",
    "3",
    "--shape",
    "tiny",
    "--batch-size",
    "8",
    "--warmup-steps",
    "2",
    "--threads",
    "1",
]


@pytest.fixture(autouse=True)
def _threads():
    """`--threads 1` below sets torch's global thread count: restore it after each test."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def train(capsys, out, epochs: int, *extra: str) -> tuple[int, str, str]:
    # An option in `extra` replaces TINY's (the command refuses one given twice).
    pairs = [TINY[i : i + 2] for i in range(0, len(TINY), 2)]
    base = [a for pair in pairs if pair[0] not in extra for a in pair]
    return run(
        capsys, "train-inverter", "--model", M, "--out", str(out), "--epochs", str(epochs),
        *base, *extra,
    )  # fmt: skip


def test_train_then_invert(capsys, tmp_path):
    out = tmp_path / "inv"
    code, stdout, err = train(capsys, out, 1, "--json")
    assert code == 0, err
    summary = json.loads(stdout)  # `--json`: one object, nothing else on stdout (issue 39)
    row = summary["last_epoch"]
    assert row["epoch"] == 1 and row["val_loss"] > 0 and 0 <= row["val_exact"] <= 1
    assert summary["history"] == [row] and summary["best_epoch"] == row
    assert summary["epochs_done"] == summary["epochs"] == 1
    assert summary["best"] == str(out / "best") and summary["last"] == str(out / "last")
    for sub in ("best", "last"):
        assert (out / sub / "inverter.json").is_file()
        assert (out / sub / "model.safetensors").is_file()
    assert not list(out.rglob("*.bin")) and not list(out.rglob("*.pt"))  # nothing pickled
    state = json.loads((out / "state.json").read_text())
    assert state["epoch"] == 1 and state["history"][0] == row

    code, stdout, err = run(
        capsys, "invert", "--model", M, "--tokens", "5,6", "--tokens", "7",
        "--objective", "text", "--output-tokens", "3",
        "--algorithm", "inverter", "--param", f"checkpoint={out / 'best'}", "--json",
    )  # fmt: skip
    assert code == 0, err
    # Printed as each target finishes (issue 30): in sample order once sorted.
    rows = sorted((json.loads(line) for line in stdout.splitlines()), key=lambda r: r["sample_id"])
    assert [r["length"] for r in rows] == [2, 1]
    assert all(r["algorithm"] == "inverter" and r["steps"] == 1 for r in rows)
    assert all(len(r["tokens"]) == r["length"] for r in rows)
    assert rows[0]["params"]["shape"] == "tiny"


def test_resume_from_last(capsys, tmp_path, caplog):
    out = tmp_path / "inv"
    assert train(capsys, out, 1)[0] == 0
    first = json.loads((out / "state.json").read_text())
    from safetensors.torch import load_file

    w1 = load_file(str(out / "last" / "model.safetensors"))
    with caplog.at_level(logging.INFO, logger="sodaray.inverter.train"):
        code, stdout, err = train(capsys, out, 2)
    assert code == 0, err
    assert "resuming from epoch 1" in caplog.text
    state = json.loads((out / "state.json").read_text())
    # Epoch 1 was not trained again: its row (with its timing) is the first run's.
    assert state["epoch"] == 2 and state["history"][0] == first["history"][0]
    # Without --json: a line for the epoch trained, then where the best checkpoint is.
    lines = stdout.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("epoch 2/2: train loss ")
    assert "val exact" in lines[0] and lines[1].startswith("2 of 2 epochs in ")
    assert lines[1].endswith(str(out / "best"))
    # The scheduler step count continues from the first run's (36 training pairs, batch 8: 5).
    assert first["sched_step"] == 5 and state["sched_step"] == 10
    w2 = load_file(str(out / "last" / "model.safetensors"))
    assert any(not torch.equal(w1[k], w2[k]) for k in w1)
    # Already at the requested epochs: nothing more is trained.
    assert train(capsys, out, 2)[0] == 0
    assert json.loads((out / "state.json").read_text())["history"] == state["history"]


BAD = [
    (["--shape", "huge"], "unknown inverter shape"),
    (["--lengths", "3-1"], "ends before it starts"),
    (["--per-length", "0"], "per_length"),
    (["--lr", "nan"], "lr must be a finite number"),
    (["--epochs", "x"], "invalid int value"),
    (["--threads", "0"], "--threads"),
    (["--output-tokens", "600"], "exceed the model's context"),
]


@pytest.mark.parametrize("extra,message", BAD, ids=[m for _, m in BAD])
def test_bad_argument_is_one_line_exit_2(capsys, tmp_path, extra, message):
    torch.set_num_threads(2)
    with pytest.raises(SystemExit) as exc_info:
        code, _, err = train(capsys, tmp_path / "inv", 1, *extra)
        raise SystemExit(code)
    err = capsys.readouterr().err or err
    assert exc_info.value.code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "inv" / "state.json").exists()
    assert torch.get_num_threads() == 2  # refused before --threads 1 took effect


def test_resume_with_other_data_settings_is_refused(capsys, tmp_path):
    out = tmp_path / "inv"
    assert train(capsys, out, 1)[0] == 0
    code, _, err = train(capsys, out, 2, "--output-tokens", "4")
    assert code == 2 and "output_tokens=3" in err and len(err.strip().splitlines()) == 1
    assert json.loads((out / "state.json").read_text())["epoch"] == 1


def test_logits_observation_end_to_end(capsys, tmp_path):
    out = tmp_path / "logits"
    code, stdout, err = train(capsys, out, 1, "--observation", "logits", "--mlp-hidden", "8")
    assert code == 0, err
    meta = json.loads((out / "best" / "inverter.json").read_text())
    assert meta["observation"] == "logits" and meta["mlp_hidden"] == 8
    assert meta["output_tokens"] == 3  # --output-tokens 3 in TINY beats the logits default 1
    assert json.loads((out / "train_config.json").read_text())["lr"] == 2e-4  # paper default
    assert (out / "best" / "logits_encoder.safetensors").is_file()
    code, stdout, err = run(
        capsys, "invert", "--model", M, "--tokens", "5,6", "--output-tokens", "3",
        "--algorithm", "inverter", "--param", f"checkpoint={out / 'best'}", "--json",
    )  # fmt: skip
    assert code == 0, err
    row = json.loads(stdout)
    assert row["length"] == 2 and row["params"]["observation"] == "logits"
    # The text objective observes no logits: refused in one line.
    code, _, err = run(
        capsys, "invert", "--model", M, "--tokens", "5,6", "--objective", "text",
        "--output-tokens", "3", "--algorithm", "inverter", "--param", f"checkpoint={out / 'best'}",
    )  # fmt: skip
    assert code == 2 and "logits objective" in err and len(err.strip().splitlines()) == 1
