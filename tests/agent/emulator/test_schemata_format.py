"""Schemata read-back follows the kernel version the preset names (agent/emulator/kernel.py):

- before 6.15 ``show_doms`` pads every value to ``max_data_width`` (the widest data_width
  of the alloc-capable resources): cache masks with zeros (``"%d=%0*x"``), MB with spaces
  (``"%d=%*u"``; MB data_width 3 on Intel, 4 on AMD); 6.15 removed it ("x86/resctrl:
  Remove data_width and the tabular format");
- names are right-aligned to ``max_name_width``, counting a CDP-capable L3 as
  ``L3CODE``/``L3DATA`` even with CDP off (``schemata_list_add``: "include the suffix.
  This ensures the tabular format of the schemata file does not change between mounts");
- from 5.15 the lines come from ``resctrl_schema_all``, built head-first, so MB precedes L3;
- ``size`` pads names only.
"""

from __future__ import annotations

import dataclasses

import pytest

from agent.emulator.kernel import KernelRules
from agent.emulator.model import Model
from agent.emulator.presets import get_preset


def schemata(preset: str, **overrides) -> str:
    m = Model(dataclasses.replace(get_preset(preset), **overrides))
    m.mkdir("/g")
    return m.read("/g/schemata")


@pytest.mark.parametrize(
    ("preset", "overrides", "text"),
    [
        # Intel, 20-bit masks, CDP-capable: data width 5, name width 6
        ("intel-20way", {"kernel": "6.1"}, "    MB:0=  100;1=  100\n    L3:0=fffff;1=fffff\n"),
        ("intel-20way", {"kernel": "6.15"}, "    MB:0=100;1=100\n    L3:0=fffff;1=fffff\n"),
        # before the 5.15 schema list: resource order, L3 first
        ("intel-20way", {"kernel": "5.10"}, "    L3:0=fffff;1=fffff\n    MB:0=  100;1=  100\n"),
        # 11-bit masks: width max(3, 3)
        ("gold-6130", {"kernel": "6.1"}, "    MB:0=100\n    L3:0=7ff\n"),
        # Haswell: no CDP, no MBA: names not widened
        ("e5v3-4clos", {}, "L3:0=fffff\n"),
        (
            "intel-cdp",
            {"kernel": "6.1"},
            "    MB:0=  100;1=  100\nL3DATA:0=fffff;1=fffff\nL3CODE:0=fffff;1=fffff\n",
        ),
        # mba_MBps: the value outgrows the width; no padding applies
        (
            "intel-mbps",
            {"kernel": "6.1"},
            "    MB:0=4294967295;1=4294967295\n    L3:0=fffff;1=fffff\n",
        ),
    ],
)
def test_padding_by_kernel_version(preset: str, overrides: dict, text: str) -> None:
    assert schemata(preset, **overrides) == text


def test_amd_mb_line() -> None:
    """AMD: MB data_width 4 and 16-bit masks (width 4); from 6.15 neither is padded."""
    old = schemata("amd-epyc", kernel="6.8").splitlines()
    new = schemata("amd-epyc", kernel="6.15").splitlines()
    assert old[0].startswith("    MB:0=2048;1=2048;") and old[1].startswith("    L3:0=ffff;")
    m = Model(dataclasses.replace(get_preset("amd-epyc"), kernel="6.8"))
    m.mkdir("/g")
    m.write("/g/schemata", b"MB:0=5\nL3:0=f\n")
    old = m.read("/g/schemata").splitlines()
    assert old[0].startswith("    MB:0=   5;1=2048;") and old[1].startswith("    L3:0=000f;")
    assert new[0].startswith("    MB:0=2048;") and new[1].startswith("    L3:0=ffff;")


def test_size_pads_names_only() -> None:
    m = Model(get_preset("intel-20way"))
    assert m.read("/size") == "    MB:0=100;1=100\n    L3:0=41943040;1=41943040\n"


@pytest.mark.parametrize(
    ("text", "version"), [("6.1", (6, 1)), ("6.15.2", (6, 15)), ("6.1.0-18-amd64", (6, 1))]
)
def test_kernel_versions_parse(text: str, version: tuple[int, int]) -> None:
    assert KernelRules.parse(text).version == version


def test_a_bad_kernel_version_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="not a kernel version"):
        dataclasses.replace(get_preset("intel-20way"), kernel="latest")
