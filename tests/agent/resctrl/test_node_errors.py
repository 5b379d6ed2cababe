"""Bad input and kernel refusals surface as clear errors with nothing half-applied;
ownership, adoption, vanished groups and monitoring edge cases (docs/RESCTRL.md)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent.emulator.state import ResctrlError
from agent.errors import (
    GroupNotFound,
    InUse,
    InvalidAllocation,
    InvalidCpus,
    InvalidName,
    KernelError,
    NotMounted,
    ResourceExhausted,
    StateUnwritable,
    UnknownTask,
)
from agent.pmc import PmcReader
from agent.resctrl import ResctrlNode, schemata
from agent.resctrl.lock import LockInterrupted, ResctrlLock
from agent.types import (
    SLO,
    AllocationPlan,
    GroupAllocation,
    GroupKind,
    GroupSpec,
    LatencyStats,
)
from tests.agent.pmc.conftest import open_fds, perf_fds
from tests.agent.pmc.workload import Child
from tests.agent.resctrl.conftest import fd_count, make_node, unknown_pid
from tests.emulated_resctrl import Emulated, _unmount, emulated_resctrl

PREFIX = "rdtune-"


@pytest.fixture
def intel() -> Iterator[Emulated]:
    with emulated_resctrl("intel-20way") as emu:
        yield emu


@pytest.fixture
def inode(intel: Emulated) -> Iterator[ResctrlNode]:
    node = make_node(intel)
    yield node
    node.close()


def _two_groups(node: ResctrlNode) -> None:
    node.create_group(GroupSpec("a"))
    node.create_group(GroupSpec("b"))


# ---------------------------------------------------------------------- apply


@pytest.mark.parametrize("preset", ["intel-20way", "intel-cdp", "amd-epyc"])
def test_refused_write_restores_the_groups_already_changed(preset: str) -> None:
    with emulated_resctrl(preset) as emu:
        node = make_node(emu)
        _two_groups(node)
        before = node.allocation()
        caps = node.capabilities()
        plan = AllocationPlan.uniform(
            {"a": GroupAllocation(l3_mask=0x3), "b": GroupAllocation(l3_mask=0xC)}, caps.domains
        )
        emu.model.fail_next_write(f"{PREFIX}b/schemata", errno.EIO, "injected refusal")
        with pytest.raises(KernelError) as err:
            node.apply(plan)
        assert err.value.errno == errno.EIO
        assert err.value.status == "injected refusal"
        assert "group 'b'" in str(err.value) and "restored 'a'" in str(err.value)
        assert node.allocation() == before, "the first group must be restored"
        node.apply(plan)  # the node keeps working: the next try goes through


def test_values_a_refused_apply_could_not_restore_are_rolled_back_and_no_others() -> None:
    """A refused apply whose restore is refused too journals what it could not put back;
    a restart rolls back exactly that, until a later apply writes those values again (they
    are then intended), and never a group whose write the kernel refused."""
    with emulated_resctrl("intel-20way") as emu:
        node = make_node(emu)
        _two_groups(node)
        node.apply(
            AllocationPlan({"a": {0: GroupAllocation(0xFF)}, "b": {0: GroupAllocation(0xF)}})
        )
        # a shrinks and is written first, b's write is refused, and so is a's restore
        emu.model.fail_next_write(f"{PREFIX}b/schemata", errno.EINVAL, "injected")
        emu.model.fail_next_write(f"{PREFIX}a/schemata", errno.EIO, "injected", after=1)
        with pytest.raises(KernelError) as err:
            node.apply(
                AllocationPlan({"a": {0: GroupAllocation(0x3)}, "b": {0: GroupAllocation(0xFF)}})
            )
        assert str(err.value).endswith("group 'b'; COULD NOT restore 'a': EINVAL (injected)")
        a_mixed = node.allocation().get("a", 0).l3_mask
        assert a_mixed == 0x3

        def restarted() -> tuple[ResctrlNode, dict[str, int]]:
            node.close()
            again = make_node(emu)
            held = {g: again.allocation().get(g, 0).l3_mask for g in ("a", "b")}
            return again, held

        # a restart now rolls a back to the plan before, and leaves b alone
        node, held = restarted()
        assert held == {"a": 0xFF, "b": 0xF} and "rolled back" in node.recovered
        # again, but this time later applies write a's and b's values: nothing to roll back
        emu.model.fail_next_write(f"{PREFIX}b/schemata", errno.EINVAL, "injected")
        emu.model.fail_next_write(f"{PREFIX}a/schemata", errno.EIO, "injected", after=1)
        with pytest.raises(KernelError):
            node.apply(
                AllocationPlan({"a": {0: GroupAllocation(0x3)}, "b": {0: GroupAllocation(0xFF)}})
            )
        node.apply(AllocationPlan({"b": {0: GroupAllocation(0x3)}}))
        node.apply(AllocationPlan({"a": {1: GroupAllocation(0xF)}}))  # another domain of a
        node, held = restarted()
        assert held == {"a": 0xFF, "b": 0x3}, "a's refused value rolled back; b's kept"
        node.apply(AllocationPlan({"a": {0: GroupAllocation(0xFFF0)}}))
        node, held = restarted()
        assert held == {"a": 0xFFF0, "b": 0x3} and node.recovered is None
        node.close()


def _apply_mask(mask: int) -> Callable[[ResctrlNode, list[int]], object]:
    return lambda node, _: node.apply(AllocationPlan({"a": {0: GroupAllocation(mask)}}))


@pytest.mark.parametrize(
    ("read", "err", "call"),
    [
        ("schemata", errno.ENOENT, _apply_mask(0xFF)),
        ("mode", errno.ENOENT, _apply_mask(0xF)),
        ("tasks", errno.ENOENT, lambda node, pids: node.assign("a", pids=pids)),
        ("schemata", errno.ENODEV, _apply_mask(0xFF)),
    ],
    ids=["apply, its schemata", "apply, its mode", "assign", "apply, its schemata offline"],
)  # fmt: skip
def test_a_foreign_group_removed_while_it_is_read_is_skipped(
    intel: Emulated,
    inode: ResctrlNode,
    children: list[int],
    read: str,
    err: int,
    call: Callable,
) -> None:
    """Another tool removing its group between the root's listing and the read of the
    group's file (a container runtime deleting a class) is not the call's failure: the
    group holds nothing any more. It used to fail with a bare FileNotFoundError. Nor is a
    group whose schemata cannot be read (ENODEV: a pseudo-locked region whose cache domain
    went offline)."""
    inode.create_group(GroupSpec("a"))
    os.mkdir(os.path.join(intel.root, "theirs"))
    model, real = intel.model, intel.model.read
    raced = []

    def read_then_vanish(path: str):
        if path.strip("/") == f"theirs/{read}":
            model.read = real
            if err == errno.ENOENT:
                model.rmdir("theirs")  # removed as the agent got to it
            raced.append(path)
            raise ResctrlError(err)
        return real(path)

    model.read = read_then_vanish
    try:
        call(inode, children[:2])
    finally:
        model.read = real
    assert raced, "the call never read the group's file"


def test_an_unmounted_root_is_an_unavailable_node_not_a_place_for_groups() -> None:
    """resctrl unmounted under the agent leaves a plain directory: a group's mkdir there
    would succeed and every own group would look deleted by someone else. Every call says
    NotMounted (UNAVAILABLE over gRPC, an outage to the tuner) and the state is kept."""
    with emulated_resctrl("intel-20way") as emu:
        node = make_node(emu)
        node.create_group(GroupSpec("a"))
        saved = Path(node.state_path).read_bytes()
        _unmount(emu.root)
        calls = {
            "apply": lambda: node.apply(AllocationPlan({"a": {0: GroupAllocation(0xF)}})),
            "create": lambda: node.create_group(GroupSpec("b")),
            "observe": node.observe,
            "groups": node.groups,
        }
        for name, call in calls.items():
            with pytest.raises(NotMounted, match="no longer a resctrl filesystem") as err:
                call()
            assert err.value.code == "UNAVAILABLE", name
        assert os.listdir(emu.root) == [], "nothing made in the plain directory"
        assert Path(node.state_path).read_bytes() == saved, "no group recorded as deleted"
        node.close()


def test_invalid_plan_writes_nothing(intel: Emulated, inode: ResctrlNode) -> None:
    _two_groups(inode)
    before = intel.read(f"{PREFIX}a/schemata")
    plan = AllocationPlan(
        {"a": {0: GroupAllocation(l3_mask=0x3)}, "b": {7: GroupAllocation(mb=50)}}
    )
    with pytest.raises(InvalidAllocation) as err:
        inode.apply(plan)
    assert err.value.rule == "unknown_domain"
    assert intel.read(f"{PREFIX}a/schemata") == before


def test_apply_reads_back_padded_values_and_rounds_mb(inode: ResctrlNode) -> None:
    _two_groups(inode)
    held = inode.apply(AllocationPlan({"a": {1: GroupAllocation(l3_mask=0xF0, mb=15)}}))
    assert held.get("a", 1) == GroupAllocation(l3_mask=0xF0, mb=20)
    assert held.get("a", 0) == GroupAllocation(l3_mask=0xFFFFF, mb=100)


def _foreign_exclusive(emu: Emulated) -> None:
    os.mkdir(f"{emu.root}/kube-guaranteed")
    emu.write("schemata", "L3:0=0000f;1=0000f\n")  # the admin narrows the default group
    emu.write("kube-guaranteed/schemata", "L3:0=3f000;1=3f000\n")  # not the hardware's
    emu.write("kube-guaranteed/mode", "exclusive\n")


def _default_exclusive(emu: Emulated) -> None:
    emu.write("schemata", "L3:0=3f000;1=3f000\n")  # the admin keeps ways for the default group
    emu.write("mode", "exclusive\n")


def _pseudo_locked(emu: Emulated) -> None:
    """A pseudo-locked region on ways 12-17 (the emulator has no pseudo-locking: its
    ``mode`` file reads so, and its schemata shows the region as the kernel does)."""
    os.mkdir(f"{emu.root}/locked")
    emu.write("locked/schemata", "L3:0=3f000;1=3f000\n")
    real = emu.model.read
    emu.model.read = lambda path: (
        "pseudo-locked\n" if path.strip("/") == "locked/mode" else real(path)
    )


@pytest.mark.parametrize(
    "holder",
    [_foreign_exclusive, _default_exclusive, _pseudo_locked],
    ids=["foreign exclusive group", "exclusive default group", "pseudo-locked region"],
)
def test_ways_no_group_may_share_block_overlap_before_any_write(
    intel: Emulated, holder: Callable[[Emulated], None]
) -> None:
    holder(intel)
    node = make_node(intel)
    node.create_group(GroupSpec("a"))
    if holder is not _pseudo_locked:  # which the emulator cannot model for new groups
        assert node.allocation().get("a", 0).l3_mask == 0x00FFF, "new groups avoid those ways"
    before = node.allocation()
    plan = AllocationPlan.uniform({"a": GroupAllocation(l3_mask=0x3F000)}, (0, 1))
    for dry_run in (True, False):
        with pytest.raises(InvalidAllocation) as err:
            node.apply(plan, dry_run=dry_run)
        assert err.value.rule == "exclusive_overlap"
    assert node.allocation() == before
    assert intel.status() == "ok", "rejected by the validator, never written"


@pytest.mark.parametrize(
    "holder",
    [_foreign_exclusive, _default_exclusive, _pseudo_locked],
    ids=["foreign exclusive group", "exclusive default group", "pseudo-locked region"],
)
def test_the_node_reports_the_ways_others_hold_exclusively(
    intel: Emulated, holder: Callable[[Emulated], None]
) -> None:
    """What another tool holds exclusively is reserved; a shareable foreign group, the
    default group when shareable and the node's own exclusive group are not."""
    intel.write("schemata", "L3:0=0000f;1=0000f\n")  # ways left for an own exclusive group
    os.mkdir(f"{intel.root}/shared-tool")
    intel.write("shared-tool/schemata", "L3:0=00f00;1=00f00\n")
    holder(intel)
    node = make_node(intel)
    node.create_group(GroupSpec("own", exclusive=True))
    assert node.reserved_ways() == {0: 0x3F000, 1: 0x3F000}
    os.rmdir(f"{intel.root}/shared-tool")
    assert node.reserved_ways() == {0: 0x3F000, 1: 0x3F000}


def _exclusive_pair(emu: Emulated) -> ResctrlNode:
    """Exclusive x on ways 4-7 and s on ways 8-11 of domain 0 (the default group keeps
    ways 0-1 of both domains; x the rest of domain 1)."""
    emu.write("schemata", "L3:0=3;1=3\n")
    node = make_node(emu)
    node.create_group(GroupSpec("x", exclusive=True))
    node.create_group(GroupSpec("s"))
    node.apply(AllocationPlan({"x": {0: GroupAllocation(0x0F0)}, "s": {0: GroupAllocation(0xF00)}}))
    return node


def test_exclusive_group_growing_in_one_domain_and_shrinking_in_another(intel: Emulated) -> None:
    """x grows in domain 0 and shrinks in domain 1 while s does the opposite: no order of
    one write per group gets there (each first write overlaps x), shrinking first does."""
    node = _exclusive_pair(intel)
    plan = AllocationPlan(
        {
            "x": {0: GroupAllocation(0xFF0), 1: GroupAllocation(0x3FF00)},
            "s": {0: GroupAllocation(0x3), 1: GroupAllocation(0xFF)},
        }
    )
    assert node.apply(plan, dry_run=True) == node.apply(plan) == node.allocation()
    assert [node.allocation().get(g, d).l3_mask for g in "xs" for d in (0, 1)] == [
        0xFF0,
        0x3FF00,
        0x3,
        0xFF,
    ]
    node.close()


def test_ways_traded_with_an_exclusive_group_are_refused_before_any_write(
    intel: Emulated,
) -> None:
    """A swap of ways between exclusive x and s has no order of writes the kernel takes
    (each first write overlaps x): refused by the dry run and by apply, nothing written."""
    node = _exclusive_pair(intel)
    before = node.allocation()
    swap = AllocationPlan({"x": {0: GroupAllocation(0xF00)}, "s": {0: GroupAllocation(0x0F0)}})
    for dry_run in (True, False):
        with pytest.raises(InvalidAllocation, match="apply it as two plans") as err:
            node.apply(swap, dry_run=dry_run)
        assert err.value.rule == "exclusive_overlap"
    assert node.allocation() == before and intel.status() == "ok", "nothing written"
    node.close()


def test_exclusive_group_takes_only_free_ways(intel: Emulated) -> None:
    node = make_node(intel)
    with pytest.raises(ResourceExhausted, match="no free ways"):
        node.create_group(GroupSpec("lc", GroupKind.LC, SLO(99.0, 1.0), exclusive=True))
    assert node.groups() == {}
    assert not os.path.exists(f"{intel.root}/{PREFIX}lc"), "a failed create leaves nothing"
    intel.write("schemata", "L3:0=000ff;1=000ff\n")
    node.create_group(GroupSpec("lc", GroupKind.LC, SLO(99.0, 1.0), exclusive=True))
    assert intel.read(f"{PREFIX}lc/mode") == "exclusive\n"
    assert node.allocation().get("lc", 0).l3_mask == 0x3FF00  # hw-shareable c0000 avoided


def test_exclusive_group_avoids_the_own_groups_ways(intel: Emulated) -> None:
    node = make_node(intel)
    intel.write("schemata", "L3:0=000ff;1=000ff\n")
    node.create_group(GroupSpec("a"))  # a new group starts on every way: fffff
    # The kernel counts own groups in its overlap check too: a clear refusal, not a
    # narrowing onto "a"'s ways that the mode write then fails.
    with pytest.raises(ResourceExhausted, match="no free ways"):
        node.create_group(GroupSpec("lc", GroupKind.LC, SLO(99.0, 1.0), exclusive=True))
    assert set(node.groups()) == {"a"}
    node.apply(AllocationPlan.uniform({"a": GroupAllocation(l3_mask=0x00F00)}, (0, 1)))
    node.create_group(GroupSpec("lc", GroupKind.LC, SLO(99.0, 1.0), exclusive=True))
    assert intel.read(f"{PREFIX}lc/mode") == "exclusive\n"
    assert node.allocation().get("lc", 0).l3_mask == 0x3F000  # past a's 00f00, below c0000


def test_cpus_given_to_a_group_still_count_as_the_nodes(intel: Emulated) -> None:
    node = make_node(intel)
    cpus = node.capabilities().num_cpus
    node.create_group(GroupSpec("a"))
    node.assign("a", cpus=[0, 1])  # the kernel takes them out of the root's cpus_list
    assert intel.read("cpus_list") != intel.read(f"{PREFIX}a/cpus_list")
    node.close()
    assert make_node(intel).capabilities().num_cpus == cpus  # a restarted agent's view


# ---------------------------------------------------------------------- groups


def test_closid_exhaustion_names_the_kernel_reason() -> None:
    with emulated_resctrl("e5v3-4clos") as emu:
        node = make_node(emu)
        for name in ("a", "b", "c"):
            node.create_group(GroupSpec(name))
        with pytest.raises(ResourceExhausted, match="Out of CLOSIDs") as err:
            node.create_group(GroupSpec("d"))
        assert err.value.resource == "closid"
        assert set(node.groups()) == {"a", "b", "c"}


def test_rmid_exhaustion_and_limbo() -> None:
    with emulated_resctrl("intel-20way", num_rmids=3, limbo_s=0.3) as emu:
        node = make_node(emu)
        _two_groups(node)
        with pytest.raises(ResourceExhausted, match="Out of RMIDs") as err:
            node.create_group(GroupSpec("c"))
        assert err.value.resource == "rmid"
        node.delete_group("b")
        with pytest.raises(ResourceExhausted, match="limbo"):
            node.create_group(GroupSpec("b"))
        time.sleep(0.35)
        node.create_group(GroupSpec("b"))
        assert set(node.groups()) == {"a", "b"}


def test_foreign_groups_are_never_listed_or_deleted(intel: Emulated) -> None:
    os.mkdir(f"{intel.root}/kube-besteffort")
    os.mkdir(f"{intel.root}/rdtune")  # not the prefix "rdtune-"
    node = make_node(intel)
    node.create_group(GroupSpec("a"))
    assert set(node.groups()) == {"a"}
    assert set(node.allocation()) == {"a"}
    assert set(node.observe().groups) == {"a"}
    for name in ("kube-besteffort", "rdtune", "../kube-besteffort"):
        with pytest.raises((GroupNotFound, InvalidName)):
            node.delete_group(name)
    with pytest.raises(GroupNotFound):
        node.apply(AllocationPlan({"kube-besteffort": {0: GroupAllocation(l3_mask=1)}}))
    assert os.path.isdir(f"{intel.root}/kube-besteffort") and os.path.isdir(f"{intel.root}/rdtune")


@pytest.mark.parametrize("prefix", ["", "a/b", "..", "x y"])
def test_bad_prefix_is_rejected(intel: Emulated, prefix: str) -> None:
    with pytest.raises(InvalidName):
        ResctrlNode(intel.root, prefix=prefix, state_dir=intel.state_dir, pmc=None)


def test_restart_adopts_groups_with_kind_and_slo(intel: Emulated, children: list[int]) -> None:
    node = make_node(intel)
    lc = GroupSpec("svc", GroupKind.LC, SLO(99.9, 5.0))
    node.create_group(lc)
    node.create_group(GroupSpec("batch"))
    node.assign("svc", pids=[children[0]])
    held = node.apply(AllocationPlan.uniform({"svc": GroupAllocation(l3_mask=0xFF)}, (0, 1)))
    node.close()  # "crash": nothing is deleted
    again = make_node(intel)
    assert again.groups() == {"svc": lc, "batch": GroupSpec("batch")}
    assert again.allocation() == held
    assert children[0] in again.tasks("svc")
    # Without a state file the directories are not known to be this node's: left alone
    # (never adopted as batch groups, never changed).
    os.remove(again.state_path)
    again.close()
    third = make_node(intel)
    assert third.groups() == {}
    assert sorted(third.not_ours) == ["batch", "svc"]
    assert os.path.isdir(f"{intel.root}/{PREFIX}svc")
    assert third.allocation().groups == {}


def test_state_file_is_written_atomically_as_json(intel: Emulated) -> None:
    node = make_node(intel)
    node.create_group(GroupSpec("svc", GroupKind.LC, SLO(99.0, 2.0)))
    with open(node.state_path) as f:
        data = json.load(f)
    assert data["groups"]["svc"] == {
        "kind": "lc",
        "exclusive": False,
        "slo": {"percentile": 99.0, "target_ms": 2.0},
        "marker": os.stat(f"{intel.root}/{PREFIX}svc").st_ino,
        "dir": f"{PREFIX}svc",
    }
    assert [n for n in os.listdir(os.path.dirname(node.state_path)) if n.startswith(".")] == []


def test_vanished_group_is_reported_and_recreated_on_request(intel: Emulated) -> None:
    node = make_node(intel)
    spec = GroupSpec("svc", GroupKind.LC, SLO(99.0, 2.0))
    node.create_group(spec)
    node.create_group(GroupSpec("b"))
    node.observe()
    os.rmdir(f"{intel.root}/{PREFIX}svc")  # a container runtime cleaning up "unknown" groups
    snap = node.observe()
    assert snap.vanished == {"svc"}
    assert set(snap.groups) == {"b"}
    assert set(node.groups()) == {"b"}, "never silently re-created"
    assert node.vanished() == {"svc"}
    with pytest.raises(GroupNotFound, match="vanished"):
        node.assign("svc", pids=[os.getpid()])
    # The vanished group is remembered across a restart, too.
    node.close()
    node = make_node(intel)
    assert node.vanished() == {"svc"}
    assert node.recreate_vanished() == ["svc"]
    assert node.groups()["svc"] == spec
    assert node.vanished() == frozenset()
    assert node.observe().vanished == frozenset()


def test_monitoring_groups_it_did_not_make_are_left_alone(intel: Emulated) -> None:
    node = make_node(intel)
    node.create_group(GroupSpec("a"))
    node.close()
    os.mkdir(f"{intel.root}/other")  # another tool's control group
    made = [
        f"{PREFIX}a/mon_groups/{PREFIX}m1",
        f"mon_groups/{PREFIX}m2",
        f"other/mon_groups/{PREFIX}m3",
        "mon_groups/someone-else",
    ]
    for rel in made:
        os.mkdir(f"{intel.root}/{rel}")
    again = make_node(intel)
    assert again.cleaned_mon_groups == []
    assert all(os.path.isdir(f"{intel.root}/{rel}") for rel in made)
    assert set(again.groups()) == {"a"}


def test_own_recorded_monitoring_groups_of_a_crashed_run_are_removed(intel: Emulated) -> None:
    node = make_node(intel)
    node.create_group(GroupSpec("a"))
    node.close()
    rel = f"{PREFIX}a/mon_groups/{PREFIX}m1"
    os.mkdir(f"{intel.root}/{rel}")
    with open(node.state_path) as f:
        data = json.load(f)
    data["mon_groups"] = {rel: os.stat(f"{intel.root}/{rel}").st_ino, "mon_groups/gone": 7}
    with open(node.state_path, "w") as f:
        json.dump(data, f)
    # Recorded, but deleted and made again by someone else: no longer ours.
    other = f"mon_groups/{PREFIX}m2"
    os.mkdir(f"{intel.root}/{other}")
    data["mon_groups"][other] = os.stat(f"{intel.root}/{other}").st_ino + 1000
    with open(node.state_path, "w") as f:
        json.dump(data, f)
    again = make_node(intel, check_markers=True)  # see ResctrlNode on the emulator
    assert again.cleaned_mon_groups == [rel]
    assert not os.path.exists(f"{intel.root}/{rel}")
    assert os.path.isdir(f"{intel.root}/{other}")
    with open(again.state_path) as f:
        assert json.load(f)["mon_groups"] == {}


def test_a_recorded_monitoring_group_outside_the_root_is_never_removed(
    intel: Emulated, tmp_path
) -> None:
    node = make_node(intel)
    node.create_group(GroupSpec("a"))
    node.close()
    victim = tmp_path / "victim"  # outside the resctrl root
    victim.mkdir()
    with open(node.state_path) as f:
        data = json.load(f)
    rel = os.path.relpath(victim, intel.root)
    data["mon_groups"] = {rel: os.stat(victim).st_ino, "mon_groups/../../x": 1}
    with open(node.state_path, "w") as f:
        json.dump(data, f)
    again = make_node(intel, check_markers=True)
    assert victim.is_dir()
    assert again.cleaned_mon_groups == [] and set(again.groups()) == {"a"}


@pytest.mark.parametrize(
    ("which", "text"),
    [
        ("state", '{"version": 2, "groups": {"a": {"kind": "lc", "slo"'),  # cut short
        ("state", '{"version": 2, "groups": ["a"]}'),
        ("state", '["a"]'),
        ("intent", '{"op": "apply", "groups": {"a": {"old": {"L3": [1]}}}, "order": ["a"]}'),
        ("intent", '{"op": "apply", "groups": ["a"], "order": 7}'),
    ],
)
def test_a_damaged_state_or_intent_file_never_stops_the_next_start(
    intel: Emulated, which: str, text: str
) -> None:
    """A corrupt or wrongly shaped file is reported and the node starts; a state file that
    is not one is kept aside, not overwritten by the next save (its records could still be
    recovered by hand); its groups are then not adopted, and left alone."""
    node = make_node(intel)
    node.create_group(GroupSpec("a"))
    node.close()
    path = node.state_path + (".intent" if which == "intent" else "")
    with open(path, "w") as f:
        f.write(text)
    again = make_node(intel)
    again.create_group(GroupSpec("b"))  # saves the state file
    if which == "state":
        kept = [n for n in os.listdir(intel.state_dir) if ".corrupt-" in n]
        assert len(kept) == 1
        with open(os.path.join(intel.state_dir, kept[0])) as f:
            assert f.read() == text
        assert again.not_ours == ["a"] and set(again.groups()) == {"b"}
    else:
        assert again.recovered.startswith("failed") and set(again.groups()) == {"a", "b"}
        assert not os.path.exists(path)


def test_a_group_re_made_by_someone_else_is_not_adopted(intel: Emulated) -> None:
    node = make_node(intel)
    node.create_group(GroupSpec("svc", GroupKind.LC, SLO(99.0, 2.0)))
    node.close()
    os.rmdir(f"{intel.root}/{PREFIX}svc")
    os.mkdir(f"{intel.root}/{PREFIX}svc")  # same name, another owner
    intel.write(f"{PREFIX}svc/schemata", "L3:0=3;1=3\n")
    again = make_node(intel, check_markers=True)
    assert "svc" not in again.groups() and again.not_ours == ["svc"]
    assert again.vanished() == {"svc"}
    with pytest.raises(GroupNotFound):
        again.apply(AllocationPlan.uniform({"svc": GroupAllocation(l3_mask=0xFF)}, (0, 1)))
    held = schemata.parse(intel.read(f"{PREFIX}svc/schemata"))
    assert held.get("L3", 0) == held.get("L3", 1) == 0x3, "left as its owner wrote it"


def _remade_apply(node: ResctrlNode, pid: int) -> None:
    node.apply(AllocationPlan.uniform({"x": GroupAllocation(l3_mask=0xFF)}, (0, 1)))


def _remade_observe(node: ResctrlNode, pid: int) -> None:
    snap = node.observe()
    if "x" in snap.groups or "x" not in snap.vanished:
        raise AssertionError(f"observed as own: {sorted(snap.groups)}, {set(snap.vanished)}")


def _remade_tasks(node: ResctrlNode, pid: int) -> None:
    if node.tasks("x"):
        raise AssertionError("the other owner's tasks listed as own")


def _remade_groups(node: ResctrlNode, pid: int) -> None:
    if "x" in node.groups():
        raise AssertionError("still claimed")


@pytest.mark.parametrize(
    ("call", "still_vanished"),
    [
        pytest.param(_remade_apply, {"x"}, id="apply"),
        pytest.param(lambda node, pid: node.assign("x", pids=[pid]), {"x"}, id="assign"),
        pytest.param(_remade_tasks, {"x"}, id="tasks"),
        pytest.param(_remade_observe, {"x"}, id="observe"),
        pytest.param(_remade_groups, {"x"}, id="groups"),
        # as for a group that vanished: deleted means forgotten
        pytest.param(lambda node, pid: node.delete_group("x"), set(), id="delete_group"),
    ],
)
def test_a_running_node_leaves_its_group_re_made_by_someone_else_alone(
    intel: Emulated,
    children: list[int],
    call: Callable[[ResctrlNode, int], None],
    still_vanished: set[str],
) -> None:
    node = make_node(intel, check_markers=True)  # see ResctrlNode on the emulator
    node.create_group(GroupSpec("x"))
    node.create_group(GroupSpec("y"))
    node.observe()
    os.rmdir(f"{intel.root}/{PREFIX}x")
    os.mkdir(f"{intel.root}/{PREFIX}x")  # same name, another owner
    intel.write(f"{PREFIX}x/schemata", "L3:0=3;1=3\n")
    intel.write(f"{PREFIX}x/tasks", f"{children[0]}\n")
    try:
        call(node, children[1])
    except GroupNotFound as exc:
        assert "re-created by someone else" in str(exc)
    assert os.path.isdir(f"{intel.root}/{PREFIX}x"), "never removed"
    held = schemata.parse(intel.read(f"{PREFIX}x/schemata"))
    assert held.get("L3", 0) == held.get("L3", 1) == 0x3, "left as its owner wrote it"
    assert intel.read(f"{PREFIX}x/tasks").split() == [str(children[0])]
    assert node.vanished() == still_vanished and set(node.groups()) == {"y"}
    node.apply(AllocationPlan.uniform({"y": GroupAllocation(l3_mask=0xF)}, (0, 1)))
    node.close()


# ---------------------------------------------------------------------- tasks and cpus


def test_unknown_pid_in_a_batch_moves_nothing(inode: ResctrlNode, children: list[int]) -> None:
    _two_groups(inode)
    inode.assign("b", pids=[children[0]])
    bad = unknown_pid()
    with pytest.raises(UnknownTask, match=str(bad)):
        inode.assign("a", pids=[children[1], bad, children[0]])
    assert inode.tasks("a") == frozenset()
    assert children[0] in inode.tasks("b")


@pytest.mark.parametrize(
    "steps",
    [
        [f"{PREFIX}b"],  # an own group
        ["mon_groups/m"],  # a monitoring group of the default group
        # a foreign group's monitoring group, entered through its control group (the
        # kernel refuses a move into a monitoring group of another control group)
        ["other", "other/mon_groups/m"],
    ],
)
def test_kernel_refusal_mid_batch_puts_moved_tasks_back(
    intel: Emulated, inode: ResctrlNode, children: list[int], steps: list[str]
) -> None:
    _two_groups(inode)
    for rel in steps:
        if not os.path.isdir(os.path.join(intel.root, rel)):
            os.mkdir(os.path.join(intel.root, rel))
        with open(os.path.join(intel.root, rel, "tasks"), "w") as f:
            f.write(f"{children[0]}\n")
    intel.model.deny_task(children[1])
    with pytest.raises(KernelError) as err:
        inode.assign("a", pids=[children[0], children[1]])
    assert err.value.errno == errno.EPERM
    assert err.value.status == f"No permission to move task {children[1]}"
    assert inode.tasks("a") == frozenset()
    assert str(children[0]) in intel.read(f"{steps[-1]}/tasks").split(), "back where it was"


def test_task_that_exits_before_the_write(intel: Emulated, inode: ResctrlNode) -> None:
    # /proc says the pid exists but the kernel answers ESRCH (it exited in between).
    inode.create_group(GroupSpec("a"))
    intel.model.fail_next_write(f"{PREFIX}a/tasks", errno.ESRCH, "No task 1")
    with pytest.raises(UnknownTask, match="No task 1"):
        inode.assign("a", pids=[1])


def test_bad_cpus(intel: Emulated, inode: ResctrlNode, children: list[int]) -> None:
    inode.create_group(GroupSpec("a"))
    with pytest.raises(InvalidCpus, match=r"\[9\]"):
        inode.assign("a", cpus=[1, 9])  # 9 exists but is offline
    with pytest.raises(InvalidCpus):
        inode.assign("a", cpus=[-1])
    assert intel.read(f"{PREFIX}a/cpus_list") == "\n"
    intel.model.fail_next_write(f"{PREFIX}a/cpus_list", errno.EINVAL, "Bad CPU list/mask")
    with pytest.raises(InvalidCpus, match="Bad CPU list/mask"):
        inode.assign("a", pids=[children[0]], cpus=[1])
    assert inode.tasks("a") == frozenset(), "tasks moved in the same call went back"
    inode.assign("a", cpus=[1, 2])
    inode.assign("a", cpus=[5])
    assert intel.read(f"{PREFIX}a/cpus_list") == "1-2,5\n"


@pytest.mark.parametrize("start", [f"{PREFIX}b", "mon_groups/m"])
def test_refused_cpus_put_a_single_task_back_where_it_was(
    intel: Emulated, inode: ResctrlNode, children: list[int], start: str
) -> None:
    _two_groups(inode)
    if not os.path.isdir(os.path.join(intel.root, start)):
        os.mkdir(os.path.join(intel.root, start))
    with open(os.path.join(intel.root, start, "tasks"), "w") as f:
        f.write(f"{children[0]}\n")
    intel.model.fail_next_write(f"{PREFIX}a/cpus_list", errno.EINVAL, "Bad CPU list/mask")
    with pytest.raises(InvalidCpus, match="Bad CPU list/mask"):
        inode.assign("a", pids=[children[0]], cpus=[1])
    assert inode.tasks("a") == frozenset()
    assert str(children[0]) in intel.read(f"{start}/tasks").split(), "back where it was"


# ---------------------------------------------------------------------- observe


def test_unavailable_and_error_counters_read_as_none(
    intel: Emulated, inode: ResctrlNode, children: list[int]
) -> None:
    _two_groups(inode)
    inode.assign("a", pids=[children[0]])
    for event, value in (("mbm_total_bytes", "Unavailable"), ("llc_occupancy", "Error")):
        intel.model.set_counter(f"{PREFIX}a", event, value)
    intel.model.set_counter(f"{PREFIX}a", "mbm_local_bytes", "Unassigned", domain=0)
    inode.observe()
    time.sleep(0.02)
    a = inode.observe().groups["a"]
    assert a.memory_bytes is None and a.llc_occupancy_bytes is None
    assert a.memory_local_bytes is not None and a.memory_local_bytes > 0, "domain 1 still counts"
    for event in ("mbm_total_bytes", "llc_occupancy"):
        intel.model.set_counter(f"{PREFIX}a", event, None)
    assert inode.observe().groups["a"].memory_bytes is None, "first value: no baseline yet"
    time.sleep(0.02)
    assert inode.observe().groups["a"].memory_bytes > 0


def test_counter_reset_reads_as_no_value_then_counts_again(
    intel: Emulated, inode: ResctrlNode, children: list[int]
) -> None:
    inode.create_group(GroupSpec("a"))
    inode.assign("a", pids=children)
    inode.observe()
    time.sleep(0.05)
    assert inode.observe().groups["a"].memory_bytes > 0
    time.sleep(0.02)
    intel.model.reset_counters(f"{PREFIX}a")
    assert inode.observe().groups["a"].memory_bytes is None, "a drop is no interval's bytes"
    time.sleep(0.02)
    assert inode.observe().groups["a"].memory_bytes > 0


def test_removed_monitoring_group_is_no_bandwidth_spike(
    intel: Emulated, inode: ResctrlNode, children: list[int]
) -> None:
    # A control group's mon_data sums its own RMID and its monitoring groups' (monitor.c,
    # mon_event_count): another tool removing its monitoring group under an own group
    # drops the sum by that group's bytes, which is no reset to count from zero.
    inode.create_group(GroupSpec("a"))
    inode.assign("a", pids=children[:2])
    mon = os.path.join(intel.root, f"{PREFIX}a", "mon_groups", "cadvisor")
    os.mkdir(mon)
    with open(os.path.join(mon, "tasks"), "w") as f:
        f.write(f"{children[0]}\n")
    inode.observe()
    time.sleep(0.1)
    interval = inode.observe().groups["a"].memory_bytes
    assert interval > 0
    os.rmdir(mon)  # its task goes back to the group's own RMID
    assert inode.observe().groups["a"].memory_bytes is None  # was the group's lifetime bytes
    time.sleep(0.02)
    assert 0 < inode.observe().groups["a"].memory_bytes < interval


def test_observe_gives_bandwidth_occupancy_and_lc_latency(
    intel: Emulated, children: list[int]
) -> None:
    class Feed:
        def drain(self, group: str) -> LatencyStats | None:
            return LatencyStats(10, 1.0, 2.0, 3.0, 4.0) if group == "svc" else None

    node = make_node(intel, latency=Feed())
    node.create_group(GroupSpec("svc", GroupKind.LC, SLO(99.0, 5.0)))
    node.create_group(GroupSpec("idle"))
    node.assign("svc", pids=children[:2])
    node.observe()
    time.sleep(0.05)
    snap = node.observe()
    svc, idle = snap.groups["svc"], snap.groups["idle"]
    assert svc.latency == LatencyStats(10, 1.0, 2.0, 3.0, 4.0)
    assert idle.latency is None, "batch groups have no latency"
    assert svc.memory_bytes > 0 and svc.memory_local_bytes < svc.memory_bytes
    assert idle.memory_bytes == 0 and idle.llc_occupancy_bytes == 0
    assert svc.llc_occupancy_bytes > 0
    assert snap.bandwidth_bps("svc") > 0


def test_hardware_pmc_events_are_reported_unsupported(inode: ResctrlNode) -> None:
    caps = inode.capabilities()
    for event in ("instructions", "cycles", "llc_references", "llc_misses"):
        assert event in caps.pmc_events or event in caps.pmc_unsupported
    inode.create_group(GroupSpec("a"))
    sample = inode.observe().groups["a"]
    for event in caps.pmc_unsupported:
        assert getattr(sample, event) is None


# ---------------------------------------------------------------------- locking


def test_lock_held_by_another_user_gives_a_clear_error(intel: Emulated) -> None:
    node = make_node(intel, lock_timeout_s=0.1)
    node.create_group(GroupSpec("a"))
    fd = os.open(intel.root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # pqos doing a read-modify-write
        with pytest.raises(KernelError, match="another resctrl user"):
            node.apply(AllocationPlan.uniform({"a": GroupAllocation(l3_mask=0xF)}, (0, 1)))
        fcntl.flock(fd, fcntl.LOCK_SH)  # readers share
        assert set(node.allocation()) == {"a"}
        with pytest.raises(KernelError):
            node.create_group(GroupSpec("b"))
    finally:
        os.close(fd)
    node.create_group(GroupSpec("b"))


@pytest.mark.parametrize("stop", ["interrupt", "close"])
def test_a_call_waiting_for_the_lock_gives_up_when_the_agent_stops(
    intel: Emulated, stop: str
) -> None:
    node = make_node(intel, lock_timeout_s=30.0)
    node.create_group(GroupSpec("a"))
    before = intel.read(f"{PREFIX}a/schemata")
    plan = AllocationPlan.uniform({"a": GroupAllocation(l3_mask=0xF)}, (0, 1))
    errors: list[Exception] = []

    def apply() -> None:
        try:
            node.apply(plan)
        except Exception as exc:
            errors.append(exc)

    fd = os.open(intel.root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # pqos doing a read-modify-write
        waiting = threading.Thread(target=apply, daemon=True)
        waiting.start()
        time.sleep(0.2)
        assert waiting.is_alive(), "waiting for the lock"
        started = time.monotonic()
        getattr(node, stop)()
        waiting.join(2.0)
        assert not waiting.is_alive() and time.monotonic() - started < 1.0
        assert len(errors) == 1 and isinstance(errors[0], LockInterrupted)
        assert "interrupted: the agent is stopping" in str(errors[0])
        assert errors[0].code == "UNAVAILABLE"
        started = time.monotonic()
        with pytest.raises(LockInterrupted):  # and one coming later does not wait either
            node.apply(plan)
        assert time.monotonic() - started < 1.0
    finally:
        os.close(fd)  # the other tool lets go
    time.sleep(0.1)
    assert intel.read(f"{PREFIX}a/schemata") == before, "nothing written after the stop"
    assert set(node.allocation()) == {"a"}, "a free lock is still taken (restore-on-exit)"


def test_the_lock_nests_but_never_upgrades(intel: Emulated) -> None:
    lock = ResctrlLock(intel.root, timeout_s=0.1)
    fd = os.open(intel.root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        # Nested inside exclusive, a shared section is still exclusive.
        with lock.exclusive(), lock.shared(), pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        # A shared section asking for exclusive would be dropped to no lock by a refused
        # flock conversion: refused outright instead.
        with (
            lock.shared(),
            pytest.raises(RuntimeError, match="cannot be upgraded"),
            lock.exclusive(),
        ):
            pass
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # and released after
    finally:
        os.close(fd)


# ---------------------------------------------------------------------- PMC seam


class RecordingPmc:
    """A PMC source at ResctrlNode's seam (agent.pmc.PmcReader's shape) on a machine that
    has a PMU: counts are the number of tracked pids, so the test can see them flow."""

    supported = frozenset({"instructions", "cycles"})
    unsupported = {"llc_references": "ENOENT", "llc_misses": "ENOENT"}

    def __init__(self) -> None:
        self.tracked: dict[str, list[int]] = {}

    def track(self, name: str, *, tids) -> None:
        self.tracked[name] = list(tids)

    def untrack(self, name: str) -> None:
        self.tracked.pop(name, None)

    def read_deltas(self):
        return {
            n: {"instructions": 1000.0 * len(p), "cycles": 500.0 * len(p), "llc_misses": None}
            for n, p in self.tracked.items()
        }

    def close(self) -> None:
        self.tracked.clear()


def test_pmc_counts_follow_the_group_tasks(intel: Emulated, children: list[int]) -> None:
    pmc = RecordingPmc()
    node = make_node(intel, pmc=pmc)
    caps = node.capabilities()
    assert caps.pmc_events == {"instructions", "cycles"}
    assert set(caps.pmc_unsupported) == {"llc_references", "llc_misses"}
    _two_groups(node)
    node.assign("a", pids=children[:2])
    # Counted from the observation that finds them: the interval they joined in was not.
    assert node.observe().groups["a"].instructions is None
    assert pmc.tracked["a"] == sorted(children[:2])
    sample = node.observe().groups["a"]
    assert (sample.instructions, sample.cycles, sample.llc_misses) == (2000.0, 1000.0, None)
    assert sample.ipc == 2.0
    node.assign("b", pids=[children[0]])
    # The interval's counts come from the counters it ran with, then "a" is re-tracked.
    assert node.observe().groups["a"].instructions == 2000.0
    assert pmc.tracked["a"] == [children[1]], "re-tracked when the group's tasks change"
    assert node.observe().groups["a"].instructions == 1000.0
    node.delete_group("a")
    assert "a" not in pmc.tracked


@pytest.mark.parametrize("with_tasks", [True, False])
def test_pmc_a_group_holding_cpus_is_not_counted(
    intel: Emulated, children: list[int], with_tasks: bool
) -> None:
    """Default-group tasks on a group's CPUs do its work unseen by per-thread counters:
    neither its listed tasks' counts nor an empty group's 0 would be its count."""
    pmc = RecordingPmc()
    node = make_node(intel, pmc=pmc)
    _two_groups(node)
    node.assign("a", pids=children[:1])
    node.observe()
    assert "a" in pmc.tracked
    node.assign("a", pids=children[1:2] if with_tasks else (), cpus=[1])
    if not with_tasks:
        node.assign("b", pids=children[:1])  # "a" keeps no task
    for _ in range(2):
        assert node.observe().groups["a"].instructions is None
        assert "a" not in pmc.tracked
    assert node.observe().groups["b"].instructions == (0.0 if with_tasks else 1000.0)


class UnscheduledPmc(RecordingPmc):
    """A reader whose instructions event was enabled but never ran in the interval: perf's
    time_running of 0, which agent.pmc.counters.combine reads as NaN."""

    def read_deltas(self):
        return {n: {**c, "instructions": math.nan} for n, c in super().read_deltas().items()}


def test_a_pmc_count_that_never_ran_is_not_measured(intel: Emulated, children: list[int]):
    """NaN would pass a controller's ``is None`` guard and stay in every running average
    it entered: the node reports it as what it is, not measured (None)."""
    node = make_node(intel, pmc=UnscheduledPmc())
    _two_groups(node)
    node.assign("a", pids=children[:2])
    node.observe()
    sample = node.observe().groups["a"]
    assert (sample.instructions, sample.cycles) == (None, 1000.0)


class FailingOncePmc(RecordingPmc):
    """A reader whose next track fails (as PmcReader's: the name is left untracked)."""

    fail_next = False

    def track(self, name: str, *, tids) -> None:
        self.tracked.pop(name, None)
        if self.fail_next:
            self.fail_next = False
            raise OSError(errno.EMFILE, "Too many open files")
        super().track(name, tids=tids)


def test_pmc_failed_retrack_is_retried_on_the_old_threads(
    intel: Emulated, children: list[int]
) -> None:
    pmc = FailingOncePmc()
    node = make_node(intel, pmc=pmc)
    _two_groups(node)
    node.assign("a", pids=children[:2])
    node.observe()
    assert pmc.tracked["a"] == sorted(children[:2])
    node.assign("b", pids=[children[1]])
    pmc.fail_next = True
    node.observe()  # the re-track on one thread fails: "a" is counted by nothing
    assert "a" not in pmc.tracked
    node.assign("a", pids=[children[1]])  # the thread comes back: the set "a" had before
    node.observe()
    assert pmc.tracked["a"] == sorted(children[:2]), "a failed track is retried"
    assert node.observe().groups["a"].instructions == 2000.0


def test_pmc_fd_exhaustion_is_said_once(intel: Emulated, caplog: pytest.LogCaptureFixture) -> None:
    child = Child(burn_s=0.0, mode="thread")
    pmc = PmcReader(("task_clock", "page_faults"), supported={"task_clock", "page_faults"})
    node = make_node(intel, pmc=pmc)
    try:
        node.create_group(GroupSpec("a"))
        node.assign("a", pids=[int(t) for t in os.listdir(f"/proc/{child.pid}/task")])
        # Room for the files an observation reads, one at a time, but not for the group's
        # 2 events x 2 threads: the real perf_event_open fails with EMFILE.
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        used = set(open_fds())
        limit = next(n for n in range(1, soft) if n - len({u for u in used if u < n}) == 3)
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
        try:
            for _ in range(3):
                assert node.observe().groups["a"].instructions is None
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        said = [r for r in caplog.records if "no PMC counts for group a" in r.getMessage()]
        assert len(said) == 1 and said[0].levelname == "WARNING"
        assert f"RLIMIT_NOFILE is {limit}" in said[0].getMessage()
        node.observe()  # the limit raised again: the counters open
        assert pmc.fd_count == 4
    finally:
        node.close()
        pmc.close()
        child.kill()


def test_pmc_reserve_refusal_is_said_once(
    intel: Emulated, children: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    """A group refused for the descriptor reserve is warned about once, although the
    number of descriptors open (which the message gives) changes between observations."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    pmc = PmcReader(("task_clock",), supported={"task_clock"}, fd_reserve=soft)
    node = make_node(intel, pmc=pmc)
    held: list[int] = []
    try:
        _two_groups(node)
        node.assign("a", pids=children[:1])
        for _ in range(3):
            held.append(os.open(os.devnull, os.O_RDONLY))
            assert node.observe().groups["a"].instructions is None
        said = [r for r in caplog.records if "no PMC counts for group a" in r.getMessage()]
        assert len(said) == 1 and "kept for the rest of the agent" in said[0].getMessage()
    finally:
        for fd in held:
            os.close(fd)
        node.close()
        pmc.close()


class SeenPmc(PmcReader):
    """The real reader (software events through perf_event_open), keeping what the node
    last read of it: GroupSample carries hardware events only."""

    last: dict = {}

    def read_deltas(self):
        self.last = super().read_deltas()
        return self.last


def test_real_pmc_counts_each_listed_thread_once(intel: Emulated) -> None:
    child = Child(burn_s=0.15, mode="thread")  # two threads, each burns 0.15 s
    pmc = SeenPmc(("task_clock", "page_faults"), supported={"task_clock", "page_faults"})
    node = make_node(intel, pmc=pmc)
    try:
        tids = sorted(int(t) for t in os.listdir(f"/proc/{child.pid}/task"))
        assert len(tids) == 2
        node.create_group(GroupSpec("a"))
        node.assign("a", pids=tids)  # resctrl's tasks file lists thread ids
        node.observe()  # opens the counters on the threads it lists
        # 2 events x 2 threads: counting each listed thread's whole process would open 8.
        assert pmc.fd_count == 4
        child.go()
        report, _ = child.finish()
        # The threads are gone: the interval is read from the counters it ran with,
        # before the group (now empty) is re-tracked.
        node.observe()
        counted = pmc.last["a"]["task_clock"] / 1e9
        assert 0.9 * report["work_cpu"] <= counted <= 1.3 * report["work_cpu"] + 0.05
    finally:
        node.close()
        pmc.close()
        child.kill()


@pytest.mark.parametrize("replacement", [os.devnull, "/"])
def test_one_unreadable_pmc_group_keeps_the_others_and_is_reopened(
    intel: Emulated, children: list[int], replacement: str
) -> None:
    pmc = SeenPmc(("task_clock", "page_faults"), supported={"task_clock", "page_faults"})
    node = make_node(intel, pmc=pmc)
    try:
        _two_groups(node)
        node.assign("a", pids=children[:1])
        node.assign("b", pids=children[1:2])
        node.observe()  # opens both groups' counters
        # Fault injection at the OS boundary: b's leader fd now reads /dev/null (0 bytes,
        # as the kernel answers for an event in error state) or a directory (EISDIR).
        other = os.open(replacement, os.O_RDONLY)
        os.dup2(other, pmc._tracked["b"].counters._groups[0].fds[0])
        os.close(other)
        node.observe()
        assert pmc.last["b"] is None
        assert pmc.last["a"]["task_clock"] is not None, "a's counts survive b's failure"
        assert pmc.tracked() == ("a", "b") and pmc.fd_count == 4, "b is opened again"
        node.observe()
        assert pmc.last["b"]["task_clock"] is not None
    finally:
        node.close()
        pmc.close()


def test_unwritable_state_dir_creates_nothing(intel: Emulated, tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(OSError, match="Not a directory"):  # refused at start
        make_node(intel, state_dir=str(blocker / "state"))
    # a state directory that stops taking writes later (here it is replaced by a file)
    state_dir = tmp_path / "state"
    node = make_node(intel, state_dir=str(state_dir))
    shutil.rmtree(state_dir)
    state_dir.write_text("not a directory either")
    with pytest.raises(OSError, match="was not created"):
        node.create_group(GroupSpec("a"))
    assert node.groups() == {}
    assert not os.path.exists(f"{intel.root}/{PREFIX}a")


def test_a_full_state_disk_changes_nothing_and_never_stops_a_restart(intel: Emulated) -> None:
    """A restart with nothing new to record writes nothing (before, it rewrote the state
    file and a full disk kept the agent from starting); an apply that cannot journal its
    intent changes nothing and says so as a retryable error naming the file."""
    node = make_node(intel)
    for name in ("a", "b"):
        node.create_group(GroupSpec(name))
    node.close()
    before = os.stat(node.state_path)
    again = make_node(intel)
    after = os.stat(again.state_path)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    held = again.allocation()
    shutil.rmtree(intel.state_dir)  # the journal's directory gone: every write fails
    open(intel.state_dir, "w").close()
    plan = AllocationPlan.uniform(
        {"a": GroupAllocation(l3_mask=0x3), "b": GroupAllocation(l3_mask=0xC)}, (0, 1)
    )
    with pytest.raises(StateUnwritable, match=r"\.intent failed") as err:
        again.apply(plan)
    assert err.value.code == "UNAVAILABLE"
    assert again.allocation() == held
    os.remove(intel.state_dir)
    os.mkdir(intel.state_dir)


@pytest.fixture
def full_state_dir(tmp_path) -> Iterator[str]:
    """A state directory on a small tmpfs, to be filled by the test (needs mount(2))."""
    where = tmp_path / "state"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(where)])
    if done.returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield str(where)
    finally:
        subprocess.run(["umount", "-l", str(where)])


def _fill(directory: str) -> None:
    with contextlib.suppress(OSError), open(os.path.join(directory, "filler"), "wb") as f:
        while True:
            f.write(b"\0" * 4096)
            f.flush()


def test_a_restart_after_a_reboot_serves_on_a_full_state_disk(
    intel: Emulated, full_state_dir: str
) -> None:
    """After a reboot (resctrl empty) the start has something new to record (the groups
    are gone); a full disk only defers that (before, the start failed)."""
    node = make_node(intel, state_dir=full_state_dir)
    node.create_group(GroupSpec("g"))
    node.close()
    os.rmdir(f"{intel.root}/{PREFIX}g")  # the reboot
    os.remove(node.state_path + ".lock")  # a first start after this version: no lock file
    _fill(full_state_dir)
    again = make_node(intel, state_dir=full_state_dir)
    assert again.vanished() == {"g"} and again.groups() == {}
    again.close()
    os.remove(os.path.join(full_state_dir, "filler"))
    assert make_node(intel, state_dir=full_state_dir).vanished() == {"g"}


def test_one_live_node_per_state_file(intel: Emulated) -> None:
    """A second agent on the same root and state file is refused at start (before, both ran
    and each saved only its own groups, so a restart lost the other's); the lock goes with
    its holder, a close or a kill -9, and never blocks a restart."""
    first = make_node(intel)
    first.create_group(GroupSpec("a"))
    with pytest.raises(InUse, match=f"another rdtune agent \\(pid {os.getpid()}\\)"):
        make_node(intel)
    first.create_group(GroupSpec("b"))
    first.close()
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_NODE, intel.root, intel.state_dir],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])},
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        with pytest.raises(InUse, match=f"pid {holder.pid}"):
            make_node(intel)
    finally:
        holder.kill()  # SIGKILL: nothing of the holder's runs
        holder.wait()
    assert set(make_node(intel).groups()) == {"a", "b"}


def test_a_lock_file_removed_by_hand_lets_no_second_agent_change_the_node(
    intel: Emulated, caplog
) -> None:
    """Removing ``<state>.lock`` while an agent runs let a second agent lock a new file and
    run beside it. The first now checks its lock before each change it records: it locks
    the path again, or, where a second agent got there first, changes nothing more."""
    first = make_node(intel)
    first.create_group(GroupSpec("a"))
    lock = first.state_path + ".lock"
    os.remove(lock)
    first.create_group(GroupSpec("b"))  # locks the path again
    assert "the lock file was removed while this agent ran; locked again" in caplog.text
    with pytest.raises(InUse, match="another rdtune agent"):
        make_node(intel)
    os.remove(lock)
    second = make_node(intel)  # before the first changes anything: it cannot know yet
    assert set(second.groups()) == {"a", "b"}
    with pytest.raises(InUse, match="lock file was removed while it ran, and it changes nothing"):
        first.create_group(GroupSpec("c"))
    with pytest.raises(InUse, match="changes nothing more"):
        first.delete_group("a")
    assert not os.path.exists(f"{intel.root}/{PREFIX}c")
    assert os.path.isdir(f"{intel.root}/{PREFIX}a")
    second.create_group(GroupSpec("c"))
    second.close()
    assert set(make_node(intel).groups()) == {"a", "b", "c"}


_HOLD_NODE = """
import sys, time
from agent.resctrl import ResctrlNode
node = ResctrlNode(sys.argv[1], state_dir=sys.argv[2], pmc=None)
print("ready", flush=True)
time.sleep(60)
"""


def test_two_roots_sharing_a_state_dir_keep_apart(intel: Emulated) -> None:
    with emulated_resctrl("gold-6130") as other:
        a = make_node(intel)
        b = ResctrlNode(other.root, state_dir=intel.state_dir, pmc=None)
        a.create_group(GroupSpec("svc", GroupKind.LC, SLO(99.0, 1.0)))
        b.create_group(GroupSpec("svc"))
        assert a.state_path != b.state_path
        a.close()
        assert make_node(intel).groups()["svc"].kind is GroupKind.LC


@pytest.mark.parametrize("planted", ["symlink", "stale file"])
def test_the_journal_never_writes_through_what_is_at_its_temporary_name(
    intel: Emulated, tmp_path, planted: str
) -> None:
    """The agent runs as root: a link planted at the journal's temporary name must not
    make it truncate the file linked to, and a temporary file a crash left is replaced."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    node = make_node(intel)
    tmp = node.state_path + ".intent.tmp"
    if planted == "symlink":
        os.symlink(victim, tmp)
    else:
        Path(tmp).write_text("left by a crash")
    try:
        node.create_group(GroupSpec("a"))
    finally:
        node.close()
    assert victim.read_text() == "precious\n"
    assert not os.path.lexists(tmp)
    again = make_node(intel)
    try:
        assert "a" in again.groups()
    finally:
        again.close()


@pytest.mark.parametrize(
    ("mode", "owner", "why"),
    [
        (0o777, None, "group or others can write it"),
        (0o720, None, "group or others can write it"),
        (0o700, 65534, "owned by uid 65534"),
    ],
)
def test_a_state_directory_others_could_write_is_refused_at_start(
    intel: Emulated, tmp_path, mode: int, owner: int | None, why: str
) -> None:
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o700)
    state_dir.chmod(mode)
    if owner is not None:
        if os.geteuid() != 0:
            pytest.skip("only root can give a directory to another user")
        os.chown(state_dir, owner, -1)
    with pytest.raises(StateUnwritable, match=f"refusing the state directory .*{why}") as err:
        make_node(intel, state_dir=str(state_dir))
    assert "\n" not in str(err.value)
    assert os.listdir(state_dir) == []


# ---------------------------------------------------------------------- refused at start
# Each refusal yields the node's arguments, and the error and message the start must give.
Refusal = Callable[[Emulated, Path], contextlib.AbstractContextManager[tuple[dict, type, str]]]


@contextlib.contextmanager
def _not_resctrl(emu: Emulated, tmp_path: Path) -> Iterator[tuple[dict, type, str]]:
    yield {"root": str(tmp_path)}, FileNotFoundError, "is not a resctrl filesystem"


@contextlib.contextmanager
def _unsafe_state_dir(emu: Emulated, tmp_path: Path) -> Iterator[tuple[dict, type, str]]:
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    state_dir.chmod(0o777)
    yield {"state_dir": str(state_dir)}, StateUnwritable, "group or others can write it"


@contextlib.contextmanager
def _another_agent(emu: Emulated, tmp_path: Path) -> Iterator[tuple[dict, type, str]]:
    other = make_node(emu, pmc=None)
    try:
        yield {}, InUse, "another rdtune agent"
    finally:
        other.close()


@contextlib.contextmanager
def _root_busy_at_adoption(emu: Emulated, tmp_path: Path) -> Iterator[tuple[dict, type, str]]:
    """Another resctrl user reading (LOCK_SH): discovery shares the lock, the adoption
    after the instance lock is taken times out on its exclusive one."""
    fd = os.open(emu.root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield {"lock_timeout_s": 0.05}, KernelError, "another resctrl user"
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    "refusal",
    [_not_resctrl, _unsafe_state_dir, _another_agent, _root_busy_at_adoption],
    ids=["not resctrl", "unsafe state dir", "another agent", "root busy at adoption"],
)
@pytest.mark.parametrize("reader", ["auto", "auto, counting from the start", "the caller's"])
def test_a_start_refused_leaves_nothing_open(
    intel: Emulated, tmp_path: Path, request: pytest.FixtureRequest, refusal: Refusal, reader: str
) -> None:
    """A refused start (the agent's, retried) closes the PMC reader it made and lets go of
    the instance lock, last first, and raises the refusal itself; a reader the caller
    passed stays open, counting (before, the node's own reader was left to the GC)."""
    mine = None
    if reader == "the caller's":
        mine = PmcReader(("task_clock",))
        mine.track("mine", tids=[threading.get_native_id()])
    elif reader.endswith("from the start"):
        request.getfixturevalue("counting_from_the_start")
    try:
        with refusal(intel, tmp_path) as (kwargs, raised, match):
            root = kwargs.pop("root", intel.root)
            kwargs.setdefault("state_dir", intel.state_dir)
            fds, perf = fd_count(), perf_fds()
            for _ in range(3):
                with pytest.raises(raised, match=match) as err:
                    ResctrlNode(root, pmc=mine or "auto", **kwargs)
                assert type(err.value) is raised
            assert (fd_count(), perf_fds()) == (fds, perf)
        if mine is not None:
            assert mine.tracked() == ("mine",) and mine.fd_count == 1
            assert mine.read_deltas()["mine"]["task_clock"] > 0
        make_node(intel, pmc=None).close()  # no refused start holds the state file
    finally:
        if mine is not None:
            mine.close()
