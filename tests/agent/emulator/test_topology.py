"""Domain ids come from one CPU topology, and the cache id files a client reads agree with
them (arch/x86/kernel/cpu/resctrl/core.c: an L3 domain per cache id with an online CPU,
its id the cache's ``cache/index3/id``)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.emulator.bitmap import parse_list
from agent.emulator.model import Model
from agent.emulator.presets import PRESETS, get_preset
from agent.emulator.topology import SYSFS_CPU, Topology
from tests.emulated_resctrl import emulator_process


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_sysfs_tree_reads_back_as_the_preset_topology(name: str, tmp_path: Path) -> None:
    p = get_preset(name)
    p.topo.write_sysfs(str(tmp_path), p.cache_size, p.cbm_len)
    back = Topology.from_sysfs(str(tmp_path))
    assert back.domains == p.topo.domains == Model(p).domains
    assert back.online == p.topo.online and back.possible == p.topo.possible
    for cpu in back.online:
        assert back.l3_id[cpu] == p.topo.l3_id[cpu]
        assert back.socket[cpu] == p.topo.socket[cpu]
    # the CPUs of each domain say they share that L3
    for d in p.topo.domains:
        cpu = min(p.topo.cpus_of(d))
        shared = (tmp_path / f"cpu{cpu}/cache/index3/shared_cpu_list").read_text()
        assert parse_list(shared, p.topo.possible) == set(p.topo.cpus_of(d))


def test_domains_are_the_cache_ids_with_an_online_cpu() -> None:
    # 12 possible CPUs in two blocks, only 0-5 online: the second L3 has no online CPU.
    p = dataclasses.replace(get_preset("intel-20way"), cpus_online=6, domains=(0, 1))
    m = Model(p)
    assert m.domains == (0,)
    assert m.listdir("/mon_data") == ["mon_L3_00"]
    assert "1=" not in m.read("/schemata")


def test_intel_presets_put_one_l3_per_socket_and_amd_eight_in_one() -> None:
    intel = get_preset("intel-20way").topo
    assert {intel.socket[c] for c in intel.online} == {0, 1}
    assert all(intel.socket[c] == intel.l3_id[c] for c in intel.online)
    amd = get_preset("amd-epyc").topo
    assert {amd.socket[c] for c in amd.online} == {0} and len(amd.domains) == 8


def test_host_topology_matches_this_host() -> None:
    host = Topology.from_sysfs()
    m = Model(dataclasses.replace(get_preset("intel-20way"), topology=host))
    ids = set()
    for cpu in host.online:
        for entry in os.listdir(f"{SYSFS_CPU}/cpu{cpu}/cache"):
            base = f"{SYSFS_CPU}/cpu{cpu}/cache/{entry}"
            if entry.startswith("index") and Path(base, "level").read_text().strip() == "3":
                ids.add(int(Path(base, "id").read_text()))
    assert set(m.domains) == (ids or {0})
    assert m.read("/cpus_list").strip() == Path(SYSFS_CPU, "online").read_text().strip()


def test_cli_host_topology_and_cpu_sysfs(tmp_path: Path) -> None:
    mnt = tmp_path / "resctrl"
    mnt.mkdir()
    cpu = tmp_path / "cpu"
    args = ("--preset", "amd-epyc", "--kernel", "6.15", "--cpu-sysfs", str(cpu))
    with emulator_process(mnt, *args):
        ids = {int((cpu / f"cpu{c}/cache/index3/id").read_text()) for c in range(16)}
        assert sorted(os.listdir(mnt / "mon_data")) == [f"mon_L3_{i:02d}" for i in sorted(ids)]
        assert (mnt / "schemata").read_text().startswith("    MB:0=2048;1=2048;")
    out = subprocess.run(
        [sys.executable, "-m", "tuner.cli", "emulate-resctrl", "--kernel", "latest", str(mnt)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 2 and "not a kernel version" in out.stderr
