"""CPU masks and lists follow lib/bitmap-str.c, which rdtgroup_cpus_write uses
(``cpumask_parse`` -> ``bitmap_parse``, ``cpulist_parse`` -> ``bitmap_parselist``).

The kernel rule, from bitmap_parse's comment: "Commas group hex digits into chunks. Each
chunk defines exactly 32 bits of the resultant bitmask. No chunk may specify a value larger
than 32 bits (-EOVERFLOW) ... -EINVAL is returned for illegal characters. Grouping such as
"1,,5", ",44", "," or "" is allowed. Leading, embedded and trailing whitespace accepted."
pqos writes every 32-bit word followed by a comma (``03,``, ``01,00000003,``).
"""

from __future__ import annotations

import errno
import os

import pytest

from agent.emulator.bitmap import BitmapError, format_list, format_mask, parse_list, parse_mask
from tests.emulated_resctrl import Emulated


@pytest.mark.parametrize(
    ("text", "nbits", "cpus"),
    [
        ("3,", 12, {0, 1}),  # pqos: a comma after every word
        ("01,00000003,", 40, {0, 1, 32}),
        ("01,00000003", 40, {0, 1, 32}),
        ("1,,5", 64, {0, 2, 32}),
        (",44", 12, {2, 6}),
        (",", 12, set()),
        ("", 12, set()),
        ("  0c  \n", 12, {2, 3}),
        ("Ff", 12, set(range(8))),
        ("3\nff", 12, {0, 1}),  # only up to the first newline
        ("x00000003", 40, {0, 1}),  # a non-digit before a full chunk is consumed unseen
    ],
)
def test_masks_the_kernel_accepts(text: str, nbits: int, cpus: set[int]) -> None:
    assert parse_mask(text, nbits) == cpus


@pytest.mark.parametrize(
    ("text", "nbits", "err"),
    [
        ("0x3", 12, errno.EINVAL),
        ("zz", 12, errno.EINVAL),
        ("3-4", 12, errno.EINVAL),
        ("100000000", 64, errno.EOVERFLOW),  # nine digits in one chunk
        ("1,00000000", 12, errno.EOVERFLOW),  # more chunks than 12 bits need
        ("1000", 12, errno.EOVERFLOW),  # bit 12 of a 12-bit mask
    ],
)
def test_masks_the_kernel_refuses(text: str, nbits: int, err: int) -> None:
    with pytest.raises(BitmapError) as exc:
        parse_mask(text, nbits)
    assert exc.value.err == err


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("0-3,", {0, 1, 2, 3}),
        (",1, 5\n", {1, 5}),
        ("0-7:2/4", {0, 1, 4, 5}),
        ("N", {11}),
        ("all", set(range(12))),
        ("4-N", set(range(4, 12))),
        ("", set()),
        ("1\n3", {1}),
    ],
)
def test_lists_the_kernel_accepts(text: str, cpus: set[int]) -> None:
    assert parse_list(text, 12) == cpus


@pytest.mark.parametrize(
    ("text", "err"),
    [
        ("3-1", errno.EINVAL),
        ("0-3:0/0", errno.EINVAL),
        ("1x", errno.EINVAL),
        ("-1", errno.EINVAL),
        ("0-12", errno.ERANGE),
        ("4294967296", errno.EOVERFLOW),
    ],
)
def test_lists_the_kernel_refuses(text: str, err: int) -> None:
    with pytest.raises(BitmapError) as exc:
        parse_list(text, 12)
    assert exc.value.err == err


@pytest.mark.parametrize(
    ("cpus", "nbits", "text"),
    [
        ({0, 1}, 12, "003"),  # %*pb: the first word only as wide as its bits
        ({0, 32}, 40, "01,00000001"),
        (set(), 64, "00000000,00000000"),
    ],
)
def test_mask_printing(cpus: set[int], nbits: int, text: str) -> None:
    assert format_mask(cpus, nbits) == text
    assert parse_mask(text + ",", nbits) == cpus


def test_list_printing() -> None:
    assert format_list({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8"
    assert format_list(set()) == ""


def test_pqos_masks_through_the_mount(emu: Emulated) -> None:
    os.mkdir(f"{emu.root}/g")
    emu.write("g/cpus", "03,")
    assert emu.read("g/cpus_list") == "0-1\n"
    assert emu.read("cpus") == "0fc\n"
    with pytest.raises(OSError) as exc:
        emu.write("g/cpus", "100000000,")
    assert (exc.value.errno, emu.status()) == (errno.EOVERFLOW, "Bad CPU list/mask")
