"""E2B's code interpreter flows with ``e2b-code-interpreter``, unchanged, against sandgate."""

from __future__ import annotations

import asyncio
import base64

import pytest
from e2b_code_interpreter import AsyncSandbox, Sandbox

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def sandbox():
    sb = Sandbox.create()
    try:
        yield sb
    finally:
        sb.kill()


def test_state_persists(sandbox: Sandbox) -> None:
    first = sandbox.run_code("x = 1")
    assert first.error is None
    assert first.results == []
    assert sandbox.run_code("x + 1").text == "2"


def test_streams_and_callbacks(sandbox: Sandbox) -> None:
    out: list[str] = []
    err: list[str] = []
    ex = sandbox.run_code(
        "import sys\nprint('to stdout')\nprint('to stderr', file=sys.stderr)",
        on_stdout=lambda m: out.append(m.line),
        on_stderr=lambda m: err.append(m.line),
    )
    assert "".join(ex.logs.stdout) == "to stdout\n"
    assert "".join(ex.logs.stderr) == "to stderr\n"
    assert "".join(out) == "to stdout\n" and "".join(err) == "to stderr\n"


def test_error_traceback(sandbox: Sandbox) -> None:
    ex = sandbox.run_code("def f():\n    return 1 / 0\nf()")
    assert ex.error is not None
    assert ex.error.name == "ZeroDivisionError"
    assert ex.error.value == "division by zero"
    assert "Traceback (most recent call last)" in ex.error.traceback
    assert "return 1 / 0" in ex.error.traceback


def test_rich_results(sandbox: Sandbox) -> None:
    ex = sandbox.run_code(
        "class Rich:\n"
        "    def _repr_html_(self): return '<b>rich</b>'\n"
        "    def _repr_markdown_(self): return '**rich**'\n"
        "    def __repr__(self): return 'Rich()'\n"
        "Rich()"
    )
    [main] = ex.results
    assert main.is_main_result
    assert (main.text, main.html, main.markdown) == ("Rich()", "<b>rich</b>", "**rich**")
    shown = sandbox.run_code("display(Rich())")
    assert [r.html for r in shown.results] == ["<b>rich</b>"]
    assert not shown.results[0].is_main_result


def test_matplotlib_png(sandbox: Sandbox, matplotlib_on_host: None) -> None:
    ex = sandbox.run_code(
        "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.title('squares')\nplt.show()"
    )
    assert ex.error is None, ex.error
    pngs = [r.png for r in ex.results if r.png]
    assert len(pngs) == 1, ex.results
    assert base64.b64decode(pngs[0]).startswith(PNG_MAGIC)


def test_contexts_and_bash(sandbox: Sandbox) -> None:
    ctx = sandbox.create_code_context(cwd="/tmp")
    try:
        assert ctx.id in [c.id for c in sandbox.list_code_contexts()]
        assert sandbox.run_code("import os\nos.getcwd()", context=ctx).text == "'/tmp'"
        sandbox.run_code("y = 41", context=ctx)
        assert sandbox.run_code("y + 1", context=ctx).text == "42"
        # Contexts are separate kernels.
        assert sandbox.run_code("y").error.name == "NameError"
        sandbox.restart_code_context(ctx)
        assert sandbox.run_code("y", context=ctx).error.name == "NameError"
    finally:
        sandbox.remove_code_context(ctx)
    assert ctx.id not in [c.id for c in sandbox.list_code_contexts()]
    bash = sandbox.run_code("echo from bash; X=5; echo $((X * 2))", language="bash")
    assert "".join(bash.logs.stdout) == "from bash\n10\n"
    failed = sandbox.run_code("exit 3", language="bash")
    assert failed.error is not None and "3" in failed.error.value


def test_unsupported_language(sandbox: Sandbox) -> None:
    with pytest.raises(Exception) as e:
        sandbox.run_code("console.log(1)", language="js")
    assert "unsupported_language" in str(e.value) or "not supported" in str(e.value)


def test_async_interpreter() -> None:
    async def flow() -> None:
        sb = await AsyncSandbox.create()
        try:
            assert (await sb.run_code("x = 1")).error is None
            assert (await sb.run_code("x + 1")).text == "2"
            err = (await sb.run_code("raise ValueError('bad')")).error
            assert err.name == "ValueError" and "Traceback" in err.traceback
        finally:
            await sb.kill()

    asyncio.run(flow())


def test_async_matplotlib_png(matplotlib_on_host: None) -> None:
    async def flow() -> None:
        sb = await AsyncSandbox.create()
        try:
            plot = await sb.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()")
            assert [base64.b64decode(r.png)[:8] for r in plot.results if r.png] == [PNG_MAGIC]
        finally:
            await sb.kill()

    asyncio.run(flow())


def test_create_envs_reach_the_kernel() -> None:
    sb = Sandbox.create(envs={"E2B_SUITE_VAR": "from-create"})
    try:
        assert sb.run_code("import os\nos.environ['E2B_SUITE_VAR']").text == "'from-create'"
        assert sb.run_code("import os\nos.environ['ONE']", envs={"ONE": "1"}).text == "'1'"
        assert sb.run_code("import os\nos.environ.get('ONE')").text is None
    finally:
        sb.kill()
