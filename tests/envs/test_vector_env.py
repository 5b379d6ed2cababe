"""PartitionVectorEnv: N Partition-v0 envs over the batched simulator, against N single envs.

The reference is gymnasium's own vectorisation of the single env (``SyncVectorEnv`` of
``PartitionEnv`` with the same autoreset mode): with the same seeds and actions the batched
env must give the same observations, rewards, truncations and final observations, across
autoresets, for both reward references, both baselines and both scenario families. Then the
gymnasium conventions (``make_vec`` through the ``vector_entry_point``, autoreset declared in
the metadata, seeding) and the SB3 adapter (against SB3's DummyVecEnv of single envs, and a
MaskablePPO update).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import envs
from envs.vector import make_batched_vec_env, sb3_vector_env
from envs.vector_env import PartitionVectorEnv

FAST = {"episode_steps": 4, "interval_s": 0.5}


def _masked_actions(masks: np.ndarray, nvec: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Random actions that respect each env's masks (what MaskablePPO samples)."""
    offsets = np.concatenate([[0], np.cumsum(nvec)[:-1]])
    out = np.zeros((len(masks), len(nvec)), dtype=np.int64)
    for i, m in enumerate(masks):
        for d, (o, n) in enumerate(zip(offsets, nvec, strict=True)):
            out[i, d] = rng.choice(np.flatnonzero(m[o : o + n]))
    return out


def _pair(n: int, mode: str, **kwargs):
    kw = {**FAST, **kwargs}
    vec = gym.make_vec(
        envs.PARTITION_ID,
        num_envs=n,
        vectorization_mode="vector_entry_point",
        autoreset_mode=mode,
        **kw,
    )
    ref = gym.make_vec(
        envs.PARTITION_ID,
        num_envs=n,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": AutoresetMode(mode)},
        **kw,
    )
    return vec, ref


def _ref_masks(ref) -> np.ndarray:
    return np.stack([e.unwrapped.action_masks() for e in ref.envs])


@pytest.mark.parametrize(
    ("mode", "kwargs"),
    [
        ("SameStep", {}),
        ("SameStep", {"reference": "running_max", "baseline": "full"}),
        ("SameStep", {"scenarios": "named", "split": "all", "noise": False}),
        ("NextStep", {"sim_step_s": 0.2}),
        ("SameStep", {"shield": True, "baseline": "full", "split": "validation"}),
        ("NextStep", {"shield": {"high": 0.6, "low": 0.3}}),
        # lost causes lapse after one interval over target and are pinned to the minimum
        ("SameStep", {"shield": {"give_up": 1, "retry": 3, "pin": True}, "split": "validation"}),
        # floors that protect nothing are probed down and let go
        (
            "SameStep",
            {"shield": {"probe": 2, "probe_share": 0.1, "miss_share": 0.02}, "split": "validation"},
        ),
        # two share levels: all-zero actions (the unpartitioned cache) come often
        ("SameStep", {"shield": True, "share_all": True, "share_levels": 2}),
    ],
)
def test_matches_single_envs_step_by_step(mode: str, kwargs: dict) -> None:
    n = 5
    vec, ref = _pair(n, mode, **kwargs)
    o1, i1 = vec.reset(seed=11)
    o2, i2 = ref.reset(seed=11)
    np.testing.assert_array_equal(o1, o2)
    _check_info_masks(i1, i2, n)
    assert list(i1["scenario"]) == [e.unwrapped._scenario_name for e in ref.envs]
    rng = np.random.default_rng(5)
    resets = 0
    restarting = np.zeros(n, dtype=bool)
    for _ in range(11):
        masks = vec.unwrapped.action_masks()
        np.testing.assert_array_equal(masks, _ref_masks(ref))
        a = _masked_actions(masks, vec.unwrapped.decoder.nvec, rng)
        obs, rew, term, trunc, info = vec.step(a)
        obs2, rew2, term2, trunc2, info2 = ref.step(a)
        _check_decision_info(info, info2, ref, skip=restarting | trunc)
        _check_info_masks(info, info2, n)
        restarting = trunc if mode == "NextStep" else np.zeros(n, dtype=bool)
        np.testing.assert_array_equal(obs, obs2)
        np.testing.assert_allclose(rew, rew2, rtol=1e-12, atol=1e-12)
        assert term.tolist() == term2.tolist() == [False] * n
        assert trunc.tolist() == trunc2.tolist()
        resets += bool(trunc.any())
        if mode == "SameStep":
            for i in np.flatnonzero(trunc):
                np.testing.assert_array_equal(info["final_obs"][i], info2["final_obs"][i])
    assert resets == 2
    vec.close()
    ref.close()


def _check_info_masks(info: dict, info2: dict, n: int) -> int:
    """Gymnasium's ``_key`` masks: one beside every key of the batched env's infos (nested
    dicts too), saying what the single envs' infos say of the keys both have (an env reset
    within the step has its reset's info; the ended episode's is under final_info).
    Returns how many masks were compared."""
    keys = {k for k in info if k[0] != "_"}
    # the decoder's repair notes are text the single env builds for each env; the batched
    # env leaves them out
    assert keys == {k for k in info2 if k[0] != "_"} - {"repairs"}
    compared = 0
    for key in keys:
        value, mask = info[key], info[f"_{key}"]
        assert mask.dtype == bool and mask.shape == (n,), key
        np.testing.assert_array_equal(mask, info2[f"_{key}"], err_msg=key)
        compared += 1
        if key in ("reward_terms", "final_info") and mask.any():
            compared += _check_info_masks(value, info2[key], n)
    assert compared >= 1
    return compared


def _check_decision_info(info: dict, info2: dict, ref, skip: np.ndarray) -> None:
    """The batched env's per-slot arrays of what the actions decoded to say what each single
    env's step info says per group (an env that restarted in the step reports its reset)."""
    checked = 0
    for i, env in enumerate(ref.envs):
        if skip[i]:
            continue
        assert info["time_s"][i] == info2["time_s"][i]
        for s, name in enumerate(env.unwrapped._slots):
            for key, absent in (("ways", 0), ("masks", 0), ("mb", np.nan)):
                said = info2[key].get(f"_{name}")  # which envs' dicts hold the group
                got = info[key][i, s]
                if said is None or not said[i]:
                    assert got == absent or (np.isnan(absent) and np.isnan(got)), (key, name)
                else:
                    assert got == info2[key][name][i], (key, name, got, info2[key][name][i])
                checked += 1
        assert info["shared"][i] == info2["shared"][i]
    assert checked or skip.all()


@pytest.mark.parametrize("mode", ["NextStep", "SameStep"])
def test_what_a_step_returns_is_the_callers_to_change(mode: str) -> None:
    """As SyncVectorEnv's: a caller changing the returned arrays in place (a done mask built
    into them, an info mask cleared) changes nothing in the env. Before, next_step mode kept
    the returned ``truncated`` as its envs to restart (cleared, they never restarted), and
    ``_scenario`` and ``_slots`` were one array."""
    vec, ref = _pair(2, mode, episode_steps=2)
    vec.reset(seed=0)
    ref.reset(seed=0)
    zero = np.zeros((2, 2 * vec.unwrapped.decoder.max_groups), dtype=np.int64)
    for _ in range(5):
        got, want = vec.step(zero), ref.step(zero)
        np.testing.assert_array_equal(got[0], want[0])
        assert got[3].tolist() == want[3].tolist()
        for _, _, terminated, truncated, info in (got, want):
            terminated |= truncated
            truncated[:] = False
            info["_scenario"][:] = False
        assert got[4]["_slots"].tolist() == want[4]["_slots"].tolist() == [True, True]
    vec.close()
    ref.close()


def test_an_ended_episodes_last_info_is_apart_from_the_steps_info() -> None:
    """Episodes ending apart (after a partial reset), a step's info has other envs' step
    values beside the ended episodes' under final_info: a caller changing the first changes
    nothing in the second, as in SyncVectorEnv's (they were the same arrays)."""
    vec, ref = _pair(2, "SameStep", episode_steps=2)
    zero = np.zeros((2, 2 * vec.unwrapped.decoder.max_groups), dtype=np.int64)
    for env in (vec, ref):
        env.reset(seed=0)
        env.step(zero)
        env.reset(options={"reset_mask": np.array([True, False])})
    got, want = vec.step(zero)[4], ref.step(zero)[4]
    assert got["_time_s"].tolist() == [True, False] and got["_final_info"].tolist() == [False, True]
    for key in ("time_s", "ways", "masks", "mb", "shared"):
        got[key][...] = -1
    got["reward_terms"]["total"][...] = -1
    ended, expected = got["final_info"], want["final_info"]
    assert ended["time_s"][1] == expected["time_s"][1] > 0
    assert ended["reward_terms"]["total"][1] == expected["reward_terms"]["total"][1] != -1
    assert (ended["ways"][1] >= 0).all() and (ended["masks"][1] >= 0).all()
    vec.close()
    ref.close()


PARTIAL_RESETS = [  # (steps before, seed, reset_mask): episodes then end at other steps
    (1, [None, 20, None, 21], [False, True, False, True]),
    (2, 30, [True, False, False, False]),
    (4, None, [False, False, True, False]),
]


@pytest.mark.parametrize(
    ("mode", "kwargs"),
    [
        ("SameStep", {}),
        ("NextStep", {"baseline": "equal"}),
        ("SameStep", {"shield": True, "reference": "running_max"}),
    ],
)
def test_partial_resets_match_single_envs_step_by_step(mode: str, kwargs: dict) -> None:
    """gymnasium's ``reset_mask`` option restarts the envs it marks (seeded as SyncVectorEnv
    seeds them), the others going on mid-episode, so episodes end at different steps after:
    the same observations, rewards, truncations and info masks as single envs. Before, the
    option was refused."""
    vec, ref = _pair(4, mode, episode_steps=3, **kwargs)
    vec.action_space.seed(0)
    for env in (vec, ref):
        env.reset(seed=7)
    staggered = 0
    for before, seed, mask in PARTIAL_RESETS:
        for _ in range(before):
            a = vec.action_space.sample()
            (obs, rew, _, trunc, info), want = vec.step(a), ref.step(a)
            np.testing.assert_array_equal(obs, want[0])
            np.testing.assert_allclose(rew, want[1], rtol=1e-12, atol=1e-12)
            assert trunc.tolist() == want[3].tolist()
            _check_info_masks(info, want[4], 4)
            staggered += bool(trunc.any() and not trunc.all())
        options = {"reset_mask": np.array(mask)}
        obs, info = vec.reset(seed=seed, options=options)
        want = ref.reset(seed=seed, options=dict(options))
        np.testing.assert_array_equal(obs, want[0])
        _check_info_masks(info, want[1], 4)
        assert vec.np_random_seed == ref.np_random_seed
    assert staggered >= 2
    vec.close()
    ref.close()


@pytest.mark.parametrize(
    ("mask", "message"),
    [
        ([True, False], "must be a numpy bool array of shape"),
        (np.array([1, 0]), "must be a numpy bool array of shape"),
        (np.array([True, False, True]), "must be a numpy bool array of shape"),
        (np.array([False, False]), "marks no env"),
        (np.array([True, False]), "the first reset starts every env"),
    ],
)
def test_a_reset_mask_that_cannot_be_used_is_refused_before_anything_moves(
    mask, message: str
) -> None:
    env = PartitionVectorEnv(2, **FAST, seed=3)
    with pytest.raises(ValueError, match=message):
        env.reset(options={"reset_mask": mask})
    assert env.batch is None and env.np_random_seed == (None, None)
    env.close()


def test_make_vec_returns_the_batched_env_declaring_its_autoreset() -> None:
    vec = gym.make_vec(envs.PARTITION_ID, num_envs=3, vectorization_mode="vector_entry_point")
    assert isinstance(vec.unwrapped, PartitionVectorEnv)
    assert vec.metadata["autoreset_mode"] is AutoresetMode.SAME_STEP
    assert vec.observation_space.shape == (3, vec.unwrapped.encoder.size)
    assert vec.action_space.shape == (3, 2 * vec.unwrapped.decoder.max_groups)
    obs, _ = vec.reset(seed=0)
    assert vec.single_observation_space.contains(obs[0])
    vec.close()


def test_seeding_reproduces_and_separates_trajectories() -> None:
    def run(seed, steps=6) -> np.ndarray:
        env = PartitionVectorEnv(3, **FAST)
        out = [env.reset(seed=seed)[0]]
        for k in range(steps):  # the same actions in every env
            a = np.zeros((3, 2 * env.decoder.max_groups), dtype=np.int64)
            a[:, : env.decoder.max_groups] = k % env.decoder.share_levels
            out.append(env.step(a)[0])
        return np.stack(out)

    same = run(4)
    np.testing.assert_array_equal(same, run(4))
    np.testing.assert_array_equal(same, run(np.int64(4)))  # a numpy integer seeds alike
    np.testing.assert_array_equal(same[:, 1], run([5, 5, 6])[:, 0])  # env i is seed + i
    assert not np.array_equal(same, run(5))


@pytest.mark.parametrize(("seeds", "used"), [([None, None], (5, 6)), ([None, 9], (5, 9))])
def test_a_first_reset_seeds_the_envs_given_none_from_the_seed_kwarg(seeds, used) -> None:
    """As a single env made with a seed, whose first reset(seed=None) takes it: an env whose
    seed in the list is None takes the constructor's (env i: seed + i). Before, they drew
    fresh entropy."""
    env = PartitionVectorEnv(2, **FAST, seed=5)
    obs = env.reset(seed=seeds)[0]
    assert env.np_random_seed == used
    again = PartitionVectorEnv(2, **FAST)
    np.testing.assert_array_equal(obs, again.reset(seed=list(used))[0])
    env.close()
    again.close()


def test_a_seeded_first_reset_uses_up_the_seed_kwarg() -> None:
    """As the single env: the constructor's seed is the first reset's, seeded or not."""
    names = []
    for kwargs in ({"seed": 5}, {}):
        env = PartitionVectorEnv(2, **FAST, **kwargs)
        env.reset(seed=7)
        names.append([list(env.reset()[1]["scenario"]) for _ in range(2)])
        env.close()
    assert names[0] == names[1]


def test_autoreset_starts_a_fresh_episode_in_the_same_step() -> None:
    env = PartitionVectorEnv(2, **{**FAST, "episode_steps": 2})
    env.reset(seed=1)
    zero = np.zeros((2, 2 * env.decoder.max_groups), dtype=np.int64)
    env.step(zero)
    names = list(env.scenario_names)  # the episodes about to end
    obs, _, _, trunc, info = env.step(zero)
    assert trunc.all() and info["_final_obs"].all()
    # as gymnasium's same-step autoreset: the ended episodes' info under final_info
    ended = info["final_info"]
    assert info["_final_info"].all() and ended["_scenario"].all()
    assert list(ended["scenario"]) == names and "reward_terms" in ended
    # The observation after truncation is the next episode's first: what a single env
    # with the same generator state gives on reset.
    single = envs.partition.PartitionEnv(**{**FAST, "episode_steps": 2})
    single.reset(seed=1)
    single.step(zero[0])
    single.step(zero[0])
    np.testing.assert_array_equal(obs[0], single.reset()[0])
    assert not np.array_equal(obs[0], info["final_obs"][0])


def test_bad_actions_are_refused_with_a_clear_error() -> None:
    env = PartitionVectorEnv(2, **FAST)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="shape"):
        env.step(np.zeros(2 * env.decoder.max_groups, dtype=np.int64))
    bad = np.zeros((2, 2 * env.decoder.max_groups), dtype=np.int64)
    bad[1, 0] = env.decoder.share_levels
    with pytest.raises(ValueError, match="outside"):
        env.step(bad)
    huge = np.zeros((2, 2 * env.decoder.max_groups), dtype=np.uint64)
    huge[0, 0] = 2**63  # named as given, not wrapped to a negative int64
    with pytest.raises(ValueError, match=r"action \[9223372036854775808, 0"):
        env.step(huge)
    with pytest.raises(ValueError, match="must be integers"):
        env.step(np.full((2, 2 * env.decoder.max_groups), 0.5))
    with pytest.raises(ValueError, match="autoreset_mode"):
        PartitionVectorEnv(2, autoreset_mode="disabled")


@pytest.mark.parametrize("dtype", [bool, np.int8, np.uint16])
def test_actions_of_any_dtype_the_space_contains_are_taken(dtype) -> None:
    # gymnasium's MultiDiscrete contains what casts to its dtype (bools too), and the
    # single env takes them; the same levels as int64 give the same step
    envs_ = [PartitionVectorEnv(2, **FAST) for _ in range(2)]
    levels = np.ones((2, 2 * envs_[0].decoder.max_groups), dtype=np.int64)
    assert envs_[0].action_space.contains(levels.astype(dtype))
    steps = []
    for env, a in zip(envs_, (levels, levels.astype(dtype)), strict=True):
        env.reset(seed=4)
        steps.append(env.step(a))
        env.close()
    np.testing.assert_array_equal(steps[0][0], steps[1][0])
    np.testing.assert_array_equal(steps[0][1], steps[1][1])


def test_actions_for_another_number_of_envs_are_refused_before_anything_moves() -> None:
    """Before, a numpy broadcast error, after a next_step env had already restarted the
    envs whose episodes ended: a retried step then drew other scenarios."""
    runs = []
    for bad_first in (False, True):
        env = PartitionVectorEnv(3, **{**FAST, "episode_steps": 1}, autoreset_mode="next_step")
        env.reset(seed=2)
        zero = np.zeros((3, 2 * env.decoder.max_groups), dtype=np.int64)
        env.step(zero)  # every episode ends: the next step restarts them
        if bad_first:
            with pytest.raises(ValueError, match="actions for 2 envs; this vector env has 3"):
                env.step(zero[:2])
        runs.append(env.step(zero)[0])
        env.close()
    np.testing.assert_array_equal(runs[0], runs[1])


def test_sb3_adapter_matches_dummy_vec_env_of_single_envs() -> None:
    from stable_baselines3.common.vec_env import DummyVecEnv

    n = 3
    ours = sb3_vector_env(PartitionVectorEnv(n, **FAST))
    theirs = DummyVecEnv([lambda: envs.partition.PartitionEnv(**FAST) for _ in range(n)])
    for v in (ours, theirs):
        v.seed(21)
    np.testing.assert_array_equal(ours.reset(), theirs.reset())
    _assert_same_reset_infos(ours.reset_infos, theirs.reset_infos)
    rng = np.random.default_rng(3)
    for _ in range(9):
        masks = np.stack(ours.env_method("action_masks"))
        np.testing.assert_array_equal(masks, np.stack(theirs.env_method("action_masks")))
        a = _masked_actions(masks, ours.get_attr("decoder")[0].nvec, rng)
        o1, r1, d1, i1 = ours.step(a)
        o2, r2, d2, i2 = theirs.step(a)
        np.testing.assert_array_equal(o1, o2)
        np.testing.assert_allclose(r1, r2, rtol=1e-6)
        assert d1.tolist() == d2.tolist()
        for k in np.flatnonzero(d1):
            np.testing.assert_array_equal(
                i1[k]["terminal_observation"], i2[k]["terminal_observation"]
            )
            assert i1[k]["TimeLimit.truncated"] == i2[k]["TimeLimit.truncated"]
        # every env's info as DummyVecEnv's envs give it (the step's, the ended episode's
        # on a done step), and the new episode's reset info
        for mine, single in zip(i1, i2, strict=True):
            _assert_same_info(mine, single)
        _assert_same_reset_infos(ours.reset_infos, theirs.reset_infos)
    assert ours.get_attr("observation_space") == theirs.get_attr("observation_space")
    assert ours.get_attr("action_space") == theirs.get_attr("action_space")


def _assert_same_reset_infos(mine: list[dict], single: list[dict]) -> None:
    for got, want in zip(mine, single, strict=True):
        assert got.keys() == want.keys()
        assert (got["scenario"], got["slots"]) == (want["scenario"], want["slots"])
        assert got["encoder_version"] == want["encoder_version"]
        np.testing.assert_array_equal(got["action_mask"], want["action_mask"])


def _assert_same_info(mine: dict, single: dict) -> None:
    """``mine`` (the vector env's, per slot) says what ``single`` (one env's, per group
    name) says: the reward terms (a single env's None a NaN here), the scenario, and each
    slot's ways, mask and MB (NaN where the group has none, a slot with no group empty)."""
    assert set(mine) == set(single) - {"repairs"}  # the decoder's notes: text, left out
    assert mine["scenario"] == single["scenario"] and mine["time_s"] == single["time_s"]
    assert mine["slots"] == list(single["slots"])
    assert mine["shared"] == single["shared"]
    terms = mine["reward_terms"]
    assert terms.keys() == single["reward_terms"].keys()
    for key, value in terms.items():
        want = single["reward_terms"][key]
        np.testing.assert_allclose(value, np.nan if want is None else want, rtol=1e-6)
    for key in ("ways", "masks", "mb"):
        for slot, group in enumerate(single["slots"]):
            want = single[key].get(group)
            np.testing.assert_allclose(mine[key][slot], np.nan if want is None else want)


def test_sb3_adapter_never_applies_to_some_envs_what_acts_on_all() -> None:
    """Before, ``indices`` were ignored: resetting env 1 reset all three mid-episode (with no
    done flags for SB3), setting an attribute of env 0 set it for all, and each env's reset
    options became env 0's."""
    ours = sb3_vector_env(PartitionVectorEnv(3, **FAST))
    ours.seed(0)
    ours.reset()
    names = ours.venv.scenario_names
    assert ours.get_attr("scenario_names", indices=[1]) == [names[1]]
    assert ours.get_attr("episode_steps") == [FAST["episode_steps"]] * 3
    with pytest.raises(ValueError, match=r"env_method\('reset'\): .* not to \[1\]"):
        ours.env_method("reset", indices=[1])
    with pytest.raises(ValueError, match=r"set_attr\('episode_steps'\)"):
        ours.set_attr("episode_steps", 1, indices=[0])
    ours.set_attr("episode_steps", 2)  # every env: allowed
    assert ours.venv.episode_steps == 2
    with pytest.raises(ValueError, match="one set of reset options for all its envs"):
        ours.set_options([{"baseline": "equal"}, {"baseline": "full"}, {}])
    ours.reset()  # the refused options were not kept
    ours.set_options({"baseline": "full"})  # one for all
    ours.reset()
    ours.close()


def test_the_scenario_reset_option_runs_it_in_every_env_as_the_single_env() -> None:
    env = PartitionVectorEnv(2, **FAST)
    obs, info = env.reset(seed=3, options={"scenario": "default"})
    assert list(info["scenario"]) == ["default", "default"]
    for i in range(2):
        single = envs.partition.PartitionEnv(**FAST)
        want, _ = single.reset(seed=3 + i, options={"scenario": "default"})
        np.testing.assert_array_equal(obs[i], want)
        single.close()
    with pytest.raises(ValueError, match=r"unknown reset options \['colour'\]; have baseline"):
        env.reset(options={"colour": "red"})
    env.close()
    small = PartitionVectorEnv(2, **FAST, scenarios=["default"], split="all")
    with pytest.raises(ValueError, match=r"scenario .*: .* workloads on .* ways; this vector"):
        small.reset(options={"scenario": "sixteen_groups"})  # larger than its batch holds
    small.close()


def test_get_attr_and_set_attr_as_sync_vector_env() -> None:
    env = PartitionVectorEnv(3, **FAST)
    env.reset(seed=0)
    assert env.get_attr("episode_steps") == (FAST["episode_steps"],) * 3
    assert env.get_attr("scenario_names") == tuple(env.scenario_names)  # each env's own
    env.set_attr("episode_steps", 2)
    env.set_attr("episode_steps", [5, 5, 5])  # one per env, all alike
    assert env.episode_steps == 5
    for values in ([2, 3, 2], []):
        with pytest.raises(ValueError, match=r"set_attr\('episode_steps'\): .* share it"):
            env.set_attr("episode_steps", values)
    assert env.episode_steps == 5
    env.close()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("autoreset_mode", "next_step"),  # before: episodes never restarted again
        ("autoreset_mode", AutoresetMode.NEXT_STEP),  # before: metadata still said same_step
        ("num_envs", 3),
        ("metadata", {}),
        ("single_observation_space", None),
        ("encoder", None),
        ("_steps", np.zeros(2, dtype=np.int64)),
        ("baseline", "bogus"),  # before: autoresets started from the full cache instead
    ],
)
@pytest.mark.parametrize("via", ["vector", "sb3"])
def test_set_attr_refuses_what_would_break_the_env_silently(name: str, value, via: str) -> None:
    """SyncVectorEnv's set_attr sets its single envs' attributes, never its own make-up, and
    a single env refuses a bad baseline at its (auto)reset: the batched env, which holds
    both, refuses them up front and keeps autoresetting as before."""
    env = PartitionVectorEnv(2, **{**FAST, "episode_steps": 2})
    target = sb3_vector_env(env) if via == "sb3" else env
    env.reset(seed=0)
    with pytest.raises(ValueError, match=name):
        target.set_attr(name, value)
    assert env.metadata["autoreset_mode"] is env.autoreset_mode is AutoresetMode.SAME_STEP
    assert env.baseline == "current"
    zero = np.zeros((2, 2 * env.decoder.max_groups), dtype=np.int64)
    for _ in range(2):
        obs, _, _, trunc, info = env.step(zero)
    assert trunc.all() and info["_final_obs"].all() and (env._steps == 0).all()
    assert env.observation_space.contains(obs)
    env.close()


def test_get_attr_call_and_seeds_answer_as_sync_vector_env() -> None:
    """One env's spaces and metadata (before: the batch's), each env's generator and seed
    (before: a seed the reset never used), and ``call`` (before: missing)."""
    vec, ref = _pair(2, "SameStep")
    vec.reset(seed=0)
    ref.reset(seed=0)
    for name in ("observation_space", "action_space", "metadata", "np_random_seed"):
        assert vec.get_attr(name) == ref.get_attr(name), name
    assert vec.np_random_seed == ref.np_random_seed == (0, 1)
    draws = [[g.random() for g in env.np_random] for env in (vec, ref)]
    assert draws[0] == draws[1]  # each env's own stream, in the same state
    masks = vec.call("action_masks")
    assert len(masks) == 2
    np.testing.assert_array_equal(np.stack(masks), _ref_masks(ref))
    assert vec.call("episode_steps") == ref.call("episode_steps")  # an attribute, per env
    vec.close()
    ref.close()


@pytest.mark.parametrize(
    ("seeds", "error", "message"),
    [
        ([1], ValueError, "1 seeds for 2 envs"),
        # refused by gymnasium's seeding at env 1: before, env 0 had already taken seed 1
        ([1, -1], gym.error.Error, "greater or equal to zero"),
        ([1, 2.5], gym.error.Error, "must be a python integer"),
    ],
)
def test_a_reset_refused_for_its_seeds_leaves_the_seed_kwarg_for_the_next(
    seeds: list, error: type, message: str
) -> None:
    names = []
    for refuse_first in (False, True):
        env = PartitionVectorEnv(2, **FAST, seed=5)
        if refuse_first:
            with pytest.raises(error, match=message):
                env.reset(seed=seeds)
            assert env.np_random_seed == (None, None)  # no env took a seed
        names.append(list(env.reset()[1]["scenario"]))
        assert env.np_random_seed == (5, 6)
        env.close()
    assert names[0] == names[1]


def test_sb3_adapter_keeps_a_wrappers_episode_statistics_in_the_done_steps_info() -> None:
    """RecordEpisodeStatistics puts the ended episode's ``episode`` at the top of the
    infos, beside the new episode's reset info: it belongs to the done step's info, where
    SB3 logs it from (before, it went to ``reset_infos`` and PPO logged no episode)."""
    from gymnasium.wrappers.vector import RecordEpisodeStatistics

    ours = sb3_vector_env(RecordEpisodeStatistics(PartitionVectorEnv(2, **FAST)))
    ours.seed(0)
    ours.reset()
    zero = np.zeros((2, len(ours.action_space.nvec)), dtype=np.int64)
    returns = np.zeros(2)
    for _ in range(FAST["episode_steps"]):
        _, rewards, dones, infos = ours.step(zero)
        returns += rewards
    assert dones.all()
    for info, reset_info, ret in zip(infos, ours.reset_infos, returns, strict=True):
        assert info["episode"]["l"] == FAST["episode_steps"]
        np.testing.assert_allclose(info["episode"]["r"], ret, rtol=1e-5)
        assert "reward_terms" in info and "terminal_observation" in info
        assert "episode" not in reset_info and "action_mask" in reset_info
    ours.close()


def test_sb3_adapter_refuses_a_vector_env_that_is_not_the_batched_one() -> None:
    sync = gym.make_vec(
        envs.PARTITION_ID,
        num_envs=2,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
        **FAST,
    )
    with pytest.raises(TypeError, match="not SyncVectorEnv; for copies of a single env use"):
        sb3_vector_env(sync)
    sync.close()


def test_sb3_adapter_over_a_gymnasium_vector_wrapper_reaches_the_env() -> None:
    """MaskablePPO's masks, attributes and set_attr through RecordEpisodeStatistics (which
    passes none of them on): before, action_masks raised and set_attr set the wrapper's."""
    from gymnasium.wrappers.vector import RecordEpisodeStatistics

    env = PartitionVectorEnv(2, **FAST)
    ours = sb3_vector_env(RecordEpisodeStatistics(env))
    ours.seed(0)
    ours.reset()
    masks = ours.env_method("action_masks")
    np.testing.assert_array_equal(np.stack(masks), env.action_masks())
    assert ours.get_attr("scenario_names") == list(env.scenario_names)
    ours.set_attr("episode_steps", 2)
    assert env.episode_steps == 2
    ours.close()


@pytest.mark.parametrize("limit", [3, 200, -1])
def test_max_episode_steps_ends_episodes_as_in_the_other_modes(limit: int) -> None:
    """gymnasium applies ``max_episode_steps`` with a TimeLimit in its sync and async modes;
    the batched env took it and truncated at ``episode_steps`` (64) whatever it said. -1 is
    gymnasium's "no TimeLimit" (the batched env refused it)."""
    lengths = {}
    for mode in ("vector_entry_point", "sync"):
        env = gym.make_vec(
            envs.PARTITION_ID,
            num_envs=2,
            vectorization_mode=mode,
            max_episode_steps=limit,
            episode_steps=5,
            interval_s=0.5,
        )
        env.reset(seed=0)
        zero = np.zeros(env.action_space.shape, dtype=np.int64)
        for step in range(1, 10):
            if env.step(zero)[3].any():
                lengths[mode] = step
                break
        env.close()
    end = 5 if limit == -1 else min(limit, 5)
    assert lengths == {"vector_entry_point": end, "sync": end}


def test_maskable_ppo_learns_on_the_batched_env() -> None:
    from sb3_contrib import MaskablePPO

    venv = make_batched_vec_env(4, seed=0, **FAST)
    model = MaskablePPO("MlpPolicy", venv, n_steps=8, batch_size=16, n_epochs=1, seed=0)
    model.learn(total_timesteps=64)
    assert model.num_timesteps == 64
    assert len(model.ep_info_buffer) > 0  # VecMonitor's episode statistics
    venv.close()
