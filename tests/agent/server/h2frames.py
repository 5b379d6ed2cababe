"""HTTP/2 frames built by hand, for tests that play a hostile peer on the agent's gRPC port.

Just enough of RFC 9113 to open streams, flood control frames and hold windows shut: the
client preface, 9-byte frame headers and the frame types the tests send. Header blocks use
HPACK's "literal header field without indexing, new name" form (RFC 7541 6.2.2: 0x00, then
the name and the value each as a 7-bit-prefixed length and raw bytes, no Huffman), so no
dynamic table is involved and every block decodes on its own.
"""

from __future__ import annotations

import socket
import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = (
    0x0,
    0x1,
    0x3,
    0x4,
    0x6,
    0x7,
    0x8,
    0x9,
)
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
CANCEL = 0x8  # RST_STREAM's error code for a stream the client gave up


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    """One frame: 24-bit length, type, flags, 31-bit stream id, payload."""
    return struct.pack(">I", len(payload))[1:] + struct.pack(">BBI", kind, flags, stream) + payload


def _hpack_int(value: int, prefix_bits: int = 7) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([value])
    out, value = [limit], value - limit
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    return bytes([*out, value])


def literal(name: bytes, value: bytes) -> bytes:
    """One header field, literal without indexing, new name, no Huffman."""
    return b"\x00" + _hpack_int(len(name)) + name + _hpack_int(len(value)) + value


def request_block(path: str, authority: str = "localhost", extra: dict | None = None) -> bytes:
    """A gRPC request's header block for ``path`` (e.g. /rdtune.v1.NodeAgent/Observe)."""
    fields = {
        b":method": b"POST",
        b":scheme": b"http",
        b":path": path.encode(),
        b":authority": authority.encode(),
        b"content-type": b"application/grpc",
        b"te": b"trailers",
        **(extra or {}),
    }
    return b"".join(literal(k, v) for k, v in fields.items())


def settings(**values: int) -> bytes:
    """A SETTINGS frame; keys are the setting ids as ``s<id>`` (s4=initial window)."""
    payload = b"".join(struct.pack(">HI", int(k[1:]), v) for k, v in values.items())
    return frame(SETTINGS, 0, 0, payload)


def settings_ack() -> bytes:
    return frame(SETTINGS, ACK, 0)


def ping(data: bytes = b"rdtune!!") -> bytes:
    return frame(PING, 0, 0, data)


def headers(stream: int, block: bytes, *, end_headers: bool = True, end_stream=False) -> bytes:
    flags = (END_HEADERS if end_headers else 0) | (END_STREAM if end_stream else 0)
    return frame(HEADERS, flags, stream, block)


def continuation(stream: int, block: bytes, *, end_headers: bool = False) -> bytes:
    return frame(CONTINUATION, END_HEADERS if end_headers else 0, stream, block)


def grpc_message(body: bytes = b"") -> bytes:
    """A gRPC length-prefixed message (uncompressed)."""
    return b"\x00" + struct.pack(">I", len(body)) + body


def data(stream: int, payload: bytes, *, end_stream: bool = False) -> bytes:
    return frame(DATA, END_STREAM if end_stream else 0, stream, payload)


def rst_stream(stream: int, code: int = CANCEL) -> bytes:
    return frame(RST_STREAM, 0, stream, struct.pack(">I", code))


def window_update(stream: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream, struct.pack(">I", increment))


def goaway(last_stream: int = 0, code: int = 0) -> bytes:
    return frame(GOAWAY, 0, 0, struct.pack(">II", last_stream, code))


def connect(host: str, port: int, *, preface: bool = True, timeout: float = 5.0) -> socket.socket:
    """A TCP connection to the agent, with the preface and an empty SETTINGS sent."""
    sock = socket.create_connection((host, port), timeout=timeout)
    if preface:
        sock.sendall(PREFACE + settings())
    return sock


def read_frames(sock: socket.socket, timeout: float = 0.05) -> list[tuple[int, int, int, bytes]]:
    """Whatever complete frames arrive within ``timeout`` as (type, flags, stream, payload);
    an empty list once the peer closed or nothing came."""
    sock.settimeout(timeout)
    buf = b""
    try:
        while chunk := sock.recv(65536):
            buf += chunk
    except (TimeoutError, BlockingIOError, ConnectionError):
        pass
    frames, pos = [], 0
    while len(buf) - pos >= 9:
        length = int.from_bytes(buf[pos : pos + 3], "big")
        kind, flags, stream = struct.unpack(">BBI", buf[pos + 3 : pos + 9])
        if len(buf) - pos - 9 < length:
            break
        frames.append((kind, flags, stream & 0x7FFFFFFF, buf[pos + 9 : pos + 9 + length]))
        pos += 9 + length
    return frames
