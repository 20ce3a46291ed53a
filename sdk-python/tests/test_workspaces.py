"""Workspaces, snapshots, stats, port links and the audit trail against the real gateway."""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from datetime import datetime
from typing import Iterator
from urllib.parse import urlsplit

import pytest
import requests
from conftest import Gateway

from sandbox_sessions_sdk import (
    AsyncSessionsClient,
    AuditEvent,
    AuditPage,
    SandboxOperationError,
    SessionNotFoundError,
    SessionsClient,
    SessionStats,
    Snapshot,
    SnapshotNotFoundError,
    Workspace,
    WorkspaceBusyError,
    WorkspaceExistsError,
    WorkspaceNotFoundError,
    WorkspacesUnavailableError,
)
from sandbox_sessions_sdk._common import error_for_status


@pytest.fixture
def workspace(client: SessionsClient) -> Iterator[str]:
    name = "ws-" + uuid.uuid4().hex[:12]
    yield name
    try:
        client.delete_workspace(name)
    except WorkspaceNotFoundError:
        pass


def test_workspace_outlives_its_session_and_is_held_by_one(client: SessionsClient, workspace: str) -> None:
    ws = client.create_workspace(workspace)
    assert isinstance(ws, Workspace) and ws.name == workspace and ws.in_use_by is None
    with pytest.raises(WorkspaceExistsError) as ei:
        client.create_workspace(workspace)
    assert ei.value.status_code == 409 and ei.value.code == "workspace_exists"
    assert workspace in [w.name for w in client.list_workspaces()]

    first = client.create_session(ttl=300, workspace=workspace)
    try:
        assert first.workspace == workspace
        client.write_file(first.session_id, "notes/kept.txt", b"survives\n")
        with pytest.raises(WorkspaceBusyError) as busy:
            client.create_session(ttl=300, workspace=workspace)
        assert busy.value.status_code == 409 and busy.value.code == "workspace_busy"
        with pytest.raises(WorkspaceBusyError):
            client.delete_workspace(workspace)
        held = [w for w in client.list_workspaces() if w.name == workspace]
        assert held and held[0].in_use_by == first.session_id
    finally:
        client.delete_session(first.session_id)

    second = client.create_session(ttl=300, workspace=workspace)
    try:
        assert client.read_file(second.session_id, "notes/kept.txt") == b"survives\n"
    finally:
        client.delete_session(second.session_id, keep_workspace=False)
    # keepWorkspace=false removed it with the session.
    assert workspace not in [w.name for w in client.list_workspaces()]
    with pytest.raises(WorkspaceNotFoundError) as gone:
        client.create_session(ttl=300, workspace=workspace)
    assert gone.value.status_code == 404 and gone.value.code == "workspace_not_found"
    with pytest.raises(WorkspaceNotFoundError):
        client.delete_workspace(workspace)


def test_delete_with_discard_keeps_the_last_saved_version(client: SessionsClient, workspace: str) -> None:
    client.create_workspace(workspace)
    first = client.create_session(ttl=300, workspace=workspace)
    try:
        client.write_file(first.session_id, "kept.txt", b"v1\n")
    finally:
        client.delete_session(first.session_id)
    second = client.create_session(ttl=300, workspace=workspace)
    try:
        client.write_file(second.session_id, "kept.txt", b"v2\n")
    finally:
        client.delete_session(second.session_id, discard=True)
    third = client.create_session(ttl=300, workspace=workspace)
    try:
        assert client.read_file(third.session_id, "kept.txt") == b"v1\n"
    finally:
        client.delete_session(third.session_id)


def test_snapshot_fork_list_delete(client: SessionsClient) -> None:
    src = client.create_session(ttl=300)
    forks = []
    try:
        client.write_file(src.session_id, "state.txt", b"v1")
        snap = client.create_snapshot(src.session_id)
        assert isinstance(snap, Snapshot) and snap.snapshot_id.startswith("snap_")
        assert snap.files >= 1 and snap.size_bytes >= 2 and isinstance(snap.consistent, bool)
        client.write_file(src.session_id, "state.txt", b"v2 after the snapshot")

        for _ in range(2):
            fork = client.create_session(ttl=300, from_snapshot=snap.snapshot_id)
            forks.append(fork.session_id)
            assert fork.from_snapshot == snap.snapshot_id
            assert client.read_file(fork.session_id, "state.txt") == b"v1"
        # The forks are independent of each other.
        client.write_file(forks[0], "state.txt", b"fork0")
        assert client.read_file(forks[1], "state.txt") == b"v1"

        listed = client.list_snapshots(session=src.session_id)
        assert [s.snapshot_id for s in listed] == [snap.snapshot_id]
        assert listed[0].session_id == src.session_id
        assert snap.snapshot_id in [s.snapshot_id for s in client.list_snapshots()]

        client.delete_snapshot(snap.snapshot_id)
        assert client.list_snapshots(session=src.session_id) == []
        with pytest.raises(SnapshotNotFoundError) as ei:
            client.delete_snapshot(snap.snapshot_id)
        assert ei.value.status_code == 404 and ei.value.code == "snapshot_not_found"
        with pytest.raises(SnapshotNotFoundError):
            client.create_session(ttl=300, from_snapshot=snap.snapshot_id)
        # A fork keeps its files after its snapshot is deleted.
        assert client.read_file(forks[1], "state.txt") == b"v1"
    finally:
        for sid in forks + [src.session_id]:
            client.delete_session(sid)


def test_stats_and_audit_pages(client: SessionsClient, session) -> None:  # type: ignore[no-untyped-def]
    sid = session.session_id
    client.write_file(sid, "blob.bin", b"x" * 65536)
    st = client.session_stats(sid)
    assert isinstance(st, SessionStats) and st.session_id == sid and st.status == "running"
    assert st.disk_used_bytes is not None and st.disk_used_bytes >= 65536
    assert st.sampled_at is not None

    for i in range(3):
        client.run(sid, f"echo {i}")
    first = client.list_audit(session=sid, limit=2)
    assert len(first.events) <= 2 and first.next_cursor, "more events than one page of 2"
    events = list(client.iter_audit(session=sid, page_size=2))
    assert all(isinstance(e, AuditEvent) and e.session == sid for e in events)
    seqs = [e.seq for e in events]
    assert seqs == sorted(seqs, reverse=True) and len(set(seqs)) == len(seqs), "newest first, no repeats"
    kinds = {e.kind for e in events}
    assert {"session", "command", "file"} <= kinds, kinds
    assert any(e.kind == "session" and e.op == "created" for e in events)
    assert len([e for e in events if e.kind == "command"]) >= 3
    # since: a time after everything so far returns none of these events.
    later = client.list_audit(session=sid, since="2999-01-01T00:00:00Z")
    assert later.events == []


def test_session_timeline(gateway: Gateway, client: SessionsClient, session) -> None:  # type: ignore[no-untyped-def]
    sid = session.session_id
    client.run(sid, "echo on-the-timeline")
    client.write_file(sid, "t.txt", b"t")
    page = client.session_timeline(sid)
    assert isinstance(page, AuditPage) and page.events
    assert all(isinstance(e, AuditEvent) and e.session == sid for e in page.events)
    assert {e.kind for e in page.events} <= {"command", "egress", "file", "session"}
    assert any(e.kind == "command" and "on-the-timeline" in e.raw.get("command", "") for e in page.events)
    seqs = [e.seq for e in page.events]
    assert seqs == sorted(seqs, reverse=True)
    commands = client.session_timeline(sid, kind="command")
    assert commands.events and {e.kind for e in commands.events} == {"command"}
    both = client.session_timeline(sid, kind=["command", "file"], limit=1)
    assert len(both.events) <= 1
    # after: only what is newer than the newest seen.
    assert client.session_timeline(sid, after=max(seqs)).events == []
    client.run(sid, "echo later")
    newer = client.session_timeline(sid, after=max(seqs), kind="command")
    assert [e.raw.get("command") for e in newer.events] == ["echo later"]
    for bad in ({"kind": "rest"}, {"kind": []}, {"limit": 0}, {"after": -1}, {"cursor": ""}):
        with pytest.raises(ValueError):
            client.session_timeline(sid, **bad)
    with pytest.raises(SessionNotFoundError):
        client.session_timeline("sbx-aaaaaaaaaaaaaaaaaaaa")

    async def main() -> None:
        async with AsyncSessionsClient(api_url=gateway.url, bearer_token=gateway.token) as c:
            p = await c.session_timeline(sid, kind="file")
            assert p.events and {e.kind for e in p.events} == {"file"}

    asyncio.run(main())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_port_link_and_preview_url(gateway: Gateway, client: SessionsClient, session) -> None:  # type: ignore[no-untyped-def]
    sid = session.session_id
    port = _free_port()
    client.write_file(sid, "site/index.html", b"hello from the sandbox\n")
    argv = ["python3", "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    proc = client.start_process(sid, argv=argv, cwd="site")
    try:
        link = client.port_link(sid, port, expires_in=600)
        # An origin of its own: p{port}-{label}.localhost on the API's port.
        origin = urlsplit(link.url)
        api = urlsplit(gateway.url)
        assert link.url.endswith("/") and link.expires_at is not None
        assert origin.hostname.startswith(f"p{port}-") and origin.hostname.endswith(".localhost")
        assert origin.port == api.port
        url = client.preview_url(sid, port, "/index.html")
        assert url == f"{gateway.url}/v1/sessions/{sid}/ports/{port}/index.html"
        deadline = time.monotonic() + 30
        while True:  # the server may not listen yet
            # *.localhost is the loopback in browsers and curl; Python's
            # resolver may not know it, so connect to the gateway and name
            # the preview's host.
            r = requests.get(gateway.url + "/index.html", headers={"Host": origin.netloc}, timeout=10)
            if r.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert r.status_code == 200 and r.text == "hello from the sandbox\n"
        # The preview URL answers with the bearer token, and not without it,
        # sandboxed: it is on the API's origin.
        auth = {"Authorization": f"Bearer {gateway.token}"}
        r = requests.get(url, headers=auth, timeout=10)
        assert r.text == "hello from the sandbox\n" and r.headers["Content-Security-Policy"] == "sandbox"
        assert requests.get(url, timeout=10).status_code == 401
    finally:
        client.signal_process(sid, proc["processId"], "KILL")


def test_async_workspaces_and_audit(gateway: Gateway) -> None:
    async def main() -> None:
        async with AsyncSessionsClient(api_url=gateway.url, bearer_token=gateway.token) as c:
            name = "aws-" + uuid.uuid4().hex[:10]
            await c.create_workspace(name)
            s = await c.create_session(ttl=300, workspace=name)
            try:
                with pytest.raises(WorkspaceBusyError):
                    await c.create_session(ttl=300, workspace=name)
                await c.write_file(s.session_id, "a.txt", b"async")
                snap = await c.create_snapshot(s.session_id)
                assert [x.snapshot_id for x in await c.list_snapshots(session=s.session_id)] == [snap.snapshot_id]
                st = await c.session_stats(s.session_id)
                assert st.disk_used_bytes is not None and st.disk_used_bytes >= 5
                events = [e async for e in c.iter_audit(session=s.session_id, page_size=1)]
                assert any(e.kind == "session" and e.op == "created" for e in events)
                await c.delete_snapshot(snap.snapshot_id)
            finally:
                await c.delete_session(s.session_id)
            await c.delete_workspace(name)
            assert name not in [w.name for w in await c.list_workspaces()]

    asyncio.run(main())


@pytest.mark.parametrize(
    "status,code,cls",
    [
        (409, "workspace_busy", WorkspaceBusyError),
        (409, "workspace_exists", WorkspaceExistsError),
        (404, "workspace_not_found", WorkspaceNotFoundError),
        (404, "snapshot_not_found", SnapshotNotFoundError),
        (400, "workspaces_unavailable", WorkspacesUnavailableError),
    ],
)
def test_workspace_codes_map_to_their_classes(status: int, code: str, cls: type) -> None:
    body = ('{"error": {"code": "%s", "message": "m"}}' % code).encode()
    # Even on a call that names a session, these 404s are not SessionNotFoundError.
    err = error_for_status(status, "", {}, body, what="x", session_scoped=True)
    assert type(err) is cls and err.code == code and err.status_code == status
    assert isinstance(err, SandboxOperationError)


def test_arguments_are_checked_before_sending(client: SessionsClient) -> None:
    with pytest.raises(ValueError):
        client.create_session(workspace="w", from_snapshot="snap_x")
    for bad in ("", "-lead", "a/b", "x" * 64):
        with pytest.raises(ValueError):
            client.create_workspace(bad)
    with pytest.raises(ValueError):
        client.port_link("sbx-x", 0)
    with pytest.raises(ValueError):
        client.list_audit(limit=1001)
    with pytest.raises(ValueError):
        client.list_audit(since=datetime(2030, 1, 1))  # naive: ambiguous
    with pytest.raises(TypeError):
        client.delete_session("sbx-x", keep_workspace="no")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        client.delete_session("sbx-x", discard="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        client.create_workspace("a..b")
    assert client.preview_url("sbx-a", 8080) == client.api_url + "/v1/sessions/sbx-a/ports/8080/"
