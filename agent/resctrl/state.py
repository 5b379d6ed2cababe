"""The small state ResctrlNode keeps beside resctrl: what it made, and what it is doing.

resctrl stores masks, tasks and modes, but not what a group is *for* nor who made it.
The state file records each own group's kind and SLO (without it a restarted agent would
adopt its LC services as batch jobs) and a *marker* of the directory it created: its inode
number, which the kernel never gives to another directory while the mount lives (kernfs
ids carry a generation), so a directory of the same name made by someone else is told
apart. Monitoring groups the node creates are recorded the same way; nothing that is not
recorded is ever removed or rewritten (docs/RESCTRL.md, "Locking and ownership").

The intent journal (:class:`Journal`) makes multi-step changes crash-consistent: the
node writes what it is about to do (the old and new values of an apply, the group being
created or deleted) durably before touching resctrl and clears it after; a journal found
at start is rolled back (apply, create) or forward (delete) before anything is served.

Every file is written atomically (temp file in the same directory, then rename), so a
crash leaves the old or the new file, never half. The state file is also fsynced with its
directory, so it survives a power cut. The journal is not: it only has to outlive the
process (``kill -9``), since resctrl itself does not survive a reboot -- and an fsync per
apply would cost ~16 ms on an ordinary ext4 disk, 10x the apply itself.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from agent.atomic import fsync_directory
from agent.errors import InUse, StateUnwritable
from agent.pidlock import Locked, PidLock
from agent.types import SLO, GroupKind, GroupSpec

log = logging.getLogger(__name__)
VERSION = 2  # 1: groups without markers (adopted by name, then upgraded)


def spec_to_json(spec: GroupSpec) -> dict:
    out: dict = {"kind": spec.kind.value, "exclusive": spec.exclusive}
    if spec.slo is not None:
        out["slo"] = {"percentile": spec.slo.percentile, "target_ms": spec.slo.target_ms}
    return out


def spec_from_json(name: str, data: dict) -> GroupSpec:
    slo = data.get("slo")
    return GroupSpec(
        name,
        GroupKind(data.get("kind", "batch")),
        SLO(float(slo["percentile"]), float(slo["target_ms"])) if slo else None,
        bool(data.get("exclusive", False)),
    )


@dataclass
class Saved:
    """What the state file holds: own groups' specs and markers (None: recorded before
    markers existed), own monitoring groups (path under the root -> marker), and each own
    group's directory name under the root (absent: recorded before directory names were;
    a reader that does not know the node's runtime classes, ``rdtune describe``, needs it
    to tell an adopted runtime class from another tool's group of the same name). On AMD
    also the MB maximum, learnt from a group the node made (info/MB names none)."""

    groups: dict[str, GroupSpec] = field(default_factory=dict)
    markers: dict[str, int | None] = field(default_factory=dict)
    mon_groups: dict[str, int] = field(default_factory=dict)
    dirs: dict[str, str] = field(default_factory=dict)
    mb_max: int | None = None

    @classmethod
    def of(
        cls,
        groups: Mapping[str, GroupSpec],
        markers: Mapping[str, int | None],
        mon_groups: Mapping[str, int],
        dirs: Mapping[str, str],
        mb_max: int | None = None,
    ) -> Saved:
        """The state as :func:`load` reads it back after :func:`save` (a marker per group,
        None where there is none)."""
        return cls(
            dict(groups),
            {n: markers.get(n) for n in groups},
            dict(mon_groups),
            {n: dirs[n] for n in groups if n in dirs},
            mb_max,
        )


def _read_json(path: str, keep_aside: bool = False) -> dict | None:
    """The JSON object in ``path`` (None: absent or unreadable, with a warning); with
    ``keep_aside``, a file that is not one is renamed aside first (:func:`_keep_aside`)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("ignoring unreadable file %s: %s", path, exc)
        if keep_aside and isinstance(exc, ValueError):
            _keep_aside(path)
        return None
    if not isinstance(data, dict):
        log.warning("ignoring %s: not a JSON object", path)
        if keep_aside:
            _keep_aside(path)
        return None
    return data


def _keep_aside(path: str) -> None:
    """Rename a corrupt state file to ``<path>.corrupt-<time>``: the next save would
    overwrite it, and the groups it recorded could then no longer be recovered by hand."""
    aside = f"{path}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}"
    try:
        os.replace(path, aside)
    except OSError as exc:
        log.warning("could not keep the corrupt %s aside: %s", path, exc)
        return
    log.warning("kept the corrupt state file as %s; the groups it names are not adopted", aside)


def load(path: str, keep_aside: bool = True) -> Saved:
    """The saved state; an unreadable or corrupt file counts as empty (with a warning; a
    corrupt one is kept aside unless ``keep_aside`` is False: a reader that changes
    nothing)."""
    data = _read_json(path, keep_aside=keep_aside) or {}
    groups, mon_groups = data.get("groups") or {}, data.get("mon_groups") or {}
    if not (isinstance(groups, dict) and isinstance(mon_groups, dict)):
        log.warning("ignoring %s: its groups are not JSON objects", path)
        if keep_aside:
            _keep_aside(path)
        groups, mon_groups = {}, {}
    out = Saved()
    for name, entry in groups.items():
        try:
            out.groups[name] = spec_from_json(name, entry)
            marker = entry.get("marker")
            out.markers[name] = int(marker) if marker is not None else None
            if isinstance(entry.get("dir"), str):
                out.dirs[name] = entry["dir"]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("state file %s: ignoring group %r: %s", path, name, exc)
    for rel, marker in mon_groups.items():
        if not is_mon_group_path(rel):  # hand-edited or corrupt: never rmdir outside the root
            log.warning(
                "state file %s: ignoring monitoring group %r: not one below a root", path, rel
            )
            continue
        with contextlib.suppress(ValueError, TypeError):
            out.mon_groups[rel] = int(marker)
    mb_max = data.get("mb_max")
    if isinstance(mb_max, int) and not isinstance(mb_max, bool) and mb_max > 0:
        out.mb_max = mb_max
    return out


def is_mon_group_path(rel: str) -> bool:
    """Whether ``rel`` names a monitoring group below a resctrl root: ``mon_groups/NAME``
    or ``GROUP/mon_groups/NAME``, no component empty, ``.`` or ``..``."""
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return False
    return (len(parts) == 2 and parts[0] == "mon_groups") or (
        len(parts) == 3 and parts[1] == "mon_groups"
    )


def save(path: str, saved: Saved, root: str, prefix: str) -> None:
    """Write ``saved`` to the state file ``path`` (StateUnwritable naming it on failure)."""
    groups = {}
    for name, spec in sorted(saved.groups.items()):
        entry = spec_to_json(spec)
        if saved.markers.get(name) is not None:
            entry["marker"] = saved.markers[name]
        if name in saved.dirs:
            entry["dir"] = saved.dirs[name]
        groups[name] = entry
    data = {
        "version": VERSION,
        "root": root,
        "prefix": prefix,
        "groups": groups,
        "mon_groups": dict(sorted(saved.mon_groups.items())),
    }
    if saved.mb_max is not None:
        data["mb_max"] = saved.mb_max
    try:
        write_atomic(path, data)
    except OSError as exc:
        raise StateUnwritable(
            exc.errno, f"cannot write the state file {path}: {exc.strerror or exc}"
        ) from exc


def write_atomic(path: str, data: dict, durable: bool = True) -> None:
    """``data`` as JSON at ``path``: the old or the new file after any crash; with
    ``durable`` also after a power cut once this returns."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".state-", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1 if durable else None)
            f.write("\n")
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_directory(directory)


def marker_of(path: str) -> int:
    """The marker of a directory: its inode number (unique while the mount lives)."""
    return os.stat(path).st_ino


def is_recorded(recorded: int | None, found: int, check_markers: bool) -> bool:
    """Whether a directory found with marker ``found`` is the one whose marker was recorded
    as ``recorded`` (None: recorded before markers were; ``check_markers`` False: a tree
    whose inode numbers are not kernfs ids, as the FUSE emulator's: markers say nothing)."""
    return recorded is None or not check_markers or recorded == found


class Journal:
    """One intent record at a time, beside the state file (``<state>.intent``)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def write(self, record: dict) -> None:
        # A fixed temp name (the node writes under its exclusive flock on the root) and
        # one write(2): this is on the path of every multi-group apply.
        data = json.dumps(record, separators=(",", ":")).encode()
        tmp = self.path + ".tmp"
        try:
            fd = _create_new(tmp)
        except FileNotFoundError:
            os.makedirs(os.path.dirname(self.path) or ".", mode=0o700, exist_ok=True)
            fd = _create_new(tmp)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(tmp, self.path)

    def read(self) -> dict | None:
        return _read_json(self.path)

    def clear(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


# A new file only, never through a symlink: the agent runs as root, and a file or link
# planted at the temporary name must not turn the write into one to another file.
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW


def _create_new(path: str) -> int:
    """A new private file at ``path``; whatever was there (a temporary file left by a
    crash, a planted link) is unlinked first -- unlink never follows a link."""
    try:
        return os.open(path, _NEW_FILE, 0o600)
    except FileExistsError:
        os.unlink(path)
        return os.open(path, _NEW_FILE, 0o600)


def check_private_dir(path: str) -> None:
    """Refuse a state directory another user could write: they could plant the state
    file (choosing which groups the agent adopts) or links for root to write through."""
    st = os.stat(path)
    euid = os.geteuid()
    if st.st_uid != euid:
        raise StateUnwritable(
            errno.EPERM,
            f"refusing the state directory {path}: it is owned by uid {st.st_uid}, "
            f"not by this agent's uid {euid}; use a directory of its own",
        )
    if st.st_mode & 0o022:
        raise StateUnwritable(
            errno.EPERM,
            f"refusing the state directory {path}: group or others can write it "
            f"(mode {st.st_mode & 0o777:o}); chmod go-w it or use another",
        )


class InstanceLock:
    """One live node per state file: two agents on one resctrl root with the same state
    file would each save only its own view of the groups and lose the other's. The lock is
    an ``flock`` on ``<state>.lock``, which the kernel drops when its holder dies
    (``kill -9`` included), so a crashed agent never blocks its restart; the holder's pid
    is written in the file for the message the next one gets.

    A lock file removed by hand (or by a clean-up of the state directory) would let a
    second agent lock a new file of the same name while the first still runs: the holder
    checks, before each change it records (:meth:`confirm`), that the path still names the
    file it locked, and locks the new one or stops changing the node."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
        except OSError as exc:
            raise StateUnwritable(exc.errno, f"cannot open {path}: {exc.strerror}") from exc
        check_private_dir(os.path.dirname(path) or ".")
        self._lock = _take(path)

    def confirm(self) -> None:
        """Raise :class:`InUse` unless this node still holds the lock its path names: a
        lock file removed since is locked again (a warning), or, where another agent has
        locked the new file already, this node refuses to record any change. Where the
        file cannot be made again (the directory gone or read-only) no other agent can make
        it either; the change's own write then says what is wrong."""
        if self._lock.fd is None or self._lock.holds():
            return
        try:
            new = _take(self.path)
        except InUse as exc:
            raise InUse(
                f"{exc}; this agent's lock file was removed while it ran, and it changes "
                "nothing more: stop one of the two"
            ) from None
        except StateUnwritable:
            return
        log.warning("%s: the lock file was removed while this agent ran; locked again", self.path)
        self._lock.release()
        self._lock = new

    def release(self) -> None:
        self._lock.release()


def _take(path: str) -> PidLock:
    """The lock of ``path``; :class:`InUse` naming the holder when another agent has it."""
    try:
        return PidLock.take(path)
    except Locked as exc:
        raise InUse(
            f"{path}: another rdtune agent (pid {exc.holder}) manages this resctrl root "
            "with this state directory; stop it, or give this one another prefix"
        ) from None
    except OSError as exc:
        raise StateUnwritable(exc.errno, f"cannot open {path}: {exc.strerror}") from exc
