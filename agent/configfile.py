"""What every rdtune configuration file shares: strict models, one loader and one error.

The agent's, the tuner's, the training and the suite files are described by pydantic models
(:class:`Strict`) that refuse unknown keys (a typo in a safety limit must not pass) and
values of the wrong type: strict, so a string ``"false"`` is not a boolean (``bool("false")``
is true) and ``"5"`` is not a number. A refused setting raises :class:`ConfigError` naming
the file, the key and the reason, in one line (docs/DEPLOY.md, "Configuration").

Services an operator configures through the environment (the agent, the tuner) take
overrides from variables ``PREFIX__KEY[__SUBKEY...]`` whose values are read as YAML scalars
(``RDTUNE_TUNER__GUARD__MAX_WAY_STEP=2``, ``RDTUNE_AGENT__RESTORE_ON_EXIT=true``); a
variable naming no setting is refused like an unknown key.
"""

from __future__ import annotations

import math
import os
import stat
import tomllib
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError


class ConfigError(ValueError):
    """A configuration rdtune refuses to run with; the message says what is wrong."""


class Strict(BaseModel):
    """A section of a configuration file: unknown keys and loose types are refused."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


# A float that must be finite (YAML's .inf and .nan are floats).
Finite = Annotated[float, AfterValidator(_finite)]

M = TypeVar("M", bound=BaseModel)


# Configuration files are a few KiB; a cap keeps a wrong path (a log, a disk image) from
# being read whole into memory.
MAX_CONFIG_BYTES = 4 * 1024 * 1024
NOT_REGULAR = "not a regular file"


def file_kind(mode: int) -> str:
    """What a non-regular file is, for messages (``a character device``, ``a named pipe``)."""
    for test, name in (
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a named pipe"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return name
    return NOT_REGULAR


def read_config_text(path: str | Path, limit: int = MAX_CONFIG_BYTES) -> str:
    """The text of the regular file at ``path``, or a ConfigError naming it: a device or a
    pipe would be read without end or block forever, so only regular files are read, and
    only up to ``limit`` bytes."""
    data = read_regular(path, limit, "a configuration file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None


def read_regular(path: str | Path, limit: int, what: str) -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit``; a ConfigError naming
    it otherwise (``what`` the file is for, in the message of one too large). A device or
    a pipe would be read without end or block forever, so neither is read."""
    try:
        # O_NONBLOCK: opening a FIFO for reading otherwise waits for a writer
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = file_kind(st.st_mode)
            if kind != NOT_REGULAR:
                kind += f", {NOT_REGULAR}"
            raise ConfigError(f"{path}: {kind}")
        data = b""
        while len(data) <= limit:
            chunk = os.read(fd, limit + 1 - len(data))
            if not chunk:
                break
            data += chunk
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        size = max(st.st_size, len(data))
        raise ConfigError(f"{path}: too large for {what} ({size} bytes; at most {limit})")
    return data


def parse_problem(exc: Exception) -> str:
    """What is wrong in a YAML or JSON text, in one line: the parser's problem, not its
    position in a string the user never saw as a document (YAML's ``problem``), else the
    whole message on one line."""
    return getattr(exc, "problem", None) or " ".join(str(exc).split())


class DuplicateKey(yaml.YAMLError):
    """A mapping that gives one key twice (YAML would keep the last value silently)."""

    def __init__(self, key: Any, line: int) -> None:
        super().__init__(f"duplicate key {key!r} (line {line})")
        self.key, self.line = key, line


class UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a mapping that gives a key twice: ``seed: 1`` then
    ``seed: 2`` is a mistake in a configuration, not a request for the last value. Keys
    brought in by a merge (``<<: *base``) may still be overridden."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:
                continue  # an unhashable key: the safe loader refuses it below
            if duplicate:
                raise DuplicateKey(key, key_node.start_mark.line + 1)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_config_file(path: str | Path) -> Any:
    """The document at ``path``: TOML when the name ends in ``.toml``, else YAML (None for
    an empty file). A YAML mapping that gives a key twice is refused
    (:class:`UniqueKeyLoader`), as TOML refuses it itself."""
    text = read_config_text(path)
    if Path(path).suffix.lower() == ".toml":
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    try:
        data = yaml.load(text, Loader=UniqueKeyLoader)  # a SafeLoader
    except DuplicateKey as exc:
        raise ConfigError(f"{path}: {exc}; YAML would keep only the last value") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
    if isinstance(data, str) and "=" in data:  # ``key = "value"`` lines read as one string
        raise ConfigError(
            f"{path}: not a YAML mapping (key: value); a TOML file is read as TOML when its "
            "name ends in .toml"
        )
    return data


def validate(model: type[M], data: Any, where: str, env: Mapping[tuple, str] | None = None) -> M:
    """``data`` as ``model``, or a ConfigError ``where: key: reason`` (the key's
    environment variable instead of ``where`` when ``env`` set it)."""
    try:
        return model.model_validate({} if data is None else data)
    except ValidationError as exc:
        raise ConfigError(describe(exc, model, where, env or {})) from None


def describe(exc: ValidationError, model: type[BaseModel], where: str, env: Mapping) -> str:
    """One line for the first problem pydantic found (the others follow once it is fixed)."""
    err = exc.errors(include_url=False)[0]
    loc = tuple(err["loc"])
    key = dotted(loc)
    origin = next((var for path, var in env.items() if loc[: len(path)] == path), None)
    place = f"${origin}" if origin else where
    kind, value = err["type"], err.get("input")
    if kind == "extra_forbidden":
        allowed = _fields_at(model, loc[:-1])
        hint = f"; allowed: {', '.join(allowed)}" if allowed else ""
        return f"{place}: {key}: unknown key{hint}"
    if kind == "missing":
        return f"{place}: {key}: required"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return f"{place}: {key or 'top level'}: expected a mapping, got {type(value).__name__}"
    reason = err["msg"].replace("Input should be", "must be")
    reason = reason.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    reason = reason[:1].lower() + reason[1:]
    if not isinstance(value, dict | list):
        reason += f", got {value!r}"
        if kind.endswith("_type"):
            reason += f" ({type(value).__name__})"
            if kind == "bool_type" and isinstance(value, str):
                reason += "; write true or false without quotes"
            elif isinstance(value, str) and _numeric(value):
                hint = _as_yaml_number(value) if "e" in value.lower() else None
                reason += f"; {hint or 'write it without quotes'}"
    return f"{place}: {key}: {reason}" if key else f"{place}: {reason}"


def _as_yaml_number(text: str) -> str:
    """How to write ``text`` (a number with an exponent YAML read as text) as a number.
    YAML 1.1 (PyYAML) reads a float only with a dot in its mantissa and a sign in its
    exponent: 5e-1 and 1e3 are strings there, although JSON and Python read them as
    numbers."""
    mantissa, _, exponent = text.strip().lower().partition("e")
    if "." not in mantissa:
        mantissa += ".0"
    if not exponent.startswith(("+", "-")):
        exponent = "+" + exponent
    return (
        f"YAML reads {text.strip()} as text (it needs a dot and a signed exponent): write "
        f"{mantissa}e{exponent} or {float(text):g}, without quotes"
    )


def _numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def dotted(loc: tuple) -> str:
    """``("groups", 0, "kind")`` -> ``groups[0].kind``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif str(part).startswith(("function-", "tagged-union", "union[", "<")):
            continue  # pydantic's names for validator and union steps; our union tags
        else:
            out += f".{part}" if out else str(part)
    return out


def _fields_at(model: type[BaseModel], loc: tuple) -> list[str]:
    """The keys allowed at ``loc`` inside ``model`` (empty when it cannot be told)."""
    current: Any = model
    for part in loc:
        if isinstance(part, int) or str(part).startswith("<"):
            continue
        fields = getattr(current, "model_fields", None)
        if fields is None:
            # a dict of models: the part is a user's key, the value type follows
            current = _model_in(current)
            fields = getattr(current, "model_fields", None)
            if fields is None or part in fields:
                return []
            continue
        if part not in fields:
            return []
        current = _model_in(fields[part].annotation)
    return sorted(getattr(current, "model_fields", {}))


def _model_in(annotation: Any) -> Any:
    """The BaseModel inside ``X | None``, ``list[X]`` or ``dict[str, X]`` (else as is)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if isinstance(found, type) and issubclass(found, BaseModel):
            return found
    return annotation


def env_overrides(
    data: Any, model: type[BaseModel], prefix: str, environ: Mapping[str, str] | None = None
) -> tuple[Any, dict[tuple, str]]:
    """``data`` with the settings of ``PREFIX__KEY[__SUB]`` variables put in, and where each
    came from (for error messages). A variable naming no field of ``model`` is refused."""
    environ = os.environ if environ is None else environ
    start = prefix + "__"
    found = sorted((k, v) for k, v in environ.items() if k.startswith(start))
    if not found:
        return data, {}
    if data is None:
        data = {}
    if not isinstance(data, dict):
        return data, {}  # validation reports the top level
    data = _deep_copy(data)
    origins: dict[tuple, str] = {}
    for var, text in found:
        path = tuple(p.lower() for p in var[len(start) :].split("__"))
        if not all(path) or not _is_field_path(model, path):
            raise ConfigError(f"${var}: names no setting (after {start}: KEY or KEY__SUBKEY)")
        try:
            value = yaml.safe_load(text) if text.strip() else _empty_value(model, path)
        except yaml.YAMLError:
            value = text
        node = data
        for part in path[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[path[-1]] = value
        origins[path] = var
    return data, origins


def _deep_copy(data: dict) -> dict:
    return {k: _deep_copy(v) if isinstance(v, dict) else v for k, v in data.items()}


def _is_field_path(model: Any, path: tuple[str, ...]) -> bool:
    return _field_at(model, path) is not None


def _field_at(model: Any, path: tuple[str, ...]) -> Any:
    """The pydantic field ``path`` names in ``model`` (None: no such field)."""
    current, field = model, None
    for part in path:
        fields = getattr(current, "model_fields", None)
        if fields is None or part not in fields:
            return None
        field = fields[part]
        current = _model_in(field.annotation)
    return field


def _empty_value(model: Any, path: tuple[str, ...]) -> str | None:
    """What a variable set to nothing means: the empty string for a text setting
    (``metrics_listen`` and ``health_listen``, where "" turns a listener off), else null."""
    return "" if _field_at(model, path).annotation is str else None


def load(
    model: type[M],
    path: str | Path | None,
    *,
    env_prefix: str | None = None,
    environ: Mapping[str, str] | None = None,
    refused: Mapping[str, str] | None = None,
) -> M:
    """Read ``path`` (None: no file, only defaults and the environment) as ``model``.
    ``refused`` maps dotted keys that must not be in the file (secrets) to the reason."""
    where = str(path) if path is not None else "configuration"
    data = read_config_file(path) if path is not None else None
    for key, reason in (refused or {}).items():
        node = data
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            raise ConfigError(f"{where}: {key}: {reason}")
    origins: dict[tuple, str] = {}
    if env_prefix:
        data, origins = env_overrides(data, model, env_prefix, environ)
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping at the top level")
    return validate(model, data, where, origins)
