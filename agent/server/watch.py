"""The agent's health follows its node: a node that can tell it is unusable (resctrl
unmounted under the agent, see ``ResctrlNode.unusable``) turns the server and its node
API NOT_SERVING until it is usable again, so a probe sees what every call says
(docs/AGENT.md, "Running"). The health-only port (``health_listen``) serves Check alone,
with small limits of its own (:func:`health_only_server`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

log = logging.getLogger(__name__)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

# The health-only port is plain TCP without a token, open to the pod network: a probe
# needs one Check at a time, so anything beyond a few calls and streams is refused, and a
# connection is closed after a while, rather than holding the root agent's memory.
HEALTH_MAX_RPCS = 16
HEALTH_OPTIONS = [
    ("grpc.so_reuseport", 0),
    ("grpc.max_concurrent_streams", 4),  # per connection
    ("grpc.max_connection_age_ms", 60_000),
    ("grpc.max_connection_age_grace_ms", 5_000),
    ("grpc.max_connection_idle_ms", 30_000),
    ("grpc.max_receive_message_length", 4096),  # a HealthCheckRequest is a service name
]


class CheckOnly(health_pb2_grpc.HealthServicer):
    """``servicer``'s Check, and no Watch: a stream held open per peer is what a port
    without a token must not give (kubelet's probes call Check only)."""

    def __init__(self, servicer: health.aio.HealthServicer) -> None:
        self._servicer = servicer

    async def Check(self, request, context):  # grpc's method names
        return await self._servicer.Check(request, context)

    async def Watch(self, request, context):
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this port serves Health/Check only")


def health_only_server(servicer: health.aio.HealthServicer) -> grpc.aio.Server:
    """A grpc.aio server (built on the running loop) serving ``servicer``'s Check alone."""
    server = grpc.aio.server(options=HEALTH_OPTIONS, maximum_concurrent_rpcs=HEALTH_MAX_RPCS)
    health_pb2_grpc.add_HealthServicer_to_server(CheckOnly(servicer), server)
    return server


async def watch_node(
    unusable: Callable[[], str | None],
    servicer: health.aio.HealthServicer,
    names: Sequence[str],
    period_s: float,
) -> None:
    """Every ``period_s``, ask ``unusable()`` (run in a worker thread: it reads the node's
    filesystem) and set ``names`` NOT_SERVING while it gives a reason, SERVING after;
    each change logged once. Runs until cancelled (the server's stop)."""
    loop = asyncio.get_running_loop()
    said: str | None = None
    while True:
        await asyncio.sleep(period_s)
        try:
            problem = await loop.run_in_executor(None, unusable)
        except Exception as exc:  # a check that fails says the node is unusable
            problem = f"the node's check failed: {exc}"
        if problem == said:
            continue
        if problem is None:
            log.warning("the node is usable again: health SERVING")
        else:
            log.warning("the node is unusable: %s; health NOT_SERVING", problem)
        for name in names:
            await servicer.set(name, SERVING if problem is None else NOT_SERVING)
        said = problem
