"""Grouped counters through the real perf_event_open with software events: a thread, child
processes (threads, inheritance, several pids), a real cgroup v2; scaling and deltas on
constructed counts; errors from the kernel as clear messages."""

from __future__ import annotations

import ctypes
import errno
import itertools
import json
import math
import os
import resource

import pytest

from agent.pmc import (
    GroupCounters,
    PmcError,
    PmcPermissionError,
    PmcTaskGone,
    PmcTooManyFiles,
    PmcUnsupported,
)
from agent.pmc import perf_event as pe
from agent.pmc.counters import combine, delta, online_cpus, scale
from tests.agent.pmc.conftest import move_to_cgroup, open_fds, perf_fds
from tests.agent.pmc.workload import burn, nap, touch_pages
from tests.agent.resctrl.conftest import unknown_pid

TRIO = ["task_clock", "context_switches", "page_faults"]


# --------------------------------------------------------------------------- scaling


@pytest.mark.parametrize(
    ("count", "expected"),
    [
        ((100, 1000, 1000), (100.0, 1.0)),  # counted all the time
        ((100, 1000, 250), (400.0, 4.0)),  # multiplexed: counted a quarter of the time
        ((100, 1000, 1001), (100.0, 1.0)),  # running can round past enabled
        ((0, 0, 0), (0.0, 1.0)),  # never enabled
        ((0, 1000, 0), (0.0, math.inf)),  # enabled, never scheduled
    ],
)
def test_scale(count, expected):
    assert scale(*count) == expected


@pytest.mark.parametrize(
    ("groups", "value", "factor"),
    [
        # cpu 0 always on, cpu 1 half the time: 2600 raw over 150 of 200 ns
        ([(2000, 100, 100), (600, 100, 50)], 2600 * 200 / 150, 200 / 150),
        # thread B on CPU as long as A but never scheduled: extrapolated from A's rate
        ([(1_000_000, 10_000_000, 5_000_000), (0, 10_000_000, 0)], 4_000_000.0, 4.0),
        ([(300, 100, 100), (200, 100, 100)], 500.0, 1.0),  # never multiplexed
    ],
)
def test_combine_sums_then_scales_once(groups, value, factor):
    r = combine(["cycles"], [{"cycles": g} for g in groups])
    assert r.values["cycles"] == pytest.approx(value)
    assert r.scaling["cycles"] == pytest.approx(factor)
    assert r.values["cycles"] == pytest.approx(r.raw["cycles"] * r.scaling["cycles"])
    assert r.multiplexed is (factor > 1.0)


def test_combine_never_scheduled_is_nan_not_zero():
    r = combine(["cycles"], [{"cycles": (0, 500, 0)}, {"cycles": (0, 300, 0)}])
    assert math.isnan(r.values["cycles"]) and r.scaling["cycles"] == math.inf
    idle = combine(["cycles"], [{"cycles": (0, 0, 0)}])
    assert idle.values == {"cycles": 0.0} and not idle.multiplexed


def test_delta_is_scaled_with_the_intervals_own_times():
    before = {"cycles": (100, 1000, 1000)}  # first interval: never multiplexed
    now = {"cycles": (300, 3000, 2000)}  # second: counted 1000 of 2000 ns -> x2
    r = combine(["cycles"], [delta(now, before)])
    assert r.values == {"cycles": 400.0} and r.scaling == {"cycles": 2.0}


def test_online_cpus_parses_ranges(tmp_path):
    f = tmp_path / "online"
    f.write_text("0-3,8,10-11\n")
    assert online_cpus(str(f)) == [0, 1, 2, 3, 8, 10, 11]
    assert online_cpus() == sorted(online_cpus())  # this machine's list parses


# --------------------------------------------------------------------------- this thread


@pytest.mark.parametrize("group_read", [True, False], ids=["group-read", "per-event-read"])
def test_group_counts_this_threads_work(group_read):
    with GroupCounters.for_task(TRIO, group_read=group_read) as c:
        assert c.fd_count == 3 and c.group_read is group_read
        cpu = burn(0.08)
        touch_pages(400)
        nap(5)
        r = c.sample()
    # task_clock: ns this thread ran, close to the CPU time measured around the work
    assert r.values["task_clock"] == pytest.approx(cpu * 1e9, rel=0.25)
    assert r.values["page_faults"] >= 400
    assert r.values["context_switches"] >= 5
    assert not r.multiplexed and r.raw["page_faults"] == r.values["page_faults"]
    assert r.time_enabled["task_clock"] >= r.values["task_clock"] * 0.9


@pytest.mark.parametrize("order", list(itertools.permutations(TRIO)), ids="-".join)
def test_group_read_ids_map_to_the_right_events(order):
    with GroupCounters.for_task(order) as c:
        (group,) = c._groups
        assert sorted(group.ids.values()) == sorted(order) and len(set(group.ids)) == 3
        touch_pages(5000)
        nap(3)
        burn(0.02)
        v = c.read()
    # each name got a figure of its own kind, in ranges far apart: ns of CPU (>= 1.5e7),
    # faults (one per page touched), a few switches (the naps, plus preemptions on a busy
    # host: hundreds were seen under load, never thousands)
    assert 1.5e7 < v["task_clock"] < 1e10
    assert 5000 <= v["page_faults"] < 50_000
    assert 3 <= v["context_switches"] < 4000


def test_read_delta_splits_the_work_into_intervals():
    with GroupCounters.for_task(TRIO) as c:
        touch_pages(500)
        first = c.read_delta()
        touch_pages(100)
        second = c.read_delta()
        third = c.read_delta()
        total = c.read()
    assert first["page_faults"] >= 500 and 100 <= second["page_faults"] < 500
    assert third["page_faults"] < 50
    # The counts since the last delta go on until the total is read. For this thread's CPU
    # time that was once 1.1 of 2.8 ms in a loaded pytest-xdist worker (the Python work
    # between the two reads, a garbage collection among it), so it gets a slack of 50 ms.
    slack = {"task_clock": 5e7}
    for name in TRIO:
        got = first[name] + second[name] + third[name]
        assert got <= total[name]
        assert total[name] - got < max(10, 0.2 * total[name], slack.get(name, 0))


def test_disable_enable_and_reset():
    with GroupCounters.for_task(["page_faults"]) as c:
        c.disable()
        touch_pages(200)
        assert c.read()["page_faults"] < 20
        c.enable()
        touch_pages(200)
        assert c.read()["page_faults"] >= 200
        c.reset()
        assert c.read()["page_faults"] < 20
        touch_pages(100)
        assert 100 <= c.read_delta()["page_faults"] < 150  # baseline taken at reset


def test_close_closes_every_fd_and_is_idempotent():
    base = perf_fds()
    c = GroupCounters.for_task(TRIO)
    assert perf_fds() == base + 3
    c.close()
    assert perf_fds() == base and c.closed
    c.close()
    with pytest.raises(PmcError, match="closed"):
        c.read()


# --------------------------------------------------------------------------- processes


def test_for_pids_counts_a_child(child_factory):
    child = child_factory(burn_s=0.1, pages=300)
    with GroupCounters.for_pids([child.pid], TRIO) as c:
        child.go()
        report, accounted = child.finish()
        v = c.read()
    assert report["work_cpu"] * 1e9 * 0.9 <= v["task_clock"] <= (accounted + 0.02) * 1e9
    assert v["page_faults"] >= 300


def test_for_pids_sums_several_pids(child_factory):
    children = [child_factory(burn_s=0.05) for _ in range(2)]
    with GroupCounters.for_pids([ch.pid for ch in children], ["task_clock"]) as c:
        for ch in children:
            ch.go()
        results = [ch.finish() for ch in children]
        v = c.read()
    work = sum(r["work_cpu"] for r, _ in results)
    accounted = sum(a for _, a in results)
    assert work * 1e9 * 0.9 <= v["task_clock"] <= (accounted + 0.02) * 1e9


@pytest.mark.parametrize("threads", [True, False])
def test_for_pids_counts_threads_that_already_exist(child_factory, threads):
    child = child_factory(burn_s=0.06, mode="thread")  # main + helper thread, both burn
    with GroupCounters.for_pids([child.pid], ["task_clock"], threads=threads) as c:
        assert c.fd_count == (2 if threads else 1)
        child.go()
        child.finish()
        v = c.read()
    if threads:
        assert v["task_clock"] >= 2 * 0.06e9 * 0.9
    else:  # only the main thread: the helper started before the counters opened
        assert 0.06e9 * 0.9 <= v["task_clock"] < 2 * 0.06e9 * 0.9


def test_for_threads_counts_each_listed_thread_once(child_factory):
    child = child_factory(burn_s=0.06, mode="thread")
    tids = [int(t) for t in os.listdir(f"/proc/{child.pid}/task")]
    gone = unknown_pid()
    # Both threads listed (as a resctrl tasks file lists them), one twice, plus a thread
    # that exited before the counters opened: skipped, not an error.
    with GroupCounters.for_threads([*tids, tids[0], gone], ["task_clock"]) as c:
        assert c.fd_count == 2
        child.go()
        report, _ = child.finish()
        v = c.read()
    assert 0.9 * report["work_cpu"] * 1e9 <= v["task_clock"] <= 1.3 * report["work_cpu"] * 1e9


def test_for_threads_with_every_thread_gone_is_an_error():
    with pytest.raises(PmcError, match="nothing to count"):
        GroupCounters.for_threads([unknown_pid()], ["task_clock"])


@pytest.mark.parametrize("inherit", [True, False])
def test_inherit_counts_processes_spawned_later(child_factory, inherit):
    child = child_factory(burn_s=0.08, mode="grandchild")  # the grandchild does the burning
    with GroupCounters.for_pids([child.pid], ["task_clock", "page_faults"], inherit=inherit) as c:
        assert c.group_read  # this kernel reads inherited groups in one go
        child.go()
        child.finish()
        v = c.read()
    if inherit:
        assert v["task_clock"] >= 0.08e9 * 0.9
    else:
        assert v["task_clock"] < 0.08e9 * 0.5


class OldKernel:
    """Fault injection at the OS boundary (libc's syscall): a kernel that refuses
    PERF_FORMAT_GROUP together with inherit (EINVAL, as older kernels do) and answers the
    per-event retry with ``retry_errno`` (0: opens it)."""

    def __init__(self, retry_errno: int) -> None:
        self.real = pe._syscall
        self.retry_errno = retry_errno

    def __call__(self, nr, attr_ptr, pid, cpu, group_fd, flags):
        attr = pe.perf_event_attr.from_address(attr_ptr.value)
        if attr.flags & pe.ATTR_INHERIT:
            refused = attr.read_format & pe.PERF_FORMAT_GROUP and errno.EINVAL
            err = refused or self.retry_errno
            if err:
                ctypes.set_errno(err)
                return -1
        return self.real(nr, attr_ptr, pid, cpu, group_fd, flags)


@pytest.mark.parametrize(
    ("retry_errno", "raised"),
    [(0, None), (errno.EMFILE, PmcTooManyFiles), (errno.EACCES, PmcPermissionError)],
)
def test_group_read_fallback_reports_its_own_error(monkeypatch, retry_errno, raised):
    monkeypatch.setattr(pe, "_syscall", OldKernel(retry_errno))
    if raised is None:
        with GroupCounters.for_task(TRIO, inherit=True) as c:
            assert not c.group_read and c.fd_count == 3
            burn(0.01)
            assert c.read()["task_clock"] > 0
        return
    with pytest.raises(raised) as err:
        GroupCounters.for_task(TRIO, inherit=True)
    assert err.value.errno == retry_errno and "\n" not in str(err.value)


# --------------------------------------------------------------------------- cgroup


def test_for_cgroup_counts_only_the_cgroups_tasks(cgroup_dir, child_factory):
    child = child_factory(burn_s=0.1, pages=300)
    move_to_cgroup(cgroup_dir, child.pid)
    with GroupCounters.for_cgroup(cgroup_dir, TRIO) as c:
        assert c.fd_count == 3 * len(online_cpus())  # one group per online CPU
        child.go()
        burn(0.1)  # work outside the cgroup must not be counted
        report, accounted = child.finish()
        first = c.read_delta()
        touch_pages(200)
        second = c.read_delta()
    assert report["work_cpu"] * 1e9 * 0.9 <= first["task_clock"] <= (accounted + 0.02) * 1e9
    assert first["page_faults"] >= 300 and first["context_switches"] >= 1
    assert second == {name: 0.0 for name in TRIO}  # the child is gone; we are not inside


# --------------------------------------------------------------------------- errors


def test_vanished_pid_is_esrch(child_factory):
    child = child_factory(burn_s=0)
    child.go()
    child.finish()
    with pytest.raises(PmcTaskGone, match=rf"no task with pid {child.pid}") as info:
        GroupCounters.for_pids([child.pid], TRIO)
    assert info.value.pid == child.pid and info.value.code == "NOT_FOUND"


def test_a_target_refused_part_way_closes_the_groups_already_open():
    """The groups of the targets opened before one is refused are closed by the refusal,
    not left to the GC (the traceback, kept here, holds the half-built counters)."""
    base = perf_fds()
    gone = unknown_pid()
    with pytest.raises(PmcTaskGone, match=rf"no task with pid {gone}") as info:
        GroupCounters.for_pids([os.getpid(), gone], TRIO)
    assert info.value.pid == gone and perf_fds() == base


def test_unsupported_event_says_why():
    try:
        GroupCounters.for_task(["instructions"]).close()
    except PmcUnsupported as exc:
        assert str(exc).startswith("perf_event_open(instructions) on pid 0: E")
        assert exc.code == "FAILED_PRECONDITION"
    else:
        pytest.skip("this machine has a hardware PMU: instructions can be counted")


def test_mixed_group_fails_whole_and_closes_what_it_opened():
    base = perf_fds()
    try:
        GroupCounters.for_task(["task_clock", "page_faults", "instructions"]).close()
    except PmcUnsupported as exc:
        assert exc.event == "instructions"
    else:
        pytest.skip("this machine has a hardware PMU")
    assert perf_fds() == base


def test_emfile_says_how_many_fds_were_needed():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    used = set(open_fds())
    limit = next(n for n in range(1, soft) if n - len({u for u in used if u < n}) == 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    try:
        with pytest.raises(PmcTooManyFiles) as info:
            GroupCounters.for_task(TRIO)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    msg = str(info.value)
    assert "need 3 file descriptors (3 events x 1 tasks)" in msg
    assert f"RLIMIT_NOFILE is {limit}" in msg and info.value.needed == 3
    assert info.value.code == "RESOURCE_EXHAUSTED"


def test_cgroup_path_errors(tmp_path):
    with pytest.raises(PmcError, match="cannot open the directory") as info:
        GroupCounters.for_cgroup(tmp_path / "missing", TRIO)
    assert info.value.code == "NOT_FOUND"
    with pytest.raises(PmcError, match="not a cgroup directory") as info:
        GroupCounters.for_cgroup(tmp_path, TRIO)
    assert info.value.code == "INVALID_ARGUMENT"


@pytest.mark.parametrize(
    ("events", "match"),
    [
        (["bogus"], "unknown PMC event"),
        (["page_faults", "page_faults"], "repeated"),
        ([], "no PMC events"),
    ],
)
def test_bad_event_lists(events, match):
    with pytest.raises(ValueError, match=match):
        GroupCounters.for_task(events)


@pytest.mark.parametrize("ids", [[], [0], [-5]])
@pytest.mark.parametrize("kind", ["for_pids", "for_threads"])
def test_bad_pid_lists(ids, kind):
    with pytest.raises(ValueError, match=kind):
        getattr(GroupCounters, kind)(ids, TRIO)


def _try_as_nobody(cgroup: str) -> dict[str, list[str] | None]:
    """In a forked child that dropped to uid/gid 65534, open counters on pid 1 and on a
    cgroup; return what each raised (the interpreter under /root is not usable by nobody,
    so fork rather than exec)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        code = 1
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            out: dict[str, list[str] | None] = {}
            ev = ["task_clock"]
            for what, open_ in (
                ("pid1", lambda: GroupCounters.for_pids([1], ev, exclude_kernel=True)),
                ("cgroup", lambda: GroupCounters.for_cgroup(cgroup, ev)),
                ("self", lambda: GroupCounters.for_task(ev)),
                ("self_user_only", lambda: GroupCounters.for_task(ev, exclude_kernel=True)),
            ):
                try:
                    open_().close()
                    out[what] = None
                except PmcError as exc:
                    out[what] = [type(exc).__name__, exc.code, str(exc)]
            os.write(write_end, json.dumps(out).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return json.loads(data)


def test_permission_errors_explain_paranoid_and_capabilities(cgroup_dir):
    from agent.pmc.errors import paranoid_level

    if os.geteuid() != 0:
        pytest.skip("needs root to run the check as an unprivileged user")
    if (paranoid_level() or 0) < 1:
        pytest.skip("perf_event_paranoid < 1 lets anyone count any task")
    out = _try_as_nobody(cgroup_dir)
    assert out["self_user_only"] is None  # one's own task in user mode: always allowed
    refused = ["pid1", "cgroup"] + (["self"] if paranoid_level() >= 2 else [])
    for what in refused:
        kind, code, msg = out[what]
        assert (kind, code) == ("PmcPermissionError", "PERMISSION_DENIED")
        assert msg.split(": ")[1] in ("EACCES", "EPERM")
        assert f"perf_event_paranoid is {paranoid_level()}" in msg and "CAP_PERFMON" in msg
