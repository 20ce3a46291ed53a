"""429 handling against a gateway started with --rate-limit 3."""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Iterator

import pytest
from conftest import Gateway, start_gateway

from sandbox_sessions_sdk import (
    HTTPConnectTunnel,
    RateLimitError,
    SandboxAPIError,
    SessionsClient,
    SessionSSHClient,
)


@pytest.fixture(scope="module")
def limited(sandgate_bin: str, scratch: Path) -> Iterator[Gateway]:
    """3 requests per minute and 1 live session per tenant; tenants a, b and c."""
    a, b, c = secrets.token_hex(16), secrets.token_hex(16), secrets.token_hex(16)
    gw = start_gateway(
        sandgate_bin,
        scratch,
        "--rate-limit",
        "3",
        "--max-sessions-per-tenant",
        "1",
        keys=[f"a:{a}", f"b:{b}", f"c:{c}"],
    )
    gw.other_token = b
    try:
        yield gw
    finally:
        gw.stop()


def test_rest_rate_limit(limited: Gateway) -> None:
    with SessionsClient(limited.url, limited.token) as c:
        s = c.create_session(ttl=60)  # 1
        c.get_session(s.session_id)  # 2
        c.list_sessions()  # 3
        with pytest.raises(RateLimitError) as ei:
            c.list_sessions()  # 4
    e = ei.value
    assert isinstance(e, SandboxAPIError)
    assert e.status_code == 429 and e.code == "rate_limited"
    assert e.limit == 3 and e.remaining == 0
    assert e.reset is not None and time.time() - 5 <= e.reset <= time.time() + 65
    assert e.retry_after is not None and 0 <= e.retry_after <= 61


def test_connect_rate_limit(limited: Gateway) -> None:
    token = limited.other_token
    assert token
    with SessionsClient(limited.url, token) as c:
        s = c.create_session(ttl=60)  # 1
    for _ in range(2):  # 2, 3
        HTTPConnectTunnel(limited.url, token, s.session_id, timeout=5).open().close()
    with pytest.raises(RateLimitError) as ei:
        HTTPConnectTunnel(limited.url, token, s.session_id, timeout=5).open()  # 4
    e = ei.value
    assert e.status_line and "429" in e.status_line
    assert e.limit == 3 and e.remaining == 0
    with pytest.raises(RateLimitError):  # its host key lookup is rate limited too
        SessionSSHClient(limited.url, token, s.session_id, "sandbox").connect()


def test_session_quota_is_a_rate_limit_error(limited: Gateway) -> None:
    token = limited.tokens[2]
    with SessionsClient(limited.url, token) as c:
        c.create_session(ttl=60)  # request 1, session 1 of 1
        with pytest.raises(RateLimitError) as ei:
            c.create_session(ttl=60)  # request 2: over the session quota
    e = ei.value
    assert e.status_code == 429 and e.code == "quota_exceeded"
    assert "max-sessions-per-tenant" in str(e)
    # Not a request-rate problem: the rate limit headers still show room.
    assert e.limit == 3 and e.remaining is not None and e.remaining > 0


@pytest.fixture(scope="module")
def startups(sandgate_bin: str, scratch: Path) -> Iterator[Gateway]:
    """Two tunnels per principal in SSH authentication, for 2 s each."""
    gw = start_gateway(
        sandgate_bin,
        scratch,
        "--ssh-max-startups-per-principal",
        "2",
        "--ssh-handshake-timeout",
        "2s",
    )
    try:
        yield gw
    finally:
        gw.stop()


def test_connect_startup_budget(startups: Gateway) -> None:
    with SessionsClient(startups.url, startups.token) as c:
        s = c.create_session(ttl=60)
    # Two tunnels that never start SSH hold the principal's budget ...
    stalled = [HTTPConnectTunnel(startups.url, startups.token, s.session_id, timeout=5) for _ in range(2)]
    for t in stalled:
        t.open()
    try:
        # ... so a third is refused, with no time left to retry in ...
        with pytest.raises(RateLimitError) as ei:
            HTTPConnectTunnel(startups.url, startups.token, s.session_id, timeout=0.5).open()
        e = ei.value
        assert e.status_code == 429 and e.code == "too_many_ssh_startups"
        assert e.retry_after is not None and e.retry_after >= 1
        # ... and retried until the stalled ones reach their handshake deadline.
        t0 = time.monotonic()
        HTTPConnectTunnel(startups.url, startups.token, s.session_id, timeout=15).open().close()
        assert time.monotonic() - t0 < 15
    finally:
        for t in stalled:
            t.close()
