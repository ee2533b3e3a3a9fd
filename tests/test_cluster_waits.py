"""Waits on cluster addresses are bounded (issue 58): `--address HOST:PORT` and `ray://HOST:PORT`
end within `waits.CHECK_SECONDS` in one line whatever listens there. A port that accepts and
never answers was already bounded; a gRPC server that answers but is not Ray (another service,
or the other of a head's two ports: its GCS given as ray://, its Ray Client port as HOST:PORT)
held Ray's connect loop 50 s (ray://) to 180 s (HOST:PORT). Real sockets, a real gRPC server,
`sodaray` in a subprocess with a deadline."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import STORIES, silent_port

from sodaray.experiment.cluster import check_address
from sodaray.experiment.waits import CHECK_SECONDS

grpc = pytest.importorskip("grpc")
ROOT = Path(__file__).resolve().parents[1]
SWEEP = f"""name: s
models: [{{id: "{STORIES}", num_cpus: 1}}]
datasets: [{{name: random, build: {{dataset: random, lengths: "1", per_length: 2}}}}]
algorithms: [{{name: soda}}]
max_steps: 5
"""


@contextlib.contextmanager
def grpc_port():
    """A gRPC server serving nothing: every call is UNIMPLEMENTED, as Ray's calls are at a
    server of another kind."""
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield port
    finally:
        server.stop(None)


@pytest.mark.parametrize("scheme", ["", "ray://"])
def test_a_grpc_server_that_is_not_ray_is_one_error_at_once(scheme):
    with grpc_port() as port:
        start = time.monotonic()
        with pytest.raises(ValueError) as caught:
            check_address(f"{scheme}127.0.0.1:{port}")
        seconds = time.monotonic() - start
    message = str(caught.value)
    assert "\n" not in message and "it answers gRPC but is not a Ray " in message
    kind = "Ray Client server" if scheme else "Ray cluster's GCS"
    assert kind in message and seconds < CHECK_SECONDS, (message, seconds)


@pytest.mark.parametrize("scheme", ["", "ray://"])
def test_a_port_that_never_answers_is_one_error_within_the_bound(scheme):
    with silent_port() as port:
        start = time.monotonic()
        with pytest.raises(ValueError, match="does not answer as a Ray cluster within 10 s"):
            check_address(f"{scheme}127.0.0.1:{port}")
        assert time.monotonic() - start < CHECK_SECONDS + 2


@pytest.mark.skipif(not STORIES.is_dir(), reason="stories260K not present")
@pytest.mark.parametrize("command, server", [("sweep", "silent"), ("tune", "grpc")])
def test_ray_addresses_that_never_become_a_cluster_end_in_one_line(tmp_path, command, server):
    """The commands as users run them: `sweep run` and `tune` with --address ray://HOST:PORT
    at a port that never answers, or answers as something else: exit 2, one line, within the
    bound plus start-up (imports, the file's checks)."""
    (tmp_path / "s.yaml").write_text(SWEEP)
    (tmp_path / "t.yaml").write_text(
        f"name: t\nmodel: {{id: '{STORIES}', num_cpus: 1}}\n"
        "data: {build: {dataset: random, lengths: '1', per_length: 2}}\n"
        "space: {learning_rate: {type: float, low: 0.01, high: 0.5}}\nmax_steps: 5\n"
    )
    args = ["sweep", "run", "s.yaml"] if command == "sweep" else ["tune", "t.yaml"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with silent_port() if server == "silent" else grpc_port() as port:
        start = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "sodaray", *args, "--out", "o"]
            + ["--address", f"ray://127.0.0.1:{port}"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
        )
        seconds = time.monotonic() - start
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert f"cannot reach a Ray cluster at ray://127.0.0.1:{port}" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert seconds < CHECK_SECONDS + 40, seconds  # Ray's own loop took 50 s to minutes
