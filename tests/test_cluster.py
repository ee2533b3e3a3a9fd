"""Which Ray a run uses, and nothing a Ray actor gets may depend on the driver's working
directory or file system.

Without an address a run starts a fresh local Ray, whatever cluster a `ray start` on the
machine recorded (issue 40); an attach that cannot succeed ends in one line within seconds. A
real head with a logical GPU and token authentication shows the replicas a cluster cannot all
hold, and the missing token (issue 37). Local paths are resolved on the driver
(`ModelSpec.resolved`, `TuningSpec.resolved`); the multi-node test starts a real head and a
second node from other folders and compares a sweep and a tuning run there with the same runs
on local Ray.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import pyarrow.parquet as pq
import pytest
from conftest import STORIES

import sodaray
from sodaray.experiment.cluster import TOKEN_HINT
from sodaray.experiment.replica import load_replica
from sodaray.experiment.spec import MODEL_KEYS, ModelSpec
from sodaray.io.modelfiles import ModelLoadError
from sodaray.io.paths import local_path
from sodaray.runner.spec import load_sweep
from sodaray.tuner.storage import open_storage


def test_resolved_model_carries_absolute_paths_and_keeps_its_id(tmp_path, monkeypatch):
    (tmp_path / "models" / "m").mkdir(parents=True)
    (tmp_path / "p.yaml").write_text("soda: {learning_rate: 0.1}\n")
    monkeypatch.chdir(tmp_path)
    spec = ModelSpec(id="models/m", preset_file="p.yaml").resolved()
    # Loaded from the absolute path, but named as given: job hashes and result rows use `id`.
    assert spec.source == str(tmp_path / "models" / "m") and spec.id == "models/m"
    assert spec.preset_file == str(tmp_path / "p.yaml")
    assert spec.identity() == ModelSpec(id="models/m").identity()
    hub = ModelSpec(id="roneneldan/TinyStories-33M", preset="stories260k").resolved()
    assert hub.source is None and hub.preset == "stories260k"  # no such path: a hub id
    assert local_path("../nowhere/at/all") is None
    assert "source" not in MODEL_KEYS  # set by the driver, never by a file


def test_a_node_without_the_resolved_path_says_so_in_one_line():
    spec = ModelSpec(id="../models/m", source="/no/such/node/path/m")
    with pytest.raises(ModelLoadError) as caught:
        load_replica(spec)
    message = str(caught.value)
    assert "\n" not in message and "/no/such/node/path/m" in message
    assert "../models/m" in message and socket.gethostname() in message


@pytest.mark.skipif(not STORIES.is_dir(), reason="stories260K not present")
def test_sweep_from_a_relative_path_resolves_on_the_driver(tmp_path, monkeypatch):
    rel = os.path.relpath(STORIES, tmp_path)
    path = tmp_path / "s.yaml"
    path.write_text(
        f"name: s\nmodels: [{{id: {rel}}}]\n"
        "datasets: [{name: random, build: {dataset: random, lengths: 1, per_length: 1}}]\n"
        "algorithms: [{name: soda}]\n"
    )
    monkeypatch.chdir(tmp_path)
    job = load_sweep(path).jobs()[0]
    assert job.model.id == rel and job.model.resolved().source == str(STORIES)


# ---- a real two-node cluster ------------------------------------------------------------------
BIN = Path(sys.executable).parent
RAY = BIN / "ray" if (BIN / "ray").is_file() else shutil.which("ray")
ROOT = Path(sodaray.__file__).resolve().parents[1]  # this checkout: the nodes run its code


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def private_mounts_work() -> bool:
    """`unshare -m` (root, or a user namespace): node 2 then gets its own mount table."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "true"], capture_output=True, timeout=20
    )
    return probe.returncode == 0


class TwoNodes:
    """A Ray head with no CPUs (nothing runs there) and a second node with two, started from
    its own folder; with `hidden`, node 2 runs in a private mount namespace where a tmpfs hides
    that folder (the driver's results), as on a machine without the driver's disk. Every Ray
    process lives in one of two process groups, ended by id in `stop()`."""

    def __init__(self, base: Path, hidden: Path | None) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        # Short: Ray puts unix sockets in it (a path at most 107 bytes). Ray allows one temp dir
        # per machine, so node 2 shares it; it is not the driver's default /tmp/ray.
        self.temp = Path(tempfile.mkdtemp(prefix="sr19-", dir="/tmp"))
        self.node_dir = base / "node2"
        self.node_dir.mkdir()
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "RAY_USAGE_STATS_ENABLED": "0",
            # Token authentication, as the README sets it up, with a token of this test's own:
            # left unset, `ray start --head` turns it on when ~/.ray/auth_token exists (any
            # local `ray.init` writes one) while `ray start --address` does not, and node 2 is
            # refused.
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": secrets.token_hex(32),
        }
        self.groups: list[int] = []
        self.hidden = hidden

    def start_head(self, *resources: str) -> None:
        """The head, holding `resources` (`ray start` flags)."""
        # Ports with fixed defaults (client server, dashboard, agents) given free ones: another
        # Ray on this machine may hold the defaults.
        self._start(
            [str(RAY), "start", "--head", "--port", str(self.port), *resources]
            + ["--ray-client-server-port", str(free_port()), "--dashboard-port", str(free_port())]
            + ["--dashboard-agent-listen-port", str(free_port()), "--include-dashboard", "false"]
            + ["--temp-dir", str(self.temp), "--disable-usage-stats"],
            cwd=self.node_dir.parent,
        )

    def start(self) -> None:
        hidden = self.hidden
        common = ["--temp-dir", str(self.temp), "--disable-usage-stats"]
        self.start_head("--num-cpus", "0")
        node = [str(RAY), "start", "--address", self.address, "--num-cpus", "2"]
        node += ["--dashboard-agent-listen-port", str(free_port())] + common
        if hidden is None:
            self._start(node, cwd=self.node_dir)
        else:
            # The marker proves the mount hides the folder before the node starts.
            (hidden / "marker").write_text("the driver's disk")
            script = (
                f"mount -t tmpfs sodaray-hidden {shlex.quote(str(hidden))} && "
                f"test ! -e {shlex.quote(str(hidden / 'marker'))} && exec {shlex.join(node)}"
            )
            self._start(
                ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                cwd=self.node_dir,
            )

    def _start(self, cmd: list[str], cwd: Path) -> None:
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=self.env,
            start_new_session=True,  # its own process group: the daemons it leaves stay in it
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.groups.append(proc.pid)
        out, _ = proc.communicate(timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"{cmd[:3]} failed:\n{out[-3000:]}")

    def sodaray(
        self, *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 400
    ) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(BIN / "sodaray"), *args],
            cwd=cwd,
            env=self.env if env is None else env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def stop(self) -> None:
        for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 0.0)):
            for group in self.groups:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(group, sig)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and any(_alive(g) for g in self.groups):
                time.sleep(0.2)
        shutil.rmtree(self.temp, ignore_errors=True)


def _alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def result_rows(folder: Path) -> list[tuple]:
    """Every result row's job, sample and outcome, sorted: what must match between runs."""
    table = pq.ParquetDataset(sorted(folder.rglob("shard-*.parquet"))).read()
    columns = ["job", "model", "sample_id", "true_tokens", "tokens", "found", "exact", "steps"]
    rows = table.select(columns).to_pylist()
    return sorted(tuple(str(r[c]) for c in columns) for r in rows)


@pytest.mark.benchmark  # 118 s: run with `-m benchmark`
@pytest.mark.skipif(RAY is None, reason="no `ray` command")
@pytest.mark.skipif(not STORIES.is_dir(), reason="stories260K not present")
def test_two_nodes_from_other_folders_give_the_local_results(tmp_path):
    # The driver's results folder: node 2 cannot see it where mount namespaces work.
    hidden = tmp_path / "driver"
    hidden.mkdir()
    private = private_mounts_work()
    # The quickstart sweep, run from this checkout's root as the README says: its model is the
    # relative ../../shared/models/stories260K (from sweeps/), no model from node 2's folder.
    sweep = ["sweep", "run", "sweeps/quickstart.yaml", "--limit", "2", "--max-steps", "30"]
    # A 3-trial study whose model path is relative to the driver's folder and whose journal is
    # a relative path in it (actors reach it through the driver's storage proxy).
    rel = os.path.relpath(STORIES, hidden)
    (hidden / "tune.yaml").write_text(
        f"name: tiny\nmodel: {{id: {rel}, num_cpus: 1}}\n"
        "data: {build: {dataset: random, lengths: 1-2, per_length: 2, seed: 0}}\n"
        "fixed: {max_batch_size: 8}\n"
        "space: {learning_rate: {type: float, low: 0.03, high: 0.3, log: true}}\n"
        "max_steps: 20\ntrials: 3\ncheckpoints: 2\npruner: median\n"
    )
    cluster = TwoNodes(tmp_path, hidden if private else None)
    try:
        cluster.start()
        on_cluster = cluster.sodaray(
            *sweep, "--out", str(hidden / "sweep-out"), "--address", cluster.address, cwd=ROOT
        )
        assert on_cluster.returncode == 0, on_cluster.stderr[-3000:]
        tuned = cluster.sodaray(
            "tune",
            "tune.yaml",
            "--out",
            "tune-out",
            "--address",
            cluster.address,
            "--json",
            cwd=hidden,
        )
        assert tuned.returncode == 0, tuned.stderr[-3000:]
    finally:
        cluster.stop()
    # The same commands on a local Ray (no --address), with the same environment.
    local = cluster.sodaray(*sweep, "--out", str(tmp_path / "local-sweep"), cwd=ROOT)
    assert local.returncode == 0, local.stderr[-3000:]
    cluster_rows = result_rows(hidden / "sweep-out")
    assert len(cluster_rows) == 4  # two jobs (temperatures), two samples each
    # The rows name the model as the file gives it; the actors loaded it by its absolute path.
    assert {row[1] for row in cluster_rows} == {"../../shared/models/stories260K"}
    assert cluster_rows == result_rows(tmp_path / "local-sweep")

    tuned_local = cluster.sodaray(
        "tune", "tune.yaml", "--out", str(tmp_path / "local-tune"), "--json", cwd=hidden
    )
    assert tuned_local.returncode == 0, tuned_local.stderr[-3000:]
    board, board_local = json.loads(tuned.stdout), json.loads(tuned_local.stdout)
    assert board["states"] == {"complete": 3}, board
    # The same trials (the sampler is seeded) with the same values, wherever they ran.
    assert board["top"] == board_local["top"]
    journal = hidden / "tune-out" / "tiny" / "study.journal"  # relative on the command line
    study = optuna.load_study(study_name="tiny", storage=open_storage(str(journal)))
    # Each trial's solved fraction at its 2 checkpoints, streamed back from node 2 and reported
    # by the driver.
    assert [len(t.intermediate_values) for t in study.trials] == [2, 2, 2]
    assert len(list((hidden / "tune-out" / "tiny" / "trials").glob("*.parquet"))) == 3


# ---- which Ray a run uses (issue 40) ----------------------------------------------------------
QUICK = ["sweep", "run", "sweeps/quickstart.yaml", "--limit", "2", "--max-steps", "5"]


def driver_env(**extra: str) -> dict[str, str]:
    """This checkout's code, no cluster named, no auth token: a user's plain shell."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    return {**env, **extra}


def run_cli(*args: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "sodaray"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def stale_ray_dir() -> Iterator[tuple[Path, str]]:
    """A Ray temporary folder of this test's own (RAY_TMPDIR; short: Ray's sockets go in it)
    whose `ray_current_cluster` names a cluster that is gone: a port nothing listens on."""
    base = Path(tempfile.mkdtemp(prefix="sr40-", dir="/tmp"))
    dead = f"127.0.0.1:{free_port()}"
    (base / "ray").mkdir()
    (base / "ray" / "ray_current_cluster").write_text(dead + "\n")
    yield base, dead
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.skipif(not STORIES.is_dir(), reason="stories260K not present")
def test_no_address_runs_on_a_fresh_local_ray_whatever_a_dead_cluster_left(
    tmp_path, stale_ray_dir
):
    """Ray's `address=None` attaches to the recorded cluster and, once it is dead, waits on it
    for minutes: the sweep must start its own Ray and finish. Its replicas ask for every core,
    so two cannot both run on this machine: it says so and runs on one (issue 37's stall)."""
    base, dead = stale_ray_dir
    cores = str(os.cpu_count())
    done = run_cli(
        *QUICK,
        f"models.stories260K.num_cpus={cores}",
        "--out",
        str(tmp_path / "out"),
        env=driver_env(RAY_TMPDIR=str(base)),
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(result_rows(tmp_path / "out")) == 4  # two jobs, two samples each
    assert f"1 of 2 replicas of model stories260K fit (each asks {cores} CPU" in done.stderr
    assert "running on 1" in done.stderr
    assert dead.split(":")[1] not in done.stderr  # the dead cluster was never tried
    assert (base / "ray" / "ray_current_cluster").read_text().strip() == dead


@pytest.mark.parametrize("how", ["flag", "auto", "env"])
def test_an_attach_to_a_dead_cluster_is_one_line_within_seconds(tmp_path, stale_ray_dir, how):
    """`--address` to a dead cluster, `--address auto` where the recorded one is dead, and
    RAY_ADDRESS naming a dead one: exit 2 and one line naming the address and what to do, in
    seconds (Ray's own connect loop prints warnings for minutes)."""
    base, dead = stale_ray_dir
    (tmp_path / "s.yaml").write_text(
        f"name: s\nmodels: [{{id: {STORIES}}}]\nalgorithms: [{{name: soda}}]\n"
        "datasets: [{name: r, build: {dataset: random, lengths: 1, per_length: 1}}]\n"
    )
    argv = ["sweep", "run", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "o")]
    env = driver_env(RAY_TMPDIR=str(base))
    if how == "flag":
        argv += ["--address", dead]
        expected = f"cannot reach a Ray cluster at {dead} (from --address)"
    elif how == "auto":
        argv += ["--address", "auto"]
        expected = f"at {dead} (from --address auto: the last `ray start` here recorded it in "
        expected += str(base)
    else:
        env["RAY_ADDRESS"] = dead
        expected = f"cannot reach a Ray cluster at {dead} (from RAY_ADDRESS)"
    started = time.monotonic()
    done = run_cli(*argv, env=env, timeout=120)
    took = time.monotonic() - started
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip().splitlines() == [done.stderr.strip()], done.stderr
    assert expected in done.stderr and ("leave out --address" in done.stderr) == (how != "env")
    assert took < 30, took  # the command's start-up (torch, Ray) included
    assert not (tmp_path / "o").exists()  # nothing planned or written before the check


# ---- a head with a logical GPU and token authentication (issue 37) ----------------------------
@pytest.fixture(scope="module")
def gpu_head(tmp_path_factory) -> Iterator[TwoNodes]:
    """One head node with 2 CPUs and 1 (logical) GPU, on any machine, and a token of its own;
    its Ray processes are ended by process group when the module is done."""
    head = TwoNodes(tmp_path_factory.mktemp("gpu-head"), None)
    try:
        head.start_head("--num-cpus", "2", "--num-gpus", "1")
        yield head
    finally:
        head.stop()


@pytest.mark.skipif(RAY is None, reason="no `ray` command")
def test_a_driver_without_the_clusters_token_is_told_so_in_one_line(gpu_head):
    """Ray retries a refused token twenty times with a warning each; the run stops in one line
    within seconds, and it names the token, not "start a cluster"."""
    started = time.monotonic()
    out = ["--out", str(gpu_head.node_dir / "never"), "--address", gpu_head.address]
    done = run_cli(*QUICK, *out, env=driver_env())
    took = time.monotonic() - started
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip().splitlines() == [done.stderr.strip()], done.stderr
    assert TOKEN_HINT in done.stderr and gpu_head.address in done.stderr
    # Ray's own loop: 20 tries, a warning line each. Its start-up (torch, Ray, the plan's
    # dataset) is most of this on a loaded machine.
    assert took < 60, took


@pytest.mark.skipif(RAY is None, reason="no `ray` command")
@pytest.mark.skipif(not STORIES.is_dir(), reason="stories260K not present")
def test_replicas_a_cluster_cannot_all_hold_run_on_those_it_can(gpu_head, tmp_path):
    """Two replicas asking a GPU each on a one-GPU cluster: one is placed, the other waits
    for room holding no work, and the run says so and finishes (it stalled with no message).
    Asking two GPUs, no node can hold one: one line at once, or after --wait-for-nodes."""
    env = {**gpu_head.env, "PYTHONPATH": driver_env()["PYTHONPATH"]}
    common = ["--out", str(tmp_path / "out"), "--address", gpu_head.address]
    done = gpu_head.sodaray(
        *QUICK, "models.stories260K.num_gpus=1", *common, cwd=ROOT, env=env, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "1 of 2 replicas of model stories260K fit on the cluster's nodes" in done.stderr
    assert "each asks 1 CPU and 1 GPU; the cluster has 1 node (2 CPU, 1 GPU)" in done.stderr
    assert len(result_rows(tmp_path / "out")) == 4

    # Results elsewhere: a job's folder does not depend on resources, and this one is done.
    too_big = [*QUICK, "models.stories260K.num_gpus=2", "--out", str(tmp_path / "big")]
    too_big += ["--address", gpu_head.address]
    refused = gpu_head.sodaray(*too_big, cwd=ROOT, env=env, timeout=120)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert refused.stderr.strip().splitlines() == [refused.stderr.strip()], refused.stderr
    assert "no node of the cluster can hold a replica of model stories260K" in refused.stderr

    started = time.monotonic()
    waited = gpu_head.sodaray(*too_big, "--wait-for-nodes", "3", cwd=ROOT, env=env, timeout=120)
    took = time.monotonic() - started
    assert waited.returncode == 2, waited.stderr[-3000:]
    lines = waited.stderr.strip().splitlines()
    assert any("waiting up to 3 s for nodes to join" in line for line in lines), lines
    assert lines[-1].startswith("sodaray: error: no replica of stories260K (each asks 1 CPU and")
    assert "could be placed within 3 s" in lines[-1] and took < 60, (took, waited.stderr)
