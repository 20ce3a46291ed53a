"""Exceptions raised by the SDK.

Every failure of an SDK call is a :class:`SandboxAPIError` (bad arguments
raise the usual :class:`ValueError` / :class:`TypeError` before anything is
sent)::

    SandboxAPIError
    +-- SandboxConnectionError      network, TLS, tunnel (non-200 CONNECT), SSH handshake
    |   +-- HostKeyMismatchError    the server's SSH host key is not the pinned one
    +-- UnauthorizedError           HTTP 401 (REST or CONNECT)
    +-- SessionNotFoundError        HTTP 404 for a session (REST or CONNECT)
    |   +-- SessionGoneError        410 session_gone: the session was deleted or expired lately (.reason says why)
    +-- RateLimitError              HTTP 429 (REST or CONNECT)
    |   +-- ShellBusyError          429 shell_busy: 32 commands already wait for that persistent shell
    +-- SandboxOperationError       other 4xx/5xx, SSH auth/exec/SFTP failures, use before connect
        +-- CommandTimeoutError     run_command() passed its timeout; the command was killed
        +-- ResourcesExceededError  400 resources_exceeded: a resource above the gateway's cap
        +-- InvalidResourcesError   400 invalid_resources: a resource below its minimum
        +-- InvalidEgressError      400 invalid_egress: an egress entry that does not parse
        +-- EgressNotAllowedError   400 egress_not_allowed: egress (or a secret's hosts) outside what is allowed
        +-- UnknownSecretError      400 unknown_secret: secrets the gateway does not define
        +-- InvalidSecretError      400 invalid_secret: a malformed secret reference
        +-- FileNotFoundInSandboxError   404 file_not_found (also a FileNotFoundError)
        +-- SandboxPermissionError  403 permission_denied: the sandbox's user may not (also a PermissionError)
        +-- FileTooLargeError       413 file_too_large: a write over the gateway's --max-file-bytes
        +-- DiskFullError           507 disk_full: the sandbox's filesystem is full; nothing was written
        +-- ProcessNotFoundError    404 process_not_found: no such background process
        +-- ProcessExitedError      409 process_exited: the background process has ended
        +-- WorkspaceNotFoundError  404 workspace_not_found: the tenant has no workspace of that name
        +-- WorkspaceExistsError    409 workspace_exists: the tenant already has a workspace of that name
        +-- WorkspaceBusyError      409 workspace_busy: a live session holds the workspace
        +-- SnapshotNotFoundError   404 snapshot_not_found: the tenant has no such snapshot
        +-- WorkspacesUnavailableError  400 workspaces_unavailable: this gateway keeps no workspaces
    +-- UnsupportedParamikoError    the installed Paramiko is outside the supported range
                                    (also a RuntimeError); raised by SessionSSHClient.connect()

One warning, not an error: :class:`IsolationWarning` (a UserWarning), issued
once per process per gateway URL when the gateway answers a session with ``"isolation":
"none"`` (its workdir driver: nothing is isolated, no limit is enforced).
Silence it with ``warnings.simplefilter("ignore", IsolationWarning)``.
"""

from __future__ import annotations

import re
from typing import Any, List, Mapping, Optional

__all__ = [
    "SandboxAPIError",
    "SandboxConnectionError",
    "HostKeyMismatchError",
    "UnauthorizedError",
    "SessionNotFoundError",
    "SessionGoneError",
    "RateLimitError",
    "SandboxOperationError",
    "CommandTimeoutError",
    "ResourcesExceededError",
    "InvalidResourcesError",
    "InvalidEgressError",
    "EgressNotAllowedError",
    "UnknownSecretError",
    "InvalidSecretError",
    "FileNotFoundInSandboxError",
    "SandboxPermissionError",
    "FileTooLargeError",
    "DiskFullError",
    "ShellBusyError",
    "ProcessNotFoundError",
    "ProcessExitedError",
    "WorkspaceNotFoundError",
    "WorkspaceExistsError",
    "WorkspaceBusyError",
    "SnapshotNotFoundError",
    "WorkspacesUnavailableError",
    "UnsupportedParamikoError",
    "IsolationWarning",
]


class IsolationWarning(UserWarning):
    """The gateway does not isolate its sessions (``"isolation": "none"``:
    the workdir driver). Their processes run as the gateway's user with the
    host's files and network, and ``resources`` are not enforced. Issued
    once per process per gateway URL (however many clients talk to it);
    filter it like any warning category."""


class SandboxAPIError(Exception):
    """Base class of every error the SDK raises.

    Attributes:
        message: A human-readable description.
        status_code: The HTTP status of the answer that caused the error, if any.
        code: The server's machine-readable error code (``error.code`` of the
            JSON error envelope), if the answer carried one.
        status_line: The HTTP status line (``"HTTP/1.1 404 Not Found"``) when
            the error comes from a CONNECT answer, else ``None``.
        body: The (possibly truncated) raw body of the answer, if any.
        headers: The answer's headers, if any.
    """

    def __init__(
        self,
        message: str,
        *,
        status_code: Optional[int] = None,
        code: Optional[str] = None,
        status_line: Optional[str] = None,
        body: Optional[str] = None,
        headers: Optional[Mapping[str, str]] = None,
    ) -> None:
        super().__init__(message)
        self.message: str = message
        self.status_code: Optional[int] = status_code
        self.code: Optional[str] = code
        self.status_line: Optional[str] = status_line
        self.body: Optional[str] = body
        self.headers: Mapping[str, str] = headers if headers is not None else {}

    def __str__(self) -> str:
        return self.message


class SandboxConnectionError(SandboxAPIError):
    """The gateway could not be reached or the connection broke.

    Raised for DNS/TCP/TLS failures and timeouts of REST requests, for a
    CONNECT answered with anything but 200 (other than 401, 404, 410 and 429,
    which raise their own classes), and when the SSH handshake fails.
    ``status_line`` holds the CONNECT answer's status line when there was one.
    """


class HostKeyMismatchError(SandboxConnectionError):
    """The SSH server presented a host key that is not the pinned one.

    Attributes:
        presented: The key the server presented, as an authorized_keys line.
        expected: The pinned keys, as authorized_keys lines.
    """

    def __init__(self, message: str, *, presented: str, expected: list[str]) -> None:
        super().__init__(message)
        self.presented: str = presented
        self.expected: list[str] = list(expected)


class UnauthorizedError(SandboxAPIError):
    """The bearer token was missing or rejected (HTTP 401)."""


class SessionNotFoundError(SandboxAPIError):
    """The session does not exist, was deleted, expired, or belongs to another tenant (HTTP 404).

    A session deleted or expired lately (within the gateway's
    ``--tombstone-ttl``, 24h by default) raises the subclass
    :class:`SessionGoneError` instead, so ``except SessionNotFoundError``
    catches both.
    """


_GONE_REASON = re.compile(r"\(reason: ([a-z_]+)\)")


class SessionGoneError(SessionNotFoundError):
    """The session was deleted or expired lately (HTTP 410 ``session_gone``).

    The gateway keeps a tombstone of an ended session for its
    ``--tombstone-ttl`` (24h by default); until then the session's routes
    and CONNECT answer 410 and say when and why it ended. After that, and
    for another tenant's session, the answer is 404
    (:class:`SessionNotFoundError`).

    Attributes:
        reason: Why the session ended: ``"deleted"`` (the message names the
            deleting tenant), ``"ttl_expired"``, ``"idle_expired"``,
            ``"failed"`` (the message says why it failed) or ``"shutdown"``;
            ``None`` if the message does not say.
    """

    def __init__(self, message: str, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        m = _GONE_REASON.search(message)
        self.reason: Optional[str] = m.group(1) if m else None


class RateLimitError(SandboxAPIError):
    """The gateway refused the request with HTTP 429.

    This covers the per-principal request rate limit and the tenant's quotas
    (see :attr:`code`: ``"rate_limited"``, ``"quota_exceeded"`` for live
    sessions, ``"workspace_limit"`` and ``"snapshot_limit"`` for what it keeps).

    Attributes:
        limit: ``X-RateLimit-Limit``: requests allowed per window.
        remaining: ``X-RateLimit-Remaining``: requests left in the window.
        reset: ``X-RateLimit-Reset``: when the window resets, in Unix seconds.
        retry_after: ``Retry-After``: seconds to wait before retrying.
    """

    def __init__(
        self,
        message: str,
        *,
        limit: Optional[int] = None,
        remaining: Optional[int] = None,
        reset: Optional[int] = None,
        retry_after: Optional[float] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(message, **kwargs)
        self.limit: Optional[int] = limit
        self.remaining: Optional[int] = remaining
        self.reset: Optional[int] = reset
        self.retry_after: Optional[float] = retry_after


class SandboxOperationError(SandboxAPIError):
    """An operation failed.

    Raised for HTTP errors other than 401/404/429 (400, 413, 5xx, ...), for
    answers that cannot be understood, for refused SSH authentication, for
    failed exec and SFTP operations, and when an SSH client is used before
    :meth:`~sandbox_sessions_sdk.SessionSSHClient.connect`.
    """


class CommandTimeoutError(SandboxOperationError):
    """``run_command`` did not finish within its timeout.

    The remote command was sent SIGKILL (SSH ``signal`` request) and its
    channel closed, which makes the gateway kill the command's process group.

    Attributes:
        command: The command that timed out.
        timeout: The timeout in seconds.
        stdout: The standard output received before the timeout.
        stderr: The standard error received before the timeout.
        truncated: True when ``stdout`` or ``stderr`` passed ``max_output_bytes``
            and holds only its head and tail (as in :class:`CommandResult`).
    """

    def __init__(
        self, message: str, *, command: str, timeout: float, stdout: str, stderr: str, truncated: bool = False
    ) -> None:
        super().__init__(message)
        self.command: str = command
        self.timeout: float = timeout
        self.stdout: str = stdout
        self.stderr: str = stderr
        self.truncated: bool = truncated


class _ResourceError(SandboxOperationError):
    """Shared by the two resource errors: :attr:`resource` names the field."""

    def __init__(self, message: str, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        m = re.search(r"resources\.(\w+)", message)
        #: The resource the gateway refused (``"memoryMiB"``, ``"cpus"``,
        #: ``"pids"``, ``"diskMiB"``), or None if the message names none.
        self.resource: Optional[str] = m.group(1) if m else None


class ResourcesExceededError(_ResourceError):
    """``create_session`` asked for more than the gateway allows (HTTP 400
    ``resources_exceeded``): :attr:`resource` names the field, and the message
    the gateway's limit (``--sandbox-max-memory`` and its siblings)."""


class InvalidResourcesError(_ResourceError):
    """``create_session`` asked for a resource below its minimum (HTTP 400
    ``invalid_resources``): :attr:`resource` names the field."""


class InvalidEgressError(SandboxOperationError):
    """An egress entry does not parse (HTTP 400 ``invalid_egress``): a URL
    instead of a host, a bad port, a ``*`` that is not a whole first label...
    The message names every bad entry and why."""


def _quoted(text: str) -> List[str]:
    """The double-quoted strings (Go ``%q``) in *text*, unescaped."""
    return [re.sub(r"\\(.)", r"\1", q) for q in re.findall(r'"((?:[^"\\]|\\.)*)"', text)]


class EgressNotAllowedError(SandboxOperationError):
    """Egress the gateway refuses (HTTP 400 ``egress_not_allowed``): entries
    outside what its operator allows (``serve --egress-allow``), or a secret
    bound to hosts that the session's own egress list does not cover.

    Attributes:
        entries: The refused entries (or hosts) the message names, as the
            gateway wrote them; empty if it names none.
    """

    def __init__(self, message: str, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        # The gateway ends its message with the refused entries, quoted.
        self.entries: List[str] = _quoted(message.rsplit(": ", 1)[-1])


class UnknownSecretError(SandboxOperationError):
    """``create_session`` named secrets the gateway does not define for this
    tenant (HTTP 400 ``unknown_secret``; ``serve --secrets-file``).

    Attributes:
        names: Every unknown name, in the order given.
    """

    def __init__(self, message: str, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        m = re.search(r"unknown secrets?: (.*)$", message)
        self.names: List[str] = [n.strip() for n in m.group(1).split(",") if n.strip()] if m else []


class InvalidSecretError(SandboxOperationError):
    """A secret reference the gateway rejects (HTTP 400 ``invalid_secret``):
    a name that is not an environment variable name, a name listed twice, a
    header or format without hosts, a header that cannot be set, a format
    without ``{value}``."""


class FileNotFoundInSandboxError(SandboxOperationError, FileNotFoundError):
    """Nothing at the sandbox path (HTTP 404 ``file_not_found``): a file to
    read, list or delete, or the parent directory of a file to write (see
    ``mkdirs``). Also a :class:`FileNotFoundError`, so ``except
    FileNotFoundError`` catches it; :attr:`filename` is the sandbox path when
    the SDK knows it."""


class SandboxPermissionError(SandboxOperationError, PermissionError):
    """The sandbox's user may not read, write or delete there, or the path
    leads out of the sandbox (HTTP 403 ``permission_denied``). Also a
    :class:`PermissionError`; :attr:`filename` is the sandbox path when the
    SDK knows it."""


class FileTooLargeError(SandboxOperationError):
    """``write_file`` sent more than the gateway's ``--max-file-bytes``
    (HTTP 413 ``file_too_large``); nothing was written."""


class DiskFullError(SandboxOperationError):
    """The sandbox's filesystem is full (HTTP 507 ``disk_full``, its
    ``resources.diskMiB`` on the linux driver); nothing was written and the
    old file, if any, is intact."""


class ShellBusyError(RateLimitError):
    """32 commands already wait for this persistent shell (HTTP 429
    ``shell_busy``): wait for some to finish, or use another shell. A
    :class:`RateLimitError`, as every 429 is."""


class ProcessNotFoundError(SandboxOperationError):
    """No such background process in the session (HTTP 404
    ``process_not_found``), or it finished long enough ago to be forgotten."""


class ProcessExitedError(SandboxOperationError):
    """The background process has ended (HTTP 409 ``process_exited``): it
    takes no more input or signals."""


class WorkspaceNotFoundError(SandboxOperationError):
    """The tenant has no workspace of that name (HTTP 404
    ``workspace_not_found``): ``delete_workspace``, or ``create_session(workspace=...)``."""


class WorkspaceExistsError(SandboxOperationError):
    """``create_workspace``: the tenant already has a workspace of that name
    (HTTP 409 ``workspace_exists``)."""


class WorkspaceBusyError(SandboxOperationError):
    """A live session holds the workspace (HTTP 409 ``workspace_busy``): a
    second ``create_session(workspace=...)``, or ``delete_workspace`` while
    it is held. End the holding session first."""


class SnapshotNotFoundError(SandboxOperationError):
    """The tenant has no such snapshot (HTTP 404 ``snapshot_not_found``):
    ``delete_snapshot``, or ``create_session(from_snapshot=...)``."""


class WorkspacesUnavailableError(SandboxOperationError):
    """This gateway keeps no workspaces (HTTP 400 ``workspaces_unavailable``)."""


class UnsupportedParamikoError(SandboxAPIError, RuntimeError):
    """The installed Paramiko is not one the SDK supports.

    The SDK reaches into a few Paramiko internals (``exit-signal``, the SSH
    ``signal`` request, pipelined SFTP reads) that are checked only against
    the supported range. :meth:`~sandbox_sessions_sdk.SessionSSHClient.connect`
    raises this before it opens anything; the REST client works with any
    Paramiko.

    Attributes:
        found: The installed Paramiko's ``__version__``.
        supported: The supported range, as a pip specifier (``">=3.5,<6"``).
    """

    def __init__(self, message: str, *, found: str, supported: str) -> None:
        super().__init__(message)
        self.found: str = found
        self.supported: str = supported
