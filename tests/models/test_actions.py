"""The action decoder: every action is a valid plan, on every preset and random scenario."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.sim import SimNode, random_scenario
from agent.types import (
    Allocation,
    CacheCapabilities,
    GroupAllocation,
    MbaCapabilities,
    MbaMode,
    NodeCapabilities,
    Vendor,
    is_contiguous,
)
from agent.validate import PlanContext, validate_plan
from models.actions import ActionDecoder, apportion, decode_arrays, nearest_levels
from models.features import slot_order

PRESETS = ["gold6130", "e5_2683v4", "e5v3_4clos", "epyc7302p"]
MAX_GROUPS = 8


def test_apportion_sums_and_is_proportional() -> None:
    assert apportion(10, [1, 1, 3]) == [2, 2, 6]
    assert apportion(7, [0, 0, 0]) == [3, 2, 2]  # all zero: equal, remainder to earlier
    assert apportion(5, [0, 1]) == [0, 5]
    assert apportion(3, [1, 1, 1, 1]) == [1, 1, 1, 0]  # ties go to the earlier slot
    assert apportion(0, [4, 2]) == [0, 0] and apportion(4, []) == []


def _largest_remainder_by_sorting(total: int, weights: list[int]) -> list[int]:
    """The textbook form: floor quotas, then one more to the largest remainders, ties to
    the earlier index (exact integer arithmetic; all-zero weights split equally)."""
    w = weights if sum(weights) else [1] * len(weights)
    s = sum(w)
    base = [total * x // s for x in w]
    rem = [total * x % s for x in w]
    for i in sorted(range(len(w)), key=lambda i: (-rem[i], i))[: total - sum(base)]:
        base[i] += 1
    return base


@given(st.integers(0, 40), st.lists(st.integers(0, 9), min_size=1, max_size=12))
def test_apportion_is_the_textbook_largest_remainder(total: int, weights: list[int]) -> None:
    assert apportion(total, weights) == _largest_remainder_by_sorting(total, weights)


@given(st.integers(0, 40), st.lists(st.integers(0, 9), min_size=1, max_size=12))
def test_apportion_properties(total: int, weights: list[int]) -> None:
    out = apportion(total, weights)
    assert sum(out) == total and all(x >= 0 for x in out)
    if sum(weights):
        quota = [total * w / sum(weights) for w in weights]
        assert all(abs(o - q) < 1 for o, q in zip(out, quota, strict=True))


_NODES: dict[str, SimNode] = {}


def _node(preset: str, seed: int) -> SimNode:
    node = _NODES.get(preset) or _NODES.setdefault(preset, SimNode("default", 0))
    node.reset(random_scenario(seed, preset, max_lc=3, max_batch=6), seed=seed)
    return node


def _check_plan(decoded, slots, caps, current) -> None:
    plan = validate_plan(decoded.plan, PlanContext(caps=caps, current=current))
    assert set(plan.groups) <= set(slots)
    if caps.l3 is not None and slots:
        least = max(1, caps.l3.min_cbm_bits)
        masks = decoded.masks
        assert set(masks) == set(slots)
        assert all(is_contiguous(m) and m.bit_count() >= least for m in masks.values())
        if not decoded.shared:
            union = 0
            for m in masks.values():
                assert not union & m  # disjoint
                union |= m
            assert union == caps.l3.cbm_mask  # every way is used
        else:
            assert len(slots) * least > caps.l3.num_ways
    if caps.mba is not None and slots:
        assert set(decoded.mb) == set(slots)
        if caps.mba.mode is not MbaMode.MBPS:
            assert set(decoded.mb.values()) <= set(caps.mba.levels())
    else:
        assert not decoded.mb


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    preset=st.sampled_from(PRESETS),
    seed=st.integers(0, 10_000),
    data=st.data(),
)
def test_every_action_is_a_valid_plan_on_every_preset(preset: str, seed: int, data) -> None:
    node = _node(preset, seed)
    caps = node.capabilities()
    dec = ActionDecoder(MAX_GROUPS, share_levels=8, mba_levels=10)
    action = data.draw(
        st.lists(st.integers(0, 7), min_size=MAX_GROUPS, max_size=MAX_GROUPS).flatmap(
            lambda s: st.lists(st.integers(0, 9), min_size=MAX_GROUPS, max_size=MAX_GROUPS).map(
                lambda m: s + m
            )
        )
    )
    slots = slot_order(node.groups(), MAX_GROUPS)
    decoded = dec.decode(np.array(action), slots, caps)
    _check_plan(decoded, slots, caps, node.allocation())
    held = node.apply(decoded.plan)  # the simulated kernel accepts it too
    for g, m in decoded.masks.items():
        assert held.get(g, caps.domains[0]).l3_mask == m


def _caps(ways: int, min_bits: int, mba: MbaCapabilities | None, sparse=False):
    return NodeCapabilities(
        vendor=Vendor.SIMULATED,
        num_cpus=8,
        l3=CacheCapabilities(
            cbm_mask=((1 << ways) - 1) << 4,  # a cbm_mask not starting at bit 0
            min_cbm_bits=min_bits,
            num_closids=32,
            sparse_masks=sparse,
        ),
        mba=mba,
        memory_bandwidth_bps=20e9,
    )


SYNTHETIC = {
    "shared-min2": _caps(5, 2, MbaCapabilities(10, 10, 100, 32)),
    "more-groups-than-ways": _caps(4, 1, None),
    "mbps": _caps(12, 1, MbaCapabilities(1, 1, 4294967295, 32, mode=MbaMode.MBPS)),
    "amd": _caps(16, 0, MbaCapabilities(0, 1, 2048, 32, mode=MbaMode.AMD), sparse=True),
    "no-cat": NodeCapabilities(
        vendor=Vendor.SIMULATED, num_cpus=8, mba=MbaCapabilities(10, 10, 100, 32)
    ),
}


@settings(max_examples=60, deadline=None)
@given(
    kind=st.sampled_from(sorted(SYNTHETIC)),
    n=st.integers(0, 12),
    seed=st.integers(0, 2**32 - 1),
)
def test_valid_on_synthetic_nodes_including_sharing(kind: str, n: int, seed: int) -> None:
    caps = SYNTHETIC[kind]
    dec = ActionDecoder(max_groups=12, share_levels=5, mba_levels=4)
    slots = [f"g{i:02d}" for i in range(n)]
    full = GroupAllocation(
        l3_mask=caps.l3.cbm_mask if caps.l3 else None,
        mb=caps.mba.max_bandwidth if caps.mba else None,
    )
    current = Allocation({g: {0: full} for g in slots})
    action = np.random.default_rng(seed).integers(0, dec.nvec)
    decoded = dec.decode(action, slots, caps)
    _check_plan(decoded, slots, caps, current)
    if decoded.shared:
        assert any("share" in r for r in decoded.repairs)


@pytest.mark.parametrize("share_all", [False, True])
@pytest.mark.parametrize("kind", sorted(SYNTHETIC))
def test_a_prepared_decoder_decodes_as_decode_arrays(kind: str, share_all: bool) -> None:
    # The prepared decoder's one compiled call (or decode_arrays, where Python decides)
    # against decode_arrays itself, with and without the shield's floors, on nodes with
    # and without CAT or MBA and with groups sharing slices.
    caps, rng = SYNTHETIC[kind], np.random.default_rng(7)
    dec = ActionDecoder(max_groups=8, share_levels=5, mba_levels=4, share_all=share_all)
    for n in (0, 1, 3, 6, 8):
        prepared = dec.prepare([f"g{i}" for i in range(n)], caps)
        for _ in range(40):
            levels = rng.integers(0, dec.nvec).tolist()
            floors = None
            if rng.random() < 0.5:
                floors = (rng.integers(0, 3, (1, 8)), rng.integers(0, 4, (1, 8)))
            want = decode_arrays(dec, prepared.layout, np.array([levels]), *(floors or ()))
            ways, masks, mb, shared = prepared._decode_one(levels, floors)
            assert shared == bool(want.shared[0])
            assert ways.tolist() == want.ways[0].tolist()
            assert masks.tolist() == want.masks[0].tolist()
            np.testing.assert_array_equal(mb, want.mb[0])


def test_sharing_gives_the_highest_share_levels_a_slice_alone() -> None:
    caps = SYNTHETIC["shared-min2"]  # 5 ways, min 2 bits: 2 slices, the last 3 ways wide
    dec = ActionDecoder(max_groups=3, share_levels=4, mba_levels=2)
    decoded = dec.decode([0, 3, 0, 0, 0, 0], ["a", "b", "c"], caps)
    assert decoded.shared
    assert decoded.masks["b"] != decoded.masks["a"] == decoded.masks["c"]


def test_share_levels_move_ways_monotonically() -> None:
    caps = _caps(20, 1, None)
    dec = ActionDecoder(max_groups=3, share_levels=8, mba_levels=2)
    ways = [dec.decode([lv, 2, 2, 0, 0, 0], ["a", "b", "c"], caps).ways["a"] for lv in range(8)]
    assert ways == sorted(ways) and ways[0] == 1 and ways[-1] > ways[1]
    assert dec.decode([0, 0, 0, 0, 0, 0], ["a", "b", "c"], caps).ways == {"a": 7, "b": 7, "c": 6}


def test_mba_levels_map_to_fractions() -> None:
    caps = SYNTHETIC["shared-min2"]
    dec = ActionDecoder(max_groups=2, share_levels=2, mba_levels=10)
    assert dec.decode([0, 0, 0, 9], ["a", "b"], caps).mb == {"a": 10, "b": 100}
    dec4 = ActionDecoder(max_groups=1, share_levels=2, mba_levels=4)
    assert [dec4.decode([0, j], ["a"], caps).mb["a"] for j in range(4)] == [20, 50, 70, 100]


def test_ignored_parts_are_reported() -> None:
    caps = SYNTHETIC["more-groups-than-ways"]  # no MBA
    dec = ActionDecoder(max_groups=3, share_levels=2, mba_levels=3)
    repairs = dec.decode([1, 0, 1, 2, 0, 0], ["a"], caps).repairs
    assert any("empty slots" in r for r in repairs)
    assert any("no MBA" in r for r in repairs)
    assert dec.decode([1, 0, 0, 0, 0, 0], ["a"], caps).repairs == ()


def test_action_mask_fixes_absent_slots_and_missing_resources() -> None:
    dec = ActionDecoder(max_groups=3, share_levels=4, mba_levels=2)
    mask = dec.action_mask(2, SYNTHETIC["more-groups-than-ways"])  # CAT, no MBA
    share, mba = mask[:12].reshape(3, 4), mask[12:].reshape(3, 2)
    assert share[:2].all() and share[2].tolist() == [True, False, False, False]
    assert mba.tolist() == [[True, False]] * 3
    assert mask.size == dec.nvec.sum()


@pytest.mark.parametrize(
    "action, match",
    [([0, 0, 0], "expected 4"), ([0, 0, 0, 5], "outside"), ([-1, 0, 0, 0], "outside")],
)
def test_bad_actions_are_rejected_with_a_reason(action, match) -> None:
    dec = ActionDecoder(max_groups=2, share_levels=3, mba_levels=3)
    with pytest.raises(ValueError, match=match):
        dec.decode(action, ["a"], SYNTHETIC["amd"])


def test_bad_decoder_sizes_are_rejected() -> None:
    with pytest.raises(ValueError, match="share_levels"):
        ActionDecoder(4, 0, 3)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    preset=st.sampled_from(PRESETS),
    seed=st.integers(0, 10_000),
    floored=st.booleans(),
    share_all=st.booleans(),
)
def test_nearest_levels_inverts_the_decoder_behind_floors(preset, seed, floored, share_all):
    # A teacher's allocation becomes a label by nearest_levels (training/dagger.py): any
    # allocation an action decodes to, under the shield's floors, must come back exactly.
    node = _node(preset, seed)
    caps = node.capabilities()
    dec = ActionDecoder(MAX_GROUPS, share_levels=5, mba_levels=4, share_all=share_all)
    slots = slot_order(node.groups(), MAX_GROUPS)
    layout = dec.prepare(slots, caps).layout
    rng = np.random.default_rng(seed)
    n, total, least = len(slots), int(layout.total[0]), int(layout.least[0])
    floors = None
    if floored and n * least <= total:
        spare = (total - n * least) // max(n, 1)
        ways = np.zeros((1, MAX_GROUPS), dtype=np.int64)
        ways[0, :n] = rng.integers(0, least + spare + 1, n)
        floors = (ways, np.zeros((1, MAX_GROUPS), dtype=np.int64))
    action = rng.integers(0, dec.nvec)
    action[n:MAX_GROUPS] = 0
    action[MAX_GROUPS + n :] = 0
    want = decode_arrays(dec, layout, action[None], *(floors or ()))
    got_levels = nearest_levels(dec, layout, want.ways[0, :n], want.mb[0, :n], floors)
    got = decode_arrays(dec, layout, got_levels[None], *(floors or ()))
    assert got.ways[0, :n].tolist() == want.ways[0, :n].tolist()
    np.testing.assert_array_equal(got.mb[0, :n], want.mb[0, :n])
    assert not got_levels[n:MAX_GROUPS].any() and not got_levels[MAX_GROUPS + n :].any()


def _floors(*ways: int, size: int = 4) -> tuple[np.ndarray, np.ndarray]:
    f = np.zeros((1, size), dtype=np.int64)
    f[0, : len(ways)] = ways
    return f, np.zeros((1, size), dtype=np.int64)


@pytest.mark.parametrize("kind", ["shared-min2", "mbps", "amd"])
@pytest.mark.parametrize("n", [2, 3])
def test_share_all_zero_levels_mean_the_unpartitioned_cache(kind: str, n: int) -> None:
    # The state the oracle and the unpartitioned baseline hold: every group on every way,
    # the MBA levels as said; without share_all the same action is the equal split.
    caps = SYNTHETIC[kind]
    slots = ["a", "b", "c"][:n]
    action = [0, 0, 0, 0, *[3, 1, 2][:n], *[0] * (4 - n)]
    on = ActionDecoder(4, share_levels=5, mba_levels=4, share_all=True).decode(action, slots, caps)
    off = ActionDecoder(4, share_levels=5, mba_levels=4).decode(action, slots, caps)
    assert set(on.masks.values()) == {caps.l3.cbm_mask}
    assert on.ways == dict.fromkeys(slots, caps.l3.cbm_mask.bit_count())
    assert on.mb == off.mb and not on.shared and on.repairs == ()
    assert len(set(off.masks.values())) == n or off.shared
    held = GroupAllocation(l3_mask=caps.l3.cbm_mask, mb=caps.mba.max_bandwidth)
    current = Allocation({g: {0: held} for g in slots})
    validate_plan(on.plan, PlanContext(caps=caps, current=current))
    # any non-zero level, or all levels equal and non-zero, is a split as before
    for levels in ([1, 1, 1], [0, 2, 0]):
        act = [*levels[:n], *[0] * (4 - n), *action[4:]]
        assert (
            ActionDecoder(4, 5, 4, True).decode(act, slots, caps).masks
            == ActionDecoder(4, 5, 4).decode(act, slots, caps).masks
        )


def test_share_all_behind_the_shield() -> None:
    # Honoured while no LC floor exceeds its group's share of the shared cache (11 // 3 =
    # 3 ways, as the shield counts shared ways); a floor above it (the shield under
    # pressure) decodes all zeros to the equal split above the floors, as without it.
    caps = _caps(11, 1, SYNTHETIC["shared-min2"].mba)
    slots = ["lc", "b", "c"]
    on = ActionDecoder(4, 5, 4, share_all=True).prepare(slots, caps)
    off = ActionDecoder(4, 5, 4).prepare(slots, caps)
    action = [0] * 8
    assert on.decode(action, _floors(3)).ways == dict.fromkeys(slots, 11)
    assert on.decode(action, _floors(4)).ways == off.decode(action, _floors(4)).ways
    assert on.decode(action, _floors(4)).ways == {"lc": 6, "b": 3, "c": 2}
    levels = on.decoder.levels(action)
    d = decode_arrays(on.decoder, on.layout, np.array([levels]), *_floors(3))
    assert d.masks[0, :3].tolist() == [caps.l3.cbm_mask] * 3


@pytest.mark.parametrize(
    "floor, share_all, want",
    [
        (0, True, None),  # the unpartitioned cache, said directly
        (3, True, None),  # at its share: still allowed
        (5, True, [5, 3, 3]),  # the shield wants 5 ways: the nearest split, a share each
        (0, False, [4, 4, 3]),  # the decoder cannot say it: the equal split
    ],
)
def test_nearest_levels_of_the_unpartitioned_cache(floor, share_all, want) -> None:
    caps = _caps(11, 1, SYNTHETIC["shared-min2"].mba)
    dec = ActionDecoder(4, 5, 4, share_all=share_all)
    layout = dec.prepare(["lc", "b", "c"], caps).layout
    floors = _floors(floor)
    got = nearest_levels(dec, layout, [11, 11, 11], [100, 100, 100], floors)
    d = decode_arrays(dec, layout, got[None], *floors)
    assert got[4:7].tolist() == [3, 3, 3]  # MBA as asked
    if want is None:
        assert got[:3].tolist() == [0, 0, 0]
        assert d.masks[0, :3].tolist() == [caps.l3.cbm_mask] * 3
    else:
        assert d.ways[0, :3].tolist() == want


def test_share_all_is_in_the_layout_only_when_on() -> None:
    assert "share_all" not in ActionDecoder(4, 5, 4).layout()
    assert ActionDecoder(4, 5, 4, share_all=True).layout()["share_all"] is True
    with pytest.raises(ValueError, match="share_all"):
        ActionDecoder(4, 5, 4, share_all="yes")


def test_an_amd_mb_value_between_the_peak_and_unlimited_holds_the_top_level() -> None:
    """The simulated EPYC (150 GB/s: 1,200 units of 1/8 GB/s): the top MBA level writes 2048
    (unlimited), and any value from the peak up holds all of the bandwidth, so the shield
    and the teacher's labels read it as the top level, not the 75% one below it."""
    from models.shield import held_levels

    caps = SimNode("more_lc_than_closids_epyc").capabilities()
    decoder = ActionDecoder(8, 5, 4)
    layout = decoder.decode_layout(3, caps)
    assert layout.mb_table[0].tolist() == [300, 600, 900, 2048]
    assert layout.mb_held[0].tolist() == [300, 600, 900, 1200]
    held = np.array([[1200.0, 1500.0, 2048.0, 899.0]])
    assert held_levels(held, layout.mb_held).tolist() == [[3, 3, 3, 1]]
    labels = nearest_levels(decoder, layout, [6, 6, 6], [1200.0, 1500.0, 620.0])
    assert labels[8:11].tolist() == [3, 3, 1]
