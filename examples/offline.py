"""Run the agent examples offline: no model API key, no network.

    make example-offline                      # every example, on a gateway of their own
    examples/.venv/bin/python examples/offline.py [openai-agents] [openai-sandbox-agent] [claude-tool-use] [--task TASK]

A local fake of the model's HTTP API (OpenAI's Responses API and Anthropic's
Messages API, on 127.0.0.1) stands in for the model: its first answer asks
for one ``exec`` (``exec_command``) tool call, its second reports what the tool returned. Each
example's ``main.py`` runs unchanged as a program, with the SDKs' base-URL
variables pointing at the fake: it creates a session on a real gateway, runs
the tool call in it, prints the fake model's answer and deletes the session.

The gateway is ``$SANDBOX_API_URL`` (with ``$SANDBOX_API_TOKEN``) when both
are set; otherwise this starts one of its own (``$SANDGATE_BIN``, else
``bin/sandgate``; the workdir driver, a temporary data dir, a free loopback
port) and stops it at the end. The exit status is 0 when every example
succeeded. The tests (``examples/tests/test_offline.py``) run this script.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple
from contextlib import contextmanager

EXAMPLES = Path(__file__).resolve().parent
REPO_ROOT = EXAMPLES.parent
ALL = ("openai-agents", "openai-sandbox-agent", "claude-tool-use")
OPENAI_EXAMPLES = ("openai-agents", "openai-sandbox-agent")
DEFAULT_TASK = "Write hello.txt in the sandbox and show it"
CMD = "echo hello from the sandbox > hello.txt && cat hello.txt && uname -s"


def _tool_result_openai(body: Dict[str, Any]) -> Optional[str]:
    for item in body.get("input") or []:
        if isinstance(item, dict) and item.get("type") == "function_call_output":
            return str(item.get("output", ""))
    return None


def _tool_result_anthropic(body: Dict[str, Any]) -> Optional[str]:
    for msg in body.get("messages") or []:
        content = msg.get("content")
        if not isinstance(content, list):
            continue
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                c = block.get("content")
                if isinstance(c, list):
                    c = "".join(part.get("text", "") for part in c if isinstance(part, dict))
                return str(c)
    return None


def _final_text(result: str) -> str:
    return "(fake model, offline) the sandbox answered:\n" + result.strip()[:2000]


def answer_openai(body: Dict[str, Any]) -> Dict[str, Any]:
    """A Responses API answer: an exec call first, then a message about its output."""
    from openai.types.responses import Response, ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

    result = _tool_result_openai(body)
    if result is None:
        # openai-agents names its shell tool exec; the Agents SDK's sandbox
        # tools (openai-sandbox-agent) name it exec_command. Both take cmd.
        names = {t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)}
        tool = "exec_command" if "exec_command" in names else "exec"
        item: Any = ResponseFunctionToolCall(id="fc_1", call_id="call_1", type="function_call", name=tool,
                                             arguments=json.dumps({"cmd": CMD}))
    else:
        item = ResponseOutputMessage(id="msg_1", type="message", role="assistant", status="completed",
                                     content=[ResponseOutputText(type="output_text", text=_final_text(result),
                                                                 annotations=[])])
    return Response(id="resp_offline", created_at=0, model=str(body.get("model", "fake")), object="response",
                    output=[item], parallel_tool_calls=True, tool_choice="auto", tools=[]).model_dump(mode="json")


def answer_anthropic(body: Dict[str, Any]) -> Dict[str, Any]:
    """A Messages API answer: a tool_use block first, then text about its result."""
    from anthropic.types import Message, TextBlock, ToolUseBlock, Usage

    result = _tool_result_anthropic(body)
    if result is None:
        stop, block = "tool_use", ToolUseBlock(type="tool_use", id="tu_1", name="exec", input={"cmd": CMD})
    else:
        stop, block = "end_turn", TextBlock(type="text", text=_final_text(result))
    return Message(id="msg_offline", type="message", role="assistant", model=str(body.get("model", "fake")),
                   content=[block], stop_reason=stop, stop_sequence=None,
                   usage=Usage(input_tokens=1, output_tokens=1)).model_dump(mode="json", exclude_none=True)


class FakeModel:
    """The fake model API on a free loopback port; records (path, body) of each request."""

    def __init__(self) -> None:
        self.requests: List[Tuple[str, Dict[str, Any]]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                fake.requests.append((self.path, body))
                if self.path.rstrip("/").endswith("/responses"):
                    status, answer = 200, answer_openai(body)
                elif self.path.rstrip("/").endswith("/messages"):
                    status, answer = 200, answer_anthropic(body)
                else:
                    status, answer = 404, {"error": {"message": f"the offline fake has no {self.path}"}}
                out = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join()


@contextmanager
def own_gateway() -> Iterator[Tuple[str, str]]:
    """A sandgate serve of our own: (url, token); stopped (SIGTERM) on exit."""
    binary = os.environ.get("SANDGATE_BIN") or str(REPO_ROOT / "bin" / "sandgate")
    if not os.access(binary, os.X_OK):
        raise SystemExit(f"offline.py: no sandgate binary at {binary}: run make build, or set SANDGATE_BIN, "
                         "or point SANDBOX_API_URL and SANDBOX_API_TOKEN at a running gateway")
    tmp = Path(tempfile.mkdtemp(prefix="sandgate-offline-"))
    token = secrets.token_hex(16)
    ready = tmp / "url"
    log = open(tmp / "serve.log", "wb")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDGATE_")}
    proc = subprocess.Popen(
        [binary, "serve", "--listen", "127.0.0.1:0", "--data-dir", str(tmp / "data"), "--sandbox", "workdir",
         "--api-key", token, "--keep-sandboxes-on-exit=false", "--ready-file", str(ready)],
        stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                raise SystemExit("offline.py: sandgate serve did not start:\n" + (tmp / "serve.log").read_text())
            time.sleep(0.05)
        yield ready.read_text().strip(), token
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


def run_example(name: str, task: str, api_url: str, token: str, model_url: str) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_"))}
    env.update(SANDBOX_API_URL=api_url, SANDBOX_API_TOKEN=token)
    if name in OPENAI_EXAMPLES:
        env.update(OPENAI_API_KEY="offline", OPENAI_BASE_URL=model_url + "/v1", OPENAI_MODEL="fake",
                   OPENAI_AGENTS_DISABLE_TRACING="1")
    else:
        env.update(ANTHROPIC_API_KEY="offline", ANTHROPIC_BASE_URL=model_url, ANTHROPIC_MODEL="fake")
    print(f"== {name}: python {name}/main.py {task!r} (the model: the offline fake at {model_url})", flush=True)
    res = subprocess.run([sys.executable, str(EXAMPLES / name / "main.py"), task], env=env, timeout=300)
    if res.returncode != 0:
        print(f"== {name}: exit status {res.returncode}", file=sys.stderr, flush=True)
    return res.returncode


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description="Run the agent examples against a local fake model API (no key, no network).")
    ap.add_argument("examples", nargs="*", metavar="EXAMPLE",
                    help="openai-agents, openai-sandbox-agent and/or claude-tool-use (default: all)")
    ap.add_argument("--task", default=DEFAULT_TASK, help="the task passed to each main.py")
    args = ap.parse_args(argv)
    names = args.examples or list(ALL)
    for n in names:
        if n not in ALL:
            ap.error(f"unknown example {n!r} (choose from {', '.join(ALL)})")
    fake = FakeModel()
    try:
        url, token = os.environ.get("SANDBOX_API_URL", ""), os.environ.get("SANDBOX_API_TOKEN", "")
        if url and token:
            return max(run_example(n, args.task, url, token, fake.url) for n in names)
        with own_gateway() as (url, token):
            return max([run_example(n, args.task, url, token, fake.url) for n in names])
    finally:
        fake.close()


if __name__ == "__main__":
    sys.exit(main())
