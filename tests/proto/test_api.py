"""The gRPC API as a non-Python client and an installed package see it: buf lint clean with
every element documented, stubs that are build products matching the .proto files and
never generated on import, and a Go client built from the .proto files alone that talks to
a real agent and reads its errors from the standard google.rpc.Status."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from proto import build as proto_build
from tests.tools import ROOT, require_tool


def test_buf_lint_is_clean() -> None:
    """buf.yaml: STANDARD and COMMENTS rules, with the v1 wire names as stated exceptions."""
    done = subprocess.run(
        [require_tool("buf"), "lint"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    findings = (done.stdout + done.stderr).strip()
    assert done.returncode == 0 and not findings, findings


def test_the_stubs_match_the_proto_files(tmp_path: Path) -> None:
    """What set-up generated is what the .proto files give now (an edited .proto without
    `python -m proto.build` fails here)."""
    made = proto_build.build(out_dir=tmp_path)
    assert len(made) == len(proto_build.outputs())
    for fresh in made:
        tree = proto_build.PROTO_ROOT / fresh.relative_to(tmp_path)
        assert tree.exists(), f"{tree.name} missing: run python -m proto.build"
        assert tree.read_text() == fresh.read_text(), f"{tree.name} is stale"
    # siblings are imported relatively, so the stubs work wherever the package is installed
    assert "from . import types_pb2" in (tmp_path / "rdtune/v1/agent_pb2.py").read_text()


def _copy_proto_package(dest: Path, with_stubs: bool) -> Path:
    """The proto package (sources and, if asked, stubs) in ``dest``, whose .proto files are
    newer than its stubs (what a stale check regenerates)."""
    skip = () if with_stubs else ("*_pb2*",)
    shutil.copytree(
        proto_build.PROTO_ROOT,
        dest / "proto",
        ignore=shutil.ignore_patterns("__pycache__", *skip),
    )
    for src in (dest / "proto").rglob("*.proto"):
        os.utime(src, (src.stat().st_atime, src.stat().st_mtime + 60))
    return dest / "proto"


def _import_agent(pythonpath: Path) -> subprocess.CompletedProcess:
    code = "import agent.server.convert, agent.server.app, agent.client"
    env = {**os.environ, "PYTHONPATH": f"{pythonpath}{os.pathsep}{ROOT}"}
    # cwd: "-c" puts the working directory first on sys.path
    done = subprocess.run(
        [sys.executable, "-B", "-c", code + "; import proto; print(proto.__file__)"],
        env=env, cwd=pythonpath, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if done.returncode == 0:
        assert done.stdout.strip() == str(pythonpath / "proto" / "__init__.py"), done.stdout
    return done


def test_importing_the_agent_generates_nothing(tmp_path: Path) -> None:
    package = _copy_proto_package(tmp_path, with_stubs=True)
    before = {p: p.stat().st_mtime_ns for p in package.rglob("*")}
    done = _import_agent(tmp_path)
    assert done.returncode == 0, done.stderr
    after = {p: p.stat().st_mtime_ns for p in package.rglob("*")}
    assert after == before, "importing the agent wrote into its package"


def test_missing_stubs_are_a_clear_error(tmp_path: Path) -> None:
    package = _copy_proto_package(tmp_path, with_stubs=False)
    done = _import_agent(tmp_path)
    assert done.returncode != 0
    assert "python -m proto.build" in done.stderr.strip().splitlines()[-1]
    assert not list(package.rglob("*_pb2*")), "the import generated stubs"


# ------------------------------------------------------------------------- the Go client

GO_LIBS = Path("/usr/share/gocode")  # Debian's Go libraries (grpc-go, protobuf, genproto)
GO_EXAMPLE = ROOT / "examples" / "go" / "rdtune-client"


def _go_env(gopath: Path) -> dict[str, str]:
    # GOPATH mode over Debian's packaged libraries: no module download at build time.
    env = {**os.environ, "GOPATH": f"{gopath}{os.pathsep}{GO_LIBS}", "GO111MODULE": "off"}
    env.pop("GOFLAGS", None)
    return env


@pytest.fixture(scope="module")
def go_client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/go/rdtune-client built from freshly generated Go stubs."""
    go, protoc = require_tool("go"), require_tool("protoc")
    plugins = [require_tool(p) for p in ("protoc-gen-go", "protoc-gen-go-grpc")]
    if not (GO_LIBS / "src" / "google.golang.org" / "grpc").is_dir():
        require_tool("golang-google-grpc-dev (Debian's grpc-go)")  # skips or fails
    gopath = tmp_path_factory.mktemp("gopath")
    src = gopath / "src"
    src.mkdir()
    subprocess.run(
        [protoc, f"-I{proto_build.PROTO_ROOT}", f"--go_out={src}", f"--go-grpc_out={src}",
         f"--plugin=protoc-gen-go={plugins[0]}", f"--plugin=protoc-gen-go-grpc={plugins[1]}",
         *map(str, proto_build.sources())],
        check=True, timeout=120,
    )  # fmt: skip
    example = src / "rdtune" / "examples" / "rdtune-client"
    shutil.copytree(GO_EXAMPLE, example)
    binary = gopath / "rdtune-client"
    # -trimpath: the build cache keys no package by this run's temporary GOPATH, so the
    # stubs compiled by an earlier run are reused; -s -w: no symbol table or DWARF to link
    # for a binary that is only run (together ~1 s of the build's 2-2.7 s of CPU, warm cache).
    # scripts/setup.sh fills the cache with grpc-go built the same way (cold: ~60 s of CPU).
    done = subprocess.run(
        [go, "build", "-trimpath", "-ldflags=-s -w", "-o", str(binary), "."],
        cwd=example, env=_go_env(gopath), capture_output=True, text=True, timeout=540,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return binary


@pytest.mark.slow
def test_the_go_client_talks_to_a_real_agent(go_client: Path, tmp_path: Path) -> None:
    from agent.sim import SimNode
    from tests.agent.server.conftest import serve

    token = tmp_path / "token"
    token.write_text("go-client-token\n")
    node = SimNode()
    with serve(node, token="go-client-token") as server:
        done = subprocess.run(
            [str(go_client), "-addr", server.address, "-token-file", str(token)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        lines = dict(line.split(": ", 1) for line in done.stdout.splitlines())
        caps = node.capabilities()
        assert f"cbm_mask={caps.l3.cbm_mask:#x}" in lines["capabilities"]
        half = (1 << (caps.l3.num_ways // 2)) - 1
        assert lines["apply"] == f"go-example l3_mask={half:#x}"
        assert "has_go-example=true" in lines["observe"]
        assert lines["step"] == f"go-example l3_mask={half:#x} interval=0.100"
        assert lines["session"] == "id=7 has_go-example=true"
        # the refused plan: the standard status with rdtune's facts, and nothing applied
        assert lines["error"] == (
            "code=InvalidArgument reason=INVALID_ALLOCATION domain=rdtune.v1 "
            "class=InvalidAllocation rule=contiguous"
        )
        assert lines["delete"] == "go-example"
        assert "go-example" not in node.groups()
        # without the token the agent refuses the client
        refused = subprocess.run(
            [str(go_client), "-addr", server.address], capture_output=True, text=True, timeout=60
        )
        assert refused.returncode != 0 and "Unauthenticated" in refused.stderr
