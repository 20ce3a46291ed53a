"""AsyncSessionsClient against fake servers: a mirror of test_unit.py's REST
parts (error mapping, create retries, data plane bodies and streams), and
of test_tls.py (verify_ssl) against the real gateway over HTTPS."""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import socket
import ssl
import uuid
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterator, List, Tuple

import httpx
import pytest
from conftest import Gateway, start_gateway
from test_tls import _self_signed
from test_unit import SESSION_JSON, FakeAPI, RawServer

import sandbox_sessions_sdk as sdk
from sandbox_sessions_sdk import (
    AsyncSessionsClient,
    AsyncSessionSSHClient,
    RateLimitError,
    SandboxAPIError,
    SandboxConnectionError,
    SandboxOperationError,
    SessionNotFoundError,
    UnauthorizedError,
)
from sandbox_sessions_sdk import aio as aio_module


def arun(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]


@pytest.fixture
def fake_api() -> Iterator[FakeAPI]:
    api = FakeAPI()
    yield api
    api.close()


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


@pytest.fixture
def no_retry_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aio_module, "_CREATE_RETRY_DELAYS", (0.0, 0.0))


def _key_of(call: Tuple[str, str, dict, bytes]) -> str:
    keys = [v for k, v in call[2].items() if k.lower() == "idempotency-key"]
    assert len(keys) == 1, call[2]
    return str(keys[0])


def _err(code: str) -> bytes:
    return json.dumps({"error": {"code": code, "message": "m"}}).encode()


def _ndjson(*lines: dict) -> bytes:
    return b"".join(json.dumps(x).encode() + b"\n" for x in lines)


# -- errors ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "status,body,ctype,cls,needle",
    [
        (502, b"<html><body>Bad Gateway</body></html>", "text/html", SandboxOperationError, "Bad Gateway"),
        (401, b"nope", "text/plain", UnauthorizedError, "nope"),
        (404, b"", "text/plain", SessionNotFoundError, "Not Found"),
        (429, b"slow down", "text/plain", RateLimitError, "slow down"),
        (500, b'{"error": "plain string"}', "application/json", SandboxOperationError, "plain string"),
    ],
)
def test_error_bodies(fake_api: FakeAPI, status: int, body: bytes, ctype: str, cls: type, needle: str) -> None:
    fake_api.answer = (status, {"Content-Type": ctype}, body)

    async def main() -> None:
        async with AsyncSessionsClient(fake_api.url, "t") as c:
            with pytest.raises(cls) as ei:
                await c.get_session("sbx-abc")
        assert type(ei.value) is cls and ei.value.status_code == status
        assert needle in str(ei.value) or needle in (ei.value.body or "")

    arun(main())


def test_rate_limit_headers_and_non_json_success(fake_api: FakeAPI) -> None:
    fake_api.queue = [
        (
            429,
            {
                "X-RateLimit-Limit": "3",
                "X-RateLimit-Remaining": "0",
                "X-RateLimit-Reset": "1795646144",
                "Retry-After": "17",
            },
            b'{"error": {"code": "rate_limited", "message": "too many"}}',
        ),
        (200, {"Content-Type": "text/html"}, b"<html>login page</html>"),
    ]

    async def main() -> None:
        async with AsyncSessionsClient(fake_api.url, "t") as c:
            with pytest.raises(RateLimitError) as ei:
                await c.list_sessions()
            e = ei.value
            assert (e.limit, e.remaining, e.reset, e.retry_after, e.code) == (3, 0, 1795646144, 17.0, "rate_limited")
            with pytest.raises(SandboxOperationError, match="not JSON"):
                await c.get_session("sbx-abc")

    arun(main())


def test_arguments_checked_before_sending(fake_api: FakeAPI) -> None:
    async def main() -> None:
        async with AsyncSessionsClient(fake_api.url, "t") as c:
            for call in (
                lambda: c.create_session(ttl=10),
                lambda: c.create_session(metadata={}, labels={}),
                lambda: c.create_session(egress="pypi.org"),  # type: ignore[arg-type]
                lambda: c.get_session(""),
                lambda: c.run("sbx-abc"),
                lambda: c.run("sbx-abc", "x", shell="bad name"),
                lambda: c.write_file("sbx-abc", "f", b"x", mode=0o1777),
                lambda: c.signal_process("sbx-abc", "p1", "NOPE"),
                lambda: c.list_sessions(limit=0),
            ):
                with pytest.raises((ValueError, TypeError)):
                    await call()
        assert fake_api.calls == []

    arun(main())


# -- create: Idempotency-Key and retries ---------------------------------------


def test_create_key_replay_and_retries(fake_api: FakeAPI, no_retry_pause: None) -> None:
    replay = {**SESSION_JSON, "ssh": {"username": "sandbox"}}
    fake_api.queue = [
        (503, {}, b"unavailable"),
        (502, {}, b"<html>bad gateway</html>"),
        (201, {}, json.dumps(SESSION_JSON).encode()),
        (200, {"Idempotent-Replayed": "true"}, json.dumps(replay).encode()),
    ]
    fake_api.answer = (500, {}, b'{"error": {"code": "internal", "message": "boom"}}')

    async def main() -> None:
        async with AsyncSessionsClient(fake_api.url, "t") as c:
            s = await c.create_session(metadata={"a": 1})
            assert s.session_id == "sbx-abc" and s.password == "SECRET" and s.replayed is False
            r = await c.create_session(idempotency_key="k1")
            assert r.replayed is True and r.password is None
            with pytest.raises(SandboxOperationError, match="boom") as ei:
                await c.create_session(idempotency_key="mine")
            assert ei.value.status_code == 500

    arun(main())
    keys = [_key_of(call) for call in fake_api.calls]
    assert len(set(keys[:3])) == 1 and uuid.UUID(keys[0]).version == 4
    assert len({call[3] for call in fake_api.calls[:3]}) == 1  # the same body each time
    assert keys[3:] == ["k1", "mine", "mine", "mine"]


@pytest.mark.parametrize("status", [400, 401, 409, 429, 501])
def test_create_does_not_retry_other_answers(fake_api: FakeAPI, no_retry_pause: None, status: int) -> None:
    fake_api.answer = (status, {}, b'{"error": {"code": "x", "message": "no"}}')

    async def main() -> None:
        async with AsyncSessionsClient(fake_api.url, "t") as c:
            with pytest.raises(SandboxAPIError) as ei:
                await c.create_session()
        assert ei.value.status_code == status

    arun(main())
    assert len(fake_api.calls) == 1


def test_create_retries_after_a_lost_answer(raw_server: Callable[..., RawServer], no_retry_pause: None) -> None:
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

    async def main() -> None:
        async with AsyncSessionsClient(f"http://127.0.0.1:{srv.port}", "t", timeout=5) as c:
            s = await c.create_session()
        assert s.replayed and s.session_id == "sbx-abc"

    arun(main())
    keys = [
        line.split(b":", 1)[1].strip()
        for req in srv.requests
        for line in req.split(b"\r\n")
        if line.lower().startswith(b"idempotency-key:")
    ]
    assert len(srv.requests) == 2 and len(keys) == 2 and keys[0] == keys[1]


def test_create_retry_rules() -> None:
    tls = SandboxConnectionError("tls")
    cause = httpx.ConnectError("certificate verify failed")
    cause.__context__ = ssl.SSLCertVerificationError("certificate verify failed")
    tls.__cause__ = cause
    reset = SandboxConnectionError("reset")
    reset.__cause__ = httpx.ConnectError("reset")
    assert not aio_module._create_retryable(tls)
    assert aio_module._create_retryable(reset)
    assert aio_module._create_retryable(SandboxOperationError("x", status_code=504))
    assert not aio_module._create_retryable(RateLimitError("x", status_code=429))
    assert not aio_module._create_retryable(SandboxOperationError("x", status_code=502, code="image_pull_timeout"))
    assert not aio_module._create_retryable(SandboxOperationError("x", status_code=503, code="image_store_full"))


# -- data plane ------------------------------------------------------------------


def test_data_plane_error_codes(fake_api: FakeAPI) -> None:
    fake_api.queue = [
        (404, {}, _err("file_not_found")),
        (507, {}, _err("disk_full")),
        (404, {}, _err("process_not_found")),
        (409, {}, _err("process_exited")),
        (429, {"Retry-After": "2"}, _err("shell_busy")),
        (404, {}, _err("shell_not_found")),
    ]

    async def main() -> None:
        async with AsyncSessionsClient(fake_api.url, "t") as c:
            with pytest.raises(sdk.FileNotFoundInSandboxError) as ei:
                await c.read_file("sbx-abc", "dir/x.txt")
            assert ei.value.filename == "dir/x.txt" and isinstance(ei.value, OSError)
            with pytest.raises(sdk.DiskFullError):
                await c.list_files("sbx-abc", "d")  # a GET: the fake server has no PUT
            with pytest.raises(sdk.ProcessNotFoundError):
                await c.get_process("sbx-abc", "p1")
            with pytest.raises(sdk.ProcessExitedError):
                await c.signal_process("sbx-abc", "p1", "SIGTERM")
            with pytest.raises(sdk.ShellBusyError) as busy:
                await c.run("sbx-abc", "true", shell="s")
            assert busy.value.retry_after == 2
            assert await c.delete_shell("sbx-abc", "s") is False

    arun(main())
    assert fake_api.calls[0][1] == "/v1/sessions/sbx-abc/files?path=dir%2Fx.txt"
    assert json.loads(fake_api.calls[3][3]) == {"signal": "TERM"}


def test_run_body_stream_edge_cases_and_stdin_split(fake_api: FakeAPI) -> None:
    nd = {"Content-Type": "application/x-ndjson"}
    answer = {"exitCode": None, "exitSignal": "KILL", "stdoutBase64": "/w==", "stderr": "e", "durationMs": 12}
    fake_api.queue = [
        (200, {"Content-Type": "application/json"}, json.dumps(answer).encode()),
        (200, nd, _ndjson({"stdout": "a"}, {"error": {"code": "internal", "message": "could not run"}})),
        (200, nd, _ndjson({"stdout": "a"})),
        (200, {"Content-Type": "application/json"}, json.dumps({"exitCode": 0, "stdout": "whole"}).encode()),
    ]
    fake_api.answer = (204, {}, b"")
    seen: List[object] = []

    async def main() -> None:
        async with AsyncSessionsClient(fake_api.url, "t") as c:
            res = await c.run("sbx-abc", argv=["a", ""], stdin=b"\x00", env={"LANG": "C"}, timeout=2.5)
            assert (res.stdout, res.stderr, res.exit_code, res.exit_signal) == ("\ufffd", "e", 137, "KILL")
            with pytest.raises(SandboxOperationError) as ei:
                await c.run("sbx-abc", "x", on_stdout=seen.append)
            assert ei.value.code == "internal"
            with pytest.raises(SandboxConnectionError):
                await c.run("sbx-abc", "x", on_stdout=seen.append)
            assert (await c.run("sbx-abc", "x", on_stdout=seen.append)).stdout == "whole"
            await c.send_process_input("sbx-abc", "p1", b"x" * (100 * 1024), eof=True)

    arun(main())
    assert seen == ["a", "a", "whole"]
    assert json.loads(fake_api.calls[0][3]) == {
        "argv": ["a", ""],
        "stdinBase64": "AA==",
        "env": {"LANG": "C"},
        "timeout": 2.5,
    }
    assert fake_api.calls[1][2].get("Accept") == "application/x-ndjson"
    big = [json.loads(b) for _, _, _, b in fake_api.calls[4:]]
    assert [b.get("eof") for b in big] == [None, None, True]
    assert sum(len(base64.b64decode(b["dataBase64"])) for b in big) == 100 * 1024


# -- TLS (mirror of test_tls.py) -------------------------------------------------


@pytest.fixture(scope="module")
def tls_gateway(sandgate_bin: str, scratch: Path) -> Iterator[Tuple[Gateway, str]]:
    d = scratch / "tls-async"
    d.mkdir(exist_ok=True)
    cert, key = _self_signed(d)
    gw = start_gateway(
        sandgate_bin, scratch, "--tls-cert", cert, "--tls-key", key, keys=[secrets.token_hex(16)], scheme="https"
    )
    try:
        yield gw, cert
    finally:
        gw.stop()


def test_tls_untrusted_refused_then_ca_bundle_and_no_verify(tls_gateway: Tuple[Gateway, str]) -> None:
    gw, cert = tls_gateway

    async def main() -> None:
        async with AsyncSessionsClient(gw.url, gw.token) as c:
            with pytest.raises(SandboxConnectionError, match="TLS"):
                await c.list_sessions()
        for verify_ssl in (cert, False):
            async with AsyncSessionsClient(gw.url, gw.token, verify_ssl=verify_ssl) as c:
                s = await c.create_session(ttl=60)
                try:
                    async with AsyncSessionSSHClient(gw.url, gw.token, s.session_id, verify_ssl=verify_ssl) as ssh:
                        assert (await ssh.run_command("echo tls")).stdout == "tls\n"
                    assert (await c.run(s.session_id, "echo rest")).stdout == "rest\n"
                finally:
                    await c.delete_session(s.session_id)

    arun(main())
