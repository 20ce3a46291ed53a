"""``make example-offline`` (examples/offline.py) as a user runs it: every
example's main.py against the local fake model API, no key, no network."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
from conftest import EXAMPLES

from sandbox_sessions_sdk import SessionNotFoundError, SessionsClient


def offline(env_extra: dict, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_", "SANDBOX_API_"))}
    env.update(env_extra)
    return subprocess.run([sys.executable, str(EXAMPLES / "offline.py"), *args], env=env,
                          capture_output=True, text=True, timeout=300)


def test_offline_starts_its_own_gateway(sandgate_bin: str) -> None:
    res = offline({"SANDGATE_BIN": sandgate_bin})
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("hello from the sandbox") == 3, res.stdout
    for name in ("openai-agents", "openai-sandbox-agent", "claude-tool-use"):
        assert f"== {name}:" in res.stdout
    assert res.stderr.count("session sbx-") == 3


def test_offline_on_a_given_gateway(gateway: Any, client: SessionsClient) -> None:
    res = offline({"SANDBOX_API_URL": gateway.url, "SANDBOX_API_TOKEN": gateway.token,
                   "SANDGATE_BIN": "/nonexistent"}, "claude-tool-use", "--task", "say hi")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "hello from the sandbox" in res.stdout and "'say hi'" in res.stdout
    sid = res.stderr.split("session ", 1)[1].split()[0]
    with pytest.raises(SessionNotFoundError):
        client.get_session(sid)


def test_offline_rejects_an_unknown_example() -> None:
    res = offline({}, "nope")
    assert res.returncode == 2 and "unknown example 'nope'" in res.stderr
