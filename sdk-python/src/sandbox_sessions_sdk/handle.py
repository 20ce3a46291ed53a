"""A session handle shaped like seed 003's (Sandkasten's) ``Session``.

Its example wires a sandbox into an agent framework with one object per
session that runs commands in a persistent shell, writes and reads files,
and is destroyed at the end::

    sessions = AsyncSessionsClient()                   # $SANDBOX_API_URL, $SANDBOX_API_TOKEN
    session = await sessions.open_session(ttl=1800)    # create_session's arguments
    result = await session.exec("cd proj && ls", timeout_ms=30000)
    print(result.exit_code, result.cwd, result.output)
    await session.write("proj/fib.py", "print(1)")
    data = await session.read("proj/fib.py")           # bytes
    await session.destroy()

:class:`SessionHandle` is the same for :class:`~sandbox_sessions_sdk.SessionsClient`
(plain calls). ``exec`` runs in the session's persistent shell named
``default`` (``cd``, exported variables and functions carry over), ``write``
and ``read`` use the files API (paths relative to the workspace),
``run_python`` the session's Python kernel, ``destroy`` deletes the session.
Every method is one call of the client the handle came from, whose
methods stay available for the rest (``handle.client``, ``handle.id``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Union

from .errors import SessionNotFoundError
from .models import CommandResult, PythonResult, Session

if TYPE_CHECKING:  # pragma: no cover
    from .aio import AsyncSessionsClient
    from .client import SessionsClient

__all__ = ["ExecResult", "SessionHandle", "AsyncSessionHandle"]

#: The persistent shell a handle's ``exec`` runs in.
SHELL = "default"


@dataclass(frozen=True)
class ExecResult:
    """A command's result, in seed 003's shape.

    Attributes:
        exit_code: The command's exit status (124: it passed its timeout and
            was killed; the shell keeps its directory and exported variables).
        cwd: The shell's directory after the command.
        output: What the command wrote, standard output then standard error.
        truncated: An output stream was longer than the gateway keeps.
        duration_ms: How long it ran.
        stdout, stderr: The two streams apart.
    """

    exit_code: int
    cwd: str
    output: str
    truncated: bool
    duration_ms: int
    stdout: str = ""
    stderr: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def _exec_result(res: CommandResult) -> ExecResult:
    output = res.stdout
    if res.stderr:
        output += ("" if not output or output.endswith("\n") else "\n") + res.stderr
    return ExecResult(
        exit_code=res.exit_code,
        cwd=res.cwd or "",
        output=output,
        truncated=res.truncated,
        duration_ms=res.duration_ms or 0,
        stdout=res.stdout,
        stderr=res.stderr,
    )


def _timeout(timeout_ms: Optional[int]) -> Optional[float]:
    if timeout_ms is None:
        return None
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, (int, float)):
        raise TypeError(f"timeout_ms must be a number of milliseconds, got {type(timeout_ms).__name__}")
    if timeout_ms <= 0:
        raise ValueError("timeout_ms must be above 0")
    return timeout_ms / 1000.0


class SessionHandle:
    """One session of a :class:`~sandbox_sessions_sdk.SessionsClient`, as seed
    003's ``Session`` (see the module's docstring)."""

    def __init__(self, client: "SessionsClient", session_id: str, session: Optional[Session] = None) -> None:
        self.client = client
        self.id = session_id
        #: The Session the create or get answered (None when made from an id alone).
        self.session = session

    @property
    def session_id(self) -> str:
        return self.id

    def __repr__(self) -> str:
        return f"SessionHandle(id={self.id!r})"

    def __enter__(self) -> "SessionHandle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.destroy()

    def exec(self, cmd: str, timeout_ms: Optional[int] = 30000) -> ExecResult:
        """Run *cmd* in the session's persistent shell (``cd``, ``export``... carry over)."""
        return _exec_result(self.client.run(self.id, cmd, shell=SHELL, timeout=_timeout(timeout_ms)))

    def write(self, path: str, content: Union[str, bytes]) -> None:
        """Write *content* to *path* (relative to the workspace; parent directories are made)."""
        self.client.write_file(self.id, path, content)

    def read(self, path: str, max_bytes: Optional[int] = None) -> bytes:
        """The file's bytes (at most *max_bytes*)."""
        return self.client.read_file(self.id, path, max_bytes=max_bytes)

    def run_python(self, code: str, **options: Any) -> PythonResult:
        """:meth:`SessionsClient.run_python` in this session."""
        return self.client.run_python(self.id, code, **options)

    def info(self) -> Session:
        """The session now (``GET /v1/sessions/{id}``)."""
        self.session = self.client.get_session(self.id)
        return self.session

    def destroy(self) -> None:
        """Delete the session and everything in it; a session already gone is no error."""
        try:
            self.client.delete_session(self.id)
        except SessionNotFoundError:
            pass


class AsyncSessionHandle:
    """:class:`SessionHandle` for :class:`~sandbox_sessions_sdk.AsyncSessionsClient`:
    the same methods, as coroutines."""

    def __init__(self, client: "AsyncSessionsClient", session_id: str, session: Optional[Session] = None) -> None:
        self.client = client
        self.id = session_id
        self.session = session

    @property
    def session_id(self) -> str:
        return self.id

    def __repr__(self) -> str:
        return f"AsyncSessionHandle(id={self.id!r})"

    async def __aenter__(self) -> "AsyncSessionHandle":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.destroy()

    async def exec(self, cmd: str, timeout_ms: Optional[int] = 30000) -> ExecResult:
        """:meth:`SessionHandle.exec`."""
        return _exec_result(await self.client.run(self.id, cmd, shell=SHELL, timeout=_timeout(timeout_ms)))

    async def write(self, path: str, content: Union[str, bytes]) -> None:
        """:meth:`SessionHandle.write`."""
        await self.client.write_file(self.id, path, content)

    async def read(self, path: str, max_bytes: Optional[int] = None) -> bytes:
        """:meth:`SessionHandle.read`."""
        return await self.client.read_file(self.id, path, max_bytes=max_bytes)

    async def run_python(self, code: str, **options: Any) -> PythonResult:
        """:meth:`SessionHandle.run_python`."""
        return await self.client.run_python(self.id, code, **options)

    async def info(self) -> Session:
        """:meth:`SessionHandle.info`."""
        self.session = await self.client.get_session(self.id)
        return self.session

    async def destroy(self) -> None:
        """:meth:`SessionHandle.destroy`."""
        try:
            await self.client.delete_session(self.id)
        except SessionNotFoundError:
            pass
