"""E2B's quickstart flows with the sync ``e2b`` SDK, unchanged, against sandgate."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from e2b import CommandExitException, Sandbox, SandboxQuery
from e2b.exceptions import SandboxException


@pytest.fixture
def sandbox():
    sb = Sandbox.create(metadata={"suite": "e2b-sync"})
    try:
        yield sb
    finally:
        sb.kill()


def wait_for(cond, what: str, within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(0.05)


def test_create_and_run(sandbox: Sandbox) -> None:
    res = sandbox.commands.run("echo hi")
    assert res.stdout == "hi\n"
    assert res.exit_code == 0
    with pytest.raises(CommandExitException) as e:
        sandbox.commands.run("echo oops >&2; exit 3")
    assert e.value.exit_code == 3
    assert "oops" in e.value.stderr


def test_create_env_vars() -> None:
    sb = Sandbox.create(envs={"E2B_SUITE_VAR": "from-create"})
    try:
        assert sb.commands.run("echo $E2B_SUITE_VAR").stdout == "from-create\n"
        assert sb.commands.run("echo $ONE", envs={"ONE": "1"}).stdout == "1\n"
    finally:
        sb.kill()


def test_background_command_on_stdout_and_kill(sandbox: Sandbox) -> None:
    # The sync SDK calls a background command's on_stdout from wait(), as
    # E2B's docs show it: here in a thread, while the test kills it.
    seen: list[str] = []
    ended: list[BaseException] = []
    handle = sandbox.commands.run("for i in 1 2 3; do echo line$i; sleep 0.1; done; sleep 600", background=True)

    def wait() -> None:
        try:
            handle.wait(on_stdout=seen.append)
        except BaseException as e:  # noqa: BLE001 - kept for the assertion below
            ended.append(e)

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    wait_for(lambda: "line3" in "".join(seen), "the background command's third line")
    assert any(p.pid == handle.pid for p in sandbox.commands.list())
    assert sandbox.commands.kill(handle.pid) is True
    waiter.join(timeout=20)
    assert not waiter.is_alive()
    assert len(ended) == 1 and isinstance(ended[0], CommandExitException), ended
    assert all(p.pid != handle.pid for p in sandbox.commands.list())
    assert sandbox.commands.kill(handle.pid) is False


def test_files(sandbox: Sandbox) -> None:
    d = "e2b-files-" + uuid.uuid4().hex[:8]
    assert sandbox.files.make_dir(d) is True
    info = sandbox.files.write(f"{d}/hello.txt", "hello from e2b\n")
    assert info.name == "hello.txt"
    assert sandbox.files.read(f"{d}/hello.txt") == "hello from e2b\n"
    assert sandbox.files.read(f"{d}/hello.txt", format="bytes") == b"hello from e2b\n"
    assert [e.name for e in sandbox.files.list(d)] == ["hello.txt"]
    moved = sandbox.files.rename(f"{d}/hello.txt", f"{d}/moved.txt")
    assert moved.name == "moved.txt"
    assert sandbox.files.exists(f"{d}/moved.txt")
    assert not sandbox.files.exists(f"{d}/hello.txt")
    # The file is the sandbox's: a command sees it.
    assert sandbox.commands.run(f"cat {d}/moved.txt").stdout == "hello from e2b\n"
    sandbox.files.remove(f"{d}/moved.txt")
    assert sandbox.files.list(d) == []


def test_watch_dir_sees_a_write(sandbox: Sandbox) -> None:
    d = "e2b-watch-" + uuid.uuid4().hex[:8]
    sandbox.files.make_dir(d)
    handle = sandbox.files.watch_dir(d)
    try:
        sandbox.files.write(f"{d}/new.txt", "x")
        events: list = []
        deadline = time.monotonic() + 20
        while not any(e.name == "new.txt" for e in events):
            assert time.monotonic() < deadline, f"no event for new.txt; got {events}"
            events += handle.get_new_events()
            time.sleep(0.1)
    finally:
        handle.stop()


def test_timeout_list_and_kill() -> None:
    tag = uuid.uuid4().hex
    sb = Sandbox.create(metadata={"tag": tag}, timeout=600)
    try:
        sb.set_timeout(900)
        info = sb.get_info()
        assert info.metadata == {"tag": tag}
        assert 800 < (info.end_at - info.started_at).total_seconds() < 1000 + 60
        listed = Sandbox.list(query=SandboxQuery(metadata={"tag": tag})).next_items()
        assert [s.sandbox_id for s in listed] == [sb.sandbox_id]
        assert listed[0].state == "running"
        assert Sandbox.list(query=SandboxQuery(metadata={"tag": "other-" + tag})).next_items() == []
        assert sb.is_running()
    finally:
        assert sb.kill() is True
    assert Sandbox.list(query=SandboxQuery(metadata={"tag": tag})).next_items() == []
    assert Sandbox.kill(sb.sandbox_id) is False


def test_list_pages() -> None:
    tag = uuid.uuid4().hex
    boxes = [Sandbox.create(metadata={"page": tag}) for _ in range(3)]
    try:
        pager = Sandbox.list(query=SandboxQuery(metadata={"page": tag}), limit=2)
        first = pager.next_items()
        assert len(first) == 2 and pager.has_next
        second = pager.next_items()
        assert len(second) == 1 and not pager.has_next
        assert {s.sandbox_id for s in first + second} == {b.sandbox_id for b in boxes}
    finally:
        for b in boxes:
            b.kill()


def test_pause_and_connect_keep_files() -> None:
    sb = Sandbox.create()
    try:
        sb.files.write("kept.txt", "still here")
        assert sb.pause() is True
        info = Sandbox.get_info(sb.sandbox_id)
        assert info.state == "paused"
        assert sb.pause() is False  # already paused
        again = Sandbox.connect(sb.sandbox_id)
        assert Sandbox.get_info(sb.sandbox_id).state == "running"
        assert again.files.read("kept.txt") == "still here"
        assert again.commands.run("cat kept.txt").stdout == "still here"
    finally:
        sb.kill()


def test_another_tenant_sees_nothing(gateway) -> None:
    sb = Sandbox.create()
    try:
        assert all(s.sandbox_id != sb.sandbox_id for s in Sandbox.list(api_key=gateway.other_token).next_items())
        assert Sandbox.kill(sb.sandbox_id, api_key=gateway.other_token) is False
        with pytest.raises(SandboxException):
            Sandbox.connect(sb.sandbox_id, api_key=gateway.other_token)
    finally:
        sb.kill()


def test_network_and_metrics() -> None:
    sb = Sandbox.create(network={"allow_out": ["example.com"]})
    try:
        assert sb.get_info().network["allow_out"] == ["example.com"]
        sb.update_network({"allow_out": ["api.example.org", "*.example.net"]})
        assert sorted(sb.get_info().network["allow_out"]) == ["*.example.net", "api.example.org"]
        sb.update_network({"allow_internet_access": False})
        assert sb.get_info().network["allow_out"] == []
        [m] = sb.get_metrics()
        assert m.cpu_count >= 1 and m.mem_total >= 0
    finally:
        sb.kill()


def test_stdin_blocked_is_a_timeout() -> None:
    # Input a process does not read is the SDK's TimeoutException (Connect
    # deadline_exceeded, code stdin_blocked), not an internal error.
    from e2b.exceptions import TimeoutException

    sb = Sandbox.create()
    try:
        handle = sb.commands.run("sleep 600", background=True, stdin=True)
        with pytest.raises(TimeoutException):
            sb.commands.send_stdin(handle.pid, "x" * (2 << 20))
        handle.kill()
    finally:
        sb.kill()
