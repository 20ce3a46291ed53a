"""What SessionsClient and AsyncSessionsClient share: everything but I/O.

Both clients speak httpx (``httpx.Client`` and ``httpx.AsyncClient``).
This module holds what they do alike:

- :class:`RestCore`: settings, default headers, timeouts, how a request is
  built, how a transport failure or an error answer becomes an exception,
  how a JSON answer is read, and the one-time :class:`IsolationWarning`;
- :class:`Op` and its builders: each plain call of the API (method, path,
  what it is called in errors, query, body, how its answer is parsed). A
  client method is then ``return self._do(ops.get_session(id))`` (sync) or
  ``return await self._do(ops.get_session(id))`` (async);
- the create retry rule, and the upload body (streamed, never read whole).

The twins keep only what differs by I/O: sending, reading streamed
bodies (``iter_bytes`` / ``aiter_bytes``), sleeping between retries, and
an upload's chunks (read in a worker thread for asyncio).
"""

from __future__ import annotations

import os
import re
import ssl
import sys
import threading
import warnings
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple, Union
from urllib.parse import urlsplit

import httpx

from ._common import (
    CREATE_NO_RETRY_CODES,
    CREATE_RETRY_STATUSES,
    VerifySSL,
    answer_list,
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
from ._egress import (
    decide_body,
    decided,
    egress_decision_page,
    egress_decisions_params,
    egress_pending_list,
    pending_path,
)
from ._dataplane import (
    ChunkCallback,
    NDJSONSplitter,
    RunStream,
    check_bool,
    check_path,
    check_text,
    command_body,
    command_result,
    fetch_body,
    file_list,
    list_params,
    process_body,
    run_read_timeout,
    shell_path,
    signal_body,
    stdin_bodies,
    upload_body,
    write_params,
)
from ._version import __version__
from ._workspaces import (
    audit_page,
    audit_params,
    timeline_page,
    timeline_params,
    check_workspace_name,
    delete_session_params,
    parse_list,
    parse_one,
    port_link,
    port_link_body,
    snapshot_params,
    snapshot_path,
    workspace_path,
)
from .errors import (
    FileNotFoundInSandboxError,
    IsolationWarning,
    SandboxAPIError,
    SandboxConnectionError,
    SandboxOperationError,
    SandboxPermissionError,
)
from .models import CommandResult, PythonResult, Session, SessionStats, Snapshot, Workspace

#: What a transport or body failure raises: httpx's errors, and the OSError
#: (an ssl error) some anyio versions do not wrap.
TRANSPORT_ERRORS = (httpx.HTTPError, OSError)

#: "Use the client's timeout" (None means no timeout at all).
DEFAULT: Any = object()

NDJSON = "application/x-ndjson"


def is_tls_error(e: BaseException) -> bool:
    """Whether *e* (or what caused it) is a TLS failure: retrying will not help."""
    seen = 0
    cur: Optional[BaseException] = e
    while cur is not None and seen < 8:
        if isinstance(cur, ssl.SSLError):
            return True
        cur = cur.__cause__ or cur.__context__
        seen += 1
    return "CERTIFICATE_VERIFY_FAILED" in str(e) or "SSL" in type(e).__name__


def create_retryable(e: SandboxAPIError) -> bool:
    """A failed create worth sending again: the outcome is unknown or the failure transient."""
    if isinstance(e, SandboxConnectionError):
        return not (e.__cause__ is not None and is_tls_error(e.__cause__))
    return e.status_code in CREATE_RETRY_STATUSES and e.code not in CREATE_NO_RETRY_CODES


def httpx_timeout(connect: Optional[float], read: Optional[float]) -> httpx.Timeout:
    return httpx.Timeout(connect=connect, read=read, write=connect, pool=connect)


def body_error(what: str, api_url: str, e: BaseException) -> BaseException:
    """A failure met while reading an answer's body: SandboxConnectionError
    for a network one, *e* itself for anything else."""
    if isinstance(e, (httpx.TimeoutException, TimeoutError)):
        return SandboxConnectionError(f"{what}: timed out reading the answer from {api_url}")
    if isinstance(e, TRANSPORT_ERRORS):
        return SandboxConnectionError(f"{what}: the connection to {api_url} broke: {e}")
    return e


def upload_content(data: Any, what: str) -> Tuple[Any, Dict[str, str]]:
    """``write_file``'s data as httpx content and the headers it needs: bytes
    as they are; a file object as an iterator of 1 MiB chunks, read as it is
    sent, with a ``Content-Length`` when its size is known (else chunked)."""
    body = upload_body(data, what)
    headers = {"Content-Type": "application/octet-stream"}
    if not isinstance(body, bytes) and hasattr(body, "__len__"):
        headers["Content-Length"] = str(len(body))
    return body, headers


def _seconds(t: Optional[float]) -> str:
    return "no limit" if t is None else f"{t:g}s"


@dataclass
class Op:
    """One plain call of the API: what to send, and how to read the answer."""

    method: str
    path: str
    what: str
    session_scoped: bool = False
    params: Optional[Mapping[str, Any]] = None
    json: Any = None
    headers: Optional[Dict[str, str]] = None
    #: The read timeout: DEFAULT (the client's), a number, or None (none).
    read_timeout: Any = DEFAULT
    #: Sandbox-path errors carry it as ``.filename``.
    filename: Optional[str] = None
    #: ``parse(data, headers)``: the method's result; None returns the data.
    parse: Optional[Callable[[Dict[str, Any], Mapping[str, str]], Any]] = field(default=None, repr=False)

    def kwargs(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        if self.params is not None:
            out["params"] = self.params
        if self.json is not None:
            out["json"] = self.json
        if self.headers is not None:
            out["headers"] = self.headers
        return out

    def result(self, data: Dict[str, Any], headers: Mapping[str, str]) -> Any:
        return data if self.parse is None else self.parse(data, headers)


_KERNEL = re.compile(r"[A-Za-z0-9_.-]{1,64}")

#: The slack, past a kernel call's own timeout, for its restart (SIGINT, then a kill 2 s later).
KERNEL_RESTART_SLACK = 2.0


def check_kernel(kernel: Any) -> str:
    """A kernel's name, as the gateway takes it (invalid_kernel_name otherwise)."""
    if not isinstance(kernel, str):
        raise TypeError(f"kernel must be a string, got {type(kernel).__name__}")
    if not _KERNEL.fullmatch(kernel):
        raise ValueError("kernel must be 1 to 64 letters, digits, '_', '.' or '-'")
    return kernel


def _session_post(session_id: Any, op: str) -> Op:
    """POST /v1/sessions/{id}/<op> (stop, pause, resume), answered by the session."""
    what = op + " session"
    return Op("POST", session_path(session_id) + "/" + op, what, True, parse=lambda d, h: parse_session(d, what))


class ops:
    """The builders of every plain call (arguments are checked here, before anything is sent)."""

    @staticmethod
    def create_session(body: Dict[str, Any], key: str) -> Op:
        def parse(data: Dict[str, Any], headers: Mapping[str, str]) -> Session:
            session = parse_session(data, "create session")
            session.replayed = is_replayed(headers)
            return session

        return Op("POST", "/sessions", "create session", json=body, headers={"Idempotency-Key": key}, parse=parse)

    @staticmethod
    def create_session_body(*args: Any) -> Dict[str, Any]:
        return create_session_body(*args)

    @staticmethod
    def list_sessions(limit: int, offset: int) -> Op:
        check_int("limit", limit, 1, 100)
        check_int("offset", offset, 0)
        return Op(
            "GET",
            "/sessions",
            "list sessions",
            params={"limit": limit, "offset": offset},
            parse=lambda d, h: session_page(d, limit, offset),
        )

    @staticmethod
    def get_session(session_id: Any) -> Op:
        return Op(
            "GET", session_path(session_id), "get session", True, parse=lambda d, h: parse_session(d, "get session")
        )

    @staticmethod
    def update_session(session_id: Any, ttl: Any, egress: Any) -> Op:
        body = update_session_body(ttl, egress)
        return Op(
            "PATCH",
            session_path(session_id),
            "update session",
            True,
            json=body,
            parse=lambda d, h: parse_session(d, "update session"),
        )

    @staticmethod
    def delete_session(session_id: Any, keep_workspace: Any, discard: Any) -> Op:
        params = delete_session_params(keep_workspace, discard)
        return Op("DELETE", session_path(session_id), "delete session", True, params=params, parse=_none)

    @staticmethod
    def stop_session(session_id: Any) -> Op:
        return _session_post(session_id, "stop")

    @staticmethod
    def pause_session(session_id: Any) -> Op:
        return _session_post(session_id, "pause")

    @staticmethod
    def resume_session(session_id: Any) -> Op:
        return _session_post(session_id, "resume")

    @staticmethod
    def fork_session(session_id: Any, count: Any) -> Op:
        n = check_int("count", count, 1)
        what = "fork session"

        def parse(data: Dict[str, Any], headers: Mapping[str, str]) -> List[Session]:
            items = data.get("sessions") if isinstance(data, dict) else None
            if not isinstance(items, list):
                raise SandboxOperationError(f"{what}: unexpected answer: no sessions", body=str(data)[:4096])
            return [parse_session(x, what) for x in items]

        return Op("POST", session_path(session_id) + "/fork", what, True, json={"count": n}, parse=parse)

    @staticmethod
    def run_python(
        session_id: Any, code: Any, kernel: Any, timeout: Any, max_output_bytes: Any, client_timeout: Optional[float]
    ) -> Op:
        body: Dict[str, Any] = {"code": check_text("code", code, allow_empty=True)}
        if kernel is not None:
            body["kernel"] = check_kernel(kernel)
        t = check_timeout("timeout", timeout)
        if t is not None:
            body["timeout"] = t
        if max_output_bytes is not None:
            body["maxOutputBytes"] = check_int("max_output_bytes", max_output_bytes, 0)
        # The answer comes when the code ends: wait its timeout (default 60 s),
        # the kernel's restart after it (SIGINT, then a kill 2 s later), plus ours.
        read: Optional[float] = None
        if client_timeout is not None:
            read = (t if t is not None else 60.0) + KERNEL_RESTART_SLACK + client_timeout
        return Op(
            "POST",
            session_path(session_id) + "/python",
            "run python",
            True,
            json=body,
            read_timeout=read,
            parse=lambda d, h: PythonResult.from_dict(d),
        )

    @staticmethod
    def reset_python(session_id: Any, kernel: Any) -> Op:
        body: Dict[str, Any] = {}
        if kernel is not None:
            body["kernel"] = check_kernel(kernel)
        return Op(
            "POST",
            session_path(session_id) + "/python/reset",
            "reset python",
            True,
            json=body,
            parse=lambda d, h: bool(d.get("existed")),
        )

    @staticmethod
    def create_workspace(name: Any) -> Op:
        body = {"name": check_workspace_name(name)}
        return Op(
            "POST",
            "/workspaces",
            "create workspace",
            json=body,
            parse=lambda d, h: parse_one(Workspace, d, "create workspace"),
        )

    @staticmethod
    def list_workspaces() -> Op:
        return Op(
            "GET",
            "/workspaces",
            "list workspaces",
            parse=lambda d, h: parse_list(Workspace, d, "workspaces", "list workspaces"),
        )

    @staticmethod
    def delete_workspace(name: Any) -> Op:
        return Op("DELETE", workspace_path(name), "delete workspace", parse=_none)

    @staticmethod
    def create_snapshot(session_id: Any) -> Op:
        return Op(
            "POST",
            session_path(session_id) + "/snapshots",
            "create snapshot",
            True,
            parse=lambda d, h: parse_one(Snapshot, d, "create snapshot"),
        )

    @staticmethod
    def list_snapshots(session: Any) -> Op:
        return Op(
            "GET",
            "/snapshots",
            "list snapshots",
            params=snapshot_params(session),
            parse=lambda d, h: parse_list(Snapshot, d, "snapshots", "list snapshots"),
        )

    @staticmethod
    def delete_snapshot(snapshot_id: Any) -> Op:
        return Op("DELETE", snapshot_path(snapshot_id), "delete snapshot", parse=_none)

    @staticmethod
    def session_stats(session_id: Any) -> Op:
        return Op(
            "GET",
            session_path(session_id) + "/stats",
            "session stats",
            True,
            parse=lambda d, h: parse_one(SessionStats, d, "session stats"),
        )

    @staticmethod
    def list_egress_decisions(session_id: Any, limit: Any, cursor: Any) -> Op:
        return Op(
            "GET",
            session_path(session_id) + "/egress",
            "list egress decisions",
            True,
            params=egress_decisions_params(limit, cursor),
            parse=lambda d, h: egress_decision_page(d),
        )

    @staticmethod
    def list_egress_pending(session_id: Any) -> Op:
        return Op(
            "GET",
            session_path(session_id) + "/egress/pending",
            "list egress pending",
            True,
            parse=lambda d, h: egress_pending_list(d),
        )

    @staticmethod
    def follow_egress_pending(session_id: Any) -> Op:
        # The stream lasts as long as the session: no read timeout (the
        # gateway sends a comment every 15 s).
        return Op(
            "GET",
            session_path(session_id) + "/egress/pending",
            "follow egress pending",
            True,
            params={"follow": "true"},
            headers={"Accept": "text/event-stream"},
            read_timeout=None,
        )

    @staticmethod
    def decide_egress(session_id: Any, pending_id: Any, decision: Any, remember: Any) -> Op:
        path = pending_path(session_id, pending_id)
        body = decide_body(decision, remember)
        return Op("POST", path, "decide egress", True, json=body, parse=lambda d, h: decided(d))

    @staticmethod
    def port_link(session_id: Any, port: Any, expires_in: Any) -> Op:
        path = session_path(session_id) + "/ports/link"
        body = port_link_body(port, expires_in)
        return Op("POST", path, "port link", True, json=body, parse=lambda d, h: port_link(d))

    @staticmethod
    def session_timeline(session_id: Any, kind: Any, after: Any, limit: Any, cursor: Any) -> Op:
        params = timeline_params(kind, after, limit, cursor)
        return Op(
            "GET",
            session_path(session_id) + "/timeline",
            "session timeline",
            True,
            params=params,
            parse=lambda d, h: timeline_page(d),
        )

    @staticmethod
    def list_audit(session: Any, since: Union[str, datetime, None], limit: Any, cursor: Any) -> Op:
        params = audit_params(session, since, limit, cursor)
        return Op("GET", "/audit", "list audit", params=params, parse=lambda d, h: audit_page(d))

    @staticmethod
    def run(session_id: Any, command: Any, argv: Any, client_timeout: Optional[float], **options: Any) -> Op:
        """A command (its result whole; :meth:`RestCore._stream_op` makes it streamed)."""
        path = session_path(session_id) + "/commands"
        body = command_body(command, argv, **options)
        # The answer comes when the command ends: wait its timeout, plus ours.
        return Op(
            "POST",
            path,
            "run command",
            True,
            json=body,
            read_timeout=run_read_timeout(body, client_timeout),
            parse=lambda d, h: command_result(d),
        )

    @staticmethod
    def delete_shell(session_id: Any, name: Any) -> Op:
        return Op("DELETE", shell_path(session_path(session_id), name), "delete shell", True, parse=_true)

    @staticmethod
    def list_commands(session_id: Any, limit: Any) -> Op:
        params = {}
        if limit is not None:
            params["limit"] = check_int("limit", limit, 1, 1000)
        return Op(
            "GET",
            session_path(session_id) + "/commands",
            "list commands",
            True,
            params=params,
            parse=lambda d, h: answer_list(d, "commands", "list commands"),
        )

    @staticmethod
    def file(method: str, session_id: Any, path: Any, what: str, params: Optional[Mapping[str, str]] = None) -> Op:
        """A request on ``.../files?path=...``; *what* is formatted with the checked path."""
        path = check_path("path", path)
        query = dict(params or {})
        query["path"] = path
        url = session_path(session_id) + "/files"
        return Op(method, url, what.format(path=path), True, params=query, filename=path)

    @staticmethod
    def list_files(session_id: Any, path: Any, recursive: Any) -> Op:
        op = ops.file("GET", session_id, path, "list files {path!r}", list_params(recursive))
        op.parse = lambda d, h: file_list(d, op.what)
        return op

    @staticmethod
    def delete_file(session_id: Any, path: Any, recursive: Any) -> Op:
        params = {"recursive": "true"} if check_bool("recursive", recursive) else {}
        op = ops.file("DELETE", session_id, path, "delete file {path!r}", params)
        op.parse = _none
        return op

    @staticmethod
    def write_file(session_id: Any, path: Any, mkdirs: Any, mode: Any) -> Op:
        """The request of ``write_file`` (its content comes from :func:`upload_content`)."""
        return ops.file("PUT", session_id, path, "write file {path!r}", write_params(mkdirs, mode))

    @staticmethod
    def fetch_urls(session_id: Any, urls: Any, dest_dir: Any, overwrite: Any, client_timeout: Optional[float]) -> Op:
        body = fetch_body(urls, dest_dir, overwrite)
        # Downloads take time: wait for them beyond the usual read timeout.
        read = None if client_timeout is None else max(client_timeout, 600.0)
        return Op("POST", session_path(session_id) + "/files/fetch", "fetch urls", True, json=body, read_timeout=read)

    @staticmethod
    def start_process(session_id: Any, command: Any, argv: Any, env: Any, cwd: Any, name: Any) -> Op:
        body = process_body(command, argv, env, cwd, name)
        return Op("POST", session_path(session_id) + "/processes", "start process", True, json=body)

    @staticmethod
    def list_processes(session_id: Any) -> Op:
        return Op(
            "GET",
            session_path(session_id) + "/processes",
            "list processes",
            True,
            parse=lambda d, h: answer_list(d, "processes", "list processes"),
        )

    @staticmethod
    def get_process(session_id: Any, process_id: Any) -> Op:
        return Op("GET", process_path(session_id, process_id), "get process", True)

    @staticmethod
    def process_output(session_id: Any, process_id: Any, params: Mapping[str, Any], follow: bool) -> Op:
        # Following waits as long as the process is silent.
        return Op(
            "GET",
            process_path(session_id, process_id) + "/output",
            "process output",
            True,
            params=params,
            headers={"Accept": NDJSON},
            read_timeout=None if follow else DEFAULT,
        )

    @staticmethod
    def process_input(session_id: Any, process_id: Any, data: Any, eof: Any) -> List[Op]:
        path = process_path(session_id, process_id) + "/stdin"
        return [Op("POST", path, "process input", True, json=b, parse=_none) for b in stdin_bodies(data, eof)]

    @staticmethod
    def signal_process(session_id: Any, process_id: Any, signal: Any) -> Op:
        body = signal_body(signal)
        path = process_path(session_id, process_id) + "/signal"
        return Op("POST", path, "signal process", True, json=body, parse=_none)


class RunLines:
    """A streamed ``run``'s answer, fed chunk by chunk: output goes to the
    callbacks, the last line becomes the result."""

    def __init__(self, on_stdout: Optional[ChunkCallback], on_stderr: Optional[ChunkCallback], what: str) -> None:
        self._stream = RunStream(on_stdout, on_stderr, what)
        self._splitter = NDJSONSplitter(what)

    def feed(self, chunk: bytes) -> Optional[CommandResult]:
        """The result when *chunk* completes it, else None (what a callback raises propagates)."""
        for line in self._splitter.feed(chunk):
            res = self._stream.line(line)
            if res is not None:
                return res
        return None

    def finish(self) -> CommandResult:
        """At the end of the body: the result, or SandboxConnectionError when it never came."""
        for line in self._splitter.finish():
            res = self._stream.line(line)
            if res is not None:
                return res
        raise self._stream.ended_early()


def is_ndjson(resp: httpx.Response) -> bool:
    """Whether a streamed run is answered in lines (else the whole result: a gateway that does not stream)."""
    return resp.headers.get("Content-Type", "").startswith(NDJSON)


def empty_file(e: SandboxAPIError) -> bool:
    """``read_file``'s 416: the range starts at 0, so the file is empty."""
    return e.status_code == 416


class FirstBytes:
    """``read_file``'s bytes: at most *max_bytes* of the chunks added."""

    def __init__(self, max_bytes: Optional[int]) -> None:
        self._max = max_bytes
        self._parts: List[bytes] = []
        self._got = 0

    def add(self, chunk: bytes) -> bool:
        """Keep *chunk*; True once there are enough."""
        if self._max is not None and self._got + len(chunk) >= self._max:
            self._parts.append(chunk[: self._max - self._got])
            return True
        self._parts.append(chunk)
        self._got += len(chunk)
        return False

    def data(self) -> bytes:
        return b"".join(self._parts)


class Download:
    """``read_file_to``'s destination: a local path (created, removed again
    if the download fails) or a writable binary file object."""

    def __init__(self, dest: Any, what: str) -> None:
        self._local: Optional[str] = os.fspath(dest) if isinstance(dest, (str, os.PathLike)) else None
        if self._local is None and not callable(getattr(dest, "write", None)):
            raise TypeError(f"dest must be a path or a writable binary file object, got {type(dest).__name__}")
        self._dest = dest
        self._what = what
        self._f: Any = None
        self._ok = False
        self.written = 0

    def open(self) -> None:
        self._f = open(self._local, "wb") if self._local is not None else self._dest

    def write(self, chunk: bytes) -> None:
        self._f.write(chunk)  # a local write error propagates as it is
        self.written += len(chunk)

    def done(self, headers: Mapping[str, str]) -> None:
        """The body ended: check it is whole."""
        expected = headers.get("Content-Length")
        if expected is not None and expected.isdigit() and int(expected) != self.written:
            raise SandboxConnectionError(f"{self._what}: got {self.written} of {expected} bytes")
        self._ok = True

    def close(self) -> None:
        if self._local is not None and self._f is not None:
            self._f.close()
            if not self._ok:
                try:
                    os.remove(self._local)
                except OSError:
                    pass


def _none(data: Any, headers: Any) -> None:
    return None


def _true(data: Any, headers: Any) -> bool:
    return True


def shell_missing(e: SandboxAPIError) -> bool:
    """``delete_shell``'s answer when the session had no such shell."""
    return e.status_code == 404 and e.code == "shell_not_found"


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))

#: The gateways (REST base URLs, see _gateway_key) this process has issued
#: an IsolationWarning for: once per process per gateway, however many
#: clients (sync, async, the SSH client's own) talk to it.
_isolation_warned: Set[str] = set()
_isolation_lock = threading.Lock()


def _gateway_key(base: str) -> str:
    """One gateway's REST base URL, spelled one way (scheme and host lower case)."""
    parts = urlsplit(base)
    return f"{parts.scheme.lower()}://{parts.netloc.lower()}{parts.path.rstrip('/')}"


def _first_isolation_warning(base: str) -> bool:
    """Whether this process has not yet warned about the gateway at *base* (and now has)."""
    key = _gateway_key(base)
    with _isolation_lock:
        if key in _isolation_warned:
            return False
        _isolation_warned.add(key)
        return True


def _outside_stacklevel() -> int:
    """The ``stacklevel`` of ``warnings.warn`` (called by this function's
    caller) that names the first frame outside the SDK: the user's line."""
    f = sys._getframe(1)
    level = 1
    while f.f_back is not None and os.path.dirname(os.path.abspath(f.f_code.co_filename)) == _PACKAGE_DIR:
        f = f.f_back
        level += 1
    return level


class RestCore:
    """The state and rules both REST clients share; subclasses add the I/O."""

    api_url: str
    timeout: Optional[float]
    verify_ssl: VerifySSL

    def _setup(
        self, api_url: Optional[str], bearer_token: Optional[str], timeout: Optional[float], verify_ssl: VerifySSL
    ) -> Dict[str, Any]:
        """Check the settings; return the keyword arguments of the httpx client."""
        self.api_url, self._token = resolve_settings(api_url, bearer_token)
        self.timeout = check_timeout("timeout", timeout)
        self.verify_ssl = verify_ssl
        self._base = rest_base(self.api_url)
        self._isolation_warned = False
        return dict(
            headers={
                "Authorization": f"Bearer {self._token}",
                "Accept": "application/json",
                "User-Agent": f"sandgate-sdk-python/{__version__}",
            },
            verify=ssl_context(verify_ssl),
            timeout=httpx_timeout(self.timeout, self.timeout),
        )

    def _timeout(self, timeout: Any = DEFAULT) -> httpx.Timeout:
        """*timeout* as httpx's: DEFAULT (the client's), an httpx.Timeout, a
        ``(connect, read)`` pair, a read timeout in seconds, or None (none)."""
        if timeout is DEFAULT:
            return httpx_timeout(self.timeout, self.timeout)
        if isinstance(timeout, httpx.Timeout):
            return timeout
        if isinstance(timeout, tuple):
            return httpx_timeout(*timeout)
        if self.timeout is None:
            return httpx_timeout(None, None)
        return httpx_timeout(self.timeout, timeout)

    def _op_args(self, op: Op) -> Dict[str, Any]:
        """The keyword arguments of ``_send`` for *op*."""
        return dict(
            what=op.what,
            session_scoped=op.session_scoped,
            timeout=op.read_timeout,
            filename=op.filename,
            **op.kwargs(),
        )

    @staticmethod
    def _stream_op(op: Op) -> Op:
        """*op* asking for the streamed (NDJSON) answer."""
        op.headers = dict(op.headers or {}, Accept=NDJSON)
        return op

    def _build(
        self, http: Any, method: str, path: str, timeout: httpx.Timeout, kwargs: Dict[str, Any]
    ) -> httpx.Request:
        return http.build_request(method, self._base + path, timeout=timeout, **kwargs)

    def _transport_error(self, what: str, e: BaseException, timeout: httpx.Timeout) -> SandboxConnectionError:
        """A failure to send a request (or get its answer's head)."""
        if isinstance(e, httpx.TimeoutException):
            t = timeout.connect if isinstance(e, (httpx.ConnectTimeout, httpx.PoolTimeout)) else timeout.read
            return SandboxConnectionError(f"{what}: timed out after {_seconds(t)} talking to {self.api_url}")
        if is_tls_error(e):
            return SandboxConnectionError(f"{what}: TLS error talking to {self.api_url}: {e}")
        return SandboxConnectionError(f"{what}: cannot reach {self.api_url}: {e}")

    @staticmethod
    def _status_error(
        resp: httpx.Response, content: bytes, what: str, session_scoped: bool, filename: Optional[str]
    ) -> SandboxAPIError:
        """The exception an answer >= 400 means."""
        err = error_for_status(
            resp.status_code,
            resp.reason_phrase or "",
            resp.headers,
            content,
            what=what,
            session_scoped=session_scoped,
        )
        if filename is not None and isinstance(err, (FileNotFoundInSandboxError, SandboxPermissionError)):
            err.filename = filename
        return err

    def _answer(self, resp: httpx.Response, what: str) -> Dict[str, Any]:
        """The JSON object of a successful answer whose body was read ({} for an empty one)."""
        data = json_answer(resp.status_code, resp.content, resp.headers, what)
        self._check_isolation(data)
        return data

    def _body_error(self, what: str, e: BaseException) -> BaseException:
        return body_error(what, self.api_url, e)

    def _check_isolation(self, data: Mapping[str, Any]) -> None:
        """Warn once per process per gateway when a session answer says ``"isolation": "none"``."""
        if self._isolation_warned or not isinstance(data, Mapping):
            return
        found: Sequence[Any] = [data]
        sessions = data.get("sessions")
        if isinstance(sessions, list):
            found = sessions
        for s in found:
            if isinstance(s, Mapping) and s.get("isolation") == "none":
                self._isolation_warned = True
                if not _first_isolation_warning(self._base):
                    return
                unenforced = s.get("unenforced")
                limits = ", ".join(str(x) for x in unenforced) if isinstance(unenforced, list) and unenforced else ""
                warnings.warn(
                    f"the sandgate gateway at {self.api_url} does not isolate sessions (\"isolation\": \"none\", "
                    "its workdir driver): their processes run as the gateway's user, with the host's files and "
                    "network" + (f"; not enforced: {limits}" if limits else ""),
                    IsolationWarning,
                    stacklevel=_outside_stacklevel(),
                )
                return
