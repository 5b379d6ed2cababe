"""A recording's journal read back: torn at every byte of its last record, a corrupt
record in the middle, another format version; through ``rdtune trace recover``."""

from __future__ import annotations

import json
import shutil
import struct
import zlib
from pathlib import Path

import pytest

from agent.sim import SimNode
from models.explore import Explore
from training.trace_journal import read_journal
from training.trace_record import record
from training.traces import load_trace
from tuner.cli import main

INTERVALS = 6


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> tuple[Path, Path]:
    """A journal as a kill after :data:`INTERVALS` intervals leaves it (copied from a live
    recording), and the trace of the same recording closed normally after them."""
    d = tmp_path_factory.mktemp("journal")

    def copy_journal(done: int, total: int) -> None:
        if done == INTERVALS:
            (live,) = d.glob("*.journal")
            shutil.copyfile(live, d / "killed.journal")

    out = d / "closed.parquet"
    explore = Explore(seed=1, min_dwell=1, max_dwell=2)
    record(SimNode("default", seed=0), explore, out, INTERVALS * 0.1, progress=copy_journal)
    assert not list(d.glob("*.journal.*")) and not list(d.glob("*.part"))
    return d / "killed.journal", out


def _offsets(data: bytes) -> list[int]:
    """Where each record starts (the header's first), and the end of the file."""
    offsets, at = [], 8
    while at < len(data):
        offsets.append(at)
        at += 8 + struct.unpack_from(">I", data, at)[0]
    return [*offsets, at]


def _recover(journal: Path, out: Path, capsys) -> tuple[int, str]:
    rc = main(["trace", "recover", str(journal), "--out", str(out)])
    return rc, capsys.readouterr().err


def test_a_journal_torn_at_every_byte_of_its_last_record_keeps_the_intervals_before(
    recorded, tmp_path
) -> None:
    journal, _ = recorded
    data = journal.read_bytes()
    last, end = _offsets(data)[-2:]
    assert end == len(data)
    whole = read_journal(journal).intervals
    assert len(whole) == INTERVALS and read_journal(journal).stopped is None
    torn = tmp_path / "torn.journal"
    for cut in range(last, end):  # every length the kill may have left it at
        torn.write_bytes(data[:cut])
        got = read_journal(torn)
        assert got.intervals == whole[:-1], cut
        if cut == last:  # ends cleanly between records: nothing torn to name
            assert got.stopped is None
        else:
            assert got.stopped.startswith(
                f"record of interval {INTERVALS - 1} at byte {last} is torn: the file ends"
            ), (cut, got.stopped)


@pytest.mark.parametrize("into", [1, 4, 8, 9, -1])  # prefix, length, CRC, payload, end
def test_a_torn_journal_recovers_the_trace_closed_before_it(recorded, tmp_path, capsys, into):
    journal, closed = recorded
    data = journal.read_bytes()
    last, end = _offsets(data)[-2:]
    torn = tmp_path / "torn.journal"
    torn.write_bytes(data[: last + into if into >= 0 else end - 1])
    rc, err = _recover(torn, tmp_path / "r.parquet", capsys)
    assert rc == 0, err
    assert err.startswith(
        f"rdtune trace recover: {torn}: record of interval {INTERVALS - 1} at byte {last} is "
        "torn: the file ends"
    ) and err.endswith(f"; kept the {INTERVALS - 1} intervals before it\n")
    assert err.count("\n") == 1
    assert load_trace(tmp_path / "r.parquet").steps == load_trace(closed).steps[:-1]


@pytest.mark.parametrize(
    ("where", "flip", "why"),
    [
        (0, 0xFF, "its length (4278"),  # the length's high byte: no record is that long
        (2, 0x01, "its CRC32 does not match its bytes"),  # a length 256 bytes shorter
        (5, 0x10, "its CRC32 does not match its bytes"),  # the CRC
        (40, 0x01, "its CRC32 does not match its bytes"),  # the payload
    ],
)
def test_a_corrupt_record_in_the_middle_stops_the_recovery_there(
    recorded, tmp_path, capsys, where: int, flip: int, why: str
) -> None:
    journal, closed = recorded
    data = bytearray(journal.read_bytes())
    at = _offsets(bytes(data))[3]  # the record of interval 2 (the header is the first)
    data[at + where] ^= flip
    bad = tmp_path / "bad.journal"
    bad.write_bytes(bytes(data))
    rc, err = _recover(bad, tmp_path / "r.parquet", capsys)
    assert rc == 0, err
    assert err.startswith(
        f"rdtune trace recover: {bad}: record of interval 2 at byte {at} is corrupt: {why}"
    ) and err.endswith("; kept the 2 intervals before it\n"), err
    assert err.count("\n") == 1
    trace = load_trace(tmp_path / "r.parquet")
    assert trace.steps == load_trace(closed).steps[:2]
    assert f"record of interval 2 at byte {at} is corrupt" in trace.extra["stopped_early"]


def test_a_checksummed_record_no_writer_wrote_stops_the_recovery_there(recorded, tmp_path, capsys):
    """Whole and checksummed, but a row the writer would have refused (a negative count):
    the recovery stops there as at a corrupt record, not with a trace that does not read."""
    journal, closed = recorded
    data = journal.read_bytes()
    at, after = _offsets(data)[3:5]
    interval = json.loads(data[at + 8 : after])
    interval["rows"][0]["instructions"] = -1.0
    payload = json.dumps(interval).encode()
    record = struct.pack(">II", len(payload), zlib.crc32(payload)) + payload
    bad = tmp_path / "bad.journal"
    bad.write_bytes(data[:at] + record + data[after:])
    rc, err = _recover(bad, tmp_path / "r.parquet", capsys)
    assert rc == 0
    group = interval["rows"][0]["group"]
    assert err == (
        f"rdtune trace recover: {bad}: record of interval 2 holds what no trace may: interval "
        f"2, group {group!r} not written: column 'instructions' is -1.0, not a count; kept the "
        "2 intervals before it\n"
    )
    assert load_trace(tmp_path / "r.parquet").steps == load_trace(closed).steps[:2]


def test_recover_refuses_a_part_without_journal_and_an_existing_out(recorded, tmp_path, capsys):
    journal, closed = recorded
    part = tmp_path / "t.parquet.0123abcd.part"
    part.write_bytes(b"PAR1")
    rc, err = _recover(part, tmp_path / "r.parquet", capsys)
    assert rc == 2
    assert err == (
        f"rdtune trace recover: journal {part.with_suffix('.journal')}: no such file: {part} "
        "has no journal beside it (recorded by an rdtune without journals, or closed whole)\n"
    )
    out = tmp_path / "kept.parquet"
    shutil.copyfile(closed, out)
    rc, err = _recover(journal, out, capsys)
    assert (rc, err) == (2, f"rdtune trace recover: --out {out}: exists; --force replaces it\n")
    assert out.read_bytes() == closed.read_bytes()
    assert main(["trace", "recover", str(journal), "--out", str(out), "--force"]) == 0
    assert load_trace(out).extra["stopped_early"] == "killed: recovered from its journal"
    assert load_trace(out).steps == load_trace(closed).steps


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d[:4] + struct.pack(">I", 2) + d[8:],
         "journal format version 2, but this rdtune reads version 1; recover it with the "
         "rdtune that recorded it"),
        (lambda d: b"PAR1" + d[4:], "not an rdtune trace journal (no RDTJ magic at the start)"),
        (lambda d: d[:20], "its header is torn: the file ends 4 of its"),
    ],
)  # fmt: skip
def test_a_journal_that_cannot_be_read_is_refused(recorded, tmp_path, capsys, edit, message):
    journal, _ = recorded
    other = tmp_path / "other.journal"
    other.write_bytes(edit(journal.read_bytes()))
    rc, err = _recover(other, tmp_path / "r.parquet", capsys)
    assert rc == 2
    assert err.startswith(f"rdtune trace recover: journal {other}: {message}"), err
    assert err.count("\n") == 1 and not (tmp_path / "r.parquet").exists()
    assert not list(tmp_path.glob("*.part"))
