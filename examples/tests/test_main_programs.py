"""Each example's main.py run as a program, the way its README says, with the
model API replaced by a local fake HTTP server (the SDKs' base-URL variables
point at it): the program creates a session on the real gateway, runs the
scripted tool call in it, prints the model's answer, and deletes the session.
No key, no network."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, Iterator, List, Tuple

import pytest
from anthropic.types import Message, TextBlock, ToolUseBlock, Usage
from conftest import EXAMPLES
from openai.types.responses import Response, ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

from sandbox_sessions_sdk import SessionNotFoundError, SessionsClient

CMD = "echo from-main > proof.txt && cat proof.txt && pwd"


class FakeAPI:
    """Answers POSTs with the next scripted JSON body; records (path, request body)."""

    def __init__(self) -> None:
        self.script: List[Dict[str, Any]] = []
        self.requests: List[Tuple[str, Dict[str, Any]]] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                api.requests.append((self.path, body))
                status, answer = (200, api.script.pop(0)) if api.script else (500, {"error": "script exhausted"})
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
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def fake_api() -> Iterator[FakeAPI]:
    api = FakeAPI()
    try:
        yield api
    finally:
        api.server.shutdown()
        api.server.server_close()


def run_main(example: str, gateway: Any, env_extra: Dict[str, str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_"))}
    env.update(SANDBOX_API_URL=gateway.url, SANDBOX_API_TOKEN=gateway.token, **env_extra)
    return subprocess.run(
        [sys.executable, str(EXAMPLES / example / "main.py"), "make proof.txt"],
        env=env, capture_output=True, text=True, timeout=120,
    )


def check_session_gone(client: SessionsClient, stderr: str) -> None:
    sid = stderr.split("session ", 1)[1].split()[0]
    with pytest.raises(SessionNotFoundError):
        client.get_session(sid)


def test_openai_agents_main(gateway: Any, client: SessionsClient, fake_api: FakeAPI) -> None:
    def response(rid: str, item: Any) -> Dict[str, Any]:
        return Response(id=rid, created_at=0, model="scripted", object="response", output=[item],
                        parallel_tool_calls=True, tool_choice="auto", tools=[]).model_dump(mode="json")

    fake_api.script = [
        response("resp_1", ResponseFunctionToolCall(id="fc_1", call_id="call_1", type="function_call",
                                                    name="exec", arguments=json.dumps({"cmd": CMD}))),
        response("resp_2", ResponseOutputMessage(
            id="msg_1", type="message", role="assistant", status="completed",
            content=[ResponseOutputText(type="output_text", text="proof.txt is written", annotations=[])])),
    ]
    res = run_main("openai-agents", gateway, {
        "OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": fake_api.url + "/v1",
        "OPENAI_AGENTS_DISABLE_TRACING": "1", "OPENAI_MODEL": "scripted",
    })
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "proof.txt is written"
    assert [p for p, _ in fake_api.requests] == ["/v1/responses", "/v1/responses"]
    sent = fake_api.requests[1][1]["input"]
    outputs = [i["output"] for i in sent if isinstance(i, dict) and i.get("type") == "function_call_output"]
    assert len(outputs) == 1 and outputs[0].startswith("exit=0\ncwd=") and "---\nfrom-main\n" in outputs[0]
    check_session_gone(client, res.stderr)


def test_openai_sandbox_agent_main(gateway: Any, client: SessionsClient, fake_api: FakeAPI) -> None:
    """The SandboxAgent example: the SDK's own exec_command tool runs on a
    sandgate session made by SandgateSandboxClient, which is gone afterwards."""
    def response(rid: str, item: Any) -> Dict[str, Any]:
        return Response(id=rid, created_at=0, model="scripted", object="response", output=[item],
                        parallel_tool_calls=True, tool_choice="auto", tools=[]).model_dump(mode="json")

    fake_api.script = [
        response("resp_1", ResponseFunctionToolCall(id="fc_1", call_id="call_1", type="function_call",
                                                    name="exec_command", arguments=json.dumps({"cmd": CMD}))),
        response("resp_2", ResponseOutputMessage(
            id="msg_1", type="message", role="assistant", status="completed",
            content=[ResponseOutputText(type="output_text", text="proof.txt is written", annotations=[])])),
    ]
    res = run_main("openai-sandbox-agent", gateway, {
        "OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": fake_api.url + "/v1",
        "OPENAI_AGENTS_DISABLE_TRACING": "1", "OPENAI_MODEL": "scripted",
    })
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "proof.txt is written"
    assert [p for p, _ in fake_api.requests] == ["/v1/responses", "/v1/responses"]
    tools = {t.get("name") for t in fake_api.requests[0][1]["tools"]}
    assert {"exec_command", "apply_patch"} <= tools, tools
    sent = fake_api.requests[1][1]["input"]
    outputs = [i["output"] for i in sent if isinstance(i, dict) and i.get("type") == "function_call_output"]
    assert len(outputs) == 1 and "exited with code 0" in outputs[0] and "from-main" in outputs[0], outputs
    assert "join it: sandgate ssh --api-url " in res.stderr
    check_session_gone(client, res.stderr)


def test_claude_tool_use_main(gateway: Any, client: SessionsClient, fake_api: FakeAPI) -> None:
    def message(stop: str, *content: Any) -> Dict[str, Any]:
        return Message(id="msg", type="message", role="assistant", model="scripted", content=list(content),
                       stop_reason=stop, stop_sequence=None,
                       usage=Usage(input_tokens=1, output_tokens=1)).model_dump(mode="json", exclude_none=True)

    fake_api.script = [
        message("tool_use", ToolUseBlock(type="tool_use", id="tu_1", name="exec", input={"cmd": CMD})),
        message("end_turn", TextBlock(type="text", text="proof.txt is written")),
    ]
    res = run_main("claude-tool-use", gateway, {
        "ANTHROPIC_API_KEY": "sk-ant-test", "ANTHROPIC_BASE_URL": fake_api.url, "ANTHROPIC_MODEL": "scripted",
    })
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "proof.txt is written"
    assert [p for p, _ in fake_api.requests] == ["/v1/messages", "/v1/messages"]
    body = fake_api.requests[1][1]
    assert body["model"] == "scripted"
    result = body["messages"][2]["content"][0]
    assert result["type"] == "tool_result" and result["tool_use_id"] == "tu_1" and not result["is_error"]
    assert result["content"].startswith("exit=0\ncwd=") and "---\nfrom-main\n" in result["content"]
    check_session_gone(client, res.stderr)


def test_main_wants_a_key(gateway: Any) -> None:
    for example, var in (("openai-agents", "OPENAI_API_KEY"), ("openai-sandbox-agent", "OPENAI_API_KEY"),
                         ("claude-tool-use", "ANTHROPIC_API_KEY")):
        res = run_main(example, gateway, {})
        assert res.returncode == 2 and var in res.stderr
