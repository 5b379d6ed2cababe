"""Writes of the emulated ``schemata`` and ``mode`` files: the kernel's parsing and
validation of cache bit masks and MB values, staged and applied as one command.

Mirrors ctrlmondata.c (rdtgroup_schemata_write, parse_line, cbm_validate, bw_validate) and
rdtgroup.c (rdtgroup_mode_write, rdtgroup_cbm_overlaps). A part of
:class:`~agent.emulator.model.Model`."""

from __future__ import annotations

import errno
import threading

from agent.emulator.presets import Preset
from agent.emulator.state import KERNEL_SPACE, Group, ResctrlError

_DIGITS = "0123456789abcdef"


def kstrtoull(text: str, base: int, most: int = (1 << 64) - 1) -> int:
    """``text`` as lib/kstrtox.c's kstrtoull reads it (``base`` 10 or 16), or ValueError:
    one leading ``+``, then (base 16) an optional ``0x``, then ASCII digits only, at least
    one; a value above ``most`` (the kernel's ERANGE: 2**64 - 1, or 2**32 - 1 for
    kstrtou32) is refused too. The caller strips the line's whitespace, as the kernel does."""
    if text[:1] == "+":
        text = text[1:]
    if base == 16 and text[:2].lower() == "0x":
        text = text[2:]
    digits = _DIGITS[:base]
    if not text or any(c not in digits for c in text.lower()):
        raise ValueError(text)
    value = int(text, base)
    if value > most:
        raise ValueError(text)
    return value


def kstrto(text: str, *, signed: bool = False, bits: int = 32) -> int:
    """``text`` as lib/kstrtox.c's kstrto{u,}int / kstrto{u,}ll with base 0 read it: an
    optional ``+`` (or ``-`` when ``signed``), then ``0x`` hex, ``0`` octal or decimal ASCII
    digits, one optional trailing newline. ValueError where the kernel says EINVAL,
    OverflowError where it says ERANGE (beyond 64 bits, or beyond ``bits``)."""
    body = text[:-1] if text.endswith("\n") else text
    sign = 1
    if signed and body[:1] == "-":
        sign, body = -1, body[1:]
    elif body[:1] == "+":
        body = body[1:]
    if body[:2].lower() == "0x" and body[2:3].lower() in tuple(_DIGITS):
        base, digits = 16, body[2:]
    else:  # "0x" with no hex digit after it: an octal 0, then a stray "x"
        base, digits = (8 if body[:1] == "0" else 10), body
    if not digits or any(c not in _DIGITS[:base] for c in digits.lower()):
        raise ValueError(text)
    value = int(digits, base)
    if value >= 1 << 64:
        raise OverflowError(text)
    value *= sign
    low, high = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    if not low <= value <= high:
        raise OverflowError(text)
    return value


class SchemataFiles:
    """Schemata and mode writes (a part of the Model)."""

    # The model's state (agent/emulator/model.py sets it up).
    p: Preset
    lock: threading.RLock
    status: str
    root: Group
    groups: dict[str, Group]
    domains: list[int]
    cbm_len: int

    def _write_mode(self, g: Group, text: str) -> None:
        # rdtgroup_mode_write: the one trailing newline is required and taken off before
        # the status is cleared; the rest is compared whole (strcmp), white space and all,
        # and as a C string it ends at its first NUL.
        if not text.endswith("\n"):
            raise ResctrlError(errno.EINVAL)
        self.status = "ok"
        want = text[:-1].partition("\0")[0]
        if want == g.mode:
            return
        if want == "shareable":
            g.mode = "shareable"
        elif want == "exclusive":
            # rdtgroup_mode_test_exclusive: the default group is tested like any other (its
            # usual full mask overlaps every group and the hardware's shareable bits).
            if not self.l3_schemas:
                self.status = "Cannot be exclusive without CAT/CDP"
                raise ResctrlError(errno.EINVAL)
            for s in self.l3_schemas:
                for d in self.domains:
                    if self._overlaps(s, d, g.ctrl[s][d], g.closid, exclusive_only=False):
                        self.status = "Schemata overlaps"
                        raise ResctrlError(errno.EINVAL)
            g.mode = "exclusive"
        else:
            self.status = "Unknown or unsupported mode"
            raise ResctrlError(errno.EINVAL)

    def _overlaps(self, schema: str, dom: int, cbm: int, closid: int, exclusive_only: bool) -> bool:
        # rdtgroup_cbm_overlaps: against every other CLOSID's current mask, and with CDP
        # against the peer (code vs data) masks too. Unless only exclusive groups count, the
        # ways hardware uses directly (shareable_bits) count as another group's.
        if not exclusive_only and cbm & self.p.shareable_bits:
            return True
        for g in self._ctrl_groups():
            if g.closid == closid:
                continue
            if exclusive_only and g.mode != "exclusive":
                continue
            if any(g.ctrl[s][dom] & cbm for s in self.l3_schemas):
                return True
        return False

    def _write_schemata(self, g: Group, text: str) -> None:
        # rdtgroup_schemata_write: the trailing newline is checked before the status is
        # reset; then the whole write is parsed and staged before anything is applied.
        if not text or not text.endswith("\n"):
            raise ResctrlError(errno.EINVAL)
        self.status = "ok"
        staged: dict[str, dict[int, int]] = {}
        # the kernel parses a C string (strsep, strim): it ends at the first NUL
        for line in text[:-1].partition("\0")[0].split("\n"):
            resname, sep, rest = line.partition(":")
            resname = resname.strip(KERNEL_SPACE)
            if not sep:
                self.status = "Missing ':'"
                raise ResctrlError(errno.EINVAL)
            if rest == "":
                self.status = f"Missing '{resname}' value"
                raise ResctrlError(errno.EINVAL)
            if resname not in self.schemas:
                self.status = f"Unknown or unsupported resource name '{resname}'"
                raise ResctrlError(errno.EINVAL)
            self._parse_line(g, resname, rest, staged.setdefault(resname, {}))
        self._advance()
        for schema, per_dom in staged.items():
            g.ctrl[schema].update(per_dom)

    def _parse_line(self, g: Group, schema: str, line: str, staged: dict[int, int]) -> None:
        items = line.split(";")
        if items[-1] == "":
            items.pop()  # parse_line stops where the line ends: after a trailing ';'
        for item in items:
            ident, sep, value = item.partition("=")  # an empty item fails here, as there
            dom = _kstrtoul10(ident) if sep else None
            if dom is None:
                self.status = "Missing '=' or non-numeric domain"
                raise ResctrlError(errno.EINVAL)
            value = value.strip(KERNEL_SPACE)
            if dom not in self.domains:
                raise ResctrlError(errno.EINVAL)  # the kernel says nothing: status stays "ok"
            if schema == "MB" and self.p.mba_mbps:
                # parse_bw stores an mba_MBps value as it parses (d->mbps_val), never staged,
                # so a later line refusing the write does not take it back, and a domain
                # named twice is no duplicate: the last value stays.
                bw = self._parse_bw(value)
                self._advance()
                g.ctrl[schema][dom] = bw
                continue
            if dom in staged:
                self.status = f"Duplicate domain {dom}"
                raise ResctrlError(errno.EINVAL)
            if schema == "MB":
                staged[dom] = self._parse_bw(value)
            else:
                staged[dom] = self._parse_cbm(g, schema, dom, value)

    def _parse_bw(self, value: str) -> int:
        mb = self.p.mb
        assert mb is not None
        try:
            bw = kstrtoull(value, 10, most=0xFFFFFFFF)  # kstrtou32
        except ValueError:
            self.status = f"Invalid MB value {value}"
            raise ResctrlError(errno.EINVAL) from None
        if self.p.mba_mbps:
            return bw
        if bw < mb.min_bandwidth or bw > mb.max_bandwidth:
            self.status = f"MB value {bw} out of range [{mb.min_bandwidth},{mb.max_bandwidth}]"
            raise ResctrlError(errno.EINVAL)
        gran = mb.bandwidth_gran
        return -(-bw // gran) * gran

    def _parse_cbm(self, g: Group, schema: str, dom: int, value: str) -> int:
        try:
            val = kstrtoull(value, 16)  # kstrtoul: any failure, an overflow too, says this
        except ValueError:
            self.status = f"Non-hex character in the mask {value}"
            raise ResctrlError(errno.EINVAL) from None
        if (self.p.min_cbm_bits > 0 and val == 0) or val > self.p.cbm_mask:
            self.status = "Mask out of range"
            raise ResctrlError(errno.EINVAL)
        first = (val & -val).bit_length() - 1 if val else self.cbm_len
        zero = first
        while zero < self.cbm_len and val >> zero & 1:
            zero += 1
        if not self.p.sparse_masks and val >> zero:
            self.status = f"The mask {val:x} has non-consecutive 1-bits"
            raise ResctrlError(errno.EINVAL)
        if zero - first < self.p.min_cbm_bits:
            self.status = f"Need at least {self.p.min_cbm_bits} bits in the mask"
            raise ResctrlError(errno.EINVAL)
        if self._overlaps(schema, dom, val, g.closid, exclusive_only=True):
            self.status = "Overlaps with exclusive group"
            raise ResctrlError(errno.EINVAL)
        if g.mode == "exclusive" and self._overlaps(schema, dom, val, g.closid, False):
            self.status = "Overlaps with other group"
            raise ResctrlError(errno.EINVAL)
        return val


def _kstrtoul10(text: str) -> int | None:
    """The kernel's kstrtoul(s, 10), as parse_line reads a domain id: an optional '+',
    ASCII digits only (not the other scripts' digits str.isdigit takes, nor superscripts),
    one optional trailing newline, a value below 2**64; None where it fails."""
    body = text[:-1] if text.endswith("\n") else text
    body = body[1:] if body.startswith("+") else body
    if not body or any(c not in "0123456789" for c in body):
        return None
    value = int(body)
    return value if value < 2**64 else None
