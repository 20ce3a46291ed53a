"""The Paramiko version check, the one home of Paramiko's private API, and CommandResult.

No gateway needed.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from pathlib import Path
from typing import Dict, List

import paramiko
import pytest
from conftest import SDK_ROOT

from sandbox_sessions_sdk import (
    CommandResult,
    SandboxAPIError,
    SessionSSHClient,
    UnsupportedParamikoError,
    _paramiko_compat,
)

PACKAGE = SDK_ROOT / "src" / "sandbox_sessions_sdk"

# Paramiko internals the SDK uses; only _paramiko_compat.py may name them.
PRIVATE = {
    "_handle_request",
    "_channel_handler_table",
    "_send_user_message",
    "_request",
    "_async_request",
    "_async_response",
    "_read_response",
    "_convert_status",
}


def test_installed_paramiko_is_supported() -> None:
    assert _paramiko_compat.problem() is None, _paramiko_compat.problem()
    _paramiko_compat.check()


@pytest.mark.parametrize("version", ["3.5.0", "3.5.1", "4.0.0", "5.1.0", "5.99.3"])
def test_versions_in_range(version: str) -> None:
    assert _paramiko_compat.problem(version) is None


@pytest.mark.parametrize("version", ["3.4.1", "3.0.0", "2.12.0", "6.0.0", "10.1", "", "dev"])
def test_versions_out_of_range(version: str) -> None:
    assert _paramiko_compat.problem(version) is not None


def test_range_matches_pyproject() -> None:
    text = (SDK_ROOT / "pyproject.toml").read_text()
    assert f'"paramiko{_paramiko_compat.SUPPORTED}"' in text


def _pinned_paramiko(requirements: str) -> str:
    m = re.search(r"^paramiko==(\S+)$", (SDK_ROOT / requirements).read_text(), re.M)
    assert m is not None, requirements
    return m.group(1)


def test_ci_pins_both_ends_of_the_range() -> None:
    oldest, newest = _pinned_paramiko("requirements-oldest.txt"), _pinned_paramiko("requirements-test.txt")
    assert _paramiko_compat.problem(oldest) is None and _paramiko_compat.problem(newest) is None
    assert oldest.startswith("%d.%d." % _paramiko_compat._OLDEST)
    assert int(newest.split(".")[0]) == _paramiko_compat._BEYOND[0] - 1


def test_unsupported_paramiko_fails_connect_before_any_io(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(paramiko, "__version__", "6.0.0")
    # Port 1 refuses connections: a SandboxConnectionError would mean the check came too late.
    c = SessionSSHClient("http://127.0.0.1:1", "t", "sbx-1", "sandbox", host_key_policy=paramiko.RejectPolicy())
    with pytest.raises(UnsupportedParamikoError) as exc:
        c.connect()
    e = exc.value
    assert isinstance(e, SandboxAPIError) and isinstance(e, RuntimeError)
    assert e.found == "6.0.0" and e.supported == ">=3.5,<6"
    assert "paramiko>=3.5,<6" in str(e) and "6.0.0" in str(e)
    assert not c.connected


def test_missing_private_name_is_unsupported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(paramiko.SFTPClient, "_async_request")
    why = _paramiko_compat.problem()
    assert why is not None and "SFTPClient._async_request" in why
    with pytest.raises(UnsupportedParamikoError, match="SFTPClient._async_request"):
        _paramiko_compat.check()


def _private_uses(path: Path) -> List[str]:
    """Private Paramiko names a module uses: attributes of anything but self, and method or class attribute names."""
    uses = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr in PRIVATE:
            if not (isinstance(node.value, ast.Name) and node.value.id == "self"):
                uses.append(f"{path.name}:{node.lineno}: .{node.attr}")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in PRIVATE - {"_request"}:
            uses.append(f"{path.name}:{node.lineno}: def {node.name}")
        elif isinstance(node, ast.Name) and node.id in PRIVATE:
            uses.append(f"{path.name}:{node.lineno}: {node.id}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in PRIVATE:
            uses.append(f"{path.name}:{node.lineno}: {node.value!r}")
    return uses


def test_private_paramiko_api_only_in_compat_module() -> None:
    modules = sorted(PACKAGE.glob("*.py"))
    assert len(modules) > 5
    uses = [u for p in modules if p.name != "_paramiko_compat.py" for u in _private_uses(p)]
    assert uses == []
    # The scan finds them where they are.
    found = {u.rsplit(" ", 1)[-1].lstrip(".") for u in _private_uses(PACKAGE / "_paramiko_compat.py")}
    assert PRIVATE <= {re.sub(r"^def |'", "", f) for f in found}


def test_command_result() -> None:
    r = CommandResult(stdout="out\n", stderr="err\n", exit_code=7, exit_signal=None)
    # attributes
    assert (r.stdout, r.stderr, r.exit_code, r.exit_signal) == ("out\n", "err\n", 7, None)
    # the dict it used to be
    assert r["stdout"] == "out\n" and r["exit_code"] == 7 and r["exit_signal"] is None
    assert r.get("stderr") == "err\n" and r.get("nope") is None and r.get("nope", 1) == 1
    assert "stdout" in r and "nope" not in r
    assert list(r) == list(r.keys()) == ["stdout", "stderr", "exit_code", "exit_signal", "truncated"]
    assert len(r) == 5 and r["truncated"] is False and r.truncated is False
    d: Dict[str, object] = {
        "stdout": "out\n",
        "stderr": "err\n",
        "exit_code": 7,
        "exit_signal": None,
        "truncated": False,
    }
    assert dict(r) == d and dict(r.items()) == d
    assert r == d and d == r and r != {**d, "exit_code": 0} and r != {**d, "extra": 1}
    assert r != {k: v for k, v in d.items() if k != "truncated"}  # a dict compares all five keys
    assert r == CommandResult("out\n", "err\n", 7, None) and r != CommandResult("out\n", "err\n", 7, "KILL")
    assert r != CommandResult("out\n", "err\n", 7, None, truncated=True)
    assert hash(r) == hash(CommandResult("out\n", "err\n", 7))
    # asdict has every field, the REST ones (timed_out, cwd, duration_ms, state_lost) too
    assert json.loads(json.dumps(dataclasses.asdict(r))) == {**d, "timed_out": False, "cwd": None, "duration_ms": None, "state_lost": False}
    with pytest.raises(KeyError):
        r["nope"]
    # frozen
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.exit_code = 0  # type: ignore[misc]
    assert "exit_code=7" in repr(r)
