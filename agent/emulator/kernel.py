"""What changed in resctrl between kernel versions, for the version a preset names.

A preset (or ``rdtune emulate-resctrl --kernel``) names one kernel version; the model asks
:class:`KernelRules` rather than hard-coding either side of a change. The rules, with the
kernel code each follows:

- **Schemata values** (fs/resctrl/ctrlmondata.c ``show_doms``): up to 6.14 every value is
  padded to ``max_data_width``, the widest ``data_width`` of the alloc-capable resources:
  cache masks zero-padded (``"%d=%0*x"``, data_width = (cbm_len + 3) / 4), MB
  space-padded (``"%d=%*u"``, data_width 3 on Intel, 4 on AMD), so on a 20-way Intel host
  ``MB:0=  100``. 6.15 removed the padding ("x86/resctrl: Remove data_width and the
  tabular format", 43312b8ea1c6): ``"%d=%x"`` / ``"%d=%u"``, so ``L3:0=ff``, ``MB:0=100``.
- **Resource names** are right-aligned to ``max_name_width`` in every version, and a
  CDP-capable resource counts with its CODE/DATA suffix even when CDP is off, so the
  columns do not move between mounts (4.10-5.13: ``rdt_init_padding`` over the
  alloc-capable resources, which include L3CODE/L3DATA on CDP hardware; 5.14 on:
  ``schemata_list_add`` adds 4 to the length when ``r->cdp_capable`` and CDP is off). A
  CDP-capable host therefore reads ``    L3:...`` and ``    MB:...``. ``size`` uses the same
  name padding and never pads values (``rdtgroup_size_show``).
- **Line order**: before 5.15 ``rdtgroup_schemata_show`` walked the resource array (L3, or
  L3DATA then L3CODE, then MB); from 5.15 it walks ``resctrl_schema_all``, which
  ``schemata_list_create`` builds with ``list_add`` (insertion at the head), so the last
  resource comes first: ``MB`` then ``L3`` ("x86/resctrl: Add a separate schema list for
  resctrl", the 5.15 schema series). ``size`` follows the same order.
- **tasks writes** (fs/resctrl/rdtgroup.c ``rdtgroup_tasks_write``): up to 6.6 one pid per
  write, parsed with ``kstrtoint(strstrip(buf))`` before last_cmd_status is cleared (a bad
  pid is EINVAL with the previous status left alone); 6.7 takes a comma-separated list and
  appends "Error while processing task N" after the reason of a failed move
  ("x86/resctrl: Add multiple tasks to the resctrl group at once", fe2a20ea0b09).
- **rename(2)** of a monitoring group, to another name or under another control group's
  ``mon_groups``, from 6.5 (``rdtgroup_rename``, "x86/resctrl: Implement rename op for mon
  groups", 8da2b938eb7e); before, every rename is EPERM.
- **info/L3/sparse_masks** exists from 6.7 ("x86/resctrl: Add sparse_masks file in info",
  4dba8f10b8fe); before, a tool learns whether masks may be sparse from the vendor.
- **Writes** longer than a page are refused with E2BIG before any handler runs, in every
  version (kernfs ``kernfs_fop_write_iter``: resctrl's files set ``atomic_write_len`` to
  PAGE_SIZE), the last command's status left as it was.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PAGE_SIZE = 4096  # x86-64: the longest write a resctrl file takes whole


@dataclass(frozen=True)
class KernelRules:
    """The resctrl behaviour of one kernel version (major, minor)."""

    version: tuple[int, int]

    @classmethod
    def parse(cls, text: str) -> KernelRules:
        """``6.1``, ``6.15.2`` or a ``uname -r`` such as ``6.1.0-18-amd64``."""
        m = re.match(r"^\s*(\d+)\.(\d+)", text)
        if m is None:
            raise ValueError(f"not a kernel version: {text!r} (expected e.g. 6.1 or 6.15)")
        return cls((int(m.group(1)), int(m.group(2))))

    def __str__(self) -> str:
        return f"{self.version[0]}.{self.version[1]}"

    @property
    def pads_values(self) -> bool:
        return self.version < (6, 15)

    @property
    def multi_pid_tasks(self) -> bool:
        return self.version >= (6, 7)

    @property
    def has_sparse_masks_file(self) -> bool:
        return self.version >= (6, 7)

    @property
    def renames_mon_groups(self) -> bool:
        return self.version >= (6, 5)

    def schema_order(self, l3: tuple[str, ...], has_mb: bool) -> tuple[str, ...]:
        """The schemata lines in print order; ``l3`` is (L3,) or (L3DATA, L3CODE)."""
        mb = ("MB",) if has_mb else ()
        return mb + l3 if self.version >= (5, 15) else l3 + mb

    def name_width(self, schemas: tuple[str, ...], cdp_capable_l3: bool) -> int:
        widths = [len(s) for s in schemas]
        if cdp_capable_l3:
            widths.append(len("L3CODE"))
        return max(widths)

    def data_width(self, cbm_len: int, mb_data_width: int | None) -> int:
        widths = [(cbm_len + 3) // 4]
        if mb_data_width is not None:
            widths.append(mb_data_width)
        return max(widths)

    def format_cbm(self, dom: int, value: int, width: int) -> str:
        return f"{dom}={value:0{width}x}" if self.pads_values else f"{dom}={value:x}"

    def format_bw(self, dom: int, value: int, width: int) -> str:
        return f"{dom}={value:>{width}}" if self.pads_values else f"{dom}={value}"
