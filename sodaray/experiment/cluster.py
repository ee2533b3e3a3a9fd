"""Which Ray a run uses (a fresh local one, or a cluster it attaches to), the one-line errors when
a cluster cannot be joined, and how many of a model's replicas the cluster can hold."""

from __future__ import annotations

import logging
import math
import os
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from sodaray.errors import first_line
from sodaray.experiment import stops
from sodaray.experiment.waits import CHECK_SECONDS, within

log = logging.getLogger(__name__)

ADDRESS_HINT = "start one (`ray start --head`, `ray up cluster.yaml`) or leave out --address"
ENV_HINT = "start one (`ray start --head`, `ray up cluster.yaml`) or unset RAY_ADDRESS"
TOKEN_HINT = (
    "the cluster uses token authentication: set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN (or "
    "RAY_AUTH_TOKEN_PATH) to the head's token, which `ray get-auth-token` prints on the head"
)
# Ray's connect loop tries a GCS 20 times, up to half a minute each: an attach to an open port gets
# this many, so a refusal (a missing auth token) is one line within seconds.
CONNECT_TRIES = 4
# How long a run waits with none of its replicas placed when `--wait-for-nodes` is 0 (placing on
# a node with room takes well under a second: this is for other work to free room).
PLACE_GRACE_S = 30.0
CLUSTER_REST = "; the rest start if nodes join or others' work ends"
RESOURCE_STEP = 1e-4  # Ray's resolution for resource amounts: 0.3 GPU three times fits 1


def cluster_address(address: str | None) -> str | None:
    """The cluster a run attaches to: `--address`, else RAY_ADDRESS (which `ray job submit`
    sets for its drivers); None for a fresh local Ray of this run's own, whatever clusters were
    started on this machine before (Ray's `address=None` would attach to the last one
    `ray start` recorded, and wait minutes on it when it has died)."""
    chosen = address or os.environ.get("RAY_ADDRESS") or None
    return None if chosen == "local" else chosen


def _where(address: str | None) -> tuple[str, str]:
    """Where the cluster's address came from (for the error), and what to do instead."""
    return ("--address", ADDRESS_HINT) if address else ("RAY_ADDRESS", ENV_HINT)


def recorded_address() -> tuple[str, Path] | None:
    """The address `auto` attaches to on this machine, and the file it is read from: the one
    the last `ray start --head` recorded in Ray's temporary folder (`ray.init` documents
    /tmp/ray/ray_current_cluster; Ray takes RAY_TMPDIR, else on Linux TMPDIR, over /tmp)."""
    linux = sys.platform.startswith("linux")
    base = os.environ.get("RAY_TMPDIR") or (linux and os.environ.get("TMPDIR")) or None
    if not base:
        base = "/tmp" if sys.platform.startswith(("linux", "darwin")) else tempfile.gettempdir()
    path = Path(base) / "ray" / "ray_current_cluster"
    try:
        text = path.read_text(encoding="utf-8", errors="replace")[:1000].strip()
    except OSError:
        return None
    return (text, path) if text else None


def check_address(address: str | None, timeout: float = CHECK_SECONDS) -> None:
    """The cluster the run would attach to (`cluster_address`) must accept a connection and
    answer as Ray's GCS or Ray Client does within `timeout` seconds all told (Ray itself retries
    for minutes). `auto` is checked at the address `ray start` recorded on this machine, when
    there is one (else Ray says in one line that no cluster runs)."""
    target = cluster_address(address)
    if target is None:
        return
    where, hint = _where(address)
    if target == "auto" and os.environ.get("RAY_ADDRESS", "auto") != "auto":
        target, where, hint = os.environ["RAY_ADDRESS"], "RAY_ADDRESS", ENV_HINT  # Ray's order
    if target == "auto":
        recorded = recorded_address()
        if recorded is None:
            return
        target, path = recorded
        where = f"--address auto: the last `ray start` here recorded it in {path}"
        hint = "that cluster is gone: start one (`ray start --head`) or leave out --address"
    scheme, sep, rest = target.partition("://")
    if sep and scheme not in ("ray", "rays"):
        raise ValueError(f"{where}: use auto, HOST:PORT or ray://HOST:PORT")
    host, _, port = (rest if sep else target).rstrip("/").rpartition(":")
    try:
        probe = partial(_answers, host or "127.0.0.1", int(port), timeout, scheme)
        within(probe, "the address", timeout)
    except (OSError, ValueError) as exc:
        raise ValueError(
            f"cannot reach a Ray cluster at {target} (from {where}): {exc}; {hint}"
        ) from exc


# One call each kind of Ray server answers (any status but UNIMPLEMENTED: a token refused is
# Ray's to say): the GCS at HOST:PORT, Ray Client's server at ray://HOST:PORT.
RAY_CALLS = {
    "": (
        "/ray.rpc.NodeInfoGcsService/GetClusterId",
        "a Ray cluster's GCS (the head's --port, 6379 by default; a Ray Client port is "
        "given as ray://HOST:PORT)",
    ),
    "ray": (
        "/ray.rpc.RayletDriver/ClusterInfo",
        "a Ray Client server (the head's --ray-client-server-port, 10001 by default; its "
        "GCS port is given as HOST:PORT)",
    ),
}


def _answers(host: str, port: int, timeout: float, scheme: str) -> None:
    """`host:port` accepts a connection, completes a gRPC (HTTP/2) handshake and serves the
    Ray call its scheme implies (`RAY_CALLS`); an OSError saying which did not. Over TLS
    (`rays://`, RAY_USE_TLS) the connection alone is checked."""
    start = time.monotonic()
    socket.create_connection((host, port), timeout=timeout).close()
    if scheme == "rays" or os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
        return
    import grpc

    channel = grpc.insecure_channel(f"{host}:{port}")
    no_answer = f"it accepts connections but does not answer as a Ray cluster within {timeout:g} s"

    def left() -> float:  # what is left of the bound, less a margin for `within`
        return max(timeout - (time.monotonic() - start) - 0.5, 0.1)

    method, kind = RAY_CALLS[scheme if scheme == "ray" else ""]
    try:
        grpc.channel_ready_future(channel).result(timeout=left())
        channel.unary_unary(method)(b"", timeout=left())  # bytes in and out
    except grpc.FutureTimeoutError as exc:
        raise TimeoutError(no_answer) from exc
    except grpc.RpcError as exc:
        code = exc.code() if callable(getattr(exc, "code", None)) else None
        if code == grpc.StatusCode.UNIMPLEMENTED:
            raise ConnectionError(f"it answers gRPC but is not {kind}") from exc
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            raise TimeoutError(no_answer) from exc
    finally:
        channel.close()


def init_ray(address: str | None) -> None:
    """Start a fresh local Ray for this run (no address given), or join a cluster, with a
    one-line error within seconds when the cluster cannot be reached or refuses us."""
    import ray

    level = logging.INFO if log.isEnabledFor(logging.INFO) else logging.ERROR  # Ray's lines: -v
    options = dict(include_dashboard=False, log_to_driver=False, logging_level=level)
    target = cluster_address(address)
    if target is None:
        with _signals_kept():
            ray.init(address="local", **options)
        return
    check_address(address)
    where, hint = _where(address)
    tries = "RAY_gcs_server_port_wait_time_s"  # read by `ray.init` as it joins
    ours = tries not in os.environ  # else the user's own
    os.environ.setdefault(tries, str(CONNECT_TRIES))
    try:
        with _signals_kept(), _stderr_held():
            ray.init(address=target, **options)
    except (ConnectionError, RuntimeError, ray.exceptions.AuthenticationError) as exc:
        raise ValueError(
            f"cannot connect to a Ray cluster at {target} (from {where}): {first_line(exc)}; "
            f"{connect_hint(exc, hint)}"
        ) from exc
    finally:
        if ours:
            os.environ.pop(tries, None)


@contextmanager
def _signals_kept() -> Iterator[None]:
    """`ray.init` under sodaray's stop rule: a SystemExit out of the block is Ray's own SIGTERM
    handler, raised as `stops.Stop` once Ray is shut down; other stop signals are raised once
    Ray is up (`stops.deferred`). After the block sodaray's handlers are back in force."""
    os.environ.setdefault(stops.NO_NATIVE_HANDLER, "1")  # for an import of ray not yet made
    try:
        with stops.deferred():
            yield
    except SystemExit as exc:  # Ray's SIGTERM handler, mid-start
        import ray

        with stops.deferred():
            ray.shutdown()
        raise stops.stopped_by(signal.SIGTERM) from exc
    finally:
        stops.reinstall()


@contextmanager
def _stderr_held() -> Iterator[None]:
    """What is written to file descriptor 2 in the block (Ray's core, a warning per failed
    connect attempt), written out once the block has ended well; dropped after an error, which
    the one-line error says in its stead."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real descriptor 2: nothing to hold
        yield
        return
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        sink.seek(0)
        sys.stderr.write(sink.read(1 << 20).decode("utf-8", errors="replace"))


def connect_hint(exc: BaseException, otherwise: str = ADDRESS_HINT) -> str:
    """What to do about a refused connection: a cluster with Ray's token authentication refuses
    a client without its token, and "start one" would send the user the wrong way. Ray wraps
    the refusal ("InvalidAuthToken") in a plain ConnectionError: its causes are read too."""
    import ray

    seen: BaseException | None = exc
    for _ in range(8):  # a cause chain is short; a cycle is not followed
        if isinstance(seen, ray.exceptions.AuthenticationError) or "token" in str(seen).lower():
            return TOKEN_HINT
        seen = seen and (seen.__cause__ or seen.__context__)
    return otherwise


@dataclass(frozen=True)
class Cluster:
    """The Ray a run uses and how it treats failures and room there (`sweep run`, `tune`).
    `address`: the cluster to attach to (`cluster_address`). `max_attempts`: the tries a unit of
    work gets (one whose input is at fault fails at its first; `experiment.group`).
    `wait_for_nodes`: see `Placement`. Values out of range are a one-line ValueError."""

    address: str | None = None
    max_attempts: int = 3
    wait_for_nodes: float = 0.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"--max-attempts must be at least 1, not {self.max_attempts}")
        wait = self.wait_for_nodes
        if not (math.isfinite(wait) and wait >= 0):
            raise ValueError(f"--wait-for-nodes must be a number of seconds, 0 or more, not {wait}")


@dataclass(frozen=True)
class Placement:
    """How a run's replicas meet the Ray they run on. `local`: a Ray this run started, where
    replicas beyond what it holds are not made (on a cluster they wait for room).
    `wait_for_nodes`: seconds a run on a cluster waits while none of its replicas can be placed;
    0: a model no node can hold stops the run at once, one waiting for room after
    `PLACE_GRACE_S`."""

    local: bool = False
    wait_for_nodes: float = 0.0

    @property
    def stall_s(self) -> float:
        """How long a run waits with none of its replicas placed before it stops."""
        return self.wait_for_nodes if self.wait_for_nodes > 0 else PLACE_GRACE_S


@contextmanager
def ray_session(
    requests: list[tuple[str, float, float]], cluster: Cluster
) -> Iterator[tuple[Placement, list[Any]]]:
    """Ray ready for actors making `requests` (label, num_cpus, num_gpus) for the block: a fresh
    local instance unless `cluster.address`/RAY_ADDRESS names a cluster or Ray already runs
    here, shut down after it; requests checked first (a local Ray would wait forever for what
    the machine lacks). Yields how replicas are placed there, and a list for the block's actor
    groups, each ended before Ray shuts down (`ActorGroup.kill`) within `CHECK_SECONDS` (with
    Ray's raylet gone, removing a placement group waits for ever; one late is left to Ray's
    shutdown, with a warning)."""
    import ray

    own = not ray.is_initialized()
    local = own and cluster_address(cluster.address) is None
    if local:
        check_resources(requests)
    placement = Placement(local=local, wait_for_nodes=cluster.wait_for_nodes)
    try:
        if own:  # in the block: a stop signal while Ray starts still shuts it down
            init_ray(cluster.address)
        if not local:  # what no node holds, in one line before any work is handed out
            for label, cpus, gpus in requests:
                room_for(label, cpus, gpus, placement)
        groups: list[Any] = []
        try:
            yield placement, groups
        finally:
            for group in groups:
                try:
                    within(group.kill, "Ray, ending a model's replicas")
                except TimeoutError as exc:
                    log.warning("%s: going on to shut Ray down", exc)
    finally:
        if own:  # a stop signal waits for the shutdown's end (cut short, it left processes)
            with stops.deferred():
                ray.shutdown()


def check_resources(requests: list[tuple[str, float, float]]) -> None:
    """Each actor's request (label, num_cpus, num_gpus) against this machine, before a local
    Ray starts: one that can never fit is an error (Ray would wait forever for it)."""
    import torch

    total = {"CPU": float(os.cpu_count() or 1), "GPU": float(torch.cuda.device_count())}
    for label, cpus, gpus in requests:
        for name, need in (("GPU", gpus), ("CPU", cpus)):
            if need > total[name]:
                raise ValueError(
                    f"{label} asks for {need:g} {name} per replica but the machine has "
                    f"{total[name]:g}; lower its num_gpus/num_cpus, or give --address for a "
                    "cluster that has them"
                )


def describe(cpus: float, gpus: float) -> str:
    """A replica's request as words: "1 CPU and 1 GPU"."""
    return f"{cpus:g} CPU" + (f" and {gpus:g} GPU" if gpus else "")


def room_for(label: str, cpus: float, gpus: float, placement: Placement) -> tuple[int, str]:
    """How many replicas of a model asking `cpus` and `gpus` each the Ray cluster's live nodes
    hold when nothing else runs (each node counted apart: a replica runs on one node; work of
    other jobs and of this run's other models is not subtracted: it ends, and Ray then places
    what waits), and the request and nodes in words; a one-line error when none fits and the
    run will not wait for nodes to join."""
    import ray

    fit, shown = 0, []
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        have = node.get("Resources") or {}
        node_cpus, node_gpus = float(have.get("CPU", 0.0)), float(have.get("GPU", 0.0))
        shown.append(f"{node_cpus:g} CPU" + (f", {node_gpus:g} GPU" if node_gpus else ""))
        pairs = ((node_cpus, cpus), (node_gpus, gpus))  # num_cpus is above 0: never empty
        fit += min(math.floor(amount / need + RESOURCE_STEP) for amount, need in pairs if need > 0)
    listed = "; ".join(shown[:4]) + (f"; {len(shown) - 4} more" if len(shown) > 4 else "")
    nodes = f"{len(shown)} node{'s' if len(shown) != 1 else ''} ({listed or 'none'})"
    where = "this machine" if placement.local else "the cluster"
    asks = f"each asks {describe(cpus, gpus)}; {where} has {nodes}"
    if fit == 0 and (placement.local or placement.wait_for_nodes <= 0):
        raise ValueError(
            f"no node of {where} can hold a replica of {label} ({asks}); lower its "
            "num_gpus/num_cpus or add such nodes, or give --wait-for-nodes SECONDS where an "
            "autoscaler adds them"
        )
    return fit, asks


def replicas_to_make(label: str, cpus: float, gpus: float, asked: int, placement: Placement) -> int:
    """How many of `asked` replicas of a model to make, with a warning when fewer can run now
    (`room_for`'s error when none can): on a local Ray those that fit; on a cluster all (nodes
    may join, others' work ends), those not placed waiting while the group runs on the others."""
    fit, asks = room_for(label, cpus, gpus, placement)
    if fit >= asked:
        return asked
    if fit == 0:  # on a cluster, with --wait-for-nodes (else `room_for` refused it)
        said = (
            f"no node of the cluster can hold a replica of {label} now ({asks}): waiting up to "
            f"{placement.wait_for_nodes:.0f} s for nodes to join (--wait-for-nodes)"
        )
    else:
        on, rest = ("", "") if placement.local else (" on the cluster's nodes", CLUSTER_REST)
        said = f"{fit} of {asked} replicas of {label} fit{on} ({asks}): running on {fit}{rest}"
    log.warning("%s", said)
    return fit if placement.local else asked
