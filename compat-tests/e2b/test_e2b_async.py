"""E2B's quickstart flows with the async ``e2b`` SDK (AsyncSandbox), unchanged, against sandgate."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from e2b import AsyncSandbox, CommandExitException, SandboxQuery


async def wait_for(cond, what: str, within: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not cond():
        if loop.time() > deadline:
            raise AssertionError("timed out waiting for " + what)
        await asyncio.sleep(0.05)


def test_async_commands() -> None:
    async def flow() -> None:
        sb = await AsyncSandbox.create(metadata={"suite": "e2b-async"})
        try:
            assert (await sb.commands.run("echo hi")).stdout == "hi\n"
            seen: list[str] = []
            handle = await sb.commands.run(
                "for i in 1 2 3; do echo line$i; sleep 0.1; done; sleep 600", background=True, on_stdout=seen.append
            )
            await wait_for(lambda: "line3" in "".join(seen), "the background command's third line")
            assert await sb.commands.kill(handle.pid) is True
            with pytest.raises(CommandExitException):
                await handle.wait()
            assert await sb.commands.kill(handle.pid) is False
        finally:
            await sb.kill()

    asyncio.run(flow())


def test_async_files_and_watch() -> None:
    async def flow() -> None:
        sb = await AsyncSandbox.create()
        try:
            d = "e2b-async-" + uuid.uuid4().hex[:8]
            assert await sb.files.make_dir(d) is True
            events: list = []
            watcher = await sb.files.watch_dir(d, on_event=events.append)
            try:
                await sb.files.write(f"{d}/a.txt", "alpha")
                await wait_for(lambda: any(e.name == "a.txt" for e in events), "a watch event for a.txt")
            finally:
                await watcher.stop()
            assert await sb.files.read(f"{d}/a.txt") == "alpha"
            assert [e.name for e in await sb.files.list(d)] == ["a.txt"]
            await sb.files.rename(f"{d}/a.txt", f"{d}/b.txt")
            assert [e.name for e in await sb.files.list(d)] == ["b.txt"]
            await sb.files.remove(f"{d}/b.txt")
            assert await sb.files.list(d) == []
        finally:
            await sb.kill()

    asyncio.run(flow())


def test_async_lifecycle() -> None:
    async def flow() -> None:
        tag = uuid.uuid4().hex
        sb = await AsyncSandbox.create(metadata={"tag": tag})
        try:
            await sb.set_timeout(600)
            listed = await AsyncSandbox.list(query=SandboxQuery(metadata={"tag": tag})).next_items()
            assert [s.sandbox_id for s in listed] == [sb.sandbox_id]
            await sb.files.write("kept.txt", "kept")
            assert await sb.pause() is True
            assert (await AsyncSandbox.get_info(sb.sandbox_id)).state == "paused"
            again = await AsyncSandbox.connect(sb.sandbox_id)
            assert (await AsyncSandbox.get_info(sb.sandbox_id)).state == "running"
            assert await again.files.read("kept.txt") == "kept"
        finally:
            assert await sb.kill() is True
        assert await AsyncSandbox.list(query=SandboxQuery(metadata={"tag": tag})).next_items() == []

    asyncio.run(flow())
