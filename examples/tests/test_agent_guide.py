"""docs/agent-guide.md: its in-repo links resolve, and the state rules it
states for persistent shells hold on the real gateway."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import REPO_ROOT

from sandbox_sessions_sdk import SessionsClient

DOCS = [
    REPO_ROOT / "docs" / "agent-guide.md",
    REPO_ROOT / "examples" / "README.md",
    REPO_ROOT / "examples" / "openai-agents" / "README.md",
    REPO_ROOT / "examples" / "claude-tool-use" / "README.md",
]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_links_stay_in_the_repo_and_resolve(doc: Path) -> None:
    text = doc.read_text()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith("https://pypi.org/"):
            continue
        assert not re.match(r"[a-z]+:", target), f"{doc.name}: external link {target}"
        path = target.split("#", 1)[0]
        if path:
            assert (doc.parent / path).exists(), f"{doc.name}: broken link {target}"


def test_shell_state_across_a_timeout(client: SessionsClient, session_id: str) -> None:
    sh = client.shell(session_id, "guide")
    sh.run("mkdir -p d && cd d && export KEPT=1 && PLAIN=2 && f() { echo fn; }")
    assert sh.run("echo $KEPT $PLAIN; f").stdout == "1 2\nfn\n"
    res = sh.run("sleep 30", timeout=1)
    assert res.timed_out and res.exit_code == 124
    after = sh.run("echo ${KEPT:-none} ${PLAIN:-none}; f; basename $PWD")
    assert after.stdout == "1 none\nfn\nd\n"


def test_one_off_commands_keep_only_files(client: SessionsClient, session_id: str) -> None:
    client.run(session_id, "mkdir -p e && cd e && export X=1 && echo data > e.txt")
    res = client.run(session_id, "echo ${X:-unset}; cat e/e.txt")
    assert res.stdout == "unset\ndata\n"
