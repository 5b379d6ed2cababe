"""How a ResctrlNode survives crashes: at start, before anything is served, the intent
journal's record of an apply, a creation or a deletion that a crash cut short is rolled
back or forward (docs/AGENT.md, "Crash consistency and ownership"), writing and removing
only directories that are still the ones the node recorded. A part of
:class:`~agent.resctrl.node.ResctrlNode`, through
:class:`~agent.resctrl.ownership.Ownership`."""

from __future__ import annotations

import logging
import os

from agent.resctrl import discovery, schemata, state

log = logging.getLogger(__name__)


class Recovery:
    """Crash recovery from the intent journal (a part of ResctrlNode)."""

    # The node's state (agent/resctrl/node.py sets it up).
    root: str
    runtime_classes: frozenset[str]
    _journal: state.Journal
    _digits: int
    recovered: str | None

    def _recover(self, saved: state.Saved) -> None:
        """Finish what a crash cut short, from the intent journal (exclusive lock held)."""
        intent = self._journal.read()
        if intent is None:
            return
        op, name = intent.get("op"), intent.get("name")
        try:
            if op == "apply":
                self.recovered = self._roll_back_apply(intent, saved)
            elif op == "create" and isinstance(name, str):
                self.recovered = self._roll_back_create(name, saved)
            elif op == "delete" and isinstance(name, str):
                self.recovered = self._roll_forward_delete(name, saved)
            else:
                log.warning("ignoring an intent record of unknown form: %r", intent)
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:  # any shape
            log.error("recovering from the intent record %r failed: %s", intent, exc)
            self.recovered = f"failed: {exc}"
        else:
            if self.recovered:
                log.warning("crash recovery: %s", self.recovered)
        self._journal.clear()

    def _roll_back_apply(self, intent: dict, saved: state.Saved) -> str:
        """Every write of an interrupted apply undone, last first (each group's old values;
        or, where it wrote a group twice, allocation.py's _write_steps, each write's values
        before it), so the node goes back through the states it came by."""
        steps = intent.get("steps") or [[g, intent["groups"][g]["old"]] for g in intent["order"]]
        restored: list[str] = []
        for group, before in reversed(steps):
            path = os.path.join(self.root, self._dirname(group), "schemata")
            if not self._still_own(group, saved):
                continue  # gone, or re-made by someone else since: not ours to write
            values = {res: {int(d): int(v) for d, v in per.items()} for res, per in before.items()}
            try:
                self._write(path, schemata.format_write(values, self._digits))
                if group not in restored:
                    restored.append(group)
            except OSError as exc:
                log.error("could not roll back group %r: %s (%s)", group, exc, self._status())
        return f"rolled back an interrupted apply of {', '.join(map(repr, restored)) or 'nothing'}"

    def _roll_back_create(self, name: str, saved: state.Saved) -> str:
        path = self._dir(name)
        if not os.path.isdir(path):
            return ""  # the crash came before mkdir
        if self._still_own(name, saved):
            return ""  # recorded before the crash: the creation is complete
        # Not recorded, or recorded with the marker of a directory that vanished: a
        # vanished group's re-creation, cut short before its new marker was recorded.
        if discovery.read_text(os.path.join(path, "tasks")).split():
            # Nobody was told the group exists, so nobody could have put tasks in it:
            # this directory is someone else's after all.
            return f"left {path} alone (it holds tasks)"
        os.rmdir(path)
        return f"removed group {name!r}, whose creation a crash cut short"

    def _roll_forward_delete(self, name: str, saved: state.Saved) -> str:
        path = self._dir(name)
        marker = saved.markers.get(name)
        done = ""
        ours = name in saved.groups and os.path.isdir(path)
        if ours and name not in self.runtime_classes and self._same(marker, state.marker_of(path)):
            os.rmdir(path)
            done = f"finished deleting group {name!r}"
        saved.groups.pop(name, None)
        saved.markers.pop(name, None)
        saved.dirs.pop(name, None)
        return done or f"forgot group {name!r}, deleted before a crash"

    def _still_own(self, name: str, saved: state.Saved) -> bool:
        """Whether recorded group ``name``'s directory is there and is the one recorded
        (a directory deleted and made again under its name is another tool's group)."""
        if name not in saved.groups:
            return False
        try:
            found = state.marker_of(self._dir(name))
        except FileNotFoundError:
            return False
        return self._same(saved.markers.get(name), found)
