"""The OpenAI Agents SDK's own E2BSandboxClient runs a SandboxAgent against sandgate.

A second, independent proof of the facade (issue 40, item 5): the Agents SDK's
E2B integration (agents.extensions.sandbox.e2b), unchanged, creates the sandbox
through /compat/e2b and runs the agent's tools in it through the sandbox URL.
``ScriptedModel`` is an Agents SDK ``Model`` that returns scripted tool calls
and records what the runner sends back: no API key, no network.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any, List

from agents import ModelResponse, RunConfig, Runner, Usage, set_tracing_disabled
from agents.extensions.sandbox.e2b import E2BSandboxClient, E2BSandboxClientOptions
from agents.models.interface import Model
from agents.sandbox import Manifest, SandboxAgent, SandboxRunConfig
from e2b import Sandbox, SandboxQuery
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

set_tracing_disabled(True)  # no trace export: it would want OPENAI_API_KEY and the network


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

    async def get_response(self, system_instructions, input, model_settings, tools, output_schema, handoffs,
                           tracing, *, previous_response_id=None, conversation_id=None, prompt=None, **kwargs):
        self.inputs.append(input)
        return ModelResponse(output=self.turns.pop(0), usage=Usage(), response_id=None)

    def stream_response(self, *args, **kwargs):
        raise NotImplementedError("the test does not stream")

    def tool_outputs(self) -> dict:
        out = {}
        for inp in self.inputs:
            for item in inp if isinstance(inp, list) else []:
                if isinstance(item, dict) and item.get("type") == "function_call_output":
                    out[item["call_id"]] = item["output"]
        return out


def test_sandbox_agent_through_the_e2b_client(tmp_path: Path) -> None:
    # The workdir driver runs commands on the host: the agent's workspace root
    # is a directory of the test's own.
    root = tmp_path / "workspace"
    tag = uuid.uuid4().hex
    model = ScriptedModel([
        [call("c1", "exec_command", cmd="echo 'print(6 * 7)' > answer.py && python3 answer.py")],
        [call("c2", "exec_command", cmd="ls && cat answer.py")],
        [message("the answer is 42")],
    ])
    agent = SandboxAgent(
        name="e2b-agent",
        instructions="Use the sandbox to compute the answer.",
        model=model,
        default_manifest=Manifest(root=str(root)),
    )
    # The client's defaults: on_timeout "pause" (autoPause) with auto_resume.
    options = E2BSandboxClientOptions(sandbox_type="e2b", timeout=600, metadata={"agents": tag})
    config = RunConfig(sandbox=SandboxRunConfig(client=E2BSandboxClient(), options=options))

    result = asyncio.run(Runner.run(agent, "What is 6 times 7?", run_config=config))

    assert result.final_output == "the answer is 42"
    outputs = model.tool_outputs()
    assert "42" in str(outputs["c1"])
    assert "answer.py" in str(outputs["c2"])
    # The file is in the sandbox's workspace, which is the gateway's (workdir): here.
    assert (root / "answer.py").read_text() == "print(6 * 7)\n"
    # The runner ended the sandbox it created.
    assert Sandbox.list(query=SandboxQuery(metadata={"agents": tag})).next_items() == []
