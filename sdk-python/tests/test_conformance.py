"""The SDK conformance suite (conformance/scenarios.json), run with the
Python SDK's sync and async clients against a real gateway.

The TypeScript SDK runs the same file (sdk-typescript/test/conformance.test.ts):
each scenario's steps name operations by their Python name, and each runner
maps them to its SDK and its results to the scenario's plain shape (see
conformance/README.md). A step the SDK cannot do fails the scenario.
"""

from __future__ import annotations

import base64
import inspect
import json
import re
import secrets
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional

import asyncio

import httpx
import pytest

from sandbox_sessions_sdk import SessionsClient
from sandbox_sessions_sdk import errors as sdk_errors
from sandbox_sessions_sdk.aio import AsyncSessionsClient

from conftest import Gateway, start_gateway

SCENARIOS_PATH = Path(__file__).resolve().parents[2] / "conformance" / "scenarios.json"
SCENARIOS: List[Dict[str, Any]] = json.loads(SCENARIOS_PATH.read_text())["scenarios"]


@pytest.fixture(scope="module")
def conformance_gateway(sandgate_bin: str, scratch: Path) -> Iterator[Gateway]:
    gw = start_gateway(sandgate_bin, scratch, "--rate-limit", "100000")
    try:
        yield gw
    finally:
        gw.stop()


# -- results in the scenarios' plain shape --------------------------------------


def _session(s: Any) -> Dict[str, Any]:
    return {
        "id": s.session_id,
        "status": s.status,
        "ttl": s.ttl,
        "name": s.name,
        "metadata": s.metadata,
        "workspace": s.workspace,
        "from_snapshot": s.from_snapshot,
    }


def _command(r: Any) -> Dict[str, Any]:
    return {
        "exit_code": r.exit_code,
        "exit_signal": r.exit_signal,
        "stdout": r.stdout,
        "stderr": r.stderr,
        "timed_out": r.timed_out,
        "truncated": r.truncated,
        "cwd": r.cwd,
    }


def _process(p: Mapping[str, Any]) -> Dict[str, Any]:
    return {
        "process_id": p.get("processId"),
        "status": p.get("status"),
        "name": p.get("name"),
        "exit_code": p.get("exitCode"),
        "exit_signal": p.get("exitSignal"),
    }


def _output(lines: List[Mapping[str, Any]]) -> Dict[str, Any]:
    out, err = b"", b""
    for line in lines:
        out += line.get("stdout", "").encode() + base64.b64decode(line.get("stdoutBase64", ""))
        err += line.get("stderr", "").encode() + base64.b64decode(line.get("stderrBase64", ""))
    last = lines[-1] if lines else {}
    return {
        "stdout": out.decode(errors="replace"),
        "stderr": err.decode(errors="replace"),
        "done": last.get("done"),
        "exit_code": last.get("exitCode"),
        "exit_signal": last.get("exitSignal"),
    }


def _python(r: Any) -> Dict[str, Any]:
    return {
        "kernel": r.kernel,
        "result": r.result,
        "stdout": r.stdout,
        "stderr": r.stderr,
        "error_name": r.error.name if r.error is not None else None,
    }


def _names(entries: Any) -> List[str]:
    return sorted(e["name"] if isinstance(e, Mapping) else e.name for e in entries)


async def _await(v: Any) -> Any:
    return await v if inspect.isawaitable(v) else v


async def _lines(stream: Any) -> List[Dict[str, Any]]:
    if hasattr(stream, "__aiter__"):
        return [line async for line in stream]
    with stream:
        return list(stream)


async def do_op(c: Any, op: str, a: Dict[str, Any]) -> Any:
    """One step: the SDK call the scenario's op names, its result in the plain shape."""
    sid = a.get("session")
    if op == "create_session":
        kw = {k: a[k] for k in ("ttl", "name", "metadata", "workspace", "from_snapshot", "resources", "secrets", "image") if k in a}
        return _session(await _await(c.create_session(**kw)))
    if op == "get_session":
        return _session(await _await(c.get_session(sid)))
    if op == "update_session":
        return _session(await _await(c.update_session(sid, ttl=a["ttl"])))
    if op == "list_sessions":
        page = await _await(c.list_sessions(limit=100))
        return {"ids": [s.session_id for s in page["sessions"]], "total": page["total"]}
    if op == "delete_session":
        return await _await(c.delete_session(sid))
    if op == "stop_session":
        return _session(await _await(c.stop_session(sid)))
    if op == "run":
        kw = {k: a[k] for k in ("argv", "stdin", "env", "cwd", "timeout", "shell") if k in a}
        if not a.get("stream"):
            return _command(await _await(c.run(sid, a.get("command"), **kw)))
        out: List[Any] = []
        err: List[Any] = []
        res = _command(await _await(c.run(sid, a.get("command"), on_stdout=out.append, on_stderr=err.append, **kw)))
        join = lambda chunks: "".join(x if isinstance(x, str) else x.decode(errors="replace") for x in chunks)  # noqa: E731
        return dict(res, streamed_stdout=join(out), streamed_stderr=join(err))
    if op == "session_logs":
        return {"text": await _await(c.session_logs(sid, a.get("tail")))}
    if op == "host_keys":
        keys = await _await(c.host_keys())
        return {"first": keys[0] if keys else None, "count": len(keys)}
    if op == "file_link":
        link = await _await(c.file_link(sid, a["path"], a.get("expires_in")))
        async with httpx.AsyncClient() as h:
            return {"fetched": (await h.get(link["url"])).text}
    if op == "create_ticket":
        return {"session_id": (await _await(c.create_ticket(sid)))["sessionId"]}
    if op == "list_images":
        images = await _await(c.list_images())
        return {"has_allow": isinstance(images.get("allow"), list), "images": [i["name"] for i in images["images"]]}
    if op == "delete_shell":
        return {"value": await _await(c.delete_shell(sid, a["name"]))}
    if op == "write_file":
        await _await(c.write_file(sid, a["path"], a["data"].encode()))
        return None
    if op == "read_file":
        data = await _await(c.read_file(sid, a["path"], max_bytes=a.get("max_bytes")))
        return {"text": data.decode(errors="replace")}
    if op == "list_files":
        fl = await _await(c.list_files(sid, a.get("path", "."), recursive=a.get("recursive", False)))
        return {"names": _names(fl), "truncated": fl.truncated}
    if op == "delete_file":
        return await _await(c.delete_file(sid, a["path"], recursive=a.get("recursive", False)))
    if op == "start_process":
        kw = {k: a[k] for k in ("argv", "env", "cwd", "name") if k in a}
        return _process(await _await(c.start_process(sid, a.get("command"), **kw)))
    if op == "process_output":
        stream = await _await(c.process_output(sid, a["process_id"], offset=a.get("offset", 0), follow=a.get("follow", True)))
        return _output(await _lines(stream))
    if op == "get_process":
        return _process(await _await(c.get_process(sid, a["process_id"])))
    if op == "list_processes":
        return {"process_ids": [p["processId"] for p in await _await(c.list_processes(sid))]}
    if op == "send_process_input":
        return await _await(c.send_process_input(sid, a["process_id"], a["data"], eof=a.get("eof", False)))
    if op == "signal_process":
        return await _await(c.signal_process(sid, a["process_id"], a["signal"]))
    if op == "run_python":
        kw = {k: a[k] for k in ("kernel", "timeout") if k in a}
        return _python(await _await(c.run_python(sid, a["code"], **kw)))
    if op == "reset_python":
        # The SDK answers whether the kernel existed; the kernel is the one named (or the default).
        return {"kernel": a.get("kernel") or "default", "existed": await _await(c.reset_python(sid, a.get("kernel")))}
    if op == "create_workspace":
        return {"name": (await _await(c.create_workspace(a["name"]))).name}
    if op == "list_workspaces":
        return {"names": _names(await _await(c.list_workspaces()))}
    if op == "delete_workspace":
        return await _await(c.delete_workspace(a["name"]))
    if op == "create_snapshot":
        return {"snapshot_id": (await _await(c.create_snapshot(sid))).snapshot_id}
    if op == "list_snapshots":
        return {"snapshot_ids": [s.snapshot_id for s in await _await(c.list_snapshots(session=sid))]}
    if op == "delete_snapshot":
        return await _await(c.delete_snapshot(a["snapshot_id"]))
    raise AssertionError(f"the Python runner does not know op {op!r}")


# -- the scenario language -----------------------------------------------------

_REF = re.compile(r"^\$([A-Za-z_]\w*)\.([A-Za-z_]\w*)$")
_INTERP = re.compile(r"\$\{([A-Za-z_]\w*)(?:\.([A-Za-z_]\w*))?\}")


def resolve(v: Any, env: Dict[str, Any]) -> Any:
    """*v* with ``$var.field`` (a whole value) and ``${var}`` / ``${var.field}`` (in text) replaced."""
    if isinstance(v, str):
        m = _REF.match(v)
        if m and m.group(1) in env:
            return env[m.group(1)][m.group(2)]
        return _INTERP.sub(lambda m: str(env[m.group(1)] if m.group(2) is None else env[m.group(1)][m.group(2)]), v)
    if isinstance(v, list):
        return [resolve(x, env) for x in v]
    if isinstance(v, dict):
        return {k: resolve(x, env) for k, x in v.items()}
    return v


def check(got: Any, want: Any, where: str) -> None:
    """*got* matches *want*: equal, or a matcher (``$match``, ``$contains``, ``$excludes``)."""
    if isinstance(want, dict) and len(want) == 1 and next(iter(want)).startswith("$"):
        (kind, arg), = want.items()
        if kind == "$match":
            assert isinstance(got, str) and re.search(arg, got), f"{where}: {got!r} does not match {arg!r}"
        elif kind == "$contains":
            assert arg in got, f"{where}: {arg!r} not in {got!r}"
        elif kind == "$excludes":
            assert arg not in got, f"{where}: {arg!r} in {got!r}"
        else:
            raise AssertionError(f"{where}: unknown matcher {kind}")
        return
    assert got == want, f"{where}: got {got!r}, want {want!r}"


# Bad arguments: the scenario's ArgumentError is Python's ValueError or TypeError.
_ARGUMENT_ERRORS = (ValueError, TypeError)


def check_error(e: BaseException, want: Mapping[str, Any], where: str) -> None:
    cls = want["class"]
    if cls == "ArgumentError":
        assert isinstance(e, _ARGUMENT_ERRORS) and not isinstance(e, sdk_errors.SandboxAPIError), f"{where}: {e!r}"
        return
    expected = getattr(sdk_errors, cls)
    assert isinstance(e, expected), f"{where}: raised {type(e).__name__}: {e}, want {cls}"
    if "status" in want:
        assert e.status_code == want["status"], f"{where}: status {e.status_code}, want {want['status']}"
    if "code" in want:
        assert e.code == want["code"], f"{where}: code {e.code!r}, want {want['code']!r}"


async def run_scenario(scenario: Dict[str, Any], client: Any, bad_client: Any) -> None:
    env: Dict[str, Any] = {"rand": secrets.token_hex(4)}
    made: List[str] = []
    try:
        for i, step in enumerate(scenario["steps"]):
            where = f"{scenario['name']!r} step {i + 1} ({step['op']})"
            args = resolve(step.get("args", {}), env)
            c = bad_client if step.get("as") == "bad_token" else client
            try:
                got = await do_op(c, step["op"], args)
            except Exception as e:  # noqa: BLE001 - compared with the step's error
                if "error" not in step:
                    raise AssertionError(f"{where}: raised {type(e).__name__}: {e}") from e
                check_error(e, step["error"], where)
                continue
            assert "error" not in step, f"{where}: succeeded ({got!r}), want {step['error']}"
            if step["op"] == "create_session":
                made.append(got["id"])
            if "save" in step:
                env[step["save"]] = got
            for key, want in resolve(step.get("expect", {}), env).items():
                check(got.get(key) if isinstance(got, dict) else None, want, f"{where}: {key}")
    finally:
        for sid in made:
            try:
                await _await(client.delete_session(sid))
            except sdk_errors.SandboxAPIError:
                pass


@pytest.mark.parametrize("flavour", ["sync", "async"])
@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s["name"] for s in SCENARIOS])
def test_conformance(conformance_gateway: Gateway, scenario: Dict[str, Any], flavour: str) -> None:
    gw = conformance_gateway
    if flavour == "sync":
        with SessionsClient(api_url=gw.url, bearer_token=gw.token) as c, SessionsClient(
            api_url=gw.url, bearer_token=secrets.token_hex(16)
        ) as bad:
            asyncio.run(run_scenario(scenario, c, bad))
        return

    async def main() -> None:
        async with AsyncSessionsClient(api_url=gw.url, bearer_token=gw.token) as c, AsyncSessionsClient(
            api_url=gw.url, bearer_token=secrets.token_hex(16)
        ) as bad:
            await run_scenario(scenario, c, bad)

    asyncio.run(main())


def test_every_op_is_known() -> None:
    """Each op of the scenarios is one the runners know (a typo fails here, not silently)."""
    src = Path(__file__).read_text()
    ops = {step["op"] for s in SCENARIOS for step in s["steps"]}
    missing = sorted(op for op in ops if f'op == "{op}"' not in src)
    assert not missing, f"ops without a Python runner: {missing}"
