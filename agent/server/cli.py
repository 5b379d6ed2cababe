"""Serve a node (simulated or real resctrl) over gRPC: the rdtune node agent.

The agent exposes one Node -- a simulated server (``--backend sim``, the default, runs
anywhere) or this machine's resctrl (``--backend resctrl``) -- to tuners, environments and
evaluation runs on this or other hosts, with health checking, reflection and a Prometheus
metrics endpoint. It listens on 127.0.0.1 (or a unix: socket) unless told otherwise; any
other address requires TLS and a bearer token (--token-file or $RDTUNE_AGENT_TOKEN).
SIGTERM/SIGINT shut it down gracefully (in-flight applies finish; groups stay).

Options given on the command line override the --config YAML file (see
agent/server/config.py for its keys).
"""

from __future__ import annotations

import argparse

from agent.argtypes import non_negative_float, non_negative_int, positive_float


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = __doc__.split("\n\n", 1)[1]
    parser.add_argument(
        "--config", metavar="FILE", help="configuration file: YAML, or TOML when it ends in .toml"
    )
    be = parser.add_argument_group("backend")
    be.add_argument("--backend", choices=("sim", "resctrl"), help="node to serve (default sim)")
    be.add_argument(
        "--scenario",
        metavar="NAME",
        help="sim: a built-in scenario (--list-scenarios) or a scenario YAML file to start "
        "with (default: default)",
    )
    be.add_argument("--seed", type=non_negative_int, help="sim: random seed (default 0)")
    be.add_argument(
        "--no-auto-groups",
        dest="auto_groups",
        action="store_false",
        default=None,
        help="sim: start with no groups (clients create them)",
    )
    be.add_argument("--root", metavar="PATH", help="resctrl: mount point (default /sys/fs/resctrl)")
    be.add_argument(
        "--state-dir",
        metavar="DIR",
        help="resctrl: where the agent records its own groups (default $RDTUNE_STATE_DIR, "
        "else /var/lib/rdtune for root, else $XDG_STATE_HOME/rdtune or ~/.local/state/rdtune)",
    )
    be.add_argument(
        "--runtime-class",
        metavar="NAME",
        action="append",
        dest="runtime_classes",
        help="resctrl: an RDT class the container runtime creates and puts annotated pods "
        "into; clients adopt it by name (repeatable; docs/DEPLOY.md)",
    )
    be.add_argument(
        "--memory-bandwidth-gbps",
        metavar="GBPS",
        type=positive_float,
        help="resctrl: an L3 domain's achievable peak memory bandwidth in GB/s, measured "
        "(e.g. Intel MLC --max_bandwidth); the kernel does not report it, and policies "
        "read each group's bandwidth as a share of it (docs/DEPLOY.md)",
    )
    net = parser.add_argument_group("network and security")
    net.add_argument(
        "--listen",
        metavar="ADDR",
        help="host:port or unix:/path (default 127.0.0.1:50051; the resctrl backend needs a "
        "unix socket or a token: it runs as root and loopback admits every local user)",
    )
    net.add_argument(
        "--metrics-listen",
        metavar="ADDR",
        help="Prometheus endpoint host:port (default 127.0.0.1:9464; '' disables); a "
        "non-loopback address needs --metrics-tls-cert/--metrics-tls-key and "
        "--metrics-token-file (HTTPS with a bearer token)",
    )
    net.add_argument(
        "--health-listen",
        metavar="ADDR",
        help="serve only the gRPC health service on this host:port, plain TCP (kubelet's "
        "gRPC probes; the node API stays on --listen); default: off",
    )
    net.add_argument("--metrics-tls-cert", metavar="FILE", help="metrics certificate (PEM)")
    net.add_argument("--metrics-tls-key", metavar="FILE", help="metrics private key (PEM)")
    net.add_argument(
        "--metrics-tls-client-ca",
        metavar="FILE",
        help="require scrapers' client certificates signed by this CA (mTLS; needs "
        "--metrics-tls-cert/--metrics-tls-key)",
    )
    net.add_argument(
        "--metrics-token-file",
        metavar="FILE",
        help="bearer token scrapes must send (required off loopback)",
    )
    net.add_argument("--tls-cert", metavar="FILE", help="server certificate (PEM)")
    net.add_argument("--tls-key", metavar="FILE", help="server private key (PEM)")
    net.add_argument("--tls-client-ca", metavar="FILE", help="require client certs from this CA")
    net.add_argument("--token-file", metavar="FILE", help="file holding the bearer token")
    net.add_argument(
        "--max-message-bytes",
        type=int,
        metavar="N",
        help="largest message in bytes (default 4194304; 1024 to 2147483647)",
    )
    net.add_argument(
        "--rate-limit",
        type=positive_float,
        metavar="RPS",
        help="requests/s per client host (default 20000)",
    )
    net.add_argument(
        "--rate-burst",
        type=positive_float,
        metavar="N",
        help="burst allowance per client host (default 40000)",
    )
    net.add_argument(
        "--latency-scrape",
        action="append",
        metavar="GROUP=URL#METRIC",
        help="scrape an LC group's latency from a Prometheus histogram, e.g. "
        "web=http://127.0.0.1:8080/metrics#http_request_duration_seconds (repeatable)",
    )
    life = parser.add_argument_group("lifecycle")
    life.add_argument(
        "--restore-on-exit",
        action="store_true",
        default=None,
        help="on shutdown give every own group all ways and full bandwidth again",
    )
    life.add_argument(
        "--grace",
        dest="grace_s",
        type=non_negative_float,
        metavar="S",
        help="seconds in-flight calls get to finish at shutdown (default 5; at most 3600)",
    )
    parser.add_argument(
        "--list-scenarios", action="store_true", help="print the sim backend's scenarios and exit"
    )


_OVERRIDES = (
    "backend",
    "scenario",
    "seed",
    "auto_groups",
    "root",
    "state_dir",
    "runtime_classes",
    "memory_bandwidth_gbps",
    "listen",
    "metrics_listen",
    "health_listen",
    "metrics_tls_cert",
    "metrics_tls_key",
    "metrics_tls_client_ca",
    "metrics_token_file",
    "tls_cert",
    "tls_key",
    "tls_client_ca",
    "token_file",
    "max_message_bytes",
    "rate_limit",
    "rate_burst",
    "restore_on_exit",
    "grace_s",
)


def build_config(args: argparse.Namespace):
    from agent.server.config import load_yaml
    from agent.server.security import ConfigError

    cfg = load_yaml(args.config)  # None: the defaults, with RDTUNE_AGENT__* overrides
    for name in _OVERRIDES:
        value = getattr(args, name, None)
        if value is not None:
            setattr(cfg, name, value)
            cfg.explicit |= {name}
    if getattr(args, "rate_burst", None) is not None and cfg.rate_limit is None:
        raise ConfigError(
            "--rate-burst: the rate limit is off (rate_limit: null), so no burst applies; "
            "give --rate-limit too"
        )
    for spec in getattr(args, "latency_scrape", None) or ():
        cfg.latency_scrape.update(parse_scrape_flag(spec))
    try:
        cfg.resolve_token()
        cfg.validate()
    except ConfigError as exc:
        if args.config:  # checked once merged: the value may be the file's or a flag's
            raise ConfigError(f"{args.config} with the flags and environment: {exc}") from exc
        raise
    return cfg


def parse_scrape_flag(spec: str) -> dict:
    """``GROUP=URL#METRIC`` -> {group: ScrapeTarget} (a URL fragment is never sent)."""
    from agent.server.scrape import ScrapeTarget
    from agent.server.security import ConfigError

    group, sep, rest = spec.partition("=")
    url, hash_, metric = rest.rpartition("#")
    if not (sep and hash_ and group and url and metric):
        raise ConfigError(f"--latency-scrape {spec!r}: expected GROUP=URL#METRIC")
    try:
        return {group: ScrapeTarget(url=url, metric=metric)}
    except ValueError as exc:
        raise ConfigError(f"--latency-scrape {spec!r}: {exc}") from exc


def run(args: argparse.Namespace) -> int:
    import logging
    import os
    import signal
    import sys
    import threading

    from agent.server.security import ConfigError

    log = logging.getLogger("rdtune.agent")
    if args.list_scenarios:
        from agent.sim import scenario_names

        for name in scenario_names():
            print(name)
        return 0
    try:
        cfg = build_config(args)
    except ConfigError as exc:
        print(f"rdtune agent: {exc}", file=sys.stderr)
        return 2

    from agent.server.app import AgentServer, make_node

    try:
        node = make_node(cfg)
    except Exception as exc:  # a bad scenario name, no resctrl mount, ...
        print(f"rdtune agent: cannot start the {cfg.backend} backend: {exc}", file=sys.stderr)
        return 2
    try:
        server = AgentServer(node, cfg).start()
    except (ConfigError, RuntimeError) as exc:
        node.close()
        print(f"rdtune agent: {exc}", file=sys.stderr)
        return 2
    print(f"rdtune agent: serving {cfg.backend} on {server.address}", flush=True)
    if server.metrics_port:
        scheme = cfg.metrics_endpoint().scheme
        print(
            f"rdtune agent: metrics on {scheme}://{cfg.metrics_listen.rpartition(':')[0]}:"
            f"{server.metrics_port}/metrics",
            flush=True,
        )
    stop = threading.Event()

    def on_signal(signum, frame) -> None:
        log.info("signal %d: shutting down", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while not stop.wait(1.0):
        pass
    server.stop()
    if server.restored is not None:
        print(
            "rdtune agent: "
            + (
                "restored full allocations of own groups"
                if server.restored
                else "could NOT restore full allocations (see the log)"
            ),
            flush=True,
        )
    print("rdtune agent: stopped", flush=True)
    if not server.grpc_stopped:
        # Everything the stop does is done (restore, node closed, socket removed); what is
        # left is grpc waiting for a peer's connection that may never close.
        log.warning("a connection did not close: exiting without waiting for it")
        logging.shutdown()
        os._exit(0)
    return 0
