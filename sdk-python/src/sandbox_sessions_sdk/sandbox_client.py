"""Code-execution sandbox surface available to agents via ``ctx.sandbox``.

The abstract :class:`SandboxClient` is what agent code programs against. The
runtime layer (host-side microsandbox + FUSE-mounted MinIO, in-cluster
DaemonSet, hosted SaaS) supplies a concrete implementation.

The sandbox is **general-purpose code execution**, not Python-only. Agents
can:

* run arbitrary shell pipelines:
  ``await ctx.sandbox.run_shell("git clone … && cargo build")``
* exec a binary with explicit args (no shell parsing):
  ``await sb.exec("/usr/bin/git", ["clone", url])``
* pick any OCI image:
  ``run_shell("npx @openai/codex …", image="node:20-slim")``

``run_python`` is just a convenience for the common Python-snippet case.

Why an abstract here when ``microsandbox`` itself already has a Python SDK?
The platform owns the *policy* layer — bucket selection, network egress,
write-path restrictions, resource caps, audit logging. Agents must depend on
the policy-respecting surface, not on the raw SDK, so the same agent code
runs unchanged across local dev / cluster / hosted environments.

sandgate's implementation
-------------------------

:class:`ExecResult`, :class:`SandboxSpec`, :class:`SandboxHandle`,
:class:`SandboxClient` and :class:`SandboxUnavailable` are the interface,
unchanged. :class:`SandgateSandboxClient` and :class:`SandgateSandboxHandle`
implement it on sandgate's REST API, one sandbox being one session:

* The async methods run the blocking :class:`~sandbox_sessions_sdk.SessionsClient`
  calls in a worker thread (:func:`asyncio.to_thread`), so they do not block
  the event loop and several may run at once (each holds one thread while it
  waits; the underlying httpx connection pool is shared).
* ``SandboxSpec.name`` is the session's ``name`` (unique among the tenant's
  live sessions: a second ``create`` of a live name raises
  :class:`~sandbox_sessions_sdk.SandboxOperationError` ``name_taken``);
  ``get``/``remove`` find the session by it (``GET /v1/sessions?name=``).
* ``memory_mib``/``cpus`` are the session's ``resources``, ``secrets`` its
  secrets by name, ``egress`` its allow-list (empty: no network, as on the
  gateway), ``labels`` its labels. ``workspace`` is a named workspace of
  the tenant mounted as the session's ``/workspace`` (created when it does
  not exist yet): the sandbox starts with its files, and they outlive the
  sandbox (``remove`` keeps the workspace; one live sandbox holds it at a
  time, another ``create`` with it raises
  :class:`~sandbox_sessions_sdk.WorkspaceBusyError`).
* ``exec`` and ``shell`` are ``POST /v1/sessions/{id}/commands`` (argv, or
  shell text); a command that passes its timeout is killed and gives
  ``exit_code`` 124 (a result, not an exception). ``kill`` deletes the
  session; ``stop`` is ``POST /v1/sessions/{id}/stop`` (on a gateway without
  that endpoint, or whose sandbox driver cannot stop sessions, it raises
  :class:`NotImplementedError`); ``logs`` is ``GET /v1/sessions/{id}/logs``.
* Errors are the SDK's own (:class:`~sandbox_sessions_sdk.SandboxAPIError`
  and subclasses); an unknown name is
  :class:`~sandbox_sessions_sdk.SessionNotFoundError`.
"""

from __future__ import annotations

import asyncio
import inspect
import time
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, TypeVar

from ._common import check_hosts as _check_hosts
from ._common import check_resources as _check_resources
from ._common import check_secrets as _check_secrets
from .client import (
    _CREATE_RETRY_DELAYS,
    SessionsClient,
    _create_retryable,
)
from ._workspaces import check_workspace_name
from .errors import SandboxAPIError, SessionNotFoundError, WorkspaceExistsError, WorkspaceNotFoundError
from .models import CommandResult, Session

__all__ = [
    "ExecResult",
    "SandboxSpec",
    "SandboxHandle",
    "SandboxClient",
    "SandboxUnavailable",
    "SandgateSandboxClient",
    "SandgateSandboxHandle",
]

_T = TypeVar("_T")


# -- the interface (seed 002), unchanged ---------------------------------------


@dataclass(frozen=True)
class ExecResult:
    """Result of a command run inside a sandbox."""

    stdout: str
    stderr: str = ""
    exit_code: int = 0
    truncated: bool = False

    @property
    def output(self) -> str:
        """Convenience: combined stdout+stderr."""
        return self.stdout + (self.stderr or "")

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass(frozen=True)
class SandboxSpec:
    """Caller request shape for :meth:`SandboxClient.create`."""

    name: str
    image: str = "python:3.11-slim"
    memory_mib: int = 512
    cpus: int = 1
    # If set, the runtime mounts this workspace at ``/workspace`` inside the
    # VM (FUSE-backed where supported, snapshot bridge otherwise).
    workspace: str | None = None
    # Logical names the runtime should resolve to actual secrets and inject
    # into the VM env. Values never appear in the CLI/API surface.
    secrets: tuple[str, ...] = ()
    # Egress allowlist by hostname; empty = deny all.
    egress: tuple[str, ...] = ()
    # Free-form labels for audit / billing.
    labels: dict[str, str] = field(default_factory=dict)


class SandboxHandle(ABC):
    """Live handle to a running sandbox VM."""

    name: str

    @abstractmethod
    async def exec(
        self,
        cmd: str,
        args: Sequence[str] | None = None,
        *,
        timeout: float | None = None,
    ) -> ExecResult: ...

    @abstractmethod
    async def shell(self, script: str, *, timeout: float | None = None) -> ExecResult: ...

    @abstractmethod
    async def stop(self) -> None: ...

    @abstractmethod
    async def kill(self) -> None: ...

    @abstractmethod
    async def logs(self, *, tail: int | None = None) -> str: ...


class SandboxClient(ABC):
    """Negotiation surface handed to agents via ``ctx.sandbox``."""

    @abstractmethod
    async def create(self, spec: SandboxSpec) -> SandboxHandle: ...

    @abstractmethod
    async def get(self, name: str) -> SandboxHandle: ...

    @abstractmethod
    async def list(self) -> list[str]: ...

    @abstractmethod
    async def remove(self, name: str) -> None: ...

    async def run_python(self, code: str, *, image: str = "python:3.11-slim", **kwargs: Any) -> ExecResult:
        """Convenience: spin a one-shot sandbox, run inline Python, tear down.

        Equivalent to ``create(SandboxSpec(image=image)).exec("python", ["-c", code])``.
        Use the lower-level surface when you need persistence, multiple
        commands, or non-Python tools.
        """
        import uuid

        spec = SandboxSpec(name=f"py-{uuid.uuid4().hex[:8]}", image=image, **kwargs)
        sb = await self.create(spec)
        try:
            return await sb.exec("python", ["-c", code])
        finally:
            try:
                await sb.stop()
            except Exception:  # noqa: BLE001
                pass
            try:
                await self.remove(spec.name)
            except Exception:  # noqa: BLE001
                pass

    async def run_shell(
        self,
        script: str,
        *,
        image: str = "python:3.11-slim",
        **kwargs: Any,
    ) -> ExecResult:
        """Convenience: spin a one-shot sandbox, run an arbitrary shell script, tear down.

        Pass ``image=`` to pick the toolchain (e.g. ``"node:20-slim"`` for
        npm-based tools like codex, ``"rust:1-slim"`` for cargo,
        ``"alpine/git"`` for plain git ops). The default
        ``python:3.11-slim`` already has bash/coreutils/curl/git so most
        one-liners just work.
        """
        import uuid

        spec = SandboxSpec(name=f"sh-{uuid.uuid4().hex[:8]}", image=image, **kwargs)
        sb = await self.create(spec)
        try:
            return await sb.shell(script)
        finally:
            try:
                await sb.stop()
            except Exception:  # noqa: BLE001
                pass
            try:
                await self.remove(spec.name)
            except Exception:  # noqa: BLE001
                pass


class SandboxUnavailable(RuntimeError):
    """Raised when ``ctx.sandbox`` is accessed but no runtime is attached."""


# -- sandgate's implementation ---------------------------------------------------

#: The SandboxSpec defaults for fields sandgate does not build; any other
#: value raises NotImplementedError naming the field (none left: workspace
#: mounts a named workspace).
_UNBUILT_FIELDS: Dict[str, Any] = {}

#: Answers to POST .../stop that mean "this gateway cannot stop sessions".
_NO_STOP_CODES = frozenset({"unknown_endpoint", "stop_unsupported"})


def _exec_result(res: CommandResult) -> ExecResult:
    return ExecResult(stdout=res.stdout, stderr=res.stderr, exit_code=res.exit_code, truncated=res.truncated)


def _session_name(session: Session) -> Optional[str]:
    name = session.raw.get("name") if isinstance(session.raw, Mapping) else None
    return name if isinstance(name, str) and name else None


class SandgateSandboxHandle(SandboxHandle):
    """A sandbox on sandgate: one session, reached over the REST data plane.

    Attributes:
        name: The sandbox's (the session's) name.
        session_id: The session's id (``sbx-...``), for the lower-level
            :class:`~sandbox_sessions_sdk.SessionsClient` calls (files,
            processes, SSH...).
    """

    def __init__(self, sessions: SessionsClient, name: str, session_id: str) -> None:
        self._sessions = sessions
        self.name = name
        self.session_id = session_id

    def __repr__(self) -> str:
        return f"SandgateSandboxHandle(name={self.name!r}, session_id={self.session_id!r})"

    async def exec(
        self,
        cmd: str,
        args: Sequence[str] | None = None,
        *,
        timeout: float | None = None,
    ) -> ExecResult:
        """Run *cmd* with *args* (no shell parsing): ``POST .../commands`` with ``argv``.

        A non-zero exit is a result (``ok`` False). After *timeout* seconds
        (the gateway's default 60 when None) the command's process tree is
        killed and the result has ``exit_code`` 124.
        """
        if isinstance(args, (str, bytes)):
            raise TypeError("args must be a sequence of strings, not a string")
        argv = [cmd, *(args or ())]
        res = await asyncio.to_thread(self._sessions.run, self.session_id, argv=argv, timeout=timeout)
        return _exec_result(res)

    async def shell(self, script: str, *, timeout: float | None = None) -> ExecResult:
        """Run *script* with the sandbox's shell (``sh -c``, bash where present).

        Each call gets a fresh shell (``cd``/``export`` do not carry over);
        timeout as for :meth:`exec`.
        """
        res = await asyncio.to_thread(self._sessions.run, self.session_id, script, timeout=timeout)
        return _exec_result(res)

    async def stop(self) -> None:
        """Stop the sandbox, keeping its files (``POST /v1/sessions/{id}/stop``).

        Its processes end; the next command starts it again.

        Raises:
            NotImplementedError: the gateway has no stop endpoint, or its
                sandbox driver cannot stop sessions (use :meth:`kill`).
            SessionNotFoundError: the sandbox is gone.
        """
        path = self._sessions._session_path(self.session_id) + "/stop"
        try:
            await asyncio.to_thread(self._sessions._call, "POST", path, what="stop session", session_scoped=True)
        except SandboxAPIError as e:
            if e.code in _NO_STOP_CODES or e.status_code in (405, 501):
                raise NotImplementedError(
                    f"sandbox {self.name!r}: this sandgate gateway lacks stop (POST /v1/sessions/{{id}}/stop "
                    f"answered HTTP {e.status_code} {e.code or ''}); use kill() to end the sandbox"
                ) from e
            raise

    async def kill(self) -> None:
        """End the sandbox and delete everything in it (``DELETE /v1/sessions/{id}``).

        Killing a sandbox that is already gone does nothing.
        """
        try:
            await asyncio.to_thread(self._sessions.delete_session, self.session_id)
        except SessionNotFoundError:
            pass

    async def logs(self, *, tail: int | None = None) -> str:
        """The sandbox's recent commands and background process output, as text.

        ``GET /v1/sessions/{id}/logs``: at most *tail* commands and lines of
        each process's output (1..10000; the gateway's default 100 when None).
        """
        params: Dict[str, Any] = {}
        if tail is not None:
            if isinstance(tail, bool) or not isinstance(tail, int):
                raise TypeError(f"tail must be an int, got {type(tail).__name__}")
            if not 1 <= tail <= 10000:
                raise ValueError("tail must be 1..10000")
            params["tail"] = tail
        path = self._sessions._session_path(self.session_id) + "/logs"

        def get() -> str:
            resp = self._sessions._send(
                "GET", path, what="session logs", session_scoped=True, params=params, headers={"Accept": "text/plain"}
            )
            return resp.content.decode(resp.charset_encoding or "utf-8", errors="replace")

        return await asyncio.to_thread(get)


class SandgateSandboxClient(SandboxClient):
    """:class:`SandboxClient` on a sandgate gateway: a sandbox is a session.

    Args:
        sessions: The :class:`~sandbox_sessions_sdk.SessionsClient` to use
            (not closed by :meth:`close`). None: one is made from
            *api_url*, *bearer_token*, *timeout* and *verify_ssl* (which
            default to ``$SANDBOX_API_URL`` and ``$SANDBOX_API_TOKEN``) and
            closed by :meth:`close`.
        ttl: Lifetime of each sandbox's session in seconds (60..28800); the
            gateway deletes it after that.
        images: Image names to translate before they reach the gateway, e.g.
            ``{"python:3.11-slim": "default"}`` on a gateway whose own root
            (``default``) stands in for that image, or to pin a digest.
            Names not in it are sent as they are.

    Use it as an async (or plain) context manager to close it::

        async with SandgateSandboxClient(api_url=URL, bearer_token=TOKEN) as sandbox:
            res = await sandbox.run_shell("echo hi")
    """

    def __init__(
        self,
        sessions: Optional[SessionsClient] = None,
        *,
        api_url: Optional[str] = None,
        bearer_token: Optional[str] = None,
        timeout: float = 30,
        verify_ssl: Any = True,
        ttl: int = 3600,
        images: Optional[Mapping[str, str]] = None,
    ) -> None:
        if sessions is None:
            sessions = SessionsClient(
                api_url=api_url, bearer_token=bearer_token, timeout=timeout, verify_ssl=verify_ssl
            )
            self._owns = True
        else:
            if api_url is not None or bearer_token is not None:
                raise ValueError("give sessions or api_url/bearer_token, not both")
            self._owns = False
        self.sessions: SessionsClient = sessions
        self.ttl = ttl
        self.images: Dict[str, str] = dict(images or {})

    def __repr__(self) -> str:
        return f"SandgateSandboxClient(api_url={self.sessions.api_url!r})"

    def close(self) -> None:
        """Close the SessionsClient this client made (not one it was given)."""
        if self._owns:
            self.sessions.close()

    def __enter__(self) -> "SandgateSandboxClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    async def __aenter__(self) -> "SandgateSandboxClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()

    async def _call(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        return await asyncio.to_thread(fn, *args, **kwargs)

    # -- create ----------------------------------------------------------

    def _create_body(self, spec: SandboxSpec) -> Dict[str, Any]:
        if not isinstance(spec, SandboxSpec):
            raise TypeError(f"spec must be a SandboxSpec, got {type(spec).__name__}")
        for fname, default in _UNBUILT_FIELDS.items():
            if getattr(spec, fname) != default:
                raise NotImplementedError(
                    f"SandboxSpec.{fname}={getattr(spec, fname)!r}: sandgate does not implement {fname} "
                    f"(leave it {default!r}; each sandbox has its own empty workspace)"
                )
        if not isinstance(spec.name, str) or not spec.name:
            raise ValueError("SandboxSpec.name must be a non-empty string")
        if not isinstance(spec.image, str) or not spec.image:
            raise ValueError("SandboxSpec.image must be a non-empty string")
        body: Dict[str, Any] = {
            "name": spec.name,
            "image": self.images.get(spec.image, spec.image),
            "resources": _check_resources({"memoryMiB": spec.memory_mib, "cpus": spec.cpus}),
            "labels": dict(spec.labels),
        }
        if spec.egress:
            body["egress"] = _check_hosts("egress", spec.egress)
        if spec.secrets:
            body["secrets"] = _check_secrets(spec.secrets)
        if spec.workspace is not None:
            body["workspace"] = check_workspace_name(spec.workspace)
        return body

    def _create_session(self, body: Dict[str, Any]) -> Session:
        """Create the session, with ``name``.

        Through ``SessionsClient.create_session(name=...)`` when this SDK
        has it; else the same request (and the same retries, under one
        Idempotency-Key) sent here.
        """
        try:
            return self._create_session_once(body)
        except WorkspaceNotFoundError:
            if "workspace" not in body:
                raise
        # The spec's workspace does not exist yet: make it, then mount it.
        try:
            self.sessions.create_workspace(body["workspace"])
        except WorkspaceExistsError:
            pass  # made meanwhile by another client: use it
        return self._create_session_once(body)

    def _create_session_once(self, body: Dict[str, Any]) -> Session:
        if "name" in inspect.signature(self.sessions.create_session).parameters:
            fields = dict(body)
            fields["metadata"] = fields.pop("labels")
            return self.sessions.create_session(ttl=self.ttl, **fields)  # type: ignore[arg-type]
        fields = dict(body, ttl=self.ttl)
        key = str(uuid.uuid4())
        for attempt in range(len(_CREATE_RETRY_DELAYS) + 1):
            try:
                data, _ = self.sessions._call(
                    "POST", "/sessions", what="create session", json=fields, headers={"Idempotency-Key": key}
                )
                break
            except SandboxAPIError as e:
                if attempt == len(_CREATE_RETRY_DELAYS) or not _create_retryable(e):
                    raise
                time.sleep(_CREATE_RETRY_DELAYS[attempt])
        return self.sessions._session(data, "create session")

    async def create(self, spec: SandboxSpec) -> SandboxHandle:
        """Create the sandbox *spec* describes and return its handle.

        ``spec.workspace`` names a workspace of the tenant to mount as the
        sandbox's ``/workspace``; it is created when it does not exist.

        Raises:
            WorkspaceBusyError: another live sandbox holds ``spec.workspace``.
            SandboxOperationError: the gateway refused it (``.code``
                ``name_taken``, ``unknown_image``, ``invalid_name``...).
        """
        body = self._create_body(spec)
        session = await self._call(self._create_session, body)
        return SandgateSandboxHandle(self.sessions, spec.name, session.session_id)

    # -- lookup ------------------------------------------------------------

    def _find(self, name: str) -> Session:
        if not isinstance(name, str) or not name:
            raise ValueError("name must be a non-empty string")
        data, _ = self.sessions._call("GET", "/sessions", what="find sandbox", params={"name": name})
        items = data.get("sessions")
        if not isinstance(items, list) or not items:
            raise SessionNotFoundError(f"find sandbox: no sandbox named {name!r}")
        return self.sessions._session(items[0], "find sandbox")

    async def get(self, name: str) -> SandboxHandle:
        """The handle of the sandbox named *name* (``GET /v1/sessions?name=``).

        Raises:
            SessionNotFoundError: no live sandbox of that name.
        """
        session = await self._call(self._find, name)
        return SandgateSandboxHandle(self.sessions, name, session.session_id)

    def _names(self) -> List[str]:
        names: List[str] = []
        offset = 0
        while True:
            page = self.sessions.list_sessions(limit=100, offset=offset)
            sessions = page["sessions"]
            for s in sessions:
                name = _session_name(s)
                if name is not None and s.status != "failed" and name not in names:
                    names.append(name)
            offset += len(sessions)
            if not sessions or offset >= int(page.get("total") or 0):
                return names

    async def list(self) -> list[str]:
        """The names of this tenant's sandboxes (oldest first; failed ones and
        sessions created without a name are left out)."""
        return await self._call(self._names)

    async def remove(self, name: str, *, discard: Optional[bool] = None) -> None:
        """Delete the sandbox named *name* and everything in it.

        ``discard=True`` ends it without saving its named workspace (see
        :meth:`SessionsClient.delete_session`).

        Raises:
            SessionNotFoundError: no sandbox of that name.
        """

        def remove() -> None:
            self.sessions.delete_session(self._find(name).session_id, discard=discard)

        await self._call(remove)

    async def run_python(self, code: str, *, image: str = "python:3.11-slim", **kwargs: Any) -> ExecResult:
        """Convenience: spin a one-shot sandbox, run inline Python, tear down.

        As :meth:`SandboxClient.run_python` (the same steps: create, exec,
        stop, remove), with ``python3 -c code``: the name every Python image
        and Debian-like root has (``python`` alone is missing from many).
        Use the lower-level surface when you need persistence, multiple
        commands, or non-Python tools.
        """
        spec = SandboxSpec(name=f"py-{uuid.uuid4().hex[:8]}", image=image, **kwargs)
        sb = await self.create(spec)
        try:
            return await sb.exec("python3", ["-c", code])
        finally:
            try:
                await sb.stop()
            except Exception:  # noqa: BLE001
                pass
            try:
                await self.remove(spec.name)
            except Exception:  # noqa: BLE001
                pass
