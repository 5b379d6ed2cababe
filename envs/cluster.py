"""Starting Ray for rdtune's parallel work: evaluation jobs (eval/runner.py) and training
sweeps and rollouts (training/sweep.py) start or join a cluster the same way.

``local`` always starts a private instance (``address="local"``): with no address Ray joins
any cluster it finds (``RAY_ADDRESS``, ``/tmp/ray/ray_current_cluster``) and then refuses
``num_cpus`` — a stray cluster on a CI host once broke a run that way. Workers run with one
BLAS/OpenMP thread each (a process per core is the parallelism). Joining a remote cluster
ships rdtune's source packages with the job, since its nodes need not have them installed.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

import grpc

import agent
import envs
import models
from agent import interrupt

WORKER_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


class ClusterError(ValueError):
    """A Ray cluster that cannot be reached, or an address that is not one; the message names
    the address."""


REACH_TIMEOUT_S = 10.0
PROBE_TIMEOUT_S = 3.0

# One cheap method of the gRPC service behind each kind of address, called with a request
# of raw bytes (no Ray import needed): a cluster's GCS (HOST:PORT) answers GetClusterId (which
# ray.init asks for too) to an empty request; a Ray Client server (ray://HOST:PORT, port
# 10001 by default) is another service and answers a ClusterInfo PING (type = 6).
GCS_PROBE = ("/ray.rpc.NodeInfoGcsService/GetClusterId", b"", "a Ray cluster's GCS")
CLIENT_PROBE = ("/ray.rpc.RayletDriver/ClusterInfo", b"\x08\x06", "a Ray Client server")


# What _probe_ray finds at a Ray cluster that asks its clients for a token (Ray's token
# authentication, which ``ray start --head`` turns on in Ray 2.60): the probe sends none.
ASKS_FOR_TOKEN = "a Ray handler asking for an authentication token"


def _probe_ray(target: str, method: str, request: bytes) -> str | None:
    """Call ``method`` of the gRPC server at ``target`` (an answer only Ray gives): an open
    port that is something else (HTTP, a silent listener, another gRPC service) passes a TCP
    connect, then keeps ``ray.init`` waiting for a long time. None when a handler of
    ``method`` answers (:data:`ASKS_FOR_TOKEN` when it wants a token), else what was found;
    bounded by :data:`PROBE_TIMEOUT_S` in all."""
    deadline = time.monotonic() + PROBE_TIMEOUT_S
    # no HTTP proxy, as Ray's own gRPC clients by default (and as the TCP check connects)
    with grpc.insecure_channel(target, options=[("grpc.enable_http_proxy", 0)]) as channel:
        try:  # a port that does not speak HTTP/2 gRPC never gets ready
            grpc.channel_ready_future(channel).result(timeout=PROBE_TIMEOUT_S)
        except grpc.FutureTimeoutError:
            return f"no gRPC answer within {PROBE_TIMEOUT_S:g} s"
        call = channel.unary_unary(method)  # raw bytes both ways
        try:
            call(request, timeout=max(deadline - time.monotonic(), 0.5))
        except grpc.RpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.UNIMPLEMENTED:
                return f"a gRPC server without {method}"
            if code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE):
                return f"no answer to {method}: {code.name}"
            if code == grpc.StatusCode.UNAUTHENTICATED:
                return ASKS_FOR_TOKEN
            # any other status is a handler of that method answering: Ray's
    return None


def _check_reachable(address: str) -> None:
    """Connect to a ``host:port`` (or ``ray://host:port``) address first, then ask it what
    only Ray answers (:func:`_probe_ray`): ``ray.init`` on a closed port retries for minutes
    with only C++ warnings to show for it, and on an open port that is not Ray it waits a
    long time before an unclear error."""
    if address == "auto":
        return  # Ray finds the cluster itself (RAY_ADDRESS, the last one started here)
    target = address.removeprefix("ray://")
    scheme, slashes, _ = target.partition("://")
    if slashes:
        # else the scheme was taken for part of the host name ("Name or service not known")
        raise ClusterError(
            f"not a Ray address: {address!r}; {scheme}:// is not Ray's (http://HOST:8265 is "
            "its dashboard's); give HOST:PORT (what 'ray start --head' prints), "
            "ray://HOST:PORT (a Ray Client server), local or auto"
        )
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ClusterError(
            f"not a Ray address: {address!r}; give HOST:PORT (what 'ray start --head' prints), "
            "ray://HOST:PORT (a Ray Client server), local or auto"
        )
    if not 1 <= int(port) <= 65535:
        # the OS would take the port modulo 65536 and probe another one than named
        raise ClusterError(f"not a Ray address: {address!r}; port {port} is not in 1..65535")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=REACH_TIMEOUT_S).close()
    except OSError as exc:
        raise ClusterError(f"cannot reach the Ray cluster at {address}: {exc}") from None
    method, request, what = CLIENT_PROBE if target != address else GCS_PROBE
    found = _probe_ray(target, method, request)
    if found == ASKS_FOR_TOKEN:
        # ray.init would retry for half a minute of C++ warnings, then say it failed to
        # connect: the fix is this process's environment (the cluster's token is read from
        # RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token).
        if os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
            raise ClusterError(
                f"the Ray cluster at {address} asks for an authentication token: run with "
                "RAY_AUTH_MODE=token and the cluster's token in RAY_AUTH_TOKEN or "
                "~/.ray/auth_token ('ray get-auth-token' on its head prints it)"
            )
        return
    if found is not None:
        raise ClusterError(
            f"cannot join the Ray cluster at {address}: it answers, but not as {what} ({found})"
        )


def start_ray(
    address: str, *, num_cpus: int | None = None, packages: Iterable[ModuleType] = ()
) -> None:
    """Start (``local``: a private instance with ``num_cpus``, default every core) or join
    (an address) a Ray cluster; joining ships ``agent``, ``envs``, ``models`` and the
    caller's ``packages``."""
    if num_cpus is not None and (
        not isinstance(num_cpus, int) or isinstance(num_cpus, bool) or num_cpus < 1
    ):
        # 0 would pass for "not given" below (num_cpus or os.cpu_count()): every core
        raise ValueError(f"num_cpus must be a whole number >= 1 (or None), got {num_cpus!r}")
    import ray  # an optional dependency: only parallel runs need it

    if address == "local":
        ray.init(
            address="local",
            num_cpus=os.cpu_count() if num_cpus is None else num_cpus,
            include_dashboard=False,
            runtime_env={"env_vars": WORKER_ENV},
            log_to_driver=False,
            ignore_reinit_error=True,
        )
        interrupt.reinstall()  # ray.init's own SIGTERM handler would skip our cleanup
        return
    _check_reachable(address)
    shipped = (agent, envs, models, *packages)
    modules = sorted({str(Path(m.__file__).parent) for m in shipped})
    try:
        ray.init(
            address=address,
            include_dashboard=False,
            runtime_env={"env_vars": WORKER_ENV, "py_modules": modules},
            ignore_reinit_error=True,
        )
    except ConnectionError as exc:
        raise ClusterError(f"cannot reach the Ray cluster at {address!r}: {exc}") from None
    interrupt.reinstall()
