"""sandgate as the OpenAI Agents SDK's sandbox backend, with the real SDK.

A ``SandboxAgent`` driven by a scripted ``Model`` (no API key, no network)
uses the SDK's own shell (``exec_command``), file (``view_image``) and patch
(``apply_patch``) tools on a real sandgate session through
``SandgateSandboxClient``; the test then checks through the REST API that the
files are in the session's workspace. Pausing and resuming goes through the
SDK's own snapshot lifecycle (``RunState`` of an interrupted run, the
session's ``stop``/``resume`` with a snapshot), which on sandgate is a
sandgate snapshot and a session created ``fromSnapshot``.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import io
import json
import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, List

import pytest
from agents import ModelResponse, Runner, Usage, set_tracing_disabled
from agents.models.interface import Model
from agents.run import RunConfig
from agents.sandbox import LocalSnapshotSpec, Manifest, SandboxAgent, SandboxRunConfig
from agents.sandbox.errors import ExecTimeoutError, WorkspaceReadNotFoundError
from openai.types.responses import (
    ResponseCustomToolCall,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from conftest import sdk_fixtures
from sandbox_sessions_sdk import AsyncSessionsClient, SessionNotFoundError, SessionsClient
from sandbox_sessions_sdk.openai_agents import (
    SandgateSandboxClient,
    SandgateSandboxClientOptions,
    SandgateSandboxSession,
    SandgateSandboxSessionState,
)

set_tracing_disabled(True)

# A 1x1 PNG, for the view_image tool.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


def in_loop(fn):
    """Run an async test in a fresh event loop (asyncio.run), keeping its fixtures."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return asyncio.run(fn(*args, **kwargs))

    return wrapper


def call(call_id: str, name: str, **args: Any) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        id=f"fc_{call_id}", call_id=call_id, type="function_call", name=name, arguments=json.dumps(args)
    )


def patch(call_id: str, text: str) -> ResponseCustomToolCall:
    return ResponseCustomToolCall(id=f"ct_{call_id}", call_id=call_id, type="custom_tool_call", name="apply_patch",
                                  input=text)


def message(text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id="msg_final", type="message", role="assistant", status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


class ScriptedModel(Model):
    """Each turn returns the next scripted output items; records what the runner sent."""

    def __init__(self, turns: List[List[Any]]) -> None:
        self.turns = list(turns)
        self.inputs: List[Any] = []
        self.tool_names: List[List[str]] = []

    async def get_response(self, system_instructions, input, model_settings, tools, output_schema, handoffs,
                           tracing, *, previous_response_id=None, conversation_id=None, prompt=None, **kwargs):
        self.inputs.append(input)
        self.tool_names.append([t.name for t in tools])
        turn = self.turns.pop(0)
        # A turn may depend on what the tools answered before (a process's session ID).
        return ModelResponse(output=turn(self) if callable(turn) else turn, usage=Usage(), response_id=None)

    def stream_response(self, *args, **kwargs):
        raise NotImplementedError

    def outputs(self) -> dict:
        """call_id -> the output the tools sent back to the model."""
        out = {}
        for inp in self.inputs:
            for item in inp if isinstance(inp, list) else []:
                if isinstance(item, dict) and item.get("type") in ("function_call_output", "custom_tool_call_output"):
                    out[item["call_id"]] = item["output"]
        return out


def _text(output: Any) -> str:
    return output if isinstance(output, str) else json.dumps(output)


@pytest.fixture(scope="module", params=["workdir", "linux"])
def gateway(request, gateway, sandgate_bin: str, scratch: Path) -> Any:
    """Each test on both sandbox drivers: the examples' workdir gateway (the
    workspace is the session's host directory), and a linux one (the
    workspace is /workspace in the sandbox's own root)."""
    if request.param == "workdir":
        yield gateway
        return
    try:
        gw = sdk_fixtures.start_gateway(sandgate_bin, scratch, "--sandbox", "linux", "--rate-limit", "100000")
    except RuntimeError as e:
        sdk_fixtures.fail_or_skip(f"no linux sandbox driver here: {e}")
    try:
        yield gw
    finally:
        gw.stop()


@pytest.fixture
def snapshots_dir() -> Any:
    with tempfile.TemporaryDirectory(prefix="sandgate-agents-snap-") as d:
        yield Path(d)


def join_over_ssh(command: str, gateway, sandgate_bin: str, remote: str) -> subprocess.CompletedProcess:
    """Run the session's ssh_command as a person would (sandgate on PATH, the
    token in SANDBOX_API_TOKEN), with a remote command instead of a shell."""
    if shutil.which("ssh") is None:
        sdk_fixtures.fail_or_skip("no OpenSSH ssh client here")
    env = dict(os.environ, SANDBOX_API_TOKEN=gateway.token,
               PATH=os.path.dirname(sandgate_bin) + os.pathsep + os.environ.get("PATH", ""))
    return subprocess.run([*shlex.split(command), "--", remote], env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=120)


def sandgate_client(gateway) -> SandgateSandboxClient:
    return SandgateSandboxClient(api_url=gateway.url, bearer_token=gateway.token)


@in_loop
async def test_sandbox_agent_uses_shell_file_and_patch_tools(gateway, client: SessionsClient, snapshots_dir) -> None:
    model = ScriptedModel([
        [call("c1", "exec_command", cmd="mkdir -p proj && printf 'print(6*7)\\n' > proj/answer.py && python3 proj/answer.py && pwd")],
        [patch("p1", "*** Begin Patch\n*** Add File: proj/notes.md\n+# Notes\n+first line\n*** End Patch\n")],
        [patch("p2", "*** Begin Patch\n*** Update File: proj/notes.md\n@@\n # Notes\n-first line\n+patched line\n*** End Patch\n")],
        [call("c2", "exec_command", cmd="cat proj/notes.md && printf '%s' '" + base64.b64encode(PNG).decode() + "' | base64 -d > dot.png")],
        [call("c3", "view_image", path="dot.png")],
        [message("done")],
    ])
    agent = SandboxAgent(name="coder", instructions="Use the tools.", model=model)
    sandbox = sandgate_client(gateway)
    run_config = RunConfig(sandbox=SandboxRunConfig(
        client=sandbox,
        options=SandgateSandboxClientOptions(labels={"test": "agents-backend"}, pause_on_exit=True),
        snapshot=LocalSnapshotSpec(base_path=snapshots_dir),
    ))
    result = await Runner.run(agent, "Make the project", run_config=run_config)
    assert result.final_output == "done"
    assert {"exec_command", "apply_patch", "view_image"} <= set(model.tool_names[0])
    out = model.outputs()
    assert "42" in _text(out["c1"]), out["c1"]
    assert "patched line" in _text(out["c2"]), out["c2"]
    assert "image" in _text(out["c3"]), out["c3"]

    # pause_on_exit: the session was stopped, not deleted; its files are in the workspace.
    sessions = client.list_sessions(limit=100)["sessions"]
    mine = [s for s in sessions if s.metadata.get("test") == "agents-backend"]
    assert len(mine) == 1, mine
    sid = mine[0].session_id
    try:
        assert client.get_session(sid).status == "stopped"
        assert client.read_file(sid, "proj/notes.md").rstrip(b"\n") == b"# Notes\npatched line"
        assert client.read_file(sid, "proj/answer.py") == b"print(6*7)\n"
        assert client.read_file(sid, "dot.png") == PNG
    finally:
        client.delete_session(sid)
    await sandbox.close()


@in_loop
async def test_interrupted_run_resumes_its_sandbox_from_a_snapshot(gateway, client: SessionsClient,
                                                                  snapshots_dir) -> None:
    """The SDK's own pause and resume: a run stops for a tool approval; its
    RunState (serialized, as an application would store it) carries the
    sandbox's state; the sandbox is gone meanwhile; resuming the run restores
    the workspace from the sandgate snapshot into a new session."""
    from agents import RunState
    from agents.sandbox.capabilities import Filesystem, Shell

    def approval_for_patches(toolset) -> None:
        toolset.apply_patch.needs_approval = True

    model = ScriptedModel([
        [call("c1", "exec_command", cmd="echo before > first.txt")],
        [patch("p1", "*** Begin Patch\n*** Add File: second.txt\n+after approval\n*** End Patch\n")],
        [call("c2", "exec_command", cmd="cat first.txt second.txt")],
        [message("done")],
    ])
    agent = SandboxAgent(name="coder", instructions="Use the tools.", model=model,
                         capabilities=[Filesystem(configure_tools=approval_for_patches), Shell()])
    sandbox = sandgate_client(gateway)
    run_config = RunConfig(sandbox=SandboxRunConfig(
        client=sandbox, options=SandgateSandboxClientOptions(labels={"test": "agents-resume"}),
        snapshot=LocalSnapshotSpec(base_path=snapshots_dir),
    ))
    before = {snap.snapshot_id for snap in client.list_snapshots()}
    first = await Runner.run(agent, "Two files", run_config=run_config)
    assert len(first.interruptions) == 1
    made = {snap.snapshot_id for snap in client.list_snapshots()} - before
    assert len(made) == 1, "pausing the run made no sandgate snapshot"
    stored = first.to_state().to_string()
    payload = json.loads(stored)
    assert "sandgate" in json.dumps(payload.get("sandbox", payload)) and gateway.token not in stored
    # The run's sandbox was cleaned up when it paused: nothing of it is live.
    live = [s for s in client.list_sessions(limit=100)["sessions"] if s.metadata.get("test") == "agents-resume"]
    assert live == []

    state = await RunState.from_string(agent, stored)
    state.approve(state.get_interruptions()[0])
    second = await Runner.run(agent, state, run_config=run_config)
    assert second.final_output == "done"
    out = _text(model.outputs()["c2"])
    # first.txt was only in the deleted session: it came back from the snapshot.
    assert "before" in out and "after approval" in out, out
    # The second run's own persist replaced that snapshot (and deleted it).
    after = {snap.snapshot_id for snap in client.list_snapshots()} - before
    assert len(after) == 1 and after != made
    for sid in after:
        client.delete_snapshot(sid)
    await sandbox.close()


def _process_id(output: Any) -> int:
    text = _text(output)
    assert "Process running with session ID " in text, text
    return int(text.split("Process running with session ID ", 1)[1].split()[0])


@in_loop
async def test_long_and_interactive_commands_are_sandgate_processes(gateway, client: SessionsClient,
                                                                   snapshots_dir) -> None:
    """A command that outlives the tool's yield time goes on (a sandgate
    background process); the model polls it and writes to its stdin with the
    SDK's write_stdin tool."""
    model = ScriptedModel([
        # Whether the sandbox has a script(1) that gives tty=True its terminal.
        [call("c0", "exec_command",
              cmd="if script -qefc true /dev/null >/dev/null 2>&1; then echo has-script; else echo no-script; fi")],
        [call("c1", "exec_command", cmd="sleep 2; echo late; exit 5", yield_time_ms=300)],
        lambda m: [call("c2", "write_stdin", session_id=_process_id(m.outputs()["c1"]), chars="",
                        yield_time_ms=20000)],
        [call("c3", "exec_command", cmd="read name; echo hello $name", yield_time_ms=300)],
        lambda m: [call("c4", "write_stdin", session_id=_process_id(m.outputs()["c3"]), chars="sandgate\n",
                        yield_time_ms=5000)],
        # tty: a terminal (script(1)), so python3 runs its interactive prompt.
        [call("c5", "exec_command", cmd="python3 -q", tty=True, yield_time_ms=1000)],
        lambda m: [call("c6", "write_stdin", session_id=_process_id(m.outputs()["c5"]),
                        chars="import sys; print(sys.stdin.isatty(), 6 * 7)\n", yield_time_ms=2000)],
        lambda m: [call("c7", "write_stdin", session_id=_process_id(m.outputs()["c5"]), chars="exit()\n",
                        yield_time_ms=5000)],
        [message("done")],
    ])
    agent = SandboxAgent(name="coder", instructions="Use the tools.", model=model)
    sandbox = sandgate_client(gateway)
    result = await Runner.run(agent, "Wait for things", run_config=RunConfig(sandbox=SandboxRunConfig(
        client=sandbox, options=SandgateSandboxClientOptions(labels={"test": "agents-pty"}),
        snapshot=LocalSnapshotSpec(base_path=snapshots_dir))))
    assert result.final_output == "done"
    assert "write_stdin" in model.tool_names[0]
    out = model.outputs()
    assert "Process exited" not in _text(out["c1"]) and "late" not in _text(out["c1"])
    assert "late" in _text(out["c2"]) and "Process exited with code 5" in _text(out["c2"]), out["c2"]
    assert "hello sandgate" in _text(out["c4"]) and "Process exited with code 0" in _text(out["c4"]), out["c4"]
    assert "has-script" in _text(out["c0"]) or "no-script" in _text(out["c0"]), out["c0"]
    if "has-script" in _text(out["c0"]):
        assert "True 42" in _text(out["c6"]), out["c6"]
    else:  # plain pipes: python3 still reads its statements from stdin
        assert "False 42" in _text(out["c6"]), out["c6"]
    assert "Process exited with code 0" in _text(out["c7"]), out["c7"]
    # The run's session is deleted at its end (no pause_on_exit).
    assert not [s for s in client.list_sessions(limit=100)["sessions"] if s.metadata.get("test") == "agents-pty"]
    await sandbox.close()


@in_loop
async def test_session_lifecycle_snapshot_resume_and_sandgate_extras(gateway, client: SessionsClient,
                                                                     snapshots_dir, sandgate_bin: str) -> None:
    sandbox = sandgate_client(gateway)
    options = SandgateSandboxClientOptions(exposed_ports=(8000,), labels={"test": "agents-lifecycle"})
    session = await sandbox.create(
        manifest=Manifest(), options=options, snapshot=LocalSnapshotSpec(base_path=snapshots_dir)
    )
    inner = session._inner
    assert isinstance(inner, SandgateSandboxSession)
    first = inner.sandgate_session_id
    await session.start()
    try:
        await session.write(Path("src/app.txt"), io.BytesIO(b"v1\n"))
        assert (await session.read(Path("src/app.txt"))).read() == b"v1\n"
        assert client.read_file(first, "src/app.txt") == b"v1\n"
        res = await session.exec("cat src/app.txt && echo err >&2 && exit 3")
        assert (res.stdout, res.stderr, res.exit_code) == (b"v1\n", b"err\n", 3)
        with pytest.raises(WorkspaceReadNotFoundError):
            await session.read(Path("nope.txt"))
        with pytest.raises(ExecTimeoutError):
            await session.exec("sleep 30", timeout=1)
        entries = await session.ls("src")
        assert [e.path.rsplit("/", 1)[-1] for e in entries if not e.path.endswith((".", ".."))] == ["app.txt"]

        # sandgate's own: SSH for a person, preview links for ports.
        assert inner.ssh_command == f"sandgate ssh --api-url {gateway.url} {first}"
        assert inner.ssh_argv("kh")[-1] == f"sandbox@{first}"
        joined = join_over_ssh(inner.ssh_command, gateway, sandgate_bin, "cat src/app.txt")
        assert joined.returncode == 0 and joined.stdout == "v1\n", joined.stderr
        endpoint = await session.resolve_exposed_port(8000)
        assert endpoint.host.startswith("p8000-") and endpoint.host.endswith(".localhost")

        # stop: the SDK persists the workspace, here as a sandgate snapshot.
        await session.stop()
        state = inner.state
        payload = sandbox.serialize_session_state(state)
        assert payload["type"] == "sandgate" and gateway.token not in json.dumps(payload)
        assert not [k for k in payload if "token" in k.lower()], payload
        made = client.list_snapshots(session=first)
        assert len(made) == 1, "stop() made no sandgate snapshot"
        assert state.sandgate_snapshot_id == made[0].snapshot_id

        # The workspace changes after the snapshot; then the sandbox goes away.
        client.write_file(first, "src/app.txt", "v2-lost\n")
        client.delete_session(first)
    finally:
        try:
            client.delete_session(first)
        except SessionNotFoundError:
            pass

    # resume from the persisted state: the session is gone, so a new one is
    # created and the SDK restores the snapshot into it (fromSnapshot).
    restored_state = sandbox.deserialize_session_state(payload)
    assert isinstance(restored_state, SandgateSandboxSessionState)
    resumed = await sandbox.resume(restored_state)
    second = third = resumed._inner.sandgate_session_id
    # It is created from the sandgate snapshot at once, and start() keeps it
    # (no empty session replaced by the restore).
    assert client.get_session(second).from_snapshot == made[0].snapshot_id
    await resumed.start()
    try:
        assert resumed._inner.sandgate_session_id == second
        assert second != first
        assert (await resumed.read(Path("src/app.txt"))).read() == b"v1\n"
        assert client.read_file(second, "src/app.txt") == b"v1\n"
        res = await resumed.exec("cat src/app.txt")
        assert res.stdout == b"v1\n"
        # Persisting again makes a new snapshot and deletes the one it replaces.
        await resumed.write(Path("src/app.txt"), io.BytesIO(b"v3\n"))
        await resumed.stop()
        again = resumed.state.sandgate_snapshot_id
        assert again and again != made[0].snapshot_id
        ids = [s.snapshot_id for s in client.list_snapshots()]
        assert again in ids and made[0].snapshot_id not in ids
        # Hydrating a live session from a snapshot reference puts a session
        # created fromSnapshot in its place (the old one is deleted).
        await resumed.write(Path("src/app.txt"), io.BytesIO(b"v4\n"))
        ref = (await resumed._inner.persist_workspace()).read()
        await resumed.write(Path("src/app.txt"), io.BytesIO(b"v5\n"))
        await resumed._inner.hydrate_workspace(io.BytesIO(ref))
        third = resumed._inner.sandgate_session_id
        assert third != second and client.read_file(third, "src/app.txt") == b"v4\n"
        with pytest.raises(SessionNotFoundError):
            client.get_session(second)
        assert (await resumed.exec("cat src/app.txt")).stdout == b"v4\n"
    finally:
        await sandbox.delete(resumed)
    # delete: the session is gone (no pause_on_exit), and so is any replaced one.
    for sid in {second, third, resumed._inner.sandgate_session_id}:
        with pytest.raises(SessionNotFoundError):
            client.get_session(sid)
    await sandbox.close()


@pytest.mark.parametrize("with_snapshot", [False, True])
@in_loop
async def test_resume_reattaches_to_a_live_session(gateway, client: SessionsClient, snapshots_dir,
                                                   with_snapshot: bool) -> None:
    """A paused (stopped) session is reattached on resume, not replaced: with
    a snapshot too, since the live workspace still matches it."""
    sandbox = sandgate_client(gateway)
    snapshot = LocalSnapshotSpec(base_path=snapshots_dir) if with_snapshot else None
    session = await sandbox.create(options=SandgateSandboxClientOptions(pause_on_exit=True), snapshot=snapshot)
    await session.start()
    sid = session._inner.sandgate_session_id
    try:
        await session.write(Path("keep.txt"), io.BytesIO(b"kept"))
        await session.aclose()  # persists (a sandgate snapshot, or nothing), then stops: files kept
        assert client.get_session(sid).status == "stopped"
        state = sandbox.deserialize_session_state(sandbox.serialize_session_state(session.state))
        again = await sandbox.resume(state)
        await again.start()
        assert again._inner.sandgate_session_id == sid
        assert (await again.read(Path("keep.txt"))).read() == b"kept"
    finally:
        try:
            client.delete_session(sid)
        except SessionNotFoundError:
            pass
    await sandbox.close()


@in_loop
async def test_tar_persistence_and_named_workspace(gateway, client: SessionsClient, snapshots_dir) -> None:
    sandbox = sandgate_client(gateway)
    name = "agents-ws-" + os.urandom(4).hex()
    options = SandgateSandboxClientOptions(workspace=name)
    session = await sandbox.create(options=options, snapshot=LocalSnapshotSpec(base_path=snapshots_dir))
    await session.start()
    sid = session._inner.sandgate_session_id
    try:
        await session.write(Path("a/b.txt"), io.BytesIO(b"in the workspace"))
        # A named workspace cannot be combined with fromSnapshot: persistence is a tar.
        archive = await session._inner.persist_workspace()
        raw = archive.read()
        assert not raw.startswith(b"SANDGATE-SNAPSHOT-REF")
        # The workspace changes after the persist: the hydrate puts the persisted file back.
        await session.write(Path("a/b.txt"), io.BytesIO(b"changed after the persist"))
        assert client.read_file(sid, "a/b.txt") == b"changed after the persist"
        await session._inner.hydrate_workspace(io.BytesIO(raw))
        assert client.read_file(sid, "a/b.txt") == b"in the workspace"
        listing = client.list_files(sid, ".")
        assert not [e for e in listing if e["name"].startswith(".sandgate-")], listing
    finally:
        await sandbox.delete(session)
    # The workspace outlives the session, with its files.
    assert name in [w.name for w in client.list_workspaces()]
    s2 = client.create_session(ttl=600, workspace=name)
    try:
        assert client.read_file(s2.session_id, "a/b.txt") == b"in the workspace"
    finally:
        client.delete_session(s2.session_id)
        client.delete_workspace(name)
    await sandbox.close()


@in_loop
async def test_manifest_env_and_sandgate_policy_options(gateway, client: SessionsClient) -> None:
    """The manifest's files and environment, and sandgate's own options
    (egress, resources, name, labels, env) reach the session; a refusal of
    the gateway is the SDK's error with the sandgate error as its cause."""
    from agents.sandbox.entries import File
    from agents.sandbox.errors import WorkspaceStartError

    from sandbox_sessions_sdk import UnknownSecretError
    from sandbox_sessions_sdk.openai_agents import SandgateResources

    sandbox = sandgate_client(gateway)
    name = "agents-" + os.urandom(4).hex()
    options = SandgateSandboxClientOptions(
        name=name, egress=("example.com",), resources=SandgateResources(memory_mib=256, cpus=1),
        labels={"test": "agents-policy"}, env={"FROM_OPTIONS": "opt"},
    )
    manifest = Manifest(entries={"docs/README.md": File(content=b"# hi\n")}, environment={"value": {"FROM_MANIFEST": "man"}})
    session = await sandbox.create(manifest=manifest, options=options)
    await session.start()
    sid = sandbox.sandgate_session_id(session)
    try:
        info = client.get_session(sid)
        assert info.raw.get("name") == name and info.metadata == {"test": "agents-policy"}
        assert info.egress_allow and info.egress_allow[0].startswith("example.com")
        assert info.resources.get("memoryMiB") == 256
        assert client.read_file(sid, "docs/README.md") == b"# hi\n"
        res = await session.exec("echo $FROM_OPTIONS $FROM_MANIFEST")
        assert res.stdout == b"opt man\n"
        assert sandbox.ssh_command(session) == f"sandgate ssh --api-url {gateway.url} {sid}"
    finally:
        await sandbox.delete(session)
    with pytest.raises(SessionNotFoundError):
        client.get_session(sid)

    with pytest.raises(WorkspaceStartError) as refused:
        await sandbox.create(options=SandgateSandboxClientOptions(secrets=("NO_SUCH_SECRET",)))
    assert isinstance(refused.value.cause, UnknownSecretError)
    assert refused.value.context.get("code") == "unknown_secret"
    await sandbox.close()


@in_loop
async def test_a_manifest_root_below_the_workspace(gateway, client: SessionsClient) -> None:
    """Manifest(root="/workspace/proj"): the SDK works in proj/ of the
    session's workspace, on either driver."""
    sandbox = sandgate_client(gateway)
    session = await sandbox.create(manifest=Manifest(root="/workspace/proj"))
    await session.start()
    sid = sandbox.sandgate_session_id(session)
    try:
        assert session.state.manifest.root.endswith("/proj")
        await session.write(Path("a.txt"), io.BytesIO(b"in proj"))
        assert client.read_file(sid, "proj/a.txt") == b"in proj"
        res = await session.exec("pwd && cat a.txt")
        assert res.stdout.decode().endswith("/proj\nin proj") and res.exit_code == 0
    finally:
        await sandbox.delete(session)
        await sandbox.close()


def test_a_gateway_with_a_lower_command_timeout(sandgate_bin: str, scratch: Path) -> None:
    """exec_timeout_s (1 h) above the gateway's --max-command-timeout: the
    backend learns the gateway's maximum from its answer and uses it."""
    gw = sdk_fixtures.start_gateway(sandgate_bin, scratch, "--sandbox", "workdir", "--max-command-timeout", "30s")

    async def go() -> None:
        sandbox = sandgate_client(gw)
        session = await sandbox.create()
        try:
            await session.start()
            await session.write(Path("t.txt"), io.BytesIO(b"ok"))
            res = await session.exec("cat t.txt")
            assert (res.exit_code, res.stdout) == (0, b"ok")
            assert session._inner._max_timeout == 30
        finally:
            await sandbox.delete(session)
            await sandbox.close()

    try:
        asyncio.run(go())
    finally:
        gw.stop()


def test_options_and_client_need_no_arguments(monkeypatch, gateway) -> None:
    monkeypatch.setenv("SANDBOX_API_URL", gateway.url)
    monkeypatch.setenv("SANDBOX_API_TOKEN", gateway.token)
    opts = SandgateSandboxClientOptions()
    assert opts.image is None and opts.egress == () and opts.type == "sandgate"
    c = SandgateSandboxClient()
    assert c.sessions.api_url.startswith(gateway.url) and c.supports_default_options
    assert isinstance(c.sessions, AsyncSessionsClient)
    asyncio.run(c.close())


def test_an_agents_sdk_outside_the_pinned_range_is_warned_about(monkeypatch) -> None:
    import agents

    from sandbox_sessions_sdk import openai_agents

    assert agents.__version__.startswith("0.24.")  # the pin examples/requirements-test.txt installs
    monkeypatch.setattr(agents, "__version__", "0.25.0")
    with pytest.warns(RuntimeWarning, match=r"openai-agents >=0.24,<0.25; 0.25.0 is installed"):
        openai_agents._check_agents_version()


@in_loop
async def test_a_drifted_named_session_resumes_from_its_snapshot(gateway, client: SessionsClient,
                                                                snapshots_dir) -> None:
    """A paused (stopped) session whose workspace changed after its snapshot
    is replaced on resume by one created from the snapshot: with a name too
    (the old session gives the name up first), and nothing is cleared before
    the replacement exists."""
    sandbox = sandgate_client(gateway)
    name = "agents-drift-" + os.urandom(4).hex()
    options = SandgateSandboxClientOptions(name=name, pause_on_exit=True, labels={"test": "agents-drift"})
    session = await sandbox.create(options=options, snapshot=LocalSnapshotSpec(base_path=snapshots_dir))
    await session.start()
    sid = session._inner.sandgate_session_id
    resumed = None
    try:
        await session.write(Path("keep.txt"), io.BytesIO(b"snapshotted"))
        await session.aclose()  # persists a sandgate snapshot, then stops: files kept
        assert client.get_session(sid).status == "stopped"
        snap = session.state.sandgate_snapshot_id
        assert snap
        # The workspace drifts from the snapshot while the session is paused.
        client.write_file(sid, "keep.txt", "drifted\n")
        client.write_file(sid, "extra.txt", "drifted too\n")
        state = sandbox.deserialize_session_state(sandbox.serialize_session_state(session.state))
        resumed = await sandbox.resume(state)
        await resumed.start()
        new = resumed._inner.sandgate_session_id
        assert new != sid
        assert client.get_session(new).from_snapshot == snap
        assert (await resumed.read(Path("keep.txt"))).read() == b"snapshotted"
        assert (await resumed.exec("test -e extra.txt")).exit_code == 1
        assert client.get_session(new).raw.get("name") == name
        with pytest.raises(SessionNotFoundError):
            client.get_session(sid)
    finally:
        if resumed is not None:
            await sandbox.delete(resumed)
        for s in client.list_sessions(limit=100)["sessions"]:
            if s.metadata.get("test") == "agents-drift":
                client.delete_session(s.session_id)
        for s in client.list_snapshots():
            if s.snapshot_id == session.state.sandgate_snapshot_id:
                client.delete_snapshot(s.snapshot_id)
    await sandbox.close()


@in_loop
async def test_environment_values_stay_out_of_the_command_history(gateway, client: SessionsClient) -> None:
    """The options' and the manifest's environment reach commands and
    processes, but their values are not in any argv the gateway records
    (GET .../commands, GET .../processes)."""
    sandbox = sandgate_client(gateway)
    secret = "s3cret-" + os.urandom(8).hex()
    manifest_secret = "m4nifest-" + os.urandom(8).hex()
    options = SandgateSandboxClientOptions(env={"API_TOKEN": secret, "QUOTED": "a 'b' $c"})
    session = await sandbox.create(manifest=Manifest(environment={"value": {"MAN_TOKEN": manifest_secret}}),
                                   options=options)
    await session.start()
    sid = sandbox.sandgate_session_id(session)
    try:
        res = await session.exec('echo "$API_TOKEN $MAN_TOKEN $QUOTED"')
        assert res.stdout == f"{secret} {manifest_secret} a 'b' $c\n".encode(), res
        update = await session._inner.pty_exec_start('echo "p:$API_TOKEN"', yield_time_s=5)
        assert f"p:{secret}".encode() in update.output, update
        history = json.dumps(client.list_commands(sid)) + json.dumps(client.list_processes(sid))
        assert "echo" in history
        assert secret not in history and manifest_secret not in history
        # The file is outside the workspace, its owner's only; lost (a
        # restarted sandbox's /tmp), it is written again.
        (path,) = [p for _, p in session._inner._env_files.values()]
        assert not path.startswith(session.state.manifest.root)
        res = await session.exec(f"stat -c %a {path} && rm {path}")
        assert res.stdout == b"600\n", res
        assert (await session.exec('echo "$API_TOKEN"')).stdout == f"{secret}\n".encode()
    finally:
        await sandbox.delete(session)
        await sandbox.close()


@in_loop
async def test_an_interactive_exec_is_killed_at_its_timeout(gateway, client: SessionsClient) -> None:
    """pty_exec_start's timeout (else exec_timeout_s) ends the process."""
    sandbox = sandgate_client(gateway)
    session = await sandbox.create(options=SandgateSandboxClientOptions(exec_timeout_s=2))
    await session.start()
    inner = session._inner
    try:
        for timeout in (1, None):  # its own; exec_timeout_s
            update = await inner.pty_exec_start("echo started; sleep 60", timeout=timeout, yield_time_s=0.3)
            assert update.process_id is not None and update.exit_code is None, update
            update = await inner.pty_write_stdin(session_id=update.process_id, chars="", yield_time_s=20)
            assert update.process_id is None and update.exit_code is not None and update.exit_code != 0, update
    finally:
        await sandbox.delete(session)
        await sandbox.close()


@in_loop
async def test_a_dropped_output_stream_is_not_the_process_ending(gateway, client: SessionsClient) -> None:
    """An output stream that ends without its final line (a dropped
    connection) is followed again from where it stopped; the process's
    exit comes from the gateway's final line."""
    sandbox = sandgate_client(gateway)
    session = await sandbox.create()
    await session.start()
    inner = session._inner
    real = inner._sessions.process_output
    calls: List[int] = []

    class Cut:
        """The first stream ends after its first line, as a dropped connection would."""

        def __init__(self, stream) -> None:
            self.stream = stream

        async def __aenter__(self):
            await self.stream.__aenter__()
            return self

        async def __aexit__(self, *exc):
            return await self.stream.__aexit__(*exc)

        async def __aiter__(self):
            async for line in self.stream:
                yield line
                return

    async def cut_first(*args, **kwargs):
        calls.append(kwargs.get("offset", 0))
        stream = await real(*args, **kwargs)
        return Cut(stream) if len(calls) == 1 else stream

    inner._sessions.process_output = cut_first
    try:
        update = await inner.pty_exec_start("echo one; sleep 1; echo two; exit 3", yield_time_s=15)
        assert b"one" in update.output and b"two" in update.output, update
        assert update.output.count(b"one") == 1, update
        assert update.exit_code == 3 and update.process_id is None, update
        assert len(calls) >= 2 and calls[1] > 0, calls
    finally:
        del inner._sessions.process_output
        await sandbox.delete(session)
        await sandbox.close()


@in_loop
async def test_no_sandgate_snapshot_is_left_behind(gateway, client: SessionsClient, snapshots_dir) -> None:
    """A sandgate snapshot the SDK failed to record is deleted; persisting
    as a tar afterwards deletes the one recorded before (nothing refers to
    it any more)."""
    sandbox = sandgate_client(gateway)
    blocker = snapshots_dir / "not-a-directory"
    blocker.write_bytes(b"")
    session = await sandbox.create(snapshot=LocalSnapshotSpec(base_path=blocker / "sub"))
    await session.start()
    sid = session._inner.sandgate_session_id
    try:
        await session.write(Path("f.txt"), io.BytesIO(b"x"))
        with pytest.raises(Exception):
            await session.stop()  # the SDK cannot store the reference
        assert client.list_snapshots(session=sid) == []
        assert session.state.sandgate_snapshot_id is None
    finally:
        await sandbox.delete(session)

    session = await sandbox.create(snapshot=LocalSnapshotSpec(base_path=snapshots_dir))
    await session.start()
    sid = session._inner.sandgate_session_id
    try:
        await session.stop()
        first = session.state.sandgate_snapshot_id
        assert first and [s.snapshot_id for s in client.list_snapshots(session=sid)] == [first]
        session.state.workspace_persistence = "tar"
        await session.stop()
        assert session.state.sandgate_snapshot_id is None
        assert client.list_snapshots(session=sid) == []
    finally:
        await sandbox.delete(session)
        await sandbox.close()


@in_loop
async def test_a_bounded_read_reads_only_its_bound(gateway, client: SessionsClient) -> None:
    """read_bounded asks for its bound only: a file outside the workspace
    larger than what a whole read may bring back is still read."""
    from agents.sandbox.workspace_paths import SandboxPathGrant

    sandbox = sandgate_client(gateway)
    outside = f"/tmp/sandgate-bounded-{os.urandom(6).hex()}"
    big = f"{outside}/big"
    session = await sandbox.create(manifest=Manifest(extra_path_grants=(SandboxPathGrant(path=outside),)))
    await session.start()
    try:
        res = await session.exec(f"mkdir {outside} && head -c 12582912 /dev/zero | tr '\\0' x > {big}"
                                 " && printf ok > in.txt")
        assert res.exit_code == 0, res
        assert await session.read_bounded(Path(big), max_bytes=10) == b"x" * 10
        assert await session.read_bounded(Path("in.txt"), max_bytes=1) == b"o"
        with pytest.raises(WorkspaceReadNotFoundError):
            await session.read_bounded(Path(big + ".missing"), max_bytes=10)
    finally:
        await session.exec(f"rm -rf {outside}")
        await sandbox.delete(session)
        await sandbox.close()


def test_the_example_deletes_a_session_that_failed_to_start(gateway, client: SessionsClient) -> None:
    """examples/openai-sandbox-agent: a start() that fails (here: an
    environment variable name no shell takes) leaves no live session."""
    from conftest import EXAMPLES, load

    example = load(EXAMPLES / "openai-sandbox-agent" / "main.py", "openai_sandbox_agent_main")
    label = "agents-example-" + os.urandom(4).hex()
    options = SandgateSandboxClientOptions(env={"NOT A NAME": "x"}, labels={"test": label})
    with pytest.raises(ValueError, match="environment variable name"):  # start() failed
        asyncio.run(example.run_task("anything", model=ScriptedModel([]), options=options,
                                     client=sandgate_client(gateway)))
    left = [s for s in client.list_sessions(limit=100)["sessions"] if s.metadata.get("test") == label]
    for s in left:
        client.delete_session(s.session_id)
    assert left == []


def test_teardown_failures_are_logged(sandgate_bin: str, scratch: Path, caplog) -> None:
    """A delete (or stop) that fails at the end is a warning in the log, not
    silence: here the gateway has gone away."""
    import logging

    gw = sdk_fixtures.start_gateway(sandgate_bin, scratch, "--sandbox", "workdir")

    async def go() -> None:
        sandbox = sandgate_client(gw)
        session = await sandbox.create()
        await session.start()
        sid = session._inner.sandgate_session_id
        gw.stop()
        with caplog.at_level(logging.WARNING, logger="sandbox_sessions_sdk.openai_agents"):
            await sandbox.delete(session)
        assert any(sid in r.getMessage() for r in caplog.records), caplog.records
        await sandbox.close()

    try:
        asyncio.run(go())
    finally:
        gw.stop()


@in_loop
async def test_resume_errors_are_start_errors_and_another_gateway_is_warned_about(gateway,
                                                                                  client: SessionsClient) -> None:
    from agents.sandbox.errors import WorkspaceStartError

    sandbox = sandgate_client(gateway)
    session = await sandbox.create(options=SandgateSandboxClientOptions(labels={"test": "agents-resume-err"}))
    payload = sandbox.serialize_session_state(session.state)
    await sandbox.delete(session)

    # The gateway cannot be reached: the SDK's start error, retryable, the transport error its cause.
    elsewhere = SandgateSandboxClient(api_url="http://127.0.0.1:9", bearer_token="x")
    with pytest.warns(RuntimeWarning, match="another gateway"):
        with pytest.raises(WorkspaceStartError) as failed:
            await elsewhere.resume(elsewhere.deserialize_session_state(payload))
    assert failed.value.retryable is True and failed.value.cause is not None
    await elsewhere.close()

    # A state of another gateway URL: warned about, then resumed here.
    state = sandbox.deserialize_session_state(payload)
    state.api_url = "http://other.invalid:8080"
    with pytest.warns(RuntimeWarning, match="another gateway"):
        resumed = await sandbox.resume(state)
    try:
        await resumed.start()
        assert (await resumed.exec("true")).exit_code == 0
    finally:
        await sandbox.delete(resumed)
        await sandbox.close()


@in_loop
async def test_a_named_workspace_made_meanwhile_by_another_client(gateway, client: SessionsClient) -> None:
    """Two clients starting on a new named workspace at once: the one whose
    create_workspace loses the race (workspace_exists) uses the workspace
    the other made."""
    sandbox = sandgate_client(gateway)
    name = "agents-race-" + os.urandom(4).hex()
    real = sandbox.sessions.create_workspace

    async def the_other_client_first(ws: str):
        client.create_workspace(ws)  # the other client wins the race
        return await real(ws)

    sandbox.sessions.create_workspace = the_other_client_first
    try:
        session = await sandbox.create(options=SandgateSandboxClientOptions(workspace=name))
        try:
            await session.start()
            await session.write(Path("x.txt"), io.BytesIO(b"x"))
            assert client.get_session(session._inner.sandgate_session_id).workspace == name
        finally:
            await sandbox.delete(session)
    finally:
        del sandbox.sessions.create_workspace
        await sandbox.close()
        client.delete_workspace(name)


@in_loop
async def test_reads_and_writes_as_a_user_are_that_users(gateway, client: SessionsClient) -> None:
    """write(..., user=) makes a file of that user's (the I/O runs as the
    user, through sudo, not as the session's default user)."""
    sandbox = sandgate_client(gateway)
    secret = "s3cret-" + os.urandom(8).hex()
    session = await sandbox.create(options=SandgateSandboxClientOptions(env={"API_TOKEN": secret}))
    await session.start()
    # On the workdir driver the workspace is a host directory under this
    # test's private scratch directory: let other users traverse to it.
    opened = []
    root = Path(session.state.workspace_root or "/workspace")
    if root.is_dir() and str(root).startswith(tempfile.gettempdir()):
        for d in [root, *root.parents]:
            mode = d.stat().st_mode
            if not mode & 0o001:
                opened.append((d, mode))
                d.chmod(mode | 0o001)
    try:
        res = await session.exec("mkdir -p shared && chmod 777 shared && sudo -n -u nobody -- test -w shared")
        if b"no new privileges" in res.stderr:
            # sandgate's linux sandboxes run with no_new_privs: sudo cannot
            # change user there, so user= fails, clearly, and writes nothing.
            with pytest.raises(Exception):
                await session.write(Path("shared/by-nobody.txt"), io.BytesIO(b"hi"), user="nobody")
            assert (await session.exec("test -e shared/by-nobody.txt")).exit_code != 0
            return
        if res.exit_code != 0:
            sdk_fixtures.fail_or_skip(f"no sudo to nobody in the workspace of this sandbox: {res.stderr!r}")
        await session.write(Path("shared/by-nobody.txt"), io.BytesIO(b"hi"), user="nobody")
        owner = await session.exec("stat -c %U shared/by-nobody.txt")
        assert owner.stdout == b"nobody\n", owner
        assert (await session.read(Path("shared/by-nobody.txt"), user="nobody")).read() == b"hi"
        await session.exec("printf root > shared/root-only.txt && chmod 600 shared/root-only.txt")
        with pytest.raises(Exception):
            await session.read(Path("shared/root-only.txt"), user="nobody")
        # The environment reaches a user's commands too (sudo resets it:
        # the file is sourced after sudo), and its value is in no argv.
        res = await session.exec('echo "$(id -un) $API_TOKEN"', user="nobody")
        assert res.stdout == f"nobody {secret}\n".encode(), res
        history = json.dumps(client.list_commands(sandbox.sandgate_session_id(session)))
        assert "sudo" in history and secret not in history
    finally:
        for d, mode in opened:
            d.chmod(mode & 0o7777)
        await sandbox.delete(session)
        await sandbox.close()


def test_a_drifted_resume_at_the_session_quota(sandgate_bin: str, scratch: Path, snapshots_dir) -> None:
    """--max-sessions-per-tenant 1: the replacement of a drifted session
    cannot exist beside it (quota_exceeded), so the old one goes first."""
    gw = sdk_fixtures.start_gateway(sandgate_bin, scratch, "--sandbox", "workdir", "--max-sessions-per-tenant", "1")

    async def go() -> None:
        sandbox = sandgate_client(gw)
        session = await sandbox.create(options=SandgateSandboxClientOptions(pause_on_exit=True),
                                       snapshot=LocalSnapshotSpec(base_path=snapshots_dir))
        await session.start()
        sid = session._inner.sandgate_session_id
        await session.write(Path("keep.txt"), io.BytesIO(b"snapshotted"))
        await session.aclose()
        await sandbox.sessions.write_file(sid, "keep.txt", b"drifted")
        resumed = await sandbox.resume(
            sandbox.deserialize_session_state(sandbox.serialize_session_state(session.state)))
        try:
            await resumed.start()
            assert resumed._inner.sandgate_session_id != sid
            assert (await resumed.read(Path("keep.txt"))).read() == b"snapshotted"
        finally:
            await sandbox.delete(resumed)
            await sandbox.close()

    try:
        asyncio.run(go())
    finally:
        gw.stop()
