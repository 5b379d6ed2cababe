"""Run the online tuner: a controller driving one node agent, behind the safety guard.

Every interval the tuner observes the node, decides with the controller (one of the
catalogue's heuristics, or policy:PATH for an exported learned policy, refused when its
encoder version or capabilities do not match the node), validates the plan, enforces the change
limits, and applies it atomically. An LC group missing its SLO for K intervals in a row
switches the node to the fallback controller until it has been stable again. While the
agent is unreachable the tuner retries with backoff and re-applies its allocation when the
agent is back. SIGTERM/SIGINT stop it cleanly (optionally restoring the allocation found
at start); if the tuner dies, the node keeps its last valid allocation.

Options given on the command line override the --config YAML file (see tuner/config.py and
docs/DEPLOY.md). Prometheus metrics are served on --metrics-listen.

Exit status: 0 stopped cleanly; 1 the agent refused; 2 a bad option or setting; 3 stopped,
but --restore-baseline could not put the baseline back (the summary says "restored": false).
"""

from __future__ import annotations

import argparse

from agent import connection
from agent.argtypes import positive_int, wait_seconds

EXIT_NOT_RESTORED = 3  # stopped, but --restore-baseline could not restore the baseline


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = __doc__.split("\n\n", 1)[1]
    parser.add_argument(
        "--controller",
        metavar="SPEC",
        help="a controller of the catalogue (see --list-controllers), NAME[key=value,...], "
        "policy:PATH (exported policy) or import:MODULE:CLASS; wins over the --config "
        "file's controller:",
    )
    parser.add_argument(
        "--calibrate",
        action="store_true",
        help="let a controller that calibrates (static, ubik, static_lc, coco, best_static) "
        "sweep this node at start instead of requiring its calibrated options",
    )
    parser.add_argument(
        "--config", metavar="FILE", help="configuration file: YAML, or TOML when it ends in .toml"
    )
    parser.add_argument(
        "--interval",
        dest="interval_s",
        type=wait_seconds,
        metavar="S",
        help="control interval in seconds (default: the config's interval_s, else 1.0)",
    )
    parser.add_argument(
        "--fallback",
        metavar="SPEC",
        help="SLO guard fallback controller, NAME[key=value,...] (default: the config's "
        "fallback, else static, strict ubik or eq: the first that needs no options; the "
        "config's fallback_options apply to the config's fallback only)",
    )
    parser.add_argument(
        "--metrics-listen",
        metavar="ADDR",
        help="Prometheus host:port (default 127.0.0.1:9465; '' disables)",
    )
    parser.add_argument("--log-json", action="store_true", default=None, help="JSON lines logs")
    parser.add_argument(
        "--restore-baseline",
        action="store_true",
        default=None,
        help="on clean shutdown put back the allocation found at start",
    )
    parser.add_argument(
        "--intervals",
        type=positive_int,
        metavar="N",
        help="stop after N intervals (default: run on)",
    )
    connection.add_arguments(
        parser,
        address_default=None,
        address_help="agent address: host:port or unix:/path (default: the config's, else "
        "127.0.0.1:50051)",
        timeout_default=None,
        timeout_note=" (default: the config's agent.timeout_s, else 5)",
    )
    parser.add_argument(
        "--list-controllers",
        action="store_true",
        help="list the controllers (the catalogue rdtune eval uses too) and exit",
    )


def build_config(args: argparse.Namespace):
    from tuner.config import load_yaml

    flags = (
        "controller", "interval_s", "fallback", "metrics_listen", "log_json", "restore_baseline"
    )  # fmt: skip
    overrides = {n: getattr(args, n) for n in flags if getattr(args, n, None) is not None}
    # None: the defaults, with RDTUNE_TUNER__* overrides; the flags over both
    cfg = load_yaml(args.config, overrides=overrides)
    cfg.agent = connection.from_args(args, cfg.agent)
    cfg.validate()
    return cfg


def _check_policy_files(spec: str) -> None:
    """At start, not once the agent answers: an exported policy's files must be there (a
    missing policy ConfigMap would otherwise show only after the first connection)."""
    from pathlib import Path

    from tuner.controllers import ControllerError

    if not spec.startswith("policy:") or not spec.removeprefix("policy:"):
        return
    path = Path(spec.removeprefix("policy:"))
    # An optional ConfigMap that does not exist is mounted as an empty directory. What is
    # there is checked later by the policy loader, against the node.
    if not path.exists() or (path.is_dir() and not any(path.iterdir())):
        raise ControllerError(
            f"{spec}: no exported policy there (nothing at that path; an 'rdtune export' "
            "directory, e.g. the rdtune-policy ConfigMap mounted)"
        )


def _warn_of_another_cadence(spec: str, options: dict | None, interval_s: float) -> None:
    """One warning, at start, when an exported policy will decide at another cadence than
    its card says it was trained at: its features (rates, deltas) and its shield's counts
    of intervals (give_up, retry) then mean other times. Said, not refused: the cadence is
    the operator's choice (``decide_s`` sets the policy's own)."""
    import logging
    import math

    from models.card import ModelCard, PolicyError, trained_interval_s
    from models.catalogue import ControllerSpec, decide_s_of

    parsed = ControllerSpec.parse(spec).with_options(options or {})
    if parsed.name != "policy":
        return
    try:
        trained = trained_interval_s(ModelCard.read(parsed.options["path"]).env)
    except (PolicyError, KeyError):  # check() refused a card that cannot be read
        return
    decide_s = parsed.options.get("decide_s")
    runs = interval_s if decide_s is None else decide_s_of(decide_s)
    if trained is None or math.isclose(runs, trained, rel_tol=1e-6):
        return
    logging.getLogger("rdtune.tuner").warning(
        "the policy %s was trained deciding every %g s and will decide every %g s here; its "
        "features and its shield's interval counts then mean other times: give it "
        "decide_s=%g (controller_options) or --interval %g",
        parsed.options["path"],
        trained,
        runs,
        trained,
        trained,
        extra={"event": "cadence", "trained_interval_s": trained, "decide_s": runs},
    )


def run(args: argparse.Namespace) -> int:
    import json
    import logging
    import signal
    import sys
    import threading

    from models.catalogue import describe
    from tuner.config import ConfigError
    from tuner.controllers import ControllerError, build, check, fallbacks

    if args.list_controllers:
        print(describe())
        return 0
    try:
        cfg = build_config(args)
        if not cfg.controller:
            raise ConfigError(
                "no controller: give --controller SPEC, or controller: in the --config file "
                "(see --list-controllers)"
            )
        spec = cfg.controller
        backup = fallbacks(cfg.fallback, cfg.fallback_options)
        _check_policy_files(spec)
        check(spec, cfg.controller_options)  # not left until the agent answers
    except (ConfigError, ControllerError) as exc:
        print(f"rdtune tune: {exc}", file=sys.stderr)
        return 2
    if cfg.log_json:
        from tuner.logs import use_json_logs

        use_json_logs(logging.INFO)
    elif logging.getLogger().level > logging.INFO:
        logging.getLogger("rdtune.tuner").setLevel(logging.INFO)
    _warn_of_another_cadence(spec, cfg.controller_options, cfg.interval_s)

    from agent.errors import NodeError
    from agent.server.errors import WrongPeer
    from tuner.metrics import TunerMetrics
    from tuner.service import Tuner

    metrics = TunerMetrics()
    http = None
    endpoint = cfg.metrics_endpoint()
    if endpoint is not None:
        try:  # off loopback, validate() required TLS and a token
            http = endpoint.serve(metrics.registry)
        except (OSError, ValueError) as exc:  # a bind error; an unreadable token file
            print(
                f"rdtune tune: cannot serve metrics on {cfg.metrics_listen}: {exc}", file=sys.stderr
            )
            return 2
        host = cfg.metrics_listen.rpartition(":")[0]
        print(
            f"rdtune tune: metrics on {endpoint.scheme}://{host}:{http.server_port}/metrics",
            flush=True,
        )

    def controller(node):
        return build(
            spec,
            node,
            cfg.controller_options,
            interval_s=cfg.interval_s,
            calibrate=args.calibrate,
        )

    tuner = Tuner(cfg.agent.connect, controller, cfg, backup, metrics)
    stop = threading.Event()

    def on_signal(signum, frame) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(f"rdtune tune: {spec} on {cfg.agent.address}", flush=True)
    code, restored = 0, None
    try:
        code = tuner.run(stop, args.intervals)
    except (ControllerError, ConfigError, WrongPeer) as exc:
        print(f"rdtune tune: {exc}", file=sys.stderr)
        code = 2
    except NodeError as exc:
        print(f"rdtune tune: the agent refused: {exc}", file=sys.stderr)
        code = 1
    except Exception as exc:  # a bug: its traceback logged, the node restored, the summary said
        logging.getLogger("rdtune.tuner").exception("stopped by an unexpected error")
        print(f"rdtune tune: unexpected error: {type(exc).__name__}: {exc}", file=sys.stderr)
        code = 1
    finally:
        restored = tuner.shutdown()
        if http is not None:
            http.shutdown()
            http.server_close()
    summary = {
        "intervals": tuner.intervals,
        "switches": [  # the last ones (tuner.service.KEPT_SWITCHES)
            {"to_fallback": s.to_fallback, "groups": list(s.groups)} for s in tuner.switches
        ],
        "switch_count": tuner.switches.count,
        "dropped": tuner.drop_log.total,  # plans the guard or the node refused
        "controller": tuner.primary.name if tuner.primary else None,
        "fallback": tuner.fallback.name,
    }
    if restored is not None:
        summary["restored"] = restored
    print(f"rdtune tune: stopped {json.dumps(summary)}", flush=True)
    if code == 0 and restored is False:
        return EXIT_NOT_RESTORED  # the node is left split for workloads nobody tunes
    return code
