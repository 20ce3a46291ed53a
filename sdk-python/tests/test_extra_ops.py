"""The methods docs/sdk.md's table needed and the clients lacked
(_extra_ops.py), against the real gateway: session_logs, list_images,
host_keys, file_link, create_ticket; sync and async. Also stop_session,
run_python and reset_python, which are the clients' own (client.py,
aio.py; test_seed_shapes.py has more), and that no method of the mixins
is defined again along a client's classes (one twin would be dead code)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from sandbox_sessions_sdk import PythonResult, SandboxOperationError, Session, SessionNotFoundError, SessionsClient
from sandbox_sessions_sdk._extra_ops import AsyncExtraOps, ExtraOps
from sandbox_sessions_sdk.aio import AsyncSessionsClient

from conftest import Gateway, start_gateway


@pytest.mark.parametrize("cls, mixin", [(SessionsClient, ExtraOps), (AsyncSessionsClient, AsyncExtraOps)])
def test_mixin_methods_defined_once(cls: type, mixin: type) -> None:
    own = {name for name in vars(mixin) if not name.startswith("_") and callable(vars(mixin)[name])}
    assert own
    twice = sorted(
        f"{name} ({klass.__name__})"
        for klass in cls.__mro__
        if klass is not mixin
        for name in vars(klass)
        if name in own
    )
    assert not twice, f"{mixin.__name__}'s methods are also defined by: {twice}"


def test_stop_and_kernel(client: SessionsClient, session: Session) -> None:
    sid = session.session_id
    client.write_file(sid, "keep.txt", b"kept")
    r = client.run_python(sid, "x = 20\nx + 1")
    assert isinstance(r, PythonResult) and r.result == "21"
    assert client.stop_session(sid).status == "stopped"
    assert client.run(sid, "cat keep.txt").stdout == "kept"
    # The stop ended the kernel: its state is gone.
    r = client.run_python(sid, "x")
    assert r.error is not None and r.error.name == "NameError"
    assert client.reset_python(sid) is True
    assert client.reset_python(sid, kernel="never") is False
    # A kernel name the gateway would refuse is refused before anything is sent.
    for bad in ("bad name", "", "k" * 65):
        with pytest.raises(ValueError):
            client.run_python(sid, "1", kernel=bad)
        with pytest.raises(ValueError):
            client.reset_python(sid, kernel=bad)
    with pytest.raises(SessionNotFoundError):
        client.stop_session("sbx-aaaaaaaaaaaaaaaaaaaa")


def test_logs_images_keys_links_tickets(client: SessionsClient, session: Session) -> None:
    sid = session.session_id
    client.run(sid, "echo for-the-logs")
    logs = client.session_logs(sid, tail=50)
    assert "== commands" in logs and "echo for-the-logs" in logs
    with pytest.raises(ValueError):
        client.session_logs(sid, tail=0)
    images = client.list_images()
    assert isinstance(images["images"], list) and isinstance(images["allow"], list)
    assert client.host_keys() == session.host_keys
    client.write_file(sid, "linked.txt", b"by link")
    link = client.file_link(sid, "linked.txt", expires_in=60)
    assert httpx.get(link["url"]).text == "by link"
    t = client.create_ticket(sid)
    assert t["sessionId"] == sid and len(t["ticket"]) > 10


def test_async_twins(gateway: Gateway, client: SessionsClient, session: Session) -> None:
    sid = session.session_id

    async def main() -> None:
        async with AsyncSessionsClient(api_url=gateway.url, bearer_token=gateway.token) as c:
            assert (await c.run_python(sid, "6 * 7")).result == "42"
            assert (await c.reset_python(sid)) is True
            assert (await c.host_keys()) == session.host_keys
            assert "allow" in await c.list_images()
            await c.run(sid, "echo async-logs")
            assert "async-logs" in await c.session_logs(sid)
            await c.write_file(sid, "a.txt", b"a")
            assert (await c.file_link(sid, "a.txt"))["url"].startswith("http")
            assert (await c.create_ticket(sid))["sessionId"] == sid
            assert (await c.stop_session(sid)).status == "stopped"

    asyncio.run(main())


def test_list_images_names_the_aliases(sandgate_bin: str, scratch: Path) -> None:
    gw = start_gateway(sandgate_bin, scratch, "--image-alias", "sg-alias-test:1=default")
    try:
        with SessionsClient(api_url=gw.url, bearer_token=gw.token) as c:
            assert c.list_images()["aliases"] == [{"name": "sg-alias-test:1", "image": "default"}]
            # A create asking for the alias gets the image it stands for.
            s = c.create_session(ttl=120, image="sg-alias-test:1")
            c.delete_session(s.session_id)
    finally:
        gw.stop()


def test_pause_and_resume(client: SessionsClient, session: Session, gateway: Gateway) -> None:
    """pause_session parks the processes with their memory; the next call
    (or resume_session) lets them run again, the kernel's variable kept."""
    sid = session.session_id
    assert client.run_python(sid, "kept = 6 * 7").error is None
    if session.isolation == "none":  # the workdir driver cannot pause
        with pytest.raises(SandboxOperationError) as e:
            client.pause_session(sid)
        assert e.value.code == "pause_unsupported"
        return
    p = client.pause_session(sid)
    assert p.status == "paused" and p.raw["pause"]["method"] == "freeze" and p.raw["pause"]["notKept"]
    assert client.get_session(sid).status == "paused"
    assert client.run_python(sid, "kept").result == "42"  # the call resumed it
    assert client.get_session(sid).status == "running"
    assert client.pause_session(sid).status == "paused"
    assert client.resume_session(sid).status == "running"
    assert client.resume_session(sid).status == "running"  # a running one: unchanged
    with pytest.raises(SessionNotFoundError):
        client.pause_session("sbx-aaaaaaaaaaaaaaaaaaaa")

    async def main() -> None:
        async with AsyncSessionsClient(api_url=gateway.url, bearer_token=gateway.token) as c:
            assert (await c.pause_session(sid)).status == "paused"
            assert (await c.resume_session(sid)).status == "running"
            assert (await c.run_python(sid, "kept")).result == "42"

    asyncio.run(main())


def _criu() -> str:
    """A criu 4.x for serve --checkpoint ($SANDGATE_CRIU, else .ci/build-criu's), or ""."""
    import os
    import subprocess

    for c in (os.environ.get("SANDGATE_CRIU", ""), os.path.expanduser("~/.cache/sandgate/criu-4.2/criu")):
        if c and os.access(c, os.X_OK):
            out = subprocess.run([c, "--version"], capture_output=True, text=True).stdout
            if "Version: 4." in out:
                return c
    return ""


def test_fork_session_refusals(client: SessionsClient, session: Session) -> None:
    """fork_session on a gateway without --checkpoint: fork_unsupported;
    a count past 8 is invalid_count; below 1 is refused before sending."""
    sid = session.session_id
    with pytest.raises(SandboxOperationError) as e:
        client.fork_session(sid, 2)
    assert e.value.code == "fork_unsupported"
    with pytest.raises(SandboxOperationError) as e:
        client.fork_session(sid, 9)
    assert e.value.code == "invalid_count"
    with pytest.raises(ValueError):
        client.fork_session(sid, 0)
    with pytest.raises(SessionNotFoundError):
        client.fork_session("sbx-aaaaaaaaaaaaaaaaaaaa")


def test_fork_session_carries_the_kernel(sandgate_bin: str, scratch: Path) -> None:
    """fork_session on a linux gateway with --checkpoint: each fork's kernel
    has the source's variable (skipped without root or a criu 4.x)."""
    import os

    criu = _criu()
    if os.geteuid() != 0 or not criu:
        if os.environ.get("CI") == "true":
            pytest.fail("CI runs as root with .ci/build-criu's criu 4.x")
        pytest.skip("needs root and a criu 4.x (SANDGATE_CRIU)")
    gw = start_gateway(sandgate_bin, scratch, "--sandbox", "linux", "--checkpoint", "--criu", criu)
    try:
        with SessionsClient(api_url=gw.url, bearer_token=gw.token) as c:
            s = c.create_session(ttl=300)
            assert c.run_python(s.session_id, "kept = 6 * 7").error is None
            forks = c.fork_session(s.session_id, 2)
            assert len(forks) == 2 and all(f.session_id != s.session_id for f in forks)
            for f in forks:
                assert c.run_python(f.session_id, "kept").result == "42"

            async def main() -> None:
                async with AsyncSessionsClient(api_url=gw.url, bearer_token=gw.token) as ac:
                    (f,) = await ac.fork_session(s.session_id)
                    assert (await ac.run_python(f.session_id, "kept")).result == "42"

            asyncio.run(main())
    finally:
        gw.stop()


def _criu() -> str:
    """A criu 4.x for serve --checkpoint ($SANDGATE_CRIU, else .ci/build-criu's)."""
    import os
    import subprocess

    for c in (os.environ.get("SANDGATE_CRIU"), os.path.expanduser("~/.cache/sandgate/criu-4.2/criu")):
        if not c or not os.access(c, os.X_OK):
            continue
        res = subprocess.run([c, "--version"], capture_output=True, text=True, timeout=30)
        if res.returncode == 0 and "Version: 4." in res.stdout:
            return c
    return ""


def test_pause_checkpoint(sandgate_bin: str, scratch: Path) -> None:
    """Under serve --checkpoint, pause_session checkpoints the session to
    disk (method "checkpoint", its memory freed); the next call restores it
    with the kernel's variable, a background server and the shell's cd and
    export."""
    from conftest import fail_or_skip

    criu = _criu()
    if not criu:
        fail_or_skip("no criu 4.x (SANDGATE_CRIU, or .ci/build-criu's ~/.cache/sandgate/criu-4.2/criu)")
        return
    gw = start_gateway(sandgate_bin, scratch, "--checkpoint", "--criu", criu)
    try:
        with SessionsClient(api_url=gw.url, bearer_token=gw.token) as c:
            s = c.create_session(ttl=300)
            sid = s.session_id
            if s.isolation == "none":
                fail_or_skip("pause by checkpoint needs the linux driver")
                return
            assert c.run_python(sid, "x = 4242\nblob = bytearray(32 << 20)").error is None
            c.run(sid, "nohup python3 -m http.server 8766 --bind 127.0.0.1 >/dev/null 2>&1 &")
            probe = "python3 -c 'import urllib.request as u; print(u.urlopen(\"http://127.0.0.1:8766/\").status)'"
            for _ in range(100):
                if c.run(sid, probe + " 2>/dev/null || true").stdout == "200\n":
                    break
            assert c.run(sid, "mkdir -p /tmp/deep && cd /tmp/deep && export SDK_VAR=kept", shell="main").exit_code == 0
            p = c.pause_session(sid)
            assert p.status == "paused" and p.raw["pause"]["method"] == "checkpoint", p.raw["pause"]
            assert p.raw["pause"]["residentBytes"] < 8 << 20  # of a 32 MiB kernel
            assert c.run_python(sid, "x").result == "4242"  # the call restored it
            assert c.run(sid, probe).stdout == "200\n"
            assert c.run(sid, "pwd; echo $SDK_VAR", shell="main").stdout == "/tmp/deep\nkept\n"
            c.delete_session(sid)
    finally:
        gw.stop()
