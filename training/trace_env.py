"""Training against recorded traces: ``rdtune/TracePartition-v0`` and env recording to Parquet.

- ``rdtune/TracePartition-v0`` is envs' ``NodePartitionEnv`` over a
  :class:`training.trace_node.TraceNode` fitted from one or more trace files (docs/TRACES.md):
  each reset picks a trace (seeded) and a
  random start in its replay. Registered when this module is imported, so the trainer's
  config can name it as ``env.id: "training.trace_env:rdtune/TracePartition-v0"``
  (Gymnasium imports the module before making the env, in worker processes too) with
  ``env.kwargs: {traces: [FILE, ...], ...}``. Fits are cached per file and process.
- :func:`episode_writers` is the ``open_writer`` envs' ``RecordTrace`` wrapper takes:
  one Parquet trace (docs/TRACES.md) per episode in a directory.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np

from training.dynamics import Dynamics, fit_dynamics
from training.trace_node import Replay, TraceNode
from training.traces import TraceError, TraceWriter, load_trace

TRACE_PARTITION_ID = "rdtune/TracePartition-v0"
_FITS: dict[tuple[str, float], tuple[Dynamics, Replay, float]] = {}


def _fitted(path: str) -> tuple[Dynamics, Replay, float]:
    try:
        # keyed by the file's time too: a trace rewritten since is fitted again
        key = (os.path.abspath(path), os.path.getmtime(path))
    except OSError as exc:  # before load_trace, which would have named it
        problem = "no such file" if isinstance(exc, FileNotFoundError) else exc.strerror
        raise TraceError(path, problem or str(exc)) from None
    if key not in _FITS:
        trace = load_trace(path)
        _FITS[key] = (fit_dynamics(trace), Replay.from_trace(trace), trace.interval_s or 0.1)
    return _FITS[key]


class TraceNodes:
    """A TraceNode per trace; ``reset`` picks one by seed (a family of recorded mixes).
    Each is named by its file's stem (``names``): traces of one scenario are told apart."""

    def __init__(
        self, paths: Sequence[str], noise: bool = True, step_s: float | None = None
    ) -> None:
        from envs.partition import MIN_SIM_STEP_S, _flag, _positive

        if not paths:
            raise ValueError("TracePartition-v0 needs at least one trace file (traces=[...])")
        noise = _flag("noise", noise)
        if step_s is not None:
            # the node's cost grows as its step shrinks, as the simulator's does
            step_s = _positive("trace_step_s", step_s, at_least=MIN_SIM_STEP_S)
        self.nodes = []
        self.names = []
        for p in paths:
            dyn, replay, interval = _fitted(str(p))
            step = interval if step_s is None else step_s
            self.nodes.append(
                TraceNode(dyn, replay, interval_s=step, noise=noise, random_start=True)
            )
            self.names.append(Path(p).stem)
        self.index = 0

    @property
    def current(self) -> TraceNode:
        return self.nodes[self.index]

    @property
    def current_name(self) -> str:
        return self.names[self.index]

    def reset(self, scenario: object | None = None, seed: int | None = None) -> None:
        if scenario is not None:
            raise ValueError(
                f"TracePartition-v0 replays its traces' own mixes; it cannot reset to "
                f"scenario {scenario!r} (pick traces with traces=[...])"
            )
        if seed is not None:
            self.index = int(np.random.default_rng(seed).integers(len(self.nodes)))
        self.current.reset(None, seed)

    def now(self) -> float:
        return self.current.now()

    def advance(self, dt: float) -> None:
        self.current.advance(dt)


def make_trace_env(
    traces: str | Sequence[str],
    noise: bool = True,
    trace_step_s: float | None = 0.5,
    **env_kwargs: Any,
):
    """``NodePartitionEnv`` over trace-driven nodes fitted from ``traces``; the node's model
    step is ``trace_step_s`` (None: the trace's interval; at least 1 ms). Groups with an
    occupancy model still move their state one fitted transition per recorded interval.
    ``info["scenario"]`` names the trace an episode replays (its file's stem)."""
    from envs.partition import NodePartitionEnv

    if "scenario" in env_kwargs:
        raise ValueError(
            "TracePartition-v0 replays its traces' own mixes and takes no scenario "
            f"(got scenario={env_kwargs['scenario']!r}); pick traces with traces=[...]"
        )
    paths = [traces] if isinstance(traces, str | os.PathLike) else list(traces)
    env_kwargs.setdefault("reference", "running_max")
    return NodePartitionEnv(
        node=TraceDrivenNode(TraceNodes(paths, noise, trace_step_s)), **env_kwargs
    )


class TraceDrivenNode:
    """What NodePartitionEnv sees: the current TraceNode's Node and Clock methods."""

    def __init__(self, nodes: TraceNodes) -> None:
        self._nodes = nodes

    def capabilities(self):
        return self._nodes.current.capabilities()

    def groups(self):
        return self._nodes.current.groups()

    def create_group(self, spec):
        return self._nodes.current.create_group(spec)

    def delete_group(self, name):
        return self._nodes.current.delete_group(name)

    def assign(self, group, *, pids=(), cpus=()):
        return self._nodes.current.assign(group, pids=pids, cpus=cpus)

    def tasks(self, group):
        return self._nodes.current.tasks(group)

    def apply(self, plan, *, dry_run: bool = False):
        return self._nodes.current.apply(plan, dry_run=dry_run)

    def allocation(self):
        return self._nodes.current.allocation()

    def reserved_ways(self):
        return self._nodes.current.reserved_ways()

    def observe(self):
        return self._nodes.current.observe()

    def close(self) -> None:
        pass

    def scenario_name(self) -> str:
        """The trace being replayed (its file's stem): what agent.node.scenario_name reads."""
        return self._nodes.current_name

    def now(self) -> float:
        return self._nodes.now()

    def reset(self, scenario: object | None = None, seed: int | None = None) -> None:
        self._nodes.reset(scenario, seed)

    def advance(self, dt: float) -> None:
        self._nodes.advance(dt)


if TRACE_PARTITION_ID not in gymnasium.registry:
    gymnasium.register(id=TRACE_PARTITION_ID, entry_point="training.trace_env:make_trace_env")


def episode_writers(
    directory: str | os.PathLike, controller: str = "policy", **writer_kwargs: Any
) -> Callable[[gymnasium.Env, int], TraceWriter]:
    """``open_writer`` for envs' ``RecordTrace``: one trace file per episode,
    ``DIRECTORY/episode-00000.parquet`` ..., each with the env's node and groups; a run
    into a directory of an earlier one replaces its episodes unless ``replace=False``. No
    journal is kept unless ``journal=True``: an episode runs again from its seed, and a
    journal's fsyncs would cost every episode file."""
    writer_kwargs.setdefault("replace", True)
    writer_kwargs.setdefault("journal", False)
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)

    def open_writer(env: gymnasium.Env, episode: int) -> TraceWriter:
        node = env.node
        scenario = getattr(env, "_scenario_name", None)
        return TraceWriter(
            root / f"episode-{episode:05d}.parquet",
            node.capabilities(),
            node.groups(),
            controller,
            scenario={"name": scenario} if scenario else None,
            interval_s=getattr(env, "interval_s", 0.0),
            **writer_kwargs,
        )

    return open_writer
