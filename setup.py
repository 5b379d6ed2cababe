"""Build hook: the package layout of the two ways rdtune is installed, and the gRPC stubs.

- A wheel (``pip install .``, ``python -m build``) installs the repository's folders under
  one ``rdtune`` namespace (``rdtune.agent``, ``rdtune.models``, ...; the folders stay where
  they are: a package-dir mapping) and rewrites the copies it carries to import each other
  by those names (scripts/namespace.py); the console script is ``rdtune.tuner.cli:main``.
  No top-level name but ``rdtune`` is claimed.
- The development install of a checkout (scripts/setup.sh: ``RDTUNE_SOURCE_LAYOUT=1 pip
  install -e .``) keeps the folders' own names, as the code and tests import them.

Either way the stubs are generated from proto/rdtune/v1/*.proto at build time into the
build (never on import): the wheel carries them.
"""

import importlib.util
import os
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SOURCE_LAYOUT = os.environ.get("RDTUNE_SOURCE_LAYOUT") == "1"


def _load(name: str, path: Path):
    """A module of this checkout by path (a build does not put the checkout on sys.path)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


namespace = _load("rdtune_namespace", ROOT / "scripts" / "namespace.py")
TOP = namespace.TOP
found = find_packages(str(ROOT), include=[f"{t}" for t in TOP] + [f"{t}.*" for t in TOP])
DATA_SUFFIXES = {".yaml", ".yml", ".toml", ".json", ".onnx", ".npz", ".proto", ".pyi"}


def _data(package: str) -> list[str]:
    """The data files of ``package``: in its folder and in folders below it that are not
    packages themselves (agent/sim/data/, models/policies/default/, eval/scenarios/)."""
    base = ROOT.joinpath(*package.split("."))
    out, todo = [], [base]
    while todo:
        folder = todo.pop()
        for path in sorted(folder.iterdir()):
            if path.is_dir() and path.name != "__pycache__":
                if not (path / "__init__.py").exists():
                    todo.append(path)
            elif path.suffix in DATA_SUFFIXES and "_pb2" not in path.name:
                out.append(path.relative_to(base).as_posix())
    return out


def _name(package: str) -> str:
    return package if SOURCE_LAYOUT else f"{namespace.NAMESPACE}.{package}"


class BuildWithProto(build_py):
    def run(self):
        super().run()
        proto_build = _load("rdtune_proto_build", ROOT / "proto" / "build.py")
        if self.editable_mode:  # the checkout is what gets imported: its stubs, made now
            proto_build.build()
            return
        # the stubs go next to the built package's .proto files: <build>/[rdtune/]proto/
        out = Path(self.build_lib).joinpath(*_name("proto").split("."))
        out.mkdir(parents=True, exist_ok=True)
        proto_build.build(out_dir=out)
        if not SOURCE_LAYOUT:
            package_root = Path(self.build_lib) / namespace.NAMESPACE
            namespace.rewrite_tree(package_root, ROOT)


setup(
    packages=[_name(p) for p in found],
    package_dir={} if SOURCE_LAYOUT else {_name(t): t for t in TOP},
    package_data={_name(p): _data(p) for p in found},
    entry_points={
        "console_scripts": [f"rdtune = {_name('tuner')}.cli:main"],
    },
    cmdclass={"build_py": BuildWithProto},
)
