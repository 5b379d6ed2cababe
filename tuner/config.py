"""The tuner's configuration: a YAML file (``rdtune tune --config FILE``), flags win.

Example ``tuner.yaml`` (every key optional; see docs/DEPLOY.md)::

    controller: copart            # the controller (a catalogue spec; --controller wins)
    interval_s: 1.0               # control interval (node clock: simulated nodes are stepped)
    resync_intervals: 10          # read the node's allocation back every N intervals (1: always)
    controller_options: {}        # keyword options of the controller (models/catalogue.py)
    fallback: static              # SLO guard's fallback (default: static, else ubik strict,
    fallback_options:             #   else eq: the first that needs no options)
      {lc_group: web, ways: 4}    # static: the LC group and its ways (from an offline sweep)
    groups:                       # groups to create (or adopt when they exist) on the node
      - name: web
        kind: lc
        slo: {percentile: 99, target_ms: 5.0}
        pids: [1234]              # tasks to move in at start
        cgroup: /sys/fs/cgroup/system.slice/web.service   # its tasks, now and later
        cpus: [0, 1]
      - name: batch
        kind: batch
        cgroup: /sys/fs/cgroup/batch.slice   # a slice: the tasks of every unit below it
    guard:
      violation_intervals: 3      # K: consecutive SLO violations that switch to the fallback
      stable_intervals: 10        # intervals without violation before switching back
      backoff_window_intervals: 100   # a trip this soon after switching back doubles it,
      max_stable_intervals: 320   #   up to this many
      max_way_step: 2             # ways a group may gain or lose per interval (null: no limit)
      max_mb_step: 2              # MBA steps per interval (tuner.guard.mb_step_size; null: none)
      min_dwell_s: 0.0            # a group's allocation is held at least this long
      limit_fallback: false       # also rate-limit the fallback's plans
    agent:
      address: 127.0.0.1:50051    # or unix:/run/rdtune/agent.sock (--agent wins)
      token_file: /etc/rdtune/token   # or $RDTUNE_AGENT_TOKEN
      tls: {ca: ca.pem, cert: client.pem, key: client.key, server_name: agent.local}
      timeout_s: 5.0
    retry: {initial_s: 0.2, max_s: 10.0}   # backoff while the agent is unreachable
    metrics_listen: 127.0.0.1:9465   # Prometheus endpoint ("" disables); not loopback:
    metrics_tls: {cert: tuner.pem, key: tuner.key, client_ca: null}   # HTTPS and
    metrics_token_file: /etc/rdtune/metrics-token                     # a bearer token
    log_json: false               # JSON lines logs on stderr
    restore_baseline: false       # on clean shutdown, put back the allocation found at start
    restore_deadline_s: 10.0      # ... retrying an unreachable agent for this long
    realtime: null                # simulated node: also sleep each interval (default: no)

Unknown keys and wrong types are errors naming the file and the key (agent/configfile.py):
a typo in a safety limit, or ``restore_baseline: "false"``, must not pass silently. Every
setting can also come from a ``RDTUNE_TUNER__KEY[__SUBKEY]`` variable (YAML value).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from agent import configfile
from agent.address import split_address
from agent.configfile import ConfigError, Finite, Strict
from agent.connection import AgentConnection
from agent.pmc.counters import threads_of
from agent.server.metrics_http import MetricsEndpoint
from agent.types import MAX_WAIT_S, SLO, GroupKind, GroupSpec

__all__ = ["AgentConnection", "ConfigError", "GroupConfig", "GuardConfig", "TunerConfig"]

log = logging.getLogger("rdtune.tuner")


@dataclass
class GroupConfig:
    """A group the tuner makes sure exists on the node, and what goes into it."""

    spec: GroupSpec
    pids: tuple[int, ...] = ()
    cgroup: str | None = None
    cpus: tuple[int, ...] = ()

    def all_pids(self, threads: bool = False) -> tuple[int, ...]:
        """Configured pids plus the cgroup's current members (read now); with ``threads``
        every thread of each instead: a resctrl group holds threads, and writing a
        process's pid to its ``tasks`` file moves the main thread alone."""
        return self.with_members(self.cgroup_pids(), threads)

    def cgroup_pids(self) -> tuple[int, ...]:
        """The processes of the cgroup and of every cgroup below it, read now. A systemd
        slice holds none itself (its processes are in the ``.service`` and ``.scope``
        cgroups below it, and cgroup v2 allows no processes in an inner cgroup), so
        following a slice means following its whole subtree."""
        if not self.cgroup:
            return ()
        root = Path(self.cgroup)
        path = root / "cgroup.procs"
        try:
            pids = [int(x) for x in path.read_text().split()]
        except OSError as exc:
            raise ConfigError(f"group {self.spec.name!r}: cannot read {path}: {exc}") from exc
        for below in _descendants(root):
            try:
                pids.extend(int(x) for x in (below / "cgroup.procs").read_text().split())
            except OSError:  # removed since it was listed (a stopped unit): no tasks there
                continue
        return tuple(pids)

    def with_members(self, members: tuple[int, ...], threads: bool) -> tuple[int, ...]:
        """The configured pids plus ``members`` (as :meth:`cgroup_pids` read them), each
        once; with ``threads`` every thread of each (see :meth:`all_pids`)."""
        pids = [*self.pids, *members]
        if threads:
            pids = [tid for pid in pids for tid in threads_of(pid)]
        return tuple(dict.fromkeys(pids))

    def check_cpus(self) -> None:
        """Refuse a CPU listed twice (most likely a typo for another one) at start, not
        after the group is made: the agent would take it silently. The file's schema
        refuses a CPU that is not a whole number in [0, 8191] (``Cpu``); whether the host has it
        is the agent's to say, as CPU numbers can have gaps."""
        seen: set[int] = set()
        for cpu in self.cpus:
            if cpu in seen:
                raise ConfigError(f"group {self.spec.name!r}: cpus: CPU {cpu} is listed twice")
            seen.add(cpu)


@dataclass
class GuardConfig:
    violation_intervals: int = 3
    stable_intervals: int = 10
    backoff_window_intervals: int = 100
    max_stable_intervals: int = 320
    max_way_step: int | None = None
    max_mb_step: int | None = None
    min_dwell_s: float = 0.0
    limit_fallback: bool = False

    def validate(self) -> None:
        if self.violation_intervals < 1:
            raise ConfigError("guard.violation_intervals must be >= 1")
        for key in ("stable_intervals", "backoff_window_intervals", "max_stable_intervals"):
            if getattr(self, key) < 1:
                raise ConfigError(f"guard.{key} must be >= 1")
        for key in ("max_way_step", "max_mb_step"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigError(f"guard.{key} must be a whole number >= 1 (or null)")
        if not (math.isfinite(self.min_dwell_s) and self.min_dwell_s >= 0):
            raise ConfigError("guard.min_dwell_s must be >= 0")


@dataclass
class TunerConfig:
    controller: str | None = None
    interval_s: float = 1.0
    resync_intervals: int = 10
    controller_options: dict = field(default_factory=dict)
    fallback: str | None = None
    fallback_options: dict = field(default_factory=dict)
    groups: list[GroupConfig] = field(default_factory=list)
    guard: GuardConfig = field(default_factory=GuardConfig)
    agent: AgentConnection = field(default_factory=AgentConnection)
    retry_initial_s: float = 0.2
    retry_max_s: float = 10.0
    metrics_listen: str = "127.0.0.1:9465"
    metrics_tls_cert: str | None = None
    metrics_tls_key: str | None = None
    metrics_tls_client_ca: str | None = None
    metrics_token_file: str | None = None
    log_json: bool = False
    restore_baseline: bool = False
    restore_deadline_s: float = 10.0
    realtime: bool | None = None

    def validate(self) -> None:
        if not (math.isfinite(self.interval_s) and 0 < self.interval_s <= MAX_WAIT_S):
            raise ConfigError(
                f"interval_s must be a number in (0, {MAX_WAIT_S:g}] s (the longest an "
                f"agent waits out), got {self.interval_s}"
            )
        if not isinstance(self.resync_intervals, int) or self.resync_intervals < 1:
            raise ConfigError("resync_intervals must be a whole number >= 1")
        if not (0 < self.retry_initial_s <= self.retry_max_s):
            raise ConfigError("retry needs 0 < initial_s <= max_s")
        if not (math.isfinite(self.restore_deadline_s) and self.restore_deadline_s >= 0):
            raise ConfigError("restore_deadline_s must be a number >= 0")
        if not (math.isfinite(self.agent.timeout_s) and 0 < self.agent.timeout_s <= MAX_WAIT_S):
            raise ConfigError(
                f"agent.timeout_s must be in (0, {MAX_WAIT_S:g}] s, got {self.agent.timeout_s}"
            )
        if not isinstance(self.controller_options, dict):
            raise ConfigError("controller_options must be a mapping")
        if not isinstance(self.fallback_options, dict):
            raise ConfigError("fallback_options must be a mapping")
        if self.fallback_options and not self.fallback:
            # The default fallback is the first of several that builds without options:
            # options meant for one of them would be ignored, unchecked.
            raise ConfigError(
                "fallback_options without fallback: name the fallback they are for "
                "(fallback: static, with fallback_options: {lc_group, ways}), or remove them"
            )
        self.guard.validate()
        names = [g.spec.name for g in self.groups]
        if len(set(names)) != len(names):
            raise ConfigError(f"group names must be unique, got {names}")
        for g in self.groups:
            g.check_cpus()
        if self.metrics_listen:
            host, sep, port = self.metrics_listen.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ConfigError(
                    f"metrics_listen must be host:port (or '' to disable), "
                    f"got {self.metrics_listen!r}"
                )
            self.metrics_endpoint().check()

    def metrics_endpoint(self) -> MetricsEndpoint | None:
        """The metrics endpoint's settings (None: disabled)."""
        return MetricsEndpoint.of(self)


# ------------------------------------------------------------------------ the file

ENV_PREFIX = "RDTUNE_TUNER"  # RDTUNE_TUNER__INTERVAL_S=0.5, RDTUNE_TUNER__GUARD__MAX_WAY_STEP=2
_G = GuardConfig()
PositiveS = Annotated[Finite, Field(gt=0)]
NonNegativeS = Annotated[Finite, Field(ge=0)]
WaitS = Annotated[Finite, Field(gt=0, le=MAX_WAIT_S)]  # an interval or a call's deadline
AtLeastOne = Annotated[int, Field(ge=1)]
# Linux's PID_MAX_LIMIT (2**22) and NR_CPUS's largest setting: a larger id names nothing
Pid = Annotated[int, Field(ge=0, le=1 << 22)]
Cpu = Annotated[int, Field(ge=0, le=8191)]


class SloFile(Strict):
    percentile: float
    target_ms: float


class GroupFile(Strict):
    """One ``groups:`` entry."""

    name: str
    kind: Literal["lc", "batch", "system"] = "batch"
    slo: SloFile | None = None
    exclusive: bool = False
    pids: list[Pid] = []
    cgroup: str | None = None
    cpus: list[Cpu] = []

    @field_validator("cgroup")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not os.path.isabs(value):
            raise ValueError("cgroup must be an absolute path")
        return value

    def to_config(self, key: str) -> GroupConfig:
        """The group as the tuner uses it; a ValueError naming ``key`` (where the group is
        in the file) when the group rules of agent.types (SLOs, names) refuse it."""
        try:
            slo = None if self.slo is None else SLO(self.slo.percentile, self.slo.target_ms)
        except ValueError as exc:
            raise ValueError(f"{key}.slo: {exc}") from None
        try:
            spec = GroupSpec(self.name, GroupKind(self.kind), slo, self.exclusive)
        except ValueError as exc:
            raise ValueError(f"{key}: {exc}") from None
        return GroupConfig(spec, tuple(self.pids), self.cgroup, tuple(self.cpus))


class GuardFile(Strict):
    violation_intervals: AtLeastOne = _G.violation_intervals
    stable_intervals: AtLeastOne = _G.stable_intervals
    backoff_window_intervals: AtLeastOne = _G.backoff_window_intervals
    max_stable_intervals: AtLeastOne = _G.max_stable_intervals
    max_way_step: AtLeastOne | None = _G.max_way_step
    max_mb_step: AtLeastOne | None = _G.max_mb_step
    min_dwell_s: NonNegativeS = _G.min_dwell_s
    limit_fallback: bool = _G.limit_fallback


class AgentTlsFile(Strict):
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    server_name: str | None = None


class AgentFile(Strict):
    address: str = "127.0.0.1:50051"
    token_file: str | None = None
    tls: AgentTlsFile | None = None
    timeout_s: WaitS = 5.0

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        split_address(value)  # ConfigError (a ValueError): what is wrong with it
        return value


class RetryFile(Strict):
    initial_s: PositiveS = 0.2
    max_s: PositiveS = 10.0


class MetricsTlsFile(Strict):
    cert: str | None = None
    key: str | None = None
    client_ca: str | None = None


class TunerFile(Strict):
    """``tuner.yaml`` as written (the module docstring has an example)."""

    controller: str | None = None
    interval_s: WaitS = 1.0
    resync_intervals: AtLeastOne = 10
    controller_options: dict[str, Any] = {}
    fallback: str | None = None
    fallback_options: dict[str, Any] = {}
    groups: list[GroupFile] = []
    guard: GuardFile = GuardFile()
    agent: AgentFile = AgentFile()
    retry: RetryFile = RetryFile()
    metrics_listen: str | None = "127.0.0.1:9465"  # "" or null: no endpoint
    metrics_tls: MetricsTlsFile | None = None
    metrics_token_file: str | None = None
    log_json: bool = False
    restore_baseline: bool = False
    restore_deadline_s: NonNegativeS = 10.0
    realtime: bool | None = None

    def to_config(self) -> TunerConfig:
        tls, mtls = self.agent.tls, self.metrics_tls or MetricsTlsFile()
        return TunerConfig(
            controller=self.controller,
            interval_s=self.interval_s,
            resync_intervals=self.resync_intervals,
            controller_options=dict(self.controller_options),
            fallback=self.fallback,
            fallback_options=dict(self.fallback_options),
            groups=[g.to_config(f"groups[{i}]") for i, g in enumerate(self.groups)],
            guard=GuardConfig(**self.guard.model_dump()),
            agent=AgentConnection(
                address=self.agent.address,
                token_file=self.agent.token_file,
                tls_ca=tls.ca if tls else None,
                tls_cert=tls.cert if tls else None,
                tls_key=tls.key if tls else None,
                tls_server_name=tls.server_name if tls else None,
                tls=tls is not None,
                timeout_s=self.agent.timeout_s,
            ),
            retry_initial_s=self.retry.initial_s,
            retry_max_s=self.retry.max_s,
            metrics_listen=self.metrics_listen or "",
            metrics_tls_cert=mtls.cert,
            metrics_tls_key=mtls.key,
            metrics_tls_client_ca=mtls.client_ca,
            metrics_token_file=self.metrics_token_file,
            log_json=self.log_json,
            restore_baseline=self.restore_baseline,
            restore_deadline_s=self.restore_deadline_s,
            realtime=self.realtime,
        )


_REFUSED = {"agent.token": "put the agent token in token_file or $RDTUNE_AGENT_TOKEN, not here"}


def _build(
    model: TunerFile,
    where: str,
    overrides: Mapping[str, Any] | None = None,
    in_file: TunerFile | None = None,
) -> TunerConfig:
    """``in_file``: the file alone (without the environment), whose fallback its
    ``fallback_options`` are for."""
    try:
        cfg = model.to_config()
    except ConfigError:
        raise
    except ValueError as exc:  # the group rules of agent.types (names, SLOs)
        raise ConfigError(f"{where}: {exc}") from None
    for name, value in (overrides or {}).items():
        setattr(cfg, name, value)  # before the checks: a flag replaces a refused file value
    if in_file is not None:
        _drop_replaced_fallback_options(cfg, in_file)
    try:
        cfg.validate()
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return cfg


def _drop_replaced_fallback_options(cfg: TunerConfig, in_file: TunerFile) -> None:
    """A fallback named by a flag or the environment in place of the file's does not take
    the file's ``fallback_options``: they are options of the file's fallback (static's
    lc_group and ways would make eq or copart refuse to start)."""
    kept = cfg.fallback_options == in_file.fallback_options  # not given anew
    replaced = _spec_name(cfg.fallback) != _spec_name(in_file.fallback)
    if in_file.fallback and in_file.fallback_options and kept and replaced:
        log.info(
            "fallback %s replaces the file's %s: its fallback_options are not used",
            cfg.fallback,
            in_file.fallback,
            extra={"event": "config"},
        )
        cfg.fallback_options = {}


def _spec_name(spec: str | None) -> str:
    """The controller a spec names (``static[ways=4]``: static)."""
    return (spec or "").partition("[")[0].strip()


def parse_config(raw: object, where: str = "config") -> TunerConfig:
    """A :class:`TunerConfig` from parsed YAML (validated; no environment overrides)."""
    if raw is not None and not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping at the top level")
    token = (raw or {}).get("agent")
    if isinstance(token, dict) and token.get("token") is not None:
        raise ConfigError(f"{where}: agent.token: {_REFUSED['agent.token']}")
    return _build(configfile.validate(TunerFile, raw, where), where)


def load_yaml(
    path: str | Path | None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> TunerConfig:
    """The tuner's configuration from ``path`` (None: defaults) and ``RDTUNE_TUNER__*``
    variables, ``overrides`` (the command line's flags: field -> value) taking the place of
    theirs before anything is checked."""
    where = str(path) if path is not None else "configuration"
    model = configfile.load(
        TunerFile, path, env_prefix=ENV_PREFIX, environ=environ, refused=_REFUSED
    )
    in_file = configfile.load(TunerFile, path, refused=_REFUSED) if path is not None else None
    return _build(model, where, overrides, in_file)


def _descendants(root: Path) -> list[Path]:
    """Every cgroup below ``root``, parents before children, in a stable order."""
    found: list[Path] = []
    for top, dirs, _ in os.walk(root):
        dirs.sort()
        found.extend(Path(top) / d for d in dirs)
    return found
