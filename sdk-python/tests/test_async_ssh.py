"""AsyncSessionSSHClient against the real gateway: a mirror of test_ssh.py's
core (auth and host keys, run_command, callbacks, timeouts, SFTP) and
cancellation. Plain tests that run their coroutine with ``asyncio.run``."""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Awaitable, List, Tuple

import paramiko
import pytest
from conftest import Gateway, wait_gone, wait_present

from sandbox_sessions_sdk import (
    AsyncSessionSSHClient,
    CommandTimeoutError,
    HostKeyMismatchError,
    SandboxOperationError,
    Session,
    SessionNotFoundError,
    SessionsClient,
    UnauthorizedError,
)


def arun(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]


def sleep_marker() -> str:
    return f"30.{uuid.uuid4().int % 10**6:06d}"


def ssh_for(gateway: Gateway, session: Session, **kwargs: Any) -> AsyncSessionSSHClient:
    return AsyncSessionSSHClient(
        api_url=gateway.url, bearer_token=gateway.token, session_id=session.session_id, **kwargs
    )


def test_connect_pins_host_keys_and_runs(gateway: Gateway, session: Session) -> None:
    async def main() -> None:
        async with ssh_for(gateway, session) as ssh:
            assert ssh.connected
            assert ssh.pinned_host_keys and ssh.pinned_host_keys[0].startswith("ssh-ed25519 ")
            res = await ssh.run_command("echo out; echo err >&2; exit 3")
            assert (res.stdout, res.stderr, res.exit_code, res.exit_signal) == ("out\n", "err\n", 3, None)
            assert (await ssh.run_command("cat")).stdout == ""  # stdin closed
            res = await ssh.run_command("kill -TERM $$")
            assert res.exit_signal == "TERM" and res.exit_code == 143
        assert not ssh.connected
        await ssh.close()  # twice is fine

    arun(main())


def test_password_auth(gateway: Gateway, session: Session) -> None:
    async def main() -> None:
        async with ssh_for(gateway, session, password=session.password) as ssh:
            assert (await ssh.run_command("echo hi")).stdout == "hi\n"
        with pytest.raises(SandboxOperationError, match="authentication"):
            await ssh_for(gateway, session, password="wrong").connect()

    arun(main())


def test_connect_errors(gateway: Gateway, session: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        with pytest.raises(UnauthorizedError):
            await AsyncSessionSSHClient(gateway.url, "bad-token", session.session_id).connect()
        with pytest.raises(SessionNotFoundError):
            await AsyncSessionSSHClient(gateway.url, gateway.token, "sbx-doesnotexist").connect()
        with pytest.raises(SandboxOperationError, match="not connected"):
            await ssh_for(gateway, session).run_command("true")

    arun(main())

    # A pinned key that is not the server's: HostKeyMismatchError, as the sync client.
    real_get = SessionsClient.get_session

    def wrong_keys(self: SessionsClient, sid: str) -> Session:
        s = real_get(self, sid)
        s.host_keys = ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE7rq8m0F2ynFzRWEz0mEmO6zmO0kq0v3l0Hh2kbG2vK"]
        return s

    monkeypatch.setattr(SessionsClient, "get_session", wrong_keys)

    async def mismatch() -> None:
        with pytest.raises(HostKeyMismatchError):
            await ssh_for(gateway, session).connect()

    arun(mismatch())


def test_callbacks_on_the_loop_and_concurrency(gateway: Gateway, session: Session) -> None:
    async def main() -> None:
        loop_thread: List[int] = []
        events: List[Tuple[str, str]] = []

        def on_out(s: str) -> None:
            loop_thread.append(threading.get_ident())
            events.append(("out", s))

        async with ssh_for(gateway, session) as ssh:
            res = await ssh.run_command(
                "for i in 1 2; do echo out$i; echo err$i >&2; sleep 0.2; done",
                on_stdout=on_out,
                on_stderr=lambda s: events.append(("err", s)),
            )
            assert res.stdout == "out1\nout2\n" and res.stderr == "err1\nerr2\n"
            assert "".join(s for k, s in events if k == "out") == res.stdout
            assert "".join(s for k, s in events if k == "err") == res.stderr
            assert set(loop_thread) == {threading.get_ident()}, "callbacks run on the event loop"
            # Four commands at once on one connection: they overlap.
            t0 = time.monotonic()
            results = await asyncio.gather(*(ssh.run_command(f"sleep 1; echo {i}") for i in range(4)))
            assert [r.stdout for r in results] == [f"{i}\n" for i in range(4)]
            assert time.monotonic() - t0 < 3.5

    arun(main())


def test_callback_exception_kills_command(gateway: Gateway, session: Session) -> None:
    marker = sleep_marker()

    def boom(_: str) -> None:
        raise RuntimeError("stop")

    async def main() -> None:
        async with ssh_for(gateway, session) as ssh:
            with pytest.raises(RuntimeError, match="stop"):
                await ssh.run_command(f"echo go; sleep {marker}", on_stdout=boom)
            assert (await ssh.run_command("echo still")).stdout == "still\n"

    arun(main())
    assert wait_gone(f"sleep {marker}") == []


def test_timeout_kills_command(gateway: Gateway, session: Session) -> None:
    marker = sleep_marker()

    async def main() -> None:
        async with ssh_for(gateway, session) as ssh:
            t0 = time.monotonic()
            with pytest.raises(CommandTimeoutError) as ei:
                await ssh.run_command(f"echo started; exec sleep {marker}", timeout=1)
            assert 0.9 <= time.monotonic() - t0 < 4
            assert ei.value.stdout == "started\n" and ei.value.timeout == 1

    arun(main())
    assert wait_gone(f"sleep {marker}") == []


@pytest.mark.parametrize("how", ["wait_for", "cancel"])
def test_cancelling_run_command_kills_it(gateway: Gateway, session: Session, how: str) -> None:
    marker = sleep_marker()

    async def main() -> None:
        async with ssh_for(gateway, session) as ssh:
            t0 = time.monotonic()
            if how == "wait_for":
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(ssh.run_command(f"exec sleep {marker}", timeout=None), 1)
            else:
                started = asyncio.Event()
                task = asyncio.ensure_future(
                    ssh.run_command(f"echo go; exec sleep {marker}", on_stdout=lambda _: started.set())
                )
                await asyncio.wait_for(started.wait(), 10)
                assert await asyncio.to_thread(wait_present, f"sleep {marker}")
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            # The kill happened before the cancellation returned.
            assert time.monotonic() - t0 < 5
            assert await asyncio.to_thread(wait_gone, f"sleep {marker}", 2.0) == []
            # The connection is still usable.
            assert (await ssh.run_command("echo ok")).stdout == "ok\n"

    arun(main())


def test_sftp_upload_download(gateway: Gateway, session: Session, local_dir: Path) -> None:
    async def main() -> None:
        data = os.urandom(3 * 1024 * 1024 + 17)
        (local_dir / "up.bin").write_bytes(data)
        async with ssh_for(gateway, session) as ssh:
            await ssh.upload_file(local_dir / "up.bin", "up.bin")
            assert (await ssh.run_command("wc -c < up.bin")).stdout.strip() == str(len(data))
            await ssh.download_file("up.bin", local_dir / "down.bin")
            assert (local_dir / "down.bin").read_bytes() == data
            # Two transfers at once take turns on the one SFTP channel.
            await asyncio.gather(
                ssh.download_file("up.bin", local_dir / "d1.bin"), ssh.download_file("up.bin", local_dir / "d2.bin")
            )
            assert (local_dir / "d1.bin").read_bytes() == data == (local_dir / "d2.bin").read_bytes()
            with pytest.raises(SandboxOperationError, match="download"):
                await ssh.download_file("no/such/file", local_dir / "missing.bin")
            assert not (local_dir / "missing.bin").exists()
            sftp = await ssh.open_sftp()
            assert isinstance(sftp, paramiko.SFTPClient)

    arun(main())


def test_cancelled_download_removes_partial_file(gateway: Gateway, session: Session, local_dir: Path) -> None:
    async def main() -> None:
        async with ssh_for(gateway, session) as ssh:
            await ssh.run_command("head -c 200000000 /dev/zero > big.bin")
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(ssh.download_file("big.bin", local_dir / "big.bin"), 0.2)
            assert not (local_dir / "big.bin").exists()
            # SFTP opens again.
            await ssh.run_command("echo x > small.txt")
            await ssh.download_file("small.txt", local_dir / "small.txt")
            assert (local_dir / "small.txt").read_text() == "x\n"

    arun(main())
