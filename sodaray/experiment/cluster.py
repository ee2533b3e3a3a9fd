"""Joining a Ray cluster (or starting Ray locally) and checking what its actors ask for."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sodaray.errors import first_line
from sodaray.experiment.spec import ModelSpec

log = logging.getLogger(__name__)

ADDRESS_HINT = "start one (`ray start --head`, `ray up cluster.yaml`) or leave out --address"
TOKEN_HINT = (
    "the cluster uses token authentication: set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN (or "
    "RAY_AUTH_TOKEN_PATH) to the head's token, which `ray get-auth-token` prints on the head"
)


def check_address(address: str | None, timeout: float = 5.0) -> None:
    """A HOST:PORT or ray://HOST:PORT address must accept a connection within `timeout`
    seconds: Ray itself retries for half a minute, printing as it goes."""
    if not address or address in ("auto", "local"):
        return
    scheme, sep, rest = address.partition("://")
    if sep and scheme not in ("ray", "rays"):
        raise ValueError(f"--address {address}: use auto, HOST:PORT or ray://HOST:PORT")
    target = rest if sep else address
    host, _, port = target.rstrip("/").rpartition(":")
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout).close()
    except (OSError, ValueError) as exc:
        raise ValueError(
            f"cannot reach a Ray cluster at {address} ({exc}); {ADDRESS_HINT}"
        ) from exc


def init_ray(address: str | None) -> None:
    """Start Ray locally (no address) or join a cluster, with a one-line error when the cluster
    cannot be reached (Ray itself would wait minutes on a wrong HOST:PORT)."""
    import ray

    check_address(address)
    try:
        ray.init(
            address=address,
            include_dashboard=False,
            log_to_driver=False,
            # Ray's own start-up lines only when our caller logs at INFO (`-v`)
            logging_level=logging.INFO if log.isEnabledFor(logging.INFO) else logging.ERROR,
        )
    except (ConnectionError, ray.exceptions.AuthenticationError) as exc:
        raise ValueError(
            f"cannot connect to a Ray cluster at {address}: {first_line(exc)}; {connect_hint(exc)}"
        ) from exc


def connect_hint(exc: BaseException) -> str:
    """What to do about a refused connection: a cluster with Ray's token authentication refuses
    a client without its token, and "start one" would send the user the wrong way."""
    import ray

    text = str(exc).lower()
    if isinstance(exc, ray.exceptions.AuthenticationError) or "token" in text or "auth" in text:
        return TOKEN_HINT
    return ADDRESS_HINT


@contextmanager
def ray_session(requests: list[tuple[str, float, float]], address: str | None) -> Iterator[bool]:
    """Ray ready for actors making `requests` (label, num_cpus, num_gpus) for the block: started
    here unless it already runs, and then shut down after it (yields whether it was started
    here). Requests are checked before a local Ray starts (it would wait forever for what the
    machine lacks) and against a cluster after."""
    import ray

    own = not ray.is_initialized()
    if own and address is None:
        check_resources(requests, None)
    if own:
        init_ray(address)
    if address is not None or not own:  # a cluster: the autoscaler may add nodes
        check_resources(requests, address or "the running Ray")
    try:
        yield own
    finally:
        if own:
            ray.shutdown()


def actor_class(cls: type, model: ModelSpec, concurrency: int = 1) -> Any:
    """`cls` as a Ray actor class that asks for a model entry's resources, runs up to
    `concurrency` calls at once (threads), and is restarted whenever it dies. Ray never re-runs
    a call itself: the caller decides what a failed call means (`experiment.group`)."""
    import ray

    return ray.remote(cls).options(
        num_cpus=model.num_cpus,
        num_gpus=model.num_gpus,
        max_restarts=-1,
        max_task_retries=0,
        max_concurrency=concurrency,
    )


def check_resources(requests: list[tuple[str, float, float]], address: str | None) -> None:
    """Each actor's request (label, num_cpus, num_gpus) against what the Ray cluster has. On the
    local machine a request that can never fit is an error (Ray would wait forever); on a
    cluster the autoscaler may still add nodes, so it is a warning saying so."""
    import ray

    if ray.is_initialized():
        total = ray.cluster_resources()
    else:  # the local machine, before Ray starts: what Ray would detect
        import torch

        total = {"CPU": float(os.cpu_count() or 1), "GPU": float(torch.cuda.device_count())}
    for label, cpus, gpus in requests:
        short = [
            f"{need:g} {name} per replica but the {'cluster' if address else 'machine'} has "
            f"{total.get(key, 0):g}"
            for name, key, need in (("GPU", "GPU", gpus), ("CPU", "CPU", cpus))
            if need > total.get(key, 0)
        ]
        if not short:
            continue
        if address is None:
            raise ValueError(
                f"{label} asks for {short[0]}; lower its num_gpus/num_cpus, or give --address "
                "for a cluster that has them"
            )
        log.warning(
            "%s asks for %s; waiting for the autoscaler to add such nodes (Ctrl-C to stop)",
            label,
            short[0],
        )
