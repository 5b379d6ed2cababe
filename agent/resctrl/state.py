"""The small state ResctrlNode keeps beside resctrl: each own group's kind and SLO.

resctrl stores masks, tasks and modes, but not what a group is *for*; without this file a
restarted agent would adopt its LC services as batch jobs. Written atomically (temp file in
the same directory, fsync, rename) so a crash leaves the old or the new file, never half.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Mapping

from agent.types import SLO, GroupKind, GroupSpec

log = logging.getLogger(__name__)
VERSION = 1


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


def load(path: str) -> dict[str, GroupSpec]:
    """Specs by group name; an unreadable or corrupt file counts as empty (with a warning)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("ignoring unreadable state file %s: %s", path, exc)
        return {}
    out: dict[str, GroupSpec] = {}
    for name, entry in (data.get("groups") or {}).items():
        try:
            out[name] = spec_from_json(name, entry)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("state file %s: ignoring group %r: %s", path, name, exc)
    return out


def save(path: str, specs: Mapping[str, GroupSpec], root: str, prefix: str) -> None:
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o700, exist_ok=True)
    data = {
        "version": VERSION,
        "root": root,
        "prefix": prefix,
        "groups": {name: spec_to_json(s) for name, s in sorted(specs.items())},
    }
    fd, tmp = tempfile.mkstemp(prefix=".state-", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
