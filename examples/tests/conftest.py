"""Fixtures: a real sandgate gateway (the SDK suite's helpers) and a session on it.

The gateway is started by ``start_gateway`` from ``sdk-python/tests/conftest.py``
(loaded under another module name), with the ``workdir`` sandbox driver. Its
binary comes from ``$SANDGATE_BIN`` or ``go build``, as in the SDK suite.
"""

from __future__ import annotations

import importlib.util
import secrets
import sys
from pathlib import Path
from types import ModuleType
from typing import Iterator

import pytest

from sandbox_sessions_sdk import SessionNotFoundError, SessionsClient

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = REPO_ROOT / "examples"


def load(path: Path, name: str) -> ModuleType:
    """Import a file under a module name of our choosing (both examples are main.py)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


sdk_fixtures = load(REPO_ROOT / "sdk-python" / "tests" / "conftest.py", "sandgate_sdk_test_fixtures")
scratch = sdk_fixtures.scratch
sandgate_bin = sdk_fixtures.sandgate_bin


@pytest.fixture(scope="session")
def gateway(sandgate_bin: str, scratch: Path) -> Iterator["sdk_fixtures.Gateway"]:
    gw = sdk_fixtures.start_gateway(
        sandgate_bin, scratch, "--sandbox", "workdir", "--rate-limit", "100000", keys=[secrets.token_hex(16)]
    )
    try:
        yield gw
    finally:
        gw.stop()


@pytest.fixture
def client(gateway) -> Iterator[SessionsClient]:
    with SessionsClient(api_url=gateway.url, bearer_token=gateway.token) as c:
        yield c


@pytest.fixture
def session_id(client: SessionsClient) -> Iterator[str]:
    s = client.create_session(ttl=600, metadata={"test": "examples"})
    try:
        yield s.session_id
    finally:
        try:
            client.delete_session(s.session_id)
        except SessionNotFoundError:
            pass
