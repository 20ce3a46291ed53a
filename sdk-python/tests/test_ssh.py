"""HTTPConnectTunnel and SessionSSHClient against the real gateway."""

from __future__ import annotations

import hashlib
import io
import os
import socket
import time
import uuid
from pathlib import Path
from typing import List

import paramiko
import pytest
from conftest import Gateway, echo_from_threads, processes_matching, wait_gone
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from sandbox_sessions_sdk import (
    CommandTimeoutError,
    HostKeyMismatchError,
    HTTPConnectTunnel,
    SandboxOperationError,
    Session,
    SessionNotFoundError,
    SessionsClient,
    SessionSSHClient,
    UnauthorizedError,
)

# -- tunnel ---------------------------------------------------------------------


@pytest.mark.parametrize("api_suffix", ["", "/v1"])
def test_tunnel_real_server_keeps_ssh_banner(gateway: Gateway, session: Session, api_suffix: str) -> None:
    tunnel = HTTPConnectTunnel(gateway.url + api_suffix, gateway.token, session.session_id, timeout=5)
    assert tunnel.path == f"{api_suffix}/sessions/{session.session_id}"
    sock = tunnel.open()
    try:
        assert isinstance(sock, socket.socket)
        # The server speaks first: its version line follows the 200 at once,
        # and must still be in the socket.
        sock.settimeout(5)
        got = b""
        while b"\r\n" not in got:
            chunk = sock.recv(256)
            assert chunk
            got += chunk
        assert got.startswith(b"SSH-2.0-"), got
    finally:
        tunnel.close()


def test_tunnel_errors_from_real_server(gateway: Gateway, client: SessionsClient) -> None:
    s = client.create_session(ttl=60)
    with pytest.raises(UnauthorizedError) as ei:
        HTTPConnectTunnel(gateway.url, "wrong-token", s.session_id, timeout=5).open()
    assert ei.value.status_code == 401 and ei.value.status_line and "401" in ei.value.status_line
    client.delete_session(s.session_id)
    with pytest.raises(SessionNotFoundError) as ei2:
        HTTPConnectTunnel(gateway.url, gateway.token, s.session_id, timeout=5).open()
    # A deleted session is gone (410 session_gone), a SessionNotFoundError.
    assert ei2.value.status_code == 410 and "410" in (ei2.value.status_line or "")
    assert ei2.value.code == "session_gone"
    # A CONNECT path the gateway does not route is also a 404 (code
    # "not_found", message "no such endpoint"): indistinguishable by code.
    with pytest.raises(SessionNotFoundError):
        HTTPConnectTunnel(
            gateway.url, gateway.token, s.session_id, connect_path_template="/nope/{sessionId}", timeout=5
        ).open()


# -- connecting -----------------------------------------------------------------


def test_none_auth_and_pinned_host_keys(gateway: Gateway, session: Session) -> None:
    with SessionSSHClient(gateway.url, gateway.token, session.session_id, "sandbox") as ssh:
        assert ssh.connected
        assert ssh.pinned_host_keys[0] == session.host_keys[0]
        presented = ssh.transport.get_remote_server_key()
        assert f"{presented.get_name()} {presented.get_base64()}" in session.host_keys
        assert ssh.transport.get_username() == "sandbox"
        assert ssh.run_command("echo ok")["stdout"] == "ok\n"
    assert not ssh.connected


def test_connect_twice_close_twice_reconnect(gateway: Gateway, session: Session) -> None:
    ssh = SessionSSHClient(gateway.url, gateway.token, session.session_id, "sandbox")
    assert ssh.connect() is ssh
    ssh.connect()  # no-op
    ssh.close()
    ssh.close()
    with pytest.raises(SandboxOperationError):
        ssh.run_command("true")
    ssh.connect()
    try:
        assert ssh.run_command("echo again")["stdout"] == "again\n"
    finally:
        ssh.close()


@pytest.mark.parametrize("api_suffix,template", [("/v1", "/sessions/{sessionId}"), ("", "/v1/sessions/{sessionId}")])
def test_connect_paths(gateway: Gateway, session: Session, api_suffix: str, template: str) -> None:
    with SessionSSHClient(
        gateway.url + api_suffix, gateway.token, session.session_id, "sandbox", connect_path_template=template
    ) as ssh:
        assert ssh.run_command("echo hi")["stdout"] == "hi\n"


def test_password_auth(gateway: Gateway, session: Session) -> None:
    assert session.password
    with SessionSSHClient(gateway.url, gateway.token, session.session_id, "sandbox", password=session.password) as ssh:
        assert ssh.transport.is_authenticated()
        assert ssh.run_command("echo pw")["stdout"] == "pw\n"
    with pytest.raises(SandboxOperationError, match="authentication"):
        SessionSSHClient(gateway.url, gateway.token, session.session_id, "sandbox", password="wrong").connect()


def _ed25519_pkey() -> paramiko.Ed25519Key:
    pem = ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    return paramiko.Ed25519Key.from_private_key(io.StringIO(pem.decode()))


def test_pkey_auth(gateway: Gateway, client: SessionsClient) -> None:
    key = _ed25519_pkey()
    s = client.create_session(ttl=60, ssh_public_key=f"{key.get_name()} {key.get_base64()} sdk-test")
    try:
        with SessionSSHClient(gateway.url, gateway.token, s.session_id, "sandbox", pkey=key) as ssh:
            assert ssh.transport.is_authenticated()
            assert ssh.run_command("echo key")["stdout"] == "key\n"
        with pytest.raises(SandboxOperationError, match="authentication"):
            SessionSSHClient(gateway.url, gateway.token, s.session_id, "sandbox", pkey=_ed25519_pkey()).connect()
    finally:
        client.delete_session(s.session_id)


def test_wrong_pinned_host_key_fails(gateway: Gateway, session: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    impostor = _ed25519_pkey()
    real_get = SessionsClient.get_session

    def fake_get(self: SessionsClient, session_id: str) -> Session:
        s = real_get(self, session_id)
        s.host_keys = [f"{impostor.get_name()} {impostor.get_base64()}"]
        return s

    monkeypatch.setattr(SessionsClient, "get_session", fake_get)
    ssh = SessionSSHClient(gateway.url, gateway.token, session.session_id, "sandbox")
    with pytest.raises(HostKeyMismatchError) as ei:
        ssh.connect()
    assert ei.value.expected == [f"ssh-ed25519 {impostor.get_base64()}"]
    assert ei.value.presented in session.host_keys
    assert not ssh.connected
    with pytest.raises(SandboxOperationError):
        ssh.run_command("true")


def test_host_keys_missing_falls_back_to_auto_add(
    gateway: Gateway, session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_get = SessionsClient.get_session

    def fake_get(self: SessionsClient, session_id: str) -> Session:
        s = real_get(self, session_id)
        s.host_keys = []
        return s

    monkeypatch.setattr(SessionsClient, "get_session", fake_get)
    with SessionSSHClient(gateway.url, gateway.token, session.session_id, "sandbox") as ssh:
        assert ssh.pinned_host_keys == []
        assert ssh.run_command("echo auto")["stdout"] == "auto\n"


def test_custom_host_key_policy(gateway: Gateway, session: Session) -> None:
    with pytest.raises(HostKeyMismatchError) as ei:
        SessionSSHClient(
            gateway.url, gateway.token, session.session_id, "sandbox", host_key_policy=paramiko.RejectPolicy()
        ).connect()
    assert ei.value.presented in session.host_keys and ei.value.expected == []
    with SessionSSHClient(
        gateway.url, gateway.token, session.session_id, "sandbox", host_key_policy=paramiko.AutoAddPolicy()
    ) as ssh:
        assert ssh.run_command("true")["exit_code"] == 0


def test_connect_to_deleted_session(gateway: Gateway, client: SessionsClient) -> None:
    s = client.create_session(ttl=60)
    client.delete_session(s.session_id)
    # Default: the host key lookup (GET) answers 410 (session_gone).
    with pytest.raises(SessionNotFoundError):
        SessionSSHClient(gateway.url, gateway.token, s.session_id, "sandbox").connect()
    # With a policy there is no lookup: the CONNECT answers 410 session_gone.
    with pytest.raises(SessionNotFoundError) as ei:
        SessionSSHClient(
            gateway.url, gateway.token, s.session_id, "sandbox", host_key_policy=paramiko.AutoAddPolicy()
        ).connect()
    assert ei.value.status_line and "410" in ei.value.status_line


def test_connect_with_bad_token(gateway: Gateway, session: Session) -> None:
    with pytest.raises(UnauthorizedError):
        SessionSSHClient(gateway.url, "bad", session.session_id, "sandbox").connect()
    with pytest.raises(UnauthorizedError) as ei:
        SessionSSHClient(
            gateway.url, "bad", session.session_id, "sandbox", host_key_policy=paramiko.AutoAddPolicy()
        ).connect()
    assert ei.value.status_line


def test_session_deleted_while_connected(gateway: Gateway, client: SessionsClient) -> None:
    s = client.create_session(ttl=60)
    with SessionSSHClient(gateway.url, gateway.token, s.session_id, "sandbox") as ssh:
        assert ssh.run_command("true")["exit_code"] == 0
        client.delete_session(s.session_id)
        deadline = time.monotonic() + 5
        while ssh.connected and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(SandboxOperationError):
            ssh.run_command("echo still here")


# -- commands -----------------------------------------------------------------


def test_exit_codes_and_stderr_apart(ssh: SessionSSHClient) -> None:
    r = ssh.run_command("echo out; echo err >&2; exit 7")
    assert r == {"stdout": "out\n", "stderr": "err\n", "exit_code": 7, "exit_signal": None, "truncated": False}
    assert ssh.run_command("true")["exit_code"] == 0
    assert ssh.run_command("false")["exit_code"] == 1
    r = ssh.run_command("definitely-not-a-command-xyz")
    assert r["exit_code"] == 127 and "not found" in r["stderr"] and r["stdout"] == ""
    r = ssh.run_command("python3 --version")
    assert r["exit_code"] == 0 and "Python 3" in r["stdout"] + r["stderr"]


def test_stdin_is_closed(ssh: SessionSSHClient) -> None:
    r = ssh.run_command("cat; echo done", timeout=10)
    assert r["stdout"] == "done\n" and r["exit_code"] == 0


@pytest.mark.parametrize("sig,num", [("KILL", 9), ("TERM", 15)])
def test_killed_by_signal(ssh: SessionSSHClient, sig: str, num: int) -> None:
    r = ssh.run_command(f"echo before; kill -{sig} $$; sleep 2")
    assert r["stdout"] == "before\n"
    ignored = ""
    if r["exit_signal"] is None:
        ignored = ssh.run_command("grep SigIgn /proc/self/status")["stdout"].strip()
    assert r["exit_signal"] == sig, (
        f"`kill -{sig} $$` did not kill the command (result {r}); the sandbox's processes start with "
        f"these signals ignored: {ignored!r}"
    )
    assert r["exit_code"] == 128 + num


def test_large_output_and_unicode(ssh: SessionSSHClient) -> None:
    r = ssh.run_command("head -c 20000000 /dev/zero | tr '\\0' 'a'; printf 'h\\303\\251\\n' >&2", max_output_bytes=None)
    assert len(r["stdout"]) == 20_000_000 and set(r["stdout"]) == {"a"} and not r.truncated
    assert r["stderr"] == "hé\n"
    r = ssh.run_command("printf '\\377\\n'")
    assert r["stdout"] == "\ufffd\n"


def test_slow_reader_gets_all_output(ssh: SessionSSHClient) -> None:
    # The first chunk's callback holds the reader while the command writes
    # 12 MB and ends: the rest, and EOF, wait in Paramiko's buffer (the
    # window is 16 MiB). All of it must come out: a drain bounded after EOF
    # (4 MiB) lost the rest, as a slow CI reader once did on 20 MB.
    seen = {"calls": 0, "bytes": 0}

    def on_out(chunk: str) -> None:
        seen["calls"] += 1
        seen["bytes"] += len(chunk)
        if seen["calls"] == 1:
            time.sleep(2)

    r = ssh.run_command("head -c 12000000 /dev/zero | tr '\\0' a", max_output_bytes=None, on_stdout=on_out)
    assert r.exit_code == 0
    assert len(r["stdout"]) == 12_000_000 and seen["bytes"] == 12_000_000


# 20,000,000 bytes of "a" between a distinct head and tail, on stdout; 3,000,000 of "b" on stderr.
BIG_OUTPUT = (
    "printf HEAD-MARK; head -c 20000000 /dev/zero | tr '\\0' a; printf TAIL-MARK; "
    "{ printf ERR-HEAD; head -c 3000000 /dev/zero | tr '\\0' b; printf ERR-TAIL; } >&2"
)
BIG_STDOUT = 9 + 20_000_000 + 9
BIG_STDERR = 8 + 3_000_000 + 8


def test_output_cap_keeps_head_and_tail(ssh: SessionSSHClient) -> None:
    cap = 64 * 1024
    seen = {"out": 0, "err": 0}
    ends = {"first": "", "last": ""}  # the first and the last 9 characters of stdout

    def on_out(s: str) -> None:
        if seen["out"] < 9:
            ends["first"] = (ends["first"] + s)[:9]
        ends["last"] = (ends["last"] + s)[-9:]
        seen["out"] += len(s)

    def on_err(s: str) -> None:
        seen["err"] += len(s)

    r = ssh.run_command(BIG_OUTPUT, max_output_bytes=cap, on_stdout=on_out, on_stderr=on_err)
    assert r.exit_code == 0 and r.truncated and r["truncated"] is True
    # The callbacks saw every byte.
    assert seen == {"out": BIG_STDOUT, "err": BIG_STDERR}
    assert ends == {"first": "HEAD-MARK", "last": "TAIL-MARK"}
    # The result: the first and the last half of the budget, the marker between.
    for text, total, head, tail, fill in (
        (r.stdout, BIG_STDOUT, "HEAD-MARK", "TAIL-MARK", "a"),
        (r.stderr, BIG_STDERR, "ERR-HEAD", "ERR-TAIL", "b"),
    ):
        marker = f"\n[... {total - cap} bytes dropped ...]\n"
        assert len(text) == cap + len(marker) and text.count(marker) == 1
        kept_head, kept_tail = text.split(marker)
        assert len(kept_head) == len(kept_tail) == cap // 2
        assert kept_head == head + fill * (cap // 2 - len(head))
        assert kept_tail == fill * (cap // 2 - len(tail)) + tail


def test_output_cap_default_and_small_output(ssh: SessionSSHClient) -> None:
    r = ssh.run_command(BIG_OUTPUT)  # the default: 10 MiB per stream
    mib10 = 10 * 1024 * 1024
    assert r.truncated and r.stdout.startswith("HEAD-MARK") and r.stdout.endswith("TAIL-MARK")
    assert len(r.stdout) == mib10 + len(f"\n[... {BIG_STDOUT - mib10} bytes dropped ...]\n")
    assert r.stderr.startswith("ERR-HEAD") and r.stderr.endswith("ERR-TAIL") and len(r.stderr) == BIG_STDERR
    # Under the cap (exactly at it, too) nothing is dropped.
    r = ssh.run_command("printf 0123456789; printf err >&2", max_output_bytes=10)
    assert r == {"stdout": "0123456789", "stderr": "err", "exit_code": 0, "exit_signal": None, "truncated": False}
    r = ssh.run_command("printf 0123456789A", max_output_bytes=10)
    assert r.truncated and r.stdout == "01234\n[... 1 bytes dropped ...]\n6789A"
    # Only stderr too long still sets truncated.
    r = ssh.run_command("echo ok; printf 0123456789A >&2", max_output_bytes=10)
    assert r.truncated and r.stdout == "ok\n" and r.stderr == "01234\n[... 1 bytes dropped ...]\n6789A"


def test_output_cap_does_not_split_characters(ssh: SessionSSHClient) -> None:
    # 1000 two-byte characters; a 101-byte cap keeps 50 + 51 bytes: the
    # tail's first byte is half of a character and is dropped with the gap.
    r = ssh.run_command("for i in $(seq 1000); do printf '\\303\\251'; done", max_output_bytes=101)
    assert r.truncated and "\ufffd" not in r.stdout
    assert r.stdout == "é" * 25 + "\n[... 1900 bytes dropped ...]\n" + "é" * 25


def test_output_cap_on_timeout(ssh: SessionSSHClient) -> None:
    marker = f"29.{uuid.uuid4().int % 10**6:06d}"
    with pytest.raises(CommandTimeoutError) as ei:
        ssh.run_command(
            f"printf START; head -c 1000000 /dev/zero | tr '\\0' a; printf END; exec sleep {marker}",
            timeout=2,
            max_output_bytes=100,
        )
    e = ei.value
    assert e.truncated and e.stdout == "START" + "a" * 45 + "\n[... 999908 bytes dropped ...]\n" + "a" * 47 + "END"
    assert e.stderr == ""
    assert wait_gone(f"sleep {marker}") == []


def test_streaming_callbacks(ssh: SessionSSHClient) -> None:
    events: List[tuple] = []
    t0 = time.monotonic()
    r = ssh.run_command(
        "for i in 1 2 3; do echo out$i; echo err$i >&2; sleep 0.3; done",
        on_stdout=lambda s: events.append(("out", s, time.monotonic() - t0)),
        on_stderr=lambda s: events.append(("err", s, time.monotonic() - t0)),
    )
    elapsed = time.monotonic() - t0
    assert "".join(s for k, s, _ in events if k == "out") == r["stdout"] == "out1\nout2\nout3\n"
    assert "".join(s for k, s, _ in events if k == "err") == r["stderr"] == "err1\nerr2\nerr3\n"
    first = min(t for _, _, t in events)
    assert first < elapsed - 0.4, "output must arrive while the command still runs"


def test_callback_exception_kills_command(ssh: SessionSSHClient) -> None:
    marker = f"31.{uuid.uuid4().int % 10**6:06d}"

    def boom(_: str) -> None:
        raise RuntimeError("stop")

    with pytest.raises(RuntimeError, match="stop"):
        ssh.run_command(f"echo go; sleep {marker}", on_stdout=boom)
    assert wait_gone(f"sleep {marker}") == []


def test_timeout_kills_command(ssh: SessionSSHClient) -> None:
    marker = f"30.{uuid.uuid4().int % 10**6:06d}"  # `sleep 30`, findable on the host
    seen: List[int] = []

    def started(_: str) -> None:  # the command runs: its sleep must be visible
        deadline = time.monotonic() + 0.5
        while not seen and time.monotonic() < deadline:
            seen.extend(processes_matching(f"sleep {marker}"))

    t0 = time.monotonic()
    with pytest.raises(CommandTimeoutError) as ei:
        ssh.run_command(f"echo started; echo warn >&2; exec sleep {marker}", timeout=1, on_stdout=started)
    elapsed = time.monotonic() - t0
    assert 0.9 <= elapsed < 4, elapsed
    e = ei.value
    assert e.stdout == "started\n" and e.stderr == "warn\n" and e.timeout == 1
    assert isinstance(e, SandboxOperationError)
    assert seen, "the sleep was never seen running on the host"
    assert wait_gone(f"sleep {marker}") == [], "the timed-out command must be killed"
    # The connection is still usable, and the sandbox sees no leftover either.
    r = ssh.run_command(f"pgrep -f 'slee[p] {marker}' || echo none")  # [p]: not itself
    assert r["stdout"].strip() == "none"


def test_timeout_with_endless_output(ssh: SessionSSHClient) -> None:
    t0 = time.monotonic()
    with pytest.raises(CommandTimeoutError) as ei:
        ssh.run_command("yes", timeout=0.5)
    assert time.monotonic() - t0 < 3
    assert ei.value.stdout.startswith("y\ny\n")
    assert ssh.run_command("echo after")["stdout"] == "after\n"


def test_timeout_kills_whole_process_group(ssh: SessionSSHClient) -> None:
    a = f"32.{uuid.uuid4().int % 10**6:06d}"
    b = f"33.{uuid.uuid4().int % 10**6:06d}"
    with pytest.raises(CommandTimeoutError):
        ssh.run_command(f"sleep {a} & sleep {b} & wait", timeout=1)
    assert wait_gone(f"sleep {a}") == [] and wait_gone(f"sleep {b}") == []


def test_pty(gateway: Gateway, session: Session) -> None:
    with SessionSSHClient(gateway.url, gateway.token, session.session_id, "sandbox", get_pty=True) as ssh:
        r = ssh.run_command("tty; echo to-stderr >&2")
        assert r["exit_code"] == 0
        assert "/dev/pts/" in r["stdout"] and "to-stderr" in r["stdout"]


def test_concurrent_commands_on_one_connection(ssh: SessionSSHClient) -> None:
    import threading

    results: List[str] = []

    def work(i: int) -> None:
        results.append(ssh.run_command(f"sleep 0.3; echo {i}")["stdout"])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [f"{i}\n" for i in range(4)]
    assert time.monotonic() - t0 < 1.2



def test_quick_commands_from_threads_keep_the_connection(gateway: Gateway, session: Session) -> None:
    """Commands that exit at once, three threads to a connection.

    Paramiko sends a channel's EOF (after exec) outside the channel's lock,
    so its transport thread could answer the server's CLOSE first; the
    server then saw an EOF for a channel it had forgotten and ended the
    connection (about one connection in ten here). The SDK's Transport
    drops such late messages.
    """
    for conn in range(8):
        with SessionSSHClient(gateway.url, gateway.token, session.session_id, "sandbox") as ssh:
            err = echo_from_threads(ssh)()
            assert err is None, f"connection {conn}: {err!r}"



def test_late_eof_never_reaches_a_newer_channel_with_its_number(gateway: Gateway, session: Session) -> None:
    """An EOF built while its channel was open and sent after the server
    closed it (and gave its number to a new channel) is dropped, not taken
    by the new channel as its own; the new channel's own EOF goes."""
    from sandbox_sessions_sdk import _paramiko_compat

    with SessionSSHClient(gateway.url, gateway.token, session.session_id, "sandbox") as ssh:
        t = ssh.transport
        a = t.open_session()
        # The command outlives the EOF's building: with "true" the server's
        # CLOSE could come first, Paramiko then sends its own EOF and
        # _send_eof builds none (CI saw None).
        a.exec_command("sleep 0.3")
        with a.lock:  # what shutdown_write does before it lets go of the lock
            stale_eof = a._send_eof()
        assert stale_eof is not None, "the channel closed before its EOF was built"
        deadline = time.monotonic() + 10
        while not a.closed and time.monotonic() < deadline:
            time.sleep(0.01)
        assert a.closed
        time.sleep(0.2)  # the server has a's CLOSE: its number is free
        b = t.open_session()
        b.exec_command("cat")
        assert b.remote_chanid == a.remote_chanid, "the server did not reuse the number; the test proves nothing"
        with _paramiko_compat.sending_on(a):
            t._send_user_message(stale_eof)
        b.sendall(b"still open\n")
        out = b""
        deadline = time.monotonic() + 10
        while b"still open\n" not in out and time.monotonic() < deadline:
            if b.recv_ready():
                out += b.recv(100)
            time.sleep(0.01)
        assert out == b"still open\n"
        time.sleep(0.3)
        assert not b.exit_status_ready(), "cat ended: b took a's EOF"
        _paramiko_compat.shutdown_write(b)  # b's own EOF goes: cat ends
        assert b.recv_exit_status() == 0
        b.close()


def test_bulk_output_into_a_one_packet_window(ssh: SessionSSHClient) -> None:
    """Bulk output into a channel whose window holds one packet: every
    packet the gateway sends must reach the client before the gateway
    waits for window, or the output stalls (a gateway that held sealed
    packets back across that wait failed here)."""
    ch = ssh.transport.open_session(window_size=32768, max_packet_size=32768)
    ch.settimeout(20)
    ch.exec_command("seq 1 300000")
    out = bytearray()
    while True:
        b = ch.recv(65536)
        if not b:
            break
        out += b
    assert ch.recv_exit_status() == 0
    ch.close()
    want = "".join(f"{i}\n" for i in range(1, 300001)).encode()
    assert len(out) == len(want) and hashlib.sha256(out).digest() == hashlib.sha256(want).digest()


# -- SFTP -----------------------------------------------------------------------


def test_sftp_and_exec_agree_on_paths(ssh: SessionSSHClient, local_dir: Path) -> None:
    src = local_dir / "hello.txt"
    src.write_text("hello from sftp\n")
    ssh.upload_file(src, "hello.txt")
    assert ssh.run_command("cat hello.txt")["stdout"] == "hello from sftp\n"
    ssh.run_command("mkdir -p sub && echo made > sub/made.txt")
    ssh.download_file("sub/made.txt", local_dir / "made.txt")
    assert (local_dir / "made.txt").read_text() == "made\n"
    sftp = ssh.open_sftp()
    assert sftp is ssh.open_sftp()
    assert "hello.txt" in sftp.listdir(".")
    # Absolute paths: SFTP's own name for the workspace (driver-dependent:
    # "/" for workdir, "/workspace" for linux).
    home = sftp.normalize(".")
    ssh.download_file(home.rstrip("/") + "/hello.txt", local_dir / "abs.txt")
    assert (local_dir / "abs.txt").read_text() == "hello from sftp\n"


def test_sftp_errors(ssh: SessionSSHClient, local_dir: Path) -> None:
    target = local_dir / "never.txt"
    with pytest.raises(SandboxOperationError, match="download"):
        ssh.download_file("no/such/file", target)
    assert not target.exists(), "a failed download leaves no file behind"
    with pytest.raises(SandboxOperationError, match="upload"):
        ssh.upload_file(local_dir / "missing.txt", "x.txt")
    (local_dir / "f").write_text("x")
    with pytest.raises(SandboxOperationError):
        ssh.upload_file(local_dir / "f", "no/such/dir/f")
    # An empty file round-trips.
    (local_dir / "empty").write_bytes(b"")
    ssh.upload_file(local_dir / "empty", "empty")
    ssh.download_file("empty", local_dir / "empty2")
    assert (local_dir / "empty2").read_bytes() == b""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def test_50mb_upload_download(ssh: SessionSSHClient, local_dir: Path, record_property: object) -> None:
    src = local_dir / "big.bin"
    with open(src, "wb") as f:
        for _ in range(50):
            f.write(os.urandom(1 << 20))
    want = _sha256(src)

    t0 = time.monotonic()
    ssh.upload_file(src, "big.bin")
    up = time.monotonic() - t0
    remote = ssh.run_command("sha256sum big.bin")["stdout"].split()[0]
    assert remote == want

    dst = local_dir / "big.copy"
    t0 = time.monotonic()
    ssh.download_file("big.bin", dst)
    down = time.monotonic() - t0
    assert _sha256(dst) == want

    print(f"\n50 MB upload {up:.2f}s ({50 / up:.0f} MB/s), download {down:.2f}s ({50 / down:.0f} MB/s)")
    record_property("upload_s", round(up, 3))  # type: ignore[operator]
    record_property("download_s", round(down, 3))  # type: ignore[operator]
    assert up < 30 and down < 30


def test_download_uses_the_servers_read_size(ssh: SessionSSHClient, local_dir: Path) -> None:
    from sandbox_sessions_sdk import _sftp

    sftp = ssh.open_sftp()
    # sandgate's SFTP server answers limits@openssh.com as OpenSSH's does.
    assert _sftp.limits(sftp) == (261120, 261120)
    for size in (0, 7, 261120, 3 * 261120 + 7):
        data = os.urandom(size)
        with sftp.open(f"sized-{size}.bin", "wb") as f:
            f.write(data)
        dst = local_dir / f"sized-{size}.copy"
        ssh.download_file(f"sized-{size}.bin", dst)
        assert dst.read_bytes() == data, size
