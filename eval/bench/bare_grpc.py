"""A bare grpcio server with no agent code: the floor under every agent RPC (``agent`` bench).

``python -m eval.bench.bare_grpc sync|aio`` serves two methods on raw bytes (no protobuf,
no interceptor, no node) on 127.0.0.1 and prints its port:

* ``/bare.Bare/Unary``: a unary call answered with ``response`` bytes;
* ``/bare.Bare/Stream``: a bidirectional stream answering each message with ``response``
  bytes, where ``response`` is the size a message asks for (its first four bytes).

``sync`` is grpcio's synchronous server (a thread pool), ``aio`` its asyncio server -- the
kind the agent runs -- in reader-writer style, as the agent's Session is.
:class:`BareClient` is the client side, made as RemoteNode makes its calls: a blocking
unary call on grpcio's synchronous API, and a grpc.aio stream on a private event loop that
the calling thread runs for each message (agent/client.py, ``_AioLink`` and ``_Session``).
"""

from __future__ import annotations

import asyncio
import struct
import subprocess
import sys
import time
from concurrent import futures

import grpc

UNARY = "/bare.Bare/Unary"
STREAM = "/bare.Bare/Stream"


def request(size: int, answer: int) -> bytes:
    """A message of ``size`` bytes (at least 4) asking for an answer of ``answer`` bytes."""
    return struct.pack("<I", answer) + bytes(max(0, size - 4))


def _answer(message: bytes) -> bytes:
    return bytes(struct.unpack_from("<I", message)[0])


def _serve_sync() -> None:
    def unary(message, context):
        return _answer(message)

    def stream(messages, context):
        for message in messages:
            yield _answer(message)

    handler = grpc.method_handlers_generic_handler(
        "bare.Bare",
        {
            "Unary": grpc.unary_unary_rpc_method_handler(unary),
            "Stream": grpc.stream_stream_rpc_method_handler(stream),
        },
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32), handlers=[handler])
    print(server.add_insecure_port("127.0.0.1:0"), flush=True)
    server.start()
    time.sleep(86400)


async def _serve_aio() -> None:
    async def unary(message, context):
        return _answer(message)

    async def stream(messages, context):
        while True:
            message = await context.read()
            if message is grpc.aio.EOF:
                return
            await context.write(_answer(message))

    handler = grpc.method_handlers_generic_handler(
        "bare.Bare",
        {
            "Unary": grpc.unary_unary_rpc_method_handler(unary),
            "Stream": grpc.stream_stream_rpc_method_handler(stream),
        },
    )
    server = grpc.aio.server(handlers=[handler])
    print(server.add_insecure_port("127.0.0.1:0"), flush=True)
    await server.start()
    await server.wait_for_termination()


class BareServer:
    """``python -m eval.bench.bare_grpc KIND`` as a process; its address."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "eval.bench.bare_grpc", kind], stdout=subprocess.PIPE, text=True
        )
        self.address = f"127.0.0.1:{int(self.proc.stdout.readline())}"

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


class BareClient:
    """Calls to a bare server: ``unary(message)`` and ``ask(message)`` on one open stream."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self.unary = self.channel.unary_unary(UNARY)
        self.loop = asyncio.new_event_loop()
        self._aio_channel, self._stream = self.loop.run_until_complete(self._open(address))

    @staticmethod
    async def _open(address: str):
        channel = grpc.aio.insecure_channel(address)  # made on the loop, as grpc.aio asks
        return channel, channel.stream_stream(STREAM)()

    async def _exchange(self, message: bytes) -> bytes:
        await self._stream.write(message)
        return await self._stream.read()

    def ask(self, message: bytes) -> bytes:
        """One message round trip on the stream."""
        return self.loop.run_until_complete(self._exchange(message))

    def close(self) -> None:
        self._stream.cancel()
        self.loop.run_until_complete(self._aio_channel.close())
        # The cancelled stream's own task still waits for the call's last events: closed
        # under it, the loop would leave it pending and its events no loop to run on.
        pending = asyncio.all_tasks(self.loop)
        if pending:
            self.loop.run_until_complete(asyncio.wait(pending, timeout=1.0))
        self.loop.close()
        self.channel.close()


if __name__ == "__main__":
    if sys.argv[1:] == ["sync"]:
        _serve_sync()
    elif sys.argv[1:] == ["aio"]:
        asyncio.run(_serve_aio())
    else:
        raise SystemExit("usage: python -m eval.bench.bare_grpc sync|aio")
