"""Trace format: round trip, streaming row groups, and clear errors for bad files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agent.sim import SimNode
from models.explore import Explore
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
    w.close()
    assert pq.ParquetFile(path).num_row_groups == 3
    assert len(load_trace(path)) == 12


def test_interval_without_groups_round_trips(tmp_path) -> None:
    node = SimNode("default", seed=0, auto_groups=False)
    node.advance(0.1)
    path = tmp_path / "empty.parquet"
    with TraceWriter(path, node.capabilities(), {}, "x") as w:
        w.write(node.observe(), node.allocation())
    trace = load_trace(path)
    assert len(trace) == 1 and dict(trace.steps[0].snapshot.groups) == {}


# --------------------------------------------------------------------------- bad files


def _rewrite_meta(src: Path, dst: Path, **changes) -> None:
    table = pq.read_table(src)
    meta = dict(pq.read_metadata(src).metadata)
    meta.pop(b"ARROW:schema", None)
    for k, v in changes.items():
        key = (T.META_PREFIX + k).encode()
        if v is None:
            meta.pop(key, None)
        else:
            meta[key] = json.dumps(v).encode()
    pq.write_table(table.replace_schema_metadata(meta), dst)


def test_missing_file(tmp_path) -> None:
    with pytest.raises(TraceError, match="no such file") as err:
        load_trace(tmp_path / "nope.parquet")
    assert "nope.parquet" in str(err.value)


def test_not_parquet(tmp_path) -> None:
    p = tmp_path / "x.parquet"
    p.write_text("step,group\n1,a\n")
    with pytest.raises(TraceError, match="not a Parquet file") as err:
        load_trace(p)
    assert str(p) in str(err.value)


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
    _rewrite_meta(recorded[0], p, version=99)
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
    _rewrite_meta(recorded[0], p, **{key: None})
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
    _rewrite_meta(recorded[0], p, groups=groups[1:])
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
