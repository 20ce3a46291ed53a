"""The asyncio clients: AsyncSessionsClient (REST over httpx) and
AsyncSessionSSHClient (the Paramiko SSH client in worker threads).

They take the same arguments and have the same methods as
:class:`SessionsClient` and :class:`SessionSSHClient`, as coroutines; the
argument checks, request building, answer parsing, error mapping and retry
rules are the sync client's own (``_rest``, ``_common``, ``_dataplane``):
only the I/O differs (``httpx.AsyncClient`` for ``httpx.Client``). Cancelling a call (a
cancelled task, ``asyncio.wait_for``'s timeout) cancels what it started
remotely: a REST ``run`` drops its HTTP connection, which kills the command
(unless ``background``); an SSH ``run_command`` kills the command (SSH
``signal`` KILL, then the channel is closed).
"""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from datetime import datetime
from types import TracebackType
from typing import Any, AsyncIterator, BinaryIO, Callable, Dict, List, Mapping, Optional, Sequence, Type, Union

import httpx
import paramiko

from ._common import CREATE_RETRY_DELAYS, VerifySSL, check_idempotency_key, create_session_body, session_path
from ._dataplane import (
    CHUNK_BYTES,
    ChunkCallback,
    FileList,
    NDJSONSplitter,
    check_callback,
    check_shell_name,
    output_params,
    read_headers,
    whole_result,
)
from ._output import DEFAULT_MAX_OUTPUT_BYTES
from ._extra_ops import AsyncExtraOps
from ._rest import (
    DEFAULT,
    TRANSPORT_ERRORS,
    Download,
    FirstBytes,
    Op,
    RestCore,
    RunLines,
    body_error,
    create_retryable,
    empty_file,
    is_ndjson,
    ops,
    shell_missing,
    upload_content,
)
from ._workspaces import preview_url
from .errors import SandboxAPIError, SandboxOperationError
from .handle import AsyncSessionHandle
from ._egress import EgressDecisionPage, EgressEntry, EgressPending, EgressPendingEvent, SSEParser
from .models import (
    AuditEvent,
    AuditPage,
    CommandResult,
    PortLink,
    PythonResult,
    Session,
    SessionStats,
    Snapshot,
    Workspace,
)
from .ssh import CommandCancelled, OutputCallback, PathLike, SessionSSHClient
from .tunnel import DEFAULT_CONNECT_PATH

__all__ = ["AsyncSessionsClient", "AsyncShell", "AsyncNDJSONStream", "AsyncSessionSSHClient"]

#: Pauses before create_session's retries (as the sync client's).
_CREATE_RETRY_DELAYS = CREATE_RETRY_DELAYS

#: The create retry rule (shared with the sync client).
_create_retryable = create_retryable


async def _async_chunks(body: Any) -> AsyncIterator[bytes]:
    """A sync iterable of upload chunks (a file object's), read in a worker thread."""
    it = iter(body)
    done = object()
    while True:
        chunk = await asyncio.to_thread(next, it, done)
        if chunk is done:
            return
        yield chunk


class AsyncSessionsClient(RestCore, AsyncExtraOps):
    """The REST API as coroutines: :class:`SessionsClient`'s methods and
    arguments, over ``httpx.AsyncClient``. Use it as an async context manager::

        async with AsyncSessionsClient(api_url=URL, bearer_token=TOKEN) as sessions:
            session = await sessions.create_session(ttl=600)
            res = await sessions.run(session.session_id, "echo hi")

    Each method is documented on :class:`SessionsClient`; the differences:

    - ``run``'s ``on_stdout`` / ``on_stderr`` are called on the event loop
      (plain functions, not coroutines).
    - ``process_output`` returns an :class:`AsyncNDJSONStream`
      (``async for``; ``async with`` or ``await stream.aclose()``).
    - ``shell`` returns an :class:`AsyncShell`.
    - Cancelling a ``run`` (``task.cancel()``, ``asyncio.wait_for``) closes
      its HTTP connection: the gateway then kills the command with its
      process tree (unless ``background=True``).
    """

    def __init__(
        self,
        api_url: Optional[str] = None,
        bearer_token: Optional[str] = None,
        timeout: float = 30,
        verify_ssl: VerifySSL = True,
    ) -> None:
        self._http = httpx.AsyncClient(**self._setup(api_url, bearer_token, timeout, verify_ssl))

    def __repr__(self) -> str:
        return f"AsyncSessionsClient(api_url={self.api_url!r})"

    async def __aenter__(self) -> "AsyncSessionsClient":
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the underlying HTTP connections. Safe to call twice."""
        await self._http.aclose()

    # -- sessions ------------------------------------------------------------

    async def create_session(
        self,
        ttl: int = 3600,
        image: Optional[str] = None,
        metadata: Optional[Mapping[str, Any]] = None,
        ssh_public_key: Optional[str] = None,
        idempotency_key: Optional[str] = None,
        resources: Optional[Mapping[str, Any]] = None,
        labels: Optional[Mapping[str, Any]] = None,
        egress: Optional[Sequence[EgressEntry]] = None,
        secrets: Optional[Sequence[Any]] = None,
        workspace: Optional[str] = None,
        from_snapshot: Optional[str] = None,
        name: Optional[str] = None,
        egress_mode: Optional[str] = None,
    ) -> Session:
        """:meth:`SessionsClient.create_session` (with the same retries, same key)."""
        body = create_session_body(
            ttl, image, metadata, ssh_public_key, resources, labels, egress, secrets, workspace, from_snapshot, name, egress_mode
        )
        key = check_idempotency_key(idempotency_key) if idempotency_key is not None else str(uuid.uuid4())
        op = ops.create_session(body, key)
        for attempt in range(len(_CREATE_RETRY_DELAYS) + 1):
            try:
                return await self._do(op)
            except SandboxAPIError as e:
                if attempt == len(_CREATE_RETRY_DELAYS) or not _create_retryable(e):
                    raise
            await asyncio.sleep(_CREATE_RETRY_DELAYS[attempt])
        raise AssertionError("unreachable")  # pragma: no cover

    async def open_session(self, **create_args: Any) -> AsyncSessionHandle:
        """:meth:`SessionsClient.open_session`: ``session = await client.open_session(ttl=600)``."""
        session = await self.create_session(**create_args)
        return AsyncSessionHandle(self, session.session_id, session)

    def session(self, session_id: str) -> AsyncSessionHandle:
        """:meth:`SessionsClient.session` (nothing is sent)."""
        session_path(session_id)
        return AsyncSessionHandle(self, session_id)

    async def list_sessions(self, limit: int = 50, offset: int = 0) -> Dict[str, Any]:
        """:meth:`SessionsClient.list_sessions`."""
        return await self._do(ops.list_sessions(limit, offset))

    async def get_session(self, session_id: str) -> Session:
        """:meth:`SessionsClient.get_session`."""
        return await self._do(ops.get_session(session_id))

    async def update_session(
        self, session_id: str, ttl: Optional[int] = None, egress: Optional[Sequence[EgressEntry]] = None
    ) -> Session:
        """:meth:`SessionsClient.update_session`."""
        return await self._do(ops.update_session(session_id, ttl, egress))

    async def delete_session(
        self, session_id: str, keep_workspace: Optional[bool] = None, discard: Optional[bool] = None
    ) -> None:
        """:meth:`SessionsClient.delete_session`."""
        await self._do(ops.delete_session(session_id, keep_workspace, discard))

    async def stop_session(self, session_id: str) -> Session:
        """:meth:`SessionsClient.stop_session`."""
        return await self._do(ops.stop_session(session_id))

    async def pause_session(self, session_id: str) -> Session:
        """:meth:`SessionsClient.pause_session`."""
        return await self._do(ops.pause_session(session_id))

    async def resume_session(self, session_id: str) -> Session:
        """:meth:`SessionsClient.resume_session`."""
        return await self._do(ops.resume_session(session_id))

    async def fork_session(self, session_id: str, count: int = 1) -> List[Session]:
        """:meth:`SessionsClient.fork_session`."""
        return await self._do(ops.fork_session(session_id, count))

    # -- workspaces and snapshots --------------------------------------------

    async def create_workspace(self, name: str) -> Workspace:
        """:meth:`SessionsClient.create_workspace`."""
        return await self._do(ops.create_workspace(name))

    async def list_workspaces(self) -> List[Workspace]:
        """:meth:`SessionsClient.list_workspaces`."""
        return await self._do(ops.list_workspaces())

    async def delete_workspace(self, name: str) -> None:
        """:meth:`SessionsClient.delete_workspace`."""
        await self._do(ops.delete_workspace(name))

    async def create_snapshot(self, session_id: str) -> Snapshot:
        """:meth:`SessionsClient.create_snapshot`."""
        return await self._do(ops.create_snapshot(session_id))

    async def list_snapshots(self, session: Optional[str] = None) -> List[Snapshot]:
        """:meth:`SessionsClient.list_snapshots`."""
        return await self._do(ops.list_snapshots(session))

    async def delete_snapshot(self, snapshot_id: str) -> None:
        """:meth:`SessionsClient.delete_snapshot`."""
        await self._do(ops.delete_snapshot(snapshot_id))

    # -- usage, previews, audit ---------------------------------------------

    async def session_stats(self, session_id: str) -> SessionStats:
        """:meth:`SessionsClient.session_stats`."""
        return await self._do(ops.session_stats(session_id))

    async def list_egress_decisions(
        self, session_id: str, limit: int = 100, cursor: Optional[str] = None
    ) -> EgressDecisionPage:
        """:meth:`SessionsClient.list_egress_decisions`."""
        return await self._do(ops.list_egress_decisions(session_id, limit, cursor))

    async def list_egress_pending(self, session_id: str) -> List[EgressPending]:
        """:meth:`SessionsClient.list_egress_pending`."""
        return await self._do(ops.list_egress_pending(session_id))

    async def follow_egress_pending(self, session_id: str) -> AsyncIterator[EgressPendingEvent]:
        """:meth:`SessionsClient.follow_egress_pending`: ``async for ev in client.follow_egress_pending(sid)``."""
        op = ops.follow_egress_pending(session_id)
        resp = await self._send(op.method, op.path, stream=True, **self._op_args(op))
        parser = SSEParser()
        try:
            async for line in resp.aiter_lines():
                ev = parser.feed(line)
                if ev is not None:
                    yield ev
        finally:
            await resp.aclose()

    async def decide_egress(
        self, session_id: str, pending_id: str, decision: str, remember: bool = False
    ) -> EgressPending:
        """:meth:`SessionsClient.decide_egress`."""
        return await self._do(ops.decide_egress(session_id, pending_id, decision, remember))

    def preview_url(self, session_id: str, port: int, path: str = "/") -> str:
        """:meth:`SessionsClient.preview_url` (nothing is sent)."""
        return preview_url(self._base, session_id, port, path)

    async def port_link(self, session_id: str, port: int, expires_in: Optional[int] = None) -> PortLink:
        """:meth:`SessionsClient.port_link`."""
        return await self._do(ops.port_link(session_id, port, expires_in))

    async def list_audit(
        self,
        session: Optional[str] = None,
        since: Union[str, datetime, None] = None,
        limit: int = 100,
        cursor: Optional[str] = None,
    ) -> AuditPage:
        """:meth:`SessionsClient.list_audit`."""
        return await self._do(ops.list_audit(session, since, limit, cursor))

    async def iter_audit(
        self, session: Optional[str] = None, since: Union[str, datetime, None] = None, page_size: int = 100
    ) -> AsyncIterator[AuditEvent]:
        """:meth:`SessionsClient.iter_audit`: ``async for event in client.iter_audit(...)``."""
        cursor: Optional[str] = None
        while True:
            page = await self.list_audit(session=session, since=since, limit=page_size, cursor=cursor)
            for event in page.events:
                yield event
            if page.next_cursor is None or page.next_cursor == cursor:
                return
            cursor = page.next_cursor

    async def session_timeline(
        self,
        session_id: str,
        kind: Union[str, Sequence[str], None] = None,
        after: Optional[int] = None,
        limit: int = 100,
        cursor: Optional[str] = None,
    ) -> AuditPage:
        """:meth:`SessionsClient.session_timeline`."""
        return await self._do(ops.session_timeline(session_id, kind, after, limit, cursor))

    # -- data plane: commands ------------------------------------------------

    async def run(
        self,
        session_id: str,
        command: Optional[str] = None,
        *,
        argv: Optional[Sequence[str]] = None,
        stdin: Union[str, bytes, None] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        timeout: Optional[float] = None,
        max_output_bytes: Optional[int] = None,
        shell: Optional[str] = None,
        background: bool = False,
        on_stdout: Optional[ChunkCallback] = None,
        on_stderr: Optional[ChunkCallback] = None,
    ) -> CommandResult:
        """:meth:`SessionsClient.run`. Cancelling it drops the HTTP connection,
        which kills the command (unless ``background``)."""
        op = ops.run(
            session_id,
            command,
            argv,
            self.timeout,
            stdin=stdin,
            env=env,
            cwd=cwd,
            timeout=timeout,
            max_output_bytes=max_output_bytes,
            shell=shell,
            background=background,
        )
        check_callback("on_stdout", on_stdout)
        check_callback("on_stderr", on_stderr)
        if on_stdout is None and on_stderr is None:
            return await self._do(op)
        resp = await self._send(op.method, op.path, stream=True, **self._op_args(self._stream_op(op)))
        try:
            if not is_ndjson(resp):
                return whole_result(await self._json(resp, op.what), on_stdout, on_stderr)
            lines = RunLines(on_stdout, on_stderr, op.what)
            # What a callback raises propagates as it is (and the connection is dropped).
            async for chunk in self._chunks(resp, op.what):
                res = lines.feed(chunk)
                if res is not None:
                    return res
            return lines.finish()
        finally:
            await resp.aclose()

    def shell(self, session_id: str, name: str = "default") -> "AsyncShell":
        """:meth:`SessionsClient.shell`: a handle on a persistent shell (nothing is sent)."""
        session_path(session_id)
        return AsyncShell(self, session_id, check_shell_name(name))

    async def delete_shell(self, session_id: str, name: str) -> bool:
        """:meth:`SessionsClient.delete_shell`."""
        try:
            return await self._do(ops.delete_shell(session_id, name))
        except SandboxOperationError as e:
            if shell_missing(e):
                return False
            raise

    async def list_commands(self, session_id: str, limit: Optional[int] = None) -> List[Dict[str, Any]]:
        """:meth:`SessionsClient.list_commands`."""
        return await self._do(ops.list_commands(session_id, limit))

    # -- data plane: the Python kernel ---------------------------------------

    async def run_python(
        self,
        session_id: str,
        code: str,
        *,
        kernel: Optional[str] = None,
        timeout: Optional[float] = None,
        max_output_bytes: Optional[int] = None,
    ) -> PythonResult:
        """:meth:`SessionsClient.run_python`."""
        return await self._do(ops.run_python(session_id, code, kernel, timeout, max_output_bytes, self.timeout))

    async def reset_python(self, session_id: str, kernel: Optional[str] = None) -> bool:
        """:meth:`SessionsClient.reset_python`."""
        return await self._do(ops.reset_python(session_id, kernel))

    # -- data plane: files ---------------------------------------------------

    async def read_file(self, session_id: str, path: str, *, max_bytes: Optional[int] = None) -> bytes:
        """:meth:`SessionsClient.read_file`."""
        op = ops.file("GET", session_id, path, "read file {path!r}")
        try:
            headers = read_headers(max_bytes)
            resp = await self._send(op.method, op.path, stream=True, **self._op_args(op), headers=headers)
        except SandboxOperationError as e:
            if empty_file(e):
                return b""
            raise
        head = FirstBytes(max_bytes)
        try:
            async for chunk in self._chunks(resp, op.what, CHUNK_BYTES):
                if head.add(chunk):
                    break
        finally:
            await resp.aclose()
        return head.data()

    async def read_file_to(self, session_id: str, path: str, dest: Union[str, "os.PathLike[str]", BinaryIO]) -> int:
        """:meth:`SessionsClient.read_file_to` (local writes happen on the event loop's thread)."""
        op = ops.file("GET", session_id, path, "read file {path!r}")
        out = Download(dest, op.what)
        resp = await self._send(
            op.method, op.path, stream=True, **self._op_args(op), headers={"Accept": "application/octet-stream"}
        )
        try:
            out.open()
            async for chunk in self._chunks(resp, op.what, CHUNK_BYTES):
                out.write(chunk)
            out.done(resp.headers)
        finally:
            await resp.aclose()
            out.close()
        return out.written

    async def write_file(
        self,
        session_id: str,
        path: str,
        data: Union[bytes, str, BinaryIO],
        *,
        mode: Union[int, str, None] = None,
        mkdirs: bool = True,
    ) -> Dict[str, Any]:
        """:meth:`SessionsClient.write_file` (a file object is read in a worker thread)."""
        op = ops.write_file(session_id, path, mkdirs, mode)
        content, headers = upload_content(data, op.what)
        if not isinstance(content, bytes):
            content = _async_chunks(content)
        resp = await self._send(op.method, op.path, **self._op_args(op), content=content, headers=headers)
        return await self._json(resp, op.what)

    async def list_files(self, session_id: str, path: str = ".", recursive: bool = False) -> FileList:
        """:meth:`SessionsClient.list_files`."""
        return await self._do(ops.list_files(session_id, path, recursive))

    async def delete_file(self, session_id: str, path: str, recursive: bool = False) -> None:
        """:meth:`SessionsClient.delete_file`."""
        await self._do(ops.delete_file(session_id, path, recursive))

    async def fetch_urls(
        self, session_id: str, urls: Sequence[str], dest_dir: str = ".", overwrite: bool = False
    ) -> Dict[str, Any]:
        """:meth:`SessionsClient.fetch_urls`."""
        return await self._do(ops.fetch_urls(session_id, urls, dest_dir, overwrite, self.timeout))

    # -- data plane: background processes ------------------------------------

    async def start_process(
        self,
        session_id: str,
        command: Optional[str] = None,
        *,
        argv: Optional[Sequence[str]] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        name: Optional[str] = None,
    ) -> Dict[str, Any]:
        """:meth:`SessionsClient.start_process`."""
        return await self._do(ops.start_process(session_id, command, argv, env, cwd, name))

    async def list_processes(self, session_id: str) -> List[Dict[str, Any]]:
        """:meth:`SessionsClient.list_processes`."""
        return await self._do(ops.list_processes(session_id))

    async def get_process(self, session_id: str, process_id: str) -> Dict[str, Any]:
        """:meth:`SessionsClient.get_process`."""
        return await self._do(ops.get_process(session_id, process_id))

    async def process_output(
        self, session_id: str, process_id: str, offset: int = 0, follow: bool = True
    ) -> "AsyncNDJSONStream":
        """:meth:`SessionsClient.process_output`: the request is sent now
        (errors raise here); iterate the stream with ``async for``."""
        op = ops.process_output(session_id, process_id, output_params(offset, follow), follow)
        resp = await self._send(op.method, op.path, stream=True, **self._op_args(op))
        return AsyncNDJSONStream(resp, op.what, self.api_url)

    async def send_process_input(
        self, session_id: str, process_id: str, data: Union[str, bytes], eof: bool = False
    ) -> None:
        """:meth:`SessionsClient.send_process_input`."""
        for op in ops.process_input(session_id, process_id, data, eof):
            await self._do(op)

    async def signal_process(self, session_id: str, process_id: str, signal: Union[str, int] = "TERM") -> None:
        """:meth:`SessionsClient.signal_process`."""
        await self._do(ops.signal_process(session_id, process_id, signal))

    # -- internals -----------------------------------------------------------

    async def _do(self, op: Op) -> Any:
        """Send a plain call; return its parsed answer."""
        data, headers = await self._call(op.method, op.path, **self._op_args(op))
        return op.result(data, headers)

    async def _request(
        self, method: str, path: str, *, what: str, session_scoped: bool = False, **kwargs: Any
    ) -> Dict[str, Any]:
        return (await self._call(method, path, what=what, session_scoped=session_scoped, **kwargs))[0]

    async def _call(
        self, method: str, path: str, *, what: str, session_scoped: bool = False, **kwargs: Any
    ) -> "tuple[Dict[str, Any], Mapping[str, str]]":
        resp = await self._send(method, path, what=what, session_scoped=session_scoped, **kwargs)
        return self._answer(resp, what), resp.headers

    async def _send(
        self,
        method: str,
        path: str,
        *,
        what: str,
        session_scoped: bool = False,
        timeout: Any = DEFAULT,
        stream: bool = False,
        filename: Optional[str] = None,
        **kwargs: Any,
    ) -> httpx.Response:
        """Send one request; return the answer (its body unread when
        *stream*, else read and the connection released), or raise the error
        an answer >= 400 means. Cancelled while the answer is read: the
        connection is closed."""
        t = self._timeout(timeout)
        try:
            resp = await self._http.send(self._build(self._http, method, path, t, kwargs), stream=True)
        except TRANSPORT_ERRORS as e:
            raise self._transport_error(what, e, t) from e
        if resp.status_code >= 400:
            try:
                content = await resp.aread()
            except TRANSPORT_ERRORS:
                content = b""
            finally:
                await resp.aclose()
            raise self._status_error(resp, content, what, session_scoped, filename)
        if not stream:
            await self._read(resp, what)
        return resp

    async def _read(self, resp: httpx.Response, what: str) -> None:
        try:
            await resp.aread()
        except TRANSPORT_ERRORS as e:
            raise self._body_error(what, e) from e
        finally:
            await resp.aclose()

    async def _json(self, resp: httpx.Response, what: str) -> Dict[str, Any]:
        if not resp.is_closed:
            await self._read(resp, what)
        return self._answer(resp, what)

    async def _chunks(self, resp: httpx.Response, what: str, size: Optional[int] = None) -> AsyncIterator[bytes]:
        """An answer's body, chunk by chunk; a network error reading it becomes SandboxConnectionError."""
        chunks = resp.aiter_bytes(size)
        while True:
            try:
                chunk = await chunks.__anext__()
            except StopAsyncIteration:
                return
            except TRANSPORT_ERRORS as e:
                raise self._body_error(what, e) from e
            yield chunk


class AsyncShell:
    """A persistent shell, from :meth:`AsyncSessionsClient.shell` (see :class:`Shell`)::

    async with sessions.shell(session_id) as sh:
        await sh.run("cd /tmp")
        print((await sh.run("pwd")).stdout)
    """

    def __init__(self, client: AsyncSessionsClient, session_id: str, name: str) -> None:
        self.client = client
        self.session_id = session_id
        self.name = name

    def __repr__(self) -> str:
        return f"AsyncShell(session_id={self.session_id!r}, name={self.name!r})"

    async def __aenter__(self) -> "AsyncShell":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def run(self, command: Optional[str] = None, **options: Any) -> CommandResult:
        """:meth:`Shell.run`."""
        if "shell" in options:
            raise TypeError("AsyncShell.run() takes no 'shell' option: the shell is this one")
        return await self.client.run(self.session_id, command, shell=self.name, **options)

    async def close(self) -> None:
        """:meth:`Shell.close`."""
        await self.client.delete_shell(self.session_id, self.name)


class AsyncNDJSONStream:
    """The JSON lines of an open answer (:meth:`AsyncSessionsClient.process_output`),
    for ``async for``; closes the answer when exhausted, on :meth:`aclose`, or
    at the end of an ``async with``."""

    def __init__(self, resp: httpx.Response, what: str, api_url: str) -> None:
        self._resp = resp
        self._what = what
        self._api_url = api_url
        self._chunks = resp.aiter_bytes()
        self._splitter = NDJSONSplitter(what)
        self._pending: List[Dict[str, Any]] = []
        self._eof = False
        self._closed = False

    def __aiter__(self) -> "AsyncNDJSONStream":
        return self

    async def __anext__(self) -> Dict[str, Any]:
        while not self._pending:
            if self._closed or self._eof:
                await self.aclose()
                raise StopAsyncIteration
            try:
                chunk = await self._chunks.__anext__()
                self._pending += self._splitter.feed(chunk)
            except StopAsyncIteration:
                self._eof = True
                self._pending += self._splitter.finish()
            except SandboxOperationError:
                await self.aclose()
                raise
            except TRANSPORT_ERRORS as e:
                await self.aclose()
                raise body_error(self._what, self._api_url, e) from e
        return self._pending.pop(0)

    async def aclose(self) -> None:
        """Close the connection (the process is not affected). Safe to call twice."""
        if not self._closed:
            self._closed = True
            await self._resp.aclose()

    async def __aenter__(self) -> "AsyncNDJSONStream":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


class AsyncSessionSSHClient:
    """:class:`SessionSSHClient` for asyncio: the same arguments and methods,
    as coroutines. Use it as an async context manager (``__aenter__`` connects)::

        async with AsyncSessionSSHClient(api_url=URL, bearer_token=TOKEN,
                                         session_id=session.session_id) as ssh:
            res = await ssh.run_command("uname -a")

    It runs the sync client's Paramiko code in worker threads
    (``asyncio.to_thread``): the same host-key pinning, authentication,
    timeouts and errors. ``on_stdout`` / ``on_stderr`` are called on the
    event loop, in order, before the result is returned.

    Cancelling ``run_command`` kills the remote command (SSH ``signal``
    KILL, then the channel is closed: the gateway kills its process tree)
    before the CancelledError propagates. Cancelling ``upload_file`` /
    ``download_file`` closes the SFTP channel, which stops the transfer (a
    partial download is removed, as on any failure). The next call opens a
    new SFTP channel.
    """

    def __init__(
        self,
        api_url: Optional[str] = None,
        bearer_token: Optional[str] = None,
        session_id: Optional[str] = None,
        username: str = "sandbox",
        password: Optional[str] = None,
        pkey: Optional[paramiko.PKey] = None,
        timeout: float = 20,
        verify_ssl: VerifySSL = True,
        connect_path_template: str = DEFAULT_CONNECT_PATH,
        host_key_policy: Optional[paramiko.MissingHostKeyPolicy] = None,
        get_pty: bool = False,
        transport: str = "connect",
    ) -> None:
        self._sync = SessionSSHClient(
            api_url,
            bearer_token,
            session_id,
            username,
            password,
            pkey,
            timeout,
            verify_ssl,
            connect_path_template,
            host_key_policy,
            get_pty,
            transport,
        )
        # One SFTP transfer at a time on the shared SFTP channel; made on first
        # use (Python 3.9 binds a Lock to the loop current when it is made).
        self._sftp_lock: Optional[asyncio.Lock] = None

    def __repr__(self) -> str:
        return "Async" + repr(self._sync)

    @property
    def session_id(self) -> str:
        return self._sync.session_id

    @property
    def username(self) -> str:
        return self._sync.username

    @property
    def connected(self) -> bool:
        """True while the SSH transport is up."""
        return self._sync.connected

    @property
    def pinned_host_keys(self) -> List[str]:
        """The host keys pinned for the last connect() (authorized_keys lines)."""
        return self._sync.pinned_host_keys

    @property
    def sync_client(self) -> SessionSSHClient:
        """The underlying :class:`SessionSSHClient` (blocking: call it from a thread)."""
        return self._sync

    async def __aenter__(self) -> "AsyncSessionSSHClient":
        await self.connect()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def connect(self) -> "AsyncSessionSSHClient":
        """:meth:`SessionSSHClient.connect` in a worker thread. Returns self."""
        # Cancelled: the handshake is let finish, then everything is closed.
        await _in_thread(self._sync.connect, lambda: None, after_cancel=self._sync.close)
        return self

    async def close(self) -> None:
        """Close SFTP, SSH and the tunnel. Safe to call twice."""
        await asyncio.to_thread(self._sync.close)

    async def run_command(
        self,
        command: str,
        timeout: Optional[float] = 60,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        max_output_bytes: Optional[int] = DEFAULT_MAX_OUTPUT_BYTES,
    ) -> CommandResult:
        """:meth:`SessionSSHClient.run_command`. Cancelled, it kills the command first."""
        loop = asyncio.get_running_loop()
        cancel = threading.Event()
        failed: List[BaseException] = []
        out_cb = _on_loop(loop, on_stdout, cancel, failed)
        err_cb = _on_loop(loop, on_stderr, cancel, failed)
        try:
            return await _in_thread(
                lambda: self._sync._run_command(command, timeout, out_cb, err_cb, max_output_bytes, cancel),
                cancel.set,
            )
        except CommandCancelled:
            # A callback raised (on the loop): the command was killed; raise that.
            if failed:
                raise failed[0] from None
            raise asyncio.CancelledError() from None  # pragma: no cover - cancel.set() without a failure

    async def open_sftp(self) -> paramiko.SFTPClient:
        """:meth:`SessionSSHClient.open_sftp` (the returned Paramiko client is blocking)."""
        return await asyncio.to_thread(self._sync.open_sftp)

    async def upload_file(self, local_path: PathLike, remote_path: str) -> None:
        """:meth:`SessionSSHClient.upload_file` in a worker thread."""
        async with self._lock():
            await _in_thread(lambda: self._sync.upload_file(local_path, remote_path), self._drop_sftp)

    async def download_file(self, remote_path: str, local_path: PathLike) -> None:
        """:meth:`SessionSSHClient.download_file` in a worker thread."""
        async with self._lock():
            await _in_thread(lambda: self._sync.download_file(remote_path, local_path), self._drop_sftp)

    def _lock(self) -> asyncio.Lock:
        if self._sftp_lock is None:
            self._sftp_lock = asyncio.Lock()
        return self._sftp_lock

    def _drop_sftp(self) -> None:
        sftp, self._sync._sftp = self._sync._sftp, None
        if sftp is not None:
            try:
                sftp.close()
            except Exception:
                pass


def _on_loop(
    loop: asyncio.AbstractEventLoop,
    cb: Optional[Callable[[str], Any]],
    cancel: threading.Event,
    failed: List[BaseException],
) -> Optional[Callable[[str], Any]]:
    """A callback for the worker thread that runs *cb* on the event loop; if
    *cb* raises, the exception is kept in *failed* and the command cancelled."""
    if cb is None:
        return None
    if not callable(cb):
        raise TypeError("callbacks must be callable")

    def call(text: str) -> None:
        if failed:
            return
        try:
            cb(text)
        except Exception as e:
            failed.append(e)
            cancel.set()

    return lambda text: loop.call_soon_threadsafe(call, text)


async def _in_thread(
    fn: Callable[[], Any], on_cancel: Callable[[], None], after_cancel: Optional[Callable[[], None]] = None
) -> Any:
    """Run *fn* in a worker thread. When the awaiting task is cancelled, call
    *on_cancel* (which makes *fn* stop), wait for *fn* to end, call
    *after_cancel* (in a thread) and re-raise the CancelledError."""
    fut = asyncio.ensure_future(asyncio.to_thread(fn))
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        on_cancel()
        try:
            await fut
        except BaseException:
            pass
        if after_cancel is not None:
            await asyncio.to_thread(after_cancel)
        raise
