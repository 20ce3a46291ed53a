"""One HTTP stack: the SDK runs on httpx alone (sync and async alike)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"

PROGRAM = r"""
import sys
sys.modules["requests"] = None  # importing requests now fails
import sandbox_sessions_sdk as sdk
from sandbox_sessions_sdk import aio, client, sandbox_client
with sdk.SessionsClient("http://127.0.0.1:9", "t", timeout=5) as c:
    try:
        c.get_session("sbx-aaaaaaaaaaaaaaaaaaaa")
    except sdk.SandboxConnectionError as e:
        assert "cannot reach" in str(e), e
    else:
        raise AssertionError("no error")
assert "requests" not in {m.split(".")[0] for m in sys.modules if sys.modules[m] is not None}
print("ok")
"""


def test_sdk_needs_no_requests() -> None:
    env = dict(os.environ, PYTHONPATH=str(SRC))
    out = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_pyproject_lists_no_requests_dependency() -> None:
    text = (SRC.parent / "pyproject.toml").read_text()
    deps = text.split("dependencies = [", 1)[1].split("]", 1)[0]
    assert "httpx" in deps and "requests" not in deps
