"""The agent bench's baseline is what it says: a bare grpcio server, answering the payload
sizes it is asked for on a unary call and on a stream (eval/bench/bare_grpc.py)."""

from __future__ import annotations

import asyncio

import pytest

from eval.bench.bare_grpc import BareClient, BareServer, request


@pytest.mark.parametrize("kind", ["sync", "aio"])
def test_bare_server_answers_the_sizes_asked_for(kind: str) -> None:
    server = BareServer(kind)
    client = BareClient(server.address)
    try:
        assert len(request(340, 1599)) == 340
        assert client.unary(request(340, 1599), timeout=10) == bytes(1599)
        for asked in (1263, 336, 0):  # one stream, several messages
            assert client.ask(request(4, asked)) == bytes(asked)
    finally:
        client.close()
        server.close()


@pytest.mark.parametrize("kind", ["sync", "aio"])
def test_a_closed_client_leaves_no_stream_task_behind(kind: str) -> None:
    # After a cancel, the stream's own grpc.aio task still waits for the call's last
    # events: a loop closed under it left the task pending (asyncio's "Task was destroyed
    # but it is pending!" in the bench's output) and its late events for a closed loop
    # ("Event loop is closed" in the callbacks of the next client's loop).
    server = BareServer(kind)
    try:
        client = BareClient(server.address)
        assert client.unary(request(340, 1599), timeout=10) == bytes(1599)
        assert client.ask(request(336, 1594)) == bytes(1594)
        client.close()
        assert client.loop.is_closed()
        assert not asyncio.all_tasks(client.loop)
    finally:
        server.close()
