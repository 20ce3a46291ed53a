"""The asyncio clients: AsyncSessionsClient (REST over httpx) and
AsyncSessionSSHClient (the Paramiko SSH client in worker threads).

They take the same arguments and have the same methods as
:class:`SessionsClient` and :class:`SessionSSHClient`, as coroutines; the
argument checks, request bodies, answer parsing and error mapping are the
sync client's own (``_common``, ``_dataplane``). Cancelling a call (a
cancelled task, ``asyncio.wait_for``'s timeout) cancels what it started
remotely: a REST ``run`` drops its HTTP connection, which kills the command
(unless ``background``); an SSH ``run_command`` kills the command (SSH
``signal`` KILL, then the channel is closed).
"""

from __future__ import annotations

import asyncio
import os
import ssl
import threading
import uuid
from datetime import datetime
from types import TracebackType
from typing import Any, AsyncIterator, BinaryIO, Callable, Dict, List, Mapping, Optional, Sequence, Type, Union

import httpx
import paramiko

from ._common import (
    CREATE_RETRY_DELAYS,
    CREATE_NO_RETRY_CODES,
    CREATE_RETRY_STATUSES,
    VerifySSL,
    answer_list,
    check_idempotency_key,
    check_int,
    check_timeout,
    create_session_body,
    error_for_status,
    is_replayed,
    json_answer,
    parse_session,
    process_path,
    resolve_settings,
    rest_base,
    session_page,
    session_path,
    ssl_context,
    update_session_body,
)
from ._dataplane import (
    CHUNK_BYTES,
    ChunkCallback,
    FileList,
    NDJSONSplitter,
    RunStream,
    check_bool,
    check_callback,
    check_path,
    check_shell_name,
    command_body,
    command_result,
    fetch_body,
    file_list,
    list_params,
    output_params,
    process_body,
    read_headers,
    run_read_timeout,
    shell_path,
    signal_body,
    stdin_bodies,
    upload_body,
    whole_result,
    write_params,
)
from ._output import DEFAULT_MAX_OUTPUT_BYTES
from ._version import __version__
from ._workspaces import (
    audit_page,
    audit_params,
    check_workspace_name,
    delete_session_params,
    parse_list,
    parse_one,
    port_link,
    port_link_body,
    preview_url,
    snapshot_params,
    snapshot_path,
    workspace_path,
)
from .errors import (
    FileNotFoundInSandboxError,
    SandboxAPIError,
    SandboxConnectionError,
    SandboxOperationError,
    SandboxPermissionError,
)
from .models import AuditEvent, AuditPage, CommandResult, PortLink, Session, SessionStats, Snapshot, Workspace
from .ssh import CommandCancelled, OutputCallback, PathLike, SessionSSHClient
from .tunnel import DEFAULT_CONNECT_PATH

__all__ = ["AsyncSessionsClient", "AsyncShell", "AsyncNDJSONStream", "AsyncSessionSSHClient"]

#: Pauses before create_session's retries (as the sync client's).
_CREATE_RETRY_DELAYS = CREATE_RETRY_DELAYS

_DEFAULT: Any = object()


def _is_tls_error(e: BaseException) -> bool:
    seen = 0
    cur: Optional[BaseException] = e
    while cur is not None and seen < 8:
        if isinstance(cur, ssl.SSLError):
            return True
        cur = cur.__cause__ or cur.__context__
        seen += 1
    return "CERTIFICATE_VERIFY_FAILED" in str(e) or "SSL" in type(e).__name__


def _create_retryable(e: SandboxAPIError) -> bool:
    """A failed create worth sending again: the outcome is unknown or the failure transient."""
    if isinstance(e, SandboxConnectionError):
        return not (e.__cause__ is not None and _is_tls_error(e.__cause__))
    return e.status_code in CREATE_RETRY_STATUSES and e.code not in CREATE_NO_RETRY_CODES


def _httpx_timeout(connect: Optional[float], read: Optional[float]) -> httpx.Timeout:
    return httpx.Timeout(connect=connect, read=read, write=connect, pool=connect)


def _body_error(what: str, api_url: str, e: Exception) -> SandboxConnectionError:
    """An httpx (or socket) error met while reading an answer's body."""
    if isinstance(e, (httpx.TimeoutException, TimeoutError)):
        return SandboxConnectionError(f"{what}: timed out reading the answer from {api_url}")
    return SandboxConnectionError(f"{what}: the connection to {api_url} broke: {e}")


async def _body_chunks(resp: httpx.Response, what: str, api_url: str, size: Optional[int]) -> AsyncIterator[bytes]:
    """An answer's body, chunk by chunk; a network error reading it becomes SandboxConnectionError."""
    chunks = resp.aiter_bytes(size)
    while True:
        try:
            chunk = await chunks.__anext__()
        except StopAsyncIteration:
            return
        except (httpx.HTTPError, OSError) as e:
            raise _body_error(what, api_url, e) from e
        yield chunk


async def _async_chunks(body: Any) -> AsyncIterator[bytes]:
    """A sync iterable of upload chunks (a file object's), read in a worker thread."""
    it = iter(body)
    done = object()
    while True:
        chunk = await asyncio.to_thread(next, it, done)
        if chunk is done:
            return
        yield chunk


class AsyncSessionsClient:
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
        self.api_url, self._token = resolve_settings(api_url, bearer_token)
        self.timeout: Optional[float] = check_timeout("timeout", timeout)
        self.verify_ssl: VerifySSL = verify_ssl
        self._base = rest_base(self.api_url)
        self._http = httpx.AsyncClient(
            headers={
                "Authorization": f"Bearer {self._token}",
                "Accept": "application/json",
                "User-Agent": f"sandbox-sessions-sdk-python/{__version__}",
            },
            verify=ssl_context(verify_ssl),
            timeout=_httpx_timeout(self.timeout, self.timeout),
        )

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
        egress: Optional[Sequence[str]] = None,
        secrets: Optional[Sequence[Any]] = None,
        workspace: Optional[str] = None,
        from_snapshot: Optional[str] = None,
        name: Optional[str] = None,
    ) -> Session:
        """:meth:`SessionsClient.create_session` (with the same retries, same key)."""
        body = create_session_body(
            ttl, image, metadata, ssh_public_key, resources, labels, egress, secrets, workspace, from_snapshot, name
        )
        key = check_idempotency_key(idempotency_key) if idempotency_key is not None else str(uuid.uuid4())
        for attempt in range(len(_CREATE_RETRY_DELAYS) + 1):
            try:
                data, headers = await self._call(
                    "POST", "/sessions", what="create session", json=body, headers={"Idempotency-Key": key}
                )
                break
            except SandboxAPIError as e:
                if attempt == len(_CREATE_RETRY_DELAYS) or not _create_retryable(e):
                    raise
                await asyncio.sleep(_CREATE_RETRY_DELAYS[attempt])
        session = parse_session(data, "create session")
        session.replayed = is_replayed(headers)
        return session

    async def list_sessions(self, limit: int = 50, offset: int = 0) -> Dict[str, Any]:
        """:meth:`SessionsClient.list_sessions`."""
        check_int("limit", limit, 1, 100)
        check_int("offset", offset, 0)
        data = await self._request("GET", "/sessions", what="list sessions", params={"limit": limit, "offset": offset})
        return session_page(data, limit, offset)

    async def get_session(self, session_id: str) -> Session:
        """:meth:`SessionsClient.get_session`."""
        data = await self._request("GET", session_path(session_id), what="get session", session_scoped=True)
        return parse_session(data, "get session")

    async def update_session(
        self, session_id: str, ttl: Optional[int] = None, egress: Optional[Sequence[str]] = None
    ) -> Session:
        """:meth:`SessionsClient.update_session`."""
        body = update_session_body(ttl, egress)
        data = await self._request(
            "PATCH", session_path(session_id), what="update session", session_scoped=True, json=body
        )
        return parse_session(data, "update session")

    async def delete_session(
        self, session_id: str, keep_workspace: Optional[bool] = None, discard: Optional[bool] = None
    ) -> None:
        """:meth:`SessionsClient.delete_session`."""
        params = delete_session_params(keep_workspace, discard)
        await self._request(
            "DELETE", session_path(session_id), what="delete session", session_scoped=True, params=params
        )

    # -- workspaces and snapshots --------------------------------------------

    async def create_workspace(self, name: str) -> Workspace:
        """:meth:`SessionsClient.create_workspace`."""
        body = {"name": check_workspace_name(name)}
        data = await self._request("POST", "/workspaces", what="create workspace", json=body)
        return parse_one(Workspace, data, "create workspace")

    async def list_workspaces(self) -> List[Workspace]:
        """:meth:`SessionsClient.list_workspaces`."""
        data = await self._request("GET", "/workspaces", what="list workspaces")
        return parse_list(Workspace, data, "workspaces", "list workspaces")

    async def delete_workspace(self, name: str) -> None:
        """:meth:`SessionsClient.delete_workspace`."""
        await self._request("DELETE", workspace_path(name), what="delete workspace")

    async def create_snapshot(self, session_id: str) -> Snapshot:
        """:meth:`SessionsClient.create_snapshot`."""
        path = session_path(session_id) + "/snapshots"
        data = await self._request("POST", path, what="create snapshot", session_scoped=True)
        return parse_one(Snapshot, data, "create snapshot")

    async def list_snapshots(self, session: Optional[str] = None) -> List[Snapshot]:
        """:meth:`SessionsClient.list_snapshots`."""
        data = await self._request("GET", "/snapshots", what="list snapshots", params=snapshot_params(session))
        return parse_list(Snapshot, data, "snapshots", "list snapshots")

    async def delete_snapshot(self, snapshot_id: str) -> None:
        """:meth:`SessionsClient.delete_snapshot`."""
        await self._request("DELETE", snapshot_path(snapshot_id), what="delete snapshot")

    # -- usage, previews, audit ---------------------------------------------

    async def session_stats(self, session_id: str) -> SessionStats:
        """:meth:`SessionsClient.session_stats`."""
        path = session_path(session_id) + "/stats"
        data = await self._request("GET", path, what="session stats", session_scoped=True)
        return parse_one(SessionStats, data, "session stats")

    def preview_url(self, session_id: str, port: int, path: str = "/") -> str:
        """:meth:`SessionsClient.preview_url` (nothing is sent)."""
        return preview_url(self._base, session_id, port, path)

    async def port_link(self, session_id: str, port: int, expires_in: Optional[int] = None) -> PortLink:
        """:meth:`SessionsClient.port_link`."""
        path = session_path(session_id) + "/ports/link"
        body = port_link_body(port, expires_in)
        return port_link(await self._request("POST", path, what="port link", session_scoped=True, json=body))

    async def list_audit(
        self,
        session: Optional[str] = None,
        since: Union[str, datetime, None] = None,
        limit: int = 100,
        cursor: Optional[str] = None,
    ) -> AuditPage:
        """:meth:`SessionsClient.list_audit`."""
        params = audit_params(session, since, limit, cursor)
        return audit_page(await self._request("GET", "/audit", what="list audit", params=params))

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
        path = session_path(session_id) + "/commands"
        body = command_body(
            command,
            argv,
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
        what = "run command"
        http_timeout = _httpx_timeout(self.timeout, run_read_timeout(body, self.timeout))
        if on_stdout is None and on_stderr is None:
            data = await self._request("POST", path, what=what, session_scoped=True, json=body, timeout=http_timeout)
            return command_result(data)
        resp = await self._send(
            "POST",
            path,
            what=what,
            session_scoped=True,
            json=body,
            timeout=http_timeout,
            stream=True,
            headers={"Accept": "application/x-ndjson"},
        )
        try:
            if not resp.headers.get("Content-Type", "").startswith("application/x-ndjson"):
                return whole_result(await self._json(resp, what), on_stdout, on_stderr)
            stream = RunStream(on_stdout, on_stderr, what)
            splitter = NDJSONSplitter(what)
            # What a callback raises propagates as it is (and the connection is dropped).
            async for chunk in _body_chunks(resp, what, self.api_url, None):
                for line in splitter.feed(chunk):
                    res = stream.line(line)
                    if res is not None:
                        return res
            for line in splitter.finish():
                res = stream.line(line)
                if res is not None:
                    return res
            raise stream.ended_early()
        finally:
            await resp.aclose()

    def shell(self, session_id: str, name: str = "default") -> "AsyncShell":
        """:meth:`SessionsClient.shell`: a handle on a persistent shell (nothing is sent)."""
        session_path(session_id)
        return AsyncShell(self, session_id, check_shell_name(name))

    async def delete_shell(self, session_id: str, name: str) -> bool:
        """:meth:`SessionsClient.delete_shell`."""
        path = shell_path(session_path(session_id), name)
        try:
            await self._request("DELETE", path, what="delete shell", session_scoped=True)
        except SandboxOperationError as e:
            if e.status_code == 404 and e.code == "shell_not_found":
                return False
            raise
        return True

    async def list_commands(self, session_id: str, limit: Optional[int] = None) -> List[Dict[str, Any]]:
        """:meth:`SessionsClient.list_commands`."""
        params = {}
        if limit is not None:
            params["limit"] = check_int("limit", limit, 1, 1000)
        path = session_path(session_id) + "/commands"
        data = await self._request("GET", path, what="list commands", session_scoped=True, params=params)
        return answer_list(data, "commands", "list commands")

    # -- data plane: files ---------------------------------------------------

    async def read_file(self, session_id: str, path: str, *, max_bytes: Optional[int] = None) -> bytes:
        """:meth:`SessionsClient.read_file`."""
        path = check_path("path", path)
        headers = read_headers(max_bytes)
        what = f"read file {path!r}"
        try:
            resp = await self._send_file("GET", session_id, path, what, stream=True, headers=headers)
        except SandboxOperationError as e:
            if e.status_code == 416:  # the range starts at 0: the file is empty
                return b""
            raise
        parts: List[bytes] = []
        got = 0
        try:
            async for chunk in _body_chunks(resp, what, self.api_url, CHUNK_BYTES):
                if max_bytes is not None and got + len(chunk) >= max_bytes:
                    parts.append(chunk[: max_bytes - got])
                    break
                parts.append(chunk)
                got += len(chunk)
        finally:
            await resp.aclose()
        return b"".join(parts)

    async def read_file_to(self, session_id: str, path: str, dest: Union[str, "os.PathLike[str]", BinaryIO]) -> int:
        """:meth:`SessionsClient.read_file_to` (local writes happen on the event loop's thread)."""
        path = check_path("path", path)
        local: Optional[str] = os.fspath(dest) if isinstance(dest, (str, os.PathLike)) else None
        if local is None and not callable(getattr(dest, "write", None)):
            raise TypeError(f"dest must be a path or a writable binary file object, got {type(dest).__name__}")
        what = f"read file {path!r}"
        resp = await self._send_file(
            "GET", session_id, path, what, stream=True, headers={"Accept": "application/octet-stream"}
        )
        f: Any = None
        written = 0
        ok = False
        try:
            f = open(local, "wb") if local is not None else dest
            async for chunk in _body_chunks(resp, what, self.api_url, CHUNK_BYTES):
                f.write(chunk)  # a local write error propagates as it is
                written += len(chunk)
            expected = resp.headers.get("Content-Length")
            if expected is not None and expected.isdigit() and int(expected) != written:
                raise SandboxConnectionError(f"{what}: got {written} of {expected} bytes")
            ok = True
        finally:
            await resp.aclose()
            if local is not None and f is not None:
                f.close()
                if not ok:
                    try:
                        os.remove(local)
                    except OSError:
                        pass
        return written

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
        path = check_path("path", path)
        params = write_params(mkdirs, mode)
        what = f"write file {path!r}"
        body = upload_body(data, what)
        headers = {"Content-Type": "application/octet-stream"}
        if not isinstance(body, bytes):
            if hasattr(body, "__len__"):  # a known size: sent with a Content-Length
                headers["Content-Length"] = str(len(body))
            body = _async_chunks(body)
        resp = await self._send_file("PUT", session_id, path, what, params=params, content=body, headers=headers)
        return await self._json(resp, what)

    async def list_files(self, session_id: str, path: str = ".", recursive: bool = False) -> FileList:
        """:meth:`SessionsClient.list_files`."""
        path = check_path("path", path)
        what = f"list files {path!r}"
        resp = await self._send_file("GET", session_id, path, what, params=list_params(recursive))
        return file_list(await self._json(resp, what), what)

    async def delete_file(self, session_id: str, path: str, recursive: bool = False) -> None:
        """:meth:`SessionsClient.delete_file`."""
        path = check_path("path", path)
        params = {"recursive": "true"} if check_bool("recursive", recursive) else {}
        await self._send_file("DELETE", session_id, path, f"delete file {path!r}", params=params)

    async def fetch_urls(
        self, session_id: str, urls: Sequence[str], dest_dir: str = ".", overwrite: bool = False
    ) -> Dict[str, Any]:
        """:meth:`SessionsClient.fetch_urls`."""
        body = fetch_body(urls, dest_dir, overwrite)
        path = session_path(session_id) + "/files/fetch"
        http_timeout = _httpx_timeout(self.timeout, None if self.timeout is None else max(self.timeout, 600.0))
        return await self._request(
            "POST", path, what="fetch urls", session_scoped=True, json=body, timeout=http_timeout
        )

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
        body = process_body(command, argv, env, cwd, name)
        path = session_path(session_id) + "/processes"
        return await self._request("POST", path, what="start process", session_scoped=True, json=body)

    async def list_processes(self, session_id: str) -> List[Dict[str, Any]]:
        """:meth:`SessionsClient.list_processes`."""
        path = session_path(session_id) + "/processes"
        data = await self._request("GET", path, what="list processes", session_scoped=True)
        return answer_list(data, "processes", "list processes")

    async def get_process(self, session_id: str, process_id: str) -> Dict[str, Any]:
        """:meth:`SessionsClient.get_process`."""
        return await self._request("GET", process_path(session_id, process_id), what="get process", session_scoped=True)

    async def process_output(
        self, session_id: str, process_id: str, offset: int = 0, follow: bool = True
    ) -> "AsyncNDJSONStream":
        """:meth:`SessionsClient.process_output`: the request is sent now
        (errors raise here); iterate the stream with ``async for``."""
        params = output_params(offset, follow)
        path = process_path(session_id, process_id) + "/output"
        what = "process output"
        resp = await self._send(
            "GET",
            path,
            what=what,
            session_scoped=True,
            params=params,
            stream=True,
            timeout=_httpx_timeout(self.timeout, None if follow else self.timeout),
            headers={"Accept": "application/x-ndjson"},
        )
        return AsyncNDJSONStream(resp, what, self.api_url)

    async def send_process_input(
        self, session_id: str, process_id: str, data: Union[str, bytes], eof: bool = False
    ) -> None:
        """:meth:`SessionsClient.send_process_input`."""
        bodies = stdin_bodies(data, eof)
        path = process_path(session_id, process_id) + "/stdin"
        for body in bodies:
            await self._request("POST", path, what="process input", session_scoped=True, json=body)

    async def signal_process(self, session_id: str, process_id: str, signal: Union[str, int] = "TERM") -> None:
        """:meth:`SessionsClient.signal_process`."""
        body = signal_body(signal)
        path = process_path(session_id, process_id) + "/signal"
        await self._request("POST", path, what="signal process", session_scoped=True, json=body)

    # -- internals -----------------------------------------------------------

    async def _send_file(self, method: str, session_id: str, path: str, what: str, **kwargs: Any) -> httpx.Response:
        params = dict(kwargs.pop("params", None) or {})
        params["path"] = path
        try:
            return await self._send(
                method, session_path(session_id) + "/files", what=what, session_scoped=True, params=params, **kwargs
            )
        except (FileNotFoundInSandboxError, SandboxPermissionError) as e:
            e.filename = path
            raise

    async def _request(
        self, method: str, path: str, *, what: str, session_scoped: bool = False, **kwargs: Any
    ) -> Dict[str, Any]:
        return (await self._call(method, path, what=what, session_scoped=session_scoped, **kwargs))[0]

    async def _call(
        self, method: str, path: str, *, what: str, session_scoped: bool = False, **kwargs: Any
    ) -> "tuple[Dict[str, Any], Mapping[str, str]]":
        resp = await self._send(method, path, what=what, session_scoped=session_scoped, **kwargs)
        return await self._json(resp, what), resp.headers

    async def _send(
        self,
        method: str,
        path: str,
        *,
        what: str,
        session_scoped: bool = False,
        timeout: Any = _DEFAULT,
        stream: bool = False,
        **kwargs: Any,
    ) -> httpx.Response:
        """Send one request; return the answer (its body unread when
        *stream*, else read and the connection released), or raise the error
        an answer >= 400 means. Cancelled while the answer is read: the
        connection is closed."""
        url = self._base + path
        if timeout is _DEFAULT:
            timeout = _httpx_timeout(self.timeout, self.timeout)
        req = self._http.build_request(method, url, timeout=timeout, **kwargs)
        try:
            resp = await self._http.send(req, stream=True)
        except httpx.TimeoutException as e:
            raise SandboxConnectionError(f"{what}: timed out talking to {self.api_url}") from e
        except (httpx.HTTPError, OSError) as e:  # OSError: an ssl error some anyio versions do not wrap
            if _is_tls_error(e):
                raise SandboxConnectionError(f"{what}: TLS error talking to {self.api_url}: {e}") from e
            raise SandboxConnectionError(f"{what}: cannot reach {self.api_url}: {e}") from e
        if resp.status_code >= 400:
            try:
                content = await resp.aread()
            except (httpx.HTTPError, OSError):
                content = b""
            finally:
                await resp.aclose()
            raise error_for_status(
                resp.status_code,
                resp.reason_phrase or "",
                resp.headers,
                content,
                what=what,
                session_scoped=session_scoped,
            )
        if not stream:
            try:
                await resp.aread()
            except (httpx.HTTPError, OSError) as e:
                raise _body_error(what, self.api_url, e) from e
            finally:
                await resp.aclose()
        return resp

    @staticmethod
    async def _json(resp: httpx.Response, what: str) -> Dict[str, Any]:
        if not resp.is_closed:
            try:
                await resp.aread()
            finally:
                await resp.aclose()
        return json_answer(resp.status_code, resp.content, resp.headers, what)


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
            except (httpx.HTTPError, OSError) as e:
                await self.aclose()
                raise _body_error(self._what, self._api_url, e) from e
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
