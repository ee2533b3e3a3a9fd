"""The command's entry: `--version`, and `--help` that does not import torch, Ray or Optuna."""

from __future__ import annotations

import subprocess
import sys

import pytest

import sodaray

HEAVY = ("torch", "transformers", "ray", "optuna", "pandas", "matplotlib")

# A fresh interpreter per case: this test process has already imported everything.
PROBE = """
import sys
from sodaray.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
else:
    code = 0
heavy = [m for m in {heavy!r} if m in sys.modules]
print("HEAVY=" + ",".join(heavy), file=sys.stderr)
sys.exit(code)
"""


def probe(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PROBE.format(heavy=HEAVY), *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "argv",
    [("--help",), ("sweep", "run", "--help"), ("tune", "--help"), ("report", "--help")],
)
def test_help_imports_no_heavy_library(argv):
    done = probe(*argv)
    assert done.returncode == 0, done.stderr
    assert "usage: sodaray" in done.stdout
    assert "HEAVY=\n" in done.stderr, done.stderr


def test_version():
    done = probe("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"sodaray {sodaray.__version__}"
    assert "HEAVY=\n" in done.stderr, done.stderr


def test_lazy_names_resolve():
    # Every public name the package promises is importable through the lazy look-up.
    import sodaray.runner
    import sodaray.tuner

    for package in (sodaray, sodaray.runner, sodaray.tuner):
        for name in package.__all__:
            assert getattr(package, name) is not None, (package.__name__, name)
    with pytest.raises(AttributeError):
        sodaray.no_such_name  # noqa: B018
    # `import sodaray` then `sodaray.results.…`, as before the names became lazy.
    done = subprocess.run(
        [sys.executable, "-c", "import sodaray; print(sodaray.results.read_results.__name__)"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.strip() == "read_results", done.stderr


def test_refused_connection_names_the_missing_token():
    # Ray's own exception and message for a client without the cluster's token (Ray >= 2.52).
    import ray

    from sodaray.experiment.cluster import ADDRESS_HINT, TOKEN_HINT, connect_hint

    refused = ray.exceptions.AuthenticationError(
        "Token authentication is enabled but no authentication token was found"
    )
    assert connect_hint(refused) == TOKEN_HINT
    assert "RAY_AUTH_TOKEN" in TOKEN_HINT and "ray get-auth-token" in TOKEN_HINT
    assert connect_hint(ConnectionError("Could not find any running Ray instance")) == (
        ADDRESS_HINT
    )
    # Ray >= 2.60 retries, then raises a plain ConnectionError from the refusal: the cause says.
    try:
        try:
            raise RuntimeError("RPC error: InvalidAuthToken: Authentication token is missing")
        except RuntimeError as cause:
            raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379") from cause
    except ConnectionError as wrapped:
        assert connect_hint(wrapped) == TOKEN_HINT
