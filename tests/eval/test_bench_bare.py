"""The agent bench's baseline is what it says: a bare grpcio server, answering the payload
sizes it is asked for on a unary call and on a stream (eval/bench/bare_grpc.py)."""

from __future__ import annotations

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
