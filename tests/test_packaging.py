"""The installable artifact: a wheel built from a clean checkout installs under the one
``rdtune`` namespace next to ``proto-plus`` (whose package is ``proto``), carries the
generated stubs, needs no torch for the agent, and ``rdtune agent --backend sim`` starts
from it without writing into site-packages (scripts/namespace.py, setup.py)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.tools import ROOT

AGENT_INSTALL_LIMIT_MB = 300
WHEELHOUSE = ROOT / ".venv" / "wheelhouse"  # scripts/setup.sh


def _namespace():
    spec = importlib.util.spec_from_file_location("rdtune_namespace", ROOT / "scripts/namespace.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


NS = _namespace()
EXISTS = NS.module_exists(ROOT)


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ("from agent.types import SLO\n", "from rdtune.agent.types import SLO\n"),
        ("if x:\n    from eval.suites import (\n        get_suite,\n    )\n",
         "if x:\n    from rdtune.eval.suites import (\n        get_suite,\n    )\n"),
        ("from models import registry\n", "from rdtune.models import registry\n"),
        ("import envs  # noqa: F401\n", "from rdtune import envs  # noqa: F401\n"),
        ("import eval as eval_pkg\n", "import rdtune.eval as eval_pkg\n"),
        ("import training.trace_env\n",
         "import rdtune.training.trace_env; from rdtune import training\n"),
        ('register(id=i, entry_point="envs.partition:PartitionEnv")\n',
         'register(id=i, entry_point="rdtune.envs.partition:PartitionEnv")\n'),
        ('[sys.executable, "-m", "tuner.cli", "agent"]\n',
         '[sys.executable, "-m", "rdtune.tuner.cli", "agent"]\n'),
        # not modules: a configuration key, a file name, a subcommand word, a docstring
        ('raise ValueError("eval.kwargs: bad")\n', 'raise ValueError("eval.kwargs: bad")\n'),
        ('("eval.kwargs", 1)\n', '("eval.kwargs", 1)\n'),
        ('path / "eval.json"\n', 'path / "eval.json"\n'),
        ('{"agent": ("agent.server.cli", "serve")}\n',
         '{"agent": ("rdtune.agent.server.cli", "serve")}\n'),
        ("from .types import X\n", "from .types import X\n"),
        ("from agents import x\n", "from agents import x\n"),
    ],
)  # fmt: skip
def test_the_namespace_rewrite(before: str, after: str) -> None:
    assert NS.rewrite_source(before, EXISTS) == after


def test_an_import_it_cannot_move_is_an_error() -> None:
    with pytest.raises(NS.RewriteError, match="multi-module"):
        NS.rewrite_source("import os, agent\n", EXISTS)


# ------------------------------------------------------------------ the wheel, installed


def _clean_checkout(dest: Path) -> Path:
    """The repository's tracked and new (not ignored) files: no generated stubs, no venv."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=ROOT, capture_output=True, check=True, timeout=60,
    ).stdout.decode().split("\0")  # fmt: skip
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file() and not src.is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    assert not list(dest.glob("proto/rdtune/v1/*_pb2*")), "the checkout is not clean"
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: no clean file list to build from")
    checkout = _clean_checkout(tmp_path_factory.mktemp("checkout"))
    out = tmp_path_factory.mktemp("wheel")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RDTUNE_SOURCE_LAYOUT")}
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(out), str(checkout)],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (found,) = out.glob("rdtune-*.whl")
    return found


def test_the_wheel_claims_only_rdtune_and_carries_the_stubs(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"rdtune"}
    for stub in ("types_pb2.py", "agent_pb2.py", "agent_pb2_grpc.py", "types_pb2.pyi"):
        assert f"rdtune/proto/rdtune/v1/{stub}" in names
    for data in (
        "agent/sim/data/latency_tables.npz",
        "eval/data/suites.yaml",
        "models/policies/default/policy.onnx",
        "training/configs/default.yaml",
    ):
        assert f"rdtune/{data}" in names  # fmt: skip
    meta = zipfile.ZipFile(wheel)
    (entry,) = [n for n in names if n.endswith("entry_points.txt")]
    assert "rdtune = rdtune.tuner.cli:main" in meta.read(entry).decode()


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_mtime_ns, p.stat().st_size) for p in root.rglob("*")}


@pytest.mark.slow
def test_the_agent_installs_and_starts_from_the_wheel(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    # no pip of its own (bootstrapping one costs ~6 s of CPU): this process's pip installs
    # into it, as `pip --python` does for any environment; and no byte-compiling of the ~20
    # packages it installs (~8 s of CPU): the agent below imports what it needs either way,
    # and the size bound below is then on the installed packages without their caches
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}

    def install(*source: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-compile",
             *source, "-c", str(ROOT / "constraints.txt"), str(wheel), "proto-plus"],
            env=env, capture_output=True, text=True, timeout=900,
        )  # fmt: skip

    # the dependencies from scripts/setup.sh's wheelhouse when it has them all (pip's resolver
    # reading the package index's pages costs ~10 s of CPU), else from the index
    done = None
    if WHEELHOUSE.is_dir():
        done = install("--no-index", "--find-links", str(WHEELHOUSE))
    if done is None or done.returncode != 0:
        done = install()
    assert done.returncode == 0, done.stderr[-3000:]
    (site,) = venv.glob("lib/python3*/site-packages")
    assert not (site / "torch").exists(), "the agent's install pulled torch"
    size_mb = sum(p.stat().st_size for p in venv.rglob("*") if p.is_file()) / 2**20
    assert size_mb < AGENT_INSTALL_LIMIT_MB, f"the agent's install is {size_mb:.0f} MB"

    # proto-plus's `proto` and rdtune's stubs side by side in one process
    both = subprocess.run(
        [str(py), "-c", "import proto, rdtune.agent.server.convert as c; "
         "assert hasattr(proto, 'Message'), proto.__file__; print(c.pb.DESCRIPTOR.name)"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert both.returncode == 0 and both.stdout.strip() == "rdtune/v1/types.proto", both.stderr

    before = _tree(site)
    agent = subprocess.Popen(
        [str(venv / "bin" / "rdtune"), "agent", "--backend", "sim", "--listen", "127.0.0.1:0",
         "--metrics-listen", ""],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = agent.stdout.readline()
        assert line.startswith("rdtune agent: serving sim on "), line + agent.stderr.read()
        address = line.rsplit(" ", 1)[-1].strip()
        from agent.client import RemoteNode

        with RemoteNode(address, timeout=10.0) as node:
            caps = node.capabilities()
            assert caps.simulated and caps.l3 is not None and node.groups()
    finally:
        agent.terminate()
        _, err = agent.communicate(timeout=60)
    assert agent.returncode == 0, err
    assert _tree(site) == before, "the agent wrote into site-packages"
    print(f"agent install: {size_mb:.0f} MB")
