"""ResctrlNode: the real Linux backend of ``Node`` (ARCHITECTURE.md, "One seam"), over the
resctrl filesystem, perf_event_open counters and an LC latency feed.

Follows shared/design/RESCTRL.md: owns only the groups it created -- recorded in a state
file by name, kind, SLO and a marker of the directory (agent/resctrl/state.py) and adopted
again after a restart; a directory with its prefix that it did not record is someone
else's and is never changed or removed. It notices own groups deleted by someone else,
validates every plan with agent.validate before the first write, writes one schemata per
group (shrinking groups first), restores what it changed when the kernel refuses a write,
and returns what the kernel really holds, parsed by value. Reads take a shared flock on
the root, read-modify-write sequences an exclusive one.

Crash consistency: a multi-group apply, a group's creation and its deletion are written to
an intent journal before resctrl is touched; a journal found at start is rolled back
(apply: every group gets its old values; create: the half-made directory goes) or
forward (delete) before the node is used, so ``kill -9`` at any instant leaves one whole
plan and no group without its kind and SLO.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any, Protocol

from agent.errors import (
    GroupExists,
    GroupNotFound,
    InvalidCpus,
    InvalidName,
    KernelError,
    NodeError,
    ResourceExhausted,
    UnknownTask,
    Unsupported,
)
from agent.resctrl import discovery, monitor, schemata, state
from agent.resctrl.lock import ResctrlLock
from agent.types import (
    Allocation,
    AllocationPlan,
    GroupAllocation,
    GroupKind,
    GroupSample,
    GroupSpec,
    LatencyStats,
    NodeCapabilities,
    Snapshot,
    validate_group_name,
)
from agent.validate import PlanContext, validate_plan

log = logging.getLogger(__name__)

HARDWARE_EVENTS = ("instructions", "cycles", "llc_references", "llc_misses")


def default_state_dir() -> str:
    """$RDTUNE_STATE_DIR, else /var/lib/rdtune for root, else ~/.local/state/rdtune."""
    env = os.environ.get("RDTUNE_STATE_DIR")
    if env:
        return env
    if os.geteuid() == 0:
        return "/var/lib/rdtune"
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return os.path.join(base, "rdtune")


class PmcSource(Protocol):
    """What ResctrlNode needs of a PMC reader (agent.pmc.PmcReader fits)."""

    supported: frozenset[str]
    unsupported: Mapping[str, str]

    def track(self, name: str, *, pids: Iterable[int]) -> None: ...
    def untrack(self, name: str) -> None: ...
    def read_deltas(self) -> Mapping[str, Mapping[str, float | None]]: ...
    def close(self) -> None: ...


class LatencySource(Protocol):
    """Where LC latency comes from (agent.latency.LatencyRecorder fits)."""

    def drain(self, group: str) -> LatencyStats | None: ...


def _default_pmc() -> PmcSource | None:
    try:
        from agent.pmc import PmcReader
    except ImportError:
        return None
    try:
        return PmcReader(HARDWARE_EVENTS)
    except Exception as exc:  # a broken PMU must not stop the resctrl backend
        log.warning("PMC reader unavailable: %s", exc)
        return None


class ResctrlNode:
    """A Node over the resctrl filesystem at ``root``.

    Args:
        root: the resctrl mount (or the emulator's mountpoint).
        prefix: directory-name prefix of the groups this node owns.
        state_dir: where the kind/SLO state file lives (default: :func:`default_state_dir`).
        pmc: a PMC reader, None for none, or "auto" to use agent.pmc when it works.
        latency: an object with ``drain(group) -> LatencyStats | None`` for LC groups.
        mounts: the mount table used to read resctrl mount options.
        lock_timeout_s: how long to wait for the flock on the root.
        cache_size_path / cpuinfo: sysfs/procfs files for cache size and vendor.
        proc: procfs, used to check pids exist before moving them.
        runtime_classes: groups the container runtime creates and fills (containerd's and
            CRI-O's RDT classes, by pod annotation): directories of these names at the root,
            without the prefix, which ``create_group`` adopts (it never makes or removes
            them) so that the tuner can set their allocations; ``delete_group`` forgets one.
        check_markers: refuse to adopt (or remove) a recorded directory whose marker
            changed. Default: on a real resctrl mount, whose inode numbers are kernfs ids;
            off elsewhere (the FUSE emulator's inode numbers are libfuse node ids, which
            change when the kernel forgets an inode), where markers are only recorded.
    """

    def __init__(
        self,
        root: str = "/sys/fs/resctrl",
        prefix: str = "rdtune-",
        state_dir: str | None = None,
        pmc: PmcSource | str | None = "auto",
        latency: LatencySource | None = None,
        mounts: str = "/proc/mounts",
        lock_timeout_s: float = 5.0,
        cache_size_path: str = discovery.CACHE_SIZE,
        cpuinfo: str = discovery.CPUINFO,
        proc: str = "/proc",
        check_markers: bool | None = None,
        runtime_classes: Iterable[str] = (),
    ) -> None:
        validate_group_name(prefix, error=InvalidName)
        self.root = os.path.abspath(root)
        self.prefix = prefix
        self.runtime_classes = frozenset(runtime_classes)
        for name in self.runtime_classes:
            validate_group_name(name, error=InvalidName)
            if name.startswith(prefix):
                raise InvalidName(
                    f"runtime class {name!r} starts with the agent's prefix {prefix!r}: "
                    "it would read as a group of the agent's own"
                )
        self.proc = proc
        self.latency = latency
        safe_prefix = prefix.strip("-_.") or "rdtune"
        # One file per (prefix, root): two nodes sharing a state dir never mix their groups.
        suffix = "" if self.root == "/sys/fs/resctrl" else "-" + _short_hash(self.root)
        self.state_path = os.path.join(
            state_dir or default_state_dir(), f"{safe_prefix}-resctrl-groups{suffix}.json"
        )
        self._lock = ResctrlLock(self.root, lock_timeout_s)
        if check_markers is None:
            check_markers = discovery.mount_info(self.root, mounts).is_resctrl
        self.check_markers = check_markers
        self._own_pmc = pmc == "auto"
        self.pmc: PmcSource | None = _default_pmc() if pmc == "auto" else pmc  # type: ignore[assignment]
        if self.pmc is not None:
            pmc_events = frozenset(self.pmc.supported) & frozenset(HARDWARE_EVENTS)
            pmc_unsupported = {
                e: self.pmc.unsupported.get(e, "not supported")
                for e in HARDWARE_EVENTS
                if e not in pmc_events
            }
        else:
            pmc_events = frozenset()
            pmc_unsupported = {e: "no PMC reader configured" for e in HARDWARE_EVENTS}
        with self._lock.shared():
            self._caps = discovery.discover(
                self.root,
                mounts=mounts,
                cache_size_path=cache_size_path,
                cpuinfo=cpuinfo,
                pmc_events=pmc_events,
                pmc_unsupported=pmc_unsupported,
            )
        self._cdp = bool(self._caps.l3 and self._caps.l3.cdp)
        self._digits = (self._caps.l3.cbm_mask.bit_length() + 3) // 4 if self._caps.l3 else 0
        self._specs: dict[str, GroupSpec] = {}
        self._markers: dict[str, int | None] = {}  # own group -> its directory's marker
        self._mon_groups: dict[str, int] = {}  # own monitoring group (path) -> marker
        self._vanished: dict[str, GroupSpec] = {}
        self._journal = state.Journal(self.state_path + ".intent")
        self._creating: str | None = None  # the group being created (own, not recorded yet)
        self._made = False  # its mkdir succeeded
        self.recovered: str | None = None  # what start-up recovery did, if anything
        self.not_ours: list[str] = []  # prefix-named directories this node did not record
        self._tracker = monitor.CounterTracker()
        self._pmc_tasks: dict[str, frozenset[int]] = {}
        self._last_observe = time.monotonic()
        self.cleaned_mon_groups: list[str] = []
        self._adopt()

    # ------------------------------------------------------------------ paths

    def _dirname(self, name: str) -> str:
        """The directory name of group ``name``: a runtime class's own, else prefixed."""
        return name if name in self.runtime_classes else self.prefix + name

    def _dir(self, name: str) -> str:
        """The directory of own group ``name``; nothing a caller passes leaves the root."""
        validate_group_name(name, error=InvalidName)
        path = os.path.join(self.root, self._dirname(name))
        if os.path.dirname(os.path.normpath(path)) != self.root:
            raise InvalidName(f"group name {name!r} does not name a directory under the root")
        return path

    def _path(self, name: str, filename: str) -> str:
        return os.path.join(self._dir(name), filename)

    def _status(self) -> str:
        try:
            return discovery.read_text(os.path.join(self.root, "info", "last_cmd_status")).strip()
        except OSError:
            return ""

    def _write(self, path: str, text: str) -> None:
        """One write(2): one kernel command."""
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)

    # ------------------------------------------------------------------ adoption

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
            self._clean_own_mon_groups()
        if self._specs or saved.groups or saved.mon_groups != self._mon_groups:
            self._save()

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
        except (OSError, ValueError, TypeError, KeyError) as exc:
            log.error("recovering from the intent record %r failed: %s", intent, exc)
            self.recovered = f"failed: {exc}"
        else:
            if self.recovered:
                log.warning("crash recovery: %s", self.recovered)
        self._journal.clear()

    def _roll_back_apply(self, intent: dict, saved: state.Saved) -> str:
        """Every group of an interrupted apply gets its old values back, in the reverse of
        the order they were written (so no two groups overlap on the way)."""
        groups = intent["groups"]
        restored = []
        for group in reversed(intent["order"]):
            if group not in saved.groups:
                continue
            old = {
                res: {int(d): int(v) for d, v in per_dom.items()}
                for res, per_dom in groups[group]["old"].items()
            }
            path = os.path.join(self.root, self._dirname(group), "schemata")
            if not os.path.exists(path):
                continue
            try:
                self._write(path, schemata.format_write(old, self._digits))
                restored.append(group)
            except OSError as exc:
                log.error("could not roll back group %r: %s (%s)", group, exc, self._status())
        return f"rolled back an interrupted apply of {', '.join(map(repr, restored)) or 'nothing'}"

    def _roll_back_create(self, name: str, saved: state.Saved) -> str:
        if name in saved.groups:
            return ""  # recorded before the crash: the creation is complete
        path = self._dir(name)
        if not os.path.isdir(path):
            return ""  # the crash came before mkdir
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
        return done or f"forgot group {name!r}, deleted before a crash"

    def _same(self, recorded: int | None, found: int) -> bool:
        """Whether a directory found with marker ``found`` is the one recorded."""
        return recorded is None or not self.check_markers or recorded == found

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
        try:
            self._journal.write(record)
        except OSError as exc:
            raise OSError(
                exc.errno,
                f"cannot {what}: recording the intent in {self._journal.path} failed "
                f"({exc.strerror}); the group was not created"
                if record["op"] == "create"
                else f"cannot {what}: recording the intent in {self._journal.path} failed "
                f"({exc.strerror}); nothing was changed",
            ) from exc

    def _save(self) -> None:
        state.save(
            self.state_path,
            {**self._vanished, **self._specs},
            self.root,
            self.prefix,
            self._markers,
            self._mon_groups,
        )

    # ------------------------------------------------------------------ vanished groups

    def _check_vanished(self) -> None:
        present = set(os.listdir(self.root))
        gone = [n for n in self._specs if self._dirname(n) not in present]
        for name in gone:
            log.warning("own group %r vanished (deleted by someone else)", name)
            self._vanished[name] = self._specs.pop(name)
            self._tracker.forget(name)
            self._untrack(name)
        if gone:
            self._save()

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

    # ------------------------------------------------------------------ Node: groups

    def capabilities(self) -> NodeCapabilities:
        return self._caps

    def groups(self) -> Mapping[str, GroupSpec]:
        with self._lock.shared():
            self._check_vanished()
        return dict(self._specs)

    def _require(self, name: str) -> str:
        path = self._dir(name)
        if name not in self._specs:
            hint = "it vanished; see vanished()" if name in self._vanished else ""
            raise GroupNotFound(name, hint)
        return path

    def create_group(self, spec: GroupSpec) -> None:
        if not isinstance(spec, GroupSpec):
            raise TypeError(f"expected a GroupSpec, got {type(spec).__name__}")
        path = self._dir(spec.name)
        if spec.name in self.runtime_classes:
            self._adopt_runtime_class(spec, path)
            return
        with self._lock.exclusive():
            if spec.name in self._specs or os.path.lexists(path):
                raise GroupExists(spec.name)
            self._intend({"op": "create", "name": spec.name}, f"create group {spec.name!r}")
            self._creating = spec.name
            try:
                self._create(spec, path)
            except BaseException:
                # Not made (mkdir refused: a directory there is someone else's), or undone.
                if not self._made or not os.path.isdir(path):
                    self._journal.clear()
                raise
            finally:
                self._creating, self._made = None, False
            self._journal.clear()

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
            self._specs[spec.name] = spec
            self._markers[spec.name] = state.marker_of(path)
            vanished = self._vanished.pop(spec.name, None)
            try:
                self._save()
            except OSError as exc:
                del self._specs[spec.name]
                del self._markers[spec.name]
                if vanished is not None:
                    self._vanished[spec.name] = vanished
                raise OSError(
                    exc.errno,
                    f"cannot record group {spec.name!r} in {self.state_path}: {exc.strerror}",
                ) from exc

    def _create(self, spec: GroupSpec, path: str) -> None:
        try:
            os.mkdir(path)
            self._made = True
        except OSError as exc:
            status = self._status()
            if exc.errno == errno.EEXIST:
                raise GroupExists(spec.name) from None
            if exc.errno in (errno.ENOSPC, errno.EBUSY):
                resource = (
                    "rmid" if "RMID" in status else "ways" if "No space" in status else "closid"
                )
                if exc.errno == errno.EBUSY:
                    why = (
                        f"{status or 'Out of RMIDs'}: freed RMIDs are still in limbo "
                        "(their cache occupancy has not drained); retry shortly"
                    )
                    resource = "rmid"
                else:
                    why = status or "no CLOSID or RMID left"
                raise ResourceExhausted(
                    f"cannot create group {spec.name!r}: {why}", resource=resource
                ) from None
            raise KernelError(
                f"cannot create group {spec.name!r}",
                err=exc.errno or 0,
                status=status,
                path=path,
            ) from None
        if spec.exclusive:
            try:
                self._make_exclusive(spec.name)
            except BaseException:
                try:
                    os.rmdir(path)
                except OSError as exc:
                    log.error("could not remove %s after a failed create: %s", path, exc)
                raise
        self._specs[spec.name] = spec
        self._markers[spec.name] = state.marker_of(path)
        vanished = self._vanished.pop(spec.name, None)
        try:
            self._save()
        except OSError as exc:
            # Without a record the group would not be adopted after a restart: undo
            # rather than keep a group whose kind would be lost.
            del self._specs[spec.name]
            del self._markers[spec.name]
            if vanished is not None:
                self._vanished[spec.name] = vanished
            try:
                os.rmdir(path)
            except OSError as undo:
                log.error("could not remove %s after a failed create: %s", path, undo)
            raise OSError(
                exc.errno,
                f"cannot record group {spec.name!r} in {self.state_path}: {exc.strerror}; "
                "the group was not created",
            ) from exc

    def _make_exclusive(self, name: str) -> None:
        """Narrow a new group to the ways no other group uses, then set mode exclusive
        (the kernel refuses exclusive mode while the mask overlaps any other group)."""
        caps = self._caps
        if caps.l3 is not None:
            others = self._others_masks()
            want: dict[int, GroupAllocation] = {}
            for d in caps.l3.domains:
                used = caps.l3.shareable_bits
                for per_dom in others.values():
                    used |= per_dom.get(d, 0)
                free = _lowest_run(caps.l3.cbm_mask & ~used)
                if free.bit_count() < max(1, caps.l3.min_cbm_bits):
                    raise ResourceExhausted(
                        f"cannot make group {name!r} exclusive: no free ways in L3 domain {d} "
                        f"(other groups use {used:#x} of {caps.l3.cbm_mask:#x}); shrink the "
                        "default group first",
                        resource="ways",
                    )
                want[d] = GroupAllocation(l3_mask=free, l3_code_mask=free if self._cdp else None)
            held = self._read_schemata(name)
            text = schemata.format_write(schemata.changes_for(want, held, self._cdp), self._digits)
            if text:
                self._kernel_write(name, "schemata", text, f"narrowing group {name!r}")
        self._kernel_write(name, "mode", "exclusive\n", f"making group {name!r} exclusive")

    def _kernel_write(self, name: str, filename: str, text: str, what: str) -> None:
        path = self._path(name, filename)
        try:
            self._write(path, text)
        except OSError as exc:
            raise KernelError(
                f"{what} failed", err=exc.errno or 0, status=self._status(), path=path
            ) from None

    def delete_group(self, name: str) -> None:
        path = self._dir(name)
        with self._lock.exclusive():
            if name in self._vanished and name not in self._specs:
                del self._vanished[name]  # already gone: forget it
                self._save()
                return
            self._require(name)
            if name in self.runtime_classes:  # the runtime's directory: only forget it
                del self._specs[name]
                self._markers.pop(name, None)
                self._tracker.forget(name)
                self._untrack(name)
                self._save()
                return
            self._intend({"op": "delete", "name": name}, f"delete group {name!r}")
            try:
                os.rmdir(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                self._journal.clear()
                raise KernelError(
                    f"cannot delete group {name!r}",
                    err=exc.errno or 0,
                    status=self._status(),
                    path=path,
                ) from None
            del self._specs[name]
            self._markers.pop(name, None)
            self._tracker.forget(name)
            self._untrack(name)
            self._save()
            self._journal.clear()

    # ------------------------------------------------------------------ Node: tasks

    def tasks(self, group: str) -> frozenset[int]:
        path = self._path(group, "tasks")
        with self._lock.shared():
            self._require(group)
            try:
                text = discovery.read_text(path)
            except FileNotFoundError:
                self._check_vanished()
                raise GroupNotFound(group, "it vanished") from None
        return frozenset(int(x) for x in text.split() if x.isdigit())

    def _online_cpus(self) -> set[int]:
        """Every online CPU belongs to exactly one control group: the union of them all."""
        cpus: set[int] = set()
        for entry in [""] + [e for e in os.listdir(self.root) if e != "info"]:
            path = os.path.join(self.root, entry, "cpus_list")
            if os.path.exists(path):
                cpus |= discovery.parse_cpu_list(discovery.read_text(path))
        return cpus

    def _locate(self, pids: set[int]) -> dict[int, str]:
        """The group directory (relative to the root, "" for the default group) of each pid,
        read before a multi-pid move so a failure can put the moved ones back."""
        where: dict[int, str] = {}
        for entry in [e for e in os.listdir(self.root) if e != "info"]:
            base = os.path.join(self.root, entry)
            for rel in [entry] + [
                os.path.join(entry, "mon_groups", m)
                for m in monitor_listdir(os.path.join(base, "mon_groups"))
            ]:
                path = os.path.join(self.root, rel, "tasks")
                if not os.path.exists(path):
                    continue
                for x in discovery.read_text(path).split():
                    if x.isdigit() and int(x) in pids:
                        where[int(x)] = rel
        for m in monitor_listdir(os.path.join(self.root, "mon_groups")):
            path = os.path.join(self.root, "mon_groups", m, "tasks")
            for x in discovery.read_text(path).split():
                if x.isdigit() and int(x) in pids:
                    where[int(x)] = os.path.join("mon_groups", m)
        return where

    def assign(self, group: str, *, pids: Iterable[int] = (), cpus: Iterable[int] = ()) -> None:
        pids = list(pids)
        cpus = list(cpus)
        for pid in pids:
            if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
                raise UnknownTask(
                    -1 if not isinstance(pid, int) else pid,
                    f"pid {pid!r} is not a positive integer",
                )
        for cpu in cpus:
            if not isinstance(cpu, int) or isinstance(cpu, bool) or cpu < 0:
                raise InvalidCpus(f"CPU {cpu!r} is not a CPU number")
        with self._lock.exclusive():
            self._require(group)
            if not os.path.isdir(self._dir(group)):
                self._check_vanished()
                raise GroupNotFound(group, "it vanished")
            for pid in pids:
                if not os.path.exists(os.path.join(self.proc, str(pid))):
                    raise UnknownTask(pid, f"no task with pid {pid} (not in {self.proc})")
            if cpus:
                offline = set(cpus) - self._online_cpus()
                if offline:
                    raise InvalidCpus(
                        f"cannot assign CPUs {sorted(offline)} to group {group!r}: not online"
                    )
            before = self._locate(set(pids)) if len(pids) > 1 else {}
            moved: list[int] = []
            try:
                for pid in pids:
                    self._move(group, pid)
                    moved.append(pid)
                if cpus:
                    self._add_cpus(group, cpus)
            except NodeError:
                self._move_back(moved, before)
                raise

    def _move(self, group: str, pid: int) -> None:
        path = self._path(group, "tasks")
        try:
            self._write(path, f"{pid}\n")
        except OSError as exc:
            status = self._status()
            if exc.errno == errno.ESRCH:
                raise UnknownTask(
                    pid, f"no task with pid {pid} (the kernel says: {status or 'ESRCH'})"
                ) from None
            if exc.errno == errno.ENOENT:
                self._check_vanished()
                raise GroupNotFound(group, "it vanished") from None
            raise KernelError(
                f"cannot move task {pid} into group {group!r}",
                err=exc.errno or 0,
                status=status,
                path=path,
            ) from None

    def _move_back(self, moved: list[int], before: Mapping[int, str]) -> None:
        for pid in moved:
            rel = before.get(pid, "")
            try:
                self._write(os.path.join(self.root, rel, "tasks"), f"{pid}\n")
            except OSError as exc:
                log.error("could not return task %d to %r: %s", pid, rel or "/", exc)

    def _add_cpus(self, group: str, cpus: list[int]) -> None:
        path = self._path(group, "cpus_list")
        held = discovery.parse_cpu_list(discovery.read_text(path))
        text = ",".join(str(c) for c in sorted(held | set(cpus)))
        try:
            self._write(path, text + "\n")
        except OSError as exc:
            status = self._status()
            if exc.errno == errno.EINVAL:
                raise InvalidCpus(
                    f"cannot assign CPUs {sorted(cpus)} to group {group!r}: "
                    f"{status or 'invalid CPU list'}"
                ) from None
            raise KernelError(
                f"cannot assign CPUs to group {group!r}",
                err=exc.errno or 0,
                status=status,
                path=path,
            ) from None

    # ------------------------------------------------------------------ Node: allocation

    def _read_schemata(self, name: str) -> schemata.Schemata:
        return schemata.parse(discovery.read_text(self._path(name, "schemata")))

    def _to_alloc(self, held: schemata.Schemata) -> dict[int, GroupAllocation]:
        return {d: held.allocation(d, self._cdp) for d in self._caps.domains}

    def _read_all(self) -> dict[str, schemata.Schemata]:
        out = {}
        for name in list(self._specs):
            try:
                out[name] = self._read_schemata(name)
            except FileNotFoundError:
                self._check_vanished()
        return out

    def allocation(self) -> Allocation:
        with self._lock.shared():
            held = self._read_all()
        return Allocation({n: self._to_alloc(s) for n, s in held.items()})

    def _foreign_dirs(self) -> list[str]:
        """Control groups that are not own: other tools' (whatever their names)."""
        own = {self._dirname(n) for n in self._specs}
        if self._creating is not None:
            own.add(self._dirname(self._creating))
        return [
            e
            for e in os.listdir(self.root)
            if e != "info"
            and e not in own
            and os.path.isfile(os.path.join(self.root, e, "schemata"))
        ]

    def _others_masks(self) -> dict[str, dict[int, int]]:
        """L3 masks (code | data) of the default group ("") and foreign groups."""
        out: dict[str, dict[int, int]] = {}
        for entry in ["", *self._foreign_dirs()]:
            held = schemata.parse(discovery.read_text(os.path.join(self.root, entry, "schemata")))
            per_dom: dict[int, int] = {}
            for res in schemata.L3_NAMES:
                for d, v in held.resources.get(res, {}).items():
                    per_dom[d] = per_dom.get(d, 0) | v
            out["" if not entry else f"foreign:{entry}"] = per_dom
        return out

    def _exclusive_groups(self) -> frozenset[str]:
        # Own groups' modes are ours to set (create_group): no need to read them back.
        names = {name for name, spec in self._specs.items() if spec.exclusive}
        for entry in self._foreign_dirs():
            mode = os.path.join(self.root, entry, "mode")
            if os.path.exists(mode) and discovery.read_text(mode).strip() == "exclusive":
                names.add(f"foreign:{entry}")
        return frozenset(names)

    def _expand_cdp(self, plan: AllocationPlan) -> AllocationPlan:
        """With CDP a plain l3_mask means code and data alike (GroupAllocation's meaning)."""
        if not self._cdp or not isinstance(plan, AllocationPlan):
            return plan
        return AllocationPlan(
            {
                g: {
                    d: replace(a, l3_code_mask=a.l3_mask)
                    if isinstance(a, GroupAllocation) and a.l3_code_mask is None
                    else a
                    for d, a in per_dom.items()
                }
                for g, per_dom in plan.groups.items()
            }
        )

    def apply(self, plan: AllocationPlan, *, dry_run: bool = False) -> Allocation:
        with self._lock.exclusive():
            self._check_vanished()
            held = self._read_all()
            current = Allocation({n: self._to_alloc(s) for n, s in held.items()})
            ctx = PlanContext(
                caps=self._caps,
                current=current,
                exclusive=self._exclusive_groups(),
                others=self._others_masks(),
            )
            plan = validate_plan(self._expand_cdp(plan), ctx)
            if dry_run:
                merged = {n: dict(per) for n, per in current.groups.items()}
                for g, per_dom in plan.groups.items():
                    for d, a in per_dom.items():
                        merged[g][d] = merged[g].get(d, GroupAllocation()).overlay(a)
                return Allocation(merged)
            writes = []
            for group, per_dom in plan.groups.items():
                changes = schemata.changes_for(per_dom, held[group], self._cdp)
                if changes:
                    writes.append((self._growth(changes, held[group]), group, changes))
            writes.sort(key=lambda w: w[0])  # shrinking groups first: no transient overlap
            if len(writes) > 1:
                # One schemata write is atomic in the kernel; several are not: journal the
                # old values so a crash between them is rolled back at the next start.
                self._intend(
                    {
                        "op": "apply",
                        "order": [g for _, g, _ in writes],
                        "groups": {
                            g: {"old": _old_values(changes, held[g])} for _, g, changes in writes
                        },
                    },
                    "apply the plan",
                )
            done: list[tuple[str, dict[str, dict[int, int]]]] = []
            for _, group, changes in writes:
                path = self._path(group, "schemata")
                try:
                    self._write(path, schemata.format_write(changes, self._digits))
                except OSError as exc:
                    status = self._status()
                    failed = self._restore(done, held)
                    if not failed and len(writes) > 1:
                        self._journal.clear()  # restored: no crash left anything to repair
                    msg = f"the kernel refused the schemata of group {group!r}"
                    if done:
                        msg += f"; restored {', '.join(repr(g) for g, _ in done)}"
                    if failed:
                        msg += f"; COULD NOT restore {', '.join(failed)}"
                    raise KernelError(msg, err=exc.errno or 0, status=status, path=path) from None
                done.append((group, changes))
            if len(writes) > 1:
                self._journal.clear()
            result = self._read_all()
        return Allocation({n: self._to_alloc(s) for n, s in result.items()})

    @staticmethod
    def _growth(changes: Mapping[str, Mapping[int, int]], held: schemata.Schemata) -> int:
        """Ways a write adds that the group did not hold (0 = only shrinks or MB changes)."""
        grown = 0
        for res, per_dom in changes.items():
            if res == "MB":
                continue
            for d, v in per_dom.items():
                grown += (v & ~(held.get(res, d) or 0)).bit_count()
        return grown

    def _restore(
        self,
        done: list[tuple[str, dict[str, dict[int, int]]]],
        held: Mapping[str, schemata.Schemata],
    ) -> list[str]:
        failed = []
        for group, changes in reversed(done):
            old = {
                res: {d: held[group].resources[res][d] for d in per_dom}
                for res, per_dom in changes.items()
            }
            try:
                self._write(self._path(group, "schemata"), schemata.format_write(old, self._digits))
            except OSError as exc:
                log.error("could not restore the schemata of group %r: %s", group, exc)
                failed.append(repr(group))
        return failed

    # ------------------------------------------------------------------ Node: observe

    def _untrack(self, name: str) -> None:
        if self.pmc is not None and name in self._pmc_tasks:
            self._pmc_tasks.pop(name, None)
            try:
                self.pmc.untrack(name)
            except Exception as exc:
                log.debug("pmc untrack %s: %s", name, exc)

    def _pmc_deltas(self, tasks: Mapping[str, frozenset[int]]) -> Mapping[str, Mapping[str, Any]]:
        if self.pmc is None or not self.pmc.supported:
            return {}
        for name, pids in tasks.items():
            if self._pmc_tasks.get(name) != pids:
                try:
                    self.pmc.track(name, pids=sorted(pids))
                    self._pmc_tasks[name] = pids
                except Exception as exc:  # a task that exited meanwhile: retry next time
                    log.debug("pmc track %s: %s", name, exc)
        try:
            return self.pmc.read_deltas()
        except Exception as exc:
            log.warning("PMC read failed: %s", exc)
            return {}

    def observe(self) -> Snapshot:
        features = self._caps.monitoring.features if self._caps.monitoring else frozenset()
        mon_doms = self._caps.monitoring.domains if self._caps.monitoring else ()
        with self._lock.shared():
            self._check_vanished()
            now = time.monotonic()
            interval = max(now - self._last_observe, 1e-9)
            self._last_observe = now
            mon: dict[str, monitor.MonSample] = {}
            tasks: dict[str, frozenset[int]] = {}
            for name in list(self._specs):
                d = self._dir(name)
                mon[name] = monitor.sample_group(
                    name, os.path.join(d, "mon_data"), features, self._tracker, mon_doms
                )
                if self.pmc is not None and self.pmc.supported:
                    try:
                        text = discovery.read_text(os.path.join(d, "tasks"))
                        tasks[name] = frozenset(int(x) for x in text.split() if x.isdigit())
                    except OSError:
                        pass
            pmc = self._pmc_deltas(tasks)
        samples = {}
        for name, m in mon.items():
            counts = pmc.get(name, {})
            latency = None
            spec = self._specs.get(name)
            if spec is not None and spec.kind is GroupKind.LC and self.latency is not None:
                latency = self.latency.drain(name) or LatencyStats.empty()
            samples[name] = GroupSample(
                instructions=counts.get("instructions"),
                cycles=counts.get("cycles"),
                llc_references=counts.get("llc_references"),
                llc_misses=counts.get("llc_misses"),
                llc_occupancy_bytes=m.occupancy,
                memory_bytes=m.total,
                memory_local_bytes=m.local,
                latency=latency,
            )
        return Snapshot(now, interval, samples, frozenset(self._vanished))

    def close(self) -> None:
        if self.pmc is not None and self._own_pmc:
            self.pmc.close()
        self.pmc = None


def _old_values(
    changes: Mapping[str, Mapping[int, int]], held: schemata.Schemata
) -> dict[str, dict[str, int]]:
    """What a group held of every value an apply changes (JSON-ready)."""
    return {
        res: {str(d): held.resources[res][d] for d in per_dom} for res, per_dom in changes.items()
    }


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def _lowest_run(mask: int) -> int:
    if not mask:
        return 0
    low = mask & -mask
    above = mask + low
    return mask & ((above & -above) - 1)


def monitor_listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []
