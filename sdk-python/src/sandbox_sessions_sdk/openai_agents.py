"""sandgate as a sandbox backend of the OpenAI Agents SDK (``agents.sandbox``).

A ``SandboxAgent`` runs its shell, file and patch tools in a sandgate session::

    from agents import Runner
    from agents.run import RunConfig
    from agents.sandbox import SandboxAgent, SandboxRunConfig
    from sandbox_sessions_sdk.openai_agents import SandgateSandboxClient, SandgateSandboxClientOptions

    agent = SandboxAgent(name="coder", instructions="...")
    async with SandgateSandboxClient() as client:    # $SANDBOX_API_URL, $SANDBOX_API_TOKEN
        run_config = RunConfig(sandbox=SandboxRunConfig(
            client=client,
            options=SandgateSandboxClientOptions(egress=("pypi.org", "files.pythonhosted.org")),
        ))
        result = await Runner.run(agent, "Write fib.py and run it", run_config=run_config)

Install it with the extra that pins the Agents SDK range this module follows
(its sandbox interface changes often): ``pip install 'sandgate-sdk[openai-agents]'``
(the distribution was once named ``sandbox-sessions-sdk``).

How the SDK's contract maps onto sandgate (one Agents SDK sandbox session is
one sandgate session):

- **Lifecycle.** ``create`` is ``POST /v1/sessions`` (no image: the
  gateway's default image); ``delete`` and the session's ``shutdown`` delete
  it, or with ``pause_on_exit`` stop it (``POST .../stop``: files kept, the
  next command starts it again); ``resume`` reattaches to the session the
  state names, or, when it is gone, creates a new one: from the state's
  sandgate snapshot directly when it has one, else empty, and the SDK
  restores the workspace from the state's snapshot.
- **Exec** is ``POST .../commands`` with ``argv`` (the SDK's ``sh -lc``
  wrapping included); a command that passes its timeout is killed by the
  gateway and raises the SDK's ``ExecTimeoutError``. The shell tool's
  commands (``pty_exec_start``) are sandgate background processes
  (``POST .../processes``): one that outlives the tool's yield time goes on,
  and the SDK's ``write_stdin`` tool polls it and writes to its standard
  input; it is killed when its timeout (else ``exec_timeout_s``) passes.
  They are pipes; ``tty=True`` runs the command on a terminal through
  util-linux ``script`` where the sandbox has it. The options' and
  the manifest's environment is written once (through standard input) to a
  0600 file in the sandbox's ``/tmp`` that each command sources: the values
  are in no argv, so not in the gateway's command history.
- **Files** go through the REST files API for paths in the workspace, and
  through commands (``base64``, ``cat``) for paths outside it and for a
  ``user=`` (run as that user through ``sudo -u``, as the SDK runs its
  commands; sandgate's linux sandboxes set no_new_privs, so there only the
  workdir driver's sandboxes can).
- **Snapshots.** ``persist_workspace`` takes a sandgate snapshot
  (``POST .../snapshots``) and hands the SDK a small reference to it instead
  of a tar stream (``workspace_persistence="snapshot"``, the default);
  ``hydrate_workspace`` given that reference replaces the session with one
  created ``fromSnapshot``. ``"tar"`` moves a tar of the workspace instead
  (used as well when the session holds a named workspace, which cannot be
  combined with ``fromSnapshot``, or when the SDK asks to leave paths out).
  An SDK session keeps one sandgate snapshot: persisting again deletes the
  one it replaces, a snapshot the SDK then fails to store is deleted, and a
  tar persisted instead deletes it too. The last one stays on the gateway
  for a later resume: it counts against ``--max-snapshots-per-tenant``
  until it is deleted. When the application is done with the SDK session
  (no resume to come), delete it with
  ``await client.sessions.delete_snapshot(state.sandgate_snapshot_id)``;
  ``GET /v1/snapshots`` lists them with the ``sessionId`` they were taken
  of (sandgate snapshots carry no labels, so nothing names the SDK
  session). ``"tar"`` keeps nothing on the gateway.
- **Manifests.** The manifest's root is the session's workspace: the
  default root (``/workspace``) becomes the directory the session's commands
  start in, which is ``/workspace`` on the linux driver and the session's
  directory on the workdir driver (a root below ``/workspace`` moves with
  it). ``workspace=`` mounts a named workspace
  (created when missing): its files outlive the session.
- **Ports.** ``exposed_ports`` resolve to presigned preview origins
  (``POST .../ports/link``): ``http://p{port}-{label}.{domain}:{apiPort}/``.
- **Errors** are the SDK's (``ExecTransportError``, ``WorkspaceReadNotFoundError``,
  ``WorkspaceArchiveReadError``, ``WorkspaceStartError``...), with the
  sandgate error (its ``code``) as their cause.
- **sandgate's own**: ``egress`` (the allow-list; empty: no network),
  ``secrets`` (operator secrets by name, or bound to hosts so their values
  never enter the sandbox), ``resources``, ``workspace``, ``name``,
  ``labels``, ``ttl``; and ``session.ssh_command``, the command line a
  person runs to join the agent's sandbox over SSH.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import logging
import re
import shlex
import signal as _signal
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Dict, Literal, Optional, Tuple, Union
from urllib.parse import urlsplit

try:
    from agents.sandbox.errors import (
        ExecTimeoutError,
        ExecTransportError,
        ExposedPortUnavailableError,
        WorkspaceArchiveReadError,
        WorkspaceArchiveWriteError,
        WorkspaceReadNotFoundError,
        WorkspaceStartError,
        WorkspaceWriteTypeError,
    )
    from agents.sandbox.manifest import Manifest
    from agents.sandbox.session import SandboxSession, SandboxSessionState
    from agents.sandbox.session.base_sandbox_session import BaseSandboxSession
    from agents.sandbox.session.dependencies import Dependencies
    from agents.sandbox.session.manager import Instrumentation
    from agents.sandbox.session.pty_output import collect_pty_output
    from agents.sandbox.session.pty_types import (
        PTY_PROCESSES_MAX,
        PtyExecUpdate,
        allocate_pty_process_id,
        clamp_pty_yield_time_ms,
        process_id_to_prune_from_meta,
        resolve_pty_write_yield_time_ms,
    )
    from agents.sandbox.session.runtime_helpers import RESOLVE_WORKSPACE_PATH_HELPER, RuntimeHelperScript
    from agents.sandbox.session.sandbox_client import BaseSandboxClient, BaseSandboxClientOptions
    from agents.sandbox.snapshot import SnapshotBase, SnapshotSpec, resolve_snapshot
    from agents.sandbox.types import ExecResult, ExposedPortEndpoint, User
    from agents.sandbox.workspace_paths import coerce_posix_path, posix_path_as_path
    from pydantic import BaseModel, ConfigDict, Field
except ImportError as _e:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "sandbox_sessions_sdk.openai_agents needs the OpenAI Agents SDK (openai-agents>=0.24,<0.25): "
        "pip install 'sandgate-sdk[openai-agents]'"
    ) from _e

from .aio import AsyncSessionsClient

_log = logging.getLogger(__name__)

#: The Agents SDK versions this module follows (the extra's pin).
SUPPORTED_AGENTS_VERSIONS = ">=0.24,<0.25"


def _check_agents_version() -> None:
    import warnings

    try:
        from agents import __version__ as version
    except ImportError:  # pragma: no cover - every 0.x release has it
        return
    parts = str(version).split(".")
    if parts[:2] != ["0", "24"]:
        warnings.warn(
            f"sandbox_sessions_sdk.openai_agents follows openai-agents {SUPPORTED_AGENTS_VERSIONS}; "
            f"{version} is installed (pip install 'sandgate-sdk[openai-agents]' installs a supported one)",
            RuntimeWarning,
            stacklevel=3,
        )


_check_agents_version()
from .errors import (
    FileNotFoundInSandboxError,
    ProcessExitedError,
    ProcessNotFoundError,
    SandboxAPIError,
    SandboxConnectionError,
    SessionNotFoundError,
    SnapshotNotFoundError,
    WorkspaceExistsError,
    WorkspaceNotFoundError,
)
from .models import CommandResult, Session

__all__ = [
    "DEFAULT_WORKSPACE_ROOT",
    "SUPPORTED_AGENTS_VERSIONS",
    "SandgateResources",
    "SandgateSandboxClient",
    "SandgateSandboxClientOptions",
    "SandgateSandboxSession",
    "SandgateSandboxSessionState",
]

#: The Agents SDK's default manifest root, which is also where sandgate's
#: linux driver mounts the workspace.
DEFAULT_WORKSPACE_ROOT = "/workspace"

#: What starts a persisted workspace that is a reference to a sandgate
#: snapshot rather than a tar stream (a tar stream never starts with it).
_SNAPSHOT_REF_MAGIC = b"SANDGATE-SNAPSHOT-REF\n"

WorkspacePersistence = Literal["snapshot", "tar"]


def _encode_snapshot_ref(snapshot_id: str) -> bytes:
    return _SNAPSHOT_REF_MAGIC + json.dumps({"snapshot_id": snapshot_id}, separators=(",", ":")).encode()


def _decode_snapshot_ref(raw: bytes) -> Optional[str]:
    if not raw.startswith(_SNAPSHOT_REF_MAGIC):
        return None
    try:
        obj = json.loads(raw[len(_SNAPSHOT_REF_MAGIC) :].decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    sid = obj.get("snapshot_id") if isinstance(obj, dict) else None
    return sid if isinstance(sid, str) and sid else None


def _context(err: BaseException) -> Dict[str, object]:
    ctx: Dict[str, object] = {"backend": "sandgate"}
    if isinstance(err, SandboxAPIError):
        if err.code:
            ctx["code"] = err.code
        if err.status_code:
            ctx["http_status"] = err.status_code
    return ctx


def _retryable(err: BaseException) -> Optional[bool]:
    if isinstance(err, SandboxConnectionError):
        return True
    if isinstance(err, SandboxAPIError) and err.status_code:
        return err.status_code in (429, 500, 502, 503, 504)
    return None


class SandgateResources(BaseModel):
    """The session's limits (None: the gateway's default)."""

    model_config = ConfigDict(frozen=True)

    memory_mib: Optional[int] = None
    cpus: Optional[float] = None
    pids: Optional[int] = None
    disk_mib: Optional[int] = None

    def api(self) -> Dict[str, Any]:
        names = {"memory_mib": "memoryMiB", "cpus": "cpus", "pids": "pids", "disk_mib": "diskMiB"}
        return {names[k]: v for k, v in self.model_dump().items() if v is not None}


class SandgateSandboxClientOptions(BaseSandboxClientOptions):
    """How :class:`SandgateSandboxClient` creates a session; every field has a default.

    Attributes:
        image: The sandbox image; None (the default) is the gateway's default image.
        ttl: The session's lifetime in seconds (60..28800).
        name: A name for the session, unique among the tenant's live sessions.
        resources: Memory, CPUs, pids, disk (:class:`SandgateResources`, or a dict).
        egress: The hosts the sandbox may reach (``"pypi.org"``, ``"*.github.com"``,
            ``"10.0.0.5:8080"``); empty: no network.
        secrets: Operator secrets by name (an environment variable of that
            name), or bound to hosts (``{"name": "GITHUB_TOKEN", "hosts":
            ["api.github.com"]}``: the egress proxy adds the header, the value
            never enters the sandbox).
        workspace: A named workspace to mount as the session's workspace
            (created when missing); its files outlive the session.
        labels: Free-form labels (the session's metadata).
        env: Environment variables set on every command.
        exposed_ports: Ports whose preview origins ``resolve_exposed_port`` gives.
        port_link_ttl_s: How long those preview links stay valid.
        pause_on_exit: Stop the session (files kept) instead of deleting it
            when the SDK shuts the sandbox down.
        workspace_persistence: ``"snapshot"`` (a sandgate snapshot) or ``"tar"``.
        exec_timeout_s: The timeout of a command the SDK runs without one
            (at most the gateway's ``--max-command-timeout``, 1 h by default).
        ssh_public_key: An authorized_keys line for SSH into the session.
    """

    type: Literal["sandgate"] = "sandgate"
    image: Optional[str] = None
    ttl: int = 3600
    name: Optional[str] = None
    resources: Optional[SandgateResources] = None
    egress: Tuple[str, ...] = ()
    secrets: Tuple[Union[str, Dict[str, Any]], ...] = ()
    workspace: Optional[str] = None
    labels: Optional[Dict[str, str]] = None
    env: Optional[Dict[str, str]] = None
    exposed_ports: Tuple[int, ...] = ()
    port_link_ttl_s: int = 3600
    pause_on_exit: bool = False
    workspace_persistence: WorkspacePersistence = "snapshot"
    exec_timeout_s: float = Field(default=3600, gt=0)
    ssh_public_key: Optional[str] = None


class SandgateSandboxSessionState(SandboxSessionState):
    """What the SDK keeps of a sandgate session to resume it (no token: the
    client brings its own)."""

    type: Literal["sandgate"] = "sandgate"
    sandgate_session_id: str
    api_url: Optional[str] = None
    workspace_root: Optional[str] = None
    image: Optional[str] = None
    ttl: int = 3600
    name: Optional[str] = None
    resources: Optional[SandgateResources] = None
    egress: Tuple[str, ...] = ()
    secrets: Tuple[Union[str, Dict[str, Any]], ...] = ()
    workspace: Optional[str] = None
    labels: Optional[Dict[str, str]] = None
    base_env: Dict[str, str] = Field(default_factory=dict)
    port_link_ttl_s: int = 3600
    pause_on_exit: bool = False
    workspace_persistence: WorkspacePersistence = "snapshot"
    exec_timeout_s: float = 3600
    ssh_public_key: Optional[str] = None
    #: The sandgate snapshot the SDK's snapshot last recorded (or was
    #: restored from); the next persist replaces it and deletes it.
    sandgate_snapshot_id: Optional[str] = None


def _state_fields(options: SandgateSandboxClientOptions) -> Dict[str, Any]:
    return {
        "image": options.image,
        "ttl": options.ttl,
        "name": options.name,
        "resources": options.resources,
        "egress": tuple(options.egress),
        "secrets": tuple(options.secrets),
        "workspace": options.workspace,
        "labels": dict(options.labels) if options.labels else None,
        "base_env": dict(options.env or {}),
        "exposed_ports": tuple(options.exposed_ports),
        "port_link_ttl_s": options.port_link_ttl_s,
        "pause_on_exit": options.pause_on_exit,
        "workspace_persistence": options.workspace_persistence,
        "exec_timeout_s": options.exec_timeout_s,
        "ssh_public_key": options.ssh_public_key,
    }


async def _create_sandgate_session(
    sessions: AsyncSessionsClient, state: SandgateSandboxSessionState, *, from_snapshot: Optional[str] = None
) -> Session:
    """``POST /v1/sessions`` with what *state* asks for; a named workspace
    that does not exist yet is created first."""
    kwargs: Dict[str, Any] = {
        "ttl": state.ttl,
        "image": state.image,
        "metadata": dict(state.labels) if state.labels else None,
        "ssh_public_key": state.ssh_public_key,
        "resources": state.resources.api() if state.resources is not None else None,
        "egress": list(state.egress) or None,
        "secrets": list(state.secrets) or None,
        "name": state.name,
    }
    if from_snapshot is not None:
        kwargs["from_snapshot"] = from_snapshot
    elif state.workspace is not None:
        kwargs["workspace"] = state.workspace
    try:
        return await sessions.create_session(**kwargs)
    except WorkspaceNotFoundError:
        if from_snapshot is not None or state.workspace is None:
            raise
    try:
        await sessions.create_workspace(state.workspace)
    except WorkspaceExistsError:
        pass  # another client made it meanwhile: use it
    return await sessions.create_session(**kwargs)


def _adopt_root(state: SandgateSandboxSessionState, root: str) -> None:
    """Record *root* as the session's workspace; the manifest's root follows
    it when it was the default (``/workspace``) or the previous session's
    workspace, or lay under one of them (``/workspace/proj`` becomes
    ``ROOT/proj``): the workdir driver gives each session a directory of
    its own."""
    current = PurePosixPath(coerce_posix_path(state.manifest.root).as_posix())
    for base in (DEFAULT_WORKSPACE_ROOT, state.workspace_root):
        if base is None:
            continue
        b = PurePosixPath(base)
        if current == b or b in current.parents:
            moved = (PurePosixPath(root) / current.relative_to(b)).as_posix()
            if moved != current.as_posix():
                state.manifest = state.manifest.model_copy(update={"root": moved})
            break
    state.workspace_root = root


async def _workspace_root(sessions: AsyncSessionsClient, sid: str) -> str:
    """The directory the session's commands start in: its workspace."""
    res = await sessions.run(sid, argv=["pwd"])  # the gateway's default timeout (60 s), whatever its maximum
    return (res.cwd or res.stdout.strip() or DEFAULT_WORKSPACE_ROOT).rstrip("/") or "/"


#: What a read outside the workspace (through a command, base64) asks the
#: gateway to keep of its output; the gateway caps it (--max-output-bytes).
_MAX_READ_OUTSIDE = 8 << 20

#: The gateway's largest command timeout, in its invalid_timeout message.
#: (The error envelope has no structured field for it, nor does any
#: endpoint publish --max-command-timeout: the message is all there is. When
#: it does not match, the error is raised as it is.)
_MAX_TIMEOUT = re.compile(r"at most ([0-9.]+(?:e[+-]?[0-9]+)?) seconds")

#: Runs "$1" on a pseudo-terminal with util-linux script(1) (-e: its exit
#: status; -f: flush; -q: quiet) where the sandbox has one that takes those
#: options, else with plain pipes.
_TTY_WRAPPER = (
    'if script -qefc true /dev/null >/dev/null 2>&1; then exec script -qefc "$1" /dev/null; fi\n'
    'exec sh -c "$1"'
)


#: A name the environment file can export.
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

#: What the environment file's wrapper says when the file is gone.
_ENV_MISSING = "sandgate-env-missing"
_ENV_MISSING_EXIT = 197

#: Sources the environment file "$1", then runs the rest of its arguments.
_ENV_WRAPPER = (
    'f=$1; shift; if [ ! -r "$f" ]; then echo "%s: $f" >&2; exit %d; fi; . "$f" && exec "$@"'
    % (_ENV_MISSING, _ENV_MISSING_EXIT)
)

#: Writes its standard input to "$1", readable by its owner only (no
#: clobbering: a file put in the temporary name's way fails the write).
_ENV_WRITER = 'umask 077 && set -C && t="$1.$$" && cat > "$t" && mv -f -- "$t" "$1"'


@dataclass
class _Process:
    """A sandgate background process the SDK drives as an interactive exec."""

    process_id: str
    output_chunks: deque = field(default_factory=deque)
    output_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    output_notify: asyncio.Event = field(default_factory=asyncio.Event)
    output_closed: asyncio.Event = field(default_factory=asyncio.Event)
    exit_code: Optional[int] = None
    #: The gateway said the process ended (its output's final line, or its status).
    exited: bool = False
    reader: Optional["asyncio.Task[None]"] = None
    #: Kills the process when its timeout passes.
    killer: Optional["asyncio.Task[None]"] = None
    last_used: float = field(default_factory=time.monotonic)


def _as_user(user: Union[str, User, None], argv: list) -> list:
    """*argv* as the SDK runs a command as *user* (``sudo -u USER --``)."""
    if user is None:
        return argv
    name = user.name if isinstance(user, User) else user
    return ["sudo", "-u", name, "--", *argv]


def _exit_code(line: Dict[str, Any]) -> Optional[int]:
    if isinstance(line.get("exitCode"), int):
        return int(line["exitCode"])
    sig = line.get("exitSignal")
    if isinstance(sig, str) and sig:
        try:
            return 128 + int(_signal.Signals["SIG" + sig.upper().replace("SIG", "", 1)])
        except KeyError:
            return 255
    return None


class SandgateSandboxSession(BaseSandboxSession):
    """One sandgate session as an Agents SDK sandbox session."""

    state: SandgateSandboxSessionState

    def __init__(self, *, state: SandgateSandboxSessionState, sessions: AsyncSessionsClient) -> None:
        self.state = state
        self._sessions = sessions
        self._made_snapshot: Optional[str] = None
        self._persisted_tar = False
        self._max_timeout: Optional[float] = None
        #: The sandgate snapshot resume started this session from, if any.
        self._created_from_snapshot: Optional[str] = None
        self._pty_lock = asyncio.Lock()
        self._processes: Dict[int, _Process] = {}
        self._reserved_process_ids: set = set()
        #: (sandgate session, user) -> (digest, path) of the environment file written there.
        self._env_files: Dict[Tuple[str, Optional[str]], Tuple[str, str]] = {}

    @classmethod
    def from_state(
        cls, state: SandgateSandboxSessionState, *, sessions: AsyncSessionsClient
    ) -> "SandgateSandboxSession":
        return cls(state=state, sessions=sessions)

    @property
    def sandgate_session_id(self) -> str:
        """The sandgate session's id (``sbx-...``), for the REST API and the CLI."""
        return self.state.sandgate_session_id

    @property
    def sessions(self) -> AsyncSessionsClient:
        """The REST client this session uses (for sandgate calls the SDK has no name for)."""
        return self._sessions

    @property
    def ssh_command(self) -> str:
        """The command line a person runs to join this sandbox over SSH
        (OpenSSH through ``sandgate proxy``, the gateway's host key pinned;
        the bearer token comes from ``$SANDBOX_API_TOKEN``)::

            sandgate ssh --api-url http://127.0.0.1:8080 sbx-...
        """
        return shlex.join(["sandgate", "ssh", "--api-url", self._sessions.api_url, self.sandgate_session_id])

    def ssh_argv(self, known_hosts_file: str) -> list:
        """OpenSSH's own command line for this sandbox, for a machine with
        ``sandgate`` on its PATH: ``sandgate proxy`` as ProxyCommand and the
        host keys pinned in *known_hosts_file* (write the session's
        ``ssh.knownHostsLine`` there)."""
        proxy = shlex.join(["sandgate", "proxy", "--api-url", self._sessions.api_url]) + " %h"
        return [
            "ssh",
            "-o",
            f"ProxyCommand={proxy}",
            "-o",
            f"UserKnownHostsFile={known_hosts_file}",
            "-o",
            "StrictHostKeyChecking=yes",
            f"sandbox@{self.sandgate_session_id}",
        ]

    # -- paths -------------------------------------------------------------

    def _root(self) -> PurePosixPath:
        return PurePosixPath(coerce_posix_path(self.state.manifest.root).as_posix())

    def _workspace_rel(self, path: Union[Path, str]) -> Optional[str]:
        """*path* (absolute, normalized) relative to the sandgate workspace,
        for the files API; None when it is outside."""
        base = self.state.workspace_root or DEFAULT_WORKSPACE_ROOT
        p = PurePosixPath(coerce_posix_path(path).as_posix())
        try:
            rel = p.relative_to(PurePosixPath(base))
        except ValueError:
            return None
        return rel.as_posix() if rel.parts else "."

    async def _validate_path_access(self, path: Union[Path, str], *, for_write: bool = False) -> Path:
        return await self._validate_remote_path_access(path, for_write=for_write)

    def _runtime_helpers(self) -> Tuple[RuntimeHelperScript, ...]:
        return (RESOLVE_WORKSPACE_PATH_HELPER,)

    # -- lifecycle ---------------------------------------------------------

    async def _prepare_backend_workspace(self) -> None:
        root = self._root().as_posix()
        try:
            res = await self._run(["mkdir", "-p", "--", root], timeout=60)
        except SandboxAPIError as e:
            raise WorkspaceStartError(
                path=Path(root), context=_context(e), cause=e, message=f"failed to start session: {e}",
                retryable=_retryable(e),
            ) from e
        if res.exit_code != 0:
            raise WorkspaceStartError(
                path=Path(root),
                context={"backend": "sandgate", "exit_code": res.exit_code, "stderr": res.stderr[:4096]},
                message=f"failed to start session: mkdir {root} exited {res.exit_code}",
            )

    async def running(self) -> bool:
        # A stopped sandgate session keeps its files and starts again on the
        # next command: to the SDK it still runs.
        try:
            s = await self._sessions.get_session(self.sandgate_session_id)
        except SandboxAPIError:
            return False
        return s.status in ("running", "stopped", "creating", "starting")

    async def _shutdown_backend(self) -> None:
        await self._remove_env_files()
        sid = self.sandgate_session_id
        what = "delete"
        try:
            if self.state.pause_on_exit:
                what = "stop"
                try:
                    await self._sessions.stop_session(sid)
                    return
                except SandboxAPIError as e:
                    # A driver that cannot stop, or a failed session (nothing
                    # in it to keep): delete it rather than leave it running.
                    if e.code not in ("stop_unsupported", "session_not_running"):
                        raise
                    _log.warning("sandgate: cannot stop session %s (%s): deleting it instead", sid, e.code)
                    what = "delete"
            await self._sessions.delete_session(sid)
        except SessionNotFoundError:
            pass
        except SandboxAPIError as e:
            _log.warning("sandgate: could not %s session %s (it lives on until its ttl): %s", what, sid, e)

    # -- exec --------------------------------------------------------------

    async def _run(self, argv: list, timeout: Optional[float] = None, **options: Any) -> CommandResult:
        """``POST .../commands`` with *argv* in this session. *timeout* None
        is the state's ``exec_timeout_s``, lowered to the gateway's
        ``--max-command-timeout`` when that is smaller (learnt from its
        ``invalid_timeout`` answer, once)."""
        t = self.state.exec_timeout_s if timeout is None else timeout
        if self._max_timeout is not None:
            t = min(t, self._max_timeout)
        try:
            return await self._sessions.run(self.sandgate_session_id, argv=argv, timeout=t, **options)
        except SandboxAPIError as e:
            m = _MAX_TIMEOUT.search(e.message or "") if e.code == "invalid_timeout" else None
            if m is None or float(m.group(1)) >= t:
                raise
            self._max_timeout = float(m.group(1))
            return await self._sessions.run(
                self.sandgate_session_id, argv=argv, timeout=self._max_timeout, **options
            )

    async def _with_env(self, argv: list) -> list:
        """*argv* with the options' and the manifest's environment.

        The values never go into an argv (the gateway records each
        command's in its history, and ``ps`` shows it): they are written
        once, through a command's standard input, to a 0600 file outside
        the workspace, which the command sources before it runs
        (``sh -c '. "$F"; exec "$@"'``). Under the SDK's ``sudo -u USER --``
        the wrapper goes after it (sudo resets the environment), with a file
        of that user's. (The REST ``env`` field takes only the names the
        operator allows, as SSH's AcceptEnv.)"""
        env = {**self.state.base_env, **(await self.state.manifest.environment.resolve())}
        if not env:
            return argv
        for k in env:
            if not _ENV_NAME.fullmatch(k):
                raise ValueError(f"environment variable name {k!r} is not valid")
        user: Optional[str] = None
        rest = argv
        if len(argv) >= 4 and argv[0] == "sudo" and argv[1] == "-u" and argv[3] == "--":
            user, rest = argv[2], argv[4:]
        path = await self._env_file(env, user)
        wrapped = ["sh", "-c", _ENV_WRAPPER, "sh", path, *rest]
        return ["sudo", "-u", user, "--", *wrapped] if user is not None else wrapped

    async def _env_file(self, env: Dict[str, str], user: Optional[str]) -> str:
        """The path of the 0600 file that exports *env* for *user*'s
        commands, written (again) when it changed."""
        content = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items()).encode("utf-8")
        digest = hashlib.sha256(content).hexdigest()
        key = (self.sandgate_session_id, user)
        known = self._env_files.get(key)
        if known is not None and known[0] == digest:
            return known[1]
        path = known[1] if known is not None else f"/tmp/.sandgate-env-{uuid.uuid4().hex}"
        argv = ["sh", "-c", _ENV_WRITER, "sh", path]
        if user is not None:
            argv = ["sudo", "-u", user, "--", *argv]
        try:
            res = await self._run(argv, timeout=60, stdin=content)
        except SandboxAPIError as e:
            raise ExecTransportError(
                command=("<write environment>",), context=_context(e), cause=e,
                message=f"sandgate: writing the commands' environment failed: {e}", retryable=_retryable(e),
            ) from e
        if res.exit_code != 0:
            raise ExecTransportError(
                command=("<write environment>",),
                context={"backend": "sandgate", "exit_code": res.exit_code, "stderr": res.stderr[:4096]},
                message=f"sandgate: writing the commands' environment exited {res.exit_code}",
            )
        self._env_files[key] = (digest, path)
        return path

    async def _remove_env_files(self) -> None:
        files, self._env_files = self._env_files, {}
        for (sid, user), (_, path) in files.items():
            argv = ["rm", "-f", "--", path]
            if user is not None:
                argv = ["sudo", "-u", user, "--", *argv]
            try:
                await self._sessions.run(sid, argv=argv, timeout=30)
            except SandboxAPIError:
                pass

    async def _run_with_env(self, argv: list, **options: Any) -> CommandResult:
        res = await self._run(await self._with_env(argv), **options)
        if res.exit_code == _ENV_MISSING_EXIT and _ENV_MISSING in res.stderr:
            # The sandbox lost the file (its /tmp, across a stop and start):
            # the command did not run; write the file again and run it.
            self._env_files.clear()
            res = await self._run(await self._with_env(argv), **options)
        return res

    async def _exec_internal(self, *command: Union[str, Path], timeout: Optional[float] = None) -> ExecResult:
        argv = [str(c) for c in command]
        t = self.state.exec_timeout_s if timeout is None else max(float(timeout), 0.001)
        root = self._root().as_posix()
        cwd = None if root == (self.state.workspace_root or DEFAULT_WORKSPACE_ROOT) else root
        try:
            res = await self._run_with_env(argv, timeout=t, cwd=cwd)
        except SandboxAPIError as e:
            raise ExecTransportError(
                command=command, context=_context(e), cause=e, message=f"sandgate exec failed: {e}",
                retryable=_retryable(e),
            ) from e
        if res.timed_out:
            raise ExecTimeoutError(command=command, timeout_s=timeout, context={"backend": "sandgate"})
        return ExecResult(
            stdout=res.stdout.encode("utf-8", errors="replace"),
            stderr=res.stderr.encode("utf-8", errors="replace"),
            exit_code=res.exit_code,
        )

    # -- interactive execs: sandgate background processes ------------------

    def supports_pty(self) -> bool:
        # sandgate's background processes: long commands go on past the
        # tool's yield time, and the model polls or writes to them. Their
        # stdin, stdout and stderr are pipes; tty=True runs the command
        # under script(1) for a terminal where the sandbox has it.
        return True

    async def pty_exec_start(
        self,
        *command: Union[str, Path],
        timeout: Optional[float] = None,
        shell: Union[bool, list] = True,
        user: Union[str, User, None] = None,
        tty: bool = False,
        yield_time_s: Optional[float] = None,
        max_output_tokens: Optional[int] = None,
    ) -> PtyExecUpdate:
        argv = self._prepare_exec_command(*command, shell=shell, user=user)
        if tty:
            # A terminal: util-linux script(1) runs the command on a pty when
            # the sandbox has it; else plain pipes.
            argv = ["sh", "-c", _TTY_WRAPPER, "sh", shlex.join(argv)]
        root = self._root().as_posix()
        cwd = None if root == (self.state.workspace_root or DEFAULT_WORKSPACE_ROOT) else root
        try:
            started = await self._sessions.start_process(
                self.sandgate_session_id, argv=await self._with_env(argv), cwd=cwd
            )
        except SandboxAPIError as e:
            context = _context(e)
            if e.code in ("too_many_processes", "process_output_limit"):
                # Nothing started: the shell tool may run it as a plain command instead.
                context["retry_safe"] = True
            raise ExecTransportError(
                command=command, context=context, cause=e, message=f"sandgate process start failed: {e}",
                retryable=_retryable(e),
            ) from e
        entry = _Process(process_id=str(started["processId"]))
        entry.reader = asyncio.create_task(self._read_output(entry))
        limit = self.state.exec_timeout_s if timeout is None else max(float(timeout), 0.001)
        entry.killer = asyncio.create_task(self._kill_after(entry, limit))
        async with self._pty_lock:
            pid = allocate_pty_process_id(self._reserved_process_ids)
            self._reserved_process_ids.add(pid)
            pruned = self._prune_processes()
            self._processes[pid] = entry
        if pruned is not None:
            await self._terminate(pruned)
        yield_ms = 10_000 if yield_time_s is None else int(yield_time_s * 1000)
        return await self._collect(pid, entry, clamp_pty_yield_time_ms(yield_ms), max_output_tokens)

    async def pty_write_stdin(
        self,
        *,
        session_id: int,
        chars: str,
        yield_time_s: Optional[float] = None,
        max_output_tokens: Optional[int] = None,
    ) -> PtyExecUpdate:
        async with self._pty_lock:
            entry = self._resolve_pty_session_entry(pty_processes=self._processes, session_id=session_id)
        if chars:
            try:
                await self._sessions.send_process_input(self.sandgate_session_id, entry.process_id, chars)
            except SandboxAPIError as e:
                raise ExecTransportError(
                    command=("write_stdin", entry.process_id), context=_context(e), cause=e,
                    message=f"sandgate process input failed: {e}", retryable=_retryable(e),
                ) from e
            await asyncio.sleep(0.1)
        yield_ms = 250 if yield_time_s is None else int(yield_time_s * 1000)
        entry.last_used = time.monotonic()
        return await self._collect(
            session_id,
            entry,
            resolve_pty_write_yield_time_ms(yield_time_ms=yield_ms, input_empty=chars == ""),
            max_output_tokens,
        )

    async def pty_terminate_all(self) -> None:
        async with self._pty_lock:
            entries = list(self._processes.values())
            self._processes.clear()
            self._reserved_process_ids.clear()
        for entry in entries:
            await self._terminate(entry)

    async def _kill_after(self, entry: _Process, seconds: float) -> None:
        """The process's timeout: KILL it when *seconds* pass before it ends."""
        await asyncio.sleep(seconds)
        if entry.exited:
            return
        try:
            await self._sessions.signal_process(self.sandgate_session_id, entry.process_id, "KILL")
        except (ProcessExitedError, ProcessNotFoundError):
            pass
        except SandboxAPIError as e:
            _log.warning("sandgate: could not kill process %s at its timeout: %s", entry.process_id, e)

    async def _read_output(self, entry: _Process) -> None:
        """Follow the process's output into its chunks, to its end: the
        output's final line (``done: true``), or the process or its
        session gone. A stream that ends without it (a dropped connection)
        is followed again from where it stopped; one that a pause of the
        session ended (``error.code`` ``session_paused``) only once the
        session runs again: following it would resume it."""
        offset = 0
        errors = 0  # consecutive failed calls: 10 end the reading
        idle = 0  # consecutive streams that brought nothing: a longer wait
        sid = self.sandgate_session_id
        try:
            while True:
                before = offset
                paused = False
                try:
                    stream = await self._sessions.process_output(sid, entry.process_id, offset=offset, follow=True)
                    async with stream:
                        async for line in stream:
                            data = b""
                            for key in ("stdout", "stderr"):
                                if isinstance(line.get(key), str):
                                    data += line[key].encode("utf-8")
                                elif isinstance(line.get(key + "Base64"), str):
                                    data += base64.b64decode(line[key + "Base64"])
                            if data:
                                async with entry.output_lock:
                                    entry.output_chunks.append(data)
                                entry.output_notify.set()
                                if isinstance(line.get("offset"), int):
                                    offset = max(offset, line["offset"] + len(data))
                            elif isinstance(line.get("offset"), int):  # after droppedBytes
                                offset = max(offset, line["offset"])
                            if isinstance(line.get("nextOffset"), int):
                                offset = max(offset, line["nextOffset"])
                            err = line.get("error")
                            if isinstance(err, dict) and err.get("code") == "session_paused":
                                paused = True
                            if line.get("done") is True:
                                entry.exit_code = _exit_code(line)
                                entry.exited = True
                                return
                    errors = 0
                except (ProcessNotFoundError, SessionNotFoundError):
                    return
                except SandboxAPIError:
                    errors += 1
                if paused:
                    # The session was paused: wait, asking only its status
                    # (which does not resume it), until it runs again.
                    try:
                        while (await self._sessions.get_session(sid)).status == "paused":
                            await asyncio.sleep(1.0)
                    except SessionNotFoundError:
                        return
                    except SandboxAPIError:
                        errors += 1
                    continue
                idle = 0 if offset > before else idle + 1
                # The stream ended without its final line: the process may
                # still run (follow it again) or have ended (its final line
                # comes at once); gone, there is nothing more to read.
                try:
                    await self._sessions.get_process(sid, entry.process_id)
                except (ProcessNotFoundError, SessionNotFoundError):
                    return
                except SandboxAPIError:
                    errors += 1
                if errors > 10:
                    return
                await asyncio.sleep(min(0.1 * (2 ** min(max(errors, idle), 5)), 2.0))
        except asyncio.CancelledError:
            pass
        finally:
            killer = entry.killer
            if entry.exited and killer is not None and not killer.done():
                killer.cancel()
            entry.output_closed.set()
            entry.output_notify.set()

    async def _collect(
        self, pid: int, entry: _Process, yield_time_ms: int, max_output_tokens: Optional[int]
    ) -> PtyExecUpdate:
        output, original_token_count, closed = await collect_pty_output(
            output_chunks=entry.output_chunks,
            output_lock=entry.output_lock,
            output_notify=entry.output_notify,
            is_done=entry.output_closed.is_set,
            yield_time_ms=yield_time_ms,
            max_output_tokens=max_output_tokens,
        )
        live: Optional[int] = pid
        if closed:
            async with self._pty_lock:
                removed = self._processes.pop(pid, None)
                self._reserved_process_ids.discard(pid)
            if removed is not None:
                await self._terminate(removed)
            live = None
        return PtyExecUpdate(
            process_id=live,
            output=output,
            exit_code=entry.exit_code if closed else None,
            original_token_count=original_token_count,
        )

    def _prune_processes(self) -> Optional[_Process]:
        if len(self._processes) < PTY_PROCESSES_MAX:
            return None
        meta = [(pid, e.last_used, e.output_closed.is_set()) for pid, e in self._processes.items()]
        pid = process_id_to_prune_from_meta(meta)
        if pid is None:
            return None
        self._reserved_process_ids.discard(pid)
        return self._processes.pop(pid, None)

    async def _terminate(self, entry: _Process) -> None:
        # KILL it unless the gateway said it ended (the reader may have
        # stopped for another reason: a session gone, a connection lost).
        if not entry.exited:
            try:
                await self._sessions.signal_process(self.sandgate_session_id, entry.process_id, "KILL")
            except (ProcessExitedError, ProcessNotFoundError, SessionNotFoundError):
                pass
            except SandboxAPIError as e:
                _log.warning("sandgate: could not kill process %s: %s", entry.process_id, e)
        tasks = []
        for attr in ("reader", "killer"):
            task = getattr(entry, attr)
            setattr(entry, attr, None)
            if task is not None and task is not asyncio.current_task():
                if not task.done():
                    task.cancel()
                tasks.append(task)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- files -------------------------------------------------------------

    async def read(self, path: Path, *, user: Union[str, User, None] = None) -> io.IOBase:
        error_path = posix_path_as_path(coerce_posix_path(path))
        if user is not None:
            target = await self._check_read_with_exec(path, user=user)
        else:
            target = await self._validate_path_access(path)
        # As a user: through a command of that user's (the files API reads
        # as the session's default user).
        rel = self._workspace_rel(target) if user is None else None
        try:
            if rel is not None:
                return io.BytesIO(await self._sessions.read_file(self.sandgate_session_id, rel))
            res = await self._run(
                _as_user(user, ["sh", "-c", 'test -e "$1" || exit 44; base64 < "$1"', "sh", target.as_posix()]),
                max_output_bytes=_MAX_READ_OUTSIDE,
            )
        except FileNotFoundInSandboxError as e:
            raise WorkspaceReadNotFoundError(path=error_path, context=_context(e), cause=e) from e
        except SandboxAPIError as e:
            raise WorkspaceArchiveReadError(
                path=error_path, context=_context(e), cause=e, retryable=_retryable(e)
            ) from e
        if res.exit_code == 44:
            raise WorkspaceReadNotFoundError(path=error_path, context={"backend": "sandgate"})
        if res.exit_code != 0 or res.truncated:
            raise WorkspaceArchiveReadError(
                path=error_path,
                context={"backend": "sandgate", "exit_code": res.exit_code, "truncated": res.truncated,
                         "stderr": res.stderr[:4096]},
            )
        return io.BytesIO(base64.b64decode(res.stdout))

    async def _read_bounded(self, path: Path, *, max_bytes: int) -> bytes:
        """At most *max_bytes* of *path*, and no more asked for: the files
        API's bound in the workspace, ``head -c`` outside it."""
        error_path = posix_path_as_path(coerce_posix_path(path))
        target = await self._validate_path_access(path)
        rel = self._workspace_rel(target)
        if rel is not None:
            try:
                return await self._sessions.read_file(self.sandgate_session_id, rel, max_bytes=max_bytes)
            except FileNotFoundInSandboxError as e:
                raise WorkspaceReadNotFoundError(path=error_path, context=_context(e), cause=e) from e
            except SandboxAPIError as e:
                raise WorkspaceArchiveReadError(
                    path=error_path, context=_context(e), cause=e, retryable=_retryable(e)
                ) from e
        # base64 is 4/3 of the bytes, plus a newline every 76 characters.
        wire = (max_bytes + 2) // 3 * 4 + max_bytes // 57 + 64
        try:
            res = await self._run(
                ["sh", "-c", '[ -e "$1" ] || exit 44; [ -f "$1" ] || exit 45; head -c "$2" < "$1" | base64',
                 "sh", target.as_posix(), str(max_bytes)],
                timeout=60,
                max_output_bytes=wire,
            )
        except SandboxAPIError as e:
            raise WorkspaceArchiveReadError(
                path=error_path, context=_context(e), cause=e, retryable=_retryable(e)
            ) from e
        if res.exit_code == 44:
            raise WorkspaceReadNotFoundError(path=error_path, context={"backend": "sandgate"})
        if res.truncated:
            raise WorkspaceArchiveReadError(
                path=error_path, context={"backend": "sandgate", "reason": "bounded_read_wire_limit"}
            )
        if res.exit_code != 0:
            raise WorkspaceArchiveReadError(
                path=error_path,
                context={"backend": "sandgate", "exit_code": res.exit_code, "stderr": res.stderr[:4096]},
            )
        return base64.b64decode(res.stdout)[:max_bytes]

    async def write(self, path: Path, data: io.IOBase, *, user: Union[str, User, None] = None) -> None:
        error_path = posix_path_as_path(coerce_posix_path(path))
        if user is not None:
            await self._check_write_with_exec(path, user=user)
        payload = data.read()
        if isinstance(payload, str):
            payload = payload.encode("utf-8")
        if not isinstance(payload, (bytes, bytearray)):
            raise WorkspaceWriteTypeError(path=error_path, actual_type=type(payload).__name__)
        target = await self._validate_path_access(path, for_write=True)
        # As a user: through a command of that user's (the files API writes
        # as the session's default user).
        rel = self._workspace_rel(target) if user is None else None
        try:
            if rel is not None:
                await self._sessions.write_file(self.sandgate_session_id, rel, bytes(payload), mkdirs=True)
                return
            res = await self._run(
                _as_user(user, ["sh", "-c", 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"', "sh",
                                target.as_posix()]),
                stdin=bytes(payload),
            )
        except SandboxAPIError as e:
            raise WorkspaceArchiveWriteError(
                path=error_path, context=_context(e), cause=e, retryable=_retryable(e)
            ) from e
        if res.exit_code != 0:
            raise WorkspaceArchiveWriteError(
                path=error_path,
                context={"backend": "sandgate", "exit_code": res.exit_code, "stderr": res.stderr[:4096]},
            )

    # -- snapshots -----------------------------------------------------------

    def _uses_snapshots(self) -> bool:
        return (
            self.state.workspace_persistence == "snapshot"
            and self.state.workspace is None
            and not self._persist_workspace_skip_relpaths()
            and self._root().as_posix() == (self.state.workspace_root or DEFAULT_WORKSPACE_ROOT)
        )

    async def _persist_snapshot(self) -> None:
        # One sandgate snapshot per SDK session: once the SDK has recorded a
        # new one, the one it replaces is deleted (snapshots count against
        # the tenant's --max-snapshots-per-tenant). One the SDK failed to
        # record is deleted at once; a tar recorded instead deletes the
        # previous one too (nothing refers to it any more).
        previous = self.state.sandgate_snapshot_id
        self._made_snapshot = None
        self._persisted_tar = False
        try:
            await super()._persist_snapshot()
        except BaseException:
            made, self._made_snapshot = self._made_snapshot, None
            if made is not None:
                await self._delete_snapshot_quietly(made)
            raise
        made = self._made_snapshot
        if made is not None:
            self.state.sandgate_snapshot_id = made
        elif self._persisted_tar:
            self.state.sandgate_snapshot_id = None
        else:
            return  # nothing persisted (no snapshot configured)
        if previous is not None and previous != made:
            await self._delete_snapshot_quietly(previous)

    async def _delete_snapshot_quietly(self, snapshot_id: str) -> None:
        try:
            await self._sessions.delete_snapshot(snapshot_id)
        except SnapshotNotFoundError:
            pass
        except SandboxAPIError as e:
            _log.warning("sandgate: could not delete snapshot %s (delete_snapshot it later): %s", snapshot_id, e)

    async def persist_workspace(self) -> io.IOBase:
        root = self._root()
        if self._uses_snapshots():
            try:
                snap = await self._sessions.create_snapshot(self.sandgate_session_id)
            except SandboxAPIError as e:
                raise WorkspaceArchiveReadError(
                    path=Path(root.as_posix()), context={**_context(e), "reason": "snapshot_failed"}, cause=e,
                    retryable=_retryable(e),
                ) from e
            self._made_snapshot = snap.snapshot_id
            return io.BytesIO(_encode_snapshot_ref(snap.snapshot_id))
        return await self._persist_tar()

    async def _persist_tar(self) -> io.IOBase:
        self._persisted_tar = True
        root = self._root()
        name = f".sandgate-persist-{uuid.uuid4().hex}.tar"
        excludes = [f"--exclude=./{p.as_posix()}" for p in sorted(self._persist_workspace_skip_relpaths())]
        argv = ["tar", "-C", root.as_posix(), f"--exclude=./{name}", *excludes, "-cf", (root / name).as_posix(), "."]
        try:
            res = await self._run(argv)
            if res.exit_code != 0:
                raise WorkspaceArchiveReadError(
                    path=Path(root.as_posix()),
                    context={"backend": "sandgate", "reason": "tar_failed", "exit_code": res.exit_code,
                             "stderr": res.stderr[:4096]},
                )
            rel = self._workspace_rel(root / name)
            if rel is not None:
                raw = await self._sessions.read_file(self.sandgate_session_id, rel)
            else:
                raw = (await self.read(Path((root / name).as_posix()))).read()
            return io.BytesIO(raw)
        except SandboxAPIError as e:
            raise WorkspaceArchiveReadError(
                path=Path(root.as_posix()), context=_context(e), cause=e, retryable=_retryable(e)
            ) from e
        finally:
            try:
                await self._run(["rm", "-f", "--", (root / name).as_posix()], timeout=60)
            except SandboxAPIError:
                pass

    async def hydrate_workspace(self, data: io.IOBase) -> None:
        root = self._root()
        raw = data.read()
        if isinstance(raw, str):
            raw = raw.encode("utf-8")
        if not isinstance(raw, (bytes, bytearray)):
            raise WorkspaceWriteTypeError(path=Path(root.as_posix()), actual_type=type(raw).__name__)
        snapshot_id = _decode_snapshot_ref(bytes(raw))
        if snapshot_id is not None:
            await self._replace_from_snapshot(snapshot_id)
            return
        from agents.sandbox.util.tar_utils import UnsafeTarMemberError, validate_tar_bytes

        try:
            validate_tar_bytes(bytes(raw), allow_external_symlink_targets=False)
        except UnsafeTarMemberError as e:
            raise WorkspaceArchiveWriteError(
                path=Path(root.as_posix()),
                context={"backend": "sandgate", "reason": "unsafe_or_invalid_tar", "member": e.member},
                cause=e,
            ) from e
        name = f".sandgate-hydrate-{uuid.uuid4().hex}.tar"
        target = root / name
        try:
            await self.write(Path(target.as_posix()), io.BytesIO(bytes(raw)))
            res = await self._run(["tar", "-C", root.as_posix(), "-xf", target.as_posix()])
        except SandboxAPIError as e:
            raise WorkspaceArchiveWriteError(
                path=Path(root.as_posix()), context=_context(e), cause=e, retryable=_retryable(e)
            ) from e
        finally:
            try:
                await self._run(["rm", "-f", "--", target.as_posix()], timeout=60)
            except SandboxAPIError:
                pass
        if res.exit_code != 0:
            raise WorkspaceArchiveWriteError(
                path=Path(root.as_posix()),
                context={"backend": "sandgate", "reason": "tar_extract_failed", "exit_code": res.exit_code,
                         "stderr": res.stderr[:4096]},
            )

    async def _restore_snapshot_into_workspace_on_resume(self) -> None:
        # The SDK's own restore clears the workspace, then hydrates it. A
        # reference to a sandgate snapshot is not hydrated into this session
        # but replaces it: read the state's snapshot first, and clear nothing
        # then (the old session stays whole until its replacement exists).
        made_from, self._created_from_snapshot = self._created_from_snapshot, None
        data = await self.state.snapshot.restore(dependencies=self.dependencies)
        try:
            raw = data.read()
        finally:
            try:
                data.close()
            except Exception:
                pass
        if isinstance(raw, str):
            raw = raw.encode("utf-8")
        if not isinstance(raw, (bytes, bytearray)):
            raise WorkspaceWriteTypeError(path=Path(self._root().as_posix()), actual_type=type(raw).__name__)
        ref = _decode_snapshot_ref(bytes(raw))
        if ref is not None:
            if ref != made_from:  # else resume made this session from that very snapshot
                await self._replace_from_snapshot(ref)
            return
        await self._clear_workspace_root_on_resume()
        await self.hydrate_workspace(io.BytesIO(bytes(raw)))

    async def _snapshot_exists(self, snapshot_id: str) -> bool:
        return any(s.snapshot_id == snapshot_id for s in await self._sessions.list_snapshots())

    async def _replace_from_snapshot(self, snapshot_id: str) -> None:
        """Put a session created ``fromSnapshot`` in place of this one.

        The new session is made first. When the old one stands in its way
        (it holds the state's ``name``, or the tenant's last session slot:
        ``name_taken``, ``quota_exceeded``), the old one is deleted first,
        once the snapshot the new one is made from is known to exist (it
        is the copy the old workspace is being replaced with), and the
        create is tried again."""
        root = self._root()
        old: Optional[str] = self.sandgate_session_id
        # The old session's processes end with it: forget them before the id changes.
        await self.pty_terminate_all()
        try:
            try:
                created = await _create_sandgate_session(self._sessions, self.state, from_snapshot=snapshot_id)
            except SandboxAPIError as e:
                if e.code not in ("name_taken", "quota_exceeded") or not await self._snapshot_exists(snapshot_id):
                    raise
                await self._sessions.delete_session(old)  # type: ignore[arg-type]
                old = None
                created = await _create_sandgate_session(self._sessions, self.state, from_snapshot=snapshot_id)
        except SandboxAPIError as e:
            raise WorkspaceArchiveWriteError(
                path=Path(root.as_posix()),
                context={**_context(e), "reason": "snapshot_restore_failed", "snapshot_id": snapshot_id},
                cause=e,
                retryable=_retryable(e),
            ) from e
        self.state.sandgate_session_id = created.session_id
        self.state.sandgate_snapshot_id = snapshot_id
        if old is not None:
            try:
                await self._sessions.delete_session(old)
            except SessionNotFoundError:
                pass
            except SandboxAPIError as e:
                _log.warning("sandgate: could not delete the replaced session %s: %s", old, e)
        try:
            _adopt_root(self.state, await _workspace_root(self._sessions, created.session_id))
        except SandboxAPIError as e:
            raise WorkspaceArchiveWriteError(
                path=Path(root.as_posix()), context=_context(e), cause=e, retryable=_retryable(e)
            ) from e
        # The runtime helpers live outside the workspace (/tmp): install them again.
        self._runtime_helpers_installed = None

    # -- ports ---------------------------------------------------------------

    async def _resolve_exposed_port(self, port: int) -> ExposedPortEndpoint:
        try:
            link = await self._sessions.port_link(self.sandgate_session_id, port, self.state.port_link_ttl_s)
        except SandboxAPIError as e:
            raise ExposedPortUnavailableError(
                port=port, exposed_ports=self.state.exposed_ports, reason="backend_unavailable",
                context=_context(e), cause=e,
            ) from e
        split = urlsplit(link.url)
        if not split.hostname:
            raise ExposedPortUnavailableError(
                port=port, exposed_ports=self.state.exposed_ports, reason="backend_unavailable",
                context={"backend": "sandgate", "url": link.url},
            )
        tls = split.scheme == "https"
        return ExposedPortEndpoint(host=split.hostname, port=split.port or (443 if tls else 80), tls=tls)


class SandgateSandboxClient(BaseSandboxClient[Optional[SandgateSandboxClientOptions]]):
    """The Agents SDK's sandbox client for a sandgate gateway.

    Args:
        sessions: The :class:`~sandbox_sessions_sdk.AsyncSessionsClient` to
            use (not closed by :meth:`close`); None: one is made from
            *api_url*, *bearer_token*, *timeout* and *verify_ssl*, which
            default to ``$SANDBOX_API_URL`` and ``$SANDBOX_API_TOKEN``.
        instrumentation, dependencies: as for the SDK's other clients.

    ``options`` may be left out of ``SandboxRunConfig``: the defaults of
    :class:`SandgateSandboxClientOptions` apply (the gateway's default image).
    """

    backend_id = "sandgate"
    supports_default_options = True

    def __init__(
        self,
        sessions: Optional[AsyncSessionsClient] = None,
        *,
        api_url: Optional[str] = None,
        bearer_token: Optional[str] = None,
        timeout: float = 30,
        verify_ssl: Any = True,
        instrumentation: Optional[Instrumentation] = None,
        dependencies: Optional[Dependencies] = None,
    ) -> None:
        if sessions is None:
            sessions = AsyncSessionsClient(
                api_url=api_url, bearer_token=bearer_token, timeout=timeout, verify_ssl=verify_ssl
            )
            self._owns = True
        else:
            if api_url is not None or bearer_token is not None:
                raise ValueError("give sessions or api_url/bearer_token, not both")
            self._owns = False
        self.sessions: AsyncSessionsClient = sessions
        self._instrumentation = instrumentation if instrumentation is not None else Instrumentation()
        self._dependencies = dependencies

    def __repr__(self) -> str:
        return f"SandgateSandboxClient(api_url={self.sessions.api_url!r})"

    async def close(self) -> None:
        """Close the REST client this client made (not one it was given)."""
        if self._owns:
            await self.sessions.close()

    async def __aenter__(self) -> "SandgateSandboxClient":
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def create(
        self,
        *,
        snapshot: Union[SnapshotSpec, SnapshotBase, None] = None,
        manifest: Optional[Manifest] = None,
        options: Optional[SandgateSandboxClientOptions] = None,
    ) -> SandboxSession:
        if options is None:
            options = SandgateSandboxClientOptions()
        elif not isinstance(options, SandgateSandboxClientOptions):
            options = SandgateSandboxClientOptions.model_validate(
                options if isinstance(options, dict) else options.model_dump()
            )
        manifest = manifest if manifest is not None else Manifest()
        self._validate_manifest_for_create(manifest)
        session_id = uuid.uuid4()
        state = SandgateSandboxSessionState(
            session_id=session_id,
            manifest=manifest,
            snapshot=resolve_snapshot(snapshot, str(session_id)),
            sandgate_session_id="pending",
            api_url=self.sessions.api_url,
            **_state_fields(options),
        )
        created = await self._create(state)
        state.sandgate_session_id = created.session_id
        await self._adopt_workspace_root(state)
        inner = SandgateSandboxSession.from_state(state, sessions=self.sessions)
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    async def _create(self, state: SandgateSandboxSessionState, from_snapshot: Optional[str] = None) -> Session:
        try:
            return await _create_sandgate_session(self.sessions, state, from_snapshot=from_snapshot)
        except SandboxAPIError as e:
            raise WorkspaceStartError(
                path=Path(str(state.manifest.root)), context=_context(e), cause=e,
                message=f"failed to start session: sandgate refused to create it: {e}", retryable=_retryable(e),
            ) from e

    async def _adopt_workspace_root(self, state: SandgateSandboxSessionState) -> None:
        """Learn where the session's workspace is (the directory its commands
        start in) and make it the manifest's root when that is the default."""
        try:
            root = await _workspace_root(self.sessions, state.sandgate_session_id)
        except SandboxAPIError as e:
            await self._delete_quietly(state.sandgate_session_id)
            raise WorkspaceStartError(
                path=Path(str(state.manifest.root)), context=_context(e), cause=e, retryable=_retryable(e),
            ) from e
        _adopt_root(state, root)

    async def _delete_quietly(self, sid: str) -> None:
        try:
            await self.sessions.delete_session(sid)
        except SessionNotFoundError:
            pass
        except SandboxAPIError as e:
            _log.warning("sandgate: could not delete session %s (it lives on until its ttl): %s", sid, e)

    async def delete(self, session: SandboxSession) -> SandboxSession:
        inner = session._inner
        if not isinstance(inner, SandgateSandboxSession):
            raise TypeError("SandgateSandboxClient.delete expects a SandgateSandboxSession")
        try:
            await inner.shutdown()
        except Exception as e:
            _log.warning("sandgate: shutting down session %s failed: %s", inner.sandgate_session_id, e)
        return session

    async def resume(self, state: SandboxSessionState) -> SandboxSession:
        if not isinstance(state, SandgateSandboxSessionState):
            raise TypeError("SandgateSandboxClient.resume expects a SandgateSandboxSessionState")
        state.assert_path_grants_rebound()
        if state.api_url and state.api_url.rstrip("/") != self.sessions.api_url.rstrip("/"):
            import warnings

            warnings.warn(
                f"resuming a sandgate session state of another gateway ({state.api_url}) on "
                f"{self.sessions.api_url}: its session and snapshot are unknown here, so a new, "
                "empty session is made unless this is the same gateway under another URL",
                RuntimeWarning,
                stacklevel=2,
            )
        reconnected = False
        try:
            s = await self.sessions.get_session(state.sandgate_session_id)
            reconnected = s.status in ("running", "stopped", "creating", "starting")
            if not reconnected:
                await self._delete_quietly(state.sandgate_session_id)  # failed: it holds nothing to keep
        except SessionNotFoundError:
            reconnected = False
        except SandboxAPIError as e:
            raise WorkspaceStartError(
                path=Path(str(state.manifest.root)), context=_context(e), cause=e,
                message=f"failed to resume session {state.sandgate_session_id}: {e}", retryable=_retryable(e),
            ) from e
        from_snapshot: Optional[str] = None
        if not reconnected:
            # The SDK will restore the workspace from the state's snapshot:
            # when that is a sandgate snapshot, start the new session from it
            # at once rather than an empty one that the restore replaces.
            if state.sandgate_snapshot_id and state.workspace is None and state.workspace_persistence == "snapshot":
                from_snapshot = state.sandgate_snapshot_id
            try:
                created = await self._create(state, from_snapshot=from_snapshot)
            except WorkspaceStartError as e:
                if from_snapshot is None or not isinstance(e.cause, SnapshotNotFoundError):
                    raise
                from_snapshot = None
                created = await self._create(state)
            state.sandgate_session_id = created.session_id
            state.workspace_root_ready = False
            await self._adopt_workspace_root(state)
        inner = SandgateSandboxSession.from_state(state, sessions=self.sessions)
        inner._created_from_snapshot = from_snapshot
        inner._set_start_state_preserved(reconnected, system=reconnected)
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    def deserialize_session_state(self, payload: Dict[str, object]) -> SandboxSessionState:
        return self._deserialize_session_state_payload(payload, SandgateSandboxSessionState)

    @staticmethod
    def sandgate_session_id(session: Union[BaseSandboxSession, SandboxSessionState]) -> str:
        """The sandgate session id (``sbx-...``) behind *session* (what
        :meth:`create` or :meth:`resume` returned, or its state)."""
        state = session if isinstance(session, SandboxSessionState) else session.state
        if not isinstance(state, SandgateSandboxSessionState):
            raise TypeError("not a sandgate sandbox session")
        return state.sandgate_session_id

    def ssh_command(self, session: Union[BaseSandboxSession, SandboxSessionState]) -> str:
        """The command line a person runs to join *session*'s sandbox over
        SSH: ``sandgate ssh --api-url URL sbx-...`` (OpenSSH through
        ``sandgate proxy``, the host key pinned; the token from
        ``$SANDBOX_API_TOKEN``). See :attr:`SandgateSandboxSession.ssh_command`."""
        return shlex.join(["sandgate", "ssh", "--api-url", self.sessions.api_url, self.sandgate_session_id(session)])
