"""The ``tasks`` files follow the kernel's rules (fs/resctrl/rdtgroup.c):

- ``show_rdt_tasks`` walks every *thread* (for_each_process_thread) and lists those whose
  CLOSID is the control group's (``is_closid_match``) or whose RMID is the monitoring
  group's (``is_rmid_match``). So the default group lists the tasks of its own monitoring
  groups, and a task is listed again by the default group after its monitoring group is
  removed (rmdir moves the tasks to the parent: Documentation/filesystems/resctrl.rst,
  "Removing a directory will move all tasks and cpus owned by the group it represents to
  the parent").
- ``rdtgroup_move_task`` moves the one task ``find_task_by_vpid`` finds: writing a
  process id moves its main thread only.
- ``rdtgroup_tasks_write`` takes one pid before 6.7 and a comma-separated list from 6.7
  (agent/emulator/kernel.py), where a failed move also reports "Error while processing
  task N".
"""

from __future__ import annotations

import errno
import os
import subprocess

import pytest

from tests.emulated_resctrl import Emulated, emulated_resctrl


def tids(pid: int) -> set[int]:
    return {int(t) for t in os.listdir(f"/proc/{pid}/task")}


def listed(emu: Emulated, rel: str) -> set[int]:
    return {int(x) for x in emu.read(rel).split()}


def test_default_group_lists_tasks_of_its_mon_groups(emu: Emulated, child: int) -> None:
    # is_closid_match: the default group's CLOSID is shared by its monitoring groups.
    os.mkdir(f"{emu.root}/mon_groups/m")
    emu.write("mon_groups/m/tasks", f"{child}\n")
    assert listed(emu, "mon_groups/m/tasks") == {child}
    assert child in listed(emu, "tasks")
    os.rmdir(f"{emu.root}/mon_groups/m")
    assert child in listed(emu, "tasks"), "rmdir returns the task to the parent"


def test_control_group_tasks_come_back_to_the_default_group(emu: Emulated, child: int) -> None:
    os.mkdir(f"{emu.root}/a")
    os.mkdir(f"{emu.root}/a/mon_groups/m")
    emu.write("a/tasks", f"{child}\n")
    emu.write("a/mon_groups/m/tasks", f"{child}\n")
    assert child not in listed(emu, "tasks")
    os.rmdir(f"{emu.root}/a")
    assert child in listed(emu, "tasks")


def test_every_thread_is_a_task_and_moves_alone(emu: Emulated, threaded: int) -> None:
    every = tids(threaded)
    assert len(every) == 4
    assert every <= listed(emu, "tasks"), "the default group lists every thread"
    os.mkdir(f"{emu.root}/a")
    emu.write("a/tasks", f"{threaded}\n")  # the process id: its main thread only
    assert listed(emu, "a/tasks") == {threaded}
    assert every - {threaded} <= listed(emu, "tasks")
    for tid in sorted(every - {threaded}):
        emu.write("a/tasks", f"{tid}\n")
    assert listed(emu, "a/tasks") == every
    assert not every & listed(emu, "tasks")


def test_exited_threads_leave_their_group(emu: Emulated) -> None:
    os.mkdir(f"{emu.root}/a")
    proc = subprocess.Popen(["sleep", "60"])
    emu.write("a/tasks", f"{proc.pid}\n")
    assert listed(emu, "a/tasks") == {proc.pid}
    proc.kill()
    proc.wait()
    assert listed(emu, "a/tasks") == set()


def _missing_pid() -> int:
    pid = 4194000
    while os.path.exists(f"/proc/{pid}"):
        pid -= 1
    return pid


@pytest.mark.parametrize(
    ("kernel", "suffix"), [("6.1", ""), ("6.8", "\nError while processing task {pid}")]
)
def test_refused_moves_by_kernel_version(kernel: str, suffix: str, child: int) -> None:
    with emulated_resctrl("intel-20way", kernel=kernel) as emu:
        os.mkdir(f"{emu.root}/a")
        pid = _missing_pid()
        with pytest.raises(OSError) as err:
            emu.write("a/tasks", f"{pid}\n")
        assert (err.value.errno, emu.status()) == (
            errno.ESRCH,
            f"No task {pid}" + suffix.format(pid=pid),
        )
        emu.model.deny_task(child)
        with pytest.raises(OSError) as err:
            emu.write("a/tasks", f"{child}\n")
        assert (err.value.errno, emu.status()) == (
            errno.EPERM,
            f"No permission to move task {child}" + suffix.format(pid=child),
        )


def test_before_6_7_one_pid_per_write_parsed_before_the_status_is_cleared(child: int) -> None:
    with emulated_resctrl("intel-20way", kernel="6.1") as emu:
        os.mkdir(f"{emu.root}/a")
        with pytest.raises(OSError):
            emu.write("a/schemata", "L3:0=zz\n")
        for text in ("abc\n", f"{child},{child}\n", "-1\n"):
            with pytest.raises(OSError) as err:
                emu.write("a/tasks", text)
            assert err.value.errno == errno.EINVAL
            assert emu.status() == "Non-hex character in the mask zz", "status untouched"
        emu.write("a/tasks", f"0x{child:x}\n")  # kstrtoint base 0
        assert listed(emu, "a/tasks") == {child}


def test_from_6_7_a_list_of_pids_moves_each_in_turn(child: int) -> None:
    other = subprocess.Popen(["sleep", "60"])
    try:
        with emulated_resctrl("intel-20way", kernel="6.8") as emu:
            os.mkdir(f"{emu.root}/a")
            emu.write("a/tasks", f"{child}, {other.pid}\n")
            assert listed(emu, "a/tasks") == {child, other.pid}
            os.mkdir(f"{emu.root}/b")
            pid = _missing_pid()
            with pytest.raises(OSError) as err:
                emu.write("b/tasks", f"{child},{pid},{other.pid}\n")
            assert err.value.errno == errno.ESRCH
            assert listed(emu, "b/tasks") == {child}, "moves before the failure stay"
            for text, status in (
                ("abc\n", "Task list parsing error pid abc"),
                ("-3\n", "Invalid pid -3"),
            ):
                with pytest.raises(OSError) as err:
                    emu.write("b/tasks", text)
                assert (err.value.errno, emu.status()) == (errno.EINVAL, status)
    finally:
        other.kill()
        other.wait()


@pytest.mark.parametrize("kernel", ["6.1", "6.8"])
def test_pid_0_moves_the_writing_task(kernel: str) -> None:
    """rdtgroup_move_task: pid 0 is ``current``, the thread that wrote it (before, the
    emulator answered "No task 0" and ESRCH), in either tasks format."""
    import threading

    with emulated_resctrl("intel-20way", kernel=kernel) as emu:
        os.mkdir(f"{emu.root}/a")
        emu.write("a/tasks", "0\n")
        assert listed(emu, "a/tasks") == {threading.get_native_id()}
        assert emu.status() == "ok"
        emu.write("tasks", "0")  # and back to the default group
        assert listed(emu, "a/tasks") == set()


def test_mon_group_takes_only_tasks_of_its_parent(emu: Emulated, child: int) -> None:
    os.mkdir(f"{emu.root}/a")
    os.mkdir(f"{emu.root}/a/mon_groups/m")
    with pytest.raises(OSError) as err:
        emu.write("a/mon_groups/m/tasks", f"{child}\n")
    assert (err.value.errno, emu.status()) == (
        errno.EINVAL,
        "Can't move task to different control group",
    )
    # A root-level monitoring group takes the default group's tasks.
    os.mkdir(f"{emu.root}/mon_groups/r")
    emu.write("mon_groups/r/tasks", f"{child}\n")
    assert listed(emu, "mon_groups/r/tasks") == {child}


SPAWNER = (
    "import subprocess, sys, threading\n"
    "ev = threading.Event()\n"
    "early = threading.Thread(target=ev.wait, daemon=True)\n"
    "early.start()\n"
    "print(early.native_id, flush=True)\n"
    "sys.stdin.readline()\n"  # moved into a group meanwhile
    "late = threading.Thread(target=ev.wait, daemon=True)\n"
    "late.start()\n"
    "child = subprocess.Popen(['sh', '-c', 'sleep 60 & echo $!; wait'], stdout=subprocess.PIPE)\n"
    "grandchild = int(child.stdout.readline())\n"
    "print(late.native_id, child.pid, grandchild, flush=True)\n"
    "sys.stdin.readline()\n"
    "child.kill()\n"
)


@pytest.fixture(params=["the group's own", "every thread's"])
def walk(request: pytest.FixtureRequest, emu: Emulated) -> str:
    """The two ways the emulator finds new threads: from the groups' own tasks through
    /proc's children files, or, where the kernel has none, by walking every thread."""
    if request.param == "the group's own":
        if not emu.model._has_children_files():
            pytest.skip("this kernel's /proc has no children files (CONFIG_PROC_CHILDREN)")
    else:
        emu.model._children_files = False
    return request.param


def test_new_threads_and_processes_start_in_their_creators_group(emu: Emulated, walk: str) -> None:
    """fork and clone copy the creator's CLOSID and RMID (dup_task_struct): a workload
    placed by its first pid keeps what it starts afterwards, and what they start in
    turn. Before, the emulator listed them in the default group, and its counters left
    their traffic out. A thread started before the move stays where it was (only the
    moved thread moves)."""
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-c", SPAWNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdin is not None and proc.stdout is not None
    spawned: list[int] = []
    try:
        early = int(proc.stdout.readline())
        os.mkdir(f"{emu.root}/a")
        emu.write("a/tasks", f"{proc.pid}\n")
        proc.stdin.write("go\n")
        proc.stdin.flush()
        late, *spawned = (int(x) for x in proc.stdout.readline().split())
        started = {late, *spawned}
        in_a = listed(emu, "a/tasks")
        assert {proc.pid, *started} <= in_a
        assert early not in in_a and early in listed(emu, "tasks")
        assert not started & listed(emu, "tasks")
        os.rmdir(f"{emu.root}/a")  # and back to the default group with the rest
        assert {proc.pid, *started} <= listed(emu, "tasks")
    finally:
        for pid in spawned:
            os.kill(pid, 9)
        proc.kill()
        proc.wait()


def test_a_group_listing_reads_only_its_own_tasks_in_proc(
    emu: Emulated, child: int, threaded: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Listing a group (or moving a task into one) walks /proc from the tasks groups
    hold, not over every process of the machine; the default group's listing needs
    every thread and walks them all."""
    if not emu.model._has_children_files():
        pytest.skip("this kernel's /proc has no children files (CONFIG_PROC_CHILDREN)")
    os.mkdir(f"{emu.root}/a")
    emu.write("a/tasks", f"{child}\n")
    read: list[str] = []
    real = os.listdir

    def spy(path: str | os.PathLike[str] = ".") -> list[str]:
        read.append(os.fspath(path))
        return real(path)

    monkeypatch.setattr(os, "listdir", spy)
    assert listed(emu, "a/tasks") == {child}
    assert read and not [p for p in read if p.startswith(f"/proc/{threaded}")]
    assert threaded in listed(emu, "tasks")
    assert [p for p in read if p.startswith(f"/proc/{threaded}")]


def test_a_mon_group_moves_to_another_control_group_from_6_5(child: int) -> None:
    """rdtgroup_rename (6.5): the group keeps its RMID and tasks, which take the new
    parent's CLOSID; a control group or a file is not renamed; before 6.5 nothing is."""
    with emulated_resctrl("amd-epyc") as emu:  # kernel 6.8
        os.mkdir(f"{emu.root}/a")
        os.mkdir(f"{emu.root}/a/mon_groups/m")
        emu.write("a/tasks", f"{child}\n")
        emu.write("a/mon_groups/m/tasks", f"{child}\n")
        rmid = emu.model.groups["a"].mon_children["m"].rmid
        os.rename(f"{emu.root}/a/mon_groups/m", f"{emu.root}/mon_groups/n")
        assert emu.status() == "ok"
        assert listed(emu, "mon_groups/n/tasks") == {child}
        assert child in listed(emu, "tasks") and child not in listed(emu, "a/tasks")
        assert emu.model.root.mon_children["n"].rmid == rmid
        elsewhere = "Destination must be a mon_groups subdirectory"
        for src, dst, status in (
            ("a", "mon_groups/a", "Source must be a MON group"),
            ("mon_groups/n/tasks", "mon_groups/t", "Source and destination must be directories"),
            ("mon_groups/n", "a/n", elsewhere),
            # is_mon_groups: no monitoring group is itself named mon_groups
            ("mon_groups/n", "mon_groups/mon_groups", elsewhere),
        ):
            with pytest.raises(OSError) as err:
                os.rename(f"{emu.root}/{src}", f"{emu.root}/{dst}")
            assert err.value.errno == errno.EPERM and emu.status() == status
    with emulated_resctrl("intel-20way") as emu:  # kernel 6.1
        os.mkdir(f"{emu.root}/mon_groups/m")
        with pytest.raises(OSError) as err:
            os.rename(f"{emu.root}/mon_groups/m", f"{emu.root}/mon_groups/n")
        assert err.value.errno == errno.EPERM
