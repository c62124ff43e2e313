"""A minimal gRPC client over one HTTP/2 connection (h2c, prior knowledge) for simulating many agents
cheaply in one process. Benchmarks only: agents use `dlu_elastic.rendezvous.client.ElasticClient`.

Why: `rendezvous_scale.py` simulates thousands of agents in one process; gRPC's Python client costs
about 0.1 ms of CPU per call here, so the simulating process would compete with the server for
this machine's two cores far more than thousands of real agents on their own nodes do. This
client sends each call as what gRPC puts on the wire (a HEADERS frame with the method's path,
`content-type: application/grpc`, `te: trailers` and `grpc-timeout`, then DATA with the
length-prefixed message), honours the server's flow control, frame size and stream limit, and
reads each answer's message: about 0.03 ms of CPU per call with the protobuf work around it.

What it does not do: compression, TLS, streaming, reading response headers. A call succeeds when
its stream brings exactly one message and then ends (gRPC sends a message only with an OK
status; a refusal is headers only); anything else (a reset stream, a stream that ends without a
message, GOAWAY, a closed connection) fails the call with `H2CallError`, so the benchmark cannot
count a refused call as an answer.
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass, field

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
# frame types (RFC 9113 6)
_DATA = 0x0
_HEADERS = 0x1
_RST_STREAM = 0x3
_SETTINGS = 0x4
_PING = 0x6
_GOAWAY = 0x7
_WINDOW_UPDATE = 0x8
_CONTINUATION = 0x9
_END_STREAM, _ACK, _END_HEADERS, _PADDED, _PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
_SETTINGS_MAX_CONCURRENT_STREAMS, _SETTINGS_INITIAL_WINDOW_SIZE, _SETTINGS_MAX_FRAME_SIZE = 0x3, 0x4, 0x5
_DEFAULT_FRAME_SIZE = 16_384
_DEFAULT_WINDOW = 65_535
_MAX_WINDOW = 2**31 - 1


class H2CallError(Exception):
    """A call that did not end with exactly one message."""


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes((kind, flags)) + struct.pack(">I", stream) + payload


def _hpack_int(value: int, prefix_bits: int, first: int) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = [first | limit]
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _literal(name_index: int, value: str) -> bytes:
    """HPACK literal without indexing, name from the static table (RFC 7541 6.2.2)."""
    data = value.encode()
    return _hpack_int(name_index, 4, 0x00) + _hpack_int(len(data), 7, 0x00) + data


def _literal_new(name: str, value: str) -> bytes:
    out = b"\x00"
    for part in (name.encode(), value.encode()):
        out += _hpack_int(len(part), 7, 0x00) + part
    return out


def request_headers(authority: str, path: str, timeout_s: float) -> bytes:
    """The header block of a unary gRPC call (static-table names, no dynamic table, no Huffman)."""
    return b"".join(
        (
            b"\x83",  # :method POST (static index 3)
            b"\x86",  # :scheme http (static index 6)
            _literal(4, path),  # :path
            _literal(1, authority),  # :authority
            _literal(31, "application/grpc"),  # content-type
            _literal_new("te", "trailers"),
            _literal_new("grpc-timeout", f"{max(int(timeout_s * 1000), 1)}m"),
        )
    )


@dataclass
class _Stream:
    answer: asyncio.Future[bytes]
    body: bytearray = field(default_factory=bytearray)


class H2Channel(asyncio.Protocol):
    """One HTTP/2 connection carrying many concurrent unary gRPC calls. Use `connect`."""

    def __init__(self, authority: str, timeout_s: float) -> None:
        self._authority = authority
        self._timeout_s = timeout_s
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._streams: dict[int, _Stream] = {}
        self._next_stream = 1
        self._headers: dict[str, bytes] = {}
        self._send_window = _DEFAULT_WINDOW  # the connection's; each stream's is far above one message
        self._max_streams = _MAX_WINDOW
        self._max_frame = _DEFAULT_FRAME_SIZE
        self._stream_window = _DEFAULT_WINDOW  # what one stream may send (no stream WINDOW_UPDATEs)
        self._room = asyncio.Event()  # set while the window and the stream limit leave room
        self._room.set()
        self._settled = self._loop.create_future()  # the server's first SETTINGS arrived
        self._error: Exception | None = None
        self.window_waits = 0  # how often a call waited for flow-control room (tests)
        self._out: list[bytes] = []  # frames of calls made in this loop iteration, written together

    @classmethod
    async def connect(cls, host: str, port: int, timeout_s: float) -> H2Channel:
        loop = asyncio.get_running_loop()
        _, channel = await loop.create_connection(lambda: cls(f"{host}:{port}", timeout_s), host, port)
        await asyncio.wait_for(channel._settled, timeout=10)
        return channel

    # asyncio.Protocol ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        settings = struct.pack(">HI", 0x2, 0) + struct.pack(">HI", _SETTINGS_INITIAL_WINDOW_SIZE, _MAX_WINDOW)
        window = struct.pack(">I", _MAX_WINDOW - _DEFAULT_WINDOW)
        transport.write(_PREFACE + _frame(_SETTINGS, 0, 0, settings) + _frame(_WINDOW_UPDATE, 0, 0, window))

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(H2CallError(f"connection lost: {exc}"))

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        offset = 0
        while len(buffer) - offset >= 9:
            length = int.from_bytes(buffer[offset : offset + 3], "big")
            end = offset + 9 + length
            if len(buffer) < end:
                break
            kind, flags = buffer[offset + 3], buffer[offset + 4]
            stream = int.from_bytes(buffer[offset + 5 : offset + 9], "big") & 0x7FFFFFFF
            self._on_frame(kind, flags, stream, bytes(buffer[offset + 9 : end]))
            offset = end
        del buffer[:offset]

    # calls --------------------------------------------------------------------------------------

    async def unary(self, method: str, request: bytes) -> bytes:
        """Call `method` (`/package.Service/Method`) with a serialized request; its answer's bytes."""
        if len(request) + 5 > self._stream_window:
            raise ValueError(f"a {len(request)}-byte request does not fit one stream's window here")
        while self._error is None and (
            self._send_window < len(request) + 5 or len(self._streams) >= self._max_streams
        ):
            self.window_waits += 1
            self._room.clear()
            await self._room.wait()
        if self._error is not None:
            raise self._error
        assert self._transport is not None
        headers = self._headers.get(method)
        if headers is None:
            headers = self._headers[method] = request_headers(self._authority, method, self._timeout_s)
        stream, self._next_stream = self._next_stream, self._next_stream + 2
        answer: asyncio.Future[bytes] = self._loop.create_future()
        self._streams[stream] = _Stream(answer)
        message = b"\x00" + struct.pack(">I", len(request)) + request
        self._send_window -= len(message)
        if not self._out:
            self._loop.call_soon(self._flush)
        self._out.append(_frame(_HEADERS, _END_HEADERS, stream, headers))
        size = self._max_frame
        for at in range(0, len(message), size):
            last = at + size >= len(message)
            self._out.append(_frame(_DATA, _END_STREAM if last else 0, stream, message[at : at + size]))
        return await answer

    def _flush(self) -> None:
        out, self._out = self._out, []
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(b"".join(out))

    def close(self) -> None:
        if self._transport is not None:
            self._transport.write(_frame(_GOAWAY, 0, 0, struct.pack(">II", 0, 0)))
            self._transport.close()

    # frames -------------------------------------------------------------------------------------

    def _on_frame(self, kind: int, flags: int, stream: int, payload: bytes) -> None:
        if kind == _DATA:
            if flags & _PADDED:
                payload = payload[1 : len(payload) - payload[0]]
            entry = self._streams.get(stream)
            if entry is not None:
                entry.body += payload
                if flags & _END_STREAM:
                    self._end(stream)
        elif kind in (_HEADERS, _CONTINUATION):
            if flags & _END_STREAM:  # trailers (or a headers-only refusal) end the call
                self._end(stream)
        elif kind == _RST_STREAM:
            entry = self._streams.pop(stream, None)
            if entry is not None and not entry.answer.done():
                code = int.from_bytes(payload[:4], "big")
                entry.answer.set_exception(H2CallError(f"stream {stream} reset by the server (code {code})"))
            self._room.set()
        elif kind == _SETTINGS and not flags & _ACK:
            for at in range(0, len(payload) - 5, 6):
                key, value = struct.unpack(">HI", payload[at : at + 6])
                if key == _SETTINGS_MAX_CONCURRENT_STREAMS:
                    self._max_streams = value
                elif key == _SETTINGS_MAX_FRAME_SIZE:
                    self._max_frame = value
                elif key == _SETTINGS_INITIAL_WINDOW_SIZE:
                    self._stream_window = value
            assert self._transport is not None
            self._transport.write(_frame(_SETTINGS, _ACK, 0, b""))
            if not self._settled.done():
                self._settled.set_result(None)
        elif kind == _PING and not flags & _ACK:
            assert self._transport is not None
            self._transport.write(_frame(_PING, _ACK, 0, payload))
        elif kind == _WINDOW_UPDATE and stream == 0:
            self._send_window += int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
            self._room.set()
        elif kind == _GOAWAY:
            self._fail(H2CallError(f"the server sent GOAWAY: {payload[8:].decode(errors='replace')}"))

    def _end(self, stream: int) -> None:
        entry = self._streams.pop(stream, None)
        self._room.set()
        if entry is None or entry.answer.done():
            return
        body = entry.body
        if len(body) < 5 or int.from_bytes(body[1:5], "big") != len(body) - 5 or body[0] != 0:
            entry.answer.set_exception(
                H2CallError(f"stream {stream} ended without exactly one uncompressed message (a refusal)")
            )
        else:
            entry.answer.set_result(bytes(body[5:]))

    def _fail(self, error: Exception) -> None:
        self._error = error
        for entry in self._streams.values():
            if not entry.answer.done():
                entry.answer.set_exception(error)
        self._streams.clear()
        self._room.set()
        if not self._settled.done():
            self._settled.set_exception(error)
