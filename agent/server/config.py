"""The agent's configuration: a YAML file, ``RDTUNE_AGENT__KEY`` environment variables over
it, and CLI flags over both. The file is read strictly (agent/configfile.py): unknown keys
and values of the wrong type (``restore_on_exit: "false"``, ``grace_s: abc``) are refused
with the file, the key and the reason.

Example ``agent.yaml``::

    backend: sim              # or resctrl
    scenario: null            # sim: a built-in scenario name (default: agent.sim's default)
    seed: 0                   # sim: the random seed
    auto_groups: true         # sim: create the scenario's groups at start
    root: /sys/fs/resctrl     # resctrl: the mount to manage (an emulated one works too)
    state_dir: /var/lib/rdtune  # resctrl: records of the agent's own groups (adopted on restart)
    runtime_classes: []       # resctrl: RDT classes the container runtime creates (DEPLOY.md)
    memory_bandwidth_gbps: null  # resctrl: an L3 domain's achievable peak, GB/s (DEPLOY.md)
    listen: 127.0.0.1:50051   # or unix:/run/rdtune/agent.sock (resctrl: this, or a token)
    health_listen: ""         # e.g. 0.0.0.0:50052: gRPC health only, plain TCP (kubelet probes)
    metrics_listen: 127.0.0.1:9464   # "" disables it; on a non-loopback address only with:
    metrics_tls: {cert: metrics.pem, key: metrics.key, client_ca: null}   # HTTPS, and
    metrics_token_file: /etc/rdtune/metrics-token                         # a bearer token
    tls: {cert: server.pem, key: server.key, client_ca: clients.pem}   # client_ca: mTLS
    token_file: /etc/rdtune/token    # or the RDTUNE_AGENT_TOKEN environment variable
    max_message_bytes: 4194304
    max_workers: 64           # threads for node calls that may block (resctrl) and scrapes
    max_streams: 16           # open observation/latency streams at once
    max_sessions: 32          # open control sessions at once
    max_waiting_steps: 64     # Steps waiting for their interval at once
    max_concurrent_rpcs: 256  # RPCs in progress at once (gRPC refuses more: RESOURCE_EXHAUSTED)
    rate_limit: {rate: 20000, burst: 40000}   # requests/s per client host; null disables
    restore_on_exit: false
    grace_s: 5
    node_check_s: 5           # how often health checks the node is usable (resctrl mounted)
    latency_scrape:
      web: {url: http://127.0.0.1:8080/metrics, metric: http_request_duration_seconds}
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from agent import configfile
from agent.address import split_address
from agent.configfile import Finite, Strict
from agent.server.metrics_http import MetricsEndpoint
from agent.server.scrape import ScrapeTarget
from agent.server.security import (
    TOKEN_ENV,
    ConfigError,
    check_exposure,
    parse_listen,
    read_token,
)
from agent.types import validate_group_name

# grpc's channel arguments and concurrency limit are C ints: a larger value fails at start.
GRPC_INT_MAX = 2**31 - 1
# Longer than any orchestrator waits for a stopping process (Kubernetes: 30 s by default);
# far below what the stop's own timers can hold (threading.TIMEOUT_MAX).
MAX_GRACE_S = 3600.0


# The keys each backend alone reads (agent/server/app.py builds its node from them).
BACKEND_KEYS = {
    "sim": ("scenario", "seed", "auto_groups"),
    # a simulated node reports its preset's peak bandwidth
    "resctrl": ("root", "state_dir", "memory_bandwidth_gbps"),
}


@dataclass
class AgentConfig:
    backend: str = "sim"
    scenario: str | None = None
    seed: int | None = None
    auto_groups: bool = True  # sim: create the scenario's groups at start
    root: str = "/sys/fs/resctrl"
    state_dir: str | None = None  # resctrl: where own-group records live (its default if None)
    # resctrl: classes the container runtime creates (pod annotations), adopted by name
    runtime_classes: list[str] = field(default_factory=list)
    # resctrl: an L3 domain's achievable peak memory bandwidth (GB/s, 1e9 bytes/s), which
    # the kernel does not report: policies read each group's bandwidth as a share of it
    memory_bandwidth_gbps: float | None = None
    listen: str = "127.0.0.1:50051"
    metrics_listen: str = "127.0.0.1:9464"
    # The gRPC health service alone, plain TCP (kubelet's gRPC probes); "" disables it.
    health_listen: str = ""
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
    max_workers: int = 64  # threads for node calls that may block, and latency scrapes
    max_streams: int = 16  # open observation/latency streams at once
    max_sessions: int = 32  # open control sessions at once
    max_waiting_steps: int = 64  # Steps waiting for their interval at once
    max_concurrent_rpcs: int = 256
    restore_on_exit: bool = False
    grace_s: float = 5.0
    # seconds between checks that the node is usable (resctrl still mounted) for health
    node_check_s: float = 5.0
    latency_scrape: dict[str, ScrapeTarget] = field(default_factory=dict)
    # The keys given in the file, the environment or a flag, rather than left at their
    # defaults: a key of the other backend is refused only when given.
    explicit: frozenset[str] = field(default=frozenset(), repr=False, compare=False)

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert and self.tls_key)

    def metrics_endpoint(self) -> MetricsEndpoint | None:
        """The metrics endpoint's settings (None: disabled)."""
        return MetricsEndpoint.of(self)

    def resolve_token(self) -> None:
        """Fill ``token`` from ``token_file`` or the environment (see ``read_token``)."""
        self.token = read_token(self.token, self.token_file, ConfigError)

    def _check_backend_keys(self) -> None:
        """Refuse a key only the other backend reads: a file for a resctrl host that
        forgot ``backend:`` would otherwise serve a simulated node, and a sim file's
        scenario would be ignored on a real one."""
        for backend, keys in BACKEND_KEYS.items():
            given = [key for key in keys if key in self.explicit]
            if backend != self.backend and given:
                raise ConfigError(
                    f"{', '.join(given)}: only the {backend} backend reads "
                    f"{'it' if len(given) == 1 else 'them'}, and this agent serves "
                    f"{self.backend}; set backend: {backend} (--backend {backend}; the "
                    f"default is sim), or remove {'it' if len(given) == 1 else 'them'}"
                )

    def validate(self) -> None:
        if self.backend not in ("sim", "resctrl"):
            raise ConfigError(f"backend must be 'sim' or 'resctrl', got {self.backend!r}")
        if self.backend == "resctrl" and not self.root.strip():  # would be the cwd
            raise ConfigError("root: empty; give the resctrl mount (default /sys/fs/resctrl)")
        if self.runtime_classes and self.backend != "resctrl":
            raise ConfigError("runtime_classes: only the resctrl backend has runtime classes")
        self._check_backend_keys()
        for name in self.runtime_classes:
            validate_group_name(name, error=ConfigError)
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("TLS needs both a certificate and a key")
        if self.tls_client_ca and not self.tls:
            raise ConfigError("a client CA (mTLS) needs a server certificate and key")
        for path in (self.tls_cert, self.tls_key, self.tls_client_ca):
            if path and not Path(path).is_file():
                raise ConfigError(f"TLS file {path!r} does not exist")
        if not 1024 <= self.max_message_bytes <= GRPC_INT_MAX:
            raise ConfigError(f"max_message_bytes must be in [1024, {GRPC_INT_MAX}]")
        if not 1 <= self.max_concurrent_rpcs <= GRPC_INT_MAX:
            raise ConfigError(f"max_concurrent_rpcs must be in [1, {GRPC_INT_MAX}]")
        # Written as "not (ok)" so that NaN, which fails every comparison, is refused.
        if self.rate_limit is not None and not (
            math.isfinite(self.rate_limit)
            and math.isfinite(self.rate_burst)
            and self.rate_limit > 0
            and self.rate_burst >= 1
        ):
            raise ConfigError(
                "rate limit needs a finite rate > 0 and a finite burst >= 1, got "
                f"rate {self.rate_limit:g}, burst {self.rate_burst:g}"
            )
        # max_sessions 0 leaves unary calls; max_waiting_steps 0 would refuse every Step
        # with an interval, the tuner's every interval on a simulated node
        if self.max_streams < 1 or self.max_sessions < 0 or self.max_waiting_steps < 1:
            raise ConfigError("max_streams and max_waiting_steps must be >= 1, max_sessions >= 0")
        bw = self.memory_bandwidth_gbps
        if bw is not None and not (math.isfinite(bw) and bw > 0):
            raise ConfigError(f"memory_bandwidth_gbps must be a finite number > 0, got {bw:g}")
        if self.max_workers < 1:
            raise ConfigError("max_workers must be >= 1")
        if not 0 < self.node_check_s <= MAX_GRACE_S:
            raise ConfigError(f"node_check_s must be in (0, {MAX_GRACE_S:g}] s")
        if not 0 <= self.grace_s <= MAX_GRACE_S:
            raise ConfigError(f"grace_s must be in [0, {MAX_GRACE_S:g}] s, got {self.grace_s:g}")
        for group in self.latency_scrape:
            validate_group_name(group, error=ConfigError)
        self._check_listeners()

    def _check_listeners(self) -> None:
        """Who may connect where: the exposure rules of each listener."""
        tls_from = "tls: {cert, key} or --tls-cert/--tls-key"
        listen = parse_listen(self.listen)
        check_exposure(listen, self.tls, self.token, tls_from)
        if self.backend == "resctrl" and listen.unix_path is None and not self.token:
            # Loopback TCP lets every local user in, and this agent runs as root: any of
            # them could move other users' tasks into a one-way group. A 0600 socket or a
            # token keeps the node to its owner.
            raise ConfigError(
                f"refusing to serve the resctrl backend on {listen.raw!r} without a token: "
                "any user of the host could connect; listen on a unix socket "
                "(listen: unix:/run/rdtune/agent.sock, as deploy/agent.yaml does) or give "
                f"a token (token_file, --token-file or ${TOKEN_ENV})"
            )
        if self.health_listen:
            if self.health_listen.strip().startswith("unix"):
                raise ConfigError(
                    f"health_listen must be host:port (TCP), got {self.health_listen!r}"
                )
            # the rules of every other address: a port above 65535 is refused, not wrapped
            split_address(self.health_listen, "health_listen", min_port=0)
        metrics = self.metrics_endpoint()
        if metrics is not None:
            metrics.check()


# ------------------------------------------------------------------------ the file

_D = AgentConfig()  # the defaults, once: the file's fields default to the same values
ENV_PREFIX = "RDTUNE_AGENT"  # RDTUNE_AGENT__LISTEN=..., RDTUNE_AGENT__RATE_LIMIT__RATE=...
Positive = Annotated[Finite, Field(gt=0)]


class TlsFiles(Strict):
    """A certificate and key (PEM files) and, for mutual TLS, the clients' CA."""

    cert: str | None = None
    key: str | None = None
    client_ca: str | None = None


class RateLimitFile(Strict):
    """Requests per second per client host, and the burst allowed above it."""

    rate: Positive = _D.rate_limit or 20000.0
    burst: Annotated[Finite, Field(ge=1)] = _D.rate_burst


class ScrapeFile(Strict):
    """An LC group's latency histogram on a Prometheus endpoint (agent/server/scrape.py)."""

    url: str
    metric: Annotated[str, Field(min_length=1)]
    scale_to_ms: Positive | None = None


class AgentFile(Strict):
    """``agent.yaml`` as written (the module docstring has an example)."""

    backend: Literal["sim", "resctrl"] = "sim"
    scenario: str | None = None
    seed: Annotated[int, Field(ge=0)] | None = None
    auto_groups: bool = _D.auto_groups
    root: str = _D.root
    state_dir: str | None = None
    runtime_classes: list[str] = []
    memory_bandwidth_gbps: Positive | None = None
    listen: str = _D.listen
    metrics_listen: str = _D.metrics_listen
    health_listen: str = _D.health_listen
    metrics_tls: TlsFiles | None = None
    metrics_token_file: str | None = None
    tls: TlsFiles | None = None
    token_file: str | None = None
    max_message_bytes: Annotated[int, Field(ge=1024, le=GRPC_INT_MAX)] = _D.max_message_bytes
    max_workers: Annotated[int, Field(ge=1)] = _D.max_workers
    max_streams: Annotated[int, Field(ge=1)] = _D.max_streams
    max_sessions: Annotated[int, Field(ge=0)] = _D.max_sessions
    max_waiting_steps: Annotated[int, Field(ge=1)] = _D.max_waiting_steps
    max_concurrent_rpcs: Annotated[int, Field(ge=1, le=GRPC_INT_MAX)] = _D.max_concurrent_rpcs
    rate_limit: RateLimitFile | None = RateLimitFile()  # null: no limit
    restore_on_exit: bool = _D.restore_on_exit
    grace_s: Annotated[Finite, Field(ge=0, le=MAX_GRACE_S)] = _D.grace_s
    node_check_s: Annotated[Finite, Field(gt=0, le=MAX_GRACE_S)] = _D.node_check_s
    latency_scrape: dict[str, ScrapeFile] = {}

    def to_config(self, where: str) -> AgentConfig:
        flat = self.model_dump(exclude={"tls", "metrics_tls", "rate_limit", "latency_scrape"})
        cfg = AgentConfig(**flat, explicit=frozenset(self.model_fields_set))
        tls, metrics_tls = self.tls or TlsFiles(), self.metrics_tls or TlsFiles()
        cfg.tls_cert, cfg.tls_key, cfg.tls_client_ca = tls.cert, tls.key, tls.client_ca
        cfg.metrics_tls_cert, cfg.metrics_tls_key = metrics_tls.cert, metrics_tls.key
        cfg.metrics_tls_client_ca = metrics_tls.client_ca
        if self.rate_limit is None:
            cfg.rate_limit = None
        else:
            cfg.rate_limit, cfg.rate_burst = self.rate_limit.rate, self.rate_limit.burst
        for group, target in self.latency_scrape.items():
            try:
                cfg.latency_scrape[group] = ScrapeTarget(**target.model_dump())
            except ValueError as exc:
                raise ConfigError(f"{where}: latency_scrape.{group}: {exc}") from None
        return cfg


_REFUSED = {"token": "put the token in token_file or $RDTUNE_AGENT_TOKEN, not the config"}


def load_yaml(path: str | Path | None, environ: Mapping[str, str] | None = None) -> AgentConfig:
    """The agent's configuration from ``path`` (None: defaults) and ``RDTUNE_AGENT__*``
    variables; unknown keys and wrong types are refused (a typo must not pass silently)."""
    where = str(path) if path is not None else "configuration"
    model = configfile.load(
        AgentFile, path, env_prefix=ENV_PREFIX, environ=environ, refused=_REFUSED
    )
    return model.to_config(where)
