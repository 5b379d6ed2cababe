"""Gymnasium environments over any Node: partitioning LLC ways and memory bandwidth.

Importing ``envs`` registers (docs/RL.md):

- ``rdtune/Partition-v0``: an in-process SimNode, a scenario per episode
  (:class:`envs.partition.PartitionEnv`); its ``vector_entry_point`` is N of them over the
  batched simulator (:class:`envs.vector_env.PartitionVectorEnv`:
  ``gymnasium.make_vec(PARTITION_ID, num_envs=N, vectorization_mode="vector_entry_point")``).
- ``rdtune/RemotePartition-v0``: any Node, by default a RemoteNode at an agent's address
  (:class:`envs.partition.NodePartitionEnv`).

``gymnasium.make("envs:rdtune/Partition-v0", ...)`` imports this package first. Features
and actions come from models/ (shared with the tuner), rewards from :mod:`envs.reward`,
scenario families from :mod:`envs.scenarios`, vectorisation helpers from
:mod:`envs.vector` and the transition recorder from :mod:`envs.recording`.
"""

import gymnasium

PARTITION_ID = "rdtune/Partition-v0"
REMOTE_PARTITION_ID = "rdtune/RemotePartition-v0"

for _id, _entry, _vector in (
    (PARTITION_ID, "envs.partition:PartitionEnv", "envs.vector_env:make_vector_env"),
    (REMOTE_PARTITION_ID, "envs.partition:NodePartitionEnv", None),
):
    if _id not in gymnasium.registry:
        gymnasium.register(id=_id, entry_point=_entry, vector_entry_point=_vector)

__all__ = ["PARTITION_ID", "REMOTE_PARTITION_ID"]
