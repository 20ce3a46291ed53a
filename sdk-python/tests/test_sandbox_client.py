"""sandbox_sessions_sdk.sandbox_client: seed 002's SandboxClient on a real gateway.

The calls are the interface's own examples (its module docstring and
docstrings): ``run_shell``, ``sb.exec("/usr/bin/git", [...])``,
``run_python``, ``create``/``get``/``list``/``remove``. The test gateway
serves its own root (image ``default``: the host's tools) and pulls no
images, so the seed's default image ``python:3.11-slim`` is translated to
``default`` (``images=``); a test checks that an image the gateway lacks is
refused, not silently replaced.
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import shutil
import uuid
from pathlib import Path
from typing import Any, Awaitable, Iterator, TypeVar

import pytest
import requests
from conftest import Gateway, start_gateway

from sandbox_sessions_sdk import SandboxOperationError, SessionNotFoundError, SessionsClient
from sandbox_sessions_sdk.sandbox_client import (
    ExecResult,
    SandboxClient,
    SandboxHandle,
    SandboxSpec,
    SandgateSandboxClient,
    SandgateSandboxHandle,
)

T = TypeVar("T")

SEED_IMAGE = "python:3.11-slim"


def run(coro: Awaitable[T]) -> T:
    return asyncio.run(coro)  # type: ignore[arg-type]


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def sandbox(gateway: Gateway) -> Iterator[SandgateSandboxClient]:
    with SandgateSandboxClient(
        api_url=gateway.url, bearer_token=gateway.token, ttl=600, images={SEED_IMAGE: "default"}
    ) as c:
        yield c


def live_names(client: SessionsClient) -> set:
    page = client.list_sessions(limit=100)
    return {s.raw.get("name") for s in page["sessions"]} - {None}


# -- the dataclasses, exactly as the seed has them --------------------------------


def test_exec_result_seed_semantics() -> None:
    r = ExecResult(stdout="out\n")
    assert (r.stderr, r.exit_code, r.truncated) == ("", 0, False)
    assert r.ok and r.output == "out\n"
    r = ExecResult(stdout="a", stderr="b", exit_code=3, truncated=True)
    assert r.output == "ab" and not r.ok and r.truncated
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.stdout = "x"  # type: ignore[misc]


def test_sandbox_spec_seed_defaults() -> None:
    s = SandboxSpec(name="n")
    assert (s.image, s.memory_mib, s.cpus, s.workspace, s.secrets, s.egress, s.labels) == (
        "python:3.11-slim",
        512,
        1,
        None,
        (),
        (),
        {},
    )
    assert SandboxSpec(name="a").labels is not SandboxSpec(name="b").labels


def test_implementation_is_the_interface() -> None:
    assert issubclass(SandgateSandboxClient, SandboxClient)
    assert issubclass(SandgateSandboxHandle, SandboxHandle)
    with pytest.raises(TypeError):
        SandboxClient()  # type: ignore[abstract]


def test_workspace_mounts_a_named_workspace(gateway: Gateway, sandbox: SandgateSandboxClient) -> None:
    """``SandboxSpec.workspace``: the runtime mounts that workspace as the
    sandbox's ``/workspace`` (made when missing); its files outlive the sandbox."""
    ws = unique("ws")
    first = run(sandbox.create(SandboxSpec(name=unique("wsa"), workspace=ws)))
    assert run(first.shell("echo kept > notes.txt && pwd")).ok
    with SessionsClient(api_url=gateway.url, bearer_token=gateway.token) as c:
        try:
            assert ws in [w.name for w in c.list_workspaces()]
            # One live sandbox holds it at a time.
            with pytest.raises(SandboxOperationError) as busy:
                run(sandbox.create(SandboxSpec(name=unique("wsb"), workspace=ws)))
            assert busy.value.code == "workspace_busy"
            run(sandbox.remove(first.name))
            second = run(sandbox.create(SandboxSpec(name=unique("wsc"), workspace=ws)))
            try:
                assert run(second.shell("cat notes.txt")).stdout == "kept\n"
            finally:
                run(sandbox.remove(second.name))
        finally:
            for s in (first,):
                try:
                    c.delete_session(s.session_id)
                except SessionNotFoundError:
                    pass
            c.delete_workspace(ws)
    # A name the gateway cannot hold is refused before anything is sent.
    with pytest.raises(ValueError, match="workspace name"):
        run(sandbox.create(SandboxSpec(name=unique("wsd"), workspace="bucket/proj")))


# -- the seed's examples, on the real gateway -------------------------------------


def test_run_shell_seed_example(gateway: Gateway, sandbox: SandgateSandboxClient) -> None:
    """``await ctx.sandbox.run_shell("git clone … && cargo build")``, with a
    pipeline the test host can run; the throwaway sandbox is gone afterwards."""
    with SessionsClient(api_url=gateway.url, bearer_token=gateway.token) as c:
        before = live_names(c)
        res = run(sandbox.run_shell("echo hello | tr a-z A-Z && echo oops >&2 && exit 3"))
        assert isinstance(res, ExecResult)
        assert res.stdout == "HELLO\n" and res.stderr == "oops\n" and res.exit_code == 3
        assert res.output == "HELLO\noops\n" and not res.ok and not res.truncated
        assert run(sandbox.run_shell("true")).ok
        assert live_names(c) == before


def test_run_python_seed_example(gateway: Gateway, sandbox: SandgateSandboxClient) -> None:
    if shutil.which("python3") is None:
        pytest.skip("no python3 on the test host (the default root's sandboxes use the host's)")
    with SessionsClient(api_url=gateway.url, bearer_token=gateway.token) as c:
        before = live_names(c)
        res = run(sandbox.run_python("import sys; print(6 * 7); sys.exit(2)"))
        assert res.stdout == "42\n" and res.exit_code == 2 and not res.ok
        res = run(sandbox.run_python("print('ok')", labels={"job": "seed"}))
        assert res.ok and res.output == "ok\n"
        assert live_names(c) == before


def test_create_exec_shell_logs_remove(gateway: Gateway, sandbox: SandgateSandboxClient) -> None:
    name = unique("sb")
    spec = SandboxSpec(name=name, memory_mib=1024, cpus=2, labels={"team": "agents"})

    async def scenario() -> None:
        sb = await sandbox.create(spec)
        assert sb.name == name
        # ``await sb.exec("/usr/bin/git", ["clone", url])``: argv, no shell parsing.
        r = await sb.exec("echo", ["a b", "$HOME", "*"])
        assert r.stdout == "a b $HOME *\n" and r.ok
        r = await sb.exec("sh", ["-c", "exit 5"])
        assert r.exit_code == 5 and not r.ok
        r = await sb.exec("true")
        assert r.ok and r.stdout == ""
        r = await sb.shell("cd / && pwd; echo err >&2")
        assert (r.stdout, r.stderr) == ("/\n", "err\n")
        r = await sb.shell("sleep 10", timeout=0.5)
        assert r.exit_code == 124 and not r.ok

        logs = await sb.logs()
        assert "== commands" in logs and "sleep 10" in logs
        assert (await sb.logs(tail=1)).count("sleep 10") == 1
        assert "exit 5" not in await sb.logs(tail=1)

        assert name in await sandbox.list()
        again = await sandbox.get(name)
        assert again.name == name and again.session_id == sb.session_id
        assert (await again.exec("echo", ["same"])).stdout == "same\n"

        await sandbox.remove(name)
        assert name not in await sandbox.list()
        with pytest.raises(SessionNotFoundError):
            await sandbox.get(name)
        with pytest.raises(SessionNotFoundError):
            await sandbox.remove(name)

    run(scenario())
    with SessionsClient(api_url=gateway.url, bearer_token=gateway.token) as c:
        assert name not in live_names(c)


def test_spec_reaches_the_gateway(gateway: Gateway, sandbox: SandgateSandboxClient) -> None:
    name = unique("spec")
    spec = SandboxSpec(name=name, memory_mib=768, cpus=2, labels={"billing": "b-1"})
    sb = run(sandbox.create(spec))
    assert isinstance(sb, SandgateSandboxHandle)
    try:
        with SessionsClient(api_url=gateway.url, bearer_token=gateway.token) as c:
            s = c.get_session(sb.session_id)
            assert s.raw.get("name") == name
            assert s.metadata == {"billing": "b-1"}
            assert s.resources is not None
            assert s.resources["memoryMiB"] == 768 and s.resources["cpus"] == 2
            assert s.egress_allow == []
    finally:
        run(sb.kill())
    run(sb.kill())  # already gone: nothing to do
    with pytest.raises(SessionNotFoundError):
        run(sandbox.get(name))


def test_name_is_unique_while_live(sandbox: SandgateSandboxClient) -> None:
    name = unique("dup")
    sb = run(sandbox.create(SandboxSpec(name=name)))
    try:
        with pytest.raises(SandboxOperationError) as e:
            run(sandbox.create(SandboxSpec(name=name)))
        assert e.value.code == "name_taken"
    finally:
        run(sb.kill())
    sb = run(sandbox.create(SandboxSpec(name=name)))  # a deleted session frees its name
    run(sb.kill())


def gateway_has_stop(gateway: Gateway) -> bool:
    """Whether the gateway serves POST /v1/sessions/{id}/stop (an unknown
    session then answers a plain 404, not ``unknown_endpoint``)."""
    resp = requests.post(
        gateway.url + "/v1/sessions/sbx-nosuchsession/stop",
        headers={"Authorization": f"Bearer {gateway.token}"},
        timeout=10,
    )
    assert resp.status_code == 404, resp.text
    return resp.json()["error"]["code"] != "unknown_endpoint"


def test_stop(gateway: Gateway, sandbox: SandgateSandboxClient) -> None:
    """stop() keeps the files on a gateway that can stop; on one without the
    endpoint it says so (NotImplementedError), never a silent success."""
    sb = run(sandbox.create(SandboxSpec(name=unique("stop"))))
    assert isinstance(sb, SandgateSandboxHandle)
    try:
        run(sb.shell("echo kept > f"))
        if not gateway_has_stop(gateway):
            with pytest.raises(NotImplementedError, match="lacks stop"):
                run(sb.stop())
            return
        run(sb.stop())
        with SessionsClient(api_url=gateway.url, bearer_token=gateway.token) as c:
            assert c.get_session(sb.session_id).status == "stopped"
        run(sb.stop())  # stopping a stopped sandbox changes nothing
        assert run(sb.shell("cat f")).stdout == "kept\n"  # the next command starts it again
    finally:
        run(sb.kill())


def test_concurrent_execs(sandbox: SandgateSandboxClient) -> None:
    """The async methods do not serialise: two 1 s sleeps take about 1 s."""
    sb = run(sandbox.create(SandboxSpec(name=unique("conc"))))

    async def both() -> Any:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        rs = await asyncio.gather(sb.shell("sleep 1; echo a"), sb.shell("sleep 1; echo b"))
        return rs, loop.time() - t0

    try:
        rs, took = run(both())
        assert [r.stdout for r in rs] == ["a\n", "b\n"]
        assert took < 1.9
    finally:
        run(sb.kill())


def test_unknown_image_is_refused(gateway: Gateway) -> None:
    """Without a translation the seed's default image reaches the gateway,
    which has no such image: an error, not the default root."""
    with SandgateSandboxClient(api_url=gateway.url, bearer_token=gateway.token, ttl=600) as plain:
        with pytest.raises(SandboxOperationError) as e:
            run(plain.run_shell("echo hi"))
        assert e.value.code in ("unknown_image", "images_unsupported")


def test_bad_spec_values_are_refused_locally(sandbox: SandgateSandboxClient) -> None:
    with pytest.raises(ValueError):
        run(sandbox.create(SandboxSpec(name="")))
    with pytest.raises(ValueError):
        run(sandbox.create(SandboxSpec(name=unique("m"), memory_mib=0)))
    with pytest.raises(TypeError):
        run(sandbox.create(SandboxSpec(name=unique("e"), egress="pypi.org")))  # type: ignore[arg-type]


def test_given_sessions_client_is_not_closed(gateway: Gateway) -> None:
    with SessionsClient(api_url=gateway.url, bearer_token=gateway.token) as c:
        with SandgateSandboxClient(c, images={SEED_IMAGE: "default"}) as sbc:
            assert run(sbc.run_shell("echo x")).stdout == "x\n"
        assert c.list_sessions(limit=1)["limit"] == 1
        with pytest.raises(ValueError):
            SandgateSandboxClient(c, api_url=gateway.url)


def test_secrets_and_egress_reach_the_session(sandgate_bin: str, scratch: Path) -> None:
    """SandboxSpec.secrets (names) and .egress (hostnames) become the session's."""
    value = "v-" + secrets.token_hex(8)
    gw = start_gateway(sandgate_bin, scratch, secrets_file={"PYPI_TOKEN": value}, egress_allow=["pypi.org"])
    try:
        with SandgateSandboxClient(
            api_url=gw.url, bearer_token=gw.token, ttl=600, images={SEED_IMAGE: "default"}
        ) as sbc:
            sb = run(sbc.create(SandboxSpec(name=unique("sec"), secrets=("PYPI_TOKEN",), egress=("pypi.org",))))
            assert isinstance(sb, SandgateSandboxHandle)
            try:
                assert run(sb.shell('printf %s "$PYPI_TOKEN"')).stdout == value
                s = sbc.sessions.get_session(sb.session_id)
                assert s.egress_allow == ["pypi.org"] and s.secret_names == ["PYPI_TOKEN"]
            finally:
                run(sb.kill())
    finally:
        gw.stop()


def test_an_older_sdk_creates_a_missing_workspace_too(gateway: Gateway) -> None:
    """With a SessionsClient whose create_session has no ``name`` (an older
    SDK), the request is sent here; a spec's workspace that does not exist
    yet is still made first, as on the newer path."""

    class OlderSessionsClient(SessionsClient):
        def create_session(self, ttl=3600, image=None, metadata=None, ssh_public_key=None,  # type: ignore[override]
                           idempotency_key=None, resources=None, labels=None, egress=None, secrets=None,
                           workspace=None):
            return super().create_session(ttl=ttl, image=image, metadata=metadata, ssh_public_key=ssh_public_key,
                                          idempotency_key=idempotency_key, resources=resources, labels=labels,
                                          egress=egress, secrets=secrets, workspace=workspace)

    ws = unique("wsold")
    with OlderSessionsClient(api_url=gateway.url, bearer_token=gateway.token) as c:
        sandbox = SandgateSandboxClient(c, ttl=600, images={SEED_IMAGE: "default"})
        name = unique("old")
        handle = run(sandbox.create(SandboxSpec(name=name, workspace=ws)))
        try:
            assert c.get_session(handle.session_id).raw.get("name") == name
            assert c.get_session(handle.session_id).workspace == ws
        finally:
            run(sandbox.remove(name))
            c.delete_workspace(ws)
