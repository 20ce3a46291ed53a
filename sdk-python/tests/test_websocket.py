"""The websocket transport: SSH in a WebSocket (GET /v1/sessions/{id}/ssh) against the real gateway."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import Gateway

from sandbox_sessions_sdk import (
    HTTPConnectTunnel,
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
