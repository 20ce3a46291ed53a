"""SessionsClient: the REST API (``/v1/sessions``)."""

from __future__ import annotations

import os
import time
import uuid
from datetime import datetime
from typing import Any, BinaryIO, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import httpx

from ._common import (
    CREATE_RETRY_DELAYS,
    DEFAULT_COMMAND_TIMEOUT,
    ClosesOnExit,
    VerifySSL,
    check_idempotency_key,
    create_session_body,
    parse_session,
    process_path,
    session_path,
)
from ._dataplane import (
    CHUNK_BYTES,
    ChunkCallback,
    FileList,
    NDJSONStream,
    check_callback,
    check_shell_name,
    output_params,
    read_headers,
    whole_result,
)
from ._extra_ops import ExtraOps
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
from .handle import SessionHandle
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

__all__ = ["SessionsClient", "Shell", "FileList"]

#: Pauses before create_session's retries (so two retries at most).
_CREATE_RETRY_DELAYS: Tuple[float, ...] = CREATE_RETRY_DELAYS

#: The gateway's command timeout when a request gives none.
_DEFAULT_COMMAND_TIMEOUT = DEFAULT_COMMAND_TIMEOUT

#: The create retry rule (shared with the async client).
_create_retryable = create_retryable


class SessionsClient(RestCore, ExtraOps, ClosesOnExit):
    """Client of the sandgate REST API. Use it as a context manager::

        with SessionsClient(api_url="https://gw.example.com", bearer_token=TOKEN) as sessions:
            session = sessions.create_session(ttl=600, metadata={"project": "demo"})

    Args:
        api_url: The gateway's base URL, e.g. ``https://gw.example.com`` or
            ``https://gw.example.com/v1``; REST calls go to ``<base>/v1/sessions``
            (``/v1`` is not doubled). Defaults to ``$SANDBOX_API_URL``.
        bearer_token: The API key or JWT. Defaults to ``$SANDBOX_API_TOKEN``.
        timeout: Seconds to wait for the gateway (connect and each read).
        verify_ssl: Verify the server's TLS certificate: ``True``, ``False``,
            or the path of a CA bundle (file or directory).

    Raises:
        ValueError: when api_url or bearer_token is missing or malformed.
    """

    def __init__(
        self,
        api_url: Optional[str] = None,
        bearer_token: Optional[str] = None,
        timeout: float = 30,
        verify_ssl: VerifySSL = True,
    ) -> None:
        self._http = httpx.Client(**self._setup(api_url, bearer_token, timeout, verify_ssl))

    def __repr__(self) -> str:
        return f"SessionsClient(api_url={self.api_url!r})"

    # -- context manager -------------------------------------------------

    def __enter__(self) -> "SessionsClient":
        return self

    def close(self) -> None:
        """Close the underlying HTTP connections. Safe to call twice."""
        self._http.close()

    # -- API ---------------------------------------------------------------

    def create_session(
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
        """Create a session and its sandbox (``POST /v1/sessions``).

        Args:
            ttl: Lifetime in seconds, 60..28800.
            image: Sandbox image; the server's default when None.
            metadata: A JSON-serialisable dict stored with the session.
            ssh_public_key: An authorized_keys line; the matching private key
                then authenticates over SSH (``SessionSSHClient(pkey=...)``).
            idempotency_key: Sent as the ``Idempotency-Key`` header: the
                gateway answers a repeated key (same tenant, within 24 h)
                with the session the first request created instead of
                creating another. None (the default) sends a fresh random
                UUID. 1 to 255 printable ASCII characters, no spaces. Pass
                your own key to make retries across calls (or processes) safe.
            resources: The sandbox's limits, with the API's names:
                ``{"memoryMiB": 1024, "cpus": 2, "pids": 512, "diskMiB": 4096}``;
                any key may be left out (the gateway's default). Above the
                gateway's cap: :class:`ResourcesExceededError`; below the
                minimum: :class:`InvalidResourcesError`. The Session's
                ``resources`` show what is in force.
            labels: Another name for ``metadata`` (give one of the two).
            egress: The hosts the sandbox may reach, through the gateway's
                egress proxy: hostnames (``"pypi.org"``), wildcards
                (``"*.pythonhosted.org"``: any subdomain, not the apex), IP
                literals (``"10.0.0.5"``, ``"[2001:db8::1]"``), each with an
                optional ``:port`` (none: ports 80 and 443), or a dict with
                rules per request: ``{"host": "api.github.com", "port": 443,
                "methods": ["GET"], "paths": ["/repos/acme/*"]}``. None or ``[]``:
                no network. The Session's ``egress_allow`` shows the list in
                canonical form. An entry that does not parse:
                :class:`InvalidEgressError`; outside what the gateway's
                operator allows: :class:`EgressNotAllowedError`.
            secrets: Operator-defined secrets (``serve --secrets-file``) to
                give the session, by name. A name (``"PYPI_TOKEN"``) sets
                the environment variable of that name to the secret's value
                in every command, shell and SFTP process. A dict
                ``{"name": "GITHUB_TOKEN", "hosts": ["api.github.com"],
                "header": "Authorization", "format": "Bearer {value}"}``
                keeps the value out of the sandbox: the variable holds a
                placeholder and the egress proxy sets ``header`` (default
                ``Authorization``) to ``format`` (default ``Bearer
                {value}``) on HTTPS requests to ``hosts``, which ``egress``
                must cover. A secret the operator defined as an SSH key
                (``ssh-key``) is given the same way, bound to its hosts
                (``{"name": "DEPLOY_KEY", "hosts": ["github.com:22"]}``,
                no header or format): the gateway's SSH agent, at
                ``SSH_AUTH_SOCK`` in every process, signs with it while
                the session is connected to those hosts, and the key
                never enters the sandbox. Names the gateway does not define:
                :class:`UnknownSecretError`; a malformed reference:
                :class:`InvalidSecretError`; hosts outside ``egress``:
                :class:`EgressNotAllowedError`. Values never appear in the
                Session.
            workspace: A named workspace of the tenant
                (:meth:`create_workspace`) to mount at ``/workspace``: the
                session starts with its files and they are kept when it
                ends. None there: :class:`WorkspaceNotFoundError`; another
                live session holds it: :class:`WorkspaceBusyError`.
            from_snapshot: A snapshot id (:meth:`create_snapshot`) whose
                files the new ``/workspace`` starts with (several sessions
                may: a fork). None there: :class:`SnapshotNotFoundError`.
                Not with ``workspace``.
            name: A name for the session, unique among the tenant's live
                sessions (``409 name_taken``): every method that takes a
                ``session_id`` also takes it (an id always wins), and so
                does ``sandgate proxy`` (``ssh NAME.sandgate``).

        Retries: when the gateway cannot be reached, the connection breaks,
        the request times out, or it answers 500, 502, 503 or 504, the create
        is sent again, up to twice more (after 0.5 s, then 1 s), with the
        same key, so a retry never makes a second session. TLS errors,
        ``image_pull_timeout`` and ``image_store_full`` (a retry would not
        change them) and other answers (4xx, 429 included) are raised at once.

            egress_mode: ``"deny"`` (the default: a connection outside
                ``egress`` is refused) or ``"ask"`` (it waits for approval:
                :meth:`list_egress_pending`, :meth:`decide_egress`).

        Returns:
            The Session. Its ``password`` is set only in the answer that
            created it: keep it if you want SSH password authentication
            later. When the gateway replayed an earlier create of the same
            key (``Idempotent-Replayed: true``, e.g. the first answer was
            lost on the way), the Session has ``replayed=True`` and
            ``password`` None; SessionSSHClient then authenticates with the
            bearer token (SSH ``none``) or a key given as ``ssh_public_key``.

        Raises:
            ValueError, TypeError: bad arguments (nothing is sent).
            UnauthorizedError, RateLimitError, SandboxOperationError,
            SandboxConnectionError: see the README's error table.
        """
        body = create_session_body(
            ttl, image, metadata, ssh_public_key, resources, labels, egress, secrets, workspace, from_snapshot, name, egress_mode
        )
        key = check_idempotency_key(idempotency_key) if idempotency_key is not None else str(uuid.uuid4())
        op = ops.create_session(body, key)
        for attempt in range(len(_CREATE_RETRY_DELAYS) + 1):
            try:
                return self._do(op)
            except SandboxAPIError as e:
                if attempt == len(_CREATE_RETRY_DELAYS) or not _create_retryable(e):
                    raise
            time.sleep(_CREATE_RETRY_DELAYS[attempt])
        raise AssertionError("unreachable")  # pragma: no cover

    def open_session(self, **create_args: Any) -> SessionHandle:
        """Create a session (:meth:`create_session`'s arguments) and return a
        handle on it shaped like seed 003's ``Session``: ``exec`` (in a
        persistent shell), ``write``, ``read``, ``run_python``, ``destroy``
        (see :class:`~sandbox_sessions_sdk.handle.SessionHandle`)."""
        session = self.create_session(**create_args)
        return SessionHandle(self, session.session_id, session)

    def session(self, session_id: str) -> SessionHandle:
        """A :class:`~sandbox_sessions_sdk.handle.SessionHandle` on an
        existing session, by id or name (nothing is sent)."""
        session_path(session_id)
        return SessionHandle(self, session_id)

    def list_sessions(self, limit: int = 50, offset: int = 0) -> Dict[str, Any]:
        """List this tenant's sessions (``GET /v1/sessions``).

        Args:
            limit: Page size, 1..100.
            offset: Number of sessions to skip, >= 0.

        Returns:
            ``{"sessions": [Session, ...], "total": int, "limit": int, "offset": int}``
        """
        return self._do(ops.list_sessions(limit, offset))

    def get_session(self, session_id: str) -> Session:
        """Fetch one session (``GET /v1/sessions/{id}``), by id or by name.

        Raises:
            SessionNotFoundError: no such session for this token's tenant.
        """
        return self._do(ops.get_session(session_id))

    def update_session(
        self, session_id: str, ttl: Optional[int] = None, egress: Optional[Sequence[EgressEntry]] = None
    ) -> Session:
        """Change a session (``PATCH /v1/sessions/{id}``).

        With neither argument, nothing changes (an empty PATCH, which still
        counts as activity and returns the session).

        Args:
            ttl: When given, the session expires ``ttl`` seconds from now
                (60..28800) and that becomes its ``ttl``; call it again
                before ``expires_at`` to keep a long task's session alive.
                The change survives a gateway restart. None changes nothing.
            egress: When given, replaces the running session's egress
                allow-list (entries as for :meth:`create_session`); new
                connections follow it at once. ``[]`` takes the network
                away. None changes nothing.

        Returns:
            The session after the change.

        Raises:
            ValueError, TypeError: bad arguments (nothing is sent).
            SessionNotFoundError: no such session for this token's tenant.
            InvalidEgressError, EgressNotAllowedError: as for create_session.
            SandboxOperationError: the session is not running (``.code``
                ``session_not_running``), or the gateway could not record
                the change (503 ``store_failed``; nothing changed).
        """
        return self._do(ops.update_session(session_id, ttl, egress))

    def delete_session(
        self, session_id: str, keep_workspace: Optional[bool] = None, discard: Optional[bool] = None
    ) -> None:
        """Delete a session and everything in its sandbox (``DELETE /v1/sessions/{id}``).

        200 and 204 both count as success. A session holding a named
        workspace saves it first; when that fails the session is not
        deleted and keeps its files (SandboxOperationError, ``.code``
        ``workspace_sync_failed``: 409 when its files hold more than the
        workspace may, 503 when the gateway's store failed).

        Args:
            keep_workspace: ``False`` also removes the named workspace the
                session holds (``?keepWorkspace=false``); None or ``True``
                keep it (the gateway's default).
            discard: ``True`` ends the session without saving its named
                workspace (``?discard=true``): what changed since the last
                sync is lost, the workspace keeps its last saved version.

        Raises:
            SessionNotFoundError: no such session (or already deleted).
            SandboxOperationError: ``workspace_sync_failed``, see above.
        """
        self._do(ops.delete_session(session_id, keep_workspace, discard))

    def stop_session(self, session_id: str) -> Session:
        """Stop a session, keeping its files (``POST /v1/sessions/{id}/stop``).

        Every process of the session ends (commands, shells, background
        processes, the Python kernels, SSH connections) and its memory and
        CPU are freed; its files stay. The next command, SSH connection or
        kernel call starts it again on the same files (status ``running``).
        Stopping a stopped session changes nothing.

        Returns:
            The session, ``status`` ``stopped``.

        Raises:
            SessionNotFoundError: no such session for this token's tenant.
            SandboxOperationError: ``.code`` ``stop_unsupported`` (the
                gateway's sandbox driver cannot stop sessions) or
                ``session_not_running`` (a failed session).
        """
        return self._do(ops.stop_session(session_id))

    def pause_session(self, session_id: str) -> Session:
        """Pause a session's processes where they are (``POST /v1/sessions/{id}/pause``).

        Every process stays as it is, with its memory (the Python kernels'
        variables, background servers, persistent shells' ``cd`` and
        ``export``), and takes no CPU; SSH connections open at the pause
        end. The next command, SSH connection, kernel call or preview
        resumes it (or :meth:`resume_session`). A gateway restart keeps it
        paused. Pausing a paused session changes nothing.

        Returns:
            The session, ``status`` ``paused``; ``raw["pause"]`` is the
            pause's report: ``method`` (``checkpoint``: dumped to disk and
            ended, its memory freed; ``freeze``: parked in memory),
            ``residentBytes`` (the memory it still holds), ``notKept``
            (what the pause does not keep).

        Raises:
            SessionNotFoundError: no such session for this token's tenant.
            SandboxOperationError: ``.code`` ``pause_unsupported`` (the
                gateway's sandbox driver cannot pause sessions),
                ``session_stopped`` or ``session_not_running``.
        """
        return self._do(ops.pause_session(session_id))

    def resume_session(self, session_id: str) -> Session:
        """Resume a paused session (``POST /v1/sessions/{id}/resume``).

        Its processes run again where they were (status ``running``).
        Resuming a running session changes nothing; any use of a paused
        session resumes it as well.

        Raises:
            SessionNotFoundError: no such session for this token's tenant.
            SandboxOperationError: ``.code`` ``session_stopped`` or
                ``session_not_running``.
        """
        return self._do(ops.resume_session(session_id))

    def fork_session(self, session_id: str, count: int = 1) -> List[Session]:
        """Copy a running session, processes and memory included (``POST /v1/sessions/{id}/fork``).

        Makes ``count`` new sessions (1 to 8), each a copy of this one as it
        was at one instant: its processes with their memory (the Python
        kernels' variables, background servers) and its workspace. The
        source keeps running. Each fork has its own id, password, egress
        proxy and secret bindings, with the source's settings. Needs a
        gateway run with ``serve --checkpoint`` (the linux driver and CRIU).

        Returns:
            The new sessions, each with its ``password`` (shown only here).

        Raises:
            ValueError: ``count`` below 1 (nothing is sent).
            SessionNotFoundError: no such session for this token's tenant.
            SandboxOperationError: ``.code`` ``invalid_count`` (more than
                8), ``fork_unsupported`` (this gateway or session cannot be
                forked), ``session_stopped``, ``fork_failed``,
                ``fork_gateway_limit`` (2 forks run on the gateway already).
        """
        return self._do(ops.fork_session(session_id, count))

    # -- workspaces and snapshots --------------------------------------------

    def create_workspace(self, name: str) -> Workspace:
        """Create an empty named workspace (``POST /v1/workspaces``), private
        to this tenant; mount it with ``create_session(workspace=name)``.

        Raises:
            ValueError: a name the API refuses (1 to 63 of ``A-Za-z0-9._-``,
                starting with a letter or digit; nothing is sent).
            WorkspaceExistsError: the tenant has a workspace of that name.
            WorkspacesUnavailableError: the gateway keeps no workspaces.
            RateLimitError: ``.code`` ``workspace_limit``: the tenant keeps as
                many workspaces as the gateway allows; delete one first.
        """
        return self._do(ops.create_workspace(name))

    def list_workspaces(self) -> List[Workspace]:
        """This tenant's workspaces, by name (``GET /v1/workspaces``)."""
        return self._do(ops.list_workspaces())

    def delete_workspace(self, name: str) -> None:
        """Delete a workspace and its files (``DELETE /v1/workspaces/{name}``).

        Raises:
            WorkspaceNotFoundError: the tenant has none of that name.
            WorkspaceBusyError: a live session holds it; end it first.
        """
        self._do(ops.delete_workspace(name))

    def create_snapshot(self, session_id: str) -> Snapshot:
        """Snapshot the session's ``/workspace`` (``POST /v1/sessions/{id}/snapshots``).

        Start sessions from it with ``create_session(from_snapshot=snap.snapshot_id)``.
        Under the workdir driver processes cannot be frozen: the result's
        ``consistent`` is then False.

        Raises:
            SessionNotFoundError: no such session.
            SandboxOperationError: ``.code`` ``snapshot_failed`` (503), ``session_not_running``...
            RateLimitError: ``.code`` ``snapshot_limit``: the tenant keeps as
                many snapshots as the gateway allows; delete one first.
        """
        return self._do(ops.create_snapshot(session_id))

    def list_snapshots(self, session: Optional[str] = None) -> List[Snapshot]:
        """This tenant's snapshots, newest first (``GET /v1/snapshots``);
        only *session*'s when given (ended sessions' too)."""
        return self._do(ops.list_snapshots(session))

    def delete_snapshot(self, snapshot_id: str) -> None:
        """Delete a snapshot (``DELETE /v1/snapshots/{id}``); sessions started
        from it keep their files.

        Raises:
            SnapshotNotFoundError: the tenant has no such snapshot.
        """
        self._do(ops.delete_snapshot(snapshot_id))

    # -- usage, previews, audit ---------------------------------------------

    def session_stats(self, session_id: str) -> SessionStats:
        """The session's resource use now (``GET /v1/sessions/{id}/stats``):
        memory, CPU, pids, disk, tunnel and egress bytes (what the driver
        can measure; the workdir driver only disk)."""
        return self._do(ops.session_stats(session_id))

    def list_egress_decisions(
        self, session_id: str, limit: int = 100, cursor: Optional[str] = None
    ) -> EgressDecisionPage:
        """One page of the session's latest egress decisions, newest first
        (``GET /v1/sessions/{id}/egress``): each connection, request,
        refused name and approval, as it ended (at most 1000 kept).

        Args:
            limit: At most this many, 1..1000.
            cursor: A previous page's ``next_cursor``, for older ones.
        """
        return self._do(ops.list_egress_decisions(session_id, limit, cursor))

    def list_egress_pending(self, session_id: str) -> List[EgressPending]:
        """The session's connections waiting for approval, oldest first
        (``GET /v1/sessions/{id}/egress/pending``; a session created with
        ``egress_mode="ask"``). A UI that waits for them can follow
        ``?follow=true``, a stream of server-sent events."""
        return self._do(ops.list_egress_pending(session_id))

    def follow_egress_pending(self, session_id: str) -> Iterator[EgressPendingEvent]:
        """Wait for the session's connections that need approval
        (``GET .../egress/pending?follow=true``, server-sent events): yields
        an :class:`EgressPendingEvent` ``pending`` for each connection
        parked (those waiting already first) and ``resolved`` once it no
        longer waits, until the session ends. The request is sent at once
        (errors raise here); close the generator to stop."""
        op = ops.follow_egress_pending(session_id)
        resp = self._send(op.method, op.path, stream=True, **self._op_args(op))

        def events() -> Iterator[EgressPendingEvent]:
            parser = SSEParser()
            try:
                for line in resp.iter_lines():
                    ev = parser.feed(line)
                    if ev is not None:
                        yield ev
            finally:
                resp.close()

        return events()

    def decide_egress(
        self, session_id: str, pending_id: str, decision: str, remember: bool = False
    ) -> EgressPending:
        """Allow or deny a connection waiting for approval
        (``POST /v1/sessions/{id}/egress/pending/{pendingId}``).

        Args:
            decision: ``"allow"`` or ``"deny"``.
            remember: Keep the decision for its host:port: ``allow`` adds it
                to the session's egress list, ``deny`` to its deny list.

        Raises:
            SandboxOperationError: ``.code`` ``pending_not_found`` (404: it was
                decided, timed out or its client left).
        """
        return self._do(ops.decide_egress(session_id, pending_id, decision, remember))

    def preview_url(self, session_id: str, port: int, path: str = "/") -> str:
        """The URL of the session's preview of *port* at *path*
        (``<api>/v1/sessions/{id}/ports/{port}/{path}``; nothing is sent).

        The gateway passes requests to it to ``http://localhost:{port}`` in
        the sandbox. It needs this client's bearer token
        (``Authorization``) and is meant for programs: it is on the API's
        origin, so its answers come with ``Content-Security-Policy:
        sandbox`` and without cookies. For a browser (or a teammate), use
        :meth:`port_link`, whose URL is an origin of the preview's own.
        """
        return preview_url(self._base, session_id, port, path)

    def port_link(self, session_id: str, port: int, expires_in: Optional[int] = None) -> PortLink:
        """A presigned link to the session's *port* (``POST .../ports/link``):
        anyone holding its ``url`` reaches the server without a token, until
        ``expires_at`` or the session ends. The URL is an origin of its own,
        ``http://p{port}-{label}.localhost:{api port}/`` by default (the
        gateway's ``--preview-domain`` otherwise): browsers and curl resolve
        ``*.localhost`` to the loopback; a client whose resolver does not
        can connect to the gateway's address with that ``Host`` header.

        Args:
            expires_in: Seconds it is valid, 1..604800 (gateway default 3600).

        Raises:
            SandboxOperationError: ``.code`` ``ports_disabled`` (403),
                ``session_not_running``...
        """
        return self._do(ops.port_link(session_id, port, expires_in))

    def list_audit(
        self,
        session: Optional[str] = None,
        since: Union[str, datetime, None] = None,
        limit: int = 100,
        cursor: Optional[str] = None,
    ) -> AuditPage:
        """One page of this tenant's audit events, newest first (``GET /v1/audit``).

        Args:
            session: Only this session's events.
            since: Only events at or after this time (an aware datetime or RFC 3339 text).
            limit: At most this many events, 1..1000.
            cursor: A previous page's ``next_cursor``, for older events.

        Raises:
            SandboxOperationError: ``.code`` ``audit_unavailable`` (the gateway keeps no audit log).
        """
        return self._do(ops.list_audit(session, since, limit, cursor))

    def iter_audit(
        self, session: Optional[str] = None, since: Union[str, datetime, None] = None, page_size: int = 100
    ) -> Iterator[AuditEvent]:
        """Every matching audit event, newest first, following ``next_cursor``
        page after page (requests are sent as you iterate)."""
        cursor: Optional[str] = None
        while True:
            page = self.list_audit(session=session, since=since, limit=page_size, cursor=cursor)
            yield from page.events
            if page.next_cursor is None or page.next_cursor == cursor:
                return
            cursor = page.next_cursor

    def session_timeline(
        self,
        session_id: str,
        kind: Union[str, Sequence[str], None] = None,
        after: Optional[int] = None,
        limit: int = 100,
        cursor: Optional[str] = None,
    ) -> AuditPage:
        """One page of what the session did, newest first (``GET /v1/sessions/{id}/timeline``).

        Its commands (SSH, REST, shells, kernel calls), egress decisions,
        file reads, writes, moves and deletes, and lifecycle (``session``
        events, a snapshot among them), as audit events
        (:class:`AuditEvent`, ``seq`` as in :meth:`list_audit`).

        Args:
            kind: Only these kinds: ``command``, ``egress``, ``file``, ``session`` (one or a list).
            after: Only events newer than the one with this ``seq`` (to follow a running session).
            limit: At most this many events, 1..1000; a page may hold fewer, or none, and
                still have a ``next_cursor``.
            cursor: A previous page's ``next_cursor``, for older events.

        Raises:
            SandboxOperationError: ``.code`` ``audit_unavailable`` (the gateway keeps no audit log).
        """
        return self._do(ops.session_timeline(session_id, kind, after, limit, cursor))

    # -- data plane: commands ----------------------------------------------

    def run(
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
        """Run a command in the session's sandbox over REST (``POST /v1/sessions/{id}/commands``).

        Args:
            command: Shell text, run by the sandbox's shell (``sh -c``, bash
                where present). Give exactly one of ``command`` and ``argv``.
            argv: Program and arguments, run with no shell parsing at all.
            stdin: The command's whole standard input (str, or bytes sent
                base64); it then gets EOF. None: empty input.
            env: Environment variables for this command; only ``TERM``,
                ``LANG``, ``LC_*`` and the gateway's allow-list
                (``serve --ssh-env-allow``), else ``SandboxOperationError``
                ``env_not_allowed``.
            cwd: Where it runs: relative to the workspace, or absolute in
                the sandbox (a directory that does not exist makes the
                command fail with exit status 1).
            timeout: Seconds (the gateway's default is 60, its maximum 3600
                unless configured otherwise). When it passes, the command's
                whole process tree is killed and the result has
                ``exit_code`` 124 and ``timed_out`` True: a timeout is a
                result, not an exception (unlike ``SessionSSHClient.run_command``).
            max_output_bytes: Bytes kept per stream (gateway default 1 MiB,
                capped by the gateway). Beyond it ``truncated`` is True and
                the stream holds its first half and last half, nothing in
                between (no marker); when streaming, its head only.
            shell: Run in the session's persistent shell of this name
                (``cd``, ``export``... carry over); see :meth:`shell`.
            background: Keep the command running if this client goes away
                (its result then lands in :meth:`list_commands`).
            on_stdout, on_stderr: Called with each chunk of output as it
                arrives (``str``, or ``bytes`` for a chunk that is not UTF-8
                text), on the calling thread. Giving either makes the request
                use the streaming mode (``Accept: application/x-ndjson``). If
                a callback raises, the request is dropped (which kills the
                command unless ``background``) and the exception propagates.

        Returns:
            A :class:`CommandResult`: ``stdout``, ``stderr`` (decoded as
            UTF-8, invalid bytes as U+FFFD; the callbacks get exact bytes),
            ``exit_code`` (the command's status; ``128 + signum`` with
            ``exit_signal`` set when a signal ended it), ``truncated``,
            ``timed_out``, ``cwd`` and ``duration_ms``. A non-zero exit code
            is not an error.

        Raises:
            ValueError, TypeError: bad arguments (nothing is sent).
            SessionNotFoundError: no such session for this token's tenant.
            ShellBusyError: 32 commands already wait for that shell.
            RateLimitError: ``.code`` ``too_many_shells`` (16 shells),
                ``too_many_commands`` (the tenant's running commands hold its
                share of the gateway's memory for output; retry after
                ``.retry_after``, or ask for a smaller ``max_output_bytes``),
                or the request rate limit.
            SandboxOperationError: the gateway refused the command
                (``.code``: ``env_not_allowed``, ``invalid_timeout``,
                ``session_not_running``, ``shell_closed``,
                ``commands_unavailable`` (503: the gateway's memory for
                output is taken; retry), ``shutting_down`` (503: the gateway
                stopped while the command ran; ``.body`` holds the output
                so far)...).
            SandboxConnectionError: the gateway could not be reached, or the
                connection broke during the command.
        """
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
            return self._do(op)
        resp = self._send(op.method, op.path, stream=True, **self._op_args(self._stream_op(op)))
        try:
            if not is_ndjson(resp):
                return whole_result(self._json(resp, op.what), on_stdout, on_stderr)
            lines = RunLines(on_stdout, on_stderr, op.what)
            # What a callback raises propagates as it is (and the connection is dropped).
            for chunk in self._chunks(resp, op.what):
                res = lines.feed(chunk)
                if res is not None:
                    return res
            return lines.finish()
        finally:
            resp.close()

    def shell(self, session_id: str, name: str = "default") -> "Shell":
        """A handle on the session's persistent shell *name* (nothing is sent yet).

        The shell is created by its first command: see :class:`Shell`.
        Names are 1 to 64 of ``[A-Za-z0-9_.-]`` (``ValueError`` otherwise).
        """
        self._session_path(session_id)
        return Shell(self, session_id, check_shell_name(name))

    def delete_shell(self, session_id: str, name: str) -> bool:
        """End the persistent shell *name* (``DELETE /v1/sessions/{id}/shells/{name}``).

        Kills it with its whole process tree and forgets its saved state;
        commands waiting for it fail with ``.code`` ``shell_closed``.

        Returns:
            True if the shell existed, False if the session had no shell of that name.
        """
        try:
            return self._do(ops.delete_shell(session_id, name))
        except SandboxOperationError as e:
            if shell_missing(e):
                return False
            raise

    def list_commands(self, session_id: str, limit: Optional[int] = None) -> List[Dict[str, Any]]:
        """The session's recent commands (``GET /v1/sessions/{id}/commands``).

        REST and SSH commands alike (a persistent shell's one by one), oldest
        first, each once it has ended, as the API's dicts: ``command``,
        ``source`` (``"rest"`` or ``"ssh"``), ``shell``, ``startedAt``,
        ``durationMs``, ``exitCode``, ``exitSignal``, ``timedOut``,
        ``bytesOut``. The gateway keeps the last 1,000.

        Args:
            limit: Only the most recent *limit* (1..1000); None: all kept.
        """
        return self._do(ops.list_commands(session_id, limit))

    # -- data plane: the Python kernel -------------------------------------

    def run_python(
        self,
        session_id: str,
        code: str,
        *,
        kernel: Optional[str] = None,
        timeout: Optional[float] = None,
        max_output_bytes: Optional[int] = None,
    ) -> PythonResult:
        """Run *code* in the session's persistent Python kernel (``POST /v1/sessions/{id}/python``).

        Like a notebook cell: variables, imports and definitions persist
        from one call to the next in the same *kernel* (default
        ``default``; a session has at most 8). When the code ends with an
        expression, ``result`` is its ``repr``. An exception it does not
        catch is ``error`` (a result, not a raise: the kernel stays).

        Args:
            code: Python source.
            kernel: The kernel's name (1 to 64 of ``[A-Za-z0-9_.-]``).
            timeout: Seconds (the gateway's default 60): then the code gets
                SIGINT (``interrupted``, state kept), and 2 s later the
                kernel is restarted (``restarted``, ``state_lost``).
            max_output_bytes: Per stream and for the result (the gateway's
                default 1 MiB).

        Raises:
            SandboxOperationError: ``python_unavailable`` (no ``python3`` in
                the image), ``kernel_busy``, ``too_many_kernels``...
        """
        return self._do(ops.run_python(session_id, code, kernel, timeout, max_output_bytes, self.timeout))

    def reset_python(self, session_id: str, kernel: Optional[str] = None) -> bool:
        """End a kernel's interpreter (``POST .../python/reset``): the next
        :meth:`run_python` starts with no state; files are untouched.
        Returns whether the kernel had an interpreter."""
        return self._do(ops.reset_python(session_id, kernel))

    # -- data plane: files -------------------------------------------------

    def read_file(self, session_id: str, path: str, *, max_bytes: Optional[int] = None) -> bytes:
        """The bytes of the sandbox file *path* (``GET /v1/sessions/{id}/files``).

        Relative paths start at the workspace, absolute ones at the sandbox's
        root. The whole file is held in memory: use :meth:`read_file_to` for
        large ones.

        Args:
            max_bytes: Read at most the first *max_bytes* bytes (a ``Range``
                request); >= 1.

        Raises:
            FileNotFoundInSandboxError: nothing at *path*.
            SandboxPermissionError: the sandbox's user may not read it.
            SandboxOperationError: ``.code`` ``is_a_directory``,
                ``not_a_regular_file``...
        """
        op = ops.file("GET", session_id, path, "read file {path!r}")
        try:
            headers = read_headers(max_bytes)
            resp = self._send(op.method, op.path, stream=True, **self._op_args(op), headers=headers)
        except SandboxOperationError as e:
            if empty_file(e):
                return b""
            raise
        head = FirstBytes(max_bytes)
        try:
            for chunk in self._chunks(resp, op.what, CHUNK_BYTES):
                if head.add(chunk):
                    break
        finally:
            resp.close()
        return head.data()

    def read_file_to(self, session_id: str, path: str, dest: Union[str, "os.PathLike[str]", BinaryIO]) -> int:
        """Stream the sandbox file *path* into *dest*, 1 MiB at a time.

        Args:
            dest: A local path (created or replaced; removed again if the
                download fails) or a binary file object to write to.

        Returns:
            The number of bytes written.

        Raises:
            as :meth:`read_file`; SandboxConnectionError when the download
            broke off (fewer bytes than announced).
        """
        op = ops.file("GET", session_id, path, "read file {path!r}")
        out = Download(dest, op.what)
        resp = self._send(
            op.method, op.path, stream=True, **self._op_args(op), headers={"Accept": "application/octet-stream"}
        )
        try:
            out.open()
            for chunk in self._chunks(resp, op.what, CHUNK_BYTES):
                out.write(chunk)
            out.done(resp.headers)
        finally:
            resp.close()
            out.close()
        return out.written

    def write_file(
        self,
        session_id: str,
        path: str,
        data: Union[bytes, str, BinaryIO],
        *,
        mode: Union[int, str, None] = None,
        mkdirs: bool = True,
    ) -> Dict[str, Any]:
        """Write the sandbox file *path* (``PUT /v1/sessions/{id}/files``).

        The gateway writes a temporary file and renames it over *path* when
        complete: readers see the old or the new file, and a failed upload
        leaves nothing.

        Args:
            data: ``bytes``, ``str`` (written as UTF-8), or a readable file
                object, streamed 1 MiB at a time and never read whole (with a
                ``Content-Length`` when its size can be known: a regular or
                seekable file; otherwise chunked).
            mode: Permission bits, ``0o755`` or ``"755"``; None: those of the
                file replaced, else 0644.
            mkdirs: Create missing parent directories (default True).

        Returns:
            The written file's entry: ``name``, ``path``, ``type``,
            ``sizeBytes``, ``mode``, ``mtime``.

        Raises:
            FileNotFoundInSandboxError: the parent directory is missing (``mkdirs=False``).
            SandboxPermissionError: the sandbox's user may not write there.
            FileTooLargeError: over the gateway's ``--max-file-bytes``.
            DiskFullError: the sandbox's filesystem is full.
            SandboxOperationError: ``.code`` ``is_a_directory``, ``not_a_directory``...
        """
        op = ops.write_file(session_id, path, mkdirs, mode)
        content, headers = upload_content(data, op.what)
        resp = self._send(op.method, op.path, **self._op_args(op), content=content, headers=headers)
        return self._json(resp, op.what)

    def list_files(self, session_id: str, path: str = ".", recursive: bool = False) -> FileList:
        """List the sandbox directory *path* (``GET .../files?list=true``).

        Args:
            path: The directory (default the workspace).
            recursive: Walk its subdirectories too, breadth first, never
                through a symlink, up to the gateway's 10,000 entries.

        Returns:
            A :class:`FileList`: a list of entry dicts (``name``, ``path``,
            ``type`` ``file``/``dir``/``symlink``/``other``, ``sizeBytes``,
            ``mode`` ``"0644"``, ``mtime``) whose ``.truncated`` is True when
            the listing stopped at 10,000 entries.

        Raises:
            FileNotFoundInSandboxError: nothing at *path*.
            SandboxOperationError: ``.code`` ``not_a_directory``...
        """
        return self._do(ops.list_files(session_id, path, recursive))

    def delete_file(self, session_id: str, path: str, recursive: bool = False) -> None:
        """Delete a sandbox file, symlink or empty directory (``DELETE .../files``).

        Args:
            recursive: Remove a directory with everything in it (never
                following a symlink).

        Raises:
            FileNotFoundInSandboxError: nothing at *path*.
            SandboxOperationError: ``.code`` ``directory_not_empty`` (without
                ``recursive``), ``invalid_path`` (the root or the workspace)...
        """
        self._do(ops.delete_file(session_id, path, recursive))

    def fetch_urls(
        self, session_id: str, urls: Sequence[str], dest_dir: str = ".", overwrite: bool = False
    ) -> Dict[str, Any]:
        """Have the gateway download *urls* into the sandbox (``POST .../files/fetch``).

        The gateway fetches them (4 at a time, public addresses only unless
        its ``--egress-allow-cidr`` allows others, at most
        ``--max-fetch-bytes`` each) and writes each into *dest_dir* (created
        if missing), named after its ``Content-Disposition`` or URL. A name
        the remote server chose never starts with a dot (``.bashrc`` is
        written as ``bashrc``).

        Args:
            urls: 1 to 200 absolute http(s) URLs.
            dest_dir: The sandbox directory (default the workspace).
            overwrite: Replace files already there. False (the default)
                never replaces anything: a download takes the next free
                name (``a-1.csv``).

        Returns:
            ``{"status": "success" | "partial_success" | "failure",
            "fetched": [paths written, in the order of urls],
            "errors": [{"url": ..., "error": ...}]}``: one URL's failure
            is reported there, not raised.

        Raises:
            ValueError, TypeError: bad arguments (nothing is sent).
            SandboxOperationError: ``.code`` ``invalid_url``, ``not_a_directory``,
                ``fetch_unavailable``...
        """
        return self._do(ops.fetch_urls(session_id, urls, dest_dir, overwrite, self.timeout))

    # -- data plane: background processes -----------------------------------

    def start_process(
        self,
        session_id: str,
        command: Optional[str] = None,
        *,
        argv: Optional[Sequence[str]] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        name: Optional[str] = None,
    ) -> Dict[str, Any]:
        """Start a background process (``POST /v1/sessions/{id}/processes``).

        It runs detached from any request until it exits, is signalled, or
        the session ends; the gateway keeps the last 16 MiB of its output.

        Args:
            command: Shell text (``sh -c``); or ``argv``, a list of words run
                as they are. Exactly one of the two.
            env: Variables to set (at most 64); names the gateway does not
                allow are ignored and listed in the answer's ``envIgnored``.
            cwd: Where it starts (relative to the workspace when relative).
            name: A label of your own (at most 64 characters).

        Returns:
            The process, as the API's dict: ``processId`` (``"p1"``, what the
            other process methods take), ``pid``, ``name``, ``command``,
            ``status`` (``running``, ``exited``, ``killed``), ``exitCode``,
            ``exitSignal``, ``startedAt``, ``outputBytes``, ``envIgnored``...

        Raises:
            RateLimitError: ``.code`` ``too_many_processes`` (64 running).
        """
        return self._do(ops.start_process(session_id, command, argv, env, cwd, name))

    def list_processes(self, session_id: str) -> List[Dict[str, Any]]:
        """The session's background processes: the running ones and the 100
        that finished last, in the order they started (dicts as :meth:`start_process`)."""
        return self._do(ops.list_processes(session_id))

    def get_process(self, session_id: str, process_id: str) -> Dict[str, Any]:
        """One background process (dict as :meth:`start_process`).

        Raises:
            ProcessNotFoundError: no such process (or finished long ago and forgotten).
        """
        return self._do(ops.get_process(session_id, process_id))

    def process_output(self, session_id: str, process_id: str, offset: int = 0, follow: bool = True) -> NDJSONStream:
        """Read (and follow) a background process's output (``GET .../processes/{pid}/output``).

        The request is sent at once (errors raise here); the answer is read
        as you iterate.

        Args:
            offset: The first byte (both streams counted together, from the
                process's start); negative: that many bytes before the end.
            follow: Go on as the process writes, until it has ended. False:
                stop at the output's current end.

        Returns:
            An iterator of the API's lines, as dicts: ``{"offset", "stdout"}``
            (or ``stderr``, ``stdoutBase64``, ``stderrBase64``),
            ``{"droppedBytes", "offset"}`` when the asked bytes are no longer
            kept, ``{"truncated": "disk_full", "offset"}`` once where the
            output stopped being kept (the session's disk size was full;
            the process runs on), and last ``{"done": True, "exitCode" or "exitSignal",
            "nextOffset"}`` (``{"done": False, "nextOffset"}`` when it is
            still running without ``follow``, or the session ended; with
            ``"error": {"code": "session_paused", ...}`` when the session
            was paused: following again from ``nextOffset`` resumes it). Use it
            in a ``with`` block, or call ``.close()``, to drop the
            connection early (the process is not affected).

        Raises:
            ProcessNotFoundError: no such process.
        """
        op = ops.process_output(session_id, process_id, output_params(offset, follow), follow)
        resp = self._send(op.method, op.path, stream=True, **self._op_args(op))
        return NDJSONStream(resp, op.what, lambda e: body_error(op.what, self.api_url, e))

    def send_process_input(self, session_id: str, process_id: str, data: Union[str, bytes], eof: bool = False) -> None:
        """Write *data* to a background process's standard input (``POST .../stdin``).

        Args:
            data: Text or bytes; large data is sent in several requests
                (the gateway takes 64 KiB a request), in order.
            eof: Close the process's standard input afterwards.

        Raises:
            ProcessExitedError: the process has ended.
            SandboxOperationError: ``.code`` ``stdin_closed`` (an earlier
                ``eof``), ``stdin_blocked`` (the process did not read its
                input for 10 seconds).
        """
        for op in ops.process_input(session_id, process_id, data, eof):
            self._do(op)

    def signal_process(self, session_id: str, process_id: str, signal: Union[str, int] = "TERM") -> None:
        """Send *signal* to a background process's group (``POST .../signal``).

        Args:
            signal: A name with or without ``SIG`` (``"TERM"``, ``"SIGKILL"``,
                ``"int"``), or a :class:`signal.Signals` member; one of ABRT,
                ALRM, FPE, HUP, ILL, INT, KILL, PIPE, QUIT, SEGV, TERM, USR1, USR2.

        Raises:
            ProcessExitedError: the process has already ended.
        """
        self._do(ops.signal_process(session_id, process_id, signal))

    # -- internals ---------------------------------------------------------

    _process_path = staticmethod(process_path)
    _session_path = staticmethod(session_path)
    _session = staticmethod(parse_session)

    def _do(self, op: Op) -> Any:
        """Send a plain call; return its parsed answer."""
        data, headers = self._call(op.method, op.path, **self._op_args(op))
        return op.result(data, headers)

    def _request(
        self, method: str, path: str, *, what: str, session_scoped: bool = False, **kwargs: Any
    ) -> Dict[str, Any]:
        return self._call(method, path, what=what, session_scoped=session_scoped, **kwargs)[0]

    def _call(
        self, method: str, path: str, *, what: str, session_scoped: bool = False, **kwargs: Any
    ) -> Tuple[Dict[str, Any], Mapping[str, str]]:
        """Send one request; return the answer's JSON object and its headers."""
        resp = self._send(method, path, what=what, session_scoped=session_scoped, **kwargs)
        return self._answer(resp, what), resp.headers

    def _send(
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
        """Send one request; return the answer (its body unread when *stream*,
        else read and the connection released), or raise the error an answer
        >= 400 means."""
        t = self._timeout(timeout)
        try:
            resp = self._http.send(self._build(self._http, method, path, t, kwargs), stream=True)
        except TRANSPORT_ERRORS as e:
            raise self._transport_error(what, e, t) from e
        if resp.status_code >= 400:
            try:
                content = resp.read()
            except TRANSPORT_ERRORS:
                content = b""
            finally:
                resp.close()
            raise self._status_error(resp, content, what, session_scoped, filename)
        if not stream:
            self._read(resp, what)
        return resp

    def _read(self, resp: httpx.Response, what: str) -> None:
        try:
            resp.read()
        except TRANSPORT_ERRORS as e:
            raise self._body_error(what, e) from e
        finally:
            resp.close()

    def _json(self, resp: httpx.Response, what: str) -> Dict[str, Any]:
        """The JSON object of a successful answer ({} for an empty one)."""
        if not resp.is_closed:
            self._read(resp, what)
        return self._answer(resp, what)

    def _chunks(self, resp: httpx.Response, what: str, size: Optional[int] = None) -> Iterator[bytes]:
        """An answer's body, chunk by chunk; a network error reading it becomes SandboxConnectionError."""
        chunks = resp.iter_bytes(size)
        while True:
            try:
                chunk = next(chunks)
            except StopIteration:
                return
            except TRANSPORT_ERRORS as e:
                raise self._body_error(what, e) from e
            yield chunk


class Shell(ClosesOnExit):
    """A session's persistent shell, from :meth:`SessionsClient.shell`.

    Its commands run one at a time in one shell process (bash if the
    sandbox has it, else sh), so ``cd``, ``export``, functions, aliases and
    variables carry over from one :meth:`run` to the next. A command that
    times out is killed with the shell; the next command gets a new shell
    that restores the exported variables, functions, aliases and directory
    saved after the last command that finished (plain unexported variables
    are lost). Use it as a context manager: ``__exit__`` calls :meth:`close`::

        with sessions.shell(session_id) as sh:
            sh.run("cd /tmp && export A=1")
            print(sh.run("pwd; echo $A").stdout)   # /tmp, 1

    Attributes:
        session_id: The session.
        name: The shell's name.
    """

    def __init__(self, client: SessionsClient, session_id: str, name: str) -> None:
        self.client = client
        self.session_id = session_id
        self.name = name

    def __repr__(self) -> str:
        return f"Shell(session_id={self.session_id!r}, name={self.name!r})"

    def __enter__(self) -> "Shell":
        return self

    def run(self, command: Optional[str] = None, **options: Any) -> CommandResult:
        """Run *command* in this shell: :meth:`SessionsClient.run` with ``shell=name``.

        Takes the same keyword options (``argv``, ``stdin``, ``env``,
        ``cwd``, ``timeout``, ``max_output_bytes``, ``background``,
        ``on_stdout``, ``on_stderr``) except ``shell``. The result's ``cwd``
        is the shell's directory after the command.
        """
        if "shell" in options:
            raise TypeError("Shell.run() takes no 'shell' option: the shell is this one")
        return self.client.run(self.session_id, command, shell=self.name, **options)

    def close(self) -> None:
        """End the shell with its whole process tree (``DELETE .../shells/{name}``).

        Safe to call twice, and on a shell that never ran a command. A later
        :meth:`run` starts a new shell of the same name.
        """
        self.client.delete_shell(self.session_id, self.name)
