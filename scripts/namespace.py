"""Install the repository's packages under one ``rdtune`` namespace (the wheel build step).

The repository keeps its folders at the top (``agent/``, ``envs/``, ``models/``, ...) and
its code imports them by those names, which a source checkout puts on ``sys.path``. An
installed distribution must not claim such generic top-level names (``proto`` alone is also
the package of the ``proto-plus`` distribution), so the wheel maps each folder to
``rdtune.<folder>`` (setup.py's package-dir mapping) and this module rewrites the copies the
wheel carries: import statements (``from agent.types import X`` ->
``from rdtune.agent.types import X``) and string literals that name a module of the
project, optionally with an attribute (``"envs.partition:PartitionEnv"``, ``"tuner.cli"``
for ``python -m``). A string is rewritten only when the module exists, so
``"eval.kwargs"`` (a configuration key) stays as it is. The sources are never changed.
"""

from __future__ import annotations

import io
import re
import tokenize
from collections.abc import Callable, Iterable
from pathlib import Path

NAMESPACE = "rdtune"
TOP = ("agent", "envs", "proto", "models", "training", "tuner", "eval")

_NAME = r"[A-Za-z_]\w*"


class RewriteError(ValueError):
    """An import the rewriter does not know how to move into the namespace."""


def module_exists(root: Path) -> Callable[[str], bool]:
    """Whether a dotted name is a module or package under ``root`` (the source tree)."""

    def exists(dotted: str) -> bool:
        path = root.joinpath(*dotted.split("."))
        return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()

    return exists


def rewrite_source(text: str, exists: Callable[[str], bool], tops: Iterable[str] = TOP) -> str:
    """``text`` (a Python module) with the project's imports and module names namespaced."""
    tops = tuple(tops)
    top = "|".join(map(re.escape, tops))
    from_re = re.compile(rf"^(\s*from\s+)({top})(\.[\w.]+)?(\s+import\b)", re.MULTILINE)
    import_re = re.compile(
        rf"^(\s*)import\s+({top})((?:\.{_NAME})*)(\s+as\s+{_NAME})?([ \t]*(?:#.*)?)$",
        re.MULTILINE,
    )
    several_re = re.compile(rf"^\s*import\s+[^#\n]*,\s*({top})\b", re.MULTILINE)

    text = _rewrite_strings(text, exists, tops)
    text = from_re.sub(lambda m: f"{m[1]}{NAMESPACE}.{m[2]}{m[3] or ''}{m[4]}", text)

    def one_import(m: re.Match) -> str:
        indent, pkg, sub, alias, tail = m[1], m[2], m[3], m[4], m[5]
        if alias:
            return f"{indent}import {NAMESPACE}.{pkg}{sub}{alias}{tail}"
        if not sub:
            return f"{indent}from {NAMESPACE} import {pkg}{tail}"
        # binds the top name as before; its submodule is loaded by the first statement
        return f"{indent}import {NAMESPACE}.{pkg}{sub}; from {NAMESPACE} import {pkg}{tail}"

    text = import_re.sub(one_import, text)
    bad = several_re.search(text)
    if bad:
        raise RewriteError(f"cannot namespace a multi-module import: {bad[0].strip()!r}")
    return text


def _rewrite_strings(text: str, exists: Callable[[str], bool], tops: tuple[str, ...]) -> str:
    """Namespace string literals that are exactly a project module (``:attr`` allowed)."""
    # at least one dot: a bare "agent" or "eval" is a word (a subcommand), not a module
    name_re = re.compile(rf"^({'|'.join(map(re.escape, tops))})((?:\.{_NAME})+)(:[\w.]+)?$")
    lines = text.splitlines(keepends=True)
    edits: list[tuple[int, int, int, str]] = []  # (row, start col, end col, new)
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError) as exc:
        raise RewriteError(f"cannot tokenize: {exc}") from None
    for tok in tokens:
        if tok.type != tokenize.STRING or tok.start[0] != tok.end[0]:
            continue
        literal = tok.string
        prefix = re.match(r"^[rRbBuU]*", literal)[0]
        if "b" in prefix.lower() or "f" in prefix.lower():
            continue
        quote = literal[len(prefix)]
        body = literal[len(prefix) + 1 : -1]
        if quote * 3 == literal[len(prefix) : len(prefix) + 3]:
            continue  # docstrings and long texts
        m = name_re.match(body)
        if m is None or not exists(m[1] + m[2]):
            continue
        new = f"{prefix}{quote}{NAMESPACE}.{body}{quote}"
        edits.append((tok.start[0] - 1, tok.start[1], tok.end[1], new))
    for row, start, end, new in reversed(edits):
        line = lines[row]
        lines[row] = line[:start] + new + line[end:]
    return "".join(lines)


def rewrite_tree(package_root: Path, source_root: Path, tops: Iterable[str] = TOP) -> int:
    """Rewrite every ``.py``/``.pyi`` under ``package_root`` (the wheel's ``rdtune/``);
    the number of files changed."""
    exists = module_exists(source_root)
    changed = 0
    for path in sorted(package_root.rglob("*.py*")):
        if path.suffix not in (".py", ".pyi"):
            continue
        old = path.read_text()
        try:
            new = rewrite_source(old, exists, tops)
        except RewriteError as exc:
            raise RewriteError(f"{path}: {exc}") from None
        if new != old:
            path.write_text(new)
            changed += 1
    return changed
