"""SessionsClient against the real gateway."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import List, Tuple

import pytest
from conftest import Gateway

from sandbox_sessions_sdk import (
    HTTPConnectTunnel,
    SandboxOperationError,
    Session,
    SessionGoneError,
    SessionNotFoundError,
    SessionsClient,
    SessionSSHClient,
    UnauthorizedError,
)


def test_create_get_list_delete(client: SessionsClient) -> None:
    s = client.create_session(ttl=120, metadata={"project": "demo", "n": 1})
    try:
        assert isinstance(s, Session)
        assert s.session_id.startswith("sbx-")
        assert s.status == "running"
        assert s.image == "default"
        assert s.metadata == {"project": "demo", "n": 1}
        assert s.ttl == 120
        assert isinstance(s.created_at, datetime) and s.created_at.tzinfo is not None
        assert s.expires_at is not None
        delta = (s.expires_at - s.created_at).total_seconds()
        assert 119 <= delta <= 121
        assert abs((datetime.now(timezone.utc) - s.created_at).total_seconds()) < 60
        assert s.username == "sandbox"
        assert s.password, "the create response carries the SSH password"
        assert s.host_keys and s.host_keys[0].startswith("ssh-ed25519 ")
        assert any(k.startswith("ssh-rsa ") for k in s.host_keys)
        assert s.connect_path == f"/v1/sessions/{s.session_id}"

        got = client.get_session(s.session_id)
        assert got.session_id == s.session_id
        assert got.metadata == s.metadata
        assert got.password is None, "only the create response carries the password"
        assert got.host_keys == s.host_keys

        page = client.list_sessions(limit=100)
        assert set(page) == {"sessions", "total", "limit", "offset"}
        assert page["limit"] == 100 and page["offset"] == 0
        assert s.session_id in [x.session_id for x in page["sessions"]]
        assert all(isinstance(x, Session) for x in page["sessions"])
    finally:
        assert client.delete_session(s.session_id) is None
    with pytest.raises(SessionGoneError) as ei:
        client.get_session(s.session_id)
    assert ei.value.status_code == 410 and ei.value.code == "session_gone"
    with pytest.raises(SessionNotFoundError):
        client.delete_session(s.session_id)


def test_defaults_and_image(client: SessionsClient) -> None:
    s = client.create_session(image="default")
    try:
        assert s.ttl == 3600 and s.metadata == {} and s.image == "default"
    finally:
        client.delete_session(s.session_id)


def test_list_pagination(client: SessionsClient) -> None:
    created = [client.create_session(ttl=60, metadata={"page": i}) for i in range(3)]
    try:
        total = client.list_sessions(limit=100)["total"]
        assert total >= 3
        seen = []
        for offset in range(0, total, 2):
            page = client.list_sessions(limit=2, offset=offset)
            assert page["limit"] == 2 and page["offset"] == offset and page["total"] == total
            assert len(page["sessions"]) <= 2
            seen += [x.session_id for x in page["sessions"]]
        assert len(seen) == len(set(seen)) == total
        assert {c.session_id for c in created} <= set(seen)
        beyond = client.list_sessions(limit=5, offset=total + 10)
        assert beyond["sessions"] == [] and beyond["total"] == total
    finally:
        for c in created:
            client.delete_session(c.session_id)


def test_api_url_ending_in_v1(gateway: Gateway) -> None:
    for url in (gateway.url + "/v1", gateway.url + "/v1/", gateway.url + "/"):
        with SessionsClient(api_url=url, bearer_token=gateway.token) as c:
            s = c.create_session(ttl=60)
            assert c.get_session(s.session_id).session_id == s.session_id
            c.delete_session(s.session_id)


def test_bad_token_is_unauthorized(gateway: Gateway) -> None:
    with SessionsClient(gateway.url, "not-the-token") as c:
        for call in (c.list_sessions, lambda: c.create_session(), lambda: c.get_session("sbx-x")):
            with pytest.raises(UnauthorizedError) as ei:
                call()
            assert ei.value.status_code == 401
            assert ei.value.code == "unauthorized"
            assert "not-the-token" not in str(ei.value)


def test_other_tenants_session_is_not_found(gateway: Gateway, session: Session) -> None:
    assert gateway.other_token
    with SessionsClient(gateway.url, gateway.other_token) as other:
        with pytest.raises(SessionNotFoundError):
            other.get_session(session.session_id)
        with pytest.raises(SessionNotFoundError):
            other.delete_session(session.session_id)
        assert session.session_id not in [x.session_id for x in other.list_sessions(limit=100)["sessions"]]


def test_server_side_400_and_413(client: SessionsClient) -> None:
    with pytest.raises(SandboxOperationError) as ei:
        client.create_session(image="no-such-image")
    assert ei.value.status_code == 400 and ei.value.code
    with pytest.raises(SandboxOperationError) as ei:
        client.create_session(ssh_public_key="ssh-ed25519 not-a-key")
    assert ei.value.status_code == 400 and ei.value.code == "invalid_ssh_public_key"
    with pytest.raises(SandboxOperationError) as ei:
        client.create_session(metadata={"blob": "x" * 70_000})
    assert ei.value.status_code == 413 and ei.value.code == "body_too_large"


def test_unknown_session_id(client: SessionsClient) -> None:
    with pytest.raises(SessionNotFoundError) as ei:
        client.get_session("sbx-aaaaaaaaaaaaaaaaaaaa")
    assert not isinstance(ei.value, SessionGoneError)
    assert ei.value.status_code == 404 and ei.value.code == "not_found"
    with pytest.raises(SessionNotFoundError) as ei:
        client.get_session("../../etc/passwd")
    assert not isinstance(ei.value, SessionGoneError)


def test_deleted_session_is_gone(gateway: Gateway, client: SessionsClient) -> None:
    """A deleted session raises SessionGoneError (a SessionNotFoundError)
    with the reason, on REST and CONNECT; for another tenant it is a plain
    SessionNotFoundError, as an unknown id is."""
    s = client.create_session(ttl=120)
    client.delete_session(s.session_id)
    with pytest.raises(SessionGoneError) as ei:
        client.get_session(s.session_id)
    assert isinstance(ei.value, SessionNotFoundError)
    assert ei.value.status_code == 410 and ei.value.code == "session_gone"
    assert ei.value.reason == "deleted"
    assert "deleted at " in str(ei.value) and "(api_key)" in str(ei.value)
    with pytest.raises(SessionGoneError) as ei:
        client.delete_session(s.session_id)
    assert ei.value.reason == "deleted"
    with pytest.raises(SessionGoneError) as ei:
        HTTPConnectTunnel(gateway.url, gateway.token, s.session_id, timeout=5).open()
    assert ei.value.reason == "deleted" and "410" in (ei.value.status_line or "")
    assert gateway.other_token
    with SessionsClient(gateway.url, gateway.other_token) as other:
        with pytest.raises(SessionNotFoundError) as ei:
            other.get_session(s.session_id)
        assert not isinstance(ei.value, SessionGoneError)


def test_idempotency_key_replays_the_same_session(gateway: Gateway, client: SessionsClient) -> None:
    """The gateway's contract for Idempotency-Key on POST /v1/sessions: the same
    key from the same tenant returns the session the first request created
    (200, Idempotent-Replayed: true, no ssh.password) instead of a second one."""
    key = f"sdk-test-{uuid.uuid4()}"
    meta = {"idempotency": key}
    created: List[Tuple[SessionsClient, Session]] = []  # deleted at the end
    assert gateway.other_token is not None
    other = SessionsClient(api_url=gateway.url, bearer_token=gateway.other_token)
    try:
        first = client.create_session(ttl=600, metadata=meta, idempotency_key=key)
        created.append((client, first))
        assert not first.replayed and first.password

        again = client.create_session(ttl=600, metadata=meta, idempotency_key=key)
        created.append((client, again))
        assert again.session_id == first.session_id, "the same key made a second session"
        assert again.replayed and again.password is None
        assert again.metadata == meta and again.host_keys == first.host_keys
        mine = [x for x in client.list_sessions(limit=100)["sessions"] if x.metadata == meta]
        assert [x.session_id for x in mine] == [first.session_id]

        # The replayed session is usable without the password (SSH none auth over the tunnel).
        with SessionSSHClient(
            api_url=gateway.url, bearer_token=gateway.token, session_id=again.session_id, password=again.password
        ) as ssh:
            assert ssh.run_command("echo same")["stdout"] == "same\n"

        # Another key, or the same key from another tenant, creates anew.
        fresh = client.create_session(ttl=600, metadata=meta)
        created.append((client, fresh))
        assert fresh.session_id != first.session_id and not fresh.replayed and fresh.password
        theirs = other.create_session(ttl=600, metadata=meta, idempotency_key=key)
        created.append((other, theirs))
        assert theirs.session_id != first.session_id and not theirs.replayed and theirs.password
    finally:
        for c, s in created:
            try:
                c.delete_session(s.session_id)
            except SessionNotFoundError:
                pass  # the same session twice
        other.close()
