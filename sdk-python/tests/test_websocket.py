"""The websocket transport: SSH in a WebSocket (GET /v1/sessions/{id}/ssh) against the real gateway."""

from __future__ import annotations

import asyncio
import socket
import threading
from pathlib import Path
from typing import List
from urllib.parse import urlsplit

import pytest
from conftest import Gateway

from sandbox_sessions_sdk import (
    AsyncSessionSSHClient,
    HTTPConnectTunnel,
    SandboxConnectionError,
    Session,
    SessionNotFoundError,
    SessionsClient,
    SessionSSHClient,
    UnauthorizedError,
)
from sandbox_sessions_sdk._websocket import WebSocketStream


@pytest.mark.parametrize("api_suffix", ["", "/v1"])
def test_websocket_tunnel_carries_the_ssh_banner(gateway: Gateway, session: Session, api_suffix: str) -> None:
    tunnel = HTTPConnectTunnel(
        gateway.url + api_suffix, gateway.token, session.session_id, timeout=5, transport="websocket"
    )
    assert tunnel.path == f"/v1/sessions/{session.session_id}/ssh"
    sock = tunnel.open()
    try:
        assert isinstance(sock, WebSocketStream)
        sock.settimeout(5)
        got = b""
        while b"\r\n" not in got:
            chunk = sock.recv(256)
            assert chunk
            got += chunk
        assert got.startswith(b"SSH-2.0-"), got
    finally:
        tunnel.close()


def test_ssh_and_sftp_over_websocket(gateway: Gateway, session: Session, tmp_path: Path) -> None:
    with SessionSSHClient(gateway.url, gateway.token, session.session_id, "sandbox", transport="websocket") as ssh:
        assert ssh.run_command("echo ws")["stdout"] == "ws\n"
        # Many frames each way.
        big = ssh.run_command("head -c 300000 /dev/zero | tr '\\0' x")["stdout"]
        assert big == "x" * 300000
        src = tmp_path / "up.bin"
        src.write_bytes(bytes(range(256)) * 1200)
        ssh.upload_file(str(src), "up.bin")
        assert ssh.run_command("wc -c < up.bin")["stdout"].strip() == str(256 * 1200)
        ssh.download_file("up.bin", str(tmp_path / "down.bin"))
        assert (tmp_path / "down.bin").read_bytes() == src.read_bytes()


def test_websocket_errors(gateway: Gateway, client: SessionsClient) -> None:
    s = client.create_session(ttl=60)
    with pytest.raises(UnauthorizedError) as ei:
        HTTPConnectTunnel(gateway.url, "wrong-token", s.session_id, timeout=5, transport="websocket").open()
    assert ei.value.status_code == 401
    client.delete_session(s.session_id)
    with pytest.raises(SessionNotFoundError) as ei2:
        HTTPConnectTunnel(gateway.url, gateway.token, s.session_id, timeout=5, transport="websocket").open()
    assert ei2.value.code == "session_gone"
    with pytest.raises(ValueError, match="transport"):
        SessionSSHClient(gateway.url, gateway.token, s.session_id, transport="carrier-pigeon")


class RefusingFront:
    """A reverse proxy in front of the gateway that does not pass CONNECT,
    as many ingresses and corporate proxies: it answers a CONNECT with
    *refusal* (raw bytes; b"" closes without answering) and passes every
    other request, WebSocket upgrades included, byte for byte."""

    def __init__(self, gateway_url: str, refusal: bytes) -> None:
        parts = urlsplit(gateway_url)
        self._target = (parts.hostname or "127.0.0.1", parts.port or 80)
        self._refusal = refusal
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = "http://127.0.0.1:%d" % self._listener.getsockname()[1]
        self.connects = 0
        self.upgrades = 0
        self._socks: List[socket.socket] = []
        self._lock = threading.Lock()
        self._accepter = threading.Thread(target=self._accept, daemon=True)
        self._accepter.start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self._socks.append(c)
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c: socket.socket) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = c.recv(4096)
            if not chunk:
                c.close()
                return
            head += chunk
        if head.startswith(b"CONNECT "):
            with self._lock:
                self.connects += 1
            if self._refusal:
                c.sendall(self._refusal)
            c.close()
            return
        if b"\r\nupgrade: websocket" in head.lower():
            with self._lock:
                self.upgrades += 1
        up = socket.create_connection(self._target)
        with self._lock:
            self._socks.append(up)
        up.sendall(head)
        threading.Thread(target=_pipe, args=(up, c), daemon=True).start()
        _pipe(c, up)

    def close(self) -> None:
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes accept()
        except OSError:
            pass
        self._listener.close()
        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:
            try:
                s.close()
            except OSError:
                pass
        self._accepter.join(5)


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            b = src.recv(65536)
            if not b:
                break
            dst.sendall(b)
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass


_REFUSALS = {
    "405": b"HTTP/1.1 405 Method Not Allowed\r\nContent-Type: text/plain\r\nContent-Length: 14\r\n\r\nno CONNECT her",
    "501": b"HTTP/1.1 501 Not Implemented\r\nContent-Length: 0\r\n\r\n",
    "400": b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n",
    # A status without the gateway's error envelope.
    "403-no-envelope": b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/html\r\nContent-Length: 9\r\n\r\n<h1>no</h1",
    "not-http": b"SSH-2.0-not-what-you-asked\r\n",
    "closed": b"",
}


@pytest.mark.parametrize("refusal", sorted(_REFUSALS))
def test_auto_falls_back_to_websocket(gateway: Gateway, session: Session, refusal: str) -> None:
    """transport="auto" behind a front end that refuses CONNECT opens the
    WebSocket instead; "connect" fails there."""
    front = RefusingFront(gateway.url, _REFUSALS[refusal])
    try:
        tunnel = HTTPConnectTunnel(front.url, gateway.token, session.session_id, timeout=10, transport="auto")
        sock = tunnel.open()
        try:
            assert tunnel.opened_transport == "websocket"
            assert tunnel.path == f"/v1/sessions/{session.session_id}/ssh"
            assert isinstance(sock, WebSocketStream)
            sock.settimeout(5)
            assert sock.recv(8) == b"SSH-2.0-"
        finally:
            tunnel.close()
        assert (front.connects, front.upgrades) == (1, 1)
        with pytest.raises(SandboxConnectionError):
            HTTPConnectTunnel(front.url, gateway.token, session.session_id, timeout=10).open()
    finally:
        front.close()


def test_ssh_client_auto_through_a_refusing_front(gateway: Gateway, session: Session) -> None:
    front = RefusingFront(gateway.url, _REFUSALS["405"])
    try:
        with SessionSSHClient(front.url, gateway.token, session.session_id, "sandbox", transport="auto") as ssh:
            assert ssh.run_command("echo auto-$((40+2))")["stdout"] == "auto-42\n"
            assert ssh._tunnel is not None and ssh._tunnel.opened_transport == "websocket"
    finally:
        front.close()


def test_async_ssh_client_auto_through_a_refusing_front(gateway: Gateway, session: Session) -> None:
    front = RefusingFront(gateway.url, _REFUSALS["501"])

    async def run() -> str:
        async with AsyncSessionSSHClient(front.url, gateway.token, session.session_id, transport="auto") as ssh:
            return (await ssh.run_command("echo async-auto"))["stdout"]

    try:
        assert asyncio.run(run()) == "async-auto\n"
    finally:
        front.close()


def test_auto_keeps_connect_and_the_gateways_own_refusals(
    gateway: Gateway, session: Session, client: SessionsClient
) -> None:
    """Straight to the gateway, auto is CONNECT; the gateway's own answers
    (401, 404 with its envelope) are final, not a reason to fall back."""
    tunnel = HTTPConnectTunnel(gateway.url, gateway.token, session.session_id, timeout=10, transport="auto")
    with tunnel as sock:
        assert tunnel.opened_transport == "connect"
        assert not isinstance(sock, WebSocketStream)
    t = HTTPConnectTunnel(gateway.url, "wrong-token", session.session_id, timeout=10, transport="auto")
    with pytest.raises(UnauthorizedError):
        t.open()
    assert t.path == f"/sessions/{session.session_id}" and t.opened_transport is None
    t = HTTPConnectTunnel(gateway.url, gateway.token, "sbx-doesnotexist", timeout=10, transport="auto")
    with pytest.raises(SessionNotFoundError) as ei:
        t.open()
    assert ei.value.code and t.path == "/sessions/sbx-doesnotexist"
    front = RefusingFront(gateway.url, b"")
    try:
        # Through a front end, the gateway's own refusal of the WebSocket
        # (after the fallback) is what the caller sees.
        with pytest.raises(UnauthorizedError):
            HTTPConnectTunnel(front.url, "wrong-token", session.session_id, timeout=10, transport="auto").open()
        assert (front.connects, front.upgrades) == (1, 1)
    finally:
        front.close()
