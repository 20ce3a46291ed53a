"""AsyncSessionsClient against the real gateway: a mirror of the sync REST
suites (sessions, errors, run, shells, files, processes) and cancellation.

Plain tests that run their coroutine with ``asyncio.run``: the gateway and
session fixtures are the sync suite's own."""

from __future__ import annotations

import asyncio
import io
import secrets
import time
import uuid
from pathlib import Path
from typing import Any, Awaitable, Iterator, List, Tuple, Union

import pytest
from conftest import Gateway, processes_matching, start_gateway, wait_gone, wait_present

from sandbox_sessions_sdk import (
    AsyncNDJSONStream,
    AsyncSessionsClient,
    AsyncShell,
    CommandResult,
    FileList,
    FileNotFoundInSandboxError,
    ProcessExitedError,
    ProcessNotFoundError,
    RateLimitError,
    SandboxConnectionError,
    SandboxOperationError,
    Session,
    SessionGoneError,
    SessionNotFoundError,
    UnauthorizedError,
)


def arun(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]


def sleep_marker() -> str:
    """A `sleep` argument findable on the host (the workdir driver runs sandbox processes there)."""
    return f"30.{uuid.uuid4().int % 10**6:06d}"


# -- sessions ------------------------------------------------------------------


def test_create_get_list_update_delete(gateway: Gateway) -> None:
    async def main() -> None:
        async with AsyncSessionsClient(api_url=gateway.url, bearer_token=gateway.token) as c:
            s = await c.create_session(ttl=120, metadata={"project": "async"})
            try:
                assert isinstance(s, Session) and s.session_id.startswith("sbx-")
                assert s.status == "running" and s.ttl == 120 and s.password and s.replayed is False
                got = await c.get_session(s.session_id)
                assert got.session_id == s.session_id and got.metadata == {"project": "async"}
                assert got.password is None and got.host_keys == s.host_keys
                page = await c.list_sessions(limit=100)
                assert set(page) == {"sessions", "total", "limit", "offset"}
                assert s.session_id in [x.session_id for x in page["sessions"]]
                upd = await c.update_session(s.session_id, ttl=600)
                assert upd.ttl == 600
            finally:
                assert await c.delete_session(s.session_id) is None
            with pytest.raises(SessionNotFoundError) as ei:
                await c.get_session(s.session_id)
            assert ei.value.status_code == 410 and ei.value.code == "session_gone"
            assert isinstance(ei.value, SessionGoneError) and ei.value.reason == "deleted"
            with pytest.raises(SessionNotFoundError):
                await c.delete_session(s.session_id)

    arun(main())


def test_idempotency_key_replays(gateway: Gateway) -> None:
    async def main() -> None:
        key = "async-" + uuid.uuid4().hex
        async with AsyncSessionsClient(gateway.url, gateway.token) as c:
            a = await c.create_session(ttl=60, idempotency_key=key)
            b = await c.create_session(ttl=60, idempotency_key=key)
            try:
                assert b.session_id == a.session_id and b.replayed is True and b.password is None
            finally:
                await c.delete_session(a.session_id)

    arun(main())


def test_concurrent_requests(gateway: Gateway) -> None:
    async def main() -> None:
        async with AsyncSessionsClient(gateway.url, gateway.token) as c:
            created = await asyncio.gather(*(c.create_session(ttl=60, metadata={"n": i}) for i in range(4)))
            try:
                assert len({s.session_id for s in created}) == 4
                got = await asyncio.gather(*(c.get_session(s.session_id) for s in created))
                assert [g.metadata for g in got] == [{"n": i} for i in range(4)]
            finally:
                await asyncio.gather(*(c.delete_session(s.session_id) for s in created))

    arun(main())


# -- errors --------------------------------------------------------------------


def test_errors_401_404_and_argument_checks(gateway: Gateway) -> None:
    async def main() -> None:
        async with AsyncSessionsClient(gateway.url, "wrong-token") as bad:
            with pytest.raises(UnauthorizedError) as ei:
                await bad.list_sessions()
            assert ei.value.status_code == 401
        async with AsyncSessionsClient(gateway.url, gateway.token) as c:
            with pytest.raises(SessionNotFoundError) as nf:
                await c.run("sbx-doesnotexist", "true")
            assert nf.value.status_code == 404
            with pytest.raises(ValueError):
                await c.create_session(ttl=5)
            with pytest.raises(ValueError):
                await c.run("sbx-x", "true", argv=["true"])
            with pytest.raises(TypeError):
                await c.create_session(resources={"memoryMiB": "big"})
        # Nothing listens there.
        async with AsyncSessionsClient("http://127.0.0.1:9", gateway.token, timeout=2) as down:
            with pytest.raises(SandboxConnectionError):
                await down.get_session("sbx-x")
        with pytest.raises(ValueError):
            AsyncSessionsClient("ftp://x", "t")

    arun(main())


@pytest.fixture(scope="module")
def limited(sandgate_bin: str, scratch: Path) -> Iterator[Gateway]:
    """3 requests per minute and 1 live session per tenant."""
    a, b = secrets.token_hex(16), secrets.token_hex(16)
    gw = start_gateway(
        sandgate_bin, scratch, "--rate-limit", "3", "--max-sessions-per-tenant", "1", keys=[f"a:{a}", f"b:{b}"]
    )
    gw.other_token = b
    try:
        yield gw
    finally:
        gw.stop()


def test_rate_limit_429(limited: Gateway) -> None:
    async def main() -> None:
        async with AsyncSessionsClient(limited.url, limited.token) as c:
            s = await c.create_session(ttl=60)  # 1
            await c.get_session(s.session_id)  # 2
            await c.list_sessions()  # 3
            with pytest.raises(RateLimitError) as ei:
                await c.list_sessions()  # 4
        e = ei.value
        assert e.status_code == 429 and e.code == "rate_limited"
        assert e.limit == 3 and e.remaining == 0
        assert e.retry_after is not None and 0 <= e.retry_after <= 61

    arun(main())


def test_session_quota_is_a_rate_limit_error(limited: Gateway) -> None:
    async def main() -> None:
        async with AsyncSessionsClient(limited.url, limited.other_token) as c:
            await c.create_session(ttl=60)
            with pytest.raises(RateLimitError) as ei:
                await c.create_session(ttl=60)
        assert ei.value.code == "quota_exceeded"

    arun(main())


# -- run and shells ------------------------------------------------------------


def test_run_argv_stdin_env_cwd(gateway: Gateway, session: Session) -> None:
    sid = session.session_id

    async def main() -> None:
        async with AsyncSessionsClient(gateway.url, gateway.token) as c:
            res = await c.run(sid, "echo out; echo err >&2; exit 3")
            assert isinstance(res, CommandResult)
            assert (res.stdout, res.stderr, res.exit_code, res.timed_out) == ("out\n", "err\n", 3, False)
            assert (await c.run(sid, argv=["printf", "%s|%s", "$HOME", "a b"])).stdout == "$HOME|a b"
            assert (await c.run(sid, "cat", stdin="hello")).stdout == "hello"
            assert (await c.run(sid, "wc -c", stdin=b"\x00\x01\xff")).stdout.strip() == "3"
            assert (await c.run(sid, 'printf %s "$LC_X"', env={"LC_X": "a b"})).stdout == "a b"
            with pytest.raises(SandboxOperationError) as ei:
                await c.run(sid, "true", env={"SDK_NOT_ALLOWED": "1"})
            assert ei.value.code == "env_not_allowed"
            await c.run(sid, "mkdir -p sub/dir")
            assert (await c.run(sid, "pwd", cwd="sub/dir")).stdout.strip().endswith("/sub/dir")
            res = await c.run(sid, "echo started; sleep 30", timeout=1)
            assert res.exit_code == 124 and res.timed_out is True and res.stdout == "started\n"
            history = await c.list_commands(sid)
            assert history and history[-1]["source"] == "rest"

    arun(main())


def test_run_streaming_callbacks(gateway: Gateway, session: Session) -> None:
    async def main() -> None:
        events: List[Tuple[str, Union[str, bytes]]] = []
        async with AsyncSessionsClient(gateway.url, gateway.token) as c:
            res = await c.run(
                session.session_id,
                "echo one; sleep 0.3; echo two >&2; sleep 0.3; echo three; exit 5",
                on_stdout=lambda x: events.append(("out", x)),
                on_stderr=lambda x: events.append(("err", x)),
            )
        assert events == [("out", "one\n"), ("err", "two\n"), ("out", "three\n")]
        assert (res.stdout, res.stderr, res.exit_code) == ("one\nthree\n", "two\n", 5)

    arun(main())


def test_shell_keeps_state(gateway: Gateway, session: Session) -> None:
    async def main() -> None:
        async with AsyncSessionsClient(gateway.url, gateway.token) as c:
            async with c.shell(session.session_id, "async") as sh:
                assert isinstance(sh, AsyncShell)
                await sh.run("mkdir -p d && cd d && export A=1")
                res = await sh.run("pwd; echo $A")
                assert res.stdout.splitlines()[1] == "1" and res.stdout.splitlines()[0].endswith("/d")
            assert await c.delete_shell(session.session_id, "async") is False  # closed by the with

    arun(main())


# -- cancellation --------------------------------------------------------------


def test_cancelled_run_kills_the_command(gateway: Gateway, session: Session) -> None:
    marker = sleep_marker()

    async def main() -> None:
        async with AsyncSessionsClient(gateway.url, gateway.token) as c:
            t0 = time.monotonic()
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(c.run(session.session_id, f"sleep {marker}"), 1)
            assert time.monotonic() - t0 < 3
            # The streaming mode too, with task.cancel().
            marker2 = sleep_marker()
            seen: List[Union[str, bytes]] = []
            task = asyncio.ensure_future(
                c.run(session.session_id, f"echo go; exec sleep {marker2}", on_stdout=seen.append)
            )
            while not seen:
                await asyncio.sleep(0.05)
            assert await asyncio.to_thread(wait_present, f"sleep {marker2}")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await asyncio.to_thread(wait_gone, f"sleep {marker2}") == []
            # The client is still usable.
            assert (await c.run(session.session_id, "echo ok")).stdout == "ok\n"

    arun(main())
    assert wait_gone(f"sleep {marker}") == [], "the cancelled command must be killed"


def test_cancelled_background_run_keeps_running(gateway: Gateway, session: Session) -> None:
    marker = sleep_marker()

    async def main() -> None:
        async with AsyncSessionsClient(gateway.url, gateway.token) as c:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(c.run(session.session_id, f"sleep {marker}", background=True), 1)

    arun(main())
    time.sleep(0.5)
    left = processes_matching(f"sleep {marker}")
    assert left, "a background command outlives its request"


# -- files ---------------------------------------------------------------------


def test_files_round_trip(gateway: Gateway, session: Session, local_dir: Path) -> None:
    sid = session.session_id

    async def main() -> None:
        async with AsyncSessionsClient(gateway.url, gateway.token) as c:
            entry = await c.write_file(sid, "dir/a.txt", "hello", mode=0o600)
            assert entry["sizeBytes"] == 5 and entry["mode"] == "0600"
            assert await c.read_file(sid, "dir/a.txt") == b"hello"
            assert await c.read_file(sid, "dir/a.txt", max_bytes=2) == b"he"
            await c.write_file(sid, "empty", b"")
            assert await c.read_file(sid, "empty", max_bytes=10) == b""
            # A file object, streamed (3 MiB, with a Content-Length) and read back to a file.
            data = bytes(range(256)) * (3 * 4096)
            await c.write_file(sid, "big.bin", io.BytesIO(data))
            assert await c.read_file_to(sid, "big.bin", local_dir / "big.bin") == len(data)
            assert (local_dir / "big.bin").read_bytes() == data
            listing = await c.list_files(sid, "dir")
            assert isinstance(listing, FileList) and [e["name"] for e in listing] == ["a.txt"]
            await c.delete_file(sid, "dir", recursive=True)
            with pytest.raises(FileNotFoundInSandboxError) as ei:
                await c.read_file(sid, "dir/a.txt")
            assert ei.value.filename == "dir/a.txt" and ei.value.status_code == 404
            with pytest.raises(FileNotFoundInSandboxError):
                await c.read_file_to(sid, "nope", local_dir / "nope")
            assert not (local_dir / "nope").exists()

    arun(main())


# -- processes -----------------------------------------------------------------


def test_processes(gateway: Gateway, session: Session) -> None:
    sid = session.session_id

    async def main() -> None:
        async with AsyncSessionsClient(gateway.url, gateway.token) as c:
            p = await c.start_process(sid, "echo a; sleep 0.2; echo b >&2", name="ab")
            assert p["processId"] and p["name"] == "ab"
            stream = await c.process_output(sid, p["processId"])
            assert isinstance(stream, AsyncNDJSONStream)
            async with stream:
                lines = [line async for line in stream]
            assert lines[-1]["done"] is True and lines[-1]["exitCode"] == 0
            assert "".join(x.get("stdout", "") for x in lines) == "a\n"
            assert "".join(x.get("stderr", "") for x in lines) == "b\n"
            assert (await c.get_process(sid, p["processId"]))["status"] == "exited"
            assert p["processId"] in [x["processId"] for x in await c.list_processes(sid)]

            cat = await c.start_process(sid, argv=["cat"])
            await c.send_process_input(sid, cat["processId"], "in\n", eof=True)
            async with await c.process_output(sid, cat["processId"]) as out:
                lines = [line async for line in out]
            assert "".join(x.get("stdout", "") for x in lines) == "in\n"

            sl = await c.start_process(sid, "sleep 30")
            await c.signal_process(sid, sl["processId"], "KILL")
            async with await c.process_output(sid, sl["processId"]) as out:
                last = [line async for line in out][-1]
            assert last["done"] is True and last["exitSignal"] == "KILL"
            with pytest.raises(ProcessExitedError):
                await c.signal_process(sid, sl["processId"], "TERM")
            with pytest.raises(ProcessNotFoundError):
                await c.get_process(sid, "p999999")
            with pytest.raises(ValueError):
                await c.signal_process(sid, sl["processId"], "NOPE")

    arun(main())


def test_callback_exception_drops_the_run_and_kills_it(gateway: Gateway, session: Session) -> None:
    marker = sleep_marker()

    def boom(_: Union[str, bytes]) -> None:
        raise OSError("stop")  # propagates as it is, not as a connection error

    async def main() -> None:
        async with AsyncSessionsClient(gateway.url, gateway.token) as c:
            with pytest.raises(OSError, match="stop"):
                await c.run(session.session_id, f"echo go; exec sleep {marker}", on_stdout=boom)

    arun(main())
    assert wait_gone(f"sleep {marker}") == []
