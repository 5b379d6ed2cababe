"""Generate the gRPC/protobuf stubs from proto/rdtune/v1/*.proto (the build step).

The .proto files are the source of truth; the ``*_pb2*.py`` files next to them are build
products (git-ignored, never edited). Run ``python -m proto.build``; set-up does, and
:func:`ensure_built` regenerates stale stubs on import so a plain ``pip install -e .``
works too.
"""

from __future__ import annotations

import sys
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent / "rdtune" / "v1"
ROOT = PROTO_DIR.parents[2]  # the directory holding the top-level ``proto`` package


def _sources() -> list[Path]:
    return sorted(PROTO_DIR.glob("*.proto"))


def _stale() -> bool:
    for src in _sources():
        out = src.with_name(src.stem + "_pb2.py")
        if not out.exists() or out.stat().st_mtime < src.stat().st_mtime:
            return True
    return False


def build(force: bool = False) -> list[Path]:
    """Compile every .proto (imports resolve from the repository root); return outputs."""
    sources = _sources()
    if not sources or not (force or _stale()):
        return []
    from grpc_tools import protoc  # build-time dependency (grpcio-tools)

    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{ROOT}",
        f"-I{include}",
        f"--python_out={ROOT}",
        f"--pyi_out={ROOT}",
        f"--grpc_python_out={ROOT}",
    ]
    args += [str(s.relative_to(ROOT)) for s in sources]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {', '.join(s.name for s in sources)}")
    return [s.with_name(s.stem + "_pb2.py") for s in sources]


def ensure_built() -> None:
    """Regenerate the stubs when a .proto is newer than its generated module."""
    if _stale():
        build(force=True)


if __name__ == "__main__":
    outs = build(force="--force" in sys.argv)
    print(f"proto: generated {len(outs)} module(s)" if outs else "proto: stubs up to date")
