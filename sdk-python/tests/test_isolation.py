"""IsolationWarning: a gateway that answers sessions with ``"isolation":
"none"`` (its workdir driver) makes the SDK warn once per process per
gateway URL."""

from __future__ import annotations

import asyncio
import json
import threading
import warnings
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, Iterator, List

import pytest

import sandbox_sessions_sdk as sdk
from sandbox_sessions_sdk import AsyncSessionsClient, IsolationWarning, SessionsClient

SESSION: Dict[str, Any] = {
    "sessionId": "sbx-aaaaaaaaaaaaaaaaaaaa",
    "status": "running",
    "image": "default",
    "metadata": {},
    "createdAt": "2026-01-01T00:00:00Z",
    "expiresAt": "2026-01-01T01:00:00Z",
}


class Gateway:
    """A fake REST API answering every session call with one session."""

    def __init__(self, isolation: bool) -> None:
        session = dict(SESSION)
        if isolation:
            session.update(isolation="none", unenforced=["memoryMiB", "cpus", "pids", "diskMiB"])
        self.session = session
        gw = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                if n:
                    self.rfile.read(n)
                if self.path.startswith("/v1/sessions?"):
                    data: Any = {"sessions": [gw.session], "total": 1, "limit": 50, "offset": 0}
                else:
                    data = gw.session
                body = json.dumps(data).encode()
                self.send_response(201 if self.command == "POST" else 200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PATCH = _answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def unisolated() -> Iterator[Gateway]:
    gw = Gateway(isolation=True)
    yield gw
    gw.close()


@pytest.fixture
def isolated() -> Iterator[Gateway]:
    gw = Gateway(isolation=False)
    yield gw
    gw.close()


def _isolation_warnings(caught: List[warnings.WarningMessage]) -> List[warnings.WarningMessage]:
    return [w for w in caught if issubclass(w.category, IsolationWarning)]


def test_sync_client_warns_once(unisolated: Gateway) -> None:
    assert issubclass(IsolationWarning, UserWarning) and "IsolationWarning" in sdk.__all__
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with SessionsClient(unisolated.url, "t") as c:
            s = c.create_session()
            assert s.isolation == "none"
            c.get_session(s.session_id)
            c.list_sessions()
            c.update_session(s.session_id, ttl=600)
    found = _isolation_warnings(caught)
    assert len(found) == 1, [str(w.message) for w in caught]
    msg = str(found[0].message)
    assert '"isolation": "none"' in msg and "memoryMiB" in msg and unisolated.url in msg
    assert found[0].filename == __file__  # it points at the caller's line


def test_warns_once_per_process_per_gateway(unisolated: Gateway) -> None:
    """More clients of the same gateway (sync, async, the URL spelled with
    /v1, a slash or upper case) do not warn again; another gateway does."""

    async def use_async(url: str) -> None:
        async with AsyncSessionsClient(url, "t") as c:
            await c.list_sessions()

    other = Gateway(isolation=True)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for url in [unisolated.url, unisolated.url + "/", unisolated.url + "/v1", unisolated.url.upper()]:
                with SessionsClient(url, "t") as c:
                    c.create_session()
                    c.list_sessions()
            asyncio.run(use_async(unisolated.url))
            assert len(_isolation_warnings(caught)) == 1, [str(w.message) for w in caught]
            with SessionsClient(other.url, "t") as c:
                c.list_sessions()
            asyncio.run(use_async(other.url + "/v1/"))
        found = _isolation_warnings(caught)
        assert len(found) == 2, [str(w.message) for w in caught]
        assert other.url in str(found[1].message)
    finally:
        other.close()


def test_threads_warn_once(unisolated: Gateway) -> None:
    """Clients in several threads at once: still one warning."""
    barrier = threading.Barrier(8)

    def work() -> None:
        with SessionsClient(unisolated.url, "t") as c:
            barrier.wait(10)
            c.list_sessions()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert len(_isolation_warnings(caught)) == 1


def test_async_client_warns_once(unisolated: Gateway) -> None:
    async def main() -> None:
        async with AsyncSessionsClient(unisolated.url, "t") as c:
            s = await c.create_session()
            await c.get_session(s.session_id)
            await c.list_sessions()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(main())
    assert len(_isolation_warnings(caught)) == 1


def test_isolated_gateway_does_not_warn(isolated: Gateway) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with SessionsClient(isolated.url, "t") as c:
            s = c.create_session()
            c.list_sessions()
            assert s.isolation is None
    assert _isolation_warnings(caught) == []


def test_warning_can_be_filtered(unisolated: Gateway) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.simplefilter("ignore", IsolationWarning)
        with SessionsClient(unisolated.url, "t") as c:
            c.create_session()
