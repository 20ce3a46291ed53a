"""Unit tests: no sandgate needed. Tiny loopback servers stand in where a
behaviour cannot be provoked from the real gateway (non-JSON bodies,
bytes glued to the CONNECT answer, silent servers)."""

from __future__ import annotations

import base64
import json
import random
import socket
import threading
import time
import uuid
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Dict, Iterator, List, Tuple

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
from sandbox_sessions_sdk import client as client_module
from sandbox_sessions_sdk._common import rest_base
from sandbox_sessions_sdk._output import OutputBuffer
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
        #: Answers given first, one per request, before falling back to *answer*.
        self.queue: List[Tuple[int, Dict[str, str], bytes]] = []
        self.calls: List[Tuple[str, str, dict, bytes]] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                api.calls.append((self.command, self.path, dict(self.headers), body))
                status, headers, out = api.queue.pop(0) if api.queue else api.answer
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            do_GET = do_POST = do_PATCH = do_DELETE = _any

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
    assert issubclass(sdk.SessionGoneError, sdk.SessionNotFoundError)
    assert "SessionGoneError" in sdk.__all__


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
        lambda c: c.create_session(idempotency_key=""),
        lambda c: c.create_session(idempotency_key="a b"),
        lambda c: c.create_session(idempotency_key="k\r\nX-Injected: 1"),
        lambda c: c.create_session(idempotency_key="é"),
        lambda c: c.create_session(idempotency_key="k" * 256),
        lambda c: c.create_session(idempotency_key=123),
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


@pytest.mark.parametrize(
    "message,reason",
    [
        ('session sbx-abc is gone (reason: deleted): deleted at 2030-01-02T03:04:05Z by tenant "t" (api_key)', "deleted"),
        ("session sbx-abc is gone (reason: idle_expired): expired at 2030-01-02T03:04:05Z: idle", "idle_expired"),
        ("session sbx-abc is gone", None),
    ],
)
def test_session_gone(fake_api: FakeAPI, message: str, reason: object) -> None:
    body = json.dumps({"error": {"code": "session_gone", "message": message}}).encode()
    fake_api.answer = (410, {"Content-Type": "application/json"}, body)
    with SessionsClient(fake_api.url, "t") as c:
        with pytest.raises(sdk.SessionGoneError) as ei:
            c.get_session("sbx-abc")
    assert isinstance(ei.value, SessionNotFoundError)
    assert ei.value.status_code == 410 and ei.value.code == "session_gone" and ei.value.reason == reason
    assert message in str(ei.value)
    # A 410 with another code (a dead file link) is not a gone session.
    fake_api.answer = (410, {"Content-Type": "application/json"}, _err("link_gone"))
    with SessionsClient(fake_api.url, "t") as c:
        with pytest.raises(SandboxOperationError) as ei2:
            c.get_session("sbx-abc")
    assert not isinstance(ei2.value, SessionNotFoundError)


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


# -- Idempotency-Key on create ----------------------------------------------------


def _key_of(call: Tuple[str, str, Dict[str, str], bytes]) -> str:
    keys = [v for k, v in call[2].items() if k.lower() == "idempotency-key"]
    assert len(keys) == 1, call[2]
    return str(keys[0])


@pytest.fixture
def no_retry_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_module, "_CREATE_RETRY_DELAYS", (0.0, 0.0))


def test_create_sends_an_idempotency_key(fake_api: FakeAPI) -> None:
    fake_api.answer = (201, {}, json.dumps(SESSION_JSON).encode())
    with SessionsClient(fake_api.url, "t") as c:
        s1 = c.create_session()
        c.create_session()
        c.create_session(idempotency_key="job-42:create~1")
        c.get_session("sbx-abc")
    k1, k2, k3 = (_key_of(call) for call in fake_api.calls[:3])
    assert uuid.UUID(k1).version == 4 and uuid.UUID(k2).version == 4 and k1 != k2  # a fresh one per call
    assert k3 == "job-42:create~1"
    assert not any(k.lower() == "idempotency-key" for k in fake_api.calls[3][2])  # create only
    assert s1.password == "SECRET" and s1.replayed is False


def test_create_replayed_answer_has_no_password(fake_api: FakeAPI) -> None:
    replay = {**SESSION_JSON, "ssh": {k: v for k, v in SESSION_JSON["ssh"].items() if k != "password"}}  # type: ignore[attr-defined]
    fake_api.answer = (200, {"Idempotent-Replayed": "true"}, json.dumps(replay).encode())
    with SessionsClient(fake_api.url, "t") as c:
        s = c.create_session(idempotency_key="k1")
    assert s.replayed is True and s.password is None and s.session_id == "sbx-abc"
    assert s == Session.from_dict(replay)  # replayed is not part of equality
    assert "replayed=True" in repr(s)


def test_create_retries_with_the_same_key(fake_api: FakeAPI, no_retry_pause: None) -> None:
    fake_api.queue = [(503, {}, b"unavailable"), (502, {}, b"<html>bad gateway</html>")]
    fake_api.answer = (201, {}, json.dumps(SESSION_JSON).encode())
    with SessionsClient(fake_api.url, "t") as c:
        s = c.create_session(metadata={"a": 1})
    assert s.session_id == "sbx-abc" and s.password == "SECRET"
    assert [call[0] for call in fake_api.calls] == ["POST"] * 3
    assert len({_key_of(call) for call in fake_api.calls}) == 1
    assert len({call[3] for call in fake_api.calls}) == 1  # the same body each time

    # Three failures: the last one is raised.
    fake_api.calls.clear()
    fake_api.answer = (500, {}, b'{"error": {"code": "internal", "message": "boom"}}')
    with SessionsClient(fake_api.url, "t") as c:
        with pytest.raises(SandboxOperationError, match="boom") as ei:
            c.create_session(idempotency_key="mine")
    assert ei.value.status_code == 500
    assert [_key_of(call) for call in fake_api.calls] == ["mine"] * 3


@pytest.mark.parametrize("status", [400, 401, 409, 413, 422, 429, 501])
def test_create_does_not_retry_other_answers(fake_api: FakeAPI, no_retry_pause: None, status: int) -> None:
    fake_api.answer = (status, {}, b'{"error": {"code": "x", "message": "no"}}')
    with SessionsClient(fake_api.url, "t") as c:
        with pytest.raises(SandboxAPIError) as ei:
            c.create_session()
    assert ei.value.status_code == status and len(fake_api.calls) == 1


def test_create_retries_after_a_lost_answer(raw_server: Callable[..., RawServer], no_retry_pause: None) -> None:
    """The first create reaches the gateway but its answer is lost (the
    connection drops): the retry carries the same key and gets the replay."""
    replay = {**SESSION_JSON, "ssh": {"username": "sandbox"}}
    body = json.dumps(replay).encode()

    def handler(conn: socket.socket, req: bytes) -> None:
        if len(srv.requests) == 1:
            conn.close()  # the answer is lost
            return
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nIdempotent-Replayed: true\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
        )

    srv = raw_server(handler)
    with SessionsClient(f"http://127.0.0.1:{srv.port}", "t", timeout=5) as c:
        s = c.create_session()
    assert s.replayed and s.password is None and s.session_id == "sbx-abc"
    keys = [
        line.split(b":", 1)[1].strip()
        for req in srv.requests
        for line in req.split(b"\r\n")
        if line.lower().startswith(b"idempotency-key:")
    ]
    assert len(srv.requests) == 2 and len(keys) == 2 and keys[0] == keys[1]


def test_create_retry_rules() -> None:
    import requests

    tls = SandboxConnectionError("tls")
    tls.__cause__ = requests.exceptions.SSLError("certificate verify failed")
    reset = SandboxConnectionError("reset")
    reset.__cause__ = requests.exceptions.ConnectionError("reset")
    assert not client_module._create_retryable(tls)
    assert client_module._create_retryable(reset)
    assert client_module._create_retryable(SandboxOperationError("x", status_code=504))
    assert not client_module._create_retryable(RateLimitError("x", status_code=429))
    assert client_module._create_retryable(SandboxOperationError("x", status_code=502, code="image_pull_failed"))
    assert not client_module._create_retryable(SandboxOperationError("x", status_code=502, code="image_pull_timeout"))
    assert not client_module._create_retryable(SandboxOperationError("x", status_code=503, code="image_store_full"))


# -- bounded command output ------------------------------------------------------


def _plain_cut(data: bytes, limit: int) -> str:
    if len(data) <= limit:
        return data.decode()
    head, tail = data[: limit // 2], data[len(data) - (limit - limit // 2) :]
    return head.decode() + f"\n[... {len(data) - limit} bytes dropped ...]\n" + tail.decode()


def test_output_buffer_keeps_head_and_tail_in_bounded_memory() -> None:
    rng = random.Random(4)
    for _ in range(300):
        data = bytes(rng.choice(b"abcdefgh\n") for _ in range(rng.randint(0, 3000)))
        limit = rng.randint(1, 1200)
        buf = OutputBuffer(limit)
        i = 0
        while i < len(data):
            n = rng.choice([1, 2, 7, 64, 500, 5000])
            buf.feed(data[i : i + n])
            i += n
            assert len(buf._head) + sum(len(c) for c in buf._tail) <= limit  # never more than the budget
            assert buf._tail_len == sum(len(c) for c in buf._tail)
        assert buf.total == len(data) and buf.truncated == (len(data) > limit)
        assert buf.text() == _plain_cut(data, limit), (len(data), limit)
    unbounded = OutputBuffer(None)
    for _ in range(100):
        unbounded.feed(b"x" * 1000)
    assert unbounded.text() == "x" * 100_000 and not unbounded.truncated


def test_output_buffer_cuts_between_characters() -> None:
    text = "aé€😀" * 300  # characters of 1, 2, 3 and 4 bytes
    data = text.encode()
    for limit in range(1, 60):
        buf = OutputBuffer(limit)
        buf.feed(data)
        out = buf.text()
        head, rest = out.split("\n[... ", 1)
        dropped, tail = rest.split(" bytes dropped ...]\n", 1)
        assert "\ufffd" not in out
        assert text.startswith(head) and text.endswith(tail)
        assert len(head.encode()) + len(tail.encode()) + int(dropped) == len(data)
        assert limit // 2 - 3 <= len(head.encode()) <= limit // 2
        assert limit - limit // 2 - 3 <= len(tail.encode()) <= limit - limit // 2
    # Invalid bytes inside the kept parts still become U+FFFD.
    buf = OutputBuffer(4)
    buf.feed(b"\xff\xfe" + b"x" * 10 + b"\xff\xfe")
    assert buf.text() == "\ufffd\ufffd\n[... 10 bytes dropped ...]\n\ufffd\ufffd"


@pytest.mark.parametrize(
    "bad,exc", [(0, ValueError), (-1, ValueError), (True, TypeError), ("10", TypeError), (1.5, TypeError)]
)
def test_max_output_bytes_checked(bad: object, exc: type) -> None:
    c = SessionSSHClient("http://127.0.0.1:1", "t", "sbx-1", "sandbox")
    with pytest.raises(exc, match="max_output_bytes"):
        c.run_command("true", max_output_bytes=bad)  # type: ignore[arg-type]
    with pytest.raises(SandboxOperationError, match="connect"):  # None and ints > 0 pass the check
        c.run_command("true", max_output_bytes=None)
    with pytest.raises(SandboxOperationError, match="connect"):
        c.run_command("true", max_output_bytes=1)


# -- data plane: error mapping and streams (fake gateway) ----------------------


def _err(code: str) -> bytes:
    return json.dumps({"error": {"code": code, "message": "m"}}).encode()


@pytest.mark.parametrize(
    "status,code,cls",
    [
        (404, "file_not_found", sdk.FileNotFoundInSandboxError),
        (403, "permission_denied", sdk.SandboxPermissionError),
        (413, "file_too_large", sdk.FileTooLargeError),
        (507, "disk_full", sdk.DiskFullError),
        (409, "is_a_directory", SandboxOperationError),
        (404, "not_found", SessionNotFoundError),
        (501, "not_implemented", SandboxOperationError),
    ],
)
def test_file_error_codes(fake_api: FakeAPI, status: int, code: str, cls: type) -> None:
    fake_api.answer = (status, {"Content-Type": "application/json"}, _err(code))
    with SessionsClient(fake_api.url, "t") as c:
        with pytest.raises(cls) as ei:
            c.read_file("sbx-abc", "dir/x.txt")
    assert type(ei.value) is cls and ei.value.code == code and ei.value.status_code == status
    if code in ("file_not_found", "permission_denied"):
        assert isinstance(ei.value, OSError) and getattr(ei.value, "filename", None) == "dir/x.txt"
    assert fake_api.calls[-1][1] == "/v1/sessions/sbx-abc/files?path=dir%2Fx.txt"


def test_process_and_shell_error_codes(fake_api: FakeAPI) -> None:
    fake_api.queue = [
        (404, {}, _err("process_not_found")),
        (409, {}, _err("process_exited")),
        (429, {"Retry-After": "2"}, _err("shell_busy")),
        (429, {}, _err("too_many_shells")),
        (404, {}, _err("shell_not_found")),
    ]
    with SessionsClient(fake_api.url, "t") as c:
        with pytest.raises(sdk.ProcessNotFoundError):
            c.get_process("sbx-abc", "p1")
        with pytest.raises(sdk.ProcessExitedError):
            c.signal_process("sbx-abc", "p1", "SIGTERM")
        with pytest.raises(sdk.ShellBusyError) as ei:
            c.run("sbx-abc", "true", shell="s")
        assert isinstance(ei.value, RateLimitError) and ei.value.retry_after == 2
        with pytest.raises(RateLimitError) as ei2:
            c.run("sbx-abc", "true", shell="s")
        assert type(ei2.value) is RateLimitError and ei2.value.code == "too_many_shells"
        assert c.delete_shell("sbx-abc", "s") is False
    assert json.loads(fake_api.calls[1][3]) == {"signal": "TERM"}
    assert json.loads(fake_api.calls[2][3]) == {"command": "true", "shell": "s"}


def test_run_request_body_and_result(fake_api: FakeAPI) -> None:
    answer = {
        "exitCode": None,
        "exitSignal": "KILL",
        "stdoutBase64": "/w==",
        "stderr": "e",
        "truncated": True,
        "timedOut": False,
        "durationMs": 12,
        "cwd": "/workspace",
    }
    fake_api.answer = (200, {"Content-Type": "application/json"}, json.dumps(answer).encode())
    with SessionsClient(fake_api.url, "t") as c:
        res = c.run(
            "sbx-abc", argv=["a", ""], stdin=b"\x00", env={"LANG": "C"}, cwd="d", timeout=2.5, max_output_bytes=0
        )
    assert (res.stdout, res.stderr, res.exit_code, res.exit_signal) == ("\ufffd", "e", 137, "KILL")
    assert (res.truncated, res.timed_out, res.duration_ms, res.cwd) == (True, False, 12, "/workspace")
    method, path, headers, body = fake_api.calls[-1]
    assert (method, path) == ("POST", "/v1/sessions/sbx-abc/commands")
    assert json.loads(body) == {
        "argv": ["a", ""],
        "stdinBase64": "AA==",
        "env": {"LANG": "C"},
        "cwd": "d",
        "timeout": 2.5,
        "maxOutputBytes": 0,
    }


def _ndjson(*lines: dict) -> bytes:
    return b"".join(json.dumps(x).encode() + b"\n" for x in lines)


def test_streamed_run_edge_cases(fake_api: FakeAPI) -> None:
    nd = {"Content-Type": "application/x-ndjson"}
    fake_api.queue = [
        (200, nd, _ndjson({"stdout": "a"}, {"error": {"code": "internal", "message": "the command could not run"}})),
        (200, nd, _ndjson({"stdout": "a"})),
        (200, {"Content-Type": "application/json"}, json.dumps({"exitCode": 0, "stdout": "whole"}).encode()),
    ]
    seen: List[object] = []
    with SessionsClient(fake_api.url, "t") as c:
        with pytest.raises(SandboxOperationError) as ei:
            c.run("sbx-abc", "x", on_stdout=seen.append)
        assert ei.value.code == "internal"
        with pytest.raises(sdk.SandboxConnectionError):
            c.run("sbx-abc", "x", on_stdout=seen.append)
        # A gateway that does not stream: the callback gets the whole output once.
        assert c.run("sbx-abc", "x", on_stdout=seen.append).stdout == "whole"
    assert seen == ["a", "a", "whole"]
    assert fake_api.calls[0][2].get("Accept") == "application/x-ndjson"


def test_send_process_input_splits_large_data(fake_api: FakeAPI) -> None:
    fake_api.answer = (204, {}, b"")
    with SessionsClient(fake_api.url, "t") as c:
        c.send_process_input("sbx-abc", "p1", "small")
        c.send_process_input("sbx-abc", "p1", b"x" * (100 * 1024), eof=True)
        c.send_process_input("sbx-abc", "p1", "", eof=True)
        c.send_process_input("sbx-abc", "p1", "")  # nothing to send
    bodies = [json.loads(b) for _, _, _, b in fake_api.calls]
    assert bodies[0] == {"data": "small"}
    big = bodies[1:4]
    assert all(len(json.dumps(b)) < 64 * 1024 for b in big)
    assert [b.get("eof") for b in big] == [None, None, True]
    assert sum(len(base64.b64decode(b["dataBase64"])) for b in big) == 100 * 1024
    assert bodies[4:] == [{"eof": True}]
