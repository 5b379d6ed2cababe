"""The agent's health follows its node: a node that can tell it is unusable (resctrl
unmounted under the agent, see ``ResctrlNode.unusable``) turns the server and its node
API NOT_SERVING until it is usable again, so a probe sees what every call says
(docs/AGENT.md, "Running")."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from grpc_health.v1 import health, health_pb2

log = logging.getLogger(__name__)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


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
