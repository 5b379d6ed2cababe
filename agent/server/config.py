"""The agent's configuration: CLI flags and/or a YAML file (flags win).

Example ``agent.yaml``::

    backend: sim              # or resctrl
    scenario: null            # sim: a built-in scenario name (default: agent.sim's default)
    seed: 0
    root: /sys/fs/resctrl     # resctrl: the mount to manage (an emulated one works too)
    state_dir: /var/lib/rdtune  # resctrl: records of the agent's own groups (adopted on restart)
    listen: 127.0.0.1:50051   # or unix:/run/rdtune/agent.sock
    metrics_listen: 127.0.0.1:9464   # "" disables it; on a non-loopback address only with:
    metrics_tls: {cert: metrics.pem, key: metrics.key, client_ca: null}   # HTTPS, and
    metrics_token_file: /etc/rdtune/metrics-token                         # a bearer token
    tls: {cert: server.pem, key: server.key, client_ca: clients.pem}   # client_ca: mTLS
    token_file: /etc/rdtune/token    # or the RDTUNE_AGENT_TOKEN environment variable
    max_message_bytes: 4194304
    max_workers: 64           # RPC worker threads
    max_streams: 16           # open observation/latency streams at once
    max_sessions: 32          # open control sessions at once (streams + sessions < max_workers)
    rate_limit: {rate: 20000, burst: 40000}   # requests/s per client host; null disables
    restore_on_exit: false
    grace_s: 5
    latency_scrape:
      web: {url: http://127.0.0.1:8080/metrics, metric: http_request_duration_seconds}
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml

from agent.server.metrics_http import MetricsEndpoint
from agent.server.scrape import ScrapeTarget
from agent.server.security import ConfigError, check_exposure, parse_listen, read_token
from agent.types import validate_group_name


@dataclass
class AgentConfig:
    backend: str = "sim"
    scenario: str | None = None
    seed: int | None = None
    auto_groups: bool = True  # sim: create the scenario's groups at start
    root: str = "/sys/fs/resctrl"
    state_dir: str | None = None  # resctrl: where own-group records live (its default if None)
    listen: str = "127.0.0.1:50051"
    metrics_listen: str = "127.0.0.1:9464"
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    token: str | None = field(default=None, repr=False)
    token_file: str | None = None
    # The metrics endpoint's own TLS and token (needed off loopback): the gRPC port may be a
    # Unix socket without TLS while Prometheus scrapes over the pod network.
    metrics_tls_cert: str | None = None
    metrics_tls_key: str | None = None
    metrics_tls_client_ca: str | None = None
    metrics_token_file: str | None = None
    max_message_bytes: int = 4 << 20
    rate_limit: float | None = 20000.0
    rate_burst: float = 40000.0
    max_workers: int = 64
    max_streams: int = 16  # open observation/latency streams at once (each holds a worker)
    max_sessions: int = 32  # open control sessions at once (each holds a worker)
    max_concurrent_rpcs: int = 256
    restore_on_exit: bool = False
    grace_s: float = 5.0
    latency_scrape: dict[str, ScrapeTarget] = field(default_factory=dict)

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert and self.tls_key)

    def metrics_endpoint(self) -> MetricsEndpoint | None:
        """The metrics endpoint's settings (None: disabled)."""
        return MetricsEndpoint.of(self)

    def resolve_token(self) -> None:
        """Fill ``token`` from ``token_file`` or the environment (see ``read_token``)."""
        self.token = read_token(self.token, self.token_file, ConfigError)

    def validate(self) -> None:
        if self.backend not in ("sim", "resctrl"):
            raise ConfigError(f"backend must be 'sim' or 'resctrl', got {self.backend!r}")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("TLS needs both a certificate and a key")
        if self.tls_client_ca and not self.tls:
            raise ConfigError("a client CA (mTLS) needs a server certificate and key")
        for path in (self.tls_cert, self.tls_key, self.tls_client_ca):
            if path and not Path(path).is_file():
                raise ConfigError(f"TLS file {path!r} does not exist")
        if self.max_message_bytes < 1024:
            raise ConfigError("max_message_bytes must be at least 1024")
        if self.rate_limit is not None and (self.rate_limit <= 0 or self.rate_burst < 1):
            raise ConfigError("rate limit needs rate > 0 and burst >= 1")
        if self.max_streams < 1 or self.max_sessions < 0:
            raise ConfigError("max_streams must be >= 1 and max_sessions >= 0")
        if self.max_streams + self.max_sessions >= self.max_workers:
            raise ConfigError(
                f"max_streams + max_sessions ({self.max_streams} + {self.max_sessions}) must be "
                f"below max_workers ({self.max_workers}): each open stream or session holds a "
                "worker thread, and unary calls need workers too"
            )
        if self.grace_s < 0:
            raise ConfigError("grace_s must be >= 0")
        for group in self.latency_scrape:
            validate_group_name(group, error=ConfigError)
        check_exposure(parse_listen(self.listen), self.tls, self.token)
        metrics = self.metrics_endpoint()
        if metrics is not None:
            metrics.check()


def _scrape_targets(raw: object) -> dict[str, ScrapeTarget]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError("latency_scrape must map group names to {url, metric}")
    out = {}
    for group, target in raw.items():
        if not isinstance(target, dict) or not {"url", "metric"} <= set(target):
            raise ConfigError(f"latency_scrape.{group} needs url and metric")
        try:
            out[str(group)] = ScrapeTarget(
                url=str(target["url"]),
                metric=str(target["metric"]),
                scale_to_ms=target.get("scale_to_ms"),
            )
        except ValueError as exc:
            raise ConfigError(f"latency_scrape.{group}: {exc}") from exc
    return out


def load_yaml(path: str | Path) -> AgentConfig:
    """Read a config file; unknown keys are an error (a typo must not pass silently)."""
    try:
        raw = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read config {path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"config {path} must be a mapping")
    raw = dict(raw)
    tls = raw.pop("tls", None) or {}
    metrics_tls = raw.pop("metrics_tls", None) or {}
    for section, value in (("tls", tls), ("metrics_tls", metrics_tls)):
        if not isinstance(value, dict) or set(value) - {"cert", "key", "client_ca"}:
            raise ConfigError(f"{section} takes cert, key and client_ca")
    rate = raw.pop("rate_limit", "default")
    if "token" in raw:
        raise ConfigError("put the token in token_file or $RDTUNE_AGENT_TOKEN, not the config")
    scrape = _scrape_targets(raw.pop("latency_scrape", None))
    known = {f.name for f in fields(AgentConfig)} - {"token", "latency_scrape"}
    known -= {"metrics_tls_cert", "metrics_tls_key", "metrics_tls_client_ca"}
    unknown = set(raw) - known
    if unknown:
        raise ConfigError(f"unknown config key(s) in {path}: {', '.join(sorted(unknown))}")
    cfg = AgentConfig(**raw, latency_scrape=scrape)
    cfg.tls_cert, cfg.tls_key = tls.get("cert"), tls.get("key")
    cfg.tls_client_ca = tls.get("client_ca")
    cfg.metrics_tls_cert, cfg.metrics_tls_key = metrics_tls.get("cert"), metrics_tls.get("key")
    cfg.metrics_tls_client_ca = metrics_tls.get("client_ca")
    if rate is None:
        cfg.rate_limit = None
    elif isinstance(rate, dict):
        cfg.rate_limit = float(rate.get("rate", cfg.rate_limit))
        cfg.rate_burst = float(rate.get("burst", cfg.rate_burst))
    return cfg
