"""REST commands against the real gateway: SessionsClient.run, persistent
shells (SessionsClient.shell), and the command history."""

from __future__ import annotations

import time
from typing import List, Tuple, Union

import pytest

from sandbox_sessions_sdk import (
    CommandResult,
    RateLimitError,
    SandboxOperationError,
    Session,
    SessionNotFoundError,
    SessionsClient,
    Shell,
    ShellBusyError,
)


def test_run_command_and_argv(client: SessionsClient, session: Session) -> None:
    sid = session.session_id
    res = client.run(sid, "echo out; echo err >&2; exit 3")
    assert isinstance(res, CommandResult)
    assert (res.stdout, res.stderr, res.exit_code, res.exit_signal) == ("out\n", "err\n", 3, None)
    assert res.truncated is False and res.timed_out is False
    assert isinstance(res.duration_ms, int) and res.duration_ms >= 0
    assert res.cwd  # the workspace, as the driver names it
    # The mapping view is still the five keys of old.
    assert dict(res) == {"stdout": "out\n", "stderr": "err\n", "exit_code": 3, "exit_signal": None, "truncated": False}
    # argv: no shell parsing at all.
    res = client.run(sid, argv=["printf", "%s|%s", "$HOME", "a b"])
    assert (res.stdout, res.exit_code) == ("$HOME|a b", 0)
    assert client.run(sid, argv=["sh", "-c", "exit 7"]).exit_code == 7
    assert client.run(sid, "nosuchcommand-xyz").exit_code == 127


def test_stdin_env_cwd(client: SessionsClient, session: Session) -> None:
    sid = session.session_id
    assert client.run(sid, "cat", stdin="hello\nworld").stdout == "hello\nworld"
    assert client.run(sid, "wc -c", stdin=b"\x00\x01\x02\xff").stdout.strip() == "4"
    assert client.run(sid, "cat").stdout == ""  # no stdin: EOF at once
    res = client.run(sid, 'printf "%s|%s" "$LC_SDKTEST" "$LANG"', env={"LC_SDKTEST": "a b", "LANG": "C.UTF-8"})
    assert res.stdout == "a b|C.UTF-8"
    with pytest.raises(SandboxOperationError) as ei:
        client.run(sid, "true", env={"SDK_NOT_ALLOWED": "1"})
    assert ei.value.code == "env_not_allowed" and ei.value.status_code == 400
    assert "SDK_NOT_ALLOWED" in str(ei.value)
    client.run(sid, "mkdir -p sub/dir")
    res = client.run(sid, "pwd", cwd="sub/dir")
    assert res.stdout.strip().endswith("/sub/dir") and res.cwd is not None and res.cwd.endswith("/sub/dir")
    # A directory that does not exist fails the command, not the request.
    assert client.run(sid, "pwd", cwd="no/such/dir").exit_code == 1


def test_timeout_is_exit_124_not_an_exception(client: SessionsClient, session: Session) -> None:
    t0 = time.monotonic()
    res = client.run(session.session_id, "echo started; sleep 30; echo never", timeout=1)
    assert time.monotonic() - t0 < 15
    assert res.exit_code == 124 and res.timed_out is True
    assert res.stdout == "started\n"
    assert res.duration_ms is not None and res.duration_ms >= 1000
    # The session is still usable.
    assert client.run(session.session_id, "echo ok").stdout == "ok\n"


def test_output_cap_truncates_head_and_tail(client: SessionsClient, session: Session) -> None:
    cmd = "head -c 5000 /dev/zero | tr '\\0' x; printf END; head -c 3000 /dev/zero | tr '\\0' y >&2"
    res = client.run(session.session_id, cmd, max_output_bytes=100)
    assert res.truncated is True and res.exit_code == 0
    assert res.stdout == "x" * 50 + "x" * 47 + "END"  # first 50 bytes, then the last 50: no marker
    assert res.stderr == "y" * 100
    full = client.run(session.session_id, cmd)
    assert full.truncated is False and len(full.stdout) == 5003 and len(full.stderr) == 3000


def test_binary_output(client: SessionsClient, session: Session) -> None:
    cmd = "printf '\\377\\376abc'; printf '\\200' >&2"
    res = client.run(session.session_id, cmd)
    # Not UTF-8: the gateway sends base64; the result decodes it as SSH does (U+FFFD).
    assert res.stdout == "\ufffd\ufffdabc" and res.stderr == "\ufffd"
    chunks: List[Union[str, bytes]] = []
    res = client.run(session.session_id, cmd, on_stdout=chunks.append)
    # The callback sees the exact bytes: bytes chunks for what is not text.
    assert b"".join(c if isinstance(c, bytes) else c.encode() for c in chunks) == b"\xff\xfeabc"
    assert any(isinstance(c, bytes) for c in chunks)
    assert res.stdout == "\ufffd\ufffdabc" and res.stderr == "\ufffd"


def test_streaming_callbacks_in_order_and_final_result(client: SessionsClient, session: Session) -> None:
    events: List[Tuple[str, Union[str, bytes], float]] = []
    t0 = time.monotonic()
    res = client.run(
        session.session_id,
        "echo one; sleep 0.5; echo two >&2; sleep 0.5; echo three; exit 5",
        on_stdout=lambda c: events.append(("out", c, time.monotonic())),
        on_stderr=lambda c: events.append(("err", c, time.monotonic())),
    )
    t_end = time.monotonic()
    assert [(s, c) for s, c, _ in events] == [("out", "one\n"), ("err", "two\n"), ("out", "three\n")]
    # The first chunk came as it was printed, well before the end.
    assert events[0][2] - t0 < t_end - t0 - 0.7
    assert (res.stdout, res.stderr, res.exit_code, res.timed_out) == ("one\nthree\n", "two\n", 5, False)
    # Only one callback: the other stream is still collected.
    res = client.run(session.session_id, "echo a; echo b >&2", on_stderr=lambda c: None)
    assert (res.stdout, res.stderr) == ("a\n", "b\n")


def test_streaming_timeout_and_cap(client: SessionsClient, session: Session) -> None:
    seen: List[Union[str, bytes]] = []
    res = client.run(session.session_id, "echo hi; sleep 30", timeout=1, on_stdout=seen.append)
    assert seen == ["hi\n"] and res.exit_code == 124 and res.timed_out is True and res.stdout == "hi\n"
    res = client.run(
        session.session_id, "head -c 1000 /dev/zero | tr '\\0' z", max_output_bytes=10, on_stdout=seen.append
    )
    assert res.truncated is True and res.stdout == "z" * 10  # streamed: the head only


def test_callback_exception_propagates(client: SessionsClient, session: Session) -> None:
    def boom(chunk: Union[str, bytes]) -> None:
        raise RuntimeError("stop")

    with pytest.raises(RuntimeError, match="stop"):
        client.run(session.session_id, "echo x; sleep 30", on_stdout=boom)
    assert client.run(session.session_id, "echo still").stdout == "still\n"


def test_background_command(client: SessionsClient, session: Session) -> None:
    res = client.run(session.session_id, "echo bg", background=True)
    assert (res.stdout, res.exit_code) == ("bg\n", 0)


def test_shell_keeps_state(client: SessionsClient, session: Session) -> None:
    sid = session.session_id
    with client.shell(sid) as sh:
        assert isinstance(sh, Shell) and sh.name == "default"
        res = sh.run("mkdir -p work/dir && cd work/dir && export SDK_A=1 && SDK_B=2 && f() { echo fn; }")
        assert res.exit_code == 0 and res.cwd is not None and res.cwd.endswith("/work/dir")
        res = sh.run('pwd; echo "$SDK_A $SDK_B"; f')
        assert res.stdout.splitlines()[1:] == ["1 2", "fn"] and res.stdout.splitlines()[0].endswith("/work/dir")
        # Options pass through; stdin and env apply to that command only.
        assert sh.run("cat", stdin="in").stdout == "in"
        assert sh.run(argv=["pwd"]).stdout.strip().endswith("/work/dir")
        # Another shell has its own state.
        other = client.shell(sid, "other")
        assert other.run("echo ${SDK_A:-unset}").stdout == "unset\n"
        other.close()
        # A timeout kills the shell; the next command gets a new one with the exported state.
        res = sh.run("sleep 30", timeout=1)
        assert res.exit_code == 124 and res.timed_out is True
        res = sh.run('pwd; echo "${SDK_A:-unset} ${SDK_B:-unset}"; f')
        lines = res.stdout.splitlines()
        assert lines[0].endswith("/work/dir") and lines[1] == "1 unset" and lines[2] == "fn"
    # Closed: a new shell of the same name starts afresh.
    res = client.run(sid, "echo ${SDK_A:-unset}", shell="default")
    assert res.stdout == "unset\n"
    sh.close()
    sh.close()  # twice is fine
    assert client.delete_shell(sid, "default") is False


def test_shell_argument_checks(client: SessionsClient, session: Session) -> None:
    with pytest.raises(ValueError):
        client.shell(session.session_id, "bad name")
    with pytest.raises(ValueError):
        client.shell(session.session_id, "x" * 65)
    with pytest.raises(TypeError):
        client.shell(session.session_id, 3)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        client.shell(session.session_id).run("true", shell="x")
    with pytest.raises(ValueError):
        client.run(session.session_id, "true", shell="a/b")


def test_shell_busy_error_is_a_rate_limit_error() -> None:
    assert issubclass(ShellBusyError, RateLimitError)


def test_history_lists_rest_commands(client: SessionsClient, session: Session) -> None:
    sid = session.session_id
    client.run(sid, "echo history-one")
    client.run(sid, argv=["echo", "history two"])
    client.run(sid, "echo history-three", shell="hist")
    client.run(sid, "sleep 5", timeout=0.5)
    history = client.list_commands(sid)
    commands = [h["command"] for h in history]
    assert "echo history-one" in commands and "echo history-three" in commands
    assert any("history two" in c for c in commands)
    for h in history:
        assert h["source"] == "rest" and "startedAt" in h and "durationMs" in h
    by_cmd = {h["command"]: h for h in history}
    assert by_cmd["echo history-three"].get("shell") == "hist"
    assert by_cmd["echo history-one"]["exitCode"] == 0 and by_cmd["echo history-one"]["bytesOut"] == 12
    assert by_cmd["sleep 5"].get("timedOut") is True
    # Most recent last; limit keeps the most recent.
    assert client.list_commands(sid, limit=1) == history[-1:]
    with pytest.raises(ValueError):
        client.list_commands(sid, limit=0)
    with pytest.raises(ValueError):
        client.list_commands(sid, limit=1001)


def test_argument_checks_send_nothing(client: SessionsClient) -> None:
    # A session that does not exist: a request would raise SessionNotFoundError.
    sid = "sbx-doesnotexist"
    bad = [
        (ValueError, dict(command=None)),
        (ValueError, dict(command="true", argv=["true"])),
        (ValueError, dict(command="  ")),
        (ValueError, dict(command="a\x00b")),
        (TypeError, dict(command=["ls"])),
        (TypeError, dict(argv="ls")),
        (ValueError, dict(argv=[])),
        (ValueError, dict(argv=[""])),
        (TypeError, dict(argv=["ls", 1])),
        (TypeError, dict(command="true", stdin=1)),
        (TypeError, dict(command="true", env=["A"])),
        (TypeError, dict(command="true", env={"A": 1})),
        (ValueError, dict(command="true", env={"A=B": "1"})),
        (ValueError, dict(command="true", timeout=0)),
        (TypeError, dict(command="true", timeout="1")),
        (ValueError, dict(command="true", max_output_bytes=-1)),
        (TypeError, dict(command="true", max_output_bytes=1.5)),
        (TypeError, dict(command="true", background="yes")),
        (TypeError, dict(command="true", on_stdout="print")),
        (TypeError, dict(command="true", cwd=3)),
    ]
    for exc, kwargs in bad:
        with pytest.raises(exc):
            client.run(sid, **kwargs)
    with pytest.raises(ValueError):
        client.run("", "true")
    with pytest.raises(SessionNotFoundError):
        client.run(sid, "true")
    with pytest.raises(SessionNotFoundError):
        client.list_commands(sid)


def test_gateway_side_errors(client: SessionsClient, session: Session) -> None:
    with pytest.raises(SandboxOperationError) as ei:
        client.run(session.session_id, "true", timeout=10**7)
    assert ei.value.code == "invalid_timeout" and ei.value.status_code == 400
    client.delete_session(session.session_id)
    with pytest.raises(SessionNotFoundError):
        client.run(session.session_id, "true")
