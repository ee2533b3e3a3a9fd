"""`sodaray invert`: JSON output, and one-line errors with exit code 2 on bad input."""

from __future__ import annotations

import json
import socket
from datetime import datetime, timedelta

import numpy as np
import pytest
from conftest import STORIES

from sodaray.cli import main

pytestmark = pytest.mark.skipif(not STORIES.is_dir(), reason="stories260K not present")
M = str(STORIES)


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_invert_json(capsys):
    code, out, err = run(
        capsys,
        "invert",
        "--model",
        M,
        "--tokens",
        "172",
        "--tokens",
        "5,6",
        "--max-steps",
        "200",
        "--json",
    )
    assert code == 0
    rows = [json.loads(line) for line in out.splitlines()]
    assert len(rows) == 2
    for key in ("tokens", "text", "found", "exact", "steps", "seconds"):
        assert key in rows[0]
    assert rows[0]["found"] and rows[0]["exact"] and rows[0]["tokens"] == [172]
    assert rows[1]["length"] == 2 and rows[1]["steps"] <= 200
    # Where and when the rows were made, and which weights (the model folder's content hash).
    assert datetime.fromisoformat(rows[0]["finished_at"]).utcoffset() == timedelta(0)
    assert rows[0]["host"] == socket.gethostname()
    assert rows[0]["model_revision"].startswith("sha256:")


def test_invert_logits_file_auto_length(capsys, tmp_path, stories):
    import torch

    logits = stories.token_logits(torch.tensor([[172]]))[:, -1:].numpy()
    np.save(tmp_path / "obs.npy", logits)
    code, out, _ = run(
        capsys,
        "invert",
        "--model",
        M,
        "--logits-file",
        str(tmp_path / "obs.npy"),
        "--max-length",
        "2",
        "--max-steps",
        "300",
        "--json",
    )
    row = json.loads(out)
    assert code == 0 and row["found"] and row["tokens"] == [172] and row["exact"] is None


BAD = [
    (["--model", "./no/such/model", "--tokens", "1"], "no such model"),
    (["--model", M, "--prompt", ""], "empty"),
    (["--model", M, "--tokens", "1,x"], "non-negative integer"),
    (["--model", M, "--tokens", "600"], "outside the model's vocabulary"),
    (["--model", M, "--tokens", "1", "--max-steps", "-5"], "max_steps"),
    (["--model", M, "--tokens", "1", "--top-k", "513"], "vocabulary"),
    (["--model", M, "--tokens", "1", "--length", "0"], "length"),
    (["--model", M, "--tokens", "1", "--preset", "nope"], "unknown preset"),
    (["--model", M, "--tokens", "1", "--param", "tempreature=1"], "tempreature"),
    (["--model", M, "--tokens", "1", "--algorithm", "magic"], "unknown algorithm"),
    (["--model", M], "give inputs"),
    (["--model", M, "--logits-file", "/nonexistent.npy"], "no such logits file"),
]


@pytest.mark.parametrize("argv,message", BAD, ids=[m for _, m in BAD])
def test_bad_input_is_one_line_exit_2(capsys, argv, message):
    with pytest.raises(SystemExit) as exc_info:
        code = main(["invert", *argv])
        raise SystemExit(code)
    err = capsys.readouterr().err
    assert exc_info.value.code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert message in err
    assert "Traceback" not in err


def test_logits_file_of_wrong_shape(capsys, tmp_path):
    np.save(tmp_path / "bad.npy", np.zeros((1, 7), dtype=np.float32))
    code, _, err = run(capsys, "invert", "--model", M, "--logits-file", str(tmp_path / "bad.npy"))
    assert code == 2 and "vocabulary" in err and len(err.strip().splitlines()) == 1
    (tmp_path / "pickle.npy").write_bytes(b"not numpy")
    code, _, err = run(
        capsys, "invert", "--model", M, "--logits-file", str(tmp_path / "pickle.npy")
    )
    assert code == 2 and "cannot read logits file" in err
