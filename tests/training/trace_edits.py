"""Trace files edited by hand, as the tests of bad traces need them: metadata values
replaced or dropped in the footer, with or without the checksum recomputed."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq

from training import traces as T

DROP = object()  # a rewrite_meta change that removes the key


def rewrite_meta(src: str | Path, dst: str | Path, *, sign: bool = True, **changes) -> None:
    """``src`` with metadata values replaced (JSON, or bytes as they are) or dropped, and
    the checksum recomputed as a deliberate edit would (``sign``): the reader's checks of
    the values, not the checksum, are then what refuses the file."""
    table = pq.read_table(src)
    meta = dict(pq.read_metadata(src).metadata)
    meta.pop(b"ARROW:schema", None)
    for k, v in changes.items():
        key = (T.META_PREFIX + k).encode()
        if v is DROP:
            meta.pop(key, None)
        else:
            meta[key] = v if isinstance(v, bytes) else json.dumps(v).encode()
    if sign:
        meta = _signed(meta)
    pq.write_table(table.replace_schema_metadata(meta), dst)


def meta_value(path: str | Path, key: str):
    """The parsed metadata value under ``key`` (None when absent)."""
    return json.loads(pq.read_metadata(path).metadata.get((T.META_PREFIX + key).encode(), b"null"))


def _signed(meta: dict[bytes, bytes]) -> dict[bytes, bytes]:
    prefix = T.META_PREFIX.encode()
    try:
        values = {
            k[len(prefix) :].decode(): json.loads(v)
            for k, v in meta.items()
            if k.startswith(prefix)
        }
    except ValueError:  # not JSON: the reader refuses it before it looks at the checksum
        return meta
    digest = json.dumps(T.metadata_checksum(values)).encode()
    return {**meta, prefix + T.CHECKSUM_KEY.encode(): digest}
