"""Parse and format resctrl ``schemata`` text (docs/RESCTRL.md, "Schemata").

Read-back text is padded on many kernels (``MB:0=  100``, ``  L3:0=000ff``, CDP's
``    MB:``): values are parsed, never compared as text. Writes name only the domains that
change and end in a newline (the kernel refuses a write without one).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from agent.types import GroupAllocation

L3_NAMES = ("L3", "L3CODE", "L3DATA")
HEX_RESOURCES = frozenset({"L3", "L3CODE", "L3DATA", "L2", "L2CODE", "L2DATA"})


class SchemataError(ValueError):
    """Text that is not a schemata (a kernel would never print it)."""


@dataclass(frozen=True)
class Schemata:
    """Parsed schemata: resource name -> domain id -> value (masks and MB as ints)."""

    resources: Mapping[str, Mapping[int, int]]

    def get(self, resource: str, domain: int) -> int | None:
        return self.resources.get(resource, {}).get(domain)

    def allocation(self, domain: int, cdp: bool) -> GroupAllocation:
        """One domain as a GroupAllocation (CDP: data mask in l3_mask, code mask apart)."""
        if cdp:
            return GroupAllocation(
                l3_mask=self.get("L3DATA", domain),
                mb=self.get("MB", domain),
                l3_code_mask=self.get("L3CODE", domain),
            )
        return GroupAllocation(l3_mask=self.get("L3", domain), mb=self.get("MB", domain))

    def domains(self) -> tuple[int, ...]:
        found: set[int] = set()
        for per_dom in self.resources.values():
            found.update(per_dom)
        return tuple(sorted(found))


def parse(text: str, decimal: bool = False) -> Schemata:
    """Parse schemata as read back from the kernel (padding and blank lines tolerated).

    ``decimal`` reads every value in base 10 (a group's ``size`` file has the same layout,
    in bytes).
    """
    resources: dict[str, dict[int, int]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        name, sep, rest = line.partition(":")
        name = name.strip()
        if not sep or not name:
            raise SchemataError(f"schemata line without a resource name: {raw!r}")
        base = 16 if name in HEX_RESOURCES and not decimal else 10
        per_dom: dict[int, int] = {}
        if rest.strip() == "uninitialized":
            # A group in pseudo-locksetup mode (another tool's) has no allocation yet:
            # rdtgroup_schemata_show prints this instead of its values.
            resources[name] = per_dom
            continue
        for item in rest.split(";"):
            if not item.strip():
                continue
            ident, eq, value = item.partition("=")
            try:
                if not eq:
                    raise ValueError
                per_dom[int(ident.strip(), 10)] = int(value.strip(), base)
            except ValueError:
                raise SchemataError(f"bad domain entry {item!r} in {raw!r}") from None
        resources[name] = per_dom
    return Schemata(resources)


def format_write(changes: Mapping[str, Mapping[int, int]], mask_digits: int = 0) -> str:
    """The text of one schemata write: only the given resources and domains, newline-ended.

    ``changes`` maps a resource name (L3, L3CODE, L3DATA, MB) to domain -> value. Masks
    are written in hex (zero-padded to ``mask_digits``), MB in decimal and last: with
    mba_MBps the kernel stores an MB value as it parses the line, so a mask line after it
    that the kernel refuses would leave the MB change applied, the rest not.
    """
    lines = []
    for name, per_dom in sorted(changes.items(), key=lambda kv: kv[0] == "MB"):
        if not per_dom:
            continue
        if name in HEX_RESOURCES:
            items = [f"{d}={v:0{mask_digits}x}" for d, v in sorted(per_dom.items())]
        else:
            items = [f"{d}={v:d}" for d, v in sorted(per_dom.items())]
        lines.append(f"{name}:{';'.join(items)}\n")
    return "".join(lines)


def changes_for(
    want: Mapping[int, GroupAllocation],
    held: Schemata,
    cdp: bool,
) -> dict[str, dict[int, int]]:
    """Resource -> domain -> value for every value of ``want`` that differs from ``held``.

    With CDP a plain ``l3_mask`` sets the data mask, and the code mask too unless the plan
    gives ``l3_code_mask`` (GroupAllocation's documented meaning).
    """
    out: dict[str, dict[int, int]] = {}

    def put(resource: str, domain: int, value: int | None) -> None:
        if value is not None and held.get(resource, domain) != value:
            out.setdefault(resource, {})[domain] = value

    for domain, alloc in sorted(want.items()):
        if cdp:
            put("L3DATA", domain, alloc.l3_mask)
            code = alloc.l3_code_mask if alloc.l3_code_mask is not None else alloc.l3_mask
            put("L3CODE", domain, code)
        else:
            put("L3", domain, alloc.l3_mask)
        put("MB", domain, alloc.mb)
    return out
