"""docs/sdk.md's table: every operation of the REST API, a method (or the
reason there is none) in Python sync, Python async and TypeScript, and the
Python methods it names exist (sdk-typescript/test/docs.test.ts checks the
TypeScript ones)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import List

from sandbox_sessions_sdk import AsyncSessionsClient, SessionsClient

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "sdk.md").read_text()
SPEC = (REPO / "api-spec" / "sandbox-api-spec.yaml").read_text()


def table_rows() -> List[List[str]]:
    section = DOC.split("## Every operation of the REST API", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [[cell.strip() for cell in row.strip().strip("|").split(" | ")] for row in rows]


def test_every_operation_has_a_row() -> None:
    ops = re.findall(r"^\s+operationId:\s*(\w+)", SPEC, re.M)
    assert ops
    names = " ".join(row[0] for row in table_rows())
    listed = set(re.findall(r"\((\w+)\*?\)", names))
    prefixes = [p for p in re.findall(r"\((\w+)\*\)", names)]
    missing = [op for op in ops if op not in listed and not any(op.startswith(p) for p in prefixes)]
    assert not missing, f"operations without a row in docs/sdk.md: {missing}"


def test_no_empty_cell() -> None:
    for row in table_rows():
        assert len(row) == 4, f"a row of docs/sdk.md has {len(row)} cells: {row}"
        for cell in row:
            assert cell, f"an empty cell in docs/sdk.md: {row}"


def test_python_methods_exist() -> None:
    for row in table_rows():
        for col, cls in ((1, SessionsClient), (2, AsyncSessionsClient)):
            for name in re.findall(r"`(?:await )?c\.(\w+)\(", row[col]):
                assert hasattr(cls, name), f"docs/sdk.md names {cls.__name__}.{name}, which does not exist ({row[0]})"
