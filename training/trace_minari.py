"""Export traces to Farama Minari, the standard offline-RL dataset format (docs/RL.md).

One Minari episode per trace. For interval ``k``: the observation is the feature encoder's
(models/features.py) view of interval ``k``; the action is the share/MBA levels
(models/actions.py, inverted by :func:`training.bc.allocation_action`) of the allocation the
controller held after deciding on it; the reward is envs' reward
(:func:`envs.reward.compute_reward`, default weights, running-max reference — a trace has
no ground truth) of interval ``k + 1``, which that allocation produced. The last interval
is the final observation; the episode is truncated there. Written with Minari's ``arrow``
back end (pyarrow, no h5py) under ``root`` (or ``$MINARI_DATASETS_PATH``); d3rlpy and
``minari.load_dataset`` read it. The dataset names ``rdtune/Partition-v0`` with the same
slots and levels as its environment (``recover_environment()`` makes it: same observation
and action spaces) and says who wrote it and with which rdtune, as Minari asks.
"""

from __future__ import annotations

import dataclasses
import getpass
import importlib.metadata
import os
import socket
from collections.abc import Sequence
from typing import Any

import numpy as np

from agent.types import Allocation
from models.actions import ActionDecoder
from models.features import FeatureEncoder
from training.bc import allocation_action
from training.traces import Trace


def _rdtune_version() -> str | None:
    try:
        return importlib.metadata.version("rdtune")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        return None


def episode_arrays(
    trace: Trace, encoder: FeatureEncoder, decoder: ActionDecoder, weights: Any = None
) -> dict[str, np.ndarray]:
    """observations (N+1), actions, rewards, terminations, truncations (N) of one trace."""
    from envs.reward import RewardWeights, RunningMaxReference, compute_reward, observed_ips

    weights = RewardWeights.of(weights)
    caps = trace.capabilities
    steps = [s for s in trace.steps if s.snapshot.groups]
    if len(steps) < 2:
        raise ValueError(f"trace {trace.path}: need at least two intervals with groups")
    ref = RunningMaxReference()
    obs, acts, rewards = [], [], []
    for k, step in enumerate(steps):
        groups = {g: trace.groups[g] for g in step.snapshot.groups}
        slots = encoder.slots(groups)
        obs.append(encoder.encode(step.snapshot, step.allocation, groups, caps, slots))
        ips = observed_ips(step.snapshot)
        reference = ref.update(ips)
        if k == 0:
            continue
        prev = steps[k - 1]
        prev_groups = {g: trace.groups[g] for g in prev.snapshot.groups}
        after = Allocation({**prev.allocation.groups, **step.allocation.groups})
        acts.append(allocation_action(decoder, after, encoder.slots(prev_groups), caps))
        terms = compute_reward(
            step.snapshot, groups, reference, caps, prev.allocation, step.allocation, weights, ips
        )
        rewards.append(float(terms.total))
    n = len(acts)
    return {
        "observations": np.asarray(obs, dtype=np.float32),
        "actions": np.asarray(acts, dtype=np.int64),
        "rewards": np.asarray(rewards, dtype=np.float64),
        "terminations": np.zeros(n, dtype=bool),
        "truncations": np.arange(n) == n - 1,
    }


class ExportError(ValueError):
    """The export's arguments do not fit the traces (a usage error: nothing is written)."""


def check_export(
    traces: Sequence[Trace], dataset_id: str, max_groups: int, root: str | os.PathLike | None
) -> None:
    """Refuse, before Minari creates any directory, a malformed id, traces with more
    groups than slots (the encoder would drop the others without a word) and a datasets
    folder ``root`` that is a file (Minari's own words: "File exists")."""
    from minari.dataset.minari_dataset import parse_dataset_id

    if root is not None and os.path.exists(root) and not os.path.isdir(root):
        raise ExportError(f"the datasets folder {root} is a file, not a directory")

    try:
        parse_dataset_id(dataset_id)
    except (ValueError, TypeError):  # TypeError: an id without -vN
        raise ExportError(
            f"--dataset-id {dataset_id!r}: not a Minari id, (namespace/)name-vN"
        ) from None
    for trace in traces:
        if len(trace.groups) > max_groups:
            raise ExportError(
                f"trace {trace.path} has {len(trace.groups)} groups, more than --max-groups "
                f"{max_groups}: raise --max-groups to at least {len(trace.groups)}"
            )


def export_minari(
    traces: Sequence[Trace],
    dataset_id: str,
    *,
    root: str | os.PathLike | None = None,
    max_groups: int = 8,
    share_levels: int = 8,
    mba_levels: int = 10,
    author: str | None = None,
    author_email: str | None = None,
    code_permalink: str | None = None,
):
    """Write ``traces`` as the Minari dataset ``dataset_id``; returns the MinariDataset.

    ``author`` and ``author_email`` default to the local account (``user`` and
    ``user@host``), ``code_permalink`` to this rdtune's version and module."""
    try:
        import minari
        from minari.data_collector import EpisodeBuffer
    except ImportError as e:  # an optional extra: pip install 'rdtune[minari]'
        raise ImportError(f"Minari export needs the minari package ({e})") from None
    import gymnasium as gym
    from gymnasium import spaces

    from envs import PARTITION_ID

    check_export(traces, dataset_id, max_groups, root)
    if root is not None:
        os.environ["MINARI_DATASETS_PATH"] = str(root)
    encoder = FeatureEncoder(max_groups)
    decoder = ActionDecoder(max_groups, share_levels, mba_levels)
    buffers = []
    for i, trace in enumerate(traces):
        arrays = episode_arrays(trace, encoder, decoder)
        buffers.append(
            EpisodeBuffer(id=i, seed=trace.seed, **{k: list(v) for k, v in arrays.items()})
        )
    levels = {"max_groups": max_groups, "share_levels": share_levels, "mba_levels": mba_levels}
    base = gym.spec(PARTITION_ID)
    env_spec = dataclasses.replace(base, kwargs={**base.kwargs, **levels})
    user = author or getpass.getuser()
    version = _rdtune_version()
    return minari.create_dataset_from_buffers(
        dataset_id,
        buffers,
        env=env_spec,
        eval_env=env_spec,
        observation_space=spaces.Box(encoder.low, encoder.high, dtype=np.float32),
        action_space=spaces.MultiDiscrete(decoder.nvec),
        author=user,
        author_email=author_email or f"{getpass.getuser()}@{socket.gethostname()}",
        code_permalink=code_permalink or f"rdtune {version or '(source tree)'}: {__name__}",
        requirements=[f"rdtune=={version}"] if version else None,
        algorithm_name=",".join(sorted({t.controller for t in traces})),
        description=(
            f"rdtune traces exported from {len(traces)} file(s); features v{encoder.version} "
            f"({encoder.size} values), actions {decoder.layout()['kind']} {decoder.nvec.tolist()}"
        ),
        data_format="arrow",
    )
