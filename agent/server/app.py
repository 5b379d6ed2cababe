"""Building, starting and stopping an agent: backend, gRPC server, health, reflection,
metrics endpoint, lifecycle.

:class:`AgentServer` is what ``rdtune agent`` runs and what the integration tests start on
loopback. The gRPC server is grpc.aio's, on an event loop in a thread of its own: every
RPC's protocol work runs on that one thread, without the thread-pool hand-offs of grpc's
synchronous server (docs/BENCHMARKS.md, "gRPC agent"); node calls that may block go to
worker threads (agent/server/service.py). The methods here are called from any thread.

Shutdown is graceful: health turns NOT_SERVING, new RPCs are refused, server streams end,
in-flight RPCs (applies included: they hold the node lock) get ``grace_s`` to finish; then
optionally every own group gets its full allocation back, and the node is closed. Groups
stay (the resctrl backend adopts them again on restart).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import fcntl
import functools
import itertools
import logging
import os
import socket
import ssl
import stat
import threading
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2_grpc

from agent.address import UNIX_PATH_MAX, split_address
from agent.connection import warn_if_open
from agent.latency import LatencyRecorder
from agent.node import Node, as_clock
from agent.server import reflection
from agent.server.config import AgentConfig
from agent.server.metrics import AgentMetrics
from agent.server.scrape import HistogramScraper
from agent.server.security import (
    BadFrameLog,
    ConfigError,
    GuardInterceptor,
    RateLimiter,
    parse_listen,
)
from agent.server.service import Limits, NodeAgentServicer, NodeHost, SimulationServicer
from agent.server.watch import NOT_SERVING, SERVING, health_only_server, watch_node
from proto.rdtune.v1 import agent_pb2 as api
from proto.rdtune.v1 import agent_pb2_grpc as rpc

# The number in each agent's private socket name (".PID.N" beside the public path): distinct
# for every agent of this process, where the low bits of an object's id once named two
# agents alike (the second unlinked the first's socket), and the same N a killed process
# with this pid used, whose socket the bind then finds and removes.
_PRIVATE_NAMES = itertools.count()

log = logging.getLogger(__name__)

STOP_SLACK_S = 2.0  # what stop may take beyond the grace period

# What a hostile HTTP/2 peer on the gRPC port meets (tests/agent/server/test_http2_peers.py
# plays one with hand-made frames; docs/AGENT.md, "Robust edges").
HTTP2_OPTIONS = (
    # Streams one connection may have open (grpc's default: no limit). Once a connection has
    # this many, grpc refuses its next streams (REFUSED_STREAM), and a stream counts until
    # the server has let go of it, reset or not: without the limit, a peer that opens
    # streams and resets them at once (CVE-2023-44487, "rapid reset") put thousands a
    # second on the agent's event loop and the real clients' calls failed. A client needs
    # far fewer: its calls beyond the limit wait on its side.
    ("grpc.max_concurrent_streams", 100),
    # No GOAWAY for pings sent "too often". grpc's ping policy closes such a connection,
    # but after a PING flood that path spun a core for as long as the peer kept the
    # connection open, and grpc's server never finished stopping. Without it a flood costs
    # what any flood of control frames costs (the agent's other clients were served), and
    # grpc still hangs up on a peer that leaves its PING acks unread.
    ("grpc.http2.max_ping_strikes", 0),
)

SERVICE_NAMES = tuple(
    api.DESCRIPTOR.services_by_name[name].full_name for name in ("NodeAgent", "Simulation")
)
SIMULATION_SERVICE = SERVICE_NAMES[1]


def make_node(cfg: AgentConfig, latency: LatencyRecorder | None = None) -> Node:
    """The backend the configuration names (imported here: only the chosen one loads)."""
    if cfg.backend == "sim":
        from agent.sim import DEFAULT_SCENARIO, SimNode, compile_kernels

        kwargs = {} if cfg.seed is None else {"seed": cfg.seed}
        node = SimNode(
            scenario=cfg.scenario or DEFAULT_SCENARIO, auto_groups=cfg.auto_groups, **kwargs
        )
        compile_kernels()  # before the agent listens, not in a client's first call
        return node
    if cfg.backend == "resctrl":
        from agent.pmc.limits import raise_nofile_limit
        from agent.resctrl import ResctrlNode

        raise_nofile_limit()  # its PMC counters take one fd per event per task
        kwargs = {} if cfg.state_dir is None else {"state_dir": cfg.state_dir}
        if cfg.memory_bandwidth_gbps is not None:
            kwargs["memory_bandwidth_bps"] = cfg.memory_bandwidth_gbps * 1e9
        return ResctrlNode(root=cfg.root, runtime_classes=cfg.runtime_classes, **kwargs)
    raise ConfigError(f"unknown backend {cfg.backend!r}")


def _read(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None


def _check_tls(cert: str, key: str, client_ca: str | None) -> None:
    """Refuse a certificate, key or client CA that TLS cannot use, naming the files (grpc
    reports any of them as a failure to bind the address)."""
    try:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        if client_ca:
            ctx.load_verify_locations(client_ca)
    except (OSError, ssl.SSLError) as exc:
        files = f"--tls-cert {cert}, --tls-key {key}" + (
            f", --tls-client-ca {client_ca}" if client_ca else ""
        )
        raise ConfigError(f"unusable TLS files ({files}): {exc}") from exc
    warn_if_open(key, "TLS key")  # once it is known to be a key


class AgentServer:
    """One node served over gRPC (plus the metrics endpoint).

    Args:
        node: the node to serve (the server closes it on stop when ``own_node``).
        cfg: listen address, security, limits; the backend fields are not used here.
        own_node: close the node on stop.
    """

    def __init__(self, node: Node, cfg: AgentConfig, *, own_node: bool = True) -> None:
        cfg.validate()
        self.cfg, self.node, self.own_node = cfg, node, own_node
        mba = node.capabilities().mba
        self.metrics = AgentMetrics(mba_mode=mba.mode) if mba else AgentMetrics()
        self.recorder = LatencyRecorder()
        scrapers = [
            HistogramScraper(group, target, self.recorder)
            for group, target in cfg.latency_scrape.items()
        ]
        limiter = RateLimiter(cfg.rate_limit, cfg.rate_burst) if cfg.rate_limit else None
        self.bad_frames = BadFrameLog()
        self.host = NodeHost(
            node,
            metrics=self.metrics,
            recorder=self.recorder,
            scrapers=scrapers,
            limits=Limits(
                max_streams=cfg.max_streams,
                max_sessions=cfg.max_sessions,
                max_waiting_steps=cfg.max_waiting_steps,
            ),
            limiter=limiter,
            bad_frames=self.bad_frames,
            workers=cfg.max_workers,
        )
        self.listen = parse_listen(cfg.listen)
        self.port: int | None = None
        self.metrics_port: int | None = None
        self._metrics_http = None
        self.health_port: int | None = None
        self._health_server: grpc.aio.Server | None = None
        self._socket_fd: int | None = None  # an O_PATH descriptor of the socket it made
        self._stopped = threading.Event()
        self._stop_lock = threading.Lock()
        self.restored: bool | None = None  # after stop: whether restore-on-exit succeeded
        # False after a stop grpc did not finish (a write pending to a peer that reads
        # nothing): freeing grpc's objects, at exit at the latest, then waits for ever.
        self.grpc_stopped = True

        self._guard = GuardInterceptor(
            cfg.token, limiter, self.metrics.observe_rpc, self.bad_frames
        )
        self._watch: asyncio.Future | None = None  # the node's health check (watch.py)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.server: grpc.aio.Server | None = None
        self.health: health.aio.HealthServicer | None = None

    # ------------------------------------------------------------------ the event loop

    def _submit(self, coro) -> concurrent.futures.Future:
        """Run ``coro`` on the server's loop (from any other thread)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _start_loop(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="rdtune-agent-loop", daemon=True
        )
        self._thread.start()

    def _end_loop(self, timeout: float = 2.0) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        deadline = time.monotonic() + timeout
        if thread.is_alive():
            # Tasks left on a stopped loop are destroyed pending, with an error logged each:
            # end them first (a session whose node call was interrupted at the grace's end).
            with contextlib.suppress(concurrent.futures.TimeoutError, RuntimeError):
                asyncio.run_coroutine_threadsafe(_end_tasks(), loop).result(timeout / 2)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(max(0.05, deadline - time.monotonic()))
        if not thread.is_alive():
            loop.close()

    async def _build(self) -> None:
        """The grpc.aio server and its services (on the loop: grpc.aio binds to it)."""
        cfg = self.cfg
        options = [
            ("grpc.max_receive_message_length", cfg.max_message_bytes),
            ("grpc.max_send_message_length", cfg.max_message_bytes),
            ("grpc.so_reuseport", 0),
            *HTTP2_OPTIONS,
        ]
        self.server = grpc.aio.server(
            interceptors=[self._guard],
            options=options,
            maximum_concurrent_rpcs=cfg.max_concurrent_rpcs,
        )
        rpc.add_NodeAgentServicer_to_server(NodeAgentServicer(self.host), self.server)
        rpc.add_SimulationServicer_to_server(SimulationServicer(self.host), self.server)
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable((*SERVICE_NAMES, health.SERVICE_NAME), self.server)
        self._bind()
        if self.cfg.health_listen:
            self._build_health()

    async def _serve(self) -> None:
        await self.server.start()
        if self._health_server is not None:
            await self._health_server.start()
        simulated = as_clock(self.host.node) is not None
        for name in ("", *SERVICE_NAMES):
            # a real node's Simulation service answers FAILED_PRECONDITION to every call
            serving = simulated or name != SIMULATION_SERVICE
            await self.health.set(name, SERVING if serving else NOT_SERVING)
        unusable = getattr(self.host.node, "unusable", None)
        if callable(unusable):  # ends with the loop's other tasks at the stop
            names = ("", SERVICE_NAMES[0])
            check = watch_node(unusable, self.health, names, self.cfg.node_check_s)
            self._watch = asyncio.ensure_future(check)

    async def _stop_serving(self, grace: float) -> None:
        await self.health.enter_graceful_shutdown()
        self.host.stop_streams()
        await self.server.stop(grace)

    async def _stop_health(self) -> None:
        await self._health_server.stop(None)

    @property
    def address(self) -> str:
        """A target a client can dial (the bound port filled in)."""
        return self.listen.grpc_target(self.port)

    def _bind(self) -> None:
        target = self.listen.grpc_target()
        public = None if self.listen.unix_path is None else Path(self.listen.unix_path)
        if public is None:
            _check_every_address_free(self.listen.raw, self.listen.host, self.listen.port)
        else:
            _check_socket_path(public)
            # grpc binds (and at its stop unlinks) a private name; the socket then takes
            # the public one by a link (_publish), which fails where another process's
            # socket is: neither grpc nor this agent ever unlinks a live one.
            private = private_name(public)
            if len(os.fsencode(private)) > UNIX_PATH_MAX:  # too long for a socket address
                private = public  # bound as it is: grpc may unlink it at its stop
            elif private.is_socket():
                private.unlink()  # left by a killed process that had this pid
            target = f"unix:{private}"
        if self.cfg.tls:
            _check_tls(self.cfg.tls_cert, self.cfg.tls_key, self.cfg.tls_client_ca)
            client_ca = _read(self.cfg.tls_client_ca)
            creds = grpc.ssl_server_credentials(
                [(_read(self.cfg.tls_key), _read(self.cfg.tls_cert))],
                root_certificates=client_ca,
                require_client_auth=client_ca is not None,
            )
            add = functools.partial(self.server.add_secure_port, target, creds)
        else:
            add = functools.partial(self.server.add_insecure_port, target)
        try:
            port = add()
        except RuntimeError as exc:  # grpc's "Failed to bind", naming the private path
            where = f"a socket in {public.parent}" if public is not None else self.listen.raw
            raise ConfigError(f"cannot listen on {self.listen.raw}: cannot bind {where}") from exc
        bound = port != 0 if public is None else private.is_socket()
        if not bound:
            raise ConfigError(f"cannot listen on {self.listen.raw} (address in use?)")
        self.port = port if public is None else None
        if public is not None:
            # Held open, the socket's inode stays allocated, so no file another process
            # puts at the path can carry its number: what the stop compares against.
            self._socket_fd = os.open(private, os.O_PATH | os.O_NOFOLLOW)
            # Private before its path is public and before the server starts: bind gave it
            # the umask's mode, and a peer connected meanwhile would stay connected.
            os.chmod(private, 0o600)
            if private != public:
                _publish(private, public)

    def start(self) -> AgentServer:
        self._start_loop()
        try:
            self._submit(self._build()).result()
            metrics = self.cfg.metrics_endpoint()
            if metrics is not None:
                try:  # off loopback, validate() made sure both TLS and a token are configured
                    self._metrics_http = metrics.serve(self.metrics.registry)
                except (OSError, ssl.SSLError, ConfigError) as exc:
                    raise ConfigError(f"cannot serve metrics on {metrics.listen}: {exc}") from exc
                self.metrics_port = self._metrics_http.server_port
            with self.host.lock:
                self.metrics.record_allocation(self.node.allocation())
            self._submit(self._serve()).result()
        except BaseException:
            for server in (self.server, self._health_server):
                if server is not None:
                    self._submit(server.stop(None)).result(5)
            if self._metrics_http is not None:
                self._metrics_http.shutdown()
                self._metrics_http.server_close()
            self._end_loop()
            self.host.close()
            self._remove_socket()
            raise
        log.info("agent serving %s on %s", self.cfg.backend, self.address)
        return self

    def _build_health(self) -> None:
        """The health service's Check alone on a plain TCP port: what kubelet's native
        gRPC probes dial (the pod's IP, no TLS, no token) while the node API stays on its
        Unix socket. It shares the main server's statuses, so it turns NOT_SERVING at
        shutdown too (a second grpc.aio server on the same loop)."""
        _, host, port = split_address(self.cfg.health_listen, "health_listen", min_port=0)
        _check_every_address_free(self.cfg.health_listen, host, port)
        self._health_server = health_only_server(self.health)
        try:
            port = self._health_server.add_insecure_port(self.cfg.health_listen)
        except RuntimeError:  # grpc's "Failed to bind" (newer grpc raises where older gave 0)
            port = 0
        if port == 0:
            raise ConfigError(f"cannot listen on {self.cfg.health_listen} (address in use?)")
        self.health_port = port

    def stop(self, grace: float | None = None) -> None:
        """Graceful shutdown within ``grace`` + 2 s; safe to call twice and from a signal
        handler's thread.

        Streams end at once (idle sessions and latency pushes are cancelled), in-flight
        calls get ``grace`` seconds, then grpc cancels the rest. Waiting for that is
        bounded too (a peer that broke its stream must not hold the agent), and restore-on-
        exit runs in any case, after the node lock is free or the time is up.
        """
        with self._stop_lock:
            if self._stopped.is_set() or self._loop is None:
                return
            grace = self.cfg.grace_s if grace is None else grace
            deadline = time.monotonic() + grace + STOP_SLACK_S
            try:
                self._submit(self._stop_serving(grace)).result(grace + STOP_SLACK_S / 2)
            except concurrent.futures.TimeoutError:
                self.grpc_stopped = False
                log.warning("RPCs still running %.3g s after shutdown began", grace + 1)
            # A call waiting for another tool's resctrl lock would write after "stopped".
            if callable(interrupt := getattr(self.node, "interrupt", None)):
                interrupt()
            if self.cfg.restore_on_exit:
                try:
                    self.host.restore_defaults(timeout=max(0.1, deadline - time.monotonic()))
                    self.restored = True
                    log.info("restored full allocations of own groups")
                except Exception as exc:
                    self.restored = False
                    log.error("restoring default allocations failed: %s", exc)
            if self._health_server is not None:
                try:
                    self._submit(self._stop_health()).result(1.0)
                except concurrent.futures.TimeoutError:
                    log.warning("the health port did not stop within 1 s")
            if self._metrics_http is not None:
                self._metrics_http.shutdown()
                self._metrics_http.server_close()
            self._end_loop(timeout=max(0.1, deadline - time.monotonic()))
            self.host.close()
            if self.own_node and self.host.lock.acquire(
                timeout=max(0.0, deadline - time.monotonic())
            ):
                try:
                    self.node.close()
                finally:
                    self.host.lock.release()
            self._remove_socket()
            self._stopped.set()

    def _remove_socket(self) -> None:
        """Remove this agent's Unix socket, never one another process put at the path
        since (a socket is replaced only when nothing answers on it, and another agent may
        have taken the path over after a failed start)."""
        fd, self._socket_fd = self._socket_fd, None
        if fd is None:
            return
        try:
            ours = os.fstat(fd)
            path = Path(self.listen.unix_path)
            if _file_id(path) == (ours.st_dev, ours.st_ino):
                path.unlink(missing_ok=True)
        finally:
            os.close(fd)

    def wait(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)

    def __enter__(self) -> AgentServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


async def _end_tasks(timeout_s: float = 0.5) -> None:
    """Cancel every other task of the running loop and wait for them (at most
    ``timeout_s``), taking their outcomes so that none is reported as never retrieved."""
    me = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=timeout_s)
    for task in tasks:
        if task.done() and not task.cancelled():
            task.exception()


def private_name(public: Path) -> Path:
    """A name for an agent's socket beside ``public`` that no other agent of this process
    binds (``.PID.N``): grpc binds it, and :func:`_publish` links it to ``public``."""
    return public.with_name(f".{os.getpid():x}.{next(_PRIVATE_NAMES):x}")


def _publish(private: Path, public: Path) -> None:
    """Give the bound socket ``private`` its public path: ``link()`` fails where anything
    is, so of two agents starting at once one gets the path and the other finds it live;
    a stale socket there is removed first, and only the one found stale: two agents that
    both found it stale would otherwise each remove it, the second the first's socket
    just linked there. Replacing holds an ``flock`` on the directory, so the check and the
    removal are one step for every agent."""
    try:
        for _ in range(3):
            try:
                os.link(private, public)
                return
            except FileExistsError:
                with _directory_lock(public.parent):
                    found = _file_id(public)
                    _check_socket_path(public)  # raises unless stale
                    if found is not None and _file_id(public) == found:
                        with contextlib.suppress(FileNotFoundError):
                            public.unlink()
        raise ConfigError(f"{public}: replaced again and again while starting; try again")
    finally:
        with contextlib.suppress(FileNotFoundError):
            private.unlink()


@contextlib.contextmanager
def _directory_lock(directory: Path):
    """An exclusive ``flock`` on ``directory`` while the block runs (held for a connect
    attempt at most); none where the directory cannot be opened for reading, and then
    the file-identity check alone guards the removal."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # the flock goes with it


def _check_every_address_free(raw: str, host: str | None, port: int | None) -> None:
    """Refuse a TCP listen address the agent cannot bind, saying why (grpc says only that
    it failed, on a log line of its own). A name that resolves to several addresses
    (``localhost``: 127.0.0.1 and ::1) is refused with the port taken on any one of them:
    grpc binds every address and succeeds if any bind does, so the agent would answer on
    ::1 while another process holds 127.0.0.1 (where a probe or a client dials). Port 0
    asks for a free port."""
    if not host or not port:
        return
    if host == "localhost":  # grpc's own resolution: both loopbacks, whatever /etc/hosts says
        found = [(socket.AF_INET, ("127.0.0.1", port)), (socket.AF_INET6, ("::1", port, 0, 0))]
    else:
        try:
            found = [
                (info[0], info[4])
                for info in socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
            ]
        except OSError:
            return  # grpc's own bind names an address it cannot resolve
    several = len({addr[0] for _, addr in found}) >= 2
    for family, addr in found:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as grpc binds
                if family == socket.AF_INET6:
                    probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                probe.bind(addr)
        except OSError as exc:
            if not several:
                why = os.strerror(exc.errno) if exc.errno else str(exc)
                raise ConfigError(f"cannot listen on {raw}: {why}") from exc
            if exc.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
                continue  # a family the host does not have (no IPv6): grpc skips it too
            raise ConfigError(
                f"cannot listen on {raw}: port {port} of {addr[0]} is in use (the name "
                f"stands for {len(found)} addresses, and grpc would serve on the others only)"
            ) from exc


def _check_socket_path(path: Path) -> None:
    """Refuse to listen at ``path`` when something other than a stale socket is there: a
    file that is not a socket, or a socket whose listener is alive (a second agent) or
    cannot be told dead. Only a refused connection marks a socket stale (its agent was
    killed); one that answers, times out or denies this user is left alone."""
    if not (path.exists() or path.is_symlink()):
        return
    if not stat.S_ISSOCK(path.lstat().st_mode):
        raise ConfigError(f"{path} exists and is not a socket; refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        return  # stale, or gone meanwhile
    except OSError as exc:
        raise ConfigError(
            f"{path}: cannot tell whether another process serves on this socket ({exc}); "
            "remove it if it is stale, or listen on another path"
        ) from exc
    finally:
        probe.close()
    raise ConfigError(
        f"{path}: another process is serving on this socket (a second agent?); "
        "stop it or listen on another path"
    )


def _file_id(path: Path) -> tuple[int, int] | None:
    """(device, inode) of ``path`` itself (None: absent): which file a path names now."""
    try:
        st = path.lstat()
    except OSError:
        return None
    return st.st_dev, st.st_ino
