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
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

import agent
import envs
import models

WORKER_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


class ClusterError(ValueError):
    """A Ray cluster that cannot be reached; the message names its address."""


REACH_TIMEOUT_S = 10.0


def _check_reachable(address: str) -> None:
    """Connect to a ``host:port`` (or ``ray://host:port``) address first: ``ray.init`` on a
    closed port retries for minutes with only C++ warnings to show for it."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return  # "auto" and the like: Ray finds the cluster itself
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=REACH_TIMEOUT_S).close()
    except OSError as exc:
        raise ClusterError(f"cannot reach the Ray cluster at {address}: {exc}") from None


def start_ray(
    address: str, *, num_cpus: int | None = None, packages: Iterable[ModuleType] = ()
) -> None:
    """Start (``local``: a private instance with ``num_cpus``, default every core) or join
    (an address) a Ray cluster; joining ships ``agent``, ``envs``, ``models`` and the
    caller's ``packages``."""
    import ray  # an optional dependency: only parallel runs need it

    if address == "local":
        ray.init(
            address="local",
            num_cpus=num_cpus or os.cpu_count(),
            include_dashboard=False,
            runtime_env={"env_vars": WORKER_ENV},
            log_to_driver=False,
            ignore_reinit_error=True,
        )
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
