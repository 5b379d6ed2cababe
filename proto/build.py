"""Generate the gRPC/protobuf stubs from proto/rdtune/v1/*.proto (the build step).

The .proto files are the source of truth; the ``*_pb2*.py`` files next to them are build
products (git-ignored, never edited), made by ``python -m proto.build`` at set-up
(scripts/setup.sh) and by the wheel build (setup.py), never on import: an installed
package must not write into its own directory. ``python -m proto.build --check`` fails
when the stubs are missing or older than a .proto.

The .proto files import each other from the ``proto/`` root (``rdtune/v1/types.proto``, as
buf and other languages' generators see them); protoc's Python output would then import
``rdtune.v1``, so the generated modules are rewritten to import their siblings relatively
and work wherever the package is installed.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent / "rdtune" / "v1"
PROTO_ROOT = PROTO_DIR.parents[1]  # proto/: the include root of the .proto files
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
# protoc's import of a sibling module: ``from rdtune.v1 import types_pb2 as ...``
_SIBLING_IMPORT = re.compile(r"^from rdtune\.v1 import ", re.MULTILINE)


def sources() -> list[Path]:
    return sorted(PROTO_DIR.glob("*.proto"))


def outputs() -> list[Path]:
    """Every generated file the sources make."""
    return [s.with_name(s.stem + suffix) for s in sources() for suffix in SUFFIXES]


def stale() -> list[Path]:
    """Generated files that are missing or older than their .proto."""
    out = []
    for src in sources():
        for suffix in SUFFIXES:
            gen = src.with_name(src.stem + suffix)
            if not gen.exists() or gen.stat().st_mtime < src.stat().st_mtime:
                out.append(gen)
    return out


def build(force: bool = False, out_dir: Path | None = None) -> list[Path]:
    """Compile every .proto into ``out_dir`` (default: next to the sources, under
    ``proto/``); return the generated files."""
    srcs = sources()
    if not srcs or not (force or out_dir is not None or stale()):
        return []
    from grpc_tools import protoc  # build-time dependency (grpcio-tools)

    out_root = PROTO_ROOT if out_dir is None else Path(out_dir)
    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
    ]
    args += [str(s.relative_to(PROTO_ROOT)) for s in srcs]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {', '.join(s.name for s in srcs)}")
    made = []
    for src in srcs:
        rel = src.relative_to(PROTO_ROOT).parent
        for suffix in SUFFIXES:
            gen = out_root / rel / (src.stem + suffix)
            gen.write_text(_SIBLING_IMPORT.sub("from . import ", gen.read_text()))
            made.append(gen)
    return made


def missing_message() -> str:
    return (
        "the gRPC stubs (proto/rdtune/v1/*_pb2.py) are not generated: run "
        "`python -m proto.build` (scripts/setup.sh does), or install rdtune from a wheel"
    )


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m proto.build",
        description="Generate the gRPC/protobuf stubs next to proto/rdtune/v1/*.proto, when "
        "missing or older than their .proto.",
    )
    parser.add_argument(
        "--check", action="store_true", help="only say whether they are up to date (exit 1: not)"
    )
    parser.add_argument("--force", action="store_true", help="generate them even when up to date")
    args = parser.parse_args(argv)
    if args.check:
        old = stale()
        if old:
            names = ", ".join(p.name for p in old)
            print(f"proto: stale or missing: {names}; run python -m proto.build", file=sys.stderr)
            return 1
        print("proto: stubs up to date")
        return 0
    outs = build(force=args.force)
    print(f"proto: generated {len(outs)} file(s)" if outs else "proto: stubs up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
