"""Every use of Paramiko's private API, in one module, behind a version check.

The SDK needs five things Paramiko has no public API for:

- the ``exit-signal`` channel request, which Paramiko ignores: a Transport
  subclass routes channel requests to :func:`_handle_channel_request` first
  (``Transport._channel_handler_table``), which defers every other request
  to Paramiko's own handler (``Channel._handle_request``);
- sending a channel request without waiting for its reply (the ``signal``
  request, RFC 4254 6.9) and answering one: ``Transport._send_user_message``;
- not sending a channel message after the channel's CLOSE
  (:func:`_late_for_channel`): the Transport subclass checks every message
  in ``Transport._send_message``, which ``_send_user_message`` calls with
  ``clear_to_send_lock`` held, and reads ``Transport._channels``;
- an SFTP extended request (``limits@openssh.com``): ``SFTPClient._request``;
- pipelined SFTP reads: ``SFTPClient._async_request``, ``_read_response``
  and ``_convert_status``, and the ``_async_response`` method Paramiko calls
  on the object handed to ``_async_request`` (:class:`ReadPipeline`).

These are unchanged across :data:`SUPPORTED` (``pyproject.toml`` carries the
same bound), and CI runs the SDK's tests against the oldest and the newest
Paramiko in it. :func:`check` refuses any other version, and any version
that lacks one of the names, with :class:`UnsupportedParamikoError` before
the first connection, instead of failing somewhere inside a command. The
lower end is where Paramiko learnt AES-GCM (3.5.0), the only ciphers
sandgate's SSH server offers.

Nothing else in the SDK touches a Paramiko name that starts with ``_``.
"""

from __future__ import annotations

import contextlib
import functools
import re
import threading
from typing import Iterator, List, Optional, Tuple, Type, Union

import paramiko
from paramiko.common import (
    MSG_CHANNEL_DATA,
    MSG_CHANNEL_EOF,
    MSG_CHANNEL_EXTENDED_DATA,
    MSG_CHANNEL_REQUEST,
    MSG_CHANNEL_WINDOW_ADJUST,
    cMSG_CHANNEL_REQUEST,
    cMSG_CHANNEL_SUCCESS,
)
from paramiko.message import Message
from paramiko.sftp import CMD_DATA, CMD_READ, CMD_STATUS, SFTPError, int64

from .errors import UnsupportedParamikoError

__all__ = [
    "SUPPORTED",
    "check",
    "transport_class",
    "send_signal",
    "sending_on",
    "shutdown_write",
    "recv",
    "exit_signal",
    "sftp_request",
    "ReadPipeline",
]

#: The Paramiko versions this module is written and tested for, as a pip specifier.
SUPPORTED = ">=3.5,<6"
_OLDEST = (3, 5)
_BEYOND = (6, 0)

# (class, attribute) for every private name used below.
_PRIVATE_NAMES: Tuple[Tuple[type, str], ...] = (
    (paramiko.Transport, "_channel_handler_table"),
    (paramiko.Transport, "_send_user_message"),
    (paramiko.Transport, "_send_message"),
    (paramiko.Channel, "_handle_request"),
    (paramiko.SFTPClient, "_request"),
    (paramiko.SFTPClient, "_async_request"),
    (paramiko.SFTPClient, "_read_response"),
    (paramiko.SFTPClient, "_convert_status"),
)

# Where the exit-signal handler leaves the signal's name on a channel.
_EXIT_SIGNAL_ATTR = "_sandbox_sessions_sdk_exit_signal"


def problem(version: Optional[str] = None) -> Optional[str]:
    """Why this Paramiko (or *version*) cannot be used, or None when it can."""
    found = paramiko.__version__ if version is None else version
    m = re.match(r"(\d+)\.(\d+)", found)
    if m is None:
        return f"cannot read Paramiko's version from {found!r}"
    if not _OLDEST <= (int(m.group(1)), int(m.group(2))) < _BEYOND:
        return f"Paramiko {found} is outside the supported range"
    missing = [f"{cls.__name__}.{name}" for cls, name in _PRIVATE_NAMES if not hasattr(cls, name)]
    if missing:
        return f"Paramiko {found} lacks {', '.join(missing)}"
    return None


def check() -> None:
    """Raise :class:`UnsupportedParamikoError` unless the installed Paramiko is supported."""
    why = problem()
    if why is not None:
        raise UnsupportedParamikoError(
            f"sandbox_sessions_sdk needs paramiko{SUPPORTED} (it uses Paramiko internals checked "
            f"only against those versions): {why} ({paramiko.__file__}); "
            f"install a supported one: pip install 'paramiko{SUPPORTED}'",
            found=paramiko.__version__,
            supported=SUPPORTED,
        )


# --------------------------------------------------------------------------
# SSH: exit-signal and signal
# --------------------------------------------------------------------------


def _handle_channel_request(chan: paramiko.Channel, m: Message) -> None:
    """Paramiko ignores ``exit-signal``; record it, then defer to Paramiko."""
    packet = getattr(m, "packet", None)
    if packet is not None:
        pos = packet.tell()
        try:
            if m.get_text() == "exit-signal":
                want_reply = m.get_boolean()  # RFC 4254 says false; answer anyway if asked
                setattr(chan, _EXIT_SIGNAL_ATTR, m.get_text())
                chan.status_event.set()
                if want_reply and chan.transport is not None:
                    reply = Message()
                    reply.add_byte(cMSG_CHANNEL_SUCCESS)
                    reply.add_int(chan.remote_chanid)
                    chan.transport._send_user_message(reply)  # type: ignore[attr-defined]
                return
        except Exception:  # malformed: let Paramiko deal with it
            pass
        packet.seek(pos)
    paramiko.Channel._handle_request(chan, m)  # type: ignore[attr-defined]


# Channel messages that must not follow the channel's CLOSE.
_AFTER_CLOSE = frozenset((MSG_CHANNEL_WINDOW_ADJUST, MSG_CHANNEL_DATA, MSG_CHANNEL_EXTENDED_DATA, MSG_CHANNEL_EOF))

# The channel the calling thread is sending for, while the SDK calls one of
# its methods (sending_on).
_sending = threading.local()


@contextlib.contextmanager
def sending_on(chan: paramiko.Channel) -> Iterator[None]:
    """Mark what this thread sends, until the block ends, as *chan*'s.

    :func:`_late_for_channel` then drops it unless that very channel is
    still open, instead of judging by its number alone, which the server
    may have given to a newer channel.
    """
    prev = getattr(_sending, "chan", None)
    _sending.chan = chan
    try:
        yield
    finally:
        _sending.chan = prev


def _late_for_channel(t: paramiko.Transport, m: Message) -> bool:
    """Whether *m* is a message for a channel that is closed, which must not be sent.

    Paramiko builds a channel's data, window adjust or EOF under the
    channel's lock and sends it after letting go (``shutdown_write``,
    ``recv``, ``send``). Meanwhile its transport thread may take the
    server's CLOSE and send the answering CLOSE, so the EOF (say) follows
    the CLOSE on the wire. The server has forgotten the channel by then,
    and x/crypto's SSH server, like OpenSSH's for EOF, ends the whole
    connection over a message for a channel it does not know; or it has
    given the number to a newer channel, which would take the message as
    its own. Commands that exit at once, three threads to a connection,
    broke about one connection in ten.

    A message sent inside :func:`sending_on` goes only while that channel
    is open (this also covers the ``signal`` request). Any other data,
    window adjust or EOF goes only while some open channel has its number.
    Called with ``clear_to_send_lock`` held, which every CLOSE is sent under
    after its channel is marked closed, so a message that passes is on the
    wire before its channel's CLOSE. The EOF Paramiko's own ``close()``
    sends just before a CLOSE is dropped too: CLOSE alone ends a channel.
    """
    with m.packet.getbuffer() as b:
        if len(b) < 5 or (b[0] not in _AFTER_CLOSE and b[0] != MSG_CHANNEL_REQUEST):
            return False
        kind = b[0]
        recipient = int.from_bytes(b[1:5], "big")
    chan = getattr(_sending, "chan", None)
    if chan is not None and chan.transport is t and chan.remote_chanid == recipient:
        return chan.closed or not chan.active
    if kind == MSG_CHANNEL_REQUEST:
        return False  # a request for a channel the server does not know is answered, not fatal
    # A channel still waiting for its open confirmation is not active and
    # carries remote_chanid 0 until then.
    channels = t._channels.values()  # type: ignore[attr-defined]
    return not any(c.active and not c.closed and c.remote_chanid == recipient for c in channels)


def shutdown_write(chan: paramiko.Channel) -> None:
    """``chan.shutdown_write()``, its EOF dropped if the channel closed meanwhile."""
    with sending_on(chan):
        chan.shutdown_write()


def recv(chan: paramiko.Channel, n: int, stderr: bool = False) -> bytes:
    """``chan.recv(n)`` (or ``recv_stderr``), its window adjust dropped if the channel closed meanwhile."""
    with sending_on(chan):
        data: bytes = chan.recv_stderr(n) if stderr else chan.recv(n)
        return data


@functools.lru_cache(maxsize=None)
def transport_class() -> Type[paramiko.Transport]:
    """A Paramiko Transport subclass whose channels record ``exit-signal``,
    and which sends nothing for a channel after its CLOSE (see :func:`_late_for_channel`).

    Raises UnsupportedParamikoError (see :func:`check`).
    """
    check()
    table = dict(paramiko.Transport._channel_handler_table)  # type: ignore[attr-defined]
    table[MSG_CHANNEL_REQUEST] = _handle_channel_request

    class _Transport(paramiko.Transport):
        _channel_handler_table = table

        def _send_message(self, data: Message) -> None:
            if _late_for_channel(self, data):
                return
            super()._send_message(data)  # type: ignore[misc]

    return _Transport


def exit_signal(chan: paramiko.Channel) -> Optional[str]:
    """The signal name of the channel's ``exit-signal`` request, if one came."""
    sig = getattr(chan, _EXIT_SIGNAL_ATTR, None)
    return sig if isinstance(sig, str) else None


def send_signal(chan: paramiko.Channel, name: str) -> None:
    """Send the SSH ``signal`` channel request (RFC 4254 6.9), without waiting for a reply."""
    m = Message()
    m.add_byte(cMSG_CHANNEL_REQUEST)
    m.add_int(chan.remote_chanid)
    m.add_string("signal")
    m.add_boolean(False)
    m.add_string(name)
    if chan.transport is None:
        raise EOFError("the channel has no transport")
    with sending_on(chan):  # not to a newer channel that has its number
        chan.transport._send_user_message(m)  # type: ignore[attr-defined]


# --------------------------------------------------------------------------
# SFTP: extended requests and pipelined reads
# --------------------------------------------------------------------------


def sftp_request(sftp: paramiko.SFTPClient, t: int, *args: object) -> Tuple[int, Message]:
    """Send one SFTP request and wait for its answer: (response type, message).

    Raises what Paramiko raises for a failed request (IOError, SFTPError, EOFError).
    """
    result: Tuple[int, Message] = sftp._request(t, *args)  # type: ignore[attr-defined]
    return result


ReadResult = Union[bytes, BaseException]


class ReadPipeline:
    """SFTP reads with many requests in flight, sent and received on the calling thread.

    :meth:`send` queues a read and returns its request number; :meth:`receive`
    waits for the next answer and returns the reads finished so far, each as
    ``(request number, data)``: ``b""`` at end of file, or the exception the
    server's status maps to.
    """

    def __init__(self, sftp: paramiko.SFTPClient) -> None:
        self._sftp = sftp
        self._done: List[Tuple[int, ReadResult]] = []

    def send(self, handle: object, offset: int, length: int) -> int:
        num: int = self._sftp._async_request(  # type: ignore[attr-defined]
            self, CMD_READ, handle, int64(offset), int(length)
        )
        return num

    def receive(self) -> List[Tuple[int, ReadResult]]:
        self._sftp._read_response()  # type: ignore[attr-defined]
        done, self._done = self._done, []
        return done

    # Paramiko calls this for each answer to a request sent with us as its handler.
    def _async_response(self, t: int, msg: Message, num: int) -> None:
        if t == CMD_DATA:
            self._done.append((num, msg.get_string()))
        elif t == CMD_STATUS:
            try:
                self._sftp._convert_status(msg)  # type: ignore[attr-defined]
            except EOFError:
                self._done.append((num, b""))
                return
            except Exception as e:
                self._done.append((num, e))
                return
            self._done.append((num, SFTPError("unexpected OK status to a read")))
        else:
            self._done.append((num, SFTPError(f"unexpected SFTP response type {t} to a read")))
