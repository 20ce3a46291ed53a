"""A coding agent on a sandgate sandbox, with the OpenAI Agents SDK.

The agent gets three tools, ``exec``, ``write_file`` and ``read_file``, that
act on one sandgate session through the Python SDK (``sandbox_sessions_sdk``).
``exec`` runs in a persistent shell named ``agent``: ``cd``, ``export`` and
shell functions carry over from one call to the next.

    export SANDBOX_API_URL=http://127.0.0.1:8080 SANDBOX_API_TOKEN=... OPENAI_API_KEY=...
    python main.py "Write a Python script that prints fibonacci numbers and run it"

The tools reach the sandbox through ``RunContextWrapper.context`` (a
``Sandbox``), so one program can drive several sessions at once.
"""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass
from typing import Optional

from agents import Agent, RunContextWrapper, Runner, function_tool

from sandbox_sessions_sdk import (
    FileNotFoundInSandboxError,
    SandboxAPIError,
    SessionsClient,
)

# What one tool result may hand the model: enough for a build log's head and
# tail, small enough to keep the context window for the task.
MAX_OUTPUT_BYTES = 64 * 1024
MAX_READ_BYTES = 256 * 1024

INSTRUCTIONS = """\
You have a disposable Linux sandbox (a sandgate session). Use the tools:
- exec: run a shell command. The shell persists between calls: cd, exported
  variables and functions carry over. Each result starts with exit=<code> and
  cwd=<directory>; exit=124 means the command hit its timeout and was killed.
- write_file / read_file: files, with paths relative to the workspace.
Work in small steps, check each command's exit code, and say what you did."""


@dataclass
class Sandbox:
    """One sandgate session and the persistent shell the agent's commands run in."""

    client: SessionsClient
    session_id: str
    shell_name: str = "agent"

    def exec(self, cmd: str, timeout_ms: int = 30000) -> str:
        timeout = max(1.0, timeout_ms / 1000.0)
        res = self.client.shell(self.session_id, self.shell_name).run(
            cmd, timeout=timeout, max_output_bytes=MAX_OUTPUT_BYTES
        )
        output = res.stdout
        if res.stderr:
            output += ("" if not output or output.endswith("\n") else "\n") + res.stderr
        notes = []
        if res.timed_out:
            notes.append(f"[timed out after {timeout:g}s: killed; the shell keeps its cwd and exported variables]")
        if res.truncated:
            notes.append(f"[output truncated to {MAX_OUTPUT_BYTES} bytes per stream]")
        if notes:
            output += ("" if not output or output.endswith("\n") else "\n") + "\n".join(notes)
        return f"exit={res.exit_code}\ncwd={res.cwd}\n---\n{output}"

    def write_file(self, path: str, content: str) -> str:
        entry = self.client.write_file(self.session_id, path, content)
        return f"wrote {path} ({entry.get('sizeBytes', len(content.encode()))} bytes)"

    def read_file(self, path: str) -> str:
        data = self.client.read_file(self.session_id, path, max_bytes=MAX_READ_BYTES)
        text = data.decode("utf-8", errors="replace")
        if len(data) == MAX_READ_BYTES:
            text += f"\n[only the first {MAX_READ_BYTES} bytes; use exec with head/tail/grep for the rest]"
        return text


def _error(exc: SandboxAPIError) -> str:
    if isinstance(exc, FileNotFoundInSandboxError):
        return f"error: no such file: {exc.filename}"
    return f"error: {exc.code or type(exc).__name__}: {exc.message}"


@function_tool
async def exec(ctx: RunContextWrapper[Sandbox], cmd: str, timeout_ms: int = 30000) -> str:
    """Execute a shell command in the sandbox. Stateful: cd, env and shell functions persist.

    Args:
        cmd: The bash command line to run.
        timeout_ms: Kill the command after this many milliseconds (at most 3600000).
    """
    try:
        return await asyncio.to_thread(ctx.context.exec, cmd, timeout_ms)
    except SandboxAPIError as exc:
        return _error(exc)


@function_tool
async def write_file(ctx: RunContextWrapper[Sandbox], path: str, content: str) -> str:
    """Write content to a file in the sandbox workspace (parent directories are created).

    Args:
        path: The file's path, relative to the workspace.
        content: The whole new content of the file.
    """
    try:
        return await asyncio.to_thread(ctx.context.write_file, path, content)
    except SandboxAPIError as exc:
        return _error(exc)


@function_tool
async def read_file(ctx: RunContextWrapper[Sandbox], path: str) -> str:
    """Read a file from the sandbox workspace.

    Args:
        path: The file's path, relative to the workspace.
    """
    try:
        return await asyncio.to_thread(ctx.context.read_file, path)
    except SandboxAPIError as exc:
        return _error(exc)


def make_agent(model: Optional[object] = None) -> Agent[Sandbox]:
    """The agent; *model* is a model name or an agents ``Model`` (the tests pass a scripted one)."""
    kwargs = {} if model is None else {"model": model}
    return Agent[Sandbox](
        name="coding-assistant",
        instructions=INSTRUCTIONS,
        tools=[exec, write_file, read_file],
        **kwargs,
    )


async def run_task(sandbox: Sandbox, task: str, model: Optional[object] = None, max_turns: int = 30) -> str:
    result = await Runner.run(make_agent(model), task, context=sandbox, max_turns=max_turns)
    return str(result.final_output)


async def main() -> int:
    task = " ".join(sys.argv[1:]) or "Write a Python script that prints the first 20 fibonacci numbers and run it"
    if not os.environ.get("OPENAI_API_KEY"):
        print("set OPENAI_API_KEY", file=sys.stderr)
        return 2
    # SANDBOX_API_URL and SANDBOX_API_TOKEN are read by the SDK.
    with SessionsClient() as client:
        session = client.create_session(ttl=1800, metadata={"example": "openai-agents"})
        print(f"session {session.session_id}", file=sys.stderr)
        try:
            print(await run_task(Sandbox(client, session.session_id), task, os.environ.get("OPENAI_MODEL")))
        finally:
            client.delete_session(session.session_id)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
