"""The Python seed shapes of issue 39, on the real gateway.

- the Python kernel as a method of both clients: ``run_python`` and
  ``reset_python`` (``POST .../python``, ``.../python/reset``), and
  ``stop_session`` (``POST .../stop``);
- a session handle shaped like seed 003's ``Session`` (``open_session``,
  ``session``: ``exec`` in a persistent shell, ``write``, ``read``,
  ``destroy``), sync and async;
- ``sandbox_sessions_sdk.openai_agents`` without the Agents SDK installed
  says which extra to install.

(Seed 002's ``SandboxSpec.workspace`` is in ``test_sandbox_client.py``.)
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import sys
from typing import Any, Awaitable

import pytest
from conftest import Gateway

from sandbox_sessions_sdk import (
    AsyncSessionHandle,
    AsyncSessionsClient,
    PythonError,
    PythonResult,
    SessionHandle,
    SessionNotFoundError,
    SessionsClient,
)
from sandbox_sessions_sdk.handle import ExecResult


def arun(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]


# -- run_python, reset_python, stop_session ------------------------------------------


def test_run_python_keeps_state_and_reports_errors(client: SessionsClient, session) -> None:
    sid = session.session_id
    r = client.run_python(sid, "x = 20\nx + 1")
    assert isinstance(r, PythonResult) and r.ok
    assert (r.kernel, r.result, r.error, r.state_lost) == ("default", "21", None, False)
    r = client.run_python(sid, "print('x is', x)\n{}['missing']")
    assert r.stdout == "x is 20\n" and r.result is None and not r.ok
    assert isinstance(r.error, PythonError) and r.error.name == "KeyError" and "missing" in r.error.traceback
    # Another kernel has its own state.
    r = client.run_python(sid, "'x' in dir()", kernel="other")
    assert r.kernel == "other" and r.result == "False"
    # The timeout interrupts the code; the state stays.
    r = client.run_python(sid, "import time\ntime.sleep(30)", timeout=1)
    assert r.timed_out and r.interrupted and not r.state_lost
    assert client.run_python(sid, "x").result == "20"
    assert client.reset_python(sid) is True
    assert client.reset_python(sid, kernel="never-ran") is False
    r = client.run_python(sid, "'x' in dir()")
    assert r.result == "False"
    with pytest.raises(TypeError):
        client.run_python(sid, b"1")  # type: ignore[arg-type]


def test_async_run_python_and_stop_session(gateway: Gateway) -> None:
    async def go() -> None:
        async with AsyncSessionsClient(api_url=gateway.url, bearer_token=gateway.token) as c:
            s = await c.create_session(ttl=600)
            try:
                r = await c.run_python(s.session_id, "y = [1, 2]\nlen(y)")
                assert r.result == "2"
                assert await c.reset_python(s.session_id) is True
                stopped = await c.stop_session(s.session_id)
                assert stopped.status == "stopped"
                # The next command starts it again, on the same files.
                assert (await c.run(s.session_id, "echo back")).stdout == "back\n"
                assert (await c.get_session(s.session_id)).status == "running"
            finally:
                await c.delete_session(s.session_id)

    arun(go())


def test_stop_session_keeps_files(client: SessionsClient, session) -> None:
    sid = session.session_id
    client.write_file(sid, "kept.txt", "yes")
    assert client.stop_session(sid).status == "stopped"
    assert client.stop_session(sid).status == "stopped"  # stopping a stopped session changes nothing
    assert client.read_file(sid, "kept.txt") == b"yes"
    with pytest.raises(SessionNotFoundError):
        client.stop_session("sbx-doesnotexist00000000")


def test_python_result_from_the_wire() -> None:
    r = PythonResult.from_dict({
        "kernel": "k", "stdoutBase64": "/w==", "stderr": "e", "result": None,
        "error": {"name": "KernelDied", "value": "killed by signal 9", "traceback": ""},
        "durationMs": 7, "truncated": False, "timedOut": False, "interrupted": False,
        "restarted": True, "stateLost": True,
    })
    assert (r.kernel, r.stdout, r.stderr, r.duration_ms, r.restarted, r.state_lost) == ("k", "\ufffd", "e", 7, True, True)
    assert r.error == PythonError("KernelDied", "killed by signal 9", "") and not r.ok
    assert r.raw["kernel"] == "k"


# -- seed 003's session handle ----------------------------------------------------------


def test_session_handle_seed_003_shape(client: SessionsClient) -> None:
    session = client.open_session(ttl=600, metadata={"test": "handle"})
    assert isinstance(session, SessionHandle) and session.id.startswith("sbx-")
    try:
        res = session.exec("mkdir -p proj && cd proj && export GREETING=hi", timeout_ms=30000)
        assert isinstance(res, ExecResult) and res.exit_code == 0 and res.cwd.endswith("/proj")
        res = session.exec("echo $GREETING; echo oops >&2; pwd")
        assert res.output.startswith("hi\noops\n") or res.output.startswith("hi\n")
        assert "oops" in res.output and res.cwd.endswith("/proj") and res.duration_ms >= 0
        assert not res.truncated
        res = session.exec("sleep 20", timeout_ms=500)
        assert res.exit_code == 124
        session.write("proj/fib.py", "print(13)\n")
        assert session.read("proj/fib.py") == b"print(13)\n"
        assert session.read("proj/fib.py", max_bytes=5) == b"print"
        assert session.exec("python3 fib.py").output == "13\n"
        assert session.run_python("6 * 7").result == "42"
        assert session.info().session_id == session.id
        same = client.session(session.id)
        assert same.read("proj/fib.py") == b"print(13)\n"
    finally:
        session.destroy()
    session.destroy()  # already gone: no error
    with pytest.raises(SessionNotFoundError):
        client.get_session(session.id)
    with pytest.raises(ValueError):
        session.exec("true", timeout_ms=0)


def test_async_session_handle(gateway: Gateway) -> None:
    async def go() -> str:
        async with AsyncSessionsClient(api_url=gateway.url, bearer_token=gateway.token) as client:
            async with await client.open_session(ttl=600) as session:
                assert isinstance(session, AsyncSessionHandle)
                await session.write("a.txt", "content")
                res = await session.exec("cat a.txt && cd /tmp")
                assert (res.exit_code, res.output) == (0, "content")
                assert (await session.exec("pwd")).cwd == "/tmp"
                assert await session.read("a.txt") == b"content"
                assert (await session.run_python("1 + 1")).result == "2"
                return session.id

    sid = asyncio.run(go())
    with SessionsClient(api_url=gateway.url, bearer_token=gateway.token) as c:
        with pytest.raises(SessionNotFoundError):
            c.get_session(sid)


# -- the openai-agents extra --------------------------------------------------------------


def test_openai_agents_module_names_its_extra() -> None:
    if importlib.util.find_spec("agents") is not None:
        pytest.skip("the Agents SDK is installed here: examples/tests run the backend with it")
    sys.modules.pop("sandbox_sessions_sdk.openai_agents", None)
    with pytest.raises(ImportError, match=r"sandgate-sdk\[openai-agents\]"):
        importlib.import_module("sandbox_sessions_sdk.openai_agents")
    # The package itself does not need it.
    import sandbox_sessions_sdk

    assert sandbox_sessions_sdk.SessionsClient is SessionsClient
