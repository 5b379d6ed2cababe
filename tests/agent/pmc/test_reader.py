"""PmcReader: counters only for the events that work here, None for the rest, per tracked
target (pids or a cgroup), and every fd closed at the end."""

from __future__ import annotations

import logging
import os
import resource
import threading

import pytest

from agent.pmc import HARDWARE_EVENTS, PmcReader, PmcTooManyFiles, online_cpus, probe_events
from agent.pmc.limits import raise_nofile_limit
from tests.agent.pmc.conftest import move_to_cgroup, open_fds, perf_fds
from tests.agent.pmc.workload import burn, touch_pages

HW_UNSUPPORTED = probe_events()[0] == frozenset()
needs_no_pmu = pytest.mark.skipif(not HW_UNSUPPORTED, reason="this machine has a PMU")
EVENTS = (*HARDWARE_EVENTS, "task_clock", "page_faults")


@needs_no_pmu
def test_probing_reader_counts_software_and_answers_none_for_hardware(child_factory):
    with PmcReader(EVENTS) as reader:
        assert reader.active == ("task_clock", "page_faults")
        assert set(reader.unsupported) == set(HARDWARE_EVENTS)
        child = child_factory(burn_s=0.03, pages=200)
        reader.track("batch", pids=[child.pid])
        assert reader.tracked() == ("batch",) and reader.fd_count == 2
        child.go()
        child.finish()
        ((name, values),) = reader.read_deltas().items()
        assert name == "batch" and list(values) == list(EVENTS)
        assert all(values[e] is None for e in HARDWARE_EVENTS)
        assert values["task_clock"] >= 0.03e9 * 0.9 and values["page_faults"] >= 200
        assert reader.read_deltas()["batch"]["page_faults"] == 0.0  # the child is gone
        reader.untrack("batch")
        assert reader.tracked() == () and reader.fd_count == 0


def test_nothing_supported_opens_nothing():
    base = perf_fds()
    with PmcReader(HARDWARE_EVENTS, supported=(), unsupported={"cycles": "ENOENT: x"}) as r:
        r.track("lc", pids=[1])
        assert perf_fds() == base
        assert r.read_deltas() == {"lc": dict.fromkeys(HARDWARE_EVENTS)}
        assert r.unsupported["cycles"] == "ENOENT: x"
        assert r.unsupported["instructions"] == "not supported on this node"


def test_given_support_is_trusted_and_limited_to_the_events_asked():
    reader = PmcReader(
        ["page_faults", "context_switches"], supported={"page_faults", "instructions"}
    )
    assert reader.active == ("page_faults",) and reader.supported == {"page_faults"}
    with reader.for_pids([]) as empty:
        # nothing to count: a measured 0 for the supported event, None for the other
        assert empty.fd_count == 0
        assert empty.read() == {"page_faults": 0.0, "context_switches": None}
    reader.close()


def test_track_cgroup_and_retrack_closes_the_old_counters(cgroup_dir, child_factory):
    base = perf_fds()
    with PmcReader(["page_faults", "context_switches"]) as reader:
        child = child_factory(burn_s=0.0, pages=300)
        move_to_cgroup(cgroup_dir, child.pid)
        reader.track("web", cgroup=cgroup_dir)
        assert reader.fd_count == 2 * len(online_cpus())
        child.go()
        child.finish()
        assert reader.read_deltas()["web"]["page_faults"] >= 300
        other = child_factory(burn_s=0.0)
        reader.track("web", pids=[other.pid])  # re-track elsewhere: the old fds are closed
        assert reader.fd_count == 2 and perf_fds() == base + 2
    assert perf_fds() == base and reader.tracked() == ()


def test_track_threads_counts_each_once(child_factory):
    child = child_factory(burn_s=0.05, mode="thread")
    tids = sorted(int(t) for t in os.listdir(f"/proc/{child.pid}/task"))
    with PmcReader(["task_clock"], supported={"task_clock"}) as reader:
        reader.track("a", tids=tids)
        assert reader.fd_count == 2  # pids=tids would open every thread of each: 4
        child.go()
        report, _ = child.finish()
        counted = reader.read_deltas()["a"]["task_clock"]
    assert 0.9 * report["work_cpu"] * 1e9 <= counted <= 1.3 * report["work_cpu"] * 1e9


def test_retrack_needs_only_the_new_counters_fds(child_factory):
    """A group is re-tracked while the process has no fd to spare: the old counters are
    closed before the new ones open, so what fitted before fits again."""
    child = child_factory(burn_s=0.05, mode="thread")
    tids = sorted(int(t) for t in os.listdir(f"/proc/{child.pid}/task"))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # no reserve: this is about the kernel's limit, not the reader's own budget
    with PmcReader(["task_clock"], supported={"task_clock"}, fd_reserve=0) as reader:
        reader.track("a", tids=tids)
        # Every fd number below the limit in use: only the fds a re-track closes are free.
        holes = max(open_fds()) + 1 - len(open_fds())
        fillers = [os.open(os.devnull, os.O_RDONLY) for _ in range(max(holes, 0))]
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(open_fds()) + 1, hard))
        try:
            reader.track("a", tids=tids)  # before: PmcTooManyFiles (needed 2 more fds)
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            for fd in fillers:
                os.close(fd)
        assert reader.tracked() == ("a",) and reader.fd_count == 2
        child.go()
        report, _ = child.finish()
        counted = reader.read_deltas()["a"]["task_clock"]
    assert 0.9 * report["work_cpu"] * 1e9 <= counted <= 1.3 * report["work_cpu"] * 1e9


def test_for_pids_owned_by_the_caller():
    reader = PmcReader(["page_faults"], supported={"page_faults"})
    with reader.for_pids([os.getpid()]) as target:
        touch_pages(100)
        assert target.read_delta()["page_faults"] >= 100
        assert target.read()["page_faults"] >= 100


@pytest.mark.parametrize("kwargs", [{}, {"pids": [1], "cgroup": "/x"}, {"pids": [1], "tids": [1]}])
def test_track_needs_exactly_one_target(kwargs):
    with (
        PmcReader(["page_faults"], supported=()) as reader,
        pytest.raises(ValueError, match="exactly one"),
    ):
        reader.track("x", **kwargs)


def test_unknown_event_names_are_rejected():
    with pytest.raises(ValueError, match="unknown PMC event"):
        PmcReader(["llc_misses", "bogus"], supported=())


def _break_leader(reader: PmcReader, name: str, replacement: str) -> None:
    """Fault injection at the OS boundary: the fd number of ``name``'s first leader now
    reads ``replacement`` (/dev/null: 0 bytes, as the kernel answers for an event in error
    state; a directory: EISDIR, a read that fails outright)."""
    fd = reader._tracked[name].counters._groups[0].fds[0]
    other = os.open(replacement, os.O_RDONLY)
    try:
        os.dup2(other, fd)
    finally:
        os.close(other)


@pytest.mark.parametrize("replacement", [os.devnull, "/"])
def test_one_unreadable_group_costs_only_its_own_counts(replacement: str) -> None:
    with PmcReader(["task_clock"], supported={"task_clock"}) as reader:
        reader.track("good", tids=[os.getpid()])
        reader.track("bad", tids=[os.getpid()])
        reader.read_deltas()
        _break_leader(reader, "bad", replacement)
        deltas = reader.read_deltas()
        assert deltas["bad"] is None
        assert deltas["good"]["task_clock"] > 0
        # untracked and its fds closed, so that the next track opens it afresh
        assert reader.tracked() == ("good",) and reader.fd_count == 1
        reader.track("bad", tids=[os.getpid()])
        assert reader.read_deltas()["bad"]["task_clock"] >= 0


@pytest.mark.parametrize("kind", ["tids", "cgroup"])
def test_counters_never_take_the_reserved_descriptors(kind, child_factory, request):
    """The limit leaves room for the counters but not for them and the reserve as well:
    they are refused, and the rest of the process still has its reserve to open files."""
    child = child_factory(burn_s=0.0, mode="thread")
    target = {"tids": sorted(int(t) for t in os.listdir(f"/proc/{child.pid}/task"))}
    if kind == "cgroup":
        target = {"cgroup": request.getfixturevalue("cgroup_dir")}
    reserve = 40
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    events = ["task_clock", "page_faults"]  # 2 x 2 threads = 4; 2 x CPUs + 1 >= 3
    with PmcReader(events, supported=set(events), fd_reserve=reserve) as reader:
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(open_fds()) + reserve + 2, hard))
        fillers: list[int] = []
        try:
            with pytest.raises(PmcTooManyFiles, match="kept for the rest of the agent") as err:
                reader.track("a", **target)
            assert err.value.needed >= 3 and "\n" not in str(err.value)
            fillers = [os.open(os.devnull, os.O_RDONLY) for _ in range(reserve)]
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            for fd in fillers:
                os.close(fd)
        assert reader.tracked() == ()


@pytest.mark.parametrize("below", [100, 0])
def test_agent_start_raises_the_soft_nofile_limit_to_the_hard_one(below, caplog):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard - below, hard))
    caplog.set_level(logging.INFO, logger="agent.pmc.limits")
    try:
        assert raise_nofile_limit() == hard
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    said = [r.getMessage() for r in caplog.records]
    assert said == (
        [f"RLIMIT_NOFILE raised from {hard - 100} to {hard} for the PMC counters"] if below else []
    )


@pytest.mark.parametrize("kind", ["process", "thread"])
def test_a_child_moved_to_another_group_is_counted_there_only(kind, child_factory):
    """Thread T1 of group "a" starts a child (a process, or a thread), which is then
    moved to group "b" and works there while T1 sleeps: "a" must not count it too."""
    spawn, started, end = threading.Event(), threading.Event(), threading.Event()
    box: dict = {}

    def t1() -> None:
        spawn.wait()
        if kind == "process":
            box["child"] = child_factory(burn_s=0.3)
            box["tid"] = box["child"].pid
        else:
            gate = threading.Event()
            worker = threading.Thread(target=lambda: (gate.wait(), box.update(cpu=burn(0.3))))
            worker.start()
            box.update(tid=worker.native_id, gate=gate, worker=worker)
        started.set()
        end.wait()

    parent = threading.Thread(target=t1)
    with PmcReader(["task_clock"], supported={"task_clock"}) as reader:
        parent.start()
        reader.track("a", tids=[parent.native_id])  # before T1 starts its child
        reader.read_deltas()
        try:
            spawn.set()
            assert started.wait(10)
            reader.track("b", tids=[box["tid"]])  # the child, moved to b
            reader.read_deltas()
            if kind == "process":
                box["child"].go()
                cpu = box["child"].finish()[0]["work_cpu"]
            else:
                box["gate"].set()
                box["worker"].join()
                cpu = box["cpu"]
            counted = reader.read_deltas()
        finally:
            end.set()
            parent.join()
    assert 0.9 * cpu * 1e9 <= counted["b"]["task_clock"] <= 1.3 * cpu * 1e9 + 5e7
    assert counted["a"]["task_clock"] < 0.1 * cpu * 1e9, "the child counted in a as well"


@pytest.mark.parametrize("target", ["tids", "pids"])
def test_a_target_without_tasks_reads_a_measured_zero(target):
    with PmcReader(["task_clock", "instructions"], supported={"task_clock"}) as reader:
        reader.track("empty", **{target: []})
        assert reader.fd_count == 0
        assert reader.read_deltas()["empty"] == {"task_clock": 0.0, "instructions": None}
