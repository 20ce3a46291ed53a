"""The README's example, run unchanged (only API_URL and TOKEN are set) in a
fresh directory, as its own Python process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import SDK_ROOT, Gateway, start_gateway

from sandbox_sessions_sdk import SessionsClient

EXAMPLE = """\
from sandbox_sessions_sdk import SessionsClient, SessionSSHClient
with SessionsClient(api_url=API_URL, bearer_token=TOKEN) as sessions:
    session = sessions.create_session(ttl=3600, metadata={"project": "demo"})
with SessionSSHClient(api_url=API_URL, bearer_token=TOKEN, session_id=session.session_id, username="sandbox") as ssh:
    res = ssh.run_command("python3 --version"); print(res["stdout"])
    ssh.upload_file("local_script.py", "remote_script.py")
    print(ssh.run_command("python3 remote_script.py")["stdout"])
    ssh.download_file("output.txt", "output.txt")
with SessionsClient(api_url=API_URL, bearer_token=TOKEN) as sessions:
    sessions.delete_session(session.session_id)
"""

LOCAL_SCRIPT = """\
import platform
with open("output.txt", "w") as f:
    f.write("computed in the sandbox: %d\\n" % sum(range(10)))
print("remote script ran on python", platform.python_version())
"""


def test_readme_carries_the_example() -> None:
    assert EXAMPLE in (SDK_ROOT / "README.md").read_text()


def test_example_runs_unchanged(gateway: Gateway, local_dir: Path) -> None:
    (local_dir / "local_script.py").write_text(LOCAL_SCRIPT)
    program = f"API_URL = {gateway.url!r}\nTOKEN = {gateway.token!r}\n" + EXAMPLE
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SDK_ROOT / "src"), env.get("PYTHONPATH")]))
    res = subprocess.run(
        [sys.executable, "-c", program], cwd=local_dir, env=env, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    assert "Python 3." in res.stdout
    assert "remote script ran on python" in res.stdout
    assert (local_dir / "output.txt").read_text() == "computed in the sandbox: 45\n"
    # The example deleted its session.
    with SessionsClient(gateway.url, gateway.token) as c:
        left = [s for s in c.list_sessions(limit=100)["sessions"] if s.metadata == {"project": "demo"}]
    assert left == []


def test_example_warns_once_without_isolation(sandgate_bin: str, scratch: Path, local_dir: Path) -> None:
    """On a gateway that isolates nothing (the workdir driver) the example,
    which uses three clients of one gateway, prints one IsolationWarning."""
    gw = start_gateway(sandgate_bin, scratch, "--sandbox", "workdir")
    try:
        (local_dir / "local_script.py").write_text(LOCAL_SCRIPT)
        program = f"API_URL = {gw.url!r}\nTOKEN = {gw.token!r}\n" + EXAMPLE
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SDK_ROOT / "src"), env.get("PYTHONPATH")]))
        env.pop("PYTHONWARNINGS", None)
        res = subprocess.run(
            [sys.executable, "-c", program], cwd=local_dir, env=env, capture_output=True, text=True, timeout=60
        )
        assert res.returncode == 0, res.stderr
        assert res.stderr.count("IsolationWarning") == 1, res.stderr
    finally:
        gw.stop()
