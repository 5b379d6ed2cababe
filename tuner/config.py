"""The tuner's configuration: a YAML file (``rdtune tune --config FILE``), flags win.

Example ``tuner.yaml`` (every key optional; see docs/DEPLOY.md)::

    interval_s: 1.0               # control interval (node clock: simulated nodes are stepped)
    resync_intervals: 10          # read the node's allocation back every N intervals (1: always)
    controller_options: {}        # keyword options of the controller (registry factory)
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
      - {name: batch, kind: batch, cgroup: /sys/fs/cgroup/batch.slice}
    guard:
      violation_intervals: 3      # K: consecutive SLO violations that switch to the fallback
      stable_intervals: 10        # intervals without violation before switching back
      max_way_step: 2             # ways a group may gain or lose per interval (null: no limit)
      max_mb_step: 2              # MBA steps (of bandwidth_gran) per interval (null: no limit)
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

Unknown keys are an error: a typo in a safety limit must not pass silently.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml

from agent.connection import AgentConnection
from agent.server.metrics_http import MetricsEndpoint
from agent.server.security import ConfigError
from agent.types import SLO, GroupKind, GroupSpec

__all__ = ["AgentConnection", "ConfigError", "GroupConfig", "GuardConfig", "TunerConfig"]


@dataclass
class GroupConfig:
    """A group the tuner makes sure exists on the node, and what goes into it."""

    spec: GroupSpec
    pids: tuple[int, ...] = ()
    cgroup: str | None = None
    cpus: tuple[int, ...] = ()

    def all_pids(self) -> tuple[int, ...]:
        """Configured pids plus the cgroup's current members (read now)."""
        pids = list(self.pids)
        if self.cgroup:
            path = Path(self.cgroup) / "cgroup.procs"
            try:
                text = path.read_text()
            except OSError as exc:
                raise ConfigError(f"group {self.spec.name!r}: cannot read {path}: {exc}") from exc
            pids.extend(int(x) for x in text.split())
        return tuple(dict.fromkeys(pids))


@dataclass
class GuardConfig:
    violation_intervals: int = 3
    stable_intervals: int = 10
    max_way_step: int | None = None
    max_mb_step: int | None = None
    min_dwell_s: float = 0.0
    limit_fallback: bool = False

    def validate(self) -> None:
        if self.violation_intervals < 1:
            raise ConfigError("guard.violation_intervals must be >= 1")
        if self.stable_intervals < 1:
            raise ConfigError("guard.stable_intervals must be >= 1")
        for key in ("max_way_step", "max_mb_step"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigError(f"guard.{key} must be a whole number >= 1 (or null)")
        if not (math.isfinite(self.min_dwell_s) and self.min_dwell_s >= 0):
            raise ConfigError("guard.min_dwell_s must be >= 0")


@dataclass
class TunerConfig:
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
        if not (math.isfinite(self.interval_s) and self.interval_s > 0):
            raise ConfigError(f"interval_s must be a positive number, got {self.interval_s}")
        if not isinstance(self.resync_intervals, int) or self.resync_intervals < 1:
            raise ConfigError("resync_intervals must be a whole number >= 1")
        if not (0 < self.retry_initial_s <= self.retry_max_s):
            raise ConfigError("retry needs 0 < initial_s <= max_s")
        if not (math.isfinite(self.restore_deadline_s) and self.restore_deadline_s >= 0):
            raise ConfigError("restore_deadline_s must be a number >= 0")
        if not (math.isfinite(self.agent.timeout_s) and self.agent.timeout_s > 0):
            raise ConfigError("agent.timeout_s must be positive")
        if not isinstance(self.controller_options, dict):
            raise ConfigError("controller_options must be a mapping")
        if not isinstance(self.fallback_options, dict):
            raise ConfigError("fallback_options must be a mapping")
        self.guard.validate()
        names = [g.spec.name for g in self.groups]
        if len(set(names)) != len(names):
            raise ConfigError(f"group names must be unique, got {names}")
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


def _ints(raw: object, what: str) -> tuple[int, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(
        isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in raw
    ):
        raise ConfigError(f"{what} must be a list of whole numbers >= 0")
    return tuple(raw)


def parse_group(raw: object, index: int) -> GroupConfig:
    """One ``groups:`` entry."""
    if not isinstance(raw, dict) or "name" not in raw:
        raise ConfigError(f"groups[{index}] must be a mapping with a name")
    raw = dict(raw)
    unknown = set(raw) - {"name", "kind", "slo", "exclusive", "pids", "cgroup", "cpus"}
    if unknown:
        raise ConfigError(f"groups[{index}]: unknown key(s) {', '.join(sorted(unknown))}")
    where = f"group {raw['name']!r}"
    try:
        slo = raw.get("slo")
        if slo is not None:
            if not isinstance(slo, dict) or set(slo) != {"percentile", "target_ms"}:
                raise ConfigError(f"{where}: slo needs exactly percentile and target_ms")
            slo = SLO(float(slo["percentile"]), float(slo["target_ms"]))
        spec = GroupSpec(
            str(raw["name"]),
            GroupKind(str(raw.get("kind", "batch"))),
            slo,
            bool(raw.get("exclusive", False)),
        )
    except ConfigError:
        raise
    except (ValueError, TypeError) as exc:  # InvalidName is a ValueError too
        raise ConfigError(f"{where}: {exc}") from exc
    cgroup = raw.get("cgroup")
    if cgroup is not None and (not isinstance(cgroup, str) or not os.path.isabs(cgroup)):
        raise ConfigError(f"{where}: cgroup must be an absolute path")
    return GroupConfig(
        spec=spec,
        pids=_ints(raw.get("pids"), f"{where}: pids"),
        cgroup=cgroup,
        cpus=_ints(raw.get("cpus"), f"{where}: cpus"),
    )


def _section(raw: dict, key: str, allowed: set[str]) -> dict:
    value = raw.pop(key, None) or {}
    if not isinstance(value, dict):
        raise ConfigError(f"{key} must be a mapping")
    unknown = set(value) - allowed
    if unknown:
        raise ConfigError(f"unknown key(s) in {key}: {', '.join(sorted(unknown))}")
    return value


def parse_config(raw: object, where: str = "config") -> TunerConfig:
    """A :class:`TunerConfig` from parsed YAML (validated)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a mapping")
    raw = dict(raw)
    guard_fields = {f.name for f in fields(GuardConfig)}
    guard = _section(raw, "guard", guard_fields)
    agent = _section(raw, "agent", {"address", "token_file", "tls", "timeout_s", "token"})
    if "token" in agent:
        raise ConfigError("put the agent token in token_file or $RDTUNE_AGENT_TOKEN, not here")
    tls = agent.pop("tls", None) or {}
    if not isinstance(tls, dict) or set(tls) - {"ca", "cert", "key", "server_name"}:
        raise ConfigError("agent.tls takes ca, cert, key and server_name")
    retry = _section(raw, "retry", {"initial_s", "max_s"})
    metrics_tls = _section(raw, "metrics_tls", {"cert", "key", "client_ca"})
    groups = raw.pop("groups", None) or []
    if not isinstance(groups, list):
        raise ConfigError("groups must be a list")
    known = {"interval_s", "resync_intervals", "controller_options", "fallback"}
    known |= {"fallback_options"}
    known |= {"metrics_listen", "metrics_tls", "metrics_token_file", "log_json"}
    known |= {"restore_baseline", "restore_deadline_s", "realtime"}
    unknown = set(raw) - known
    if unknown:
        raise ConfigError(f"unknown config key(s) in {where}: {', '.join(sorted(unknown))}")
    try:
        cfg = TunerConfig(
            interval_s=float(raw.get("interval_s", 1.0)),
            resync_intervals=raw.get("resync_intervals", 10),
            controller_options=raw.get("controller_options") or {},
            fallback=raw.get("fallback"),
            fallback_options=raw.get("fallback_options") or {},
            groups=[parse_group(g, i) for i, g in enumerate(groups)],
            guard=GuardConfig(**guard),
            agent=AgentConnection(
                address=str(agent.get("address", "127.0.0.1:50051")),
                token_file=agent.get("token_file"),
                tls_ca=tls.get("ca"),
                tls_cert=tls.get("cert"),
                tls_key=tls.get("key"),
                tls_server_name=tls.get("server_name"),
                tls=bool(tls),
                timeout_s=float(agent.get("timeout_s", 5.0)),
            ),
            retry_initial_s=float(retry.get("initial_s", 0.2)),
            retry_max_s=float(retry.get("max_s", 10.0)),
            metrics_listen=str(raw.get("metrics_listen", "127.0.0.1:9465") or ""),
            metrics_tls_cert=metrics_tls.get("cert"),
            metrics_tls_key=metrics_tls.get("key"),
            metrics_tls_client_ca=metrics_tls.get("client_ca"),
            metrics_token_file=raw.get("metrics_token_file"),
            log_json=bool(raw.get("log_json", False)),
            restore_baseline=bool(raw.get("restore_baseline", False)),
            restore_deadline_s=float(raw.get("restore_deadline_s", 10.0)),
            realtime=raw.get("realtime"),
        )
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"{where}: {exc}") from exc
    cfg.validate()
    return cfg


def load_yaml(path: str | Path) -> TunerConfig:
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read config {path}: {exc}") from exc
    return parse_config(raw, str(path))
