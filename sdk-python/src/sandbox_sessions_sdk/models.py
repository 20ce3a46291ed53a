"""Data types the SDK returns: sessions (REST) and command results (SSH)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta, timezone
from typing import Any, Dict, Iterator, List, Literal, Mapping, Optional, Tuple, Union, overload

__all__ = [
    "Session",
    "CommandResult",
    "Workspace",
    "Snapshot",
    "SessionStats",
    "PortLink",
    "PythonError",
    "PythonResult",
    "AuditEvent",
    "AuditPage",
]

_RFC3339 = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?"
    r"(?:([Zz])|([+-])(\d{2}):?(\d{2}))?$"
)


def parse_timestamp(value: Any) -> Optional[datetime]:
    """Parse an RFC 3339 timestamp (Go's format, nanoseconds included).

    Returns an aware :class:`datetime` (UTC when the text has no offset), or
    ``None`` when *value* is empty or not a timestamp.
    """
    if not isinstance(value, str) or not value:
        return None
    m = _RFC3339.match(value.strip())
    if not m:
        return None
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    frac = m.group(7) or ""
    micro = int((frac + "000000")[:6])
    tz = timezone.utc
    if m.group(9):
        offset = timedelta(hours=int(m.group(10)), minutes=int(m.group(11)))
        tz = timezone(offset if m.group(9) == "+" else -offset)
    try:
        return datetime(year, month, day, hour, minute, min(second, 59), micro, tzinfo=tz)
    except ValueError:
        return None


@dataclass
class Session:
    """A sandbox session, as the REST API describes it.

    Attributes:
        session_id: The session's id (``sbx-...``).
        status: ``running``, ``deleted``, ``expired`` or ``failed``.
        image: The sandbox image.
        metadata: The metadata given at creation.
        created_at: When the session was created (aware datetime, UTC).
        expires_at: When the session's TTL runs out.
        last_activity_at: When the session was last used over REST or SSH.
        ttl: The session's time to live in seconds, as last set (by the
            create, or by ``update_session``): ``expires_at`` is the time
            it was set plus ``ttl``.
        resources: The sandbox's limits in force, as the API names them:
            ``{"memoryMiB": int, "cpus": float, "pids": int, "diskMiB":
            int}``; None from a gateway that does not report them.
        username: The SSH username to use (``sandbox``).
        password: The per-session SSH password. Only the create response
            carries it; it is ``None`` on sessions read later. Hidden from repr.
        host_keys: The gateway's SSH host keys as authorized_keys lines
            (``ssh-ed25519 AAAA...``), ed25519 first. ``SessionSSHClient``
            pins these.
        known_hosts_line: A ready ``known_hosts`` line for OpenSSH.
        connect_path: The path to CONNECT to for this session's tunnel.
        raw: The JSON object the server sent, unchanged.
        replayed: True on a Session that ``create_session`` got back from
            the gateway's replay of an earlier create with the same
            ``Idempotency-Key`` (``Idempotent-Replayed: true``): the session
            that create made, without its ``password``. False otherwise.
        egress: The session's egress as the API shows it: ``{"allow":
            [...], "bytesIn": int, "bytesOut": int}``, the allow-list in
            force (canonical entries; empty: no network) and the bytes its
            connections carried each way; None from a gateway without
            egress. See also :attr:`egress_allow`, :attr:`egress_bytes_in`,
            :attr:`egress_bytes_out`.
        secrets: The secrets given at creation, as the API shows them:
            names (environment secrets) and dicts with ``name``, ``hosts``,
            ``header``, ``format`` (secrets bound to hosts). Never values.
        workspace: The named workspace the session holds, if any.
        from_snapshot: The snapshot the session started from, if any.
        workspace_sync: The held workspace's sync state (``lastSyncedAt``,
            ``pendingBytes``, ``lastError``), if any.
        name: The name given at create, if any; it works wherever the id does.
        isolation: ``"none"`` when the gateway does not isolate sessions
            (its workdir driver; ``raw["unenforced"]`` lists the limits
            nothing enforces), else None.
    """

    session_id: str
    status: str
    image: str
    metadata: Dict[str, Any]
    created_at: Optional[datetime]
    expires_at: Optional[datetime]
    last_activity_at: Optional[datetime] = None
    ttl: Optional[int] = None
    resources: Optional[Dict[str, Any]] = None
    username: Optional[str] = None
    password: Optional[str] = field(default=None, repr=False)
    host_keys: List[str] = field(default_factory=list)
    known_hosts_line: Optional[str] = None
    connect_path: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    replayed: bool = field(default=False, compare=False)
    egress: Optional[Dict[str, Any]] = None
    secrets: List[Any] = field(default_factory=list)
    workspace: Optional[str] = None
    from_snapshot: Optional[str] = None
    workspace_sync: Optional[Dict[str, Any]] = None
    name: Optional[str] = None
    isolation: Optional[str] = None

    @property
    def egress_allow(self) -> List[Any]:
        """The egress allow-list in force (``egress["allow"]``): strings, and
        dicts for entries with rules per request; ``[]`` when the session
        has no network or the gateway reports no egress."""
        allow = (self.egress or {}).get("allow")
        return [e for e in allow if isinstance(e, (str, dict))] if isinstance(allow, list) else []

    @property
    def egress_mode(self) -> str:
        """``"ask"`` for a session created with ``egress_mode="ask"``
        (connections outside the list wait for approval), else ``"deny"``."""
        return "ask" if (self.egress or {}).get("mode") == "ask" else "deny"

    @property
    def egress_bytes_in(self) -> Optional[int]:
        """Bytes the session's egress connections received (``egress["bytesIn"]``), or None if not reported."""
        return _count((self.egress or {}).get("bytesIn"))

    @property
    def egress_bytes_out(self) -> Optional[int]:
        """Bytes the session's egress connections sent (``egress["bytesOut"]``), or None if not reported."""
        return _count((self.egress or {}).get("bytesOut"))

    @property
    def secret_names(self) -> List[str]:
        """The names of :attr:`secrets`, environment and bound alike."""
        names = (s if isinstance(s, str) else s.get("name") if isinstance(s, Mapping) else None for s in self.secrets)
        return [n for n in names if isinstance(n, str)]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Session":
        """Build a Session from the API's JSON object (camelCase fields)."""
        if not isinstance(data, Mapping) or not isinstance(data.get("sessionId"), str):
            raise ValueError("not a session object: missing sessionId")
        ssh = data.get("ssh") or {}
        if not isinstance(ssh, Mapping):
            ssh = {}
        ttl = data.get("ttl")
        host_keys = ssh.get("hostKeys") or []
        resources = data.get("resources")
        egress = data.get("egress")
        secrets = data.get("secrets")
        return cls(
            session_id=data["sessionId"],
            status=str(data.get("status") or ""),
            image=str(data.get("image") or ""),
            metadata=dict(data.get("metadata") or {}),
            created_at=parse_timestamp(data.get("createdAt")),
            expires_at=parse_timestamp(data.get("expiresAt")),
            last_activity_at=parse_timestamp(data.get("lastActivityAt")),
            ttl=ttl if isinstance(ttl, int) and not isinstance(ttl, bool) else None,
            resources=dict(resources) if isinstance(resources, Mapping) else None,
            username=ssh.get("username") or None,
            password=ssh.get("password") or None,
            host_keys=[k for k in host_keys if isinstance(k, str) and k.strip()],
            known_hosts_line=ssh.get("knownHostsLine") or None,
            connect_path=ssh.get("connectPath") or None,
            raw=dict(data),
            egress=dict(egress) if isinstance(egress, Mapping) else None,
            secrets=[
                s if isinstance(s, str) else dict(s)
                for s in (secrets if isinstance(secrets, list) else [])
                if isinstance(s, (str, Mapping))
            ],
            workspace=data.get("workspace") or None,
            from_snapshot=data.get("fromSnapshot") or None,
            workspace_sync=dict(sync) if isinstance(sync := data.get("workspaceSync"), Mapping) else None,
            name=data.get("name") or None,
            isolation=data.get("isolation") or None,
        )


def _count(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class CommandResult(Mapping[str, Any]):
    """What :meth:`SessionSSHClient.run_command` and :meth:`SessionsClient.run` return.

    ``stdout`` and ``stderr`` are decoded as UTF-8 (invalid bytes become
    U+FFFD). ``exit_code`` is the command's own exit status; when the command
    was killed by a signal it is ``128 + signal number`` (what a shell's ``$?``
    shows) and ``exit_signal`` names the signal (``"KILL"``, ``"TERM"``...),
    which is otherwise ``None``. ``exit_code`` is -1 if the server closed the
    channel without reporting either.

    ``truncated`` is True when a stream was longer than ``run_command``'s
    ``max_output_bytes``: that stream then holds only its first and last
    bytes with ``"\n[... N bytes dropped ...]\n"`` between them (see
    :meth:`SessionSSHClient.run_command`).

    The REST API (:meth:`SessionsClient.run`) also reports ``timed_out``
    (the command passed its timeout and was killed: ``exit_code`` is then
    124), ``cwd`` (the directory it ran in; for a persistent shell, the
    shell's directory after it), ``duration_ms`` and ``state_lost`` (a
    persistent shell's command ran in a new shell that replaced one that
    ended: a timeout, an ``exit``, or a gateway restart that could not
    keep it; it started from the saved directory, exported variables,
    functions and aliases, without the plain variables and jobs). Over SSH
    they are ``False``, ``None``, ``None`` and ``False``.

    Read it as attributes (``res.stdout``) or as a read-only mapping with
    exactly the five keys ``stdout``, ``stderr``, ``exit_code``,
    ``exit_signal`` and ``truncated``, the way earlier versions returned a
    dict: ``res["stdout"]``, ``res.get("exit_signal")``, ``res["truncated"]``,
    ``dict(res)``, and ``res == {"stdout": ..., ...}`` all work (a dict
    compared with it needs all five keys). ``timed_out``, ``cwd``,
    ``duration_ms`` and ``state_lost`` are attributes only, and neither ``==`` nor ``hash``
    looks at them. ``dataclasses.asdict(res)`` gives a plain dict of every
    field (for ``json.dumps``).
    """

    stdout: str
    stderr: str
    exit_code: int
    exit_signal: Optional[str] = None
    truncated: bool = False
    timed_out: bool = field(default=False, compare=False)
    cwd: Optional[str] = field(default=None, compare=False)
    duration_ms: Optional[int] = field(default=None, compare=False)
    state_lost: bool = field(default=False, compare=False)

    @overload
    def __getitem__(self, key: Literal["stdout", "stderr"]) -> str: ...
    @overload
    def __getitem__(self, key: Literal["exit_code"]) -> int: ...
    @overload
    def __getitem__(self, key: Literal["exit_signal"]) -> Optional[str]: ...
    @overload
    def __getitem__(self, key: Literal["truncated"]) -> bool: ...
    @overload
    def __getitem__(self, key: str) -> Union[str, int, None]: ...

    def __getitem__(self, key: str) -> Union[str, int, None]:
        if key not in _COMMAND_RESULT_KEYS:
            raise KeyError(key)
        value: Union[str, int, None] = getattr(self, key)
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(_COMMAND_RESULT_KEYS)

    def __len__(self) -> int:
        return len(_COMMAND_RESULT_KEYS)

    def _astuple(self) -> Tuple[str, str, int, Optional[str], bool]:
        return (self.stdout, self.stderr, self.exit_code, self.exit_signal, self.truncated)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, CommandResult):
            return self._astuple() == other._astuple()
        if isinstance(other, Mapping):
            return dict(self.items()) == dict(other.items())
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._astuple())


#: The mapping view's keys: the five of the dict earlier versions returned.
_COMMAND_RESULT_KEYS: Tuple[str, ...] = tuple(f.name for f in fields(CommandResult))[:5]


# -- workspaces, snapshots, stats, port links, audit ----------------------------


def _int(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: Any) -> Optional[str]:
    return value if isinstance(value, str) and value else None


@dataclass
class Workspace:
    """A named workspace (``POST/GET /v1/workspaces``): files that outlive sessions.

    Attributes:
        name: Its name, unique in the tenant.
        size_bytes: Total size of its files, as last synced.
        files: How many files it holds.
        created_at: When it was created.
        last_used_at: The last sync of a session holding it.
        in_use_by: The live session holding it, or None.
        sync: The API's sync state (``lastSyncedAt``, ``pendingBytes``,
            ``lastError``), or None.
        raw: The JSON object the server sent.
    """

    name: str
    size_bytes: int = 0
    files: int = 0
    created_at: Optional[datetime] = None
    last_used_at: Optional[datetime] = None
    in_use_by: Optional[str] = None
    sync: Optional[Dict[str, Any]] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Workspace":
        if not isinstance(data, Mapping) or not isinstance(data.get("name"), str):
            raise ValueError("not a workspace object: missing name")
        sync = data.get("sync")
        return cls(
            name=data["name"],
            size_bytes=_int(data.get("sizeBytes")) or 0,
            files=_int(data.get("files")) or 0,
            created_at=parse_timestamp(data.get("createdAt")),
            last_used_at=parse_timestamp(data.get("lastUsedAt")),
            in_use_by=_str(data.get("inUseBy")),
            sync=dict(sync) if isinstance(sync, Mapping) else None,
            raw=dict(data),
        )


@dataclass
class Snapshot:
    """A snapshot of a session's workspace (``POST /v1/sessions/{id}/snapshots``,
    ``GET /v1/snapshots``). Start sessions from it with
    ``create_session(from_snapshot=snapshot.snapshot_id)``.

    Attributes:
        snapshot_id: ``snap_...``.
        size_bytes: Total size of the workspace's files.
        files: How many files.
        created_at: When it was taken.
        session_id: The session it was taken of (in listings).
        stored_bytes: Bytes this snapshot stored (only from the create).
        frozen_millis: How long the session's processes were frozen (only from the create).
        consistent: False where the driver cannot freeze processes
            (workdir): not a point-in-time copy (only from the create).
        raw: The JSON object the server sent.
    """

    snapshot_id: str
    size_bytes: int = 0
    files: int = 0
    created_at: Optional[datetime] = None
    session_id: Optional[str] = None
    stored_bytes: Optional[int] = None
    frozen_millis: Optional[float] = None
    consistent: Optional[bool] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Snapshot":
        if not isinstance(data, Mapping) or not isinstance(data.get("snapshotId"), str):
            raise ValueError("not a snapshot object: missing snapshotId")
        frozen = data.get("frozenMillis")
        consistent = data.get("consistent")
        return cls(
            snapshot_id=data["snapshotId"],
            size_bytes=_int(data.get("sizeBytes")) or 0,
            files=_int(data.get("files")) or 0,
            created_at=parse_timestamp(data.get("createdAt")),
            session_id=_str(data.get("sessionId")),
            stored_bytes=_int(data.get("storedBytes")),
            frozen_millis=float(frozen) if isinstance(frozen, (int, float)) and not isinstance(frozen, bool) else None,
            consistent=consistent if isinstance(consistent, bool) else None,
            raw=dict(data),
        )


@dataclass
class SessionStats:
    """A session's resource use now (``GET /v1/sessions/{id}/stats``).

    A group the sandbox driver cannot measure is None (the workdir driver
    knows only ``disk_used_bytes``).

    Attributes:
        session_id: The session.
        status: ``running`` or ``stopped``.
        sampled_at: When it was read.
        memory_bytes, memory_peak_bytes, memory_limit_bytes: The memory cgroup's counts.
        cpu_seconds, cpu_limit: CPU time used, and the limit in cores.
        pids, pids_limit: Processes and threads now, and the limit.
        disk_used_bytes, disk_total_bytes: What the files take, and the
            workspace filesystem's size (None under workdir). The used
            bytes include ``disk_process_output_bytes``, the output the
            session's background processes keep on the gateway's host,
            which counts against the same size.
        tunnel_bytes_in, tunnel_bytes_out: Bytes through its SSH tunnels.
        egress_bytes_in, egress_bytes_out: Bytes through its egress proxy.
        raw: The JSON object the server sent.
    """

    session_id: str
    status: str
    sampled_at: Optional[datetime] = None
    memory_bytes: Optional[int] = None
    memory_peak_bytes: Optional[int] = None
    memory_limit_bytes: Optional[int] = None
    cpu_seconds: Optional[float] = None
    cpu_limit: Optional[float] = None
    pids: Optional[int] = None
    pids_limit: Optional[int] = None
    disk_used_bytes: Optional[int] = None
    disk_total_bytes: Optional[int] = None
    disk_process_output_bytes: Optional[int] = None
    tunnel_bytes_in: int = 0
    tunnel_bytes_out: int = 0
    egress_bytes_in: int = 0
    egress_bytes_out: int = 0
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SessionStats":
        if not isinstance(data, Mapping) or not isinstance(data.get("sessionId"), str):
            raise ValueError("not a stats object: missing sessionId")

        def group(name: str) -> Mapping[str, Any]:
            g = data.get(name)
            return g if isinstance(g, Mapping) else {}

        def num(value: Any) -> Optional[float]:
            return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

        mem, cpu, pids, disk = group("memory"), group("cpu"), group("pids"), group("disk")
        tunnel, egress = group("tunnel"), group("egress")
        return cls(
            session_id=data["sessionId"],
            status=str(data.get("status") or ""),
            sampled_at=parse_timestamp(data.get("sampledAt")),
            memory_bytes=_int(mem.get("currentBytes")),
            memory_peak_bytes=_int(mem.get("peakBytes")),
            memory_limit_bytes=_int(mem.get("limitBytes")),
            cpu_seconds=num(cpu.get("seconds")),
            cpu_limit=num(cpu.get("limit")),
            pids=_int(pids.get("current")),
            pids_limit=_int(pids.get("limit")),
            disk_used_bytes=_int(disk.get("usedBytes")),
            disk_total_bytes=_int(disk.get("totalBytes")),
            disk_process_output_bytes=_int(disk.get("processOutputBytes")),
            tunnel_bytes_in=_int(tunnel.get("bytesIn")) or 0,
            tunnel_bytes_out=_int(tunnel.get("bytesOut")) or 0,
            egress_bytes_in=_int(egress.get("bytesIn")) or 0,
            egress_bytes_out=_int(egress.get("bytesOut")) or 0,
            raw=dict(data),
        )


@dataclass
class PortLink:
    """A presigned preview link (``POST /v1/sessions/{id}/ports/link``):
    anyone holding :attr:`url` reaches the port's server, no token needed,
    until :attr:`expires_at` or the session ends. The URL is the preview's
    own origin (``http://p{port}-{label}.localhost:{api port}/``), shared
    with no other session and not with the API. Append the server's path
    to it (it ends in ``/``)."""

    url: str
    expires_at: Optional[datetime] = None


@dataclass(frozen=True)
class PythonError:
    """An exception the kernel's code did not catch (``name``: its class,
    e.g. ``KeyError``), or the kernel's own end: ``KernelDied``,
    ``KernelRestarted`` (killed after a timeout), ``KernelReset``."""

    name: str
    value: str
    traceback: str = ""


@dataclass
class PythonResult:
    """What :meth:`SessionsClient.run_python` returns (``POST .../python``).

    ``result`` is the ``repr`` of the code's last expression (None when it
    ends otherwise, or the value is None); ``error`` an uncaught exception
    (the kernel stays). ``stdout``/``stderr`` are what the code and the
    processes it started wrote (UTF-8, invalid bytes as U+FFFD).
    ``interrupted``: the timeout's SIGINT stopped the code, its state kept;
    ``restarted`` and ``state_lost``: this call ran in a new interpreter.
    """

    kernel: str
    stdout: str = ""
    stderr: str = ""
    result: Optional[str] = None
    error: Optional[PythonError] = None
    duration_ms: int = 0
    truncated: bool = False
    timed_out: bool = False
    interrupted: bool = False
    restarted: bool = False
    state_lost: bool = False
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        """True when the code ran to its end without an uncaught exception."""
        return self.error is None and not self.timed_out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "PythonResult":
        import base64

        def text(key: str) -> str:
            if isinstance(data.get(key), str):
                return data[key]
            b64 = data.get(key + "Base64")
            if isinstance(b64, str):
                return base64.b64decode(b64).decode("utf-8", errors="replace")
            return ""

        err = data.get("error")
        error = None
        if isinstance(err, Mapping):
            error = PythonError(
                name=str(err.get("name", "")), value=str(err.get("value", "")), traceback=str(err.get("traceback", ""))
            )
        res = data.get("result")
        return cls(
            kernel=str(data.get("kernel") or "default"),
            stdout=text("stdout"),
            stderr=text("stderr"),
            result=res if isinstance(res, str) else None,
            error=error,
            duration_ms=int(data.get("durationMs") or 0),
            truncated=bool(data.get("truncated")),
            timed_out=bool(data.get("timedOut")),
            interrupted=bool(data.get("interrupted")),
            restarted=bool(data.get("restarted")),
            state_lost=bool(data.get("stateLost")),
            raw=dict(data),
        )


@dataclass
class AuditEvent:
    """One event of the audit trail (``GET /v1/audit``).

    The common fields are attributes; :attr:`raw` holds every field the
    event has (``command``, ``exitCode``, ``path``, ``bytesIn``... by kind).

    Attributes:
        seq: Grows by one per event written.
        time: When it happened.
        kind: ``rest``, ``tunnel.open``, ``tunnel.close``, ``ssh.auth``,
            ``command``, ``file``, ``egress``, ``session`` or ``forward``.
        session: The session it concerns, if any.
        request_id: The request's ``X-Request-Id``, if any.
        op, route, method, status, result, reason: As the API names them, when present.
    """

    seq: int
    time: Optional[datetime]
    kind: str
    session: Optional[str] = None
    request_id: Optional[str] = None
    op: Optional[str] = None
    route: Optional[str] = None
    method: Optional[str] = None
    status: Optional[int] = None
    result: Optional[str] = None
    reason: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "AuditEvent":
        if not isinstance(data, Mapping) or _int(data.get("seq")) is None or not isinstance(data.get("kind"), str):
            raise ValueError("not an audit event: missing seq or kind")
        return cls(
            seq=data["seq"],
            time=parse_timestamp(data.get("time")),
            kind=data["kind"],
            session=_str(data.get("session")),
            request_id=_str(data.get("requestId")),
            op=_str(data.get("op")),
            route=_str(data.get("route")),
            method=_str(data.get("method")),
            status=_int(data.get("status")),
            result=_str(data.get("result")),
            reason=_str(data.get("reason")),
            raw=dict(data),
        )


@dataclass
class AuditPage:
    """One page of :meth:`SessionsClient.list_audit`: events newest first;
    :attr:`next_cursor` (None on the last page) fetches older ones. A page
    may hold fewer events than asked, or none, and still have a cursor."""

    events: List[AuditEvent]
    next_cursor: Optional[str] = None
