"""A session's name goes wherever its id goes (issue 37.2)."""

from __future__ import annotations

import pytest
from conftest import Gateway

from sandbox_sessions_sdk import SessionGoneError, SessionsClient, SessionSSHClient


def test_name_wherever_the_id_goes(gateway: Gateway, client: SessionsClient) -> None:
    s = client.create_session(ttl=120, name="py-names")
    try:
        assert s.name == "py-names"
        # The test gateway's driver: linux as root (isolated), else workdir.
        if s.isolation is not None:
            assert s.isolation == "none" and s.raw["unenforced"] == ["memoryMiB", "cpus", "pids", "diskMiB"]
        got = client.get_session("py-names")
        assert got.session_id == s.session_id and got.name == "py-names"
        assert client.run("py-names", "echo by-name")["stdout"] == "by-name\n"
        # CONNECT by name: the SSH client takes it too.
        with SessionSSHClient(gateway.url, gateway.token, "py-names", "sandbox") as ssh:
            assert ssh.run_command("echo over-ssh")["stdout"] == "over-ssh\n"
    finally:
        client.delete_session("py-names")
    with pytest.raises(SessionGoneError):
        client.get_session(s.session_id)


def test_name_checked_locally(client: SessionsClient) -> None:
    with pytest.raises(ValueError):
        client.create_session(name="")
