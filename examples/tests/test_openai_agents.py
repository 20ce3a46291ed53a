"""examples/openai-agents against a real gateway, with a scripted model.

``ScriptedModel`` is an Agents SDK ``Model``: each turn it returns the next
scripted list of function calls (then a final message), and it records the
input the runner gives it, so the test sees the tool results the real tools
produced in the sandbox. No API key, no network.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, List

import pytest
from agents import ModelResponse, Usage, set_tracing_disabled
from agents.models.interface import Model
from conftest import EXAMPLES, load
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

from sandbox_sessions_sdk import SessionsClient

# No trace export (it would want OPENAI_API_KEY and the network).
set_tracing_disabled(True)

example = load(EXAMPLES / "openai-agents" / "main.py", "example_openai_agents")


def call(call_id: str, name: str, **args: Any) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        id=f"fc_{call_id}", call_id=call_id, type="function_call", name=name, arguments=json.dumps(args)
    )


def message(text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id="msg_final",
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


class ScriptedModel(Model):
    def __init__(self, turns: List[List[Any]]) -> None:
        self.turns = list(turns)
        self.inputs: List[Any] = []
        self.tool_names: List[List[str]] = []

    async def get_response(self, system_instructions, input, model_settings, tools, output_schema, handoffs,
                           tracing, *, previous_response_id=None, conversation_id=None, prompt=None, **kwargs):
        self.inputs.append(input)
        self.tool_names.append([t.name for t in tools])
        return ModelResponse(output=self.turns.pop(0), usage=Usage(), response_id=None)

    def stream_response(self, *args, **kwargs):
        raise NotImplementedError("the example does not stream")

    def tool_outputs(self) -> dict:
        """call_id -> output of every function_call_output the model was sent."""
        out = {}
        for inp in self.inputs:
            for item in inp if isinstance(inp, list) else []:
                if isinstance(item, dict) and item.get("type") == "function_call_output":
                    out[item["call_id"]] = item["output"]
        return out


SCRIPT = "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        print(a)\n        a, b = b, a + b\n\nfib(10)\n"


def test_agent_runs_its_tools_in_the_sandbox(client: SessionsClient, session_id: str) -> None:
    model = ScriptedModel([
        [call("c1", "write_file", path="proj/fib.py", content=SCRIPT)],
        # Two calls in one turn, and state that has to persist in the shell between them.
        [call("c2", "exec", cmd="cd proj && export GREETING=hi && python3 fib.py | tail -n 1")],
        [call("c3", "exec", cmd="echo $GREETING from $(basename $PWD); python3 fib.py > out.txt; exit_me() { return 3; }; exit_me", timeout_ms=10000)],
        [call("c4", "read_file", path="proj/out.txt"), call("c5", "read_file", path="nope.txt")],
        [message("fib.py prints the first 10 fibonacci numbers")],
    ])
    sandbox = example.Sandbox(client, session_id)
    final = asyncio.run(example.run_task(sandbox, "write and run fib.py", model=model))
    assert final == "fib.py prints the first 10 fibonacci numbers"
    assert model.tool_names[0] == ["exec", "write_file", "read_file"]

    # The file really is in the sandbox: read it back over REST.
    assert client.read_file(session_id, "proj/fib.py").decode() == SCRIPT
    assert client.read_file(session_id, "proj/out.txt").decode().split() == [str(n) for n in (0, 1, 1, 2, 3, 5, 8, 13, 21, 34)]

    out = model.tool_outputs()
    assert out["c1"].startswith("wrote proj/fib.py (")
    head, _, body = out["c2"].partition("\n---\n")
    assert head.splitlines()[0] == "exit=0"
    assert head.splitlines()[1].startswith("cwd=") and head.endswith("/proj")
    assert body.strip() == "34"
    # cd and export persisted from c2 to c3; the exit code is the last command's.
    head, _, body = out["c3"].partition("\n---\n")
    assert head.splitlines()[0] == "exit=3"
    assert body.strip() == "hi from proj"
    assert out["c4"].split() == [str(n) for n in (0, 1, 1, 2, 3, 5, 8, 13, 21, 34)]
    assert out["c5"] == "error: no such file: nope.txt"


def test_exec_timeout_is_reported_and_the_shell_survives(client: SessionsClient, session_id: str) -> None:
    sandbox = example.Sandbox(client, session_id)
    assert sandbox.exec("mkdir -p d && cd d && export KEEP=1").startswith("exit=0\n")
    res = sandbox.exec("echo started; sleep 30", timeout_ms=1000)
    assert res.startswith("exit=124\n"), res
    assert "started" in res and "[timed out after 1s" in res
    after = sandbox.exec("echo $KEEP; pwd")
    assert after.startswith("exit=0\n") and after.split("---\n", 1)[1].split() == ["1", after.split("cwd=", 1)[1].split("\n")[0]]


def test_stderr_comes_back_too(client: SessionsClient, session_id: str) -> None:
    res = example.Sandbox(client, session_id).exec("echo out; echo err >&2; false")
    assert res.startswith("exit=1\n")
    assert res.split("---\n", 1)[1] == "out\nerr\n"


@pytest.mark.parametrize("name", ["exec", "write_file", "read_file"])
def test_tool_schemas(name: str) -> None:
    tool = {t.name: t for t in example.make_agent().tools}[name]
    assert tool.description
    assert "ctx" not in json.dumps(tool.params_json_schema)
