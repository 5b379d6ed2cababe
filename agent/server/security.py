"""What the agent lets in: listen-address rules, bearer tokens, per-client rate limits.

Secure by default (developers' guide): the agent listens on loopback or a Unix socket; any
other address needs TLS *and* a token, or the agent refuses to start. Tokens are checked by
a server interceptor with a constant-time compare; the gRPC health service is exempt so
orchestrators can probe it. Rate limits are token buckets per client host (the peer address
without its port), answered with RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import hmac
import inspect
import ipaddress
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from agent.address import split_address
from agent.configfile import ConfigError
from agent.connection import TOKEN_ENV, read_token  # noqa: F401  (the agent's modules use them)
from agent.server.errors import Aborted, RateLimited, abort, abort_with
from agent.server.metrics import waited_seconds
from agent.throttle import LogThrottle, held_back

# The one method a peer without the token may call: kubelet's probes use Check. Watch is
# a stream held open as long as the peer likes, so unauthenticated Watches could take every
# concurrent-RPC slot from the tuner; it needs the token as every other method does.
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
UNAUTHENTICATED_TEXT = "missing or wrong bearer token (send 'authorization: Bearer <token>')"
_log = logging.getLogger("agent.server")


@dataclass(frozen=True)
class ListenAddress:
    """Where the server listens: ``host:port`` or ``unix:/path``."""

    raw: str
    unix_path: str | None
    host: str | None
    port: int | None

    @property
    def loopback(self) -> bool:
        if self.unix_path is not None:
            return True
        host = (self.host or "").strip("[]")
        if host == "localhost":
            return True
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False  # a name or 0.0.0.0-like wildcard: treat as remote

    def grpc_target(self, port: int | None = None) -> str:
        """The address string for ``server.add_*_port`` (or a client channel)."""
        if self.unix_path is not None:
            return f"unix:{self.unix_path}"
        return f"{self.host}:{self.port if port is None else port}"


def parse_listen(address: str) -> ListenAddress:
    address = address.strip()
    path, host, port = split_address(address, "listen address", min_port=0)
    return ListenAddress(address, path, host, port)


def check_exposure(
    listen: ListenAddress,
    tls: bool,
    token: str | None,
    tls_from: str = "--tls-cert/--tls-key",
    unix: bool = True,
) -> None:
    """Refuse a non-loopback listener without TLS and a bearer token (``tls_from``: where
    TLS is configured, for the message; ``unix``: whether a unix socket could be used
    instead, for the hint)."""
    if listen.loopback:
        return
    missing = [what for what, ok in ((f"TLS ({tls_from})", tls), ("a token", token)) if not ok]
    if missing:
        instead = "127.0.0.1 or a unix: socket" if unix else "127.0.0.1"
        raise ConfigError(
            f"refusing to listen on non-loopback address {listen.raw!r} without "
            f"{' and '.join(missing)}; use {instead}, or configure them"
        )


class RateLimiter:
    """Token buckets per client key: ``rate`` requests/s sustained, ``burst`` at once."""

    MAX_CLIENTS = 10_000

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic):
        if rate <= 0 or burst < 1:
            raise ConfigError("rate limit needs rate > 0 and burst >= 1")
        self.rate, self.burst, self._clock = float(rate), float(burst), clock
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def allow(self, key: str) -> bool:
        now = self._clock()
        with self._lock:
            tokens, last = self._buckets.get(key, (self.burst, now))
            tokens = min(self.burst, tokens + (now - last) * self.rate)
            ok = tokens >= 1.0
            if ok:
                tokens -= 1.0
            if key not in self._buckets and len(self._buckets) >= self.MAX_CLIENTS:
                # Forget clients whose bucket is full again: they lose nothing by it.
                full = [
                    k
                    for k, (t, s) in self._buckets.items()
                    if t + (now - s) * self.rate >= self.burst
                ]
                for k in full:
                    del self._buckets[k]
            self._buckets[key] = (tokens, now)
            return ok

    def retry_after(self, key: str) -> float:
        """Seconds until ``key``'s bucket holds a request again."""
        now = self._clock()
        with self._lock:
            tokens, last = self._buckets.get(key, (self.burst, now))
        return max(0.0, 1.0 - min(self.burst, tokens + (now - last) * self.rate)) / self.rate


def client_key(peer: str) -> str:
    """A peer string (``ipv4:1.2.3.4:5678``) without its port: one key per client host."""
    if peer.startswith(("ipv4:", "ipv6:")):
        return peer.rpartition(":")[0]
    return peer


# Methods that answer an undecodable frame in their own response stream.
IN_STREAM_ERRORS = frozenset({"/rdtune.v1.NodeAgent/Session"})

# (method, status code name, seconds: None for a stream, counted but not timed)
RpcObserver = Callable[[str, str, float | None], None]


class BadFrame:
    """A request body that did not decode: what the handler gets instead of a message, so
    the agent answers INVALID_ARGUMENT itself (grpcio would answer INTERNAL and log a
    traceback per frame, and on a stream send a second status that can hang shutdown)."""

    __slots__ = ("error", "size")

    def __init__(self, error: Exception, size: int) -> None:
        self.error, self.size = error, size

    def message(self, method: str) -> str:
        name = method.rsplit("/", 1)[-1]
        return f"undecodable {name} request ({self.size} bytes): {self.error}"


def _tolerant(deserializer):
    """``deserializer`` returning a :class:`BadFrame` instead of raising."""
    if deserializer is None:
        return None

    def decode(raw: bytes):
        try:
            return deserializer(raw)
        except Exception as exc:  # DecodeError, or anything a corrupt body provokes
            return BadFrame(exc, len(raw))

    return decode


class BadFrameLog:
    """Logs undecodable frames at most once per client host and ``every_s`` (default a
    minute), with the number left unlogged meanwhile: a hostile or broken peer cannot flood
    the log."""

    def __init__(self, every_s: float = 60.0) -> None:
        self._throttle = LogThrottle(every_s)

    @property
    def total(self) -> int:
        return self._throttle.total

    def note(self, peer: str, text: str) -> None:
        key = client_key(peer)
        quiet = self._throttle.admit(key)
        if quiet is not None:
            _log.warning("bad frame from %s: %s%s", key, text, held_back(quiet))


class GuardInterceptor(grpc.aio.ServerInterceptor):
    """Authentication, rate limiting and per-RPC metrics for every method (grpc.aio).

    Args:
        token: the bearer token clients must send (``authorization: Bearer <token>``), or
            None for no authentication (loopback only, enforced by :func:`check_exposure`).
        limiter: a :class:`RateLimiter`, or None.
        observe: called with (method, status code name, seconds) after every RPC.
        bad_frames: where undecodable request bodies are counted and logged; they are
            answered INVALID_ARGUMENT (a Session answers them in its stream).
    """

    def __init__(
        self,
        token: str | None = None,
        limiter: RateLimiter | None = None,
        observe: RpcObserver | None = None,
        bad_frames: BadFrameLog | None = None,
    ) -> None:
        self._expected = token.encode() if token else None
        self._limiter = limiter
        self._observe = observe
        self.bad_frames = bad_frames or BadFrameLog()
        # (method, authorised) -> (handler, guarded handler): wrapping builds closures and a
        # new handler, and the service's handler for a method is the same object each call.
        # Bounded by the registered methods (x2).
        self._guarded: dict[tuple[str, bool], tuple] = {}

    def _authorised(self, metadata) -> bool:
        if self._expected is None:
            return True
        for key, value in metadata or ():
            if key == "authorization":
                given = value.encode() if isinstance(value, str) else value
                # the scheme is case-insensitive (RFC 7235 section 2.1), as at /metrics
                scheme, _, credentials = given.partition(b" ")
                right = hmac.compare_digest(credentials, self._expected)
                return scheme.lower() == b"bearer" and right
        return False

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        authorised = method == HEALTH_CHECK or self._authorised(
            handler_call_details.invocation_metadata
        )
        key = (method, authorised)
        cached = self._guarded.get(key)
        if cached is not None and cached[0] is handler:
            return cached[1]
        if authorised:
            guarded = _wrap(handler, lambda fn: self._guard(fn, method, handler))
        else:
            guarded = self._refusal(method, handler)
        self._guarded[key] = (handler, guarded)
        return guarded

    def _refusal(self, method: str, handler) -> grpc.RpcMethodHandler:
        """A handler that answers UNAUTHENTICATED at once. It takes its request as a stream
        it never reads: grpc.aio reads a unary request before it calls the handler, so a
        peer without the token that opens calls and never sends their request would hold
        every concurrent-RPC slot (``max_concurrent_rpcs``) and lock the real clients out."""
        finish = self._finish

        async def refuse(requests, context):
            finish(method, context, time.perf_counter(), grpc.StatusCode.UNAUTHENTICATED)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_TEXT)

        if handler.response_streaming:
            factory = grpc.stream_stream_rpc_method_handler
        else:
            factory = grpc.stream_unary_rpc_method_handler
        return factory(refuse, response_serializer=handler.response_serializer)

    def _bad(self, context, method: str, frame: BadFrame) -> None:
        text = frame.message(method)
        self.bad_frames.note(context.peer(), text)
        abort_with(context, grpc.StatusCode.INVALID_ARGUMENT, text)

    async def _frames(self, requests, context, method: str):
        """A request stream whose undecodable frames end the call with INVALID_ARGUMENT."""
        async for request in requests:
            if type(request) is BadFrame:
                self._bad(context, method, request)
            yield request

    def _check(self, request, context, method: str, streaming: bool):
        """The request as the handler gets it, or Aborted (rate, undecodable); the token
        was checked before (:meth:`_refusal`)."""
        limiter = self._limiter
        if limiter is not None:
            client = client_key(context.peer())
            if not limiter.allow(client):
                abort(context, RateLimited(limiter.rate, limiter.retry_after(client)))
        if streaming:  # Session answers BadFrames in its own stream
            return request if method in IN_STREAM_ERRORS else self._frames(request, context, method)
        if type(request) is BadFrame:
            self._bad(context, method, request)
        return request

    def _finish(
        self, method: str, context, started: float | None, code, waited: float = 0.0
    ) -> None:
        """Report the RPC: its duration since ``started`` less ``waited`` (the interval a
        Step let pass), or none (``started`` None: a stream, which lasts as its client)."""
        if self._observe is None:
            return
        if code is None:
            code = context.code() or grpc.StatusCode.OK
        name = code.name if isinstance(code, grpc.StatusCode) else str(code)
        seconds = None if started is None else time.perf_counter() - started - waited
        self._observe(method, name, seconds)

    def _guard(self, fn, method: str, handler):
        """``fn`` wrapped: as a coroutine function, or as an async generator function when
        it is one (grpc.aio calls each kind its own way). An Aborted is counted before its
        status is sent: a client that sees the answer finds it in the metrics (grpc.aio
        sends the status inside context.abort)."""
        streams_in = handler.request_streaming
        check, finish = self._check, self._finish

        if inspect.isasyncgenfunction(fn):

            async def streaming(request, context):
                started = None  # streams are counted, not timed
                try:
                    request = check(request, context, method, streams_in)
                    async for response in fn(request, context):
                        yield response
                except Aborted as stop:
                    finish(method, context, started, stop.code)
                    await context.abort(stop.code, stop.message)
                except BaseException:
                    finish(method, context, started, context.code() or grpc.StatusCode.UNKNOWN)
                    raise
                finish(method, context, started, None)

            return streaming

        async def call(request, context):
            started = None if streams_in else time.perf_counter()
            try:
                request = check(request, context, method, streams_in)
                response = await fn(request, context)
            except Aborted as stop:
                finish(method, context, started, stop.code)
                await context.abort(stop.code, stop.message)
            except BaseException:
                finish(method, context, started, context.code() or grpc.StatusCode.UNKNOWN)
                raise
            finish(method, context, started, None, waited_seconds(response))
            return response

        return call


def _wrap(handler: grpc.RpcMethodHandler, guard) -> grpc.RpcMethodHandler:
    """The same handler with its behaviour run through ``guard``."""
    kinds = (
        ("unary_unary", grpc.unary_unary_rpc_method_handler),
        ("unary_stream", grpc.unary_stream_rpc_method_handler),
        ("stream_unary", grpc.stream_unary_rpc_method_handler),
        ("stream_stream", grpc.stream_stream_rpc_method_handler),
    )
    for attr, factory in kinds:
        fn = getattr(handler, attr)
        if fn is not None:
            return factory(
                guard(fn),
                request_deserializer=_tolerant(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
    return handler
