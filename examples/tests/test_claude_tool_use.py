"""examples/claude-tool-use against a real gateway, with a scripted model.

``FakeAnthropic`` stands in for ``anthropic.Anthropic``: ``messages.create``
returns scripted ``anthropic.types.Message`` objects (the SDK's own types)
and records each request. A second test sends the loop's requests through
the real ``anthropic.Anthropic`` client over a mock HTTP transport, to check
that the conversation the loop builds is what the API accepts on the wire.
No API key, no network.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Dict, List

import anthropic
import httpx2
from anthropic.types import Message, TextBlock, ToolUseBlock, Usage
from conftest import EXAMPLES, load

from sandbox_sessions_sdk import SessionsClient

example = load(EXAMPLES / "claude-tool-use" / "main.py", "example_claude_tool_use")

SCRIPT = "import sys\nprint('sum', sum(range(int(sys.argv[1]))))\n"


def tool_use(id: str, name: str, **input: Any) -> ToolUseBlock:
    return ToolUseBlock(type="tool_use", id=id, name=name, input=input)


def reply(*content: Any, stop_reason: str = "tool_use") -> Message:
    return Message(
        id="msg_test", type="message", role="assistant", model="scripted", content=list(content),
        stop_reason=stop_reason, stop_sequence=None, usage=Usage(input_tokens=1, output_tokens=1),
    )


def script() -> List[Message]:
    return [
        reply(TextBlock(type="text", text="Writing the script."),
              tool_use("tu1", "write_file", path="work/sum.py", content=SCRIPT)),
        reply(tool_use("tu2", "exec", cmd="cd work && export N=5"),
              tool_use("tu3", "exec", cmd="python3 sum.py $N | tee result.txt", timeout_ms=10000)),
        reply(tool_use("tu4", "read_file", path="work/result.txt"),
              tool_use("tu5", "read_file", path="missing.txt"),
              tool_use("tu6", "exec", cmd="echo oops >&2; exit 7"),
              tool_use("tu7", "exec")),
        reply(TextBlock(type="text", text="The sum of 0..4 is 10."), stop_reason="end_turn"),
    ]


class FakeMessages:
    def __init__(self, responses: List[Message]) -> None:
        self.responses = list(responses)
        self.requests: List[Dict[str, Any]] = []

    def create(self, **kwargs: Any) -> Message:
        self.requests.append(copy.deepcopy(kwargs))
        return self.responses.pop(0)


class FakeAnthropic:
    def __init__(self, responses: List[Message]) -> None:
        self.messages = FakeMessages(responses)


def results_of(messages: List[Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """tool_use_id -> the tool_result block sent back for it."""
    out = {}
    for m in messages:
        if m["role"] == "user" and isinstance(m["content"], list):
            for block in m["content"]:
                out[block["tool_use_id"]] = block
    return out


def test_loop_runs_tool_use_blocks_in_the_sandbox(client: SessionsClient, session_id: str) -> None:
    fake = FakeAnthropic(script())
    text, messages = example.run_agent(fake, example.Sandbox(client, session_id), "sum 0..4", model="scripted")
    assert text == "The sum of 0..4 is 10."
    assert len(fake.messages.requests) == 4
    first = fake.messages.requests[0]
    assert first["model"] == "scripted" and first["tools"] == example.TOOLS
    assert first["messages"] == [{"role": "user", "content": "sum 0..4"}]

    # The write really happened: read the file back over REST.
    assert client.read_file(session_id, "work/sum.py").decode() == SCRIPT
    assert client.read_file(session_id, "work/result.txt").decode() == "sum 10\n"

    res = results_of(messages)
    assert set(res) == {"tu1", "tu2", "tu3", "tu4", "tu5", "tu6", "tu7"}
    assert res["tu1"]["content"].startswith("wrote work/sum.py (") and not res["tu1"]["is_error"]
    # cd and export persisted from tu2 to tu3 (the persistent shell).
    head, _, body = res["tu3"]["content"].partition("\n---\n")
    assert head.split("\n")[0] == "exit=0" and head.endswith("/work")
    assert body == "sum 10\n"
    assert res["tu4"]["content"] == "sum 10\n"
    assert res["tu5"] == {"type": "tool_result", "tool_use_id": "tu5",
                          "content": "error: no such file: missing.txt", "is_error": True}
    # A failing command is a result for the model to read, not a tool error.
    assert res["tu6"]["content"].startswith("exit=7\n") and res["tu6"]["content"].endswith("---\noops\n")
    assert not res["tu6"]["is_error"]
    assert res["tu7"]["is_error"] and "missing argument 'cmd'" in res["tu7"]["content"]
    # All results of one turn go back in one user message, after the assistant's turn.
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user", "assistant", "user", "assistant"]


def test_requests_pass_through_the_real_sdk(client: SessionsClient, session_id: str) -> None:
    """The same loop with anthropic.Anthropic over a mock transport: every request body is valid JSON
    of the Messages API's shape, with the tool_result blocks where the API wants them."""
    responses = script()
    bodies: List[Dict[str, Any]] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        assert request.url.path == "/v1/messages"
        bodies.append(json.loads(request.content))
        return httpx2.Response(200, json=responses.pop(0).model_dump(mode="json", exclude_none=True))

    real = anthropic.Anthropic(api_key="test-key", base_url="http://anthropic.invalid",
                               http_client=httpx2.Client(transport=httpx2.MockTransport(handler)), max_retries=0)
    text, _ = example.run_agent(real, example.Sandbox(client, session_id), "sum 0..4", model="scripted")
    assert text == "The sum of 0..4 is 10."
    assert len(bodies) == 4
    last = bodies[-1]
    assert last["tools"] == example.TOOLS and last["system"] == example.SYSTEM
    assistant = last["messages"][1]
    assert assistant["role"] == "assistant"
    assert assistant["content"][1]["type"] == "tool_use" and assistant["content"][1]["id"] == "tu1"
    tool_results = last["messages"][4]["content"]
    assert [b["tool_use_id"] for b in tool_results] == ["tu2", "tu3"]
    assert tool_results[1]["content"].endswith("---\nsum 10\n")


def test_tool_schemas_match_the_tools() -> None:
    assert [t["name"] for t in example.TOOLS] == ["exec", "write_file", "read_file"]
    for t in example.TOOLS:
        schema = t["input_schema"]
        assert schema["type"] == "object" and set(schema["required"]) <= set(schema["properties"])
