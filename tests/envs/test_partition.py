"""Partition-v0: the checkers, seeding, configuration, scenario families and rendering."""

from __future__ import annotations

import re

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import given, settings
from hypothesis import strategies as st
from stable_baselines3.common.env_checker import check_env as sb3_check_env

import envs
from agent.sim import SimNode, random_scenario
from agent.sim.scenario import get_scenario
from agent.validate import PlanContext, validate_plan
from envs.partition import NodePartitionEnv, PartitionEnv
from envs.scenarios import (
    SPLITS,
    TEST_FRACTION,
    VALIDATION_FRACTION,
    ScenarioFamily,
    group_count,
    spec_key,
    split_of,
)
from envs.vector_env import PartitionVectorEnv
from tests.envs.conftest import FAST


def test_ids_are_registered_on_import() -> None:
    assert envs.PARTITION_ID in gym.registry and envs.REMOTE_PARTITION_ID in gym.registry
    env = gym.make("envs:rdtune/Partition-v0", episode_steps=2)
    assert isinstance(env.unwrapped, PartitionEnv)
    env.close()


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"preset": "e5_2683v4"}, {"scenarios": "named", "reference": "running_max"}],
    ids=["random", "no-mba-preset", "named-running-max"],
)
def test_gymnasium_and_sb3_checkers_pass(make_env, kwargs) -> None:
    env = make_env(**kwargs)
    check_env(env.unwrapped, skip_render_check=False)
    sb3_check_env(env.unwrapped, warn=True)


def _rollout(env, seed: int, steps: int = 5):
    obs, info = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    out = [(obs.copy(), 0.0, info["scenario"])]
    for _ in range(steps):
        action = rng.integers(0, env.action_space.nvec)
        obs, reward, _, _, info = env.step(action)
        out.append((obs.copy(), reward, info["scenario"]))
    return out


def test_same_seed_same_trajectory(make_env) -> None:
    a = _rollout(make_env(), seed=11)
    b = _rollout(make_env(), seed=11)
    c = _rollout(make_env(), seed=12)
    for (oa, ra, sa), (ob, rb, sb) in zip(a, b, strict=True):
        assert sa == sb and ra == rb and np.array_equal(oa, ob)
    assert a[0][2] != c[0][2] or not np.array_equal(a[1][0], c[1][0])


def test_seed_kwarg_seeds_the_first_reset(make_env) -> None:
    a, b = make_env(seed=5), make_env()
    oa, ia = a.reset()
    ob, ib = b.reset(seed=5)
    assert ia["scenario"] == ib["scenario"] and np.array_equal(oa, ob)


def test_a_seeded_first_reset_uses_up_the_seed_kwarg(make_env) -> None:
    """reset(seed=7), then reset(): the stream seed 7 started goes on. Before, the second
    reset took the constructor's seed, so the copies of a vector env seeded s + i at their
    first reset all restarted on the constructor's scenario at their first autoreset."""
    a, b = make_env(seed=5), make_env()
    scenarios = []
    for env in (a, b):
        env.reset(seed=7)
        scenarios.append([env.reset()[1]["scenario"] for _ in range(3)])
    assert scenarios[0] == scenarios[1]


def test_episode_truncates_after_episode_steps(make_env) -> None:
    env = make_env(episode_steps=3)
    env.reset(seed=0)
    flags = [env.step(env.action_space.sample())[3] for _ in range(3)]
    assert flags == [False, False, True]


def test_each_step_applies_the_decoded_valid_plan(make_env) -> None:
    env = make_env(scenarios=["default"], split="all")
    env.reset(seed=3)
    base = env.unwrapped
    action = np.zeros(base.action_space.shape, dtype=np.int64)
    action[0] = 7  # the LC group (slot 0) gets the largest share
    action[base.decoder.max_groups] = 9  # and full bandwidth
    _, _, _, _, info = env.step(action)
    held = base.held_allocation
    node = base.node
    assert held == node.allocation()
    validate_plan(held.as_plan(), PlanContext(caps=node.capabilities(), current=held))
    lc = base.slots[0]
    assert base.group_specs[lc].kind.value == "lc"
    assert info["ways"][lc] == max(info["ways"].values()) and info["mb"][lc] == 100
    assert held.get(lc, 0).l3_mask == info["masks"][lc]


def test_info_reports_reward_terms_and_repairs(make_env) -> None:
    env = make_env()
    env.reset(seed=2)
    _, reward, _, _, info = env.step(env.action_space.sample())
    terms = info["reward_terms"]
    assert {"slo", "fairness", "throughput", "change", "total"} <= set(terms)
    assert reward == pytest.approx(
        terms["slo"] + terms["fairness"] + terms["throughput"] + terms["change"]
    )
    assert isinstance(info["repairs"], tuple)


@pytest.mark.parametrize("vectorised", [False, True])
def test_a_caller_changing_the_infos_slots_changes_nothing_of_the_env(vectorised) -> None:
    """The slot names an info hands out are the caller's: they were the env's own list."""
    kw = {"scenarios": ["default"], "split": "all", **FAST}
    if vectorised:
        mode = "vector_entry_point"
        env = gym.make_vec(envs.PARTITION_ID, num_envs=2, vectorization_mode=mode, **kw)
    else:
        env = gym.make(envs.PARTITION_ID, **kw)

    def slots(info: dict) -> list[str]:
        return info["slots"][0] if vectorised else info["slots"]

    want = list(slots(env.reset(seed=0)[1]))
    for _ in range(2):
        info = env.step(env.action_space.sample())[4]
        assert slots(info) == want
        slots(info).reverse()
        slots(info).append("caller's")
    if not vectorised:
        assert env.unwrapped.slots == want
    env.close()


def test_action_masks_follow_present_groups(make_env) -> None:
    env = make_env(scenarios=["default"], split="all")
    _, info = env.reset(seed=0)
    base = env.unwrapped
    mask = base.action_masks()
    assert np.array_equal(mask, info["action_mask"])
    n = len(base.slots)
    share = mask[: base.decoder.max_groups * base.decoder.share_levels].reshape(8, -1)
    assert share[:n].all() and not share[n:, 1:].any()


def test_ansi_render_shows_allocation_and_metrics(make_env) -> None:
    env = make_env(scenarios=["default"], split="all", render_mode="ansi")
    env.reset(seed=0)
    env.step(env.action_space.sample())
    text = env.render()
    assert "memcached" in text and "[" in text and "MB=" in text and "reward=" in text
    assert "SLO" in text and "slowdown=" in text
    assert gym.make(envs.PARTITION_ID).unwrapped.render_text() == "(not reset)\n"


def test_rgb_render_draws_each_groups_ways_and_bandwidth(make_env) -> None:
    env = make_env(scenarios=["default"], split="all", render_mode="rgb_array")
    check_env(env.unwrapped, skip_render_check=False)
    env.reset(seed=0)
    base = env.unwrapped
    first = env.render()
    assert first.dtype == np.uint8 and first.ndim == 3 and first.shape[2] == 3
    cell, ways = 8, base.capabilities.l3.num_ways
    domain = base.capabilities.domains[0]
    for row, name in enumerate(base.slots):
        held = base.held_allocation.get(name, domain)
        # the pixel in the middle of each way's cell is lit exactly where the mask has it
        centre = first[row * cell + cell // 2, [w * cell + cell // 2 for w in range(ways)]]
        lit = (centre != 64).any(axis=1)
        assert lit.tolist() == [bool(held.l3_mask >> w & 1) for w in range(ways)], name
    action = np.zeros_like(env.action_space.nvec)  # the smallest share for every slot
    env.step(action)
    assert not np.array_equal(env.render(), first)


def test_sb3_make_vec_env_makes_the_registered_id() -> None:
    """SB3's make_vec_env asks gym.make for render_mode="rgb_array" unless told otherwise."""
    from stable_baselines3.common.env_util import make_vec_env

    venv = make_vec_env(envs.PARTITION_ID, n_envs=2, seed=0, env_kwargs={"episode_steps": 3})
    try:
        obs = venv.reset()
        assert obs.shape == (2, *venv.observation_space.shape)
        _, rewards, _, _ = venv.step(np.stack([venv.action_space.sample()] * 2))
        assert rewards.shape == (2,) and np.isfinite(rewards).all()
        frames = venv.get_images()
        assert len(frames) == 2 and all(f.ndim == 3 for f in frames)
    finally:
        venv.close()


def test_reset_options_pick_scenario_and_baseline(make_env) -> None:
    env = make_env()
    _, info = env.reset(seed=0, options={"scenario": "copart_h_llc", "baseline": "full"})
    assert info["scenario"] == "copart_h_llc"
    held = env.unwrapped.held_allocation
    assert {held.get(g, 0).l3_mask for g in held} == {env.unwrapped.capabilities.l3.cbm_mask}
    with pytest.raises(ValueError, match="unknown reset options"):
        env.reset(options={"nope": 1})


def _reset_to(vectorised: bool, scenario: str, **kwargs) -> tuple[str, str]:
    """(the scenario's name, the machine it ran on) after a reset to ``scenario``."""
    if vectorised:
        env = PartitionVectorEnv(2, **FAST, **kwargs)
        info = env.reset(seed=0, options={"scenario": scenario})[1]
        ran = env.batch.presets()[0].name, info["scenario"][0]
    else:
        env = PartitionEnv(**FAST, **kwargs)
        info = env.reset(seed=0, options={"scenario": scenario})[1]
        ran = env.node.preset.name, info["scenario"]
    env.close()
    return ran


@pytest.mark.parametrize("vectorised", [False, True])
def test_the_scenario_reset_option_runs_on_the_envs_preset(vectorised) -> None:
    """The constructor's preset is every scenario's machine, a reset's choice too."""
    assert split_of(get_scenario("default").with_machine("e5_2683v4")) == "train"
    assert get_scenario("default").machine != "e5_2683v4"
    assert _reset_to(vectorised, "default", preset="e5_2683v4") == ("e5_2683v4", "default")


@pytest.mark.parametrize("vectorised", [False, True])
@pytest.mark.parametrize(
    ("split", "allowed"), [("train", False), ("validation", False), ("test", True), ("all", True)]
)
def test_the_scenario_reset_option_keeps_to_the_envs_split(vectorised, split, allowed) -> None:
    """A held-out mix is refused on a train (or validation) env: nothing trains or selects
    on the test split."""
    assert split_of(get_scenario("copart_is")) == "test"
    if allowed:
        assert _reset_to(vectorised, "copart_is", split=split)[1] == "copart_is"
    else:
        problem = f"scenario copart_is is in the 'test' split, not this env's '{split}'"
        with pytest.raises(ValueError, match=problem):
            _reset_to(vectorised, "copart_is", split=split)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"scenarios": "everything"}, "scenarios must be one of"),
        ({"split": "holdout"}, "split must be one of"),
        ({"preset": "no_such_cpu"}, "no_such_cpu"),
        ({"reference": "oracle"}, "reference must be one of"),
        ({"baseline": "random"}, "baseline must be one of"),
        ({"interval_s": 0}, "interval_s must be a positive"),
        ({"episode_steps": 0}, "episode_steps"),
        ({"reward_weights": {"slo": -1}}, "reward weight slo"),
        ({"reward_weights": {"speed": 1}}, "unknown reward weights"),
        ({"max_groups": 0}, "max_groups"),
        ({"render_mode": "human"}, "render_mode|does not render"),
        # True is an int to Python; bool("false") is True (noise was turned on)
        ({"max_groups": True}, "max_groups must be an integer in .1, 4096., got True"),
        ({"max_groups": 100_000}, "max_groups must be an integer in .1, 4096."),  # 3 s a step
        ({"sim_step_s": 1e-9}, "sim_step_s must be at least 0.001 s"),  # minutes a reset
        ({"share_levels": True}, "share_levels must be a positive integer, got True"),
        ({"episode_steps": True}, "episode_steps must be a positive integer, got True"),
        ({"interval_s": True}, "interval_s must be a positive number, got True"),
        ({"noise": "false"}, "noise must be true or false, got 'false'"),
    ],
)
@pytest.mark.parametrize("vectorised", [False, True], ids=["single", "vector"])
def test_bad_configuration_is_rejected_clearly(kwargs, match, vectorised) -> None:
    from envs.vector_env import PartitionVectorEnv

    with pytest.raises(Exception, match=match):
        PartitionVectorEnv(2, **kwargs) if vectorised else PartitionEnv(**kwargs)


def test_step_before_reset_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="reset"):
        PartitionEnv().step(np.zeros(16, dtype=np.int64))


def test_a_step_after_close_or_of_a_batch_shaped_action_is_refused() -> None:
    """Before, a (1, 16) or (2, 8) action was flattened and taken, and stepping a closed env
    went on."""
    env = PartitionEnv(episode_steps=4)
    env.reset(seed=0)
    for shape in ((1, 16), (2, 8)):
        with pytest.raises(ValueError, match=re.escape(f"action of shape {shape}; expected (16,)")):
            env.step(np.zeros(shape, dtype=np.int64))
    env.step(np.zeros(16, dtype=np.int64))  # still usable
    env.close()
    with pytest.raises(RuntimeError, match="reset"):
        env.step(np.zeros(16, dtype=np.int64))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one"),
        ({"node": "abc"}, "node must be a Node"),  # was an AttributeError at reset
        ({"address": "127.0.0.1:1", "timeout": -1}, "timeout must be a positive number"),
        ({"address": "127.0.0.1:1", "use_clock": "no"}, "use_clock must be true or false"),
        # before, every snapshot had interval_s 0 and every reward after the first was 0
        ({"node": SimNode("default"), "use_clock": False}, "nothing would advance its time"),
    ],
)
def test_remote_env_refuses_what_it_cannot_use(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        NodePartitionEnv(**kwargs)


# ------------------------------------------------------------------ scenario families


def test_named_splits_are_disjoint_and_cover_the_library() -> None:
    pools = {split: ScenarioFamily("named", split).pool for split in ("train", "test")}
    try:
        pools["validation"] = ScenarioFamily("named", "validation").pool
    except ValueError:  # no library scenario may hash into the (small) validation band
        pools["validation"] = []
    every = ScenarioFamily("named", "all").pool
    assert pools["train"] and pools["test"]
    keys = {split: {spec_key(s) for s in pool} for split, pool in pools.items()}
    assert not keys["train"] & keys["test"]
    assert not keys["validation"] & (keys["train"] | keys["test"])
    assert sum(len(p) for p in pools.values()) == len(every)
    assert all(len({w.group_name for w in s.workloads}) <= 8 for s in every)


def test_generator_families_are_disjoint_by_spec_hash() -> None:
    rng = np.random.default_rng(0)
    for split in ("test", "validation", "train"):
        fam = ScenarioFamily("random", split)
        assert all(split_of(fam.draw(rng)) == split for _ in range(15))


def test_split_bands_of_the_hash_space() -> None:
    """test is the first 20% of the hash space, validation the next 10%, train the rest."""
    rng = np.random.default_rng(3)
    draws = [random_scenario(int(rng.integers(2**31 - 1))) for _ in range(400)]
    share = {s: sum(split_of(d) == s for d in draws) / len(draws) for s in SPLITS[:3]}
    assert share["test"] == pytest.approx(TEST_FRACTION, abs=0.06)
    assert share["validation"] == pytest.approx(VALIDATION_FRACTION, abs=0.05)
    assert split_of(draws[0], 0.0001, 0.0) == "train"
    assert split_of(draws[0], 0.0001, 0.9998) == "validation"


def test_generator_families_can_be_narrowed() -> None:
    rng = np.random.default_rng(2)
    fam = ScenarioFamily("random", "test", max_lc=3, min_lc=1, max_workloads=4)
    for _ in range(10):
        scn = fam.draw(rng)
        assert 1 <= sum(w.load is not None for w in scn.workloads) <= 3
        assert len(scn.workloads) <= 4


@pytest.mark.parametrize("max_groups", [2, 4])
def test_generator_draws_fit_the_slots(max_groups) -> None:
    """Groups beyond max_groups would keep every way, outside the policy's control."""
    fam = ScenarioFamily("random", "train", max_groups=max_groups)
    rng = np.random.default_rng(0)
    assert all(group_count(fam.draw(rng)) <= max_groups for _ in range(30))


def test_the_default_max_groups_rejects_no_generator_draw() -> None:
    """The generator's largest mixes fit 8 slots: the defaults draw what they drew before
    draws were checked against max_groups (the splits' mixes are unchanged)."""
    for split in ("train", "test"):
        a, b = np.random.default_rng(5), np.random.default_rng(5)
        fits = ScenarioFamily("random", split)
        unbounded = ScenarioFamily("random", split, max_groups=10**6)
        assert [fits.draw(a).name for _ in range(40)] == [unbounded.draw(b).name for _ in range(40)]


def test_split_ignores_the_name() -> None:
    a = random_scenario(4)
    b = type(a)(name="renamed", machine=a.machine, workloads=a.workloads)
    assert spec_key(a) == spec_key(b) and split_of(a) == split_of(b)


@pytest.mark.parametrize("spelling", ["reordered", "renamed", "default threads spelt out"])
def test_a_library_mix_in_another_spelling_is_refused_where_its_split_differs(spelling) -> None:
    """The split hashes the workloads in the order listed, by their group names: copart_is
    (test) listed in reverse, or with its instances named otherwise, hashed to train, and a
    train env took it. The mix itself (mix_key) is the library's, so it is refused, naming
    the library scenario and its split."""
    import dataclasses

    from envs.scenarios import mix_key

    lib = get_scenario("copart_is")
    if spelling == "reordered":
        ws = tuple(reversed(lib.workloads))
    elif spelling == "renamed":
        ws = tuple(dataclasses.replace(w, name=w.name + "a", group=w.group and w.group + "a")
                   for w in lib.workloads)  # fmt: skip
    else:
        cat = lib.catalog
        ws = tuple(dataclasses.replace(w, threads=w.threads or cat.workload(w.workload).threads)
                   for w in lib.workloads)  # fmt: skip
    twin = dataclasses.replace(lib, name="twin", workloads=ws)
    assert mix_key(twin) == mix_key(lib) and split_of(lib) == "test"
    if split_of(twin) == "test":  # hashed as the library's: the split rule keeps it apart
        assert [s.name for s in ScenarioFamily([twin], "test").pool] == ["twin"]
        with pytest.raises(ValueError, match="is in the 'train' split"):
            ScenarioFamily([twin], "train")
        return
    for split in ("train", "validation", "test"):
        with pytest.raises(ValueError, match="is library scenario copart_is's mix"):
            ScenarioFamily([twin], split)
        with pytest.raises(ValueError, match="is library scenario copart_is's mix"):
            ScenarioFamily("random", split).chosen(twin)
    assert ScenarioFamily([twin], "all").pool  # split='all' takes every mix


def test_the_library_twin_check_rejects_no_generator_draw() -> None:
    """Draws of the default families are what they were before draws were checked against
    the library's mixes (a seeded draw's loads are never a library scenario's)."""
    for split in ("train", "validation", "test"):
        a, b = np.random.default_rng(5), np.random.default_rng(5)
        checked, unchecked = ScenarioFamily("random", split), ScenarioFamily("random", split)
        unchecked._library = {}  # no library mix to compare with
        assert [checked.draw(a).name for _ in range(60)] == [
            unchecked.draw(b).name for _ in range(60)
        ]


def test_preset_applies_to_every_draw() -> None:
    rng = np.random.default_rng(1)
    fam = ScenarioFamily("random", "train", preset="epyc7302p")
    assert {fam.draw(rng).machine for _ in range(5)} == {"epyc7302p"}
    named = ScenarioFamily(["default", "copart_h_bw"], "all", preset="e5_2683v4")
    assert {s.machine for s in named.pool} == {"e5_2683v4"}


def test_an_empty_split_is_an_error() -> None:
    test_names = [s.name for s in ScenarioFamily("named", "test").pool]
    with pytest.raises(ValueError, match="no scenario"):
        ScenarioFamily(test_names, "train")


def test_reward_weights_reach_the_reward(make_env) -> None:
    silent = make_env(reward_weights={"slo": 0, "fairness": 0, "throughput": 0, "change": 0})
    silent.reset(seed=1)
    _, reward, _, _, info = silent.step(silent.action_space.sample())
    assert reward == 0 and info["reward_terms"]["total"] == 0
    only_tput = make_env(reward_weights={"slo": 0, "fairness": 0, "change": 0})
    only_tput.reset(seed=1)
    _, reward, _, _, info = only_tput.step(only_tput.action_space.sample())
    assert reward == pytest.approx(info["reward_terms"]["mean_progress"]) and reward > 0


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), preset=st.sampled_from([None, "e5v3_4clos", "epyc7302p"]))
def test_any_action_sequence_keeps_the_node_valid(seed: int, preset) -> None:
    env = PartitionEnv(preset=preset, split="all", episode_steps=3, interval_s=0.2, noise=False)
    try:
        env.reset(seed=seed)
        env.action_space.seed(seed)
        caps = env.capabilities
        for _ in range(3):
            _, reward, *_ = env.step(env.action_space.sample())
            held = env.node.allocation()
            assert held == env.held_allocation and np.isfinite(reward)
            validate_plan(held.as_plan(), PlanContext(caps=caps, current=held))
    finally:
        env.close()


def test_groups_beyond_max_groups_are_left_untouched(make_env) -> None:
    env = make_env(scenarios=["copart_h_llc"], split="all", max_groups=2)
    obs, info = env.reset(seed=0, options={"baseline": "full"})
    base = env.unwrapped
    assert len(info["slots"]) == 2 and len(base.group_specs) == 4
    assert obs[base.encoder.names.index("node.truncated")] == 1
    left_out = set(base.group_specs) - set(base.slots)
    before = {g: base.held_allocation.get(g, 0) for g in left_out}
    _, _, _, _, info = env.step(env.action_space.sample())
    assert set(info["masks"]) == set(base.slots)
    assert {g: base.node.allocation().get(g, 0) for g in left_out} == before


@pytest.mark.parametrize("vector", [False, True])
def test_episodes_start_from_the_nodes_allocation_by_default(vector: bool) -> None:
    """What the online tuner finds: a fresh node is unpartitioned, and nothing is applied
    before the first action (no equal split)."""
    import gymnasium as gym

    import envs

    if vector:
        env = gym.make_vec(
            envs.PARTITION_ID, num_envs=2, vectorization_mode="vector_entry_point", episode_steps=2
        )
        obs, _ = env.reset(seed=3)
    else:
        env = gym.make(envs.PARTITION_ID, episode_steps=2)
        obs, _ = env.reset(seed=3)
        obs = obs[None]
    enc = env.unwrapped.encoder
    ways = enc.names.index("g0.ways_fraction")
    for row in obs:
        present = row[0 : enc.max_groups * enc.group_size : enc.group_size] > 0
        fractions = row[ways : enc.max_groups * enc.group_size : enc.group_size]
        assert present.sum() >= 2 and (fractions[present] == 1.0).all()
    env.close()


@pytest.mark.parametrize("share_all", [False, True])
def test_share_all_lets_an_action_leave_the_cache_unpartitioned(share_all: bool) -> None:
    """All-zero share levels: with ``share_all`` every group stays on every way (what the
    oracle and the unpartitioned baseline hold; the MBA levels still apply); without it
    they are the equal split into disjoint masks."""
    env = gym.make(
        envs.PARTITION_ID,
        scenarios=["copart_h_llc"],
        split="all",
        episode_steps=3,
        shield=True,
        share_all=share_all,
    )
    env.reset(seed=1)
    base = env.unwrapped
    action = np.zeros(base.action_space.shape, dtype=np.int64)
    action[base.decoder.max_groups] = base.decoder.mba_levels - 1  # the first: full bandwidth
    for _ in range(2):
        env.step(action)
    held = base.node.allocation()
    masks = [held.get(g, 0).l3_mask for g in base.slots]
    full = base.capabilities.l3.cbm_mask
    assert len(masks) >= 2
    assert (masks == [full] * len(masks)) is share_all
    if not share_all:
        assert sum(m.bit_count() for m in masks) == full.bit_count()  # disjoint
    assert held.get(base.slots[0], 0).mb > held.get(base.slots[1], 0).mb
    env.close()
