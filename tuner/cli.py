"""The ``rdtune`` command line: one entry point, one subcommand per capability.

Each subcommand lives next to the code it drives, in a module exposing
``add_arguments(parser)`` and ``run(args) -> int``; this file only lists them. Those
modules keep heavy imports (torch, ray, grpc) inside ``run`` so ``rdtune --help`` is fast.

Bad input never ends in a traceback: a wrong option, a refused configuration file, an
input file that is missing, unreadable or unusable (a trace, a checkpoint, saved results)
or a controller spec that cannot be built is one line naming it (status 2); a failure while
the command runs (a controller this node cannot run, an agent that cannot be reached or
refuses, a write that fails, an optional extra it cannot run without) is one line saying so
(status 1; ``-vv`` logs the traceback too), and a reader that stops early
(``rdtune ... | head``) ends the command quietly. Ctrl-C and SIGTERM stop a command
the same way, its cleanup run, with one line and the status a shell reports for the signal
(130, 143; agent/interrupt.py).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import signal
import sys
from collections.abc import Collection, Sequence

log = logging.getLogger("rdtune.cli")


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line: what is wrong and where to look."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (see '{self.prog} --help')\n")

    def parse_args(self, args=None, namespace=None):
        # argparse leaves options no subcommand knows to the top parser, whose error would
        # send the user to 'rdtune --help': the command they ran says it instead.
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            _chosen_parser(self, ns).error(f"unrecognized arguments: {' '.join(extras)}")
        return ns

    def format_help(self) -> str:
        # Descriptions and epilogs are module docstrings: their reST literals
        # (``--backend sim``) read as plain text on a terminal.
        return super().format_help().replace("``", "")


def _chosen_parser(parser: argparse.ArgumentParser, ns: argparse.Namespace):
    """The (sub)command's parser ``ns`` was parsed by: the deepest chosen subparser."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(getattr(ns, action.dest, None) or "")
            if chosen is not None:
                return _chosen_parser(chosen, ns)
    return parser


# name -> (module, one-line help). Order is the order shown by --help.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("eval.demo", "run the built-in demo: controllers head to head on a simulated node"),
    "eval": ("eval.cli", "compare controllers on a suite of scenarios; report with plots"),
    "bench": ("eval.bench.cli", "measure speed: simulator, env, agent RPC, controllers, tuner"),
    "agent": ("agent.server.cli", "serve a node (simulated or resctrl) over gRPC"),
    "emulate-resctrl": ("agent.emulator.cli", "mount an emulated resctrl filesystem (FUSE)"),
    "describe": ("agent.describe", "print a node's capabilities and own groups"),
    "tune": ("tuner.tune", "run the online tuner: a controller driving a node agent, guarded"),
    "status": ("tuner.status", "print a node's live allocation and the tuner's key metrics"),
    "trace": ("training.trace_cli", "record, inspect and export traces (offline training data)"),
    "train": ("training.cli", "train a policy (PPO / MaskablePPO; Ray sweeps with --sweep)"),
    "export": ("training.export", "export a trained run to ONNX + a model card"),
}


# Commands that stop on SIGTERM their own way: the agent and the tuner gracefully (their
# restore), the resctrl emulator through libfuse's loop (whose handlers go in only where
# none is set; a Python one would wait for a loop that never returns to Python).
OWN_SIGTERM = frozenset({"agent", "tune", "emulate-resctrl"})


def build_parser(commands: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``commands``, only those subcommands get their options
    (their modules imported): the others are listed by name and help, so one command's
    start does not pay for importing every other's module (~0.5 s of CPU)."""
    parser = Parser(
        prog="rdtune",
        description=(
            "rdtune splits a server's last-level cache ways (Intel CAT / AMD L3 QoS) and "
            "memory bandwidth (Intel MBA) among its workloads, so latency-critical services "
            "meet their tail-latency SLOs while batch jobs share the rest fairly."
        ),
        epilog="Run 'rdtune COMMAND --help' for a command's options.",
    )
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        if commands is not None and name not in commands:
            sub.add_parser(name, help=help_text, description=help_text)
            continue
        module = importlib.import_module(module_name)
        cmd = sub.add_parser(name, help=help_text, description=module.__doc__.split("\n\n")[0])
        module.add_arguments(cmd)
        cmd.set_defaults(_module=module)
    return parser


def _chosen(argv: Sequence[str]) -> set[str]:
    """The subcommand ``argv`` names (its first word that is not an option), if any."""
    word = next((a for a in argv if not a.startswith("-")), None)
    return {word} if word in COMMANDS else set()


def _command(args: argparse.Namespace) -> str:
    sub = getattr(args, "trace_command", None)
    return f"rdtune {args.command}" + (f" {sub}" if sub else "")


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:  # before a command ran (its modules loading): nothing to say
        print("rdtune: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
    except BrokenPipeError:
        # The reader went away (| head): stop quietly, and keep Python's final flush of
        # stdout from failing again at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # what a shell reports for a command killed by SIGPIPE


def _main(argv: Sequence[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(_chosen(argv)).parse_args(argv)
    level = (logging.WARNING, logging.INFO, logging.DEBUG)[min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from agent.errors import NodeError
    from agent.interrupt import INTERRUPTED, TERMINATED, terminate_as_interrupt, terminated

    own = args.command in OWN_SIGTERM
    try:
        with contextlib.nullcontext() if own else terminate_as_interrupt():
            return int(args._module.run(args) or 0)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (Terminated): cleanup has run
        # A command may say what it kept: KeyboardInterrupt("the intervals so far are in X").
        stopped = terminated(exc)
        kept = f"; {exc}" if str(exc) else ""
        print(
            f"{_command(args)}: {'terminated' if stopped else 'interrupted'}{kept}", file=sys.stderr
        )
        return TERMINATED if stopped else INTERRUPTED
    except NodeError as exc:  # the agent is unreachable or refused the request
        log.debug("traceback", exc_info=True)
        where = f"agent {args.agent}: " if getattr(args, "agent", None) else ""
        print(f"{_command(args)}: {where}{exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        raise
    except (ValueError, OSError) as exc:  # a refused setting or an unreadable file
        log.debug("traceback", exc_info=True)
        print(f"{_command(args)}: {exc}", file=sys.stderr)
        return 2 if _is_usage_error(exc) else 1


def _is_usage_error(exc: Exception) -> bool:
    """Whether ``exc`` is the operator's input refused (a configuration file, a controller
    spec) rather than something the node or the system did; commands that do not sort
    their errors themselves still exit 2 for it."""
    from agent.configfile import ConfigError
    from models.setup import ControllerError, Unavailable

    return isinstance(exc, ConfigError | ControllerError) and not isinstance(exc, Unavailable)


if __name__ == "__main__":
    sys.exit(main())
