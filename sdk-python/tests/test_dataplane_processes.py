"""REST background processes against the real gateway: start_process,
list_processes, get_process, process_output, send_process_input,
signal_process.
"""

from __future__ import annotations

import base64
import signal
import time
from typing import Any, Dict, List, Tuple

import pytest

from sandbox_sessions_sdk import (
    ProcessExitedError,
    ProcessNotFoundError,
    Session,
    SessionNotFoundError,
    SessionsClient,
)


@pytest.fixture
def sid(session: Session) -> str:
    return session.session_id


def _collect(lines: List[Dict[str, Any]]) -> Tuple[bytes, bytes, Dict[str, Any]]:
    """(stdout, stderr, last line) of an output stream's lines."""
    out, err = b"", b""
    for line in lines:
        out += line.get("stdout", "").encode() + base64.b64decode(line.get("stdoutBase64", ""))
        err += line.get("stderr", "").encode() + base64.b64decode(line.get("stderrBase64", ""))
    return out, err, lines[-1]


def test_start_and_follow_to_done(client: SessionsClient, sid: str) -> None:
    p = client.start_process(sid, "echo one; sleep 0.3; echo two >&2; sleep 0.3; echo three; exit 4", name="job")
    assert p["processId"] and p["status"] == "running" and p["name"] == "job"
    lines = list(client.process_output(sid, p["processId"]))
    out, err, last = _collect(lines)
    assert (out, err) == (b"one\nthree\n", b"two\n")
    assert last["done"] is True and last["exitCode"] == 4 and last["nextOffset"] == len(out) + len(err)
    # Offsets count both streams in order.
    offsets = [line["offset"] for line in lines if "offset" in line]
    assert offsets == sorted(offsets) and offsets[0] == 0
    got = client.get_process(sid, p["processId"])
    assert got["status"] == "exited" and got["exitCode"] == 4 and got["outputBytes"] == len(out) + len(err)
    assert p["processId"] in [q["processId"] for q in client.list_processes(sid)]
    # Read again from an offset, without following.
    again = list(client.process_output(sid, p["processId"], offset=4, follow=False))
    assert _collect(again)[0] == b"three\n" and again[-1]["done"] is True


def test_argv_env_cwd(client: SessionsClient, sid: str) -> None:
    client.run(sid, "mkdir -p pdir")
    p = client.start_process(
        sid, argv=["sh", "-c", 'pwd; echo "$LC_SDKP"'], env={"LC_SDKP": "v", "SDK_NOT_ALLOWED": "x"}, cwd="pdir"
    )
    assert p.get("envIgnored") == ["SDK_NOT_ALLOWED"]
    out, _, last = _collect(list(client.process_output(sid, p["processId"])))
    lines = out.decode().splitlines()
    assert lines[0].endswith("/pdir") and lines[1] == "v" and last["exitCode"] == 0


def test_not_following_a_running_process(client: SessionsClient, sid: str) -> None:
    p = client.start_process(sid, "echo ready; sleep 30")
    deadline = time.monotonic() + 10
    while client.get_process(sid, p["processId"])["outputBytes"] < 6 and time.monotonic() < deadline:
        time.sleep(0.05)
    lines = list(client.process_output(sid, p["processId"], follow=False))
    assert _collect(lines)[0] == b"ready\n"
    assert lines[-1]["done"] is False and lines[-1]["nextOffset"] == 6
    # The last bytes only.
    assert _collect(list(client.process_output(sid, p["processId"], offset=-3, follow=False)))[0] == b"dy\n"
    client.signal_process(sid, p["processId"], "KILL")


def test_stdin_with_eof(client: SessionsClient, sid: str) -> None:
    p = client.start_process(sid, "cat; echo end")
    pid = p["processId"]
    client.send_process_input(sid, pid, "hello\n")
    client.send_process_input(sid, pid, b"\x00\xffbin")
    big = b"z" * (200 * 1024)  # more than one request's worth
    client.send_process_input(sid, pid, big, eof=True)
    with client.process_output(sid, pid) as stream:
        out, _, last = _collect(list(stream))
    assert out == b"hello\n\x00\xffbin" + big + b"end\n"
    assert last["done"] is True and last["exitCode"] == 0
    with pytest.raises(ProcessExitedError):
        client.send_process_input(sid, pid, "late")


def test_stdin_eof_alone(client: SessionsClient, sid: str) -> None:
    p = client.start_process(sid, "wc -c")
    client.send_process_input(sid, p["processId"], "", eof=True)
    out, _, last = _collect(list(client.process_output(sid, p["processId"])))
    assert out.strip() == b"0" and last["exitCode"] == 0


def test_signal(client: SessionsClient, sid: str) -> None:
    p = client.start_process(sid, "echo up; exec sleep 60")
    pid = p["processId"]
    stream = client.process_output(sid, pid)
    first = next(stream)
    assert first.get("stdout") == "up\n"
    client.signal_process(sid, pid)  # TERM
    rest = list(stream)
    assert rest[-1]["done"] is True and rest[-1].get("exitSignal") == "TERM"
    got = client.get_process(sid, pid)
    assert got["status"] == "killed" and got["exitSignal"] == "TERM"
    with pytest.raises(ProcessExitedError):
        client.signal_process(sid, pid, "KILL")
    # Names with SIG, lower case, and signal.Signals members are taken.
    q = client.start_process(sid, "exec sleep 60")
    client.signal_process(sid, q["processId"], signal.SIGINT)
    last = list(client.process_output(sid, q["processId"]))[-1]
    assert last["done"] is True and last.get("exitSignal") == "INT"
    r = client.start_process(sid, "exec sleep 60")
    client.signal_process(sid, r["processId"], "sigkill")
    assert list(client.process_output(sid, r["processId"]))[-1].get("exitSignal") == "KILL"


def test_stream_close_leaves_the_process(client: SessionsClient, sid: str) -> None:
    p = client.start_process(sid, "echo a; sleep 1; echo b")
    with client.process_output(sid, p["processId"]) as stream:
        assert next(stream).get("stdout") == "a\n"
    out, _, last = _collect(list(client.process_output(sid, p["processId"])))
    assert out == b"a\nb\n" and last["exitCode"] == 0


def test_process_errors(client: SessionsClient, sid: str) -> None:
    for call in (
        lambda: client.get_process(sid, "p999"),
        lambda: client.process_output(sid, "p999"),
        lambda: client.send_process_input(sid, "p999", "x"),
        lambda: client.signal_process(sid, "p999"),
    ):
        with pytest.raises(ProcessNotFoundError) as ei:
            call()
        assert ei.value.code == "process_not_found" and ei.value.status_code == 404
    with pytest.raises(SessionNotFoundError):
        client.list_processes("sbx-doesnotexist")


def test_process_argument_checks(client: SessionsClient) -> None:
    sid = "sbx-doesnotexist"  # a request would raise SessionNotFoundError
    for exc, call in [
        (ValueError, lambda: client.start_process(sid)),
        (ValueError, lambda: client.start_process(sid, "true", argv=["true"])),
        (TypeError, lambda: client.start_process(sid, argv="true")),
        (ValueError, lambda: client.start_process(sid, "true", name="n" * 65)),
        (ValueError, lambda: client.start_process(sid, "true", env={f"LC_{i}": "x" for i in range(65)})),
        (ValueError, lambda: client.get_process(sid, "")),
        (TypeError, lambda: client.process_output(sid, "p1", offset="0")),  # type: ignore[arg-type]
        (TypeError, lambda: client.process_output(sid, "p1", follow=1)),  # type: ignore[arg-type]
        (TypeError, lambda: client.send_process_input(sid, "p1", 5)),  # type: ignore[arg-type]
        (TypeError, lambda: client.send_process_input(sid, "p1", "x", eof="yes")),  # type: ignore[arg-type]
        (ValueError, lambda: client.signal_process(sid, "p1", "NOPE")),
        (TypeError, lambda: client.signal_process(sid, "p1", 9)),
    ]:
        with pytest.raises(exc):
            call()
