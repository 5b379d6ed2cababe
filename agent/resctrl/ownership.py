"""What a ResctrlNode owns: adopting the groups recorded in its state file at start (a
directory with its prefix that it did not record is someone else's), after recovering
from a crash (agent/resctrl/recovery.py), cleaning its stale monitoring groups, and
noticing own groups deleted by someone else (docs/RESCTRL.md, "Locking and ownership").
A part of :class:`~agent.resctrl.node.ResctrlNode`."""

from __future__ import annotations

import logging
import os
from dataclasses import replace

from agent.errors import GroupExists, GroupNotFound, NotMounted, StateUnwritable, Unsupported
from agent.resctrl import discovery, state
from agent.resctrl.lock import ResctrlLock
from agent.resctrl.recovery import Recovery
from agent.types import (
    GroupSpec,
    NodeCapabilities,
    validate_group_name,
)

log = logging.getLogger(__name__)


class Ownership(Recovery):
    """Adoption and vanished groups (a part of ResctrlNode)."""

    # The node's state (agent/resctrl/node.py sets it up).
    root: str
    prefix: str
    runtime_classes: frozenset[str]
    _lock: ResctrlLock
    _caps: NodeCapabilities
    _specs: dict[str, GroupSpec]
    state_path: str
    check_markers: bool
    _markers: dict[str, int | None]
    _mon_groups: dict[str, int]
    _vanished: dict[str, GroupSpec]
    _journal: state.Journal
    _mb_max: int | None

    def _adopt_runtime_class(self, spec: GroupSpec, path: str) -> None:
        """Take on a class the container runtime made: record it, change nothing on disk."""
        with self._lock.exclusive():
            if spec.name in self._specs:
                raise GroupExists(spec.name)
            if not os.path.isfile(os.path.join(path, "schemata")):
                raise Unsupported(
                    f"runtime class {spec.name!r} does not exist as {path}: the container "
                    "runtime creates it from its RDT configuration (docs/DEPLOY.md)"
                )
            if spec.exclusive:
                raise Unsupported(
                    f"runtime class {spec.name!r}: exclusive mode is the runtime's to set"
                )
            try:
                self._record(spec, path)
            except OSError as exc:
                raise OSError(
                    exc.errno,
                    f"cannot record group {spec.name!r} in {self.state_path}: {exc.strerror}",
                ) from exc

    def _record(self, spec: GroupSpec, path: str) -> None:
        """Record ``spec`` as an own group at ``path`` in the state file; if the file cannot
        be written, forget it again (a group without a record would lose its kind at the
        next start) and raise the OSError."""
        self._specs[spec.name] = spec
        self._markers[spec.name] = state.marker_of(path)
        vanished = self._vanished.pop(spec.name, None)
        try:
            self._save()
        except OSError:
            del self._specs[spec.name]
            del self._markers[spec.name]
            if vanished is not None:
                self._vanished[spec.name] = vanished
            raise

    def _own_dirs(self) -> list[str]:
        out = []
        for entry in os.listdir(self.root):
            if entry.startswith(self.prefix) and entry != self.prefix:
                name = entry[len(self.prefix) :]
                try:
                    validate_group_name(name)
                except ValueError:
                    log.warning("ignoring %s: not a valid group name", entry)
                    continue
                out.append(name)
        return out

    def _adopt(self) -> None:
        saved = state.load(self.state_path)
        self._know_mb_max(saved.mb_max)
        with self._lock.exclusive():
            self._recover(saved)
            self._mon_groups = dict(saved.mon_groups)
            on_disk = set(self._own_dirs())
            # runtime classes this node adopted before, still there (the runtime's own)
            on_disk |= {
                n for n in self.runtime_classes if n in saved.groups and os.path.isdir(self._dir(n))
            }
            for name in sorted(on_disk):
                spec = saved.groups.get(name)
                if spec is None:
                    log.warning(
                        "%s%s was not created by this agent (not in %s): left alone",
                        self.prefix,
                        name,
                        self.state_path,
                    )
                    self.not_ours.append(name)
                    continue
                try:
                    marker = state.marker_of(self._dir(name))
                except OSError:
                    on_disk.discard(name)
                    continue
                if not self._same(saved.markers.get(name), marker):
                    log.warning(
                        "own group %r was deleted and re-created by someone else: left alone",
                        name,
                    )
                    self.not_ours.append(name)
                    on_disk.discard(name)
                    continue
                try:
                    mode = discovery.read_text(self._path(name, "mode")).strip()
                except OSError:
                    mode = "shareable"
                self._specs[name] = replace(spec, exclusive=mode == "exclusive")
                self._markers[name] = marker
            for name, spec in saved.groups.items():
                if name not in on_disk:
                    log.warning("own group %r is gone (deleted by someone else?)", name)
                    self._vanished[name] = spec
                    # kept, as _set_vanished keeps it: a directory made under the name
                    # later (by another tool, or a re-creation cut short) is told apart
                    self._markers[name] = saved.markers.get(name)
            self._clean_own_mon_groups()
        self._save(unless=saved)  # a full disk must not keep a restart from serving

    def _same(self, recorded: int | None, found: int) -> bool:
        """Whether a directory found with marker ``found`` is the one recorded."""
        return state.is_recorded(recorded, found, self.check_markers)

    def _clean_own_mon_groups(self) -> None:
        """rmdir the monitoring groups this node recorded as its own (left by a crashed
        run, they hold RMIDs); any other monitoring group is left alone."""
        for rel, marker in sorted(self._mon_groups.items()):
            path = os.path.join(self.root, rel)
            try:
                if self._same(marker, state.marker_of(path)):
                    os.rmdir(path)
                    self.cleaned_mon_groups.append(rel)
                    log.info("removed own stale monitoring group %s", path)
                else:
                    log.warning("monitoring group %s is no longer ours: left alone", path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning("could not remove own monitoring group %s: %s", path, exc)
                continue
            del self._mon_groups[rel]

    def _intend(self, record: dict, what: str) -> None:
        """Journal ``record`` durably before touching resctrl, or refuse to go on."""
        self._instance.confirm()  # InUse: another agent has taken the state file over
        try:
            self._journal.write(record)
        except OSError as exc:
            create = record["op"] == "create"
            done = "the group was not created" if create else "nothing was changed"
            raise StateUnwritable(
                exc.errno,
                f"cannot {what}: recording the intent in {self._journal.path} failed "
                f"({exc.strerror}); {done}",
            ) from exc

    def _save(self, unless: state.Saved | None = None) -> None:
        """Record the groups; with ``unless`` (what the file holds), only if they changed,
        and a failure is logged and left to the next change's save."""
        groups = {**self._vanished, **self._specs}
        dirs = {name: self._dirname(name) for name in groups}
        now = state.Saved.of(groups, self._markers, self._mon_groups, dirs, self._mb_max)
        self._instance.confirm()  # InUse: another agent has taken the state file over
        if unless is None:
            state.save(self.state_path, now, self.root, self.prefix)
        elif now != unless:
            try:
                state.save(self.state_path, now, self.root, self.prefix)
            except StateUnwritable as exc:
                log.warning("%s; serving, recorded at the next change", exc)

    def _check_vanished(self, markers: bool = True) -> None:
        """Own groups whose directory is gone, or (with ``markers``: a stat per group)
        is another one of the same name, become vanished."""
        present = set(os.listdir(self.root))
        require_mounted(self.root, present)
        gone = [n for n in self._specs if self._dirname(n) not in present]
        for name in gone:
            log.warning("own group %r vanished (deleted by someone else)", name)
            self._set_vanished(name)
        if (self._find_remade(list(self._specs)) if markers else []) or gone:
            self._save()

    def _require_unchanged(self, names: list[str]) -> None:
        """Raise GroupNotFound, before anything is written, if one of ``names`` (own
        groups) is no longer the directory this node made (it is vanished then)."""
        remade = self._find_remade(names)
        if remade:
            self._save()
            raise GroupNotFound(
                remade[0],
                "it vanished: deleted and re-created by someone else, whose directory it is "
                "now (left alone; see vanished())",
            )

    def _find_remade(self, names: list[str]) -> list[str]:
        """Of ``names`` (own groups), those whose directory was deleted and re-created by
        someone else since this node made or adopted it, made vanished so that nothing is
        written to or removed from the other owner's directory. A stat per name; none
        where markers are not checked (they would tell nothing there)."""
        if not self.check_markers:
            return []
        remade = []
        for name in names:
            try:
                found = state.marker_of(os.path.join(self.root, self._dirname(name)))
            except OSError:
                continue  # gone: the listing or the failed write says so
            if not self._same(self._markers.get(name), found):
                log.warning(
                    "own group %r was deleted and re-created by someone else: left alone", name
                )
                self._set_vanished(name)
                remade.append(name)
        return remade

    def _set_vanished(self, name: str) -> None:
        # The marker stays recorded: it keeps a restarted node from adopting the new
        # directory of the same name.
        self._vanished[name] = self._specs.pop(name)
        self._tracker.forget(name)
        self._untrack(name)

    def _listed(self) -> dict[str, GroupSpec]:
        """The own groups, each with its directory's marker as its generation: a directory
        made again has another (0, unknown: recorded before markers were)."""
        marker = self._markers.get
        return {n: replace(s, generation=marker(n) or 0) for n, s in self._specs.items()}

    def vanished(self) -> frozenset[str]:
        """Own groups deleted by someone else and not re-created or deleted since."""
        with self._lock.shared():
            self._check_vanished()
        return frozenset(self._vanished)

    def recreate_vanished(self) -> list[str]:
        """Re-create every vanished group with its spec (fresh masks: all non-exclusive
        ways, MB at maximum); returns the names re-created."""
        done = []
        for name, spec in sorted(self._vanished.items()):
            self.create_group(spec)
            done.append(name)
        return done


def require_mounted(root: str, entries: set[str] | None = None) -> None:
    """NotMounted unless ``root`` (its ``entries``, when listed already) is still resctrl:
    unmounted, it is a plain directory, where a group's mkdir would succeed and every own
    group would look deleted."""
    if "info" not in (entries if entries is not None else os.listdir(root)):
        raise NotMounted(f"{root} is no longer a resctrl filesystem (unmounted?)")


def unusable_reason(root: str) -> str | None:
    """Why nothing can be done at ``root`` now (resctrl unmounted, the root gone), or None."""
    try:
        require_mounted(root)
    except NotMounted as exc:
        return str(exc)
    except OSError as exc:
        return f"{root}: {exc.strerror or exc}"
    return None
