"""The one seam of rdtune: the ``Node`` and ``Clock`` protocols.

Everything above the agent (environments, controllers, the tuner, evaluation) is written
against :class:`Node`. Three implementations share one contract, checked by the same
contract tests (tests/agent/contract.py): ``ResctrlNode`` (real Linux resctrl + perf
counters), ``SimNode`` (a simulated server) and ``RemoteNode`` (either, across gRPC).

A simulated node is also a :class:`Clock`; a real node's clock is the wall clock. Code that
needs to step time asks ``as_clock(node)``, never for the backend type. Likewise an
in-process simulated node offers :class:`GroundTruth` — what no real node can tell (the
noise-free steady state of any allocation, the load schedule ahead, which workload runs
where); code that needs it asks ``ground_truth(node)`` and refuses a node that answers None.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from agent.types import (
    Allocation,
    AllocationPlan,
    GroupSpec,
    NodeCapabilities,
    Snapshot,
    StepOutcome,
)


@runtime_checkable
class Node(Protocol):
    """A machine whose LLC ways and memory bandwidth can be split among groups.

    Groups are the node's *own* groups: a real node never shows, changes or deletes groups
    it did not create (those of container runtimes or other agents).
    """

    def capabilities(self) -> NodeCapabilities:
        """What the node supports: ways, CLOSIDs, MBA, monitoring, working PMC events."""
        ...

    def groups(self) -> Mapping[str, GroupSpec]:
        """The node's own groups by name, each with its ``generation``: changed whenever a
        group is (re)created and at no other time (0: the node tells none)."""
        ...

    def create_group(self, spec: GroupSpec) -> None:
        """Create a group holding every way not held exclusively, and MB at maximum.

        Raises GroupExists, InvalidName, or ResourceExhausted when no CLOSID/RMID is left.
        """
        ...

    def delete_group(self, name: str) -> None:
        """Delete an own group; its tasks and CPUs return to the default group.

        Raises GroupNotFound for a name the node does not own.
        """
        ...

    def assign(self, group: str, *, pids: Iterable[int] = (), cpus: Iterable[int] = ()) -> None:
        """Move tasks (by pid) and CPUs into ``group`` (kernel move semantics: a task or
        CPU leaves every other group). Raises UnknownTask, InvalidCpus, GroupNotFound.

        A pid is one task as the kernel's ``tasks`` file counts them, a thread: a process's
        pid moves its main thread only, and the threads it starts afterwards follow the
        thread that starts them. Move a multi-threaded service's threads
        (``/proc/PID/task``) one by one, or start it in its group.
        """
        ...

    def tasks(self, group: str) -> frozenset[int]:
        """The pids (thread ids, as the kernel's ``tasks`` file lists them) in ``group``."""
        ...

    def apply(self, plan: AllocationPlan, *, dry_run: bool = False) -> Allocation:
        """Apply ``plan`` all-or-nothing and return what the node really holds afterwards.

        Every value is validated first; if the node refuses any write, what was already
        changed is restored before the error is raised. With ``dry_run`` only validates,
        and returns the allocation the plan would produce (normalised, not read back).
        """
        ...

    def allocation(self) -> Allocation:
        """What the node's own groups hold now (read back)."""
        ...

    def reserved_ways(self) -> Mapping[int, int]:
        """Per L3 domain, the ways held exclusively by groups the node does not own: another
        tool's exclusive groups, pseudo-locked regions, the default group when exclusive.
        The node refuses any own group's mask that overlaps them; a domain without any is
        left out (empty: every way is the node's to give)."""
        ...

    def observe(self) -> Snapshot:
        """Counters and SLO metrics of every own group since the previous ``observe``."""
        ...

    def step(self, plan: AllocationPlan | None = None, *, interval_s: float = 0.0) -> StepOutcome:
        """One control interval: ``apply(plan)`` (when given), let ``interval_s`` pass
        (simulated time on a simulated node, wall-clock time on a real one), ``observe()``.

        The same results and errors as those calls: a refused plan raises as ``apply``
        does, and then nothing was applied and nothing observed. A remote node carries the
        whole step in one message (:class:`StepByParts` is the local nodes' version).
        """
        ...

    def close(self) -> None:
        """Release resources (file descriptors, locks, connections). Groups stay."""
        ...


class StepByParts:
    """``Node.step`` made of the node's own ``apply``, clock and ``observe``: the step of a
    node whose calls cost no round trip (mixed into the local nodes)."""

    def step(self, plan: AllocationPlan | None = None, *, interval_s: float = 0.0) -> StepOutcome:
        return step_by_parts(self, plan, interval_s)


def step_by_parts(node: Node, plan: AllocationPlan | None, interval_s: float) -> StepOutcome:
    """apply, let the interval pass, observe: :meth:`Node.step` from the node's other calls."""
    if not (interval_s >= 0 and math.isfinite(interval_s)):
        raise ValueError(f"a step's interval must be a finite number >= 0, got {interval_s}")
    held = node.apply(plan) if plan is not None else None
    waited = 0.0
    if interval_s > 0:
        started = time.perf_counter()
        clock = as_clock(node)
        if clock is not None:
            clock.advance(interval_s)
        else:
            time.sleep(interval_s)
        waited = time.perf_counter() - started
    return StepOutcome(held, node.observe(), waited)


@runtime_checkable
class Clock(Protocol):
    """Simulated time: implemented by nodes whose time the caller drives."""

    def now(self) -> float:
        """Seconds since the last reset."""
        ...

    def reset(self, scenario: object | None = None, seed: int | None = None) -> None:
        """Start over on ``scenario`` (a name or a scenario object; None keeps the current
        one) with ``seed``; groups, tasks and allocations return to the scenario's start."""
        ...

    def advance(self, dt: float) -> None:
        """Let ``dt`` seconds of simulated time pass."""
        ...


def never_blocks(node: Node) -> bool:
    """Whether every call of ``node`` is computation only: no I/O, no waiting on another
    thread or process. A node says so with a class attribute ``NEVER_BLOCKS = True`` (the
    simulator); the agent then serves its calls on its event loop, and every other node's
    in worker threads (a kernel write must not stall the agent's other RPCs)."""
    return getattr(node, "NEVER_BLOCKS", False) is True


def scenario_name(clock: Clock) -> str | None:
    """The name of the scenario a simulated node runs, when it says: a remote agent's
    (``scenario_name()``) or an in-process simulator's (its ``scenario``)."""
    named = getattr(clock, "scenario_name", None)
    if callable(named):
        return named()
    name = getattr(getattr(clock, "scenario", None), "name", None)
    return name if isinstance(name, str) and name else None


def as_clock(node: Node) -> Clock | None:
    """The node's clock when its time is simulated, else None (wall-clock node)."""
    if node.capabilities().simulated and isinstance(node, Clock):
        return node
    return None


@runtime_checkable
class GroundTruth(Protocol):
    """What a simulated node knows and a real one cannot: a capability, not a backend type.

    Offered by an in-process simulated node (``agent.sim.SimNode``); a ``RemoteNode`` never
    offers it, even to a simulated agent (the oracle's searches run thousands of steady
    states). A node that offers it also deep-copies: the copy continues exactly as the node
    would, which is how calibration sweeps run without disturbing the node (:func:`twin`).
    Controllers that need it say so in the catalogue (models/catalogue.py).
    """

    @property
    def scenario(self) -> Any:
        """The scenario running (machine preset name, workloads, catalog)."""
        ...

    def workloads(self) -> Sequence[Any]:
        """Every workload instance: name, kind, group, pids, spec, LC capacity, active."""
        ...

    def load_rps(self, name: str, at_s: float | None = None) -> float:
        """An LC instance's offered load now, or at a future time of its load schedule."""
        ...

    def reseed(self, seed: int | Sequence[int]) -> None:
        """Draw the node's randomness (measurement noise, LC requests) from streams of
        ``seed`` from now on; what it holds and its load schedules stay."""
        ...

    def steady_state(
        self,
        plan_or_allocation: Any = None,
        load_overrides: Mapping[str, float] | None = None,
        *,
        latency_requests: int = 100_000,
    ) -> Mapping[str, Any]:
        """The noise-free steady state of an allocation per group (IPS, slowdown, latency
        percentiles), without disturbing the node."""
        ...


def ground_truth(node: Node) -> GroundTruth | None:
    """The node's ground truth when it offers it (an in-process simulated node), else None."""
    if isinstance(node, GroundTruth) and node.capabilities().simulated:
        return node
    return None


def twin(node: GroundTruth, seed: int | Sequence[int] | None = None) -> Any:
    """An independent copy of a node that offers ground truth: the same state and the same
    future, or with ``seed`` the same state and its randomness drawn from ``seed`` from now
    on (:meth:`GroundTruth.reseed`); the caller closes it."""
    clone = copy.deepcopy(node)
    if seed is not None:
        clone.reseed(seed)
    return clone
