"""HTTPConnectTunnel: a raw byte stream to a session's SSH server via HTTP CONNECT."""

from __future__ import annotations

import socket
import ssl
import time
from typing import Dict, Mapping, Optional, Union
from urllib.parse import quote, urlsplit

from ._common import (
    CaseInsensitiveHeaders,
    ClosesOnExit,
    VerifySSL,
    check_timeout,
    error_for_status,
    resolve_settings,
    ssl_context,
)
from ._tlsstream import TLSStream
from ._websocket import WebSocketStream, expected_accept, handshake_key
from ._version import __version__
from .errors import SandboxAPIError, SandboxConnectionError

__all__ = ["HTTPConnectTunnel", "TLSStream", "TunnelSocket", "WebSocketStream", "TRANSPORTS"]

#: The transports a tunnel may use: ``connect`` (HTTP CONNECT),
#: ``websocket`` (``GET /v1/sessions/{id}/ssh``, for front ends that do
#: not pass CONNECT), or ``auto`` (CONNECT, then the WebSocket when
#: something in the way refuses CONNECT).
TRANSPORTS = ("connect", "websocket", "auto")

DEFAULT_CONNECT_PATH = "/sessions/{sessionId}"

#: What :meth:`HTTPConnectTunnel.open` returns: a socket for http, a
#: TLSStream for https, a WebSocketStream (over either) for the websocket
#: transport.
TunnelSocket = Union[socket.socket, TLSStream, WebSocketStream]

# Bounds on the CONNECT answer we are willing to read.
_MAX_HEAD = 64 * 1024
_MAX_BODY = 64 * 1024


class HTTPConnectTunnel(ClosesOnExit):
    """Opens ``CONNECT <path> HTTP/1.1`` to the gateway and returns the socket.

    After ``HTTP/1.1 200`` the socket carries the session's raw SSH stream.
    The answer's head is read one byte at a time, so not a single byte the
    server sends after the blank line (its SSH version line) is consumed:
    the socket returned by :meth:`open` starts exactly at the SSH stream.

    Args:
        api_url: The gateway URL (``http://`` or ``https://``). Defaults to
            ``$SANDBOX_API_URL``. Its path is joined with the template:
            ``https://gw/v1`` gives ``CONNECT /v1/sessions/<id>``,
            ``http://gw:8080`` gives ``CONNECT /sessions/<id>``.
        bearer_token: Sent as both ``Proxy-Authorization: Bearer`` and
            ``Authorization: Bearer``. Defaults to ``$SANDBOX_API_TOKEN``.
        session_id: The session to connect to.
        connect_path_template: Path template, ``{sessionId}`` is replaced by
            the URL-escaped session id.
        timeout: Seconds allowed for TCP connect, TLS handshake and the
            CONNECT answer together. The returned socket is blocking.
        verify_ssl: ``True``, ``False`` or a CA bundle path, like requests.
        extra_headers: More headers to send with the CONNECT request.
        transport: ``"connect"`` (the default) or ``"websocket"``: the same
            SSH stream in a WebSocket, ``GET /v1/sessions/<id>/ssh`` under
            the URL's path (``/v1`` added unless it ends so), for front ends
            that do not pass CONNECT. ``connect_path_template`` is then
            not used. ``"auto"`` sends CONNECT and, when something other
            than the gateway refuses it (an answer of 400, 405 or 501, one
            without the gateway's error envelope, or no HTTP answer at
            all), opens the WebSocket instead, on a new connection and
            within the same *timeout*. The gateway's own refusals (401,
            404, 429...) are final. :attr:`opened_transport` says which
            one was used.

    Errors raised by :meth:`open`:
        UnauthorizedError (401), SessionNotFoundError (404), RateLimitError
        (429), and SandboxConnectionError for everything else (network, TLS,
        timeouts, any other non-200 answer); every one of them carries the
        answer's ``status_line`` and ``status_code`` when there was an answer.
        A CONNECT refused because too many tunnels are in SSH authentication
        (``429 too_many_ssh_startups``: the caller's own budget; ``503
        ssh_startups_full``: the gateway's) is retried after its
        ``Retry-After`` for as long as *timeout* allows.
    """

    def __init__(
        self,
        api_url: Optional[str] = None,
        bearer_token: Optional[str] = None,
        session_id: Optional[str] = None,
        connect_path_template: str = DEFAULT_CONNECT_PATH,
        timeout: float = 10,
        verify_ssl: VerifySSL = True,
        extra_headers: Optional[Mapping[str, str]] = None,
        transport: str = "connect",
    ) -> None:
        self.api_url, self._token = resolve_settings(api_url, bearer_token)
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, not {transport!r}")
        self.transport: str = transport
        if not isinstance(session_id, str) or not session_id:
            raise ValueError("session_id must be a non-empty string")
        if "{sessionId}" not in connect_path_template:
            raise ValueError("connect_path_template must contain {sessionId}")
        self.session_id: str = session_id
        self.timeout: Optional[float] = check_timeout("timeout", timeout)
        self.verify_ssl: VerifySSL = verify_ssl
        self.extra_headers: Dict[str, str] = dict(extra_headers or {})
        for k, v in self.extra_headers.items():
            if any(c in str(k) + str(v) for c in "\r\n\0"):
                raise ValueError("extra_headers must not contain CR, LF or NUL")
        parts = urlsplit(self.api_url)
        self._tls = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port or (443 if self._tls else 80)
        self._netloc = parts.netloc.rsplit("@", 1)[-1]
        template_path = connect_path_template.replace("{sessionId}", quote(session_id, safe=""))
        self._connect_path = parts.path.rstrip("/") + "/" + template_path.lstrip("/")
        base = parts.path.rstrip("/")
        if not base.endswith("/v1"):
            base += "/v1"
        self._ws_path = base + "/sessions/" + quote(session_id, safe="") + "/ssh"
        #: The request path: the CONNECT path, or the WebSocket's (with
        #: ``auto``, the WebSocket's once open() has fallen back to it).
        self.path: str = self._ws_path if transport == "websocket" else self._connect_path
        #: ``"connect"`` or ``"websocket"``: the transport the last
        #: open() used (None before).
        self.opened_transport: Optional[str] = None
        self._sock: Optional[TunnelSocket] = None

    def __repr__(self) -> str:
        return f"HTTPConnectTunnel(api_url={self.api_url!r}, session_id={self.session_id!r})"

    @property
    def sock(self) -> Optional[TunnelSocket]:
        """The open socket, or None before :meth:`open` and after :meth:`close`."""
        return self._sock

    def __enter__(self) -> TunnelSocket:
        return self.open()

    def open(self) -> TunnelSocket:
        """Connect, send CONNECT and return the socket once the gateway answers 200.

        The socket is in blocking mode and positioned at the first byte after
        the answer's head. For https it is a :class:`TLSStream`: socket-like,
        and safe to read in one thread while others write, which an
        ``ssl.SSLSocket`` is not (SSH libraries such as Paramiko do exactly
        that).
        """
        if self._sock is not None:
            raise SandboxConnectionError("tunnel is already open")
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        mode = "websocket" if self.transport == "websocket" else "connect"
        self.path = self._ws_path if mode == "websocket" else self._connect_path
        while True:
            sock = self._dial(deadline)
            try:
                if mode == "websocket":
                    self._ws_handshake(sock, deadline)
                else:
                    self._handshake(sock, deadline)
                break
            except SandboxAPIError as e:
                _close_quietly(sock)
                if self.transport == "auto" and mode == "connect" and _connect_refused(e):
                    # Something in the way does not pass CONNECT: the
                    # same stream in a WebSocket, on a new connection.
                    mode, self.path = "websocket", self._ws_path
                    continue
                wait = _startup_retry(e, deadline)
                if wait is None:
                    raise
                time.sleep(wait)
            except BaseException:
                _close_quietly(sock)
                raise
        sock.settimeout(None)
        if mode == "websocket":
            sock = WebSocketStream(sock)
        self.opened_transport = mode
        self._sock = sock
        return sock

    def close(self) -> None:
        """Close the socket. Safe to call at any time, and twice."""
        sock, self._sock = self._sock, None
        if sock is not None:
            _close_quietly(sock)

    # -- internals ---------------------------------------------------------

    def _dial(self, deadline: Optional[float]) -> TunnelSocket:
        where = f"{self._host}:{self._port}"
        try:
            raw = socket.create_connection((self._host, self._port), timeout=_remaining(deadline))
        except socket.timeout as e:
            raise SandboxConnectionError(f"tunnel: timed out connecting to {where}") from e
        except OSError as e:
            raise SandboxConnectionError(f"tunnel: cannot connect to {where}: {e}") from e
        try:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        if not self._tls:
            return raw
        try:
            # Not ctx.wrap_socket: an SSH library reads and writes the
            # stream from two threads, which an SSLSocket does not allow.
            return TLSStream(raw, ssl_context(self.verify_ssl), self._host, _remaining(deadline))
        except ssl.SSLError as e:
            _close_quietly(raw)
            raise SandboxConnectionError(f"tunnel: TLS handshake with {where} failed: {e}") from e
        except socket.timeout as e:
            _close_quietly(raw)
            raise SandboxConnectionError(f"tunnel: TLS handshake with {where} timed out") from e
        except OSError as e:
            _close_quietly(raw)
            raise SandboxConnectionError(f"tunnel: TLS handshake with {where} failed: {e}") from e

    def _ws_handshake(self, sock: TunnelSocket, deadline: Optional[float]) -> None:
        key = handshake_key()
        lines = [
            f"GET {self.path} HTTP/1.1",
            f"Host: {self._netloc}",
            "Connection: Upgrade",
            "Upgrade: websocket",
            "Sec-WebSocket-Version: 13",
            f"Sec-WebSocket-Key: {key}",
            f"Authorization: Bearer {self._token}",
            f"User-Agent: sandgate-sdk-python/{__version__}",
        ]
        lines += [f"{k}: {v}" for k, v in self.extra_headers.items()]
        status_line, _, _, headers = self._exchange(sock, lines, 101, deadline)
        if headers.get("Sec-WebSocket-Accept", "") != expected_accept(key):
            raise SandboxConnectionError(
                f"tunnel: the answer to the WebSocket upgrade of {self.path} has a wrong Sec-WebSocket-Accept",
                status_line=status_line,
            )

    def _exchange(
        self, sock: TunnelSocket, lines: "list[str]", want: int, deadline: Optional[float]
    ) -> "tuple[str, int, str, CaseInsensitiveHeaders]":
        """Send a request head and return the answer's parsed head; raise unless its status is *want*."""
        what = lines[0].split(" ", 1)[0]
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        try:
            sock.settimeout(_remaining(deadline))
            sock.sendall(request)
            head = _read_head(sock, deadline)
        except socket.timeout as e:
            raise SandboxConnectionError(f"tunnel: no answer to {what} {self.path} within {self.timeout}s") from e
        except ConnectionResetError as e:
            raise _UnreadableAnswer(f"tunnel: {what} {self.path} failed: {e}") from e
        except OSError as e:
            raise SandboxConnectionError(f"tunnel: {what} {self.path} failed: {e}") from e
        answer = _parse_head(head)
        status_line, status, reason, headers = answer
        if status == want:
            return answer
        body = b""
        try:
            body = _read_body(sock, headers, deadline)
        except OSError:
            pass
        raise error_for_status(
            status,
            reason,
            headers,
            body,
            what=f"tunnel: {what} {self.path} answered {status_line!r}",
            session_scoped=True,
            status_line=status_line,
            fallback=SandboxConnectionError,
        )

    def _handshake(self, sock: TunnelSocket, deadline: Optional[float]) -> None:
        lines = [
            f"CONNECT {self.path} HTTP/1.1",
            f"Host: {self._netloc}",
            f"Proxy-Authorization: Bearer {self._token}",
            f"Authorization: Bearer {self._token}",
            f"User-Agent: sandgate-sdk-python/{__version__}",
        ]
        lines += [f"{k}: {v}" for k, v in self.extra_headers.items()]
        self._exchange(sock, lines, 200, deadline)


class _UnreadableAnswer(SandboxConnectionError):
    """An answer that is no HTTP, or the connection closed before one."""


#: Statuses with which front ends that do not pass CONNECT refuse it.
_CONNECT_REFUSALS = (400, 405, 501)


def _connect_refused(e: SandboxAPIError) -> bool:
    """Whether a CONNECT failed with *e* because something other than the
    gateway refused it, so that the WebSocket may get through: no HTTP
    answer, a 400, 405 or 501, or a status without the gateway's error
    envelope. The gateway's own answers (401, 404, 429... with a code)
    are final; so are network failures and timeouts."""
    if isinstance(e, _UnreadableAnswer):
        return True
    if e.status_code is None:
        return False
    return e.status_code in _CONNECT_REFUSALS or not e.code


def _remaining(deadline: Optional[float]) -> Optional[float]:
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise socket.timeout("timed out")
    return left


def _close_quietly(sock: TunnelSocket) -> None:
    try:
        sock.close()
    except OSError:
        pass


def _read_head(sock: TunnelSocket, deadline: Optional[float]) -> bytes:
    """Read the answer's head up to and including the blank line, one byte at a time."""
    buf = bytearray()
    while not buf.endswith(b"\r\n\r\n") and not buf.endswith(b"\n\n"):
        if len(buf) >= _MAX_HEAD:
            raise SandboxConnectionError("tunnel: CONNECT answer head is too large")
        sock.settimeout(_remaining(deadline))
        b = sock.recv(1)
        if not b:
            if not buf:
                raise _UnreadableAnswer("tunnel: the gateway closed the connection without answering CONNECT")
            raise _UnreadableAnswer(
                "tunnel: the gateway closed the connection in the middle of its CONNECT answer: "
                + bytes(buf[:200]).decode("latin-1", errors="replace")
            )
        buf += b
    return bytes(buf)


def _parse_head(head: bytes) -> "tuple[str, int, str, CaseInsensitiveHeaders]":
    text = head.decode("latin-1")
    lines = text.replace("\r\n", "\n").split("\n")
    status_line = lines[0].strip()
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise _UnreadableAnswer(
            f"tunnel: the gateway's answer to CONNECT is not HTTP: {status_line[:200]!r}",
            status_line=status_line[:200],
        )
    status = int(parts[1])
    reason = parts[2] if len(parts) > 2 else ""
    headers = CaseInsensitiveHeaders()
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip()] = v.strip()
    return status_line, status, reason, headers


def _read_body(sock: TunnelSocket, headers: CaseInsensitiveHeaders, deadline: Optional[float]) -> bytes:
    """Read an error answer's body when its length is known and small."""
    try:
        length = int(headers.get("Content-Length", ""))
    except ValueError:
        return b""
    length = max(0, min(length, _MAX_BODY))
    body = bytearray()
    while len(body) < length:
        sock.settimeout(_remaining(deadline))
        chunk = sock.recv(length - len(body))
        if not chunk:
            break
        body += chunk
    return bytes(body)


#: CONNECT refusals that only say "too many tunnels in SSH authentication
#: right now" (the caller's own budget, or the gateway's): retried within
#: the tunnel's timeout, after the answer's Retry-After.
_STARTUP_CODES = ("too_many_ssh_startups", "ssh_startups_full")


def _startup_retry(e: "SandboxAPIError", deadline: Optional[float]) -> Optional[float]:
    """Seconds to wait before retrying a CONNECT refused with *e*, or None."""
    if e.code not in _STARTUP_CODES:
        return None
    wait = _float_retry_after(e.headers) or 1.0
    wait = min(max(wait, 0.05), 5.0)
    if deadline is not None and time.monotonic() + wait >= deadline:
        return None
    return wait


def _float_retry_after(headers: Mapping[str, str]) -> Optional[float]:
    for k, v in headers.items():
        if k.lower() == "retry-after":
            try:
                return float(v)
            except ValueError:
                return None
    return None
