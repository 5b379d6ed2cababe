"""Controllers by name: what ``rdtune tune --controller NAME`` and ``rdtune eval`` accept.

Each entry is a factory taking keyword options (from a config file or the command line).
Heuristics register here as they are built; the learned policy registers as ``policy``
(loaded from an exported model).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from models.controller import Controller

# name -> "module:Class" (imported on demand so listing names stays cheap)
CONTROLLERS: dict[str, str] = {
    "unpartitioned": "models.basic:Unpartitioned",
    "eq": "models.basic:EqualPartition",
    "explore": "models.explore:Explore",
    "copart": "models.copart:CoPart",  # stream={mb: misses/s}, period=..., lc_ways=...
    "static": "models.static:StaticController",  # lc_group=..., ways=... (from a sweep)
    "ubik": "models.ubik:Ubik",  # profiles={lc_group: target ways}, slack=0.05
    "static_lc": "models.ubik:StaticLC",  # profiles={lc_group: ways}
    "coco": "models.coco:coco_from_options",  # services=[{name, pids, slo}], groups=[...]
    "round_robin": "models.coco:round_robin_from_options",  # as coco
    "policy": "models.policy:PolicyController",  # path=... (an 'rdtune export' directory)
}


def names() -> list[str]:
    return list(CONTROLLERS)


def factory(name: str) -> Callable[..., Controller]:
    try:
        target = CONTROLLERS[name]
    except KeyError:
        raise ValueError(
            f"unknown controller {name!r}; choose from {', '.join(CONTROLLERS)}"
        ) from None
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def make(name: str, **options: Any) -> Controller:
    """A new controller ``name`` configured with ``options``."""
    return factory(name)(**options)
