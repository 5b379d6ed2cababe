"""The repository documents itself: every path cited in docs, docstrings and comments exists,
and nothing cites an issue number or a file outside the repository."""

from __future__ import annotations

import ast
import importlib
import io
import re
import subprocess
import textwrap
import tokenize
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("docs", "agent", "models", "envs", "eval", "training", "tuner", "proto", "tests")
PATH = re.compile(
    r"(?<![\w./-])((?:" + "|".join((*PACKAGES, "deploy", "scripts")) + r")/[\w./-]*\w)"
)
DOC_NAME = re.compile(r"(?<![\w./-])([A-Z][A-Z_]+\.md)\b")  # e.g. RL.md, cited bare
OUTSIDE = re.compile(r"\bissues?[ #-]*\d+|/work/shared|shared/design|shared/papers|\.\./papers")
GENERATED = ("_pb2.py", "_pb2_grpc.py")
# One worker runs this module: its prose (~3 s to read) is built once, not per worker.
pytestmark = pytest.mark.xdist_group("docs")


def _tracked() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    keep = (".py", ".md", ".yaml", ".yml", ".proto", ".sh", ".toml")
    return [ROOT / f for f in out if f.endswith(keep) or f == "Makefile"]


def _prose(path: Path) -> str:
    """What a reader reads as text: a Python file's docstrings and comments (not its string
    literals, which name other things: metric tags, URLs), any other file whole."""
    text = path.read_text(errors="replace")
    if path.suffix != ".py":
        return text
    parts = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                parts.append(doc)
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            parts.append(tok.string)
    return "\n".join(parts)


@pytest.fixture(scope="module")
def prose() -> dict[Path, str]:
    """Every tracked file's prose, read by the worker that runs these tests (not at import,
    which every test process would pay for while collecting)."""
    return {path.relative_to(ROOT): _prose(path) for path in _tracked()}


def test_the_docs_the_guide_names_are_here() -> None:
    for name in ("ARCHITECTURE.md", "CONTROLLERS.md", "RESCTRL.md", "RL.md", "SIMULATOR.md"):
        assert (ROOT / "docs" / name).is_file(), name


@pytest.mark.parametrize("kind", ["paths", "outside"])
def test_citations(prose: dict[Path, str], kind: str) -> None:
    bad = []
    for where, text in prose.items():
        if kind == "outside":
            bad += [f"{where}: {m.group(0)!r}" for m in OUTSIDE.finditer(text)]
            continue
        for m in PATH.finditer(text):
            cited = m.group(1).rstrip(".")
            if not cited.endswith(GENERATED) and not (ROOT / cited).exists():
                bad.append(f"{where}: {cited}")
        for m in DOC_NAME.finditer(text):
            name = m.group(1)
            if not ((ROOT / name).exists() or (ROOT / "docs" / name).exists()):
                bad.append(f"{where}: {name}")
    assert not bad, "\n".join(sorted(set(bad)))


# docs/DEPLOY.md sends readers to the config modules' docstrings for every setting.
@pytest.mark.parametrize(
    ("module", "model"),
    [("agent.server.config", "AgentFile"), ("tuner.config", "TunerFile")],
    ids=["agent", "tuner"],
)
def test_a_config_modules_docstring_example_names_every_key(module: str, model: str) -> None:
    loaded = importlib.import_module(module)
    example = loaded.__doc__.split("::", 1)[1].split("\n\n")[1]
    keys = set(yaml.safe_load(textwrap.dedent(example)))
    schema = getattr(loaded, model).model_fields
    fields = {f.alias or name for name, f in schema.items()}
    assert keys == fields, f"missing: {sorted(fields - keys)}, unknown: {sorted(keys - fields)}"
