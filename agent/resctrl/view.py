"""A read-only look at a resctrl node (``rdtune describe``): its capabilities, the groups
its state file records and what their schemata hold.

Unlike :class:`~agent.resctrl.node.ResctrlNode` it takes no instance lock, runs no
start-up recovery (adoption, the intent journal's roll-back) and creates no state
directory: it can look at a node while the agent serves it, and changes nothing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from agent.resctrl import discovery, schemata, state
from agent.resctrl.lock import ResctrlLock
from agent.resctrl.node import _capabilities, _default_pmc, _state_path
from agent.types import Allocation, GroupSpec, NodeCapabilities, validate_group_name


class ResctrlView:
    """The node of ``prefix`` on ``root`` as the agent's state file in ``state_dir``
    records it (see :class:`~agent.resctrl.node.ResctrlNode` for the arguments)."""

    def __init__(
        self,
        root: str = "/sys/fs/resctrl",
        prefix: str = "rdtune-",
        state_dir: str | None = None,
        check_markers: bool | None = None,
    ) -> None:
        validate_group_name(prefix, error=ValueError)
        self.root = os.path.abspath(root)
        self.prefix = prefix
        self.state_path = _state_path(self.root, prefix, state_dir)
        self._lock = ResctrlLock(self.root)  # consistent reads: the flock makes no file
        pmc = _default_pmc()
        try:
            self._caps = _capabilities(self.root, self._lock, pmc)
        finally:  # the view counts nothing: only what the reader can count here was needed
            if pmc is not None:
                pmc.close()
        saved = state.load(self.state_path, keep_aside=False)
        if check_markers is None:
            check_markers = discovery.mount_info(self.root).is_resctrl
        self._dirs = {name: self._dir_of(name, saved, check_markers) for name in saved.groups}
        self._specs = {n: s for n, s in saved.groups.items() if self._dirs[n] is not None}
        self._vanished = sorted(set(saved.groups) - set(self._specs))
        recorded = {os.path.basename(d) for d in self._dirs.values() if d}
        self.not_ours = sorted(
            entry[len(prefix) :]
            for entry in os.listdir(self.root)
            if entry.startswith(prefix)
            and entry not in recorded
            and os.path.isfile(os.path.join(self.root, entry, "schemata"))
        )

    def _dir_of(self, name: str, saved: state.Saved, check_markers: bool) -> str | None:
        """The directory of recorded group ``name``: the one the state file names (a file
        written before it named them: the prefixed one; the agent names them at its next
        start); None when it is gone, or (with ``check_markers``) deleted and made again by
        someone else, as ResctrlNode tells."""
        entry = saved.dirs.get(name)
        if entry not in (self.prefix + name, name):  # never a path out of the root
            entry = self.prefix + name
        path = os.path.join(self.root, entry)
        if not os.path.isfile(os.path.join(path, "schemata")):
            return None
        try:
            found = state.marker_of(path)
        except FileNotFoundError:
            return None
        return path if state.is_recorded(saved.markers.get(name), found, check_markers) else None

    def capabilities(self) -> NodeCapabilities:
        return self._caps

    def groups(self) -> Mapping[str, GroupSpec]:
        return dict(self._specs)

    def vanished(self) -> list[str]:
        return list(self._vanished)

    def allocation(self) -> Allocation:
        cdp = bool(self._caps.l3 and self._caps.l3.cdp)
        out = {}
        with self._lock.shared():
            for name in self._specs:
                try:
                    text = discovery.read_text(os.path.join(self._dirs[name], "schemata"))
                except FileNotFoundError:  # removed since it was listed
                    continue
                held = schemata.parse(text)
                out[name] = {d: held.allocation(d, cdp) for d in self._caps.domains}
        return Allocation(out)

    def close(self) -> None:
        """Nothing to release: the view holds nothing open between calls."""
