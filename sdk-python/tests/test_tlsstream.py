"""TLSStream against a real TLS server on loopback (Python's ssl, one thread per connection)."""

from __future__ import annotations

import hashlib
import os
import socket
import ssl
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, Tuple

import pytest
from test_tls import _self_signed

from sandbox_sessions_sdk import TLSStream

Handler = Callable[[ssl.SSLSocket], None]


class _Server:
    """Accepts TLS connections and runs *handler* on each in its own thread."""

    def __init__(self, cert: str, key: str, handler: Handler) -> None:
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(cert, key)
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.port = self.lsock.getsockname()[1]
        self.handler = handler
        self.threads = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.lsock.accept()
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            t.start()
            self.threads.append(t)

    def _serve(self, conn: socket.socket) -> None:
        try:
            with self.ctx.wrap_socket(conn, server_side=True) as tls:
                self.handler(tls)
        except OSError:
            pass

    def close(self) -> None:
        self.lsock.close()
        for t in self.threads:
            t.join(10)


def _echo(tls: ssl.SSLSocket) -> None:
    while True:
        data = tls.recv(65536)
        if not data:
            return
        tls.sendall(data)


def _silent(tls: ssl.SSLSocket) -> None:
    tls.recv(1)  # until the client goes away


def _hang_up(tls: ssl.SSLSocket) -> None:
    tls.sendall(b"bye")
    tls.unwrap()


@pytest.fixture
def certs(tmp_path: Path) -> Tuple[str, str]:
    return _self_signed(tmp_path)


@pytest.fixture
def server(certs: Tuple[str, str], request: pytest.FixtureRequest) -> Iterator[_Server]:
    srv = _Server(certs[0], certs[1], request.param)
    try:
        yield srv
    finally:
        srv.close()


def _connect(srv: _Server, cert: str, timeout: float = 5) -> TLSStream:
    raw = socket.create_connection(("127.0.0.1", srv.port), timeout=timeout)
    ctx = ssl.create_default_context(cafile=cert)
    return TLSStream(raw, ctx, "127.0.0.1", timeout)


@pytest.mark.parametrize("server", [_echo], indirect=True)
def test_one_thread_reads_while_others_write(server: _Server, certs: Tuple[str, str]) -> None:
    """Three writers and one reader on one stream: every byte comes back, none corrupted."""
    s = _connect(server, certs[0])
    s.settimeout(0.1)  # what Paramiko's transport thread sets
    assert s.version() in ("TLSv1.2", "TLSv1.3")
    chunks = [os.urandom(n) for n in (1, 100, 16384, 16385, 70000) * 40]
    sent = hashlib.sha256()
    total = sum(len(c) for c in chunks) * 3
    lock = threading.Lock()

    def writer() -> None:
        for c in chunks:
            with lock:  # one message at a time, like Paramiko's packetizer
                s.sendall(c)
                sent.update(c)

    writers = [threading.Thread(target=writer) for _ in range(3)]
    for w in writers:
        w.start()
    got = hashlib.sha256()
    n = 0
    deadline = time.monotonic() + 60
    while n < total and time.monotonic() < deadline:
        try:
            data = s.recv(65536)
        except socket.timeout:
            continue
        assert data, "the stream ended early"
        got.update(data)
        n += len(data)
    for w in writers:
        w.join(10)
    assert n == total
    assert got.hexdigest() == sent.hexdigest()
    s.close()
    s.close()  # twice is fine
    assert s.closed


@pytest.mark.parametrize("server", [_silent], indirect=True)
def test_timeouts_and_close_from_another_thread(server: _Server, certs: Tuple[str, str]) -> None:
    s = _connect(server, certs[0])
    s.settimeout(0.2)
    t0 = time.monotonic()
    with pytest.raises(socket.timeout):
        s.recv(10)
    assert 0.15 < time.monotonic() - t0 < 5
    s.setblocking(False)
    with pytest.raises(BlockingIOError):
        s.recv(10)
    # A blocking recv wakes up when another thread closes the stream.
    s.settimeout(None)
    result: list = []

    def reader() -> None:
        try:
            result.append(s.recv(10))
        except OSError as e:
            result.append(e)

    t = threading.Thread(target=reader)
    t.start()
    time.sleep(0.2)
    s.close()
    t.join(5)
    assert not t.is_alive(), "close did not wake the reader"
    assert result and (result[0] == b"" or isinstance(result[0], OSError))
    with pytest.raises(OSError):
        s.send(b"x")


@pytest.mark.parametrize("server", [_hang_up], indirect=True)
def test_peer_close_reads_as_end_of_stream(server: _Server, certs: Tuple[str, str]) -> None:
    s = _connect(server, certs[0])
    got = b""
    while True:
        data = s.recv(10)
        if not data:
            break
        got += data
    assert got == b"bye"
    assert s.recv(10) == b""
    s.close()


@pytest.mark.parametrize("server", [_echo], indirect=True)
def test_untrusted_certificate_fails_the_handshake(server: _Server, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    other_cert, _ = _self_signed(other)
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    with pytest.raises(ssl.SSLCertVerificationError):
        TLSStream(raw, ssl.create_default_context(cafile=other_cert), "127.0.0.1", 5)
    raw.close()
