"""Trace format: round trip, streaming row groups, and clear errors for bad files."""

from __future__ import annotations

import bz2
import contextlib
import gzip
import io
import itertools
import json
import lzma
import math
import os
import re
import signal
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agent import interrupt
from agent.sim import SimNode
from models.explore import Explore
from tests.training.trace_edits import DROP, rewrite_meta
from training import traces as T
from training.trace_record import record
from training.traces import TraceError, TraceWriter, load_trace


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> tuple[Path, SimNode]:
    path = tmp_path_factory.mktemp("tr") / "explore.parquet"
    node = SimNode("default", seed=3)
    n = record(
        node,
        Explore(seed=1, min_dwell=2, max_dwell=4),
        path,
        6.0,
        interval_s=0.1,
        scenario={"name": "default"},
        seed=3,
    )
    assert n == 60
    return path, node


def test_round_trip_keeps_every_interval(recorded) -> None:
    path, node = recorded
    trace = load_trace(path)
    assert len(trace) == 60
    assert trace.version == T.FORMAT_VERSION
    assert trace.capabilities == node.capabilities()
    assert dict(trace.groups) == dict(node.groups())
    assert trace.controller == "explore"
    assert trace.scenario == {"name": "default"} and trace.seed == 3
    assert trace.interval_s == pytest.approx(0.1)
    times = [s.snapshot.timestamp for s in trace.steps]
    assert times == sorted(times) and times[-1] == pytest.approx(6.0)
    # Explore changes the allocation every 2..4 intervals: applied is recorded then, and
    # the next interval holds exactly what was applied.
    changes = [i for i, s in enumerate(trace.steps) if s.applied is not None]
    assert 60 / 4 - 2 <= len(changes) <= 60 / 2 + 1
    for i in changes[:-1]:
        if i + 1 < len(trace):
            assert trace.steps[i + 1].allocation == trace.steps[i].applied
    lc = [g for g, s in trace.groups.items() if s.slo is not None]
    assert lc, "the default scenario has an LC service"
    lat = trace.steps[10].snapshot.groups[lc[0]].latency
    assert lat is not None and lat.count > 0 and math.isfinite(lat.p99_ms)


def test_exact_values_round_trip(tmp_path) -> None:
    node = SimNode("default", seed=0)
    node.advance(0.2)
    snap = node.observe()
    held = node.allocation()
    path = tmp_path / "one.parquet"
    with TraceWriter(path, node.capabilities(), node.groups(), "manual", interval_s=0.2) as w:
        w.write(snap, held, None, note="first")
        w.write(snap.__class__(snap.timestamp + 0.2, 0.2, snap.groups), held, held)
    trace = load_trace(path)
    assert trace.steps[0].snapshot == snap
    assert trace.steps[0].allocation == held and trace.steps[0].applied is None
    assert trace.steps[0].note == "first"
    assert trace.steps[1].applied == held


def test_writer_streams_row_groups_and_part_file(tmp_path) -> None:
    node = SimNode("default", seed=0)
    path = tmp_path / "s.parquet"
    w = TraceWriter(path, node.capabilities(), node.groups(), "x", row_group_steps=5)
    for _ in range(12):
        node.advance(0.1)
        w.write(node.observe(), node.allocation())
    assert not path.exists(), "the trace appears under its name only when complete"
    assert w.location.name.startswith("s.parquet.") and w.location.suffix == ".part"
    w.close()
    assert pq.ParquetFile(path).num_row_groups == 3
    assert len(load_trace(path)) == 12
    assert w.location == path and list(tmp_path.iterdir()) == [path]
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask, "modes as for any new file"


def _write(path: Path, intervals: int, **kwargs) -> TraceWriter:
    node = SimNode("default", seed=0)
    w = TraceWriter(path, node.capabilities(), node.groups(), "x", **kwargs)
    for _ in range(intervals):
        node.advance(0.1)
        w.write(node.observe(), node.allocation())
    return w


def test_the_part_file_is_always_a_new_one(tmp_path) -> None:
    """A crashed recording's ``.part`` and a link planted where one would go are left
    alone: the writer's file is created afresh under a name of its own."""
    path = tmp_path / "t.parquet"
    crashed = tmp_path / "t.parquet.part"
    crashed.write_bytes(b"a crashed recording's intervals")
    victim = tmp_path / "victim"
    victim.write_bytes(b"kept")
    for i in range(20):  # names a guess could plant: the old fixed one, and random ones
        (tmp_path / f"t.parquet.{i:08x}.part").symlink_to(victim)
    _write(path, 3).close()
    assert len(load_trace(path)) == 3
    assert crashed.read_bytes() == b"a crashed recording's intervals"
    assert victim.read_bytes() == b"kept"


@pytest.mark.parametrize("replace", [False, True])
def test_a_file_that_appears_while_writing(tmp_path, replace: bool) -> None:
    """Two recorders given the same file: the one that closes second keeps the first's
    trace unless told to replace it, and says where its own is."""
    path = tmp_path / "t.parquet"
    w = _write(path, 3, replace=replace)
    _write(path, 5).close()  # the other recorder, done first
    if replace:
        w.close()
        assert len(load_trace(path)) == 3 and w.location == path
        return
    with pytest.raises(FileExistsError) as err:
        w.close()
    assert str(err.value) == (
        f"{path} appeared while recording (another recording to the same file?) and is kept; "
        f"this trace's 3 intervals are in {w.location}"
    )
    assert len(load_trace(path)) == 5
    assert w.location.suffix == ".part" and len(load_trace(w.location)) == 3


def test_interval_without_groups_round_trips(tmp_path) -> None:
    node = SimNode("default", seed=0, auto_groups=False)
    node.advance(0.1)
    path = tmp_path / "empty.parquet"
    with TraceWriter(path, node.capabilities(), {}, "x") as w:
        w.write(node.observe(), node.allocation())
    trace = load_trace(path)
    assert len(trace) == 1 and dict(trace.steps[0].snapshot.groups) == {}


_WATCHED = re.compile(r"(traces|interrupt|contextlib)\.py$|pyarrow")


@contextlib.contextmanager
def _signal_at_line(n: int, sig: int) -> Iterator[list[bool]]:
    """Within the block, ``sig`` (a real signal, to this process) is sent at the ``n``-th
    line run of the writer's, the interrupt handling's and Arrow's Python code, as one
    arriving there would be; the list yielded says whether it was sent."""
    sent = [False]
    count = 0

    def tracer(frame, event, arg):
        nonlocal count
        if event == "line" and not sent[0] and _WATCHED.search(frame.f_code.co_filename):
            count += 1
            if count == n:
                sent[0] = True
                signal.raise_signal(sig)
        return tracer

    before = sys.gettrace()
    sys.settrace(tracer)
    try:
        yield sent
    finally:
        sys.settrace(before)


@pytest.fixture(scope="module")
def four_intervals() -> tuple[SimNode, list[tuple]]:
    node = SimNode("default", seed=0)
    intervals = []
    for _ in range(4):
        node.advance(0.1)
        intervals.append((node.observe(), node.allocation()))
    return node, intervals


@pytest.fixture
def python_handlers() -> Iterator[None]:
    """Python's own SIGINT handler (Ctrl-C raises KeyboardInterrupt) and SIGTERM's default
    for the test, whatever the process had: a test worker's may be another, and an earlier
    test of the same worker may have left its own."""
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before[0])
        signal.signal(signal.SIGTERM, before[1])


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize(
    "call, row_group_steps",
    [("write", 8), ("write", 4), ("close", 8)],
    ids=["a write that buffers", "a write that ends a row group", "the close"],
)
def test_a_signal_anywhere_in_the_writer_leaves_a_whole_trace(
    four_intervals, tmp_path, sig, call, row_group_steps, python_handlers
) -> None:
    """Ctrl-C or SIGTERM at any line of a write or of the close, then the close the
    recorder makes (training/trace_record.py): the trace reads, with every interval
    written before and the interrupted one whole or absent; the signal is never lost,
    and the handlers are put back."""
    node, intervals = four_intervals
    for n in itertools.count(1):
        path = tmp_path / f"t{n}.parquet"
        w = TraceWriter(
            path, node.capabilities(), node.groups(), "x", row_group_steps=row_group_steps
        )
        for snap, held in intervals[:3]:
            w.write(snap, held)
        interrupted = False
        try:
            with interrupt.terminate_as_interrupt(), _signal_at_line(n, sig) as sent:
                w.close() if call == "close" else w.write(*intervals[3])
        except KeyboardInterrupt:
            interrupted = True
        assert interrupted == sent[0], f"line {n}: the signal was lost"
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        if not interrupted:
            w.close()
            break  # past the call's last line
        w.close(stopped="KeyboardInterrupt")  # as record() does
        trace = load_trace(path)
        assert len(trace) in (3, 4) and trace.steps[2].snapshot == intervals[2][0], n
    assert n > 20, "the calls ran that many lines"


# --------------------------------------------------------------------------- bad files


def test_missing_file(tmp_path) -> None:
    with pytest.raises(TraceError, match="no such file") as err:
        load_trace(tmp_path / "nope.parquet")
    assert "nope.parquet" in str(err.value)


def test_a_file_that_cannot_be_read_is_a_trace_error(recorded, monkeypatch) -> None:
    """Not an OSError past the reader (rdtune trace info exited 1 for it, 2 for the rest)."""

    def refused(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "open", refused)  # root reads a file whatever its mode
    with pytest.raises(TraceError) as err:
        load_trace(recorded[0])
    assert str(err.value) == f"trace {recorded[0]}: cannot be read: Permission denied"


def test_a_pipe_is_refused_not_waited_on(tmp_path) -> None:
    fifo = tmp_path / "t.parquet"
    os.mkfifo(fifo)  # no writer: reading it would block for ever
    with pytest.raises(TraceError, match="is not a regular file"):
        load_trace(fifo)


def test_not_parquet(tmp_path) -> None:
    p = tmp_path / "x.parquet"
    p.write_text("step,group\n1,a\n")
    with pytest.raises(TraceError, match="not a Parquet file") as err:
        load_trace(p)
    assert str(p) in str(err.value)


@pytest.mark.parametrize(
    "packer, pack",
    [
        ("gzip", gzip.compress),
        ("bzip2", bz2.compress),
        ("xz", lzma.compress),
        ("zip", lambda data: _zipped("t.parquet", data)),
    ],
    ids=["gzip", "bzip2", "xz", "zip"],
)
def test_a_compressed_trace_is_named_as_such(recorded, tmp_path, packer, pack) -> None:
    p = tmp_path / "t.parquet.packed"
    p.write_bytes(pack(recorded[0].read_bytes()))
    with pytest.raises(TraceError) as err:
        load_trace(p)
    assert str(err.value) == (
        f"trace {p}: compressed with {packer}, not a Parquet file: decompress it first (a "
        "trace is read as written; its pages are compressed already)"
    )


def _zipped(name: str, data: bytes) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        z.writestr(name, data)
    return out.getvalue()


@pytest.mark.parametrize("keep", [0.5, 0.9, 0.999])
def test_truncated(recorded, tmp_path, keep) -> None:
    data = recorded[0].read_bytes()
    p = tmp_path / "cut.parquet"
    p.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(TraceError, match="truncated") as err:
        load_trace(p)
    assert str(p) in str(err.value)


def test_unclosed_writer_reads_as_truncated(tmp_path) -> None:
    node = SimNode("default", seed=0)
    path = tmp_path / "crash.parquet"
    w = TraceWriter(path, node.capabilities(), node.groups(), "x", row_group_steps=1)
    node.advance(0.1)
    w.write(node.observe(), node.allocation())
    with pytest.raises(TraceError, match="truncated"):
        load_trace(w._part)  # what a crashed recorder leaves behind


def test_corrupt_data_pages(recorded, tmp_path) -> None:
    data = bytearray(recorded[0].read_bytes())
    # Overwrite the middle of the column chunks (not the footer) with garbage.
    footer_len = int.from_bytes(data[-8:-4], "little")
    body_end = len(data) - 8 - footer_len
    for i in range(100, body_end - 100, 7):
        data[i] = 0xFF
    p = tmp_path / "corrupt.parquet"
    p.write_bytes(bytes(data))
    with pytest.raises(TraceError, match="corrupt") as err:
        load_trace(p)
    assert str(p) in str(err.value)


def test_corrupt_footer(recorded, tmp_path) -> None:
    data = bytearray(recorded[0].read_bytes())
    footer_len = int.from_bytes(data[-8:-4], "little")
    start = len(data) - 8 - footer_len
    data[start : start + 40] = b"\x13" * 40
    p = tmp_path / "badfooter.parquet"
    p.write_bytes(bytes(data))
    with pytest.raises(TraceError, match="corrupt"):
        load_trace(p)


def test_version_mismatch(recorded, tmp_path) -> None:
    p = tmp_path / "v99.parquet"
    rewrite_meta(recorded[0], p, version=99)
    with pytest.raises(TraceError, match="version 99") as err:
        load_trace(p)
    assert str(p) in str(err.value) and f"version {T.FORMAT_VERSION}" in str(err.value)


def test_plain_parquet_is_not_a_trace(tmp_path) -> None:
    p = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"a": [1, 2]}), p)
    with pytest.raises(TraceError, match="not an rdtune trace"):
        load_trace(p)


@pytest.mark.parametrize("key", ["capabilities", "groups", "controller"])
def test_missing_metadata(recorded, tmp_path, key) -> None:
    p = tmp_path / "nometa.parquet"
    rewrite_meta(recorded[0], p, **{key: DROP})
    with pytest.raises(TraceError, match=key):
        load_trace(p)


def test_missing_column(recorded, tmp_path) -> None:
    table = pq.read_table(recorded[0])
    p = tmp_path / "nocol.parquet"
    pq.write_table(table.drop_columns(["llc_misses"]), p)
    with pytest.raises(TraceError, match=r"missing column.*llc_misses"):
        load_trace(p)


def test_step_count_mismatch(recorded, tmp_path) -> None:
    p = tmp_path / "short.parquet"
    table = pq.read_table(recorded[0])
    keep = pa.compute.less(table["step"], 10)
    meta = dict(pq.read_metadata(recorded[0]).metadata)
    meta.pop(b"ARROW:schema")
    pq.write_table(table.filter(keep).replace_schema_metadata(meta), p)
    with pytest.raises(TraceError, match="60 intervals but the file holds 10"):
        load_trace(p)


def test_group_without_spec(recorded, tmp_path) -> None:
    p = tmp_path / "ghost.parquet"
    groups = json.loads(pq.read_metadata(recorded[0]).metadata[b"rdtune.trace.groups"])
    rewrite_meta(recorded[0], p, groups=groups[1:])
    with pytest.raises(TraceError, match="has no spec"):
        load_trace(p)


def test_writer_refuses_writes_after_close(tmp_path) -> None:
    node = SimNode("default", seed=0)
    w = TraceWriter(tmp_path / "c.parquet", node.capabilities(), node.groups(), "x")
    w.close()
    with pytest.raises(ValueError, match="closed"):
        w.write(node.observe(), node.allocation())


def _column_chunk(path: Path, column: str) -> tuple[int, int]:
    """Byte range (start, length) of ``column``'s chunk in the first row group."""
    rg = pq.ParquetFile(path).metadata.row_group(0)
    chunk = next(
        rg.column(i) for i in range(rg.num_columns) if rg.column(i).path_in_schema == column
    )
    return chunk.data_page_offset, chunk.total_compressed_size


def test_a_few_bytes_changed_in_a_data_page_are_found(recorded, tmp_path) -> None:
    data = bytearray(recorded[0].read_bytes())
    start, length = _column_chunk(recorded[0], "memory_bytes")
    data[start + length // 2 : start + length // 2 + 4] = b"\xff\xff\xff\xff"
    p = tmp_path / "flipped.parquet"
    p.write_bytes(bytes(data))
    with pytest.raises(TraceError, match="corrupt data") as err:
        load_trace(p)
    assert str(p) in str(err.value)


def test_traces_without_page_checksums_still_load(recorded, tmp_path) -> None:
    table = pq.read_table(recorded[0])
    old = tmp_path / "old.parquet"
    pq.write_table(table, old, write_page_checksum=False)  # as traces were written before
    assert len(load_trace(old)) == len(load_trace(recorded[0]))


# --------------------------------------------------------------------------- bad metadata
# Hand-edited or corrupted metadata values: each is a TraceError whose one line names the
# file and the key, never a traceback from whatever first uses the value.


def _set(value):
    return lambda _: value


def _caps(**changes):
    return lambda caps: {**caps, **changes}


def _caps_without(name):
    return lambda caps: {k: v for k, v in caps.items() if k != name}


def _resource(resource, **changes):
    return lambda caps: {**caps, resource: {**caps[resource], **changes}}


def _lc(**changes):
    """The groups with the first LC group's spec changed (the default scenario has one)."""

    def edit(groups):
        i = next(i for i, g in enumerate(groups) if g["kind"] == "lc")
        return [*groups[:i], {**groups[i], **changes}, *groups[i + 1 :]]

    return edit


# (footer key, its value edited, the key the message names)
MALFORMED = {
    "caps-str": ("capabilities", _set("x"), "capabilities"),
    "caps-list": ("capabilities", _set([]), "capabilities"),
    "caps-null": ("capabilities", _set(None), "capabilities"),
    "caps-unknown-field": ("capabilities", _caps(cores=8), "capabilities.cores"),
    "caps-no-vendor": ("capabilities", _caps_without("vendor"), "capabilities.vendor"),
    "vendor": ("capabilities", _caps(vendor="zzz"), "capabilities.vendor"),
    "num-cpus-zero": ("capabilities", _caps(num_cpus=0), "capabilities.num_cpus"),
    "num-cpus-bool": ("capabilities", _caps(num_cpus=True), "capabilities.num_cpus"),
    "bandwidth-str": (
        "capabilities",
        _caps(memory_bandwidth_bps="lots"),
        "capabilities.memory_bandwidth_bps",
    ),
    "bandwidth-inf": (
        "capabilities",
        _caps(memory_bandwidth_bps=math.inf),
        "capabilities.memory_bandwidth_bps",
    ),
    "pmc-events": ("capabilities", _caps(pmc_events=5), "capabilities.pmc_events"),
    "pmc-unsupported": ("capabilities", _caps(pmc_unsupported=[1]), "capabilities.pmc_unsupported"),
    "description": ("capabilities", _caps(description=5), "capabilities.description"),
    "simulated": ("capabilities", _caps(simulated="yes"), "capabilities.simulated"),
    "l3-str": ("capabilities", _caps(l3="11 ways"), "capabilities.l3"),
    "l3-domains-null": ("capabilities", _resource("l3", domains=None), "capabilities.l3.domains"),
    "l3-domain-null": (
        "capabilities",
        _resource("l3", domains=[None]),
        "capabilities.l3.domains[0]",
    ),
    "l3-domains-int": ("capabilities", _resource("l3", domains=5), "capabilities.l3.domains"),
    "l3-mask-str": ("capabilities", _resource("l3", cbm_mask="0x7ff"), "capabilities.l3.cbm_mask"),
    "l3-mask-zero": ("capabilities", _resource("l3", cbm_mask=0), "capabilities.l3.cbm_mask"),
    "l3-unknown-field": ("capabilities", _resource("l3", num_ways=0), "capabilities.l3.num_ways"),
    "l3-min-bits": (
        "capabilities",
        _resource("l3", min_cbm_bits=99),
        "capabilities.l3.min_cbm_bits",
    ),
    "mba-mode": ("capabilities", _resource("mba", mode="fast"), "capabilities.mba.mode"),
    "mba-domains-null": (
        "capabilities",
        _resource("mba", domains=None),
        "capabilities.mba.domains",
    ),
    "mba-min-above-max": (
        "capabilities",
        _resource("mba", min_bandwidth=200),
        "capabilities.mba.min_bandwidth",
    ),
    "monitoring-features": (
        "capabilities",
        _resource("monitoring", features="all"),
        "capabilities.monitoring.features",
    ),
    "groups-dict": ("groups", _set({"a": 1}), "groups"),
    "groups-str": ("groups", _set("abc"), "groups"),
    "group-null": ("groups", _set([None]), "groups[0]"),
    "group-no-name": ("groups", _set([{"kind": "batch"}]), "groups[0].name"),
    "group-name-int": ("groups", _set([{"name": 5, "kind": "batch"}]), "groups[0].name"),
    "group-name-path": ("groups", _set([{"name": "../x", "kind": "batch"}]), "groups[0].name"),
    "group-kind": ("groups", _set([{"name": "a", "kind": "zz"}]), "groups[0].kind"),
    "group-twice": ("groups", lambda g: [*g, g[0]], "groups[{n}].name"),
    "slo-short": ("groups", _lc(slo=[99]), "groups[{lc}].slo"),
    "slo-str": ("groups", _lc(slo="fast"), "groups[{lc}].slo"),
    "slo-percentile": ("groups", _lc(slo=[90.0, 1.0]), "groups[{lc}].slo"),
    "slo-target-nan": ("groups", _lc(slo=[95.0, math.nan]), "groups[{lc}].slo.target_ms"),
    "slo-missing": ("groups", _lc(slo=None), "groups[{lc}]"),
    "exclusive": ("groups", _lc(exclusive="no"), "groups[{lc}].exclusive"),
    "controller-int": ("controller", _set(5), "controller"),
    "scenario-str": ("scenario", _set("default"), "scenario"),
    "scenario-name": ("scenario", _set({"name": 5}), "scenario.name"),
    "seed-str": ("seed", _set("abc"), "seed"),
    "seed-float": ("seed", _set(1.5), "seed"),
    "source-null": ("source", _set(None), "source"),
    "interval-list": ("interval_s", _set([1]), "interval_s"),
    "interval-str": ("interval_s", _set("abc"), "interval_s"),
    "interval-negative": ("interval_s", _set(-1), "interval_s"),
    "interval-nan": ("interval_s", _set(math.nan), "interval_s"),
    "interval-huge-int": ("interval_s", _set(10**400), "interval_s"),
    "created-str": ("created", _set("yesterday"), "created"),
    "extra-list": ("extra", _set([1, 2]), "extra"),
    "steps-str": ("steps", _set("60"), "steps"),
    "steps-negative": ("steps", _set(-1), "steps"),
    "rdtune-version-int": ("rdtune_version", _set(1), "rdtune_version"),
    "unknown-key": ("bogus", _set(1), "bogus"),
}


@pytest.mark.parametrize("case", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_metadata_names_file_and_key(recorded, tmp_path, case) -> None:
    footer_key, edit, named = case
    meta = pq.read_metadata(recorded[0]).metadata
    value = json.loads(meta.get((T.META_PREFIX + footer_key).encode(), b"null"))
    groups = json.loads(meta[(T.META_PREFIX + "groups").encode()])
    lc = next(i for i, g in enumerate(groups) if g["kind"] == "lc")
    p = tmp_path / "edited.parquet"
    rewrite_meta(recorded[0], p, **{footer_key: edit(value)})
    with pytest.raises(TraceError) as err:
        load_trace(p)
    message = str(err.value)
    assert message.startswith(f"trace {p}: ")
    assert f"metadata {named.format(lc=lc, n=len(groups))!r}" in message
    assert "\n" not in message


@pytest.mark.parametrize("value", [True, 1.0])  # == 1 to Python, not to a trace
def test_version_must_be_the_integer(recorded, tmp_path, value) -> None:
    p = tmp_path / "version.parquet"
    rewrite_meta(recorded[0], p, version=value)
    with pytest.raises(TraceError, match=f"version {value!r}, but") as err:
        load_trace(p)
    assert str(p) in str(err.value)


def test_metadata_that_is_not_utf8(recorded, tmp_path) -> None:
    p = tmp_path / "latin1.parquet"
    rewrite_meta(recorded[0], p, controller='"expl\xf6re"'.encode("latin-1"))
    with pytest.raises(TraceError, match="metadata 'controller' is not UTF-8") as err:
        load_trace(p)
    assert str(p) in str(err.value)


def test_column_name_that_is_not_utf8(recorded, tmp_path) -> None:
    data = bytearray(recorded[0].read_bytes())
    footer_len = int.from_bytes(data[-8:-4], "little")
    start = len(data) - 8 - footer_len
    # the footer's schema spells the column names as they are (the Arrow schema's copy
    # is base64): make one invalid UTF-8, the same length
    footer = bytes(data[start:]).replace(b"wall_time", b"wall_tim\xe9")
    p = tmp_path / "name.parquet"
    p.write_bytes(bytes(data[:start]) + footer)
    with pytest.raises(TraceError, match="not UTF-8") as err:
        load_trace(p)
    assert str(err.value).startswith(f"trace {p}: ")


def _with_column(src: Path, dst: Path, name: str, values: pa.Array) -> None:
    table = pq.read_table(src)
    i = table.schema.get_field_index(name)
    pq.write_table(table.set_column(i, table.schema.field(name), values), dst)


@pytest.mark.parametrize(
    ("column", "value", "named"),
    [
        ("interval_s", None, "column 'interval_s' is None"),
        ("interval_s", math.nan, "column 'interval_s' is nan"),
        ("interval_s", -1.0, "column 'interval_s' is -1.0"),
        ("allocation", [{"domain": None, "l3_mask": 1, "mb": 10, "l3_code_mask": None}],
         "column 'allocation' has an entry without a domain"),
        ("applied", [{"domain": None, "l3_mask": 1, "mb": 10, "l3_code_mask": None}],
         "column 'applied' has an entry without a domain"),
        ("llc_misses", -1.0, "column 'llc_misses' is -1.0, not a count"),
        ("memory_bytes", math.inf, "column 'memory_bytes' is inf, not a count"),
        ("lat_count", -3, "column 'lat_count' is -3"),
        ("lat_p99_ms", -1.0, "column 'lat_p99_ms' is -1.0, not a latency"),
        ("allocation", [{"domain": 0, "l3_mask": 1 << 40, "mb": None, "l3_code_mask": None}],
         "column 'allocation', domain 0: L3 mask 0x10000000000 out of range"),
        ("allocation", [{"domain": 0, "l3_mask": 0b101, "mb": None, "l3_code_mask": None}],
         "column 'allocation', domain 0: the L3 mask 5 has non-consecutive 1-bits"),
        ("applied", [{"domain": 7, "l3_mask": 1, "mb": None, "l3_code_mask": None}],
         "column 'applied', domain 7: an L3 mask for a cache domain the node does not have"),
        ("applied", [{"domain": 0, "l3_mask": None, "mb": 1000, "l3_code_mask": None}],
         "column 'applied', domain 0: MB value 1000 out of range"),
    ],
)  # fmt: skip
def test_malformed_rows_name_file_and_column(recorded, tmp_path, column, value, named) -> None:
    n = pq.read_metadata(recorded[0]).num_rows
    p = tmp_path / "rows.parquet"
    _with_column(recorded[0], p, column, pa.array([value] * n, T.SCHEMA.field(column).type))
    with pytest.raises(TraceError, match=re.escape(named)) as err:
        load_trace(p)
    assert str(err.value).startswith(f"trace {p}: ")


def _with_cell(src: Path, dst: Path, column: str, row: int, value) -> None:
    """``src`` with one row's value in ``column`` replaced (the footer kept)."""
    values = pq.read_table(src)[column].to_pylist()
    values[row] = value
    _with_column(src, dst, column, pa.array(values, T.SCHEMA.field(column).type))


def _batch_row(path: Path) -> int:
    """The first row of a group without latencies (its LATENCY columns null)."""
    return pq.read_table(path)["lat_count"].to_pylist().index(None)


@pytest.mark.parametrize(
    ("column", "row", "value", "named"),
    [
        # rows 0 to 3 are interval 0 (the default scenario's four groups)
        ("timestamp", 0, math.inf, "row 0: column 'timestamp' is inf, not a finite time"),
        ("wall_time", 0, math.nan, "row 0: column 'wall_time' is nan, not a finite time"),
        ("wall_time", 0, None, "row 0: column 'wall_time' is None, not a finite time"),
        ("timestamp", 2, math.nan, "row 2: column 'timestamp' is nan but 0.1 in row 0, the "
         "first of interval 0"),
        ("interval_s", 1, math.inf, "row 1: column 'interval_s' is inf but 0.1 in row 0"),
        ("wall_time", 3, 5.0, "row 3: column 'wall_time' is 5.0 but "),
        ("controller", 1, "eq", "row 1: column 'controller' is 'eq' but 'explore' in row 0"),
        ("lat_p99_ms", _batch_row, math.inf, "column 'lat_p99_ms' is inf but 'lat_count' is "
         "null"),
        ("lat_p50_ms", _batch_row, 1.5, "column 'lat_p50_ms' is 1.5 but 'lat_count' is null"),
    ],
)  # fmt: skip
def test_a_row_that_contradicts_its_interval_is_refused(
    recorded, tmp_path, column, row, value, named
) -> None:
    """Only an interval's first row was read for its times, the others never checked, and a
    latency with no count was dropped: an edited or damaged row loaded as if whole."""
    row = row(recorded[0]) if callable(row) else row
    p = tmp_path / "row.parquet"
    _with_cell(recorded[0], p, column, row, value)
    with pytest.raises(TraceError, match=re.escape(named)) as err:
        load_trace(p)
    assert str(err.value).startswith(f"trace {p}: row {row}: ")


def test_a_group_twice_in_one_interval_is_refused(recorded, tmp_path) -> None:
    """The later row used to replace the earlier one without a word."""
    groups = pq.read_table(recorded[0])["group"].to_pylist()
    p = tmp_path / "twice.parquet"
    _with_cell(recorded[0], p, "group", 1, groups[0])
    with pytest.raises(TraceError) as err:
        load_trace(p)
    assert str(err.value) == f"trace {p}: row 1: group {groups[0]!r} appears twice in interval 0"


def test_every_machine_preset_round_trips(tmp_path) -> None:
    """The checks refuse nothing a node writes: every simulated machine's capabilities."""
    from agent.sim.catalog import default_catalog

    for name, machine in default_catalog().machines.items():
        caps = machine.capabilities()
        path = tmp_path / f"{name}.parquet"
        TraceWriter(path, caps, {}, "x").close()
        assert load_trace(path).capabilities == caps


# --------------------------------------------------------------------------- the checksum


def _same_content(a: T.Trace, b: T.Trace) -> bool:
    def meta(t: T.Trace) -> tuple:
        return (t.version, t.rdtune_version, t.capabilities, dict(t.groups), t.controller,
                t.scenario, t.seed, t.source, t.interval_s, t.created, t.extra)  # fmt: skip

    # the steps by repr: a NaN percentile is equal to itself there
    return meta(a) == meta(b) and repr(a.steps) == repr(b.steps)


def test_traces_carry_a_checksum_and_those_without_one_still_load(recorded, tmp_path) -> None:
    meta = pq.read_metadata(recorded[0]).metadata
    values = {
        k.decode()[len(T.META_PREFIX) :]: json.loads(v)
        for k, v in meta.items()
        if k.startswith(T.META_PREFIX.encode())
    }
    assert values[T.CHECKSUM_KEY] == T.metadata_checksum(values)
    old = tmp_path / "old.parquet"  # as traces were written before the checksum
    rewrite_meta(recorded[0], old, sign=False, **{T.CHECKSUM_KEY: DROP})
    assert T.CHECKSUM_KEY.encode() not in b"".join(pq.read_metadata(old).metadata)
    assert _same_content(load_trace(old), load_trace(recorded[0]))


@pytest.mark.parametrize(
    "edit", [{"seed": 4}, {"interval_s": 0.2}, {"controller": "eq"}, {"extra": {}}], ids=str
)
def test_values_that_do_not_match_the_checksum_are_refused(recorded, tmp_path, edit) -> None:
    """Each edit is a valid value, so only the checksum can tell."""
    p = tmp_path / "edited.parquet"
    rewrite_meta(recorded[0], p, sign=False, **edit)
    with pytest.raises(
        TraceError, match="metadata checksum mismatch: the footer is corrupt"
    ) as err:
        load_trace(p)
    assert str(err.value).startswith(f"trace {p}: ")


def test_the_checksum_is_over_values_not_their_spelling(recorded, tmp_path) -> None:
    p = tmp_path / "respelled.parquet"
    rewrite_meta(recorded[0], p, sign=False, steps=b" 60 ")
    assert _same_content(load_trace(p), load_trace(recorded[0]))


def _metadata_bits(data: bytes, start: int, path: Path) -> list[int]:
    """Every byte of the trace's metadata keys and values in the footer."""
    positions: list[int] = []
    for key, value in pq.read_metadata(path).metadata.items():
        if not key.startswith(T.META_PREFIX.encode()):
            continue
        at = data.index(key, start)
        value_at = data.index(value, at + len(key))
        assert value_at - (at + len(key)) <= 6, "the value follows its key in the footer"
        positions += [*range(at, at + len(key)), *range(value_at, value_at + len(value))]
    return positions


def _schema_bits(data: bytes, start: int, path: Path) -> list[int]:
    """Every byte of the footer's column schema: names, types, repetition, nesting (it
    comes first, and ends with the last column's name)."""
    last = T.SCHEMA.names[-1].encode()
    return list(range(start, data.index(last, start) + len(last)))


@pytest.mark.parametrize(
    "bits", [_metadata_bits, _schema_bits], ids=["trace metadata", "column schema"]
)
def test_bit_flips_in_the_footer_never_load_as_other_content(tmp_path, bits) -> None:
    """Parquet has no checksum of its footer: every bit flip in the trace's metadata keys
    and values, and in the columns' names and types, is refused or loads the same content
    (unchecked, where it only unmade the checksum key's prefix). None loads as something
    else."""
    node = SimNode("default", seed=0)
    path = tmp_path / "small.parquet"
    caps, groups = node.capabilities(), node.groups()
    scenario, extra = {"name": "default"}, {"clock": "simulated"}
    with TraceWriter(path, caps, groups, "x", scenario=scenario, seed=7, extra=extra) as w:
        for _ in range(3):
            node.advance(0.1)
            w.write(node.observe(), node.allocation())
    original = load_trace(path)
    data = path.read_bytes()
    start = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    positions = bits(data, start, path)
    flipped = tmp_path / "flipped.parquet"
    unchecked, silent = [], []
    for i in positions:
        corrupt = bytearray(data)
        corrupt[i] ^= 1 << (i % 8)
        flipped.write_bytes(bytes(corrupt))
        try:
            trace = load_trace(flipped)
        except TraceError:
            continue
        (unchecked if _same_content(trace, original) else silent).append(i)
    assert not silent, f"flips at {silent} loaded as other content"
    if bits is _metadata_bits:
        assert len(unchecked) <= len(T.META_PREFIX), unchecked
