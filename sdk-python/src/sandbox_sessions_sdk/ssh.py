"""SessionSSHClient: Paramiko SSH and SFTP into a session, through the CONNECT tunnel."""

from __future__ import annotations

import base64
import codecs
import hashlib
import os
import select
import signal as _signal
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Union

import paramiko
from paramiko.auth_strategy import AuthStrategy, NoneAuth

from . import _paramiko_compat, _sftp
from ._common import ClosesOnExit, VerifySSL, check_int, check_timeout, resolve_settings
from ._output import DEFAULT_MAX_OUTPUT_BYTES, OutputBuffer
from .client import SessionsClient
from .errors import (
    CommandTimeoutError,
    HostKeyMismatchError,
    SandboxAPIError,
    SandboxConnectionError,
    SandboxOperationError,
)
from .models import CommandResult
from .tunnel import DEFAULT_CONNECT_PATH, TRANSPORTS, HTTPConnectTunnel

__all__ = ["SessionSSHClient", "CommandResult", "DEFAULT_MAX_OUTPUT_BYTES"]

PathLike = Union[str, "os.PathLike[str]"]
OutputCallback = Callable[[str], Any]

#: SSH channel window: how much the server may send before we acknowledge.
#: Large windows keep bulk output and SFTP downloads streaming on fast links.
WINDOW_SIZE = 16 * 1024 * 1024
#: Largest SSH packet payload we accept (32 KiB is what every server supports
#: and what SFTP's 32 KiB reads and writes fit in).
MAX_PACKET_SIZE = 32 * 1024
#: SFTP read requests kept in flight by download_file.
_PREFETCH_REQUESTS = 64
_RECV_CHUNK = 256 * 1024
_DRAIN_ROUNDS = 16
# How long a killed command's channel may take to close on the gateway's side.
_KILL_WAIT = 2.0


# --------------------------------------------------------------------------
# Paramiko plumbing
# --------------------------------------------------------------------------


def _transport_factory(sock: Any, **kwargs: Any) -> paramiko.Transport:
    cls = _paramiko_compat.transport_class()  # records exit-signal
    t = cls(sock, default_window_size=WINDOW_SIZE, default_max_packet_size=MAX_PACKET_SIZE, **kwargs)
    opts = t.get_security_options()
    # AES-GCM needs one pass over the data where CTR+HMAC needs two:
    # prefer it when the server offers it (sandgate does).
    gcm = [c for c in ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com") if c in opts.ciphers]
    opts.ciphers = tuple(gcm + [c for c in opts.ciphers if c not in gcm])
    return t


class _NoneAuthStrategy(AuthStrategy):
    """SSH ``none`` authentication: the CONNECT tunnel already carried the bearer token."""

    def __init__(self, username: str) -> None:
        super().__init__(ssh_config=paramiko.SSHConfig())
        self.username = username

    def get_sources(self) -> Iterator[NoneAuth]:
        yield NoneAuth(self.username)


def parse_host_key(line: str) -> paramiko.PKey:
    """Parse an authorized_keys / known_hosts style line into a Paramiko key.

    Accepts ``TYPE BASE64 [comment]`` and ``HOSTPATTERN TYPE BASE64``.
    Raises ValueError when the line is not a key Paramiko understands.
    """
    fields = line.split()
    for i in range(min(2, max(len(fields) - 1, 0))):
        key_type, data = fields[i], fields[i + 1]
        try:
            blob = base64.b64decode(data, validate=True)
            return paramiko.PKey.from_type_string(key_type, blob)
        except Exception:
            continue
    raise ValueError(f"not a host key: {line[:60]!r}")


def _key_line(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.get_base64()}"


def _fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH-style SHA256 fingerprint."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")


def _exit_code_for_signal(name: str) -> int:
    try:
        return 128 + int(_signal.Signals["SIG" + name.upper().replace("SIG", "", 1)])
    except (KeyError, ValueError):
        return 255


class _Stream:
    """One output stream of a command: a bounded buffer, and the callback that sees it all."""

    def __init__(self, max_bytes: Optional[int], callback: Optional[OutputCallback]) -> None:
        self.buf = OutputBuffer(max_bytes)
        self._callback = callback
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> None:
        self.buf.feed(data)
        if self._callback is not None:
            text = self._decoder.decode(data)
            if text:
                self._callback(text)

    def flush(self) -> None:
        """At EOF: hand the callback what the decoder still holds (an incomplete character, as U+FFFD)."""
        if self._callback is not None:
            text = self._decoder.decode(b"", final=True)
            if text:
                self._callback(text)


# --------------------------------------------------------------------------
# The client
# --------------------------------------------------------------------------


class SessionSSHClient(ClosesOnExit):
    """SSH and SFTP into one session, through the gateway's CONNECT tunnel.

    Use it as a context manager (``__enter__`` connects)::

        with SessionSSHClient(api_url=URL, bearer_token=TOKEN,
                              session_id=session.session_id, username="sandbox") as ssh:
            print(ssh.run_command("uname -a")["stdout"])
            ssh.upload_file("data.csv", "data.csv")

    Authentication: with ``password`` and/or ``pkey`` Paramiko tries those
    (key first); with neither, SSH ``none`` authentication is used, which
    the gateway grants because the tunnel already carried the bearer token.

    Host keys: by default the client asks the REST API for the session
    (``GET /v1/sessions/{id}``) and pins the ``ssh.hostKeys`` it returns: a
    server presenting any other key fails with :class:`HostKeyMismatchError`.
    Only if the API returns no host keys does it fall back to Paramiko's
    ``AutoAddPolicy``. Pass a Paramiko ``MissingHostKeyPolicy`` as
    ``host_key_policy`` to skip the lookup and decide yourself
    (e.g. ``paramiko.RejectPolicy()``, ``paramiko.AutoAddPolicy()``).

    Args:
        api_url: Gateway URL; defaults to ``$SANDBOX_API_URL``.
        bearer_token: API key or JWT; defaults to ``$SANDBOX_API_TOKEN``.
        session_id: The session to enter.
        username: SSH username; any name is mapped to the sandbox user.
        password: The session's SSH password (from the create response).
        pkey: A Paramiko private key whose public half was given as
            ``ssh_public_key`` at creation.
        timeout: Seconds for each step of connecting (REST lookup, tunnel,
            SSH handshake, authentication) and for opening channels.
        verify_ssl: ``True``, ``False`` or a CA bundle path, like requests.
        connect_path_template: CONNECT path template, see HTTPConnectTunnel.
        host_key_policy: A Paramiko MissingHostKeyPolicy, or None to pin the
            keys the REST API returns.
        get_pty: Run commands on a pseudo-terminal (stderr then arrives
            merged into stdout, as with ``ssh -t``).
        transport: ``"connect"`` (HTTP CONNECT, the default),
            ``"websocket"`` (the same stream in a WebSocket, for front ends
            that do not pass CONNECT), or ``"auto"`` (CONNECT, then the
            WebSocket when something in the way refuses CONNECT); see
            HTTPConnectTunnel.
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
        self.api_url, self._token = resolve_settings(api_url, bearer_token)
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, not {transport!r}")
        if not isinstance(session_id, str) or not session_id:
            raise ValueError("session_id must be a non-empty string")
        if not isinstance(username, str) or not username:
            raise ValueError("username must be a non-empty string")
        if pkey is not None and not isinstance(pkey, paramiko.PKey):
            raise TypeError("pkey must be a paramiko.PKey (e.g. paramiko.Ed25519Key.from_private_key_file(path))")
        if host_key_policy is not None and not isinstance(host_key_policy, paramiko.MissingHostKeyPolicy):
            if isinstance(host_key_policy, type) and issubclass(host_key_policy, paramiko.MissingHostKeyPolicy):
                host_key_policy = host_key_policy()
            else:
                raise TypeError("host_key_policy must be a paramiko.MissingHostKeyPolicy")
        self.session_id: str = session_id
        self.username: str = username
        self._password = password
        self._pkey = pkey
        self.timeout: Optional[float] = check_timeout("timeout", timeout)
        self.verify_ssl: VerifySSL = verify_ssl
        self.connect_path_template: str = connect_path_template
        self.host_key_policy: Optional[paramiko.MissingHostKeyPolicy] = host_key_policy
        self.get_pty: bool = bool(get_pty)
        #: "connect", "websocket" or "auto" (``transport`` is Paramiko's Transport).
        self.tunnel_transport: str = transport

        self._tunnel: Optional[HTTPConnectTunnel] = None
        self._client: Optional[paramiko.SSHClient] = None
        self._sftp: Optional[paramiko.SFTPClient] = None
        #: The host keys pinned for the last connect() (authorized_keys lines).
        self.pinned_host_keys: List[str] = []

    def __repr__(self) -> str:
        state = "connected" if self._client is not None else "not connected"
        return f"SessionSSHClient(session_id={self.session_id!r}, username={self.username!r}, {state})"

    # -- context manager -------------------------------------------------

    def __enter__(self) -> "SessionSSHClient":
        self.connect()
        return self

    # -- connecting --------------------------------------------------------

    @property
    def connected(self) -> bool:
        """True while the SSH transport is up."""
        t = self._client.get_transport() if self._client is not None else None
        return t is not None and t.is_active()

    @property
    def transport(self) -> paramiko.Transport:
        """The underlying Paramiko Transport (for channels this class does not offer)."""
        return self._require_transport()

    def connect(self) -> "SessionSSHClient":
        """Open the tunnel, do the SSH handshake, check the host key and authenticate.

        Does nothing when already connected. Returns self.

        Raises:
            SessionNotFoundError, UnauthorizedError, RateLimitError: from the
                REST lookup or the CONNECT answer.
            HostKeyMismatchError: the server's host key is not the pinned one.
            SandboxConnectionError: network, TLS, other CONNECT answers, SSH handshake.
            SandboxOperationError: SSH authentication was refused.
            UnsupportedParamikoError: the installed Paramiko is outside the
                supported range; raised before anything is opened.
        """
        if self._client is not None:
            if self.connected:
                return self
            self.close()
        _paramiko_compat.check()

        pinned: List[paramiko.PKey] = []
        policy = self.host_key_policy
        if policy is None:
            with SessionsClient(
                self.api_url, self._token, timeout=self.timeout or 30, verify_ssl=self.verify_ssl
            ) as api:
                session = api.get_session(self.session_id)
            for line in session.host_keys:
                try:
                    pinned.append(parse_host_key(line))
                except ValueError:
                    continue  # a key type this Paramiko does not know
            if not pinned:
                policy = paramiko.AutoAddPolicy()
        self.pinned_host_keys = [_key_line(k) for k in pinned]

        tunnel = HTTPConnectTunnel(
            self.api_url,
            self._token,
            self.session_id,
            connect_path_template=self.connect_path_template,
            timeout=self.timeout or 20,
            verify_ssl=self.verify_ssl,
            transport=self.tunnel_transport,
        )
        sock = tunnel.open()
        client = paramiko.SSHClient()
        # The name the keys are pinned under; nothing is resolved with it.
        host_name = self.session_id
        if pinned:
            for key in pinned:
                client.get_host_keys().add(host_name, key.get_name(), key)
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
        else:
            assert policy is not None
            client.set_missing_host_key_policy(policy)

        kwargs: Dict[str, Any] = dict(
            hostname=host_name,
            port=22,
            username=self.username,
            sock=sock,
            timeout=self.timeout,
            banner_timeout=self.timeout,
            auth_timeout=self.timeout,
            channel_timeout=self.timeout,
            allow_agent=False,
            look_for_keys=False,
            transport_factory=_transport_factory,
        )
        if self._password is None and self._pkey is None:
            kwargs["auth_strategy"] = _NoneAuthStrategy(self.username)
        else:
            kwargs["password"] = self._password
            kwargs["pkey"] = self._pkey
        try:
            client.connect(**kwargs)
        except BaseException as e:
            err = self._connect_error(e, client)
            client.close()
            tunnel.close()
            if err is e:
                raise
            raise err from e
        self._client, self._tunnel = client, tunnel
        return self

    def _connect_error(self, e: BaseException, client: paramiko.SSHClient) -> BaseException:
        if isinstance(e, SandboxAPIError) or not isinstance(e, Exception):
            return e
        if isinstance(e, paramiko.BadHostKeyException):
            presented, expected = _key_line(e.key), self.pinned_host_keys
            return HostKeyMismatchError(
                f"SSH host key mismatch for session {self.session_id}: server presented "
                f"{e.key.get_name()} {_fingerprint(e.key)}, which is not one of the "
                f"{len(expected)} pinned key(s)",
                presented=presented,
                expected=expected,
            )
        if isinstance(e, paramiko.AuthenticationException):
            tried = [m for m, v in (("publickey", self._pkey), ("password", self._password)) if v is not None]
            how = "/".join(tried) or "none"
            detail = " ".join(str(e).split()) or type(e).__name__
            return SandboxOperationError(f"SSH authentication ({how}) refused for session {self.session_id}: {detail}")
        if isinstance(e, paramiko.SSHException) and "not found in known_hosts" in str(e):
            t = client.get_transport()
            key = t.get_remote_server_key() if t is not None else None
            return HostKeyMismatchError(
                f"SSH host key of session {self.session_id} rejected by the host key policy: {e}",
                presented=_key_line(key) if key is not None else "",
                expected=[],
            )
        return SandboxConnectionError(f"SSH handshake with session {self.session_id} failed: {e or type(e).__name__}")

    def close(self) -> None:
        """Close SFTP, then SSH, then the tunnel. Safe to call twice."""
        sftp, self._sftp = self._sftp, None
        client, self._client = self._client, None
        tunnel, self._tunnel = self._tunnel, None
        if sftp is not None:
            try:
                sftp.close()
            except Exception:
                pass
        if client is not None:
            try:
                client.close()
            except Exception:
                pass
        if tunnel is not None:
            tunnel.close()

    def _require_transport(self) -> paramiko.Transport:
        t = self._client.get_transport() if self._client is not None else None
        if t is None:
            raise SandboxOperationError("not connected: call connect() first (or use the client as a context manager)")
        if not t.is_active():
            raise SandboxOperationError(f"the SSH connection to session {self.session_id} is closed")
        return t

    # -- commands ----------------------------------------------------------

    def run_command(
        self,
        command: str,
        timeout: Optional[float] = 60,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        max_output_bytes: Optional[int] = DEFAULT_MAX_OUTPUT_BYTES,
    ) -> CommandResult:
        """Run *command* in the sandbox (through its shell) and wait for it.

        Its stdin is closed at once (the command reads EOF). Output is
        collected and, when callbacks are given, also handed to them as it
        arrives, as decoded text chunks, from this thread.

        Args:
            command: A shell command line.
            timeout: Seconds the command may run; None waits forever. When it
                passes, the command is sent SIGKILL (SSH ``signal`` request)
                and its channel is closed, which makes the gateway kill its
                whole process group, and CommandTimeoutError is raised.
            on_stdout: Called with each chunk of standard output.
            on_stderr: Called with each chunk of standard error.
            max_output_bytes: How much of each stream (stdout, stderr) the
                result keeps, in bytes; default 10 MiB, None keeps all.
                Of a longer stream the first ``max_output_bytes // 2`` bytes
                and the last ``max_output_bytes - max_output_bytes // 2``
                are kept, joined by the line ``"\n[... N bytes dropped ...]\n"``
                (N counts every byte left out), and ``truncated`` is set.
                A UTF-8 character cut at either edge is dropped whole. The
                middle is discarded as it arrives, so memory stays bounded.
                The callbacks still get every byte.

        Returns:
            A :class:`CommandResult` (``stdout``, ``stderr``, ``exit_code``,
            ``exit_signal``, ``truncated``; ``res["stdout"]`` works too). A
            non-zero exit code is not an error.

        Raises:
            ValueError, TypeError: max_output_bytes is not None or an int > 0.
            CommandTimeoutError: the timeout passed (carries partial output).
            SandboxOperationError: not connected, the channel or exec was
                refused, or the connection broke while the command ran.
            Any exception a callback raises: the command is killed first.
        """
        return self._run_command(command, timeout, on_stdout, on_stderr, max_output_bytes, None)

    def _run_command(
        self,
        command: str,
        timeout: Optional[float],
        on_stdout: Optional[OutputCallback],
        on_stderr: Optional[OutputCallback],
        max_output_bytes: Optional[int],
        cancel: Optional[threading.Event],
    ) -> CommandResult:
        """run_command; when *cancel* is set (from another thread) the command
        is killed as on a timeout and :class:`CommandCancelled` is raised."""
        if not isinstance(command, str):
            raise TypeError("command must be a string")
        limit = check_timeout("timeout", timeout)
        if max_output_bytes is not None:
            check_int("max_output_bytes", max_output_bytes, 1)
        t = self._require_transport()
        started = time.monotonic()
        deadline = None if limit is None else started + limit
        try:
            chan = t.open_session(window_size=WINDOW_SIZE, max_packet_size=MAX_PACKET_SIZE, timeout=self.timeout)
        except Exception as e:
            raise SandboxOperationError(f"cannot open an SSH channel in session {self.session_id}: {e}") from e
        try:
            try:
                if self.get_pty:
                    chan.get_pty()
                chan.exec_command(command)
                _paramiko_compat.shutdown_write(chan)
            except Exception as e:
                raise SandboxOperationError(f"the server refused to run the command: {e}") from e
            out = _Stream(max_output_bytes, on_stdout)
            err = _Stream(max_output_bytes, on_stderr)
            return self._collect(chan, t, command, limit, deadline, out, err, cancel)
        finally:
            chan.close()

    def _collect(
        self,
        chan: paramiko.Channel,
        t: paramiko.Transport,
        command: str,
        limit: Optional[float],
        deadline: Optional[float],
        out: "_Stream",
        err: "_Stream",
        cancel: Optional[threading.Event] = None,
    ) -> CommandResult:
        def drain(everything: bool = False) -> None:
            # Bounded, so that a command that never stops writing still
            # lets the loop below check the deadline; once EOF is seen
            # (everything), until the buffers are empty: up to a window
            # (16 MiB) may be waiting there, more than one bounded drain
            # takes from a reader slower than the command.
            rounds = 0
            while everything or rounds < _DRAIN_ROUNDS:
                rounds += 1
                moved = False
                if chan.recv_ready():
                    out.feed(_paramiko_compat.recv(chan, _RECV_CHUNK))
                    moved = True
                if chan.recv_stderr_ready():
                    err.feed(_paramiko_compat.recv(chan, _RECV_CHUNK, stderr=True))
                    moved = True
                if not moved:
                    return

        def kill() -> None:
            # SIGKILL, then wait (briefly, draining) for the gateway to close
            # the channel before closing it here: Paramiko closes the
            # channel's pipe (fileno) on close while its transport thread may
            # still be signalling that pipe about data in flight, and an
            # EBADF there ends the whole connection. Closing the channel
            # also makes the gateway kill the command's tree.
            try:
                _paramiko_compat.send_signal(chan, "KILL")
            except Exception:
                pass
            end = time.monotonic() + _KILL_WAIT
            while not chan.closed and time.monotonic() < end:
                select.select([fd], [], [], 0.05)
                drain()
            chan.close()

        def timed_out() -> CommandTimeoutError:
            kill()
            return CommandTimeoutError(
                f"command did not finish within {limit:g}s and was killed: {command[:200]!r}",
                command=command,
                timeout=float(limit or 0),
                stdout=out.buf.text(),
                stderr=err.buf.text(),
                truncated=out.buf.truncated or err.buf.truncated,
            )

        def next_wait() -> float:
            # Half a second at most between checks (a tenth when it can be
            # cancelled); past the deadline, kill.
            if cancel is not None and cancel.is_set():
                raise CommandCancelled(f"command cancelled and killed: {command[:200]!r}")
            step = 0.5 if cancel is None else 0.1
            if deadline is None:
                return step
            left = deadline - time.monotonic()
            if left <= 0:
                raise timed_out()
            return min(step, left)

        fd = chan.fileno()  # readable whenever data, EOF or close arrived
        try:
            while True:
                # All data precedes EOF, so once EOF is seen one more drain
                # gets everything.
                finished = chan.eof_received or chan.closed
                drain(everything=finished)
                if finished:
                    break
                select.select([fd], [], [], next_wait())
            out.flush()
            err.flush()
            # exit-status / exit-signal come before or right after EOF.
            while not chan.status_event.is_set():
                chan.status_event.wait(next_wait())
        except BaseException:
            if not chan.closed:
                kill()
            raise

        stdout, stderr = out.buf.text(), err.buf.text()
        truncated = out.buf.truncated or err.buf.truncated
        sig = _paramiko_compat.exit_signal(chan)
        if sig:
            return CommandResult(stdout, stderr, _exit_code_for_signal(sig), sig, truncated)
        code = chan.exit_status
        if code == -1 and not t.is_active():
            raise SandboxOperationError(
                f"the SSH connection to session {self.session_id} broke while the command ran "
                f"(was the session deleted?)"
            )
        return CommandResult(stdout, stderr, code, None, truncated)

    # -- SFTP --------------------------------------------------------------

    def open_sftp(self) -> paramiko.SFTPClient:
        """Return the connection's Paramiko SFTPClient, opening it on first use.

        Paths are relative to the sandbox's workspace, the same directory an
        exec starts in. The client is closed by :meth:`close`.
        """
        t = self._require_transport()
        if self._sftp is not None and not self._sftp.sock.closed:
            return self._sftp
        try:
            sftp = paramiko.SFTPClient.from_transport(t, window_size=WINDOW_SIZE, max_packet_size=MAX_PACKET_SIZE)
        except Exception as e:
            raise SandboxOperationError(f"cannot start SFTP in session {self.session_id}: {e}") from e
        if sftp is None:
            raise SandboxOperationError(f"cannot start SFTP in session {self.session_id}")
        self._sftp = sftp
        return sftp

    def upload_file(self, local_path: PathLike, remote_path: str) -> None:
        """Upload the local file *local_path* to *remote_path* in the sandbox.

        Writes are pipelined, and the remote size is checked afterwards.

        Raises:
            SandboxOperationError: the local file cannot be read, or the
                remote one cannot be written (the original exception is chained).
        """
        local = os.fspath(local_path)
        sftp = self.open_sftp()
        try:
            sftp.put(local, remote_path, confirm=True)
        except Exception as e:
            raise SandboxOperationError(f"upload {local!r} -> {remote_path!r} failed: {_describe(e)}") from e

    def download_file(self, remote_path: str, local_path: PathLike) -> None:
        """Download *remote_path* from the sandbox to the local file *local_path*.

        Reads are pipelined (64 requests in flight, of 255 KiB when the
        server's limits@openssh.com allows, else 32 KiB), and the size is
        checked. If the download fails, a local file it created is removed.

        Raises:
            SandboxOperationError: the remote file cannot be read, or the
                local one cannot be written (the original exception is chained).
        """
        local = os.fspath(local_path)
        sftp = self.open_sftp()
        existed = os.path.exists(local)
        try:
            with open(local, "wb") as f:
                _sftp.download(sftp, remote_path, f, in_flight=_PREFETCH_REQUESTS)
        except Exception as e:
            if not existed:
                try:
                    os.unlink(local)
                except OSError:
                    pass
            raise SandboxOperationError(f"download {remote_path!r} -> {local!r} failed: {_describe(e)}") from e


class CommandCancelled(SandboxOperationError):
    """Internal: a command cancelled from another thread (the async client's
    task was cancelled); the command was killed. Never reaches the caller of
    the async client, which sees asyncio.CancelledError."""


def _describe(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror} ({type(e).__name__})"
    return str(e) or type(e).__name__
