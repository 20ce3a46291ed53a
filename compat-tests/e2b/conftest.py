"""Fixtures: a real sandgate gateway that E2B's SDKs, unchanged, talk to.

The gateway is started by ``start_gateway`` from ``sdk-python/tests/conftest.py``
(loaded under another module name), with the ``workdir`` sandbox driver, whose
sandboxes run the host's ``python3`` (the plot test needs matplotlib there).
Its binary comes from ``$SANDGATE_BIN`` or ``go build``, as in the SDK suite.
The SDKs find it through the three variables docs/compat.md names:
E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY, set here for the whole run.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Iterator

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def load(path: Path, name: str) -> ModuleType:
    """Import a file under a module name of our choosing."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


sdk_fixtures = load(REPO_ROOT / "sdk-python" / "tests" / "conftest.py", "sandgate_sdk_test_fixtures")
scratch = sdk_fixtures.scratch
sandgate_bin = sdk_fixtures.sandgate_bin
fail_or_skip = sdk_fixtures.fail_or_skip

# The variables E2B's SDKs read; the run sets its own and clears the others.
E2B_VARS = ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY", "E2B_DOMAIN", "E2B_DEBUG", "E2B_ACCESS_TOKEN")


@pytest.fixture(scope="session")
def gateway(sandgate_bin: str, scratch: Path) -> Iterator["sdk_fixtures.Gateway"]:
    main, other = secrets.token_hex(16), secrets.token_hex(16)
    gw = sdk_fixtures.start_gateway(
        sandgate_bin, scratch, "--sandbox", "workdir", "--rate-limit", "100000", keys=[main, f"other:{other}"]
    )
    gw.other_token = other
    try:
        yield gw
    finally:
        gw.stop()


@pytest.fixture(scope="session", autouse=True)
def e2b_env(gateway) -> Iterator[None]:
    """Point E2B's SDKs at the gateway, as a user does (docs/compat.md)."""
    saved = {k: os.environ.get(k) for k in E2B_VARS}
    for k in E2B_VARS:
        os.environ.pop(k, None)
    os.environ["E2B_API_URL"] = gateway.url + "/compat/e2b"
    os.environ["E2B_SANDBOX_URL"] = gateway.url + "/compat/e2b/sandbox"
    os.environ["E2B_API_KEY"] = gateway.token
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# The PATH a sandbox's processes start with (sandbox/process.go).
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@pytest.fixture(scope="session")
def matplotlib_on_host() -> None:
    """The workdir driver's sandboxes run the host's python3, found on the
    sandboxes' default PATH (not this process's: a pyenv shim on it is not
    what a sandbox runs): the plot needs matplotlib there."""
    res = subprocess.run(
        ["/bin/sh", "-c", "python3 -c 'import matplotlib'"],
        capture_output=True,
        text=True,
        env={"PATH": SANDBOX_PATH},
    )
    if res.returncode != 0:
        fail_or_skip(
            "the host's python3 has no matplotlib (the workdir sandboxes run it): "
            "apt-get install python3-matplotlib to run the plot test"
        )
