"""The tuner's groups on the node: the configured ones created (or adopted when they exist),
their tasks moved in at start and, for groups that follow a cgroup, whenever new tasks
join it; and the node's groups read in a stable order.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence

from agent.errors import GroupExists, NodeError, ResourceExhausted
from agent.node import Node
from agent.types import GroupSpec
from models.controller import move_tasks
from tuner.config import ConfigError, GroupConfig

log = logging.getLogger("rdtune.tuner")


class GroupKeeper:
    """The configured groups (``groups``) and the tasks moved into each so far."""

    def __init__(self, groups: Sequence[GroupConfig]) -> None:
        self.groups = list(groups)
        self.moved: dict[str, set[int]] = {}  # pids moved into each configured group
        self.warned_empty: set[str] = set()  # groups whose empty cgroup was logged

    def ensure(self, node: Node, strict: bool = True) -> list[str]:
        """Create (or adopt) the configured groups and move their tasks in; the groups it
        created. ``strict`` (at start): an unreadable cgroup is a configuration error,
        found before the node is changed, and a refused start removes the groups it
        created; after an outage the error is logged and the group's tasks stay where
        they are."""
        have = node.groups()
        threads = _real_tasks(node)
        members = {g.spec.name: self._members(g, threads, strict) for g in self.groups}
        created: list[str] = []
        try:
            for g in self.groups:
                try:
                    if self._create(node, g.spec, have):
                        created.append(g.spec.name)
                except (ConfigError, ResourceExhausted) as exc:  # not ours; no CLOSID left
                    if strict:
                        raise
                    log.error("%s", exc, extra={"event": "not_made", "group": g.spec.name})
                    continue
                self.move(node, g.spec.name, members[g.spec.name])
                if g.cpus:
                    node.assign(g.spec.name, cpus=g.cpus)
        except Exception:
            if strict:  # a refused start leaves the node as it found it
                _undo(node, created)
            raise
        return created

    @staticmethod
    def undo(node: Node, created: Sequence[str]) -> None:
        """Remove the groups a refused start created (as :meth:`ensure` returned them)."""
        _undo(node, created)

    def _members(self, g: GroupConfig, threads: bool, strict: bool) -> tuple[int, ...]:
        try:
            return self._read(g, threads)
        except ConfigError as exc:
            if strict:
                raise
            log.warning("%s", exc, extra={"event": "assign_failed", "group": g.spec.name})
            return ()

    def _read(self, g: GroupConfig, threads: bool) -> tuple[int, ...]:
        """``g``'s pids (:meth:`GroupConfig.all_pids`). A followed cgroup without tasks is
        logged once: most likely the wrong cgroup, and the group would stay empty while
        its workload keeps the whole cache."""
        members = g.cgroup_pids()
        if g.cgroup and not members and g.spec.name not in self.warned_empty:
            self.warned_empty.add(g.spec.name)
            log.warning(
                "group %r: cgroup %s and the cgroups below it have no tasks (yet); "
                "check that its cgroup: names the cgroup its workload runs in",
                g.spec.name,
                g.cgroup,
                extra={"event": "cgroup_empty", "group": g.spec.name},
            )
        return g.with_members(members, threads)

    @staticmethod
    def _create(node: Node, spec: GroupSpec, have: Mapping[str, GroupSpec]) -> bool:
        """Create ``spec`` unless the node has it (adopted as it is); whether it was created."""
        if spec.name in have:
            if have[spec.name] != spec:
                log.warning(
                    "group %r exists as %s; adopting it as it is (configured: %s)",
                    spec.name,
                    have[spec.name],
                    spec,
                    extra={"event": "adopt_mismatch", "group": spec.name},
                )
            return False
        try:
            node.create_group(spec)
        except GroupExists as exc:
            if spec.name in node.groups():  # created meanwhile (another tuner starting): adopt
                return False
            # Exists, yet not among the agent's groups: a directory it did not create, or
            # one whose record it lost (its state file). Tuning without it would leave the
            # service unprotected while reporting success.
            raise ConfigError(
                f"group {spec.name!r}: the node has a group of that name the agent does not "
                f"manage ({exc}; not created by this agent, or its state file was lost); "
                "remove that resctrl group or configure another name"
            ) from exc
        log.info("created group %r", spec.name, extra={"event": "create", "group": spec.name})
        return True

    def move(self, node: Node, group: str, pids) -> None:
        """Move ``pids`` into ``group`` (:func:`~models.controller.move_tasks`: one call;
        one at a time only when one has exited since it was listed); those that had exited
        are named in one warning and, like the rest, not moved again."""
        pids = tuple(pids)
        exited = move_tasks(node, group, pids)
        if exited:
            log.warning(
                "group %r: no tasks %s (exited before they could be moved)",
                group,
                sorted(exited),
                extra={"event": "assign_failed", "group": group, "pids": sorted(exited)},
            )
        self.moved[group] = set(pids)

    def follow_cgroups(self, node: Node, groups: Mapping[str, GroupSpec]) -> None:
        """Tasks that joined a configured cgroup since the last look (a restarted service,
        a new worker) are moved into its group; children of moved tasks follow by
        themselves (resctrl groups are inherited on fork)."""
        threads = None
        for g in self.groups:
            if not g.cgroup or g.spec.name not in groups:
                continue
            if threads is None:
                threads = _real_tasks(node)
            try:
                pids = set(self._read(g, threads))
            except ConfigError as exc:
                log.warning("%s", exc, extra={"event": "assign_failed", "group": g.spec.name})
                continue
            new = pids - self.moved.get(g.spec.name, set())
            if new:
                self.move(node, g.spec.name, sorted(new))
                log.info(
                    "moved %d new task(s) of %s into %r",
                    len(new),
                    g.cgroup,
                    g.spec.name,
                    extra={"event": "tasks", "group": g.spec.name, "pids": sorted(new)},
                )
            self.moved[g.spec.name] = pids

    def forget(self, names: Iterable[str]) -> None:
        """Forget the tasks moved into groups deleted (or made again) at the node: their
        tasks went to the default group with them, and the next follow moves them in again.
        Only on such news, not by comparing with the node's tasks every interval: that costs
        reads, and would undo the task moves of controllers that move tasks themselves."""
        for name in names:
            self.moved.pop(name, None)

    @staticmethod
    def read(node: Node, known: Mapping[str, GroupSpec]) -> dict[str, GroupSpec]:
        """The node's groups in a stable order: known groups keep their place (a restarted
        agent may list them differently, and order-sensitive controllers would re-plan),
        new ones follow in the node's order."""
        fresh = dict(node.groups())
        ordered = {g: fresh[g] for g in known if g in fresh}
        ordered.update(fresh)
        return ordered


def respecified(before: Mapping[str, GroupSpec], now: Mapping[str, GroupSpec]) -> set[str]:
    """Groups of ``before`` that ``now`` lacks, holds with another spec (kind, SLO,
    exclusive) or as another generation: deleted, or deleted and made again by another
    client between two looks. A generation of 0 (an agent that reports none) tells nothing:
    a group made again with the same spec then goes unnoticed."""
    return {name for name, spec in before.items() if _remade(spec, now.get(name))}


def _remade(before: GroupSpec, now: GroupSpec | None) -> bool:
    if now is None or now != before:
        return True
    known = before.generation != 0 and now.generation != 0
    return known and before.generation != now.generation


def _undo(node: Node, created: Sequence[str]) -> None:
    for name in created:
        try:
            node.delete_group(name)
        except NodeError as exc:  # the refusal that got us here is what to report
            log.warning("could not remove group %r created at start: %s", name, exc)
        else:
            log.info(
                "removed group %r: the start was refused",
                name,
                extra={"event": "delete", "group": name},
            )


def _real_tasks(node: Node) -> bool:
    """Whether the node's tasks are this host's (a resctrl node: move every thread of a
    configured process) rather than a simulated node's own pids."""
    return not node.capabilities().simulated
