"""The README's async example, run unchanged (only API_URL and TOKEN are set)
as its own Python process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import SDK_ROOT, Gateway, wait_gone

from sandbox_sessions_sdk import SessionsClient

EXAMPLE = """\
import asyncio
from sandbox_sessions_sdk import AsyncSessionsClient, AsyncSessionSSHClient


async def main():
    async with AsyncSessionsClient(api_url=API_URL, bearer_token=TOKEN) as sessions:
        session = await sessions.create_session(ttl=600)
        sid = session.session_id
        try:
            async with AsyncSessionSSHClient(api_url=API_URL, bearer_token=TOKEN, session_id=sid) as ssh:
                rest, over_ssh = await asyncio.gather(sessions.run(sid, "echo rest"), ssh.run_command("echo ssh"))
                print(rest.stdout + over_ssh.stdout, end="")
                try:  # a cancelled call kills its command in the sandbox
                    await asyncio.wait_for(ssh.run_command("sleep 3600"), timeout=1)
                except asyncio.TimeoutError:
                    print("cancelled; the sleep was killed")
        finally:
            await sessions.delete_session(sid)


asyncio.run(main())
"""


def test_readme_carries_the_async_example() -> None:
    assert "```python\n" + EXAMPLE + "```" in (SDK_ROOT / "README.md").read_text()


def test_async_example_runs_unchanged(gateway: Gateway, local_dir: Path) -> None:
    with SessionsClient(gateway.url, gateway.token) as c:
        before = {s.session_id for s in c.list_sessions(limit=100)["sessions"]}
    program = f"API_URL = {gateway.url!r}\nTOKEN = {gateway.token!r}\n" + EXAMPLE
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SDK_ROOT / "src"), env.get("PYTHONPATH")]))
    res = subprocess.run(
        [sys.executable, "-c", program], cwd=local_dir, env=env, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout == "rest\nssh\ncancelled; the sleep was killed\n"
    # The cancelled command is gone (the workdir driver runs it as a host process).
    assert wait_gone("sleep 3600") == []
    # The example deleted its session.
    with SessionsClient(gateway.url, gateway.token) as c:
        after = {s.session_id for s in c.list_sessions(limit=100)["sessions"]}
    assert after <= before
