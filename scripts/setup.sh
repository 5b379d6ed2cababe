#!/usr/bin/env bash
# Set up rdtune on a fresh machine: system packages for the resctrl emulator (FUSE) and
# its pqos interoperability test (intel-cmt-cat, qemu-user on non-Intel hosts), a virtual
# environment in .venv, torch pinned to 2.13.0 (the build pip finds: the CPU one where it
# is on disk or in .venv already, README.md), and rdtune itself.
# Idempotent: re-running only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! ldconfig -p 2>/dev/null | grep -q 'libfuse3\.so\.3\|libfuse\.so\.2'; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "setup: installing FUSE (for the resctrl emulator)"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fuse3 libfuse3-3 >/dev/null
    else
        echo "setup: libfuse not found and cannot install it; emulator tests will skip" >&2
    fi
fi

# Intel's pqos (intel-cmt-cat) checks the emulator in tests/agent/emulator/test_pqos.py; on
# a non-Intel host it runs under qemu-user with an Intel CPU model (qemu-x86_64).
need=()
command -v pqos >/dev/null || [ -x /usr/sbin/pqos ] || need+=(intel-cmt-cat)
if ! grep -q '^vendor_id.*GenuineIntel' /proc/cpuinfo 2>/dev/null; then
    command -v qemu-x86_64 >/dev/null || need+=(qemu-user)
fi
if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "setup: installing ${need[*]} (pqos interoperability test of the emulator)"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
    else
        echo "setup: ${need[*]} missing and cannot install; the pqos test will skip" >&2
    fi
fi

# Tools the tests check the product with (tests/tools.py): promtool (Prometheus' metric
# and rule checker, from the prometheus package); protoc, Go and Debian's grpc-go,
# protobuf-go and genproto, which build the Go client example against the .proto files.
need=()
command -v promtool >/dev/null || need+=(prometheus)
command -v protoc >/dev/null || need+=(protobuf-compiler)
command -v go >/dev/null || need+=(golang-go)
command -v protoc-gen-go >/dev/null || need+=(protoc-gen-go)
command -v protoc-gen-go-grpc >/dev/null || need+=(protoc-gen-go-grpc)
for pkg in golang-google-grpc-dev golang-google-genproto-dev golang-google-protobuf-dev; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "setup: installing ${need[*]} (tools the tests check the product with)"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            "${need[@]}" >/dev/null
    else
        echo "setup: ${need[*]} missing and cannot install; those checks will skip" >&2
    fi
fi

# Go's build cache, warmed with the libraries the Go client example builds against
# (tests/proto/test_api.py, with the same -trimpath): on a fresh machine compiling grpc-go
# takes ~60 s of CPU, which belongs to setting up, not to the test run. Warm: ~1 s.
if command -v go >/dev/null && [ -d /usr/share/gocode/src/google.golang.org/grpc ]; then
    GO111MODULE=off GOPATH=/usr/share/gocode GOFLAGS= go build -trimpath \
        google.golang.org/grpc google.golang.org/grpc/codes google.golang.org/grpc/metadata \
        google.golang.org/grpc/status google.golang.org/protobuf/proto \
        google.golang.org/protobuf/types/known/durationpb \
        google.golang.org/genproto/googleapis/rpc/errdetails ||
        echo "setup: could not build grpc-go into Go's cache; the Go client test will build it" >&2
fi

# buf (the protobuf linter) from the npm registry, into .tools/ (tests/tools.py looks there).
BUF_VERSION=1.75.0
if [ ! -x .tools/node_modules/.bin/buf ]; then
    if command -v npm >/dev/null; then
        echo "setup: installing buf $BUF_VERSION (npm) into .tools/"
        npm install --prefix .tools --no-audit --no-fund --loglevel=error \
            "@bufbuild/buf@$BUF_VERSION" >/dev/null
    else
        echo "setup: npm missing; cannot install buf, the buf lint check will skip" >&2
    fi
fi

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
stamp=.venv/.rdtune-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ constraints.txt -nt "$stamp" ]; then
    echo "setup: installing rdtune and its dependencies into .venv"
    # torch first (the CPU wheel where one is on disk); the constraint keeps every later
    # resolve on it.
    .venv/bin/pip install -q -c constraints.txt torch==2.13.0
    # the checkout's own layout (top-level agent, envs, ...), as the code and tests import it;
    # PIP_CONSTRAINT also pins the isolated build's grpcio-tools, which makes the stubs (a
    # newer one would generate code the locked protobuf runtime refuses)
    PIP_CONSTRAINT="$PWD/constraints.txt" RDTUNE_SOURCE_LAYOUT=1 \
        .venv/bin/pip install -q -c constraints.txt -e ".[dev]"
    touch "$stamp"
fi
# The agent's dependencies as wheels, for tests/test_packaging.py's install of the built
# wheel into a fresh venv: from here pip resolves them without reading the package index's
# pages (~10 s of CPU in its resolver). Best effort: without it the test uses the index.
wheelhouse=.venv/wheelhouse
if [ ! -d "$wheelhouse" ] || [ pyproject.toml -nt "$wheelhouse" ] || [ constraints.txt -nt "$wheelhouse" ]; then
    rm -rf "$wheelhouse"
    .venv/bin/python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" >.venv/agent-requirements.txt
    .venv/bin/pip download -q -c constraints.txt --only-binary :all: -d "$wheelhouse" \
        -r .venv/agent-requirements.txt proto-plus 2>/dev/null ||
        { rm -rf "$wheelhouse"; echo "setup: no wheelhouse for the packaging test (it will use the index)" >&2; }
fi
# The gRPC stubs are build products of proto/rdtune/v1/*.proto (never edited by hand).
.venv/bin/python -m proto.build
# Byte-compile the checkout as pip does an installed package: where PYTHONDONTWRITEBYTECODE
# is set, every process (the test suite starts ~150 agents, tuners and CLIs) would otherwise
# compile each module it imports from source again (~0.3 s of CPU per process). Up-to-date
# files are skipped, so this costs nothing after the first run.
.venv/bin/python -m compileall -q -j 0 agent envs eval models proto training tuner
