"""A coding agent on a sandgate sandbox: the OpenAI Agents SDK's ``SandboxAgent``
with sandgate as its sandbox backend.

The agent gets the SDK's own sandbox tools (``exec_command`` for the shell,
``apply_patch`` to edit files, ``view_image``), and they act on one sandgate
session through ``sandbox_sessions_sdk.openai_agents.SandgateSandboxClient``.
Compare ``examples/openai-agents``, which writes its tools by hand.

    pip install 'sandgate-sdk[openai-agents]'
    export SANDBOX_API_URL=http://127.0.0.1:8080 SANDBOX_API_TOKEN=... OPENAI_API_KEY=...
    python main.py "Write a Python script that prints fibonacci numbers and run it"
    python main.py --egress pypi.org --egress files.pythonhosted.org "pip install rich and use it"
    python main.py --keep "..."        # stop the session at the end instead of deleting it

While the agent works, a person can join its sandbox: the program prints the
``sandgate ssh`` command line for it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any, Callable, List, Optional

from agents import Runner
from agents.run import RunConfig
from agents.sandbox import SandboxAgent, SandboxRunConfig

from sandbox_sessions_sdk.openai_agents import SandgateSandboxClient, SandgateSandboxClientOptions

INSTRUCTIONS = """\
You work in a disposable Linux sandbox (a sandgate session). Use the shell to
run commands and apply_patch to create and edit files. Work in small steps,
check each command's exit code, and say what you did."""


def make_agent(model: Optional[Any] = None) -> SandboxAgent:
    """The agent; *model* is a model name or an Agents SDK ``Model`` (the tests pass a scripted one)."""
    kwargs = {} if model is None else {"model": model}
    return SandboxAgent(name="sandgate-coder", instructions=INSTRUCTIONS, **kwargs)


async def run_task(
    task: str,
    *,
    model: Optional[Any] = None,
    options: Optional[SandgateSandboxClientOptions] = None,
    client: Optional[SandgateSandboxClient] = None,
    on_session: Optional[Callable[[str, str], None]] = None,
    max_turns: int = 30,
) -> str:
    """Run *task* in a new sandgate session; call ``on_session(session_id,
    ssh_command)`` once it exists. The session is deleted at the end (stopped
    instead, files kept, with ``options.pause_on_exit``)."""
    own = client is None
    sandbox = client or SandgateSandboxClient()  # SANDBOX_API_URL, SANDBOX_API_TOKEN
    try:
        session = await sandbox.create(options=options or SandgateSandboxClientOptions())
        started = False
        try:
            async with session:  # start; at the end: stop, then delete (or stop with pause_on_exit)
                started = True
                if on_session is not None:
                    on_session(sandbox.sandgate_session_id(session), sandbox.ssh_command(session))
                result = await Runner.run(
                    make_agent(model), task, max_turns=max_turns,
                    run_config=RunConfig(sandbox=SandboxRunConfig(session=session)),
                )
        finally:
            if not started:  # start() failed: `async with` cleans up nothing it did not enter
                await sandbox.delete(session)
        return str(result.final_output)
    finally:
        if own:
            await sandbox.close()


def parse_args(argv: List[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="A coding agent on a sandgate sandbox (OpenAI Agents SDK).")
    ap.add_argument("task", nargs="*", help="what the agent should do")
    ap.add_argument("--egress", action="append", default=[], metavar="HOST",
                    help="a host the sandbox may reach (repeatable; none: no network)")
    ap.add_argument("--secret", action="append", default=[], metavar="NAME",
                    help="an operator secret to give the sandbox, by name (repeatable)")
    ap.add_argument("--image", help="the sandbox image (default: the gateway's)")
    ap.add_argument("--workspace", help="a named workspace to work in (its files outlive the session)")
    ap.add_argument("--keep", action="store_true", help="stop the session at the end instead of deleting it")
    return ap.parse_args(argv)


async def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    task = " ".join(args.task) or "Write a Python script that prints the first 20 fibonacci numbers and run it"
    if not os.environ.get("OPENAI_API_KEY"):
        print("set OPENAI_API_KEY", file=sys.stderr)
        return 2
    options = SandgateSandboxClientOptions(
        image=args.image, egress=tuple(args.egress), secrets=tuple(args.secret), workspace=args.workspace,
        pause_on_exit=args.keep, labels={"example": "openai-sandbox-agent"},
    )

    def announce(session_id: str, ssh: str) -> None:
        print(f"session {session_id} (join it: {ssh})", file=sys.stderr, flush=True)

    print(await run_task(task, model=os.environ.get("OPENAI_MODEL"), options=options, on_session=announce))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
