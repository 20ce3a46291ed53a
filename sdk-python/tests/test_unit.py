"""Unit tests: no sandgate needed. Tiny loopback servers stand in where a
behaviour cannot be provoked from the real gateway (non-JSON bodies,
bytes glued to the CONNECT answer, silent servers)."""

from __future__ import annotations

import json
import socket
import threading
import time
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Iterator, List, Tuple

import paramiko
import pytest

import sandbox_sessions_sdk as sdk
from sandbox_sessions_sdk import (
    HTTPConnectTunnel,
    RateLimitError,
    SandboxAPIError,
    SandboxConnectionError,
    SandboxOperationError,
    Session,
    SessionNotFoundError,
    SessionsClient,
    SessionSSHClient,
    UnauthorizedError,
)
from sandbox_sessions_sdk._common import rest_base
from sandbox_sessions_sdk.models import parse_timestamp
from sandbox_sessions_sdk.ssh import parse_host_key

# -- fake servers -------------------------------------------------------------


class RawServer:
    """A one-connection-at-a-time TCP server running *handler(conn, request_bytes)*."""

    def __init__(self, handler: Callable[[socket.socket, bytes], None]) -> None:
        self.handler = handler
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.05)
        self.port = self.sock.getsockname()[1]
        self.requests: List[bytes] = []
        self._stop = False
        self._conns: List[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            self._conns.append(conn)
            req = b""
            conn.settimeout(5)
            try:
                while b"\r\n\r\n" not in req:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    req += chunk
                self.requests.append(req)
                self.handler(conn, req)
            except OSError:
                pass

    def close(self) -> None:
        self._stop = True
        self.thread.join(5)
        self.sock.close()
        for c in self._conns:
            c.close()


@pytest.fixture
def raw_server() -> Iterator[Callable[[Callable[[socket.socket, bytes], None]], RawServer]]:
    servers: List[RawServer] = []

    def make(handler: Callable[[socket.socket, bytes], None]) -> RawServer:
        s = RawServer(handler)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.close()


class FakeAPI:
    """An HTTP server answering every request with a canned (status, headers, body)."""

    def __init__(self) -> None:
        self.answer: Tuple[int, dict, bytes] = (200, {}, b"{}")
        self.calls: List[Tuple[str, str, dict, bytes]] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                api.calls.append((self.command, self.path, dict(self.headers), body))
                status, headers, out = api.answer
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            do_GET = do_POST = do_DELETE = _any

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


@pytest.fixture
def fake_api() -> Iterator[FakeAPI]:
    api = FakeAPI()
    yield api
    api.close()


SESSION_JSON = {
    "sessionId": "sbx-abc",
    "status": "running",
    "image": "default",
    "metadata": {"k": "v"},
    "createdAt": "2026-11-25T22:34:45.067554458Z",
    "expiresAt": "2026-11-25T23:34:45.067554458Z",
    "lastActivityAt": "2026-11-25T22:34:45Z",
    "ttl": 3600,
    "ssh": {
        "username": "sandbox",
        "password": "SECRET",
        "hostKeys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAINmMZmT1ifPlXhvtwa9asBfvUUiHgx27DVLqLXRCwTT2"],
        "knownHostsLine": "* ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAINmMZmT1ifPlXhvtwa9asBfvUUiHgx27DVLqLXRCwTT2",
        "connectPath": "/v1/sessions/sbx-abc",
    },
}

# -- the public surface ---------------------------------------------------------


def test_public_api_and_error_hierarchy() -> None:
    for name in sdk.__all__:
        assert hasattr(sdk, name), name
    for cls in (
        sdk.SandboxConnectionError,
        sdk.UnauthorizedError,
        sdk.SessionNotFoundError,
        sdk.RateLimitError,
        sdk.SandboxOperationError,
    ):
        assert issubclass(cls, SandboxAPIError)
    assert issubclass(sdk.CommandTimeoutError, SandboxOperationError)
    assert issubclass(sdk.HostKeyMismatchError, SandboxConnectionError)


def test_session_from_dict_and_secret_hidden() -> None:
    s = Session.from_dict(SESSION_JSON)
    assert s.session_id == "sbx-abc" and s.status == "running" and s.image == "default"
    assert s.metadata == {"k": "v"} and s.ttl == 3600
    assert s.created_at == datetime(2026, 11, 25, 22, 34, 45, 67554, tzinfo=timezone.utc)
    assert s.expires_at is not None and s.expires_at > s.created_at
    assert s.username == "sandbox" and s.password == "SECRET"
    assert s.host_keys[0].startswith("ssh-ed25519 ")
    assert s.connect_path == "/v1/sessions/sbx-abc"
    assert "SECRET" not in repr(s)
    with pytest.raises(ValueError):
        Session.from_dict({"status": "running"})


@pytest.mark.parametrize(
    "text,expected",
    [
        ("2026-01-02T03:04:05Z", datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)),
        ("2026-01-02T03:04:05.123456789Z", datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=timezone.utc)),
        ("2026-01-02T05:04:05+02:00", datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)),
        ("", None),
        ("yesterday", None),
    ],
)
def test_parse_timestamp(text: str, expected: object) -> None:
    assert parse_timestamp(text) == expected


def test_env_defaults(monkeypatch: pytest.MonkeyPatch, fake_api: FakeAPI) -> None:
    monkeypatch.setenv("SANDBOX_API_URL", fake_api.url)
    monkeypatch.setenv("SANDBOX_API_TOKEN", "env-token")
    fake_api.answer = (200, {}, json.dumps(SESSION_JSON).encode())
    with SessionsClient() as c:
        assert c.get_session("sbx-abc").session_id == "sbx-abc"
    method, path, headers, _ = fake_api.calls[-1]
    assert (method, path) == ("GET", "/v1/sessions/sbx-abc")
    assert headers["Authorization"] == "Bearer env-token"
    t = HTTPConnectTunnel(session_id="sbx-abc")
    assert t.api_url == fake_api.url
    ssh = SessionSSHClient(session_id="sbx-abc")
    assert ssh.api_url == fake_api.url and ssh.username == "sandbox"


def test_missing_settings_raise_value_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SANDBOX_API_URL", raising=False)
    monkeypatch.delenv("SANDBOX_API_TOKEN", raising=False)
    with pytest.raises(ValueError, match="SANDBOX_API_URL"):
        SessionsClient()
    with pytest.raises(ValueError, match="SANDBOX_API_TOKEN"):
        SessionsClient(api_url="http://127.0.0.1:1")
    with pytest.raises(ValueError):
        SessionsClient(api_url="ftp://x", bearer_token="t")
    with pytest.raises(ValueError):
        SessionSSHClient(api_url="http://127.0.0.1:1", bearer_token="t")  # no session_id


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.create_session(ttl=59),
        lambda c: c.create_session(ttl=28801),
        lambda c: c.create_session(ttl=True),
        lambda c: c.create_session(ttl="600"),
        lambda c: c.create_session(metadata=["not", "a", "dict"]),
        lambda c: c.list_sessions(limit=0),
        lambda c: c.list_sessions(limit=101),
        lambda c: c.list_sessions(offset=-1),
        lambda c: c.get_session(""),
        lambda c: c.delete_session(""),
    ],
)
def test_arguments_checked_before_sending(fake_api: FakeAPI, call: Callable[[SessionsClient], object]) -> None:
    with SessionsClient(fake_api.url, "t") as c:
        with pytest.raises((ValueError, TypeError)):
            call(c)
    assert fake_api.calls == []


def test_bounds_are_accepted(fake_api: FakeAPI) -> None:
    fake_api.answer = (201, {}, json.dumps(SESSION_JSON).encode())
    with SessionsClient(fake_api.url, "t") as c:
        c.create_session(ttl=60)
        c.create_session(ttl=28800, image="default", metadata={"a": [1]}, ssh_public_key="ssh-ed25519 AAAA x ")
        fake_api.answer = (
            200,
            {},
            json.dumps({"sessions": [SESSION_JSON], "total": 1, "limit": 100, "offset": 0}).encode(),
        )
        page = c.list_sessions(limit=100, offset=0)
        c.list_sessions(limit=1, offset=10**6)
    assert [s.session_id for s in page["sessions"]] == ["sbx-abc"]
    assert (page["total"], page["limit"], page["offset"]) == (1, 100, 0)
    bodies = [json.loads(b) for m, _, _, b in fake_api.calls if m == "POST"]
    assert bodies[0] == {"ttl": 60}
    assert bodies[1] == {"ttl": 28800, "image": "default", "metadata": {"a": [1]}, "sshPublicKey": "ssh-ed25519 AAAA x"}
    assert fake_api.calls[-1][1] == "/v1/sessions?limit=1&offset=1000000"


@pytest.mark.parametrize("status", [200, 204])
def test_delete_accepts_200_and_204(fake_api: FakeAPI, status: int) -> None:
    fake_api.answer = (status, {}, b"" if status == 204 else b'{"deleted": true}')
    with SessionsClient(fake_api.url, "t") as c:
        assert c.delete_session("sbx-abc") is None
    assert fake_api.calls[-1][:2] == ("DELETE", "/v1/sessions/sbx-abc")


@pytest.mark.parametrize(
    "status,body,ctype,cls,needle",
    [
        (502, b"<html><body>Bad Gateway</body></html>", "text/html", SandboxOperationError, "Bad Gateway"),
        (503, b"upstream connect error", "text/plain", SandboxOperationError, "upstream connect error"),
        (401, b"nope", "text/plain", UnauthorizedError, "nope"),
        (404, b"", "text/plain", SessionNotFoundError, "Not Found"),
        (429, b"slow down", "text/plain", RateLimitError, "slow down"),
        (500, b'{"error": "plain string"}', "application/json", SandboxOperationError, "plain string"),
    ],
)
def test_non_json_error_bodies(fake_api: FakeAPI, status: int, body: bytes, ctype: str, cls: type, needle: str) -> None:
    fake_api.answer = (status, {"Content-Type": ctype}, body)
    with SessionsClient(fake_api.url, "t") as c:
        with pytest.raises(cls) as ei:
            c.get_session("sbx-abc")
    assert ei.value.status_code == status
    assert needle in str(ei.value) or needle in (ei.value.body or "")


def test_rate_limit_headers_parsed(fake_api: FakeAPI) -> None:
    fake_api.answer = (
        429,
        {
            "X-RateLimit-Limit": "3",
            "X-RateLimit-Remaining": "0",
            "X-RateLimit-Reset": "1795646144",
            "Retry-After": "17",
        },
        b'{"error": {"code": "rate_limited", "message": "too many"}}',
    )
    with SessionsClient(fake_api.url, "t") as c:
        with pytest.raises(RateLimitError) as ei:
            c.list_sessions()
    e = ei.value
    assert (e.limit, e.remaining, e.reset, e.retry_after, e.code) == (3, 0, 1795646144, 17.0, "rate_limited")


def test_success_with_non_json_body(fake_api: FakeAPI) -> None:
    fake_api.answer = (200, {"Content-Type": "text/html"}, b"<html>login page</html>")
    with SessionsClient(fake_api.url, "t") as c:
        with pytest.raises(SandboxOperationError, match="not JSON"):
            c.get_session("sbx-abc")


def test_unreachable_gateway_is_connection_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    with SessionsClient(f"http://127.0.0.1:{port}", "t", timeout=2) as c:
        with pytest.raises(SandboxConnectionError):
            c.list_sessions()
    with pytest.raises(SandboxConnectionError):
        HTTPConnectTunnel(f"http://127.0.0.1:{port}", "t", "sbx-abc", timeout=2).open()


def test_rest_base_does_not_double_v1() -> None:
    assert rest_base("http://h:1") == "http://h:1/v1"
    assert rest_base("http://h:1/v1") == "http://h:1/v1"
    assert rest_base("https://h/prefix") == "https://h/prefix/v1"
    assert rest_base("https://h/prefix/v1") == "https://h/prefix/v1"


@pytest.mark.parametrize(
    "url,template,path",
    [
        ("http://h:8080", "/sessions/{sessionId}", "/sessions/sbx-1"),
        ("https://h/v1", "/sessions/{sessionId}", "/v1/sessions/sbx-1"),
        ("https://h/v1/", "/sessions/{sessionId}", "/v1/sessions/sbx-1"),
        ("http://h", "/v1/sessions/{sessionId}", "/v1/sessions/sbx-1"),
        ("http://h", "sessions/{sessionId}/ssh", "/sessions/sbx-1/ssh"),
    ],
)
def test_connect_path_joining(url: str, template: str, path: str) -> None:
    assert HTTPConnectTunnel(url, "t", "sbx-1", connect_path_template=template).path == path


def test_connect_path_escapes_session_id() -> None:
    assert HTTPConnectTunnel("http://h", "t", "a/../b c").path == "/sessions/a%2F..%2Fb%20c"


def test_tunnel_keeps_bytes_after_200(raw_server: Callable[..., RawServer]) -> None:
    def handler(conn: socket.socket, req: bytes) -> None:
        # The answer and the first SSH bytes in a single send.
        conn.sendall(b"HTTP/1.1 200 Connection Established\r\n\r\nSSH-2.0-x\r\n")
        time.sleep(0.5)

    srv = raw_server(handler)
    tunnel = HTTPConnectTunnel(f"http://127.0.0.1:{srv.port}/v1", "tok", "sbx-1", timeout=5)
    sock = tunnel.open()
    try:
        got = b""
        while not got.endswith(b"\r\n"):
            chunk = sock.recv(100)
            assert chunk, "connection closed before the SSH line"
            got += chunk
        assert got == b"SSH-2.0-x\r\n"
        assert sock.gettimeout() is None
    finally:
        tunnel.close()
    tunnel.close()  # twice is fine
    req = srv.requests[0].decode()
    assert req.startswith("CONNECT /v1/sessions/sbx-1 HTTP/1.1\r\n")
    assert "\r\nProxy-Authorization: Bearer tok\r\n" in req
    assert "\r\nAuthorization: Bearer tok\r\n" in req
    assert f"\r\nHost: 127.0.0.1:{srv.port}\r\n" in req


def test_tunnel_extra_headers(raw_server: Callable[..., RawServer]) -> None:
    srv = raw_server(lambda c, r: c.sendall(b"HTTP/1.1 200 OK\r\n\r\n"))
    with HTTPConnectTunnel(f"http://127.0.0.1:{srv.port}", "tok", "s", extra_headers={"X-Trace": "42"}, timeout=5):
        pass
    assert "\r\nX-Trace: 42\r\n" in srv.requests[0].decode()
    with pytest.raises(ValueError):
        HTTPConnectTunnel("http://h", "t", "s", extra_headers={"X": "a\r\nInjected: 1"})


@pytest.mark.parametrize(
    "answer,cls,code",
    [
        (b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 5\r\n\r\noops!", SandboxConnectionError, 502),
        (b"HTTP/1.1 407 Proxy Authentication Required\r\n\r\n", SandboxConnectionError, 407),
        (
            b"HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\nContent-Length: 57\r\n\r\n"
            b'{"error":{"code":"unauthorized","message":"bad token!!"}}',
            UnauthorizedError,
            401,
        ),
        (b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n", SessionNotFoundError, 404),
        (b"HTTP/1.1 429 Too Many Requests\r\nX-RateLimit-Limit: 3\r\nRetry-After: 9\r\n\r\n", RateLimitError, 429),
    ],
)
def test_tunnel_non_200(raw_server: Callable[..., RawServer], answer: bytes, cls: type, code: int) -> None:
    srv = raw_server(lambda c, r: c.sendall(answer))
    with pytest.raises(cls) as ei:
        HTTPConnectTunnel(f"http://127.0.0.1:{srv.port}", "tok", "sbx-1", timeout=5).open()
    e = ei.value
    assert e.status_code == code
    assert e.status_line == answer.split(b"\r\n", 1)[0].decode()
    assert e.status_line in str(e)
    if cls is RateLimitError:
        assert e.limit == 3 and e.retry_after == 9


def test_tunnel_garbage_and_silence(raw_server: Callable[..., RawServer]) -> None:
    srv = raw_server(lambda c, r: c.sendall(b"SSH-2.0-not-http\r\n\r\n"))
    with pytest.raises(SandboxConnectionError, match="not HTTP"):
        HTTPConnectTunnel(f"http://127.0.0.1:{srv.port}", "t", "s", timeout=5).open()
    silent = raw_server(lambda c, r: time.sleep(1))
    t0 = time.monotonic()
    with pytest.raises(SandboxConnectionError, match="no answer"):
        HTTPConnectTunnel(f"http://127.0.0.1:{silent.port}", "t", "s", timeout=0.5).open()
    assert time.monotonic() - t0 < 0.95
    closing = raw_server(lambda c, r: c.close())
    with pytest.raises(SandboxConnectionError, match="closed"):
        HTTPConnectTunnel(f"http://127.0.0.1:{closing.port}", "t", "s", timeout=5).open()


def test_parse_host_key() -> None:
    k = parse_host_key(SESSION_JSON["ssh"]["hostKeys"][0])
    assert k.get_name() == "ssh-ed25519"
    k2 = parse_host_key(SESSION_JSON["ssh"]["knownHostsLine"])
    assert k2 == k
    with pytest.raises(ValueError):
        parse_host_key("ssh-ed25519 !!!notbase64")


def test_ssh_client_use_before_connect() -> None:
    c = SessionSSHClient("http://127.0.0.1:1", "t", "sbx-1", "sandbox")
    for call in (
        lambda: c.run_command("true"),
        c.open_sftp,
        lambda: c.upload_file("a", "b"),
        lambda: c.download_file("a", "b"),
    ):
        with pytest.raises(SandboxOperationError, match="connect"):
            call()
    assert not c.connected
    c.close()  # closing an unconnected client is fine


def test_ssh_client_argument_checks() -> None:
    with pytest.raises(TypeError):
        SessionSSHClient("http://h", "t", "s", pkey="not a key")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        SessionSSHClient("http://h", "t", "s", host_key_policy="auto")  # type: ignore[arg-type]
    c = SessionSSHClient("http://h", "t", "s", host_key_policy=paramiko.AutoAddPolicy)  # a class is accepted
    assert isinstance(c.host_key_policy, paramiko.AutoAddPolicy)


def test_sftp_limits_fall_back_to_32k_without_the_extension() -> None:
    """Against Paramiko's own SFTP server, which lacks limits@openssh.com,
    the SDK keeps to 32 KiB requests."""
    import socket as socket_mod

    import paramiko

    from sandbox_sessions_sdk import _sftp

    class Server(paramiko.ServerInterface):
        def get_allowed_auths(self, username: str) -> str:
            return "none"

        def check_auth_none(self, username: str) -> int:
            return paramiko.AUTH_SUCCESSFUL

        def check_channel_request(self, kind: str, chanid: int) -> int:
            return paramiko.OPEN_SUCCEEDED

    a, b = socket_mod.socketpair()
    server = paramiko.Transport(b)
    client = paramiko.Transport(a)
    try:
        server.add_server_key(paramiko.ECDSAKey.generate())
        server.set_subsystem_handler("sftp", paramiko.SFTPServer, paramiko.SFTPServerInterface)
        server.start_server(event=threading.Event(), server=Server())
        client.start_client(timeout=10)
        client.auth_none("sandbox")
        sftp = paramiko.SFTPClient.from_transport(client)
        assert sftp is not None
        assert _sftp.limits(sftp) == (32768, 32768)
        sftp.close()
    finally:
        client.close()
        server.close()
