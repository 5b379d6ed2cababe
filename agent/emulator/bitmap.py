"""The kernel's CPU bitmap text formats, as resctrl's ``cpus`` and ``cpus_list`` use them.

Writes to ``cpus`` go through ``cpumask_parse`` -> ``bitmap_parse`` and writes to
``cpus_list`` through ``cpulist_parse`` -> ``bitmap_parselist`` (lib/bitmap-str.c; the
parser was rewritten in 5.6 and every preset names a later kernel). Reads print with
``%*pb`` / ``%*pbl`` (lib/vsprintf.c ``bitmap_string`` / ``bitmap_list_string``).

The rules that clients depend on, from bitmap_parse's own comment: "Commas group hex digits
into chunks. Each chunk defines exactly 32 bits of the resultant bitmask. ... Grouping such
as "1,,5", ",44", "," or "" is allowed. Leading, embedded and trailing whitespace accepted."
So pqos's ``3,`` (a trailing comma after every 32-bit word) is a valid mask. The parsers are
ported character by character, quirks included, and raise :class:`BitmapError` with the
errno the kernel returns (fs/resctrl/rdtgroup.c ``rdtgroup_cpus_write`` passes the parser's
errno through: EINVAL, ERANGE or EOVERFLOW, always with "Bad CPU list/mask").
"""

from __future__ import annotations

import errno

# isspace() in the kernel's ctype table (ASCII part), and the ',' separator.
_SPACE = " \t\n\v\f\r"
_REGION_END = _SPACE + ","
_HEX = "0123456789abcdefABCDEF"
_U32 = (1 << 32) - 1


class BitmapError(ValueError):
    """A text the kernel's bitmap parser refuses; ``err`` is its errno."""

    def __init__(self, err: int, text: str) -> None:
        super().__init__(f"{errno.errorcode.get(err, err)}: {text!r}")
        self.err = err


def parse_mask(text: str, nbits: int) -> set[int]:
    """``bitmap_parse``: hex 32-bit chunks read from the right, up to the first newline."""
    stop = text.find("\n")
    s = text if stop < 0 else text[:stop]
    chunks_left = (nbits + 31) // 32
    value = 0
    chunk = 0
    end = len(s) - 1
    while True:
        while end >= 0 and s[end] in _REGION_END:  # bitmap_find_region_reverse
            end -= 1
        if end < 0:
            break
        if chunks_left == 0:
            raise BitmapError(errno.EOVERFLOW, text)
        chunks_left -= 1
        num, end = _get_x32_reverse(s, end, text)
        value |= num << (32 * chunk)
        chunk += 1
    if value >> nbits:
        raise BitmapError(errno.EOVERFLOW, text)
    return {i for i in range(nbits) if value >> i & 1}


def _get_x32_reverse(s: str, end: int, text: str) -> tuple[int, int]:
    """``bitmap_get_x32_reverse``: at most eight hex digits ending at ``end``."""
    num = 0
    for shift in range(0, 32, 4):
        c = s[end]
        end -= 1
        if c not in _HEX:
            raise BitmapError(errno.EINVAL, text)
        num |= int(c, 16) << shift
        if end < 0 or s[end] in _REGION_END:
            return num, end
    # A ninth digit overflows the chunk; any other character is consumed unseen.
    c = s[end]
    end -= 1
    if c in _HEX:
        raise BitmapError(errno.EOVERFLOW, text)
    return num, end


def parse_list(text: str, nbits: int) -> set[int]:
    """``bitmap_parselist``: ``0-3,8``, ``N`` (the last bit), ``all``, ``0-7:2/4``."""
    s = text + "\0"
    i = 0
    out: set[int] = set()
    lastbit = nbits - 1
    while True:
        while s[i] in _REGION_END:  # bitmap_find_region
            i += 1
        if s[i] in "\0\n":
            return out
        start, end, used, group, i, last = _parse_region(s, i, lastbit, text)
        if start > end or group == 0 or used > group:  # bitmap_check_region
            raise BitmapError(errno.EINVAL, text)
        if end >= nbits:
            raise BitmapError(errno.ERANGE, text)
        for base in range(start, end + 1, group):
            out.update(range(base, base + min(end - base + 1, used)))
        if last:
            return out


def _parse_region(s: str, i: int, lastbit: int, text: str) -> tuple[int, int, int, int, int, bool]:
    """``bitmap_parse_region``: (start, end, used, group, next index, text ended)."""
    if s[i : i + 3].lower() == "all":
        start, end, i = 0, lastbit, i + 3
    else:
        start, i = _getnum(s, i, lastbit, text)
        if _end_of_region(s[i]):
            return start, start, start + 1, start + 1, i, s[i] in "\0\n"
        if s[i] != "-":
            raise BitmapError(errno.EINVAL, text)
        end, i = _getnum(s, i + 1, lastbit, text)
    if _end_of_region(s[i]):
        return start, end, end + 1, end + 1, i, s[i] in "\0\n"
    if s[i] != ":":
        raise BitmapError(errno.EINVAL, text)
    used, i = _getnum(s, i + 1, lastbit, text)
    if s[i] != "/":
        raise BitmapError(errno.EINVAL, text)
    group, i = _getnum(s, i + 1, lastbit, text)
    return start, end, used, group, i, False


def _end_of_region(c: str) -> bool:
    return c in _REGION_END or c in "\0\n"


def _getnum(s: str, i: int, lastbit: int, text: str) -> tuple[int, int]:
    """``bitmap_getnum``: ``N`` or a decimal that fits 32 bits."""
    if s[i] == "N":
        return lastbit, i + 1
    j = i
    while s[j].isascii() and s[j].isdigit():
        j += 1
    if j == i:
        raise BitmapError(errno.EINVAL, text)
    n = int(s[i:j])
    if n > _U32:
        raise BitmapError(errno.EOVERFLOW, text)
    return n, j


def format_mask(cpus: set[int], nbits: int) -> str:
    """``%*pb``: 32-bit words, comma separated; the first as wide as its bits need."""
    value = sum(1 << c for c in cpus)
    first = nbits % 32 or 32
    words = []
    for start in range(((nbits + 31) // 32 - 1) * 32, -1, -32):
        width = ((first if not words else 32) + 3) // 4
        words.append(f"{value >> start & _U32:0{width}x}")
    return ",".join(words)


def format_list(cpus: set[int]) -> str:
    """``%*pbl``: ascending ranges, ``0-3,8``."""
    out: list[str] = []
    run: list[int] = []
    for c in sorted(cpus):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [c]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)
