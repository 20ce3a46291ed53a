"""TTL extension, resources and labels, against the real gateway."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from conftest import Gateway, start_gateway

from sandbox_sessions_sdk import (
    InvalidResourcesError,
    ResourcesExceededError,
    SandboxOperationError,
    Session,
    SessionNotFoundError,
    SessionsClient,
)


def test_update_session_moves_expiry(gateway: Gateway, client: SessionsClient, session: Session) -> None:
    before = datetime.now(timezone.utc)
    s = client.update_session(session.session_id, ttl=7200)
    assert isinstance(s, Session) and s.session_id == session.session_id
    assert s.ttl == 7200 and s.password is None
    assert s.expires_at is not None
    assert before + timedelta(seconds=7199) <= s.expires_at <= datetime.now(timezone.utc) + timedelta(seconds=7201)
    got = client.get_session(session.session_id)
    assert got.ttl == 7200 and got.expires_at == s.expires_at
    # No ttl: nothing changes.
    assert client.update_session(session.session_id).expires_at == s.expires_at
    # Shorter: the expiry comes closer.
    assert client.update_session(session.session_id, ttl=60).expires_at < s.expires_at


def test_update_session_errors(gateway: Gateway, client: SessionsClient, session: Session) -> None:
    for bad in (59, 28801):
        with pytest.raises(ValueError):
            client.update_session(session.session_id, ttl=bad)
    with pytest.raises(TypeError):
        client.update_session(session.session_id, ttl="600")  # type: ignore[arg-type]
    with pytest.raises(SessionNotFoundError):
        client.update_session("sbx-aaaaaaaaaaaaaaaaaaaa", ttl=600)
    with SessionsClient(api_url=gateway.url, bearer_token=gateway.other_token) as other:
        with pytest.raises(SessionNotFoundError):
            other.update_session(session.session_id, ttl=600)
    # The server's own check, past the SDK's.
    with pytest.raises(SandboxOperationError) as ei:
        client._request("PATCH", f"/sessions/{session.session_id}", what="raw", json={"ttl": 5})
    assert ei.value.status_code == 400 and ei.value.code == "invalid_ttl"
    with pytest.raises(SandboxOperationError) as ei:
        client._request("PATCH", f"/sessions/{session.session_id}", what="raw", json={"image": "x"})
    assert ei.value.code == "unknown_field"


def test_create_with_resources_and_labels(client: SessionsClient) -> None:
    s = client.create_session(ttl=120, resources={"memoryMiB": 1024, "cpus": 1.5}, labels={"team": "sdk"})
    try:
        assert s.metadata == {"team": "sdk"}
        assert s.resources == {"memoryMiB": 1024, "cpus": 1.5, "pids": 256, "diskMiB": 1024}
        assert client.get_session(s.session_id).resources == s.resources
    finally:
        client.delete_session(s.session_id)
    d = client.create_session(ttl=120)
    try:
        assert d.resources == {"memoryMiB": 512, "cpus": 1, "pids": 256, "diskMiB": 1024}
    finally:
        client.delete_session(d.session_id)


def test_resource_errors(client: SessionsClient) -> None:
    with pytest.raises(ResourcesExceededError) as ei:
        client.create_session(resources={"memoryMiB": 1 << 20})
    e = ei.value
    assert isinstance(e, SandboxOperationError)
    assert e.status_code == 400 and e.code == "resources_exceeded" and e.resource == "memoryMiB"
    assert "2048" in e.message
    with pytest.raises(ResourcesExceededError) as ei:
        client.create_session(resources={"pids": 100000})
    assert ei.value.resource == "pids"
    with pytest.raises(InvalidResourcesError) as ei2:
        client.create_session(resources={"memoryMiB": 1})
    assert ei2.value.code == "invalid_resources" and ei2.value.resource == "memoryMiB"
    # Checked before anything is sent.
    with pytest.raises(ValueError):
        client.create_session(resources={"swapMiB": 1})
    with pytest.raises(ValueError):
        client.create_session(resources={"pids": 0})
    with pytest.raises(TypeError):
        client.create_session(resources={"memoryMiB": "1G"})
    with pytest.raises(TypeError):
        client.create_session(resources={"pids": 1.5})
    with pytest.raises(TypeError):
        client.create_session(resources=[1])  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        client.create_session(metadata={"a": 1}, labels={"b": 2})


def test_resource_caps_from_flags(sandgate_bin: str, scratch: Path) -> None:
    gw = start_gateway(sandgate_bin, scratch, "--sandbox-memory", "256MiB", "--sandbox-max-memory", "1GiB")
    try:
        with SessionsClient(api_url=gw.url, bearer_token=gw.token) as c:
            s = c.create_session(ttl=120, resources={"memoryMiB": 1024})
            assert s.resources is not None and s.resources["memoryMiB"] == 1024
            assert c.create_session(ttl=120).resources["memoryMiB"] == 256  # type: ignore[index]
            with pytest.raises(ResourcesExceededError) as ei:
                c.create_session(resources={"memoryMiB": 1025})
            assert "1024" in ei.value.message and "sandbox-max-memory" in ei.value.message
    finally:
        gw.stop()
