"""WebSocketStream: a socket-like byte stream in a WebSocket's binary messages.

A minimal RFC 6455 client, just what the gateway's SSH WebSocket
(``GET /v1/sessions/{id}/ssh``) needs: the handshake, masked binary frames
out, binary and continuation frames in, pings answered, close. It is
socket-like (``recv``, ``send``, ``sendall``, ``settimeout``...) over a
socket or a :class:`TLSStream`, so Paramiko can use it as its ``sock``; a
``recv`` that times out halfway through a frame keeps the bytes it has.
"""

from __future__ import annotations

import base64
import hashlib
import os
import socket
import struct
import threading
from typing import Any, Optional, Union

from ._tlsstream import TLSStream

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
_OP_CONT, _OP_TEXT, _OP_BINARY, _OP_CLOSE, _OP_PING, _OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
#: The largest frame accepted from the server (the gateway sends far smaller).
_MAX_FRAME = 16 << 20


def handshake_key() -> str:
    """A fresh Sec-WebSocket-Key."""
    return base64.b64encode(os.urandom(16)).decode("ascii")


def expected_accept(key: str) -> str:
    """The Sec-WebSocket-Accept a server must answer *key* with."""
    return base64.b64encode(hashlib.sha1(key.encode("ascii") + _GUID).digest()).decode("ascii")


class WebSocketError(OSError):
    """The WebSocket broke the protocol, or the server closed it with an error."""


class WebSocketStream:
    """The byte stream of an established WebSocket (after its ``101``)."""

    def __init__(self, sock: Union[socket.socket, TLSStream]) -> None:
        self._sock = sock
        self._raw = bytearray()  # bytes read from sock, not yet parsed into frames
        self._data = bytearray()  # payload bytes ready for recv
        self._eof = False
        self._reader = threading.Lock()
        self._writer = threading.Lock()
        # Paramiko's Transport.stop_thread reads sock._closed: keep the name.
        self._closed = False

    # -- socket API ----------------------------------------------------------

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        if flags:
            raise ValueError("WebSocketStream.recv does not take flags")
        with self._reader:
            while not self._data and not self._eof:
                if not self._parse():
                    chunk = self._sock.recv(65536)  # may time out: what was read stays in _raw
                    if not chunk:
                        self._eof = True
                        break
                    self._raw += chunk
            n = min(bufsize, len(self._data))
            out = bytes(self._data[:n])
            del self._data[:n]
            return out

    def send(self, data: Any, flags: int = 0) -> int:
        if flags:
            raise ValueError("WebSocketStream.send does not take flags")
        view = memoryview(data).cast("B")
        if not view:
            return 0
        self._send_frame(_OP_BINARY, bytes(view))
        return len(view)

    def sendall(self, data: Any, flags: int = 0) -> None:
        self.send(data, flags)

    def settimeout(self, timeout: Optional[float]) -> None:
        self._sock.settimeout(timeout)

    def gettimeout(self) -> Optional[float]:
        return self._sock.gettimeout()

    def setblocking(self, flag: bool) -> None:
        self._sock.setblocking(flag)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._send_frame(_OP_CLOSE, struct.pack("!H", 1000))
        except OSError:
            pass
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes a thread waiting in recv
        except OSError:
            pass
        self._sock.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def shutdown(self, how: int) -> None:
        self._sock.shutdown(how)

    def fileno(self) -> int:
        return self._sock.fileno()

    def getpeername(self) -> Any:
        return self._sock.getpeername()

    def getsockname(self) -> Any:
        return self._sock.getsockname()

    def setsockopt(self, *args: Any) -> None:
        self._sock.setsockopt(*args)

    def getsockopt(self, *args: Any) -> Any:
        return self._sock.getsockopt(*args)

    def __enter__(self) -> "WebSocketStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<WebSocketStream {'closed' if self._closed else 'open'} over {self._sock!r}>"

    # -- internals -------------------------------------------------------------

    def _parse(self) -> bool:
        """Take one whole frame from _raw; False when _raw holds none yet."""
        raw = self._raw
        if len(raw) < 2:
            return False
        b0, b1 = raw[0], raw[1]
        if b1 & 0x80:
            raise WebSocketError("websocket: the server masked a frame")
        if b0 & 0x70:
            raise WebSocketError("websocket: the server set a reserved bit")
        length, at = b1 & 0x7F, 2
        if length == 126:
            if len(raw) < 4:
                return False
            length, at = struct.unpack_from("!H", raw, 2)[0], 4
        elif length == 127:
            if len(raw) < 10:
                return False
            length, at = struct.unpack_from("!Q", raw, 2)[0], 10
        if length > _MAX_FRAME:
            raise WebSocketError(f"websocket: a frame of {length} bytes is over the limit")
        if len(raw) < at + length:
            return False
        payload = bytes(raw[at : at + length])
        del raw[: at + length]
        op = b0 & 0x0F
        if op in (_OP_BINARY, _OP_CONT):
            self._data += payload
        elif op == _OP_PING:
            self._send_frame(_OP_PONG, payload)
        elif op == _OP_CLOSE:
            code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
            self._eof = True
            try:  # the closing handshake: answer with a close frame
                self._send_frame(_OP_CLOSE, payload[:2])
            except OSError:
                pass
            if code not in (1000, 1001, 1005):
                reason = payload[2:].decode("utf-8", errors="replace")
                raise WebSocketError(f"websocket: the server closed the connection: {code} {reason}".rstrip())
        elif op == _OP_TEXT:
            raise WebSocketError("websocket: the server sent a text message on an SSH stream")
        # Pongs are ignored.
        return True

    def _send_frame(self, op: int, payload: bytes) -> None:
        n = len(payload)
        if n < 126:
            head = struct.pack("!BB", 0x80 | op, 0x80 | n)
        elif n < 1 << 16:
            head = struct.pack("!BBH", 0x80 | op, 0x80 | 126, n)
        else:
            head = struct.pack("!BBQ", 0x80 | op, 0x80 | 127, n)
        mask = os.urandom(4)
        masked = (int.from_bytes(payload, "big") ^ int.from_bytes((mask * (n // 4 + 1))[:n], "big")).to_bytes(n, "big")
        view = memoryview(head + mask + masked)
        with self._writer:
            if self._closed and op != _OP_CLOSE:
                raise OSError(9, "WebSocket stream is closed")
            # A frame is written whole even when the socket's timeout (set
            # short by a reader polling it) runs out halfway: half a frame
            # would corrupt the stream.
            while view:
                try:
                    n = self._sock.send(view)
                except socket.timeout:
                    if op == _OP_CLOSE or self._closed:
                        raise
                    continue
                view = view[n:]
