"""ResctrlNode: the real Linux backend of ``Node`` (docs/ARCHITECTURE.md, "The seams"), over the
resctrl filesystem, perf_event_open counters and an LC latency feed.

Follows docs/RESCTRL.md: owns only the groups it created -- recorded in a state
file by name, kind, SLO and a marker of the directory (agent/resctrl/state.py) and adopted
again after a restart; a directory with its prefix that it did not record is someone
else's and is never changed or removed. It notices own groups deleted by someone else
(or deleted and made again under the same name: the marker tells them apart),
validates every plan with agent.validate before the first write, writes one schemata per
group (shrinking groups first), restores what it changed when the kernel refuses a write,
and returns what the kernel really holds, parsed by value. Reads take a shared flock on
the root, read-modify-write sequences an exclusive one.

Crash consistency: a multi-group apply, a group's creation and its deletion are written to
an intent journal before resctrl is touched; a journal found at start is rolled back
(apply: every group gets its old values; create: the half-made directory goes) or
forward (delete) before the node is used, so ``kill -9`` at any instant leaves one whole
plan and no group without its kind and SLO.

The node is composed of this module (set-up, paths, group creation and deletion) and its
parts: ownership.py (adoption, vanished groups) with recovery.py (crash recovery), tasks.py
(tasks and CPUs), allocation.py (schemata reads and the all-or-nothing apply) and
observe.py (one interval's counters and latency).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping

from agent.errors import (
    GroupExists,
    GroupNotFound,
    InvalidName,
    KernelError,
    ResourceExhausted,
)
from agent.node import StepByParts
from agent.resctrl import discovery, monitor, schemata, state
from agent.resctrl.allocation import Allocations, l3_ways
from agent.resctrl.lock import ResctrlLock
from agent.resctrl.observe import LatencySource, Observation, PmcSource
from agent.resctrl.ownership import Ownership, require_mounted, unusable_reason
from agent.resctrl.tasks import Tasks
from agent.types import (
    GroupAllocation,
    GroupSpec,
    NodeCapabilities,
    validate_group_name,
)

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


class ResctrlNode(Ownership, Tasks, Allocations, Observation, StepByParts):
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
        memory_bandwidth_bps: an L3 domain's achievable peak memory bandwidth (bytes/s) for
            the capabilities: the operator's, measured (the kernel has none; docs/DEPLOY.md).
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
        memory_bandwidth_bps: float | None = None,
    ) -> None:
        validate_group_name(prefix, error=InvalidName)
        self.root = os.path.abspath(root)
        self.prefix = prefix
        self.runtime_classes = _runtime_classes(runtime_classes, prefix)
        self.proc = proc
        self.latency = latency
        self.state_path = _state_path(self.root, prefix, state_dir)
        self._lock = ResctrlLock(self.root, lock_timeout_s)
        if check_markers is None:
            check_markers = discovery.mount_info(self.root, mounts).is_resctrl
        self.check_markers = check_markers
        self._specs: dict[str, GroupSpec] = {}
        self._markers: dict[str, int | None] = {}  # own group -> its directory's marker
        self._mon_groups: dict[str, int] = {}  # own monitoring group (path) -> marker
        self._vanished: dict[str, GroupSpec] = {}
        self._journal = state.Journal(self.state_path + ".intent")
        # values a refused apply wrote and could not put back: group -> the values it held
        # before (journalled, so a restart rolls them back; see Allocations.apply)
        self._unrestored: dict[str, dict[str, dict[str, int]]] = {}
        self._creating: str | None = None  # the group being created (own, not recorded yet)
        self._made = False  # its mkdir succeeded
        self.recovered: str | None = None  # what start-up recovery did, if anything
        self.not_ours: list[str] = []  # prefix-named directories this node did not record
        self._tracker = monitor.CounterTracker()
        self._pmc_tasks: dict[str, frozenset[int]] = {}
        self._pmc_warned: dict[str, str] = {}
        self._last_observe = time.monotonic()
        self.cleaned_mon_groups: list[str] = []
        peak_bw = memory_bandwidth_bps  # the operator's figure: the kernel has none
        self._own_pmc = pmc == "auto"
        self.pmc: PmcSource | None = _default_pmc() if pmc == "auto" else pmc  # type: ignore[assignment]
        with _released_on_error() as acquired:  # a refused start leaves nothing open
            if self._own_pmc and self.pmc is not None:  # a caller's reader stays the caller's
                acquired.callback(_quietly, self.pmc.close, "the PMC reader")
            self._caps = _capabilities(
                self.root, self._lock, self.pmc, mounts, cache_size_path, cpuinfo, peak_bw
            )
            self._cdp = bool(self._caps.l3 and self._caps.l3.cdp)
            self._digits = (self._caps.l3.cbm_mask.bit_length() + 3) // 4 if self._caps.l3 else 0
            self._instance = state.InstanceLock(self.state_path + ".lock")
            acquired.callback(_quietly, self._instance.release, "the instance lock")
            self._adopt()

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

    def capabilities(self) -> NodeCapabilities:
        return self._caps

    def groups(self) -> Mapping[str, GroupSpec]:
        with self._lock.shared():
            self._check_vanished()
        return self._listed()

    def _require(self, name: str) -> str:
        path = self._dir(name)
        if name not in self._specs:
            hint = "it vanished; see vanished()" if name in self._vanished else ""
            raise GroupNotFound(name, hint)
        return path

    def unusable(self) -> str | None:
        """Why nothing can be done on this node now (resctrl unmounted), or None: what the
        agent's health follows (agent/server/watch.py)."""
        return unusable_reason(self.root)

    def create_group(self, spec: GroupSpec) -> None:
        if not isinstance(spec, GroupSpec):
            raise TypeError(f"expected a GroupSpec, got {type(spec).__name__}")
        path = self._dir(spec.name)
        if spec.name in self.runtime_classes:
            self._adopt_runtime_class(spec, path)
            return
        with self._lock.exclusive():
            require_mounted(self.root)
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
        self._learn_mb_max(path)  # before anything else writes the new group
        if spec.exclusive:
            try:
                self._make_exclusive(spec.name)
            except BaseException:
                try:
                    os.rmdir(path)
                except OSError as exc:
                    log.error("could not remove %s after a failed create: %s", path, exc)
                raise
        try:
            self._record(spec, path)
        except OSError as exc:
            # Without a record the group would not be adopted after a restart: undo
            # rather than keep a group whose kind would be lost.
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
        (the kernel refuses exclusive mode while the mask overlaps any other group: the
        own ones too, rdtgroup_mode_test_exclusive)."""
        caps = self._caps
        if caps.l3 is not None:
            others = self._others_masks()
            for own, held in self._read_all().items():
                others[own] = l3_ways(held)
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
                        "default group or the other groups first",
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
            if self._find_remade([name]):  # gone as if deleted; the new one is not ours
                del self._vanished[name]
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

    def interrupt(self) -> None:
        """The agent is stopping: a call waiting for another tool's resctrl lock gives up
        (LockInterrupted) and writes nothing; later calls take the lock only if it is free."""
        self._lock.interrupt()

    def close(self) -> None:
        self.interrupt()  # a closed node must not write once another tool lets go
        if self.pmc is not None and self._own_pmc:
            self.pmc.close()
        self.pmc = None
        self._instance.release()  # another agent may take the state file over now


@contextlib.contextmanager
def _released_on_error() -> Iterator[contextlib.ExitStack]:
    """An ExitStack for what a start acquires: its callbacks run, last first, only when the
    block raises (a start that succeeds keeps everything, for ``close``)."""
    with contextlib.ExitStack() as acquired:
        yield acquired
        acquired.pop_all()


def _quietly(release: Callable[[], object], what: str) -> None:
    """Release ``what`` after a refused start, logging an error of its own: the refusal is
    what the operator must see, unchanged (an ExitStack would raise this one instead)."""
    try:
        release()
    except Exception as exc:
        log.warning("releasing %s after a refused start failed: %s", what, exc)


def _capabilities(
    root: str,
    lock: ResctrlLock,
    pmc: PmcSource | None,
    mounts: str = "/proc/mounts",
    cache_size_path: str = discovery.CACHE_SIZE,
    cpuinfo: str = discovery.CPUINFO,
    peak_bw_bps: float | None = None,
) -> NodeCapabilities:
    """What the resctrl mount at ``root`` offers (read under the shared ``lock``), with the
    hardware events ``pmc`` counts and the operator's peak memory bandwidth, if given."""
    if peak_bw_bps is not None and not (math.isfinite(peak_bw_bps) and peak_bw_bps > 0):
        raise ValueError(
            f"memory_bandwidth_bps must be a finite number of bytes/s > 0, got {peak_bw_bps!r}"
        )
    pmc_events, pmc_unsupported = _pmc_events(pmc)
    with lock.shared():
        caps = discovery.discover(
            root,
            mounts=mounts,
            cache_size_path=cache_size_path,
            cpuinfo=cpuinfo,
            pmc_events=pmc_events,
            pmc_unsupported=pmc_unsupported,
        )
    return (
        caps if peak_bw_bps is None else dataclasses.replace(caps, memory_bandwidth_bps=peak_bw_bps)
    )


def _state_path(root: str, prefix: str, state_dir: str | None) -> str:
    """The state file of the node of ``prefix`` on ``root``: one file per (prefix, root), so
    two nodes sharing a state directory never mix their groups."""
    safe_prefix = prefix.strip("-_.") or "rdtune"
    suffix = "" if root == "/sys/fs/resctrl" else "-" + _short_hash(root)
    name = f"{safe_prefix}-resctrl-groups{suffix}.json"
    return os.path.join(state_dir or default_state_dir(), name)


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def _lowest_run(mask: int) -> int:
    if not mask:
        return 0
    low = mask & -mask
    above = mask + low
    return mask & ((above & -above) - 1)


def _pmc_events(pmc: PmcSource | None) -> tuple[frozenset[str], dict[str, str]]:
    """The hardware events ``pmc`` counts, and why each other one is missing."""
    if pmc is None:
        return frozenset(), {e: "no PMC reader configured" for e in HARDWARE_EVENTS}
    events = frozenset(pmc.supported) & frozenset(HARDWARE_EVENTS)
    missing = {
        e: pmc.unsupported.get(e, "not supported") for e in HARDWARE_EVENTS if e not in events
    }
    return events, missing


def _runtime_classes(names: Iterable[str], prefix: str) -> frozenset[str]:
    """Validated runtime class names: group names that do not read as own groups."""
    out = frozenset(names)
    for name in out:
        validate_group_name(name, error=InvalidName)
        if name.startswith(prefix):
            raise InvalidName(
                f"runtime class {name!r} starts with the agent's prefix {prefix!r}: "
                "it would read as a group of the agent's own"
            )
    return out
