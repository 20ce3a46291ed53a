"""A coding agent on a sandgate sandbox, with Claude's tool use (the ``anthropic`` SDK).

Three tools, ``exec``, ``write_file`` and ``read_file``, are declared to the
model as JSON schemas; ``run_agent`` sends the conversation, runs every
``tool_use`` block of the answer against one sandgate session (through
``sandbox_sessions_sdk``), sends the ``tool_result`` blocks back, and repeats
until the model stops asking for tools.

    export SANDBOX_API_URL=http://127.0.0.1:8080 SANDBOX_API_TOKEN=... ANTHROPIC_API_KEY=...
    python main.py "Write a Python script that prints fibonacci numbers and run it"
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Tuple

from sandbox_sessions_sdk import (
    FileNotFoundInSandboxError,
    SandboxAPIError,
    SessionsClient,
)

DEFAULT_MODEL = "claude-sonnet-4-5"
MAX_OUTPUT_BYTES = 64 * 1024
MAX_READ_BYTES = 256 * 1024

SYSTEM = """\
You have a disposable Linux sandbox (a sandgate session). Use the tools:
- exec: run a shell command. The shell persists between calls: cd, exported
  variables and functions carry over. Each result starts with exit=<code> and
  cwd=<directory>; exit=124 means the command hit its timeout and was killed.
- write_file / read_file: files, with paths relative to the workspace.
Work in small steps, check each command's exit code, and say what you did."""

TOOLS: List[Dict[str, Any]] = [
    {
        "name": "exec",
        "description": "Execute a shell command in the sandbox. Stateful: cd, env and shell functions persist "
        "between calls. Returns exit=<code>, cwd=<dir>, a --- line, then stdout and stderr.",
        "input_schema": {
            "type": "object",
            "properties": {
                "cmd": {"type": "string", "description": "The bash command line to run."},
                "timeout_ms": {
                    "type": "integer",
                    "description": "Kill the command after this many milliseconds (default 30000, at most 3600000).",
                    "minimum": 1000,
                    "maximum": 3600000,
                },
            },
            "required": ["cmd"],
        },
    },
    {
        "name": "write_file",
        "description": "Write content to a file in the sandbox workspace (parent directories are created).",
        "input_schema": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "The file's path, relative to the workspace."},
                "content": {"type": "string", "description": "The whole new content of the file."},
            },
            "required": ["path", "content"],
        },
    },
    {
        "name": "read_file",
        "description": "Read a file from the sandbox workspace.",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string", "description": "The file's path, relative to the workspace."}},
            "required": ["path"],
        },
    },
]


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


def run_tool(sandbox: Sandbox, name: str, args: Dict[str, Any]) -> Tuple[str, bool]:
    """Run one tool call; returns (content, is_error) for its ``tool_result``."""
    try:
        if name == "exec":
            return sandbox.exec(str(args["cmd"]), int(args.get("timeout_ms", 30000))), False
        if name == "write_file":
            return sandbox.write_file(str(args["path"]), str(args["content"])), False
        if name == "read_file":
            return sandbox.read_file(str(args["path"])), False
        return f"error: unknown tool {name!r}", True
    except KeyError as exc:
        return f"error: missing argument {exc.args[0]!r}", True
    except FileNotFoundInSandboxError as exc:
        return f"error: no such file: {exc.filename}", True
    except SandboxAPIError as exc:
        return f"error: {exc.code or type(exc).__name__}: {exc.message}", True


def run_agent(
    anthropic_client: Any,
    sandbox: Sandbox,
    task: str,
    model: str = DEFAULT_MODEL,
    max_turns: int = 30,
    max_tokens: int = 4096,
) -> Tuple[str, List[Dict[str, Any]]]:
    """The tool-use loop. Returns the model's last text and the whole conversation."""
    messages: List[Dict[str, Any]] = [{"role": "user", "content": task}]
    for _ in range(max_turns):
        response = anthropic_client.messages.create(
            model=model, max_tokens=max_tokens, system=SYSTEM, tools=TOOLS, messages=messages
        )
        messages.append({"role": "assistant", "content": response.content})
        if response.stop_reason != "tool_use":
            text = "".join(block.text for block in response.content if block.type == "text")
            return text, messages
        results = []
        for block in response.content:
            if block.type != "tool_use":
                continue
            content, is_error = run_tool(sandbox, block.name, dict(block.input))
            results.append({"type": "tool_result", "tool_use_id": block.id, "content": content, "is_error": is_error})
        messages.append({"role": "user", "content": results})
    raise RuntimeError(f"the model still wanted tools after {max_turns} turns")


def main() -> int:
    import anthropic

    task = " ".join(sys.argv[1:]) or "Write a Python script that prints the first 20 fibonacci numbers and run it"
    if not os.environ.get("ANTHROPIC_API_KEY"):
        print("set ANTHROPIC_API_KEY", file=sys.stderr)
        return 2
    # SANDBOX_API_URL and SANDBOX_API_TOKEN are read by the SDK.
    with SessionsClient() as client:
        session = client.create_session(ttl=1800, metadata={"example": "claude-tool-use"})
        print(f"session {session.session_id}", file=sys.stderr)
        try:
            text, _ = run_agent(
                anthropic.Anthropic(), Sandbox(client, session.session_id), task,
                model=os.environ.get("ANTHROPIC_MODEL", DEFAULT_MODEL),
            )
            print(text)
        finally:
            client.delete_session(session.session_id)
    return 0


if __name__ == "__main__":
    sys.exit(main())
