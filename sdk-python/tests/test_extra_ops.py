"""The methods docs/sdk.md's table needed and the clients lacked
(_extra_ops.py), against the real gateway: stop_session, run_python,
reset_python, session_logs, list_images, host_keys, file_link,
create_ticket; sync and async."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from sandbox_sessions_sdk import Session, SessionNotFoundError, SessionsClient
from sandbox_sessions_sdk.aio import AsyncSessionsClient

from conftest import Gateway


def test_stop_and_kernel(client: SessionsClient, session: Session) -> None:
    sid = session.session_id
    client.write_file(sid, "keep.txt", b"kept")
    assert client.run_python(sid, "x = 20\nx + 1")["result"] == "21"
    assert client.stop_session(sid).status == "stopped"
    assert client.run(sid, "cat keep.txt").stdout == "kept"
    # The stop ended the kernel: its state is gone.
    r = client.run_python(sid, "x")
    assert r["error"]["name"] == "NameError"
    assert client.reset_python(sid) == {"kernel": "default", "existed": True}
    assert client.reset_python(sid, kernel="never") == {"kernel": "never", "existed": False}
    with pytest.raises(ValueError):
        client.run_python(sid, "1", kernel="bad name")
    with pytest.raises(SessionNotFoundError):
        client.stop_session("sbx-aaaaaaaaaaaaaaaaaaaa")


def test_logs_images_keys_links_tickets(client: SessionsClient, session: Session) -> None:
    sid = session.session_id
    client.run(sid, "echo for-the-logs")
    logs = client.session_logs(sid, tail=50)
    assert "== commands" in logs and "echo for-the-logs" in logs
    with pytest.raises(ValueError):
        client.session_logs(sid, tail=0)
    images = client.list_images()
    assert isinstance(images["images"], list) and isinstance(images["allow"], list)
    assert client.host_keys() == session.host_keys
    client.write_file(sid, "linked.txt", b"by link")
    link = client.file_link(sid, "linked.txt", expires_in=60)
    assert httpx.get(link["url"]).text == "by link"
    t = client.create_ticket(sid)
    assert t["sessionId"] == sid and len(t["ticket"]) > 10


def test_async_twins(gateway: Gateway, client: SessionsClient, session: Session) -> None:
    sid = session.session_id

    async def main() -> None:
        async with AsyncSessionsClient(api_url=gateway.url, bearer_token=gateway.token) as c:
            assert (await c.run_python(sid, "6 * 7"))["result"] == "42"
            assert (await c.reset_python(sid))["existed"] is True
            assert (await c.host_keys()) == session.host_keys
            assert "allow" in await c.list_images()
            await c.run(sid, "echo async-logs")
            assert "async-logs" in await c.session_logs(sid)
            await c.write_file(sid, "a.txt", b"a")
            assert (await c.file_link(sid, "a.txt"))["url"].startswith("http")
            assert (await c.create_ticket(sid))["sessionId"] == sid
            assert (await c.stop_session(sid)).status == "stopped"

    asyncio.run(main())
