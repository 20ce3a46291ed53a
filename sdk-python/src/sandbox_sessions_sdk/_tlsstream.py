"""TLSStream: a TLS client connection that one thread may read while others write.

An SSH library reads its socket in one thread (Paramiko's transport thread)
and writes from others (every channel's caller). ``ssl.SSLSocket`` does not
allow that: both calls use one OpenSSL object, and CPython releases the GIL
around ``SSL_read`` and ``SSL_write``, so they run at the same time and now and
then one of them reports an error or a spurious end of stream. Over the
gateway's https CONNECT tunnel that ended about one SSH connection in ten,
mid-command.

Here OpenSSL works on memory buffers (``ssl.MemoryBIO``) under one lock,
held only while bytes are encrypted or decrypted; reading and writing the
TCP socket happen outside it, so a reader waiting for the network never
holds up a writer, or the other way round. Ciphertext leaves in the order it
was produced: one writer at a time drains the outgoing buffer.

Writes block until their ciphertext is on the socket, whatever the timeout:
once plaintext is encrypted it cannot be taken back, so a caller that saw a
timeout and sent again would duplicate it. Reads honour the timeout like a
socket (``socket.timeout``; ``BlockingIOError`` when non-blocking). Closing
shuts the TCP socket down first, which wakes any thread waiting on it.
"""

from __future__ import annotations

import select
import socket
import ssl
import threading
import time
from typing import Any, Callable, Optional

__all__ = ["TLSStream"]

_CHUNK = 256 * 1024


class TLSStream:
    """A socket-like TLS client stream over a connected TCP socket.

    It has what SSH libraries use of a socket (``recv``, ``send``,
    ``sendall``, ``settimeout``, ``gettimeout``, ``setblocking``, ``close``,
    ``shutdown``, ``fileno``, ``getpeername``, ``getsockname``,
    ``setsockopt``) plus ``version()``, ``cipher()`` and ``getpeercert()``.
    The handshake runs in the constructor within *timeout* seconds;
    certificate and handshake failures raise ``ssl.SSLError``.
    """

    def __init__(
        self,
        raw: socket.socket,
        context: ssl.SSLContext,
        server_hostname: Optional[str],
        timeout: Optional[float],
    ) -> None:
        self._raw = raw
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_hostname=server_hostname)
        self._state = threading.Lock()  # guards _tls and both buffers
        self._writer = threading.Lock()  # held by the one thread draining _outgoing
        self._reader = threading.Lock()  # one recv at a time
        self._timeout: Optional[float] = None
        # Paramiko's Transport.stop_thread reads sock._closed: keep the name.
        self._closed = False
        self._broken = False  # a write stopped halfway: the stream is corrupt
        self._rwait = _waiter(raw, readable=True)
        self._wwait = _waiter(raw, readable=False)
        raw.setblocking(False)
        self.settimeout(timeout)
        self._handshake()

    # -- socket API ----------------------------------------------------------

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        if flags:
            raise ValueError("TLSStream.recv does not take flags")
        with self._reader:
            deadline = self._deadline()
            while True:
                fatal: Optional[ssl.SSLError] = None
                with self._state:
                    try:
                        data: Optional[bytes] = self._tls.read(bufsize)
                    except ssl.SSLWantReadError:
                        data = None
                    except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                        data = b""  # close_notify, or the peer just closed (like suppress_ragged_eofs)
                    except ssl.SSLError as e:
                        data, fatal = None, e  # its alert, if OpenSSL made one, goes first
                    answer = self._outgoing.pending > 0  # a key update wants an answer
                if answer:
                    try:
                        self._flush(block=False)
                    except OSError:
                        pass  # the socket is gone: the read below, or the next one, says so
                if fatal is not None:
                    raise fatal
                if data is not None:
                    return data
                self._fill(deadline)

    def send(self, data: Any, flags: int = 0) -> int:
        if flags:
            raise ValueError("TLSStream.send does not take flags")
        if self._closed:
            raise OSError(9, "TLS stream is closed")
        if self._broken:
            raise OSError(5, "TLS stream is broken: an earlier write stopped halfway")
        view = memoryview(data).cast("B")
        if not view:
            return 0
        with self._state:
            n = self._tls.write(view)
        self._flush(block=True)
        return n

    def sendall(self, data: Any, flags: int = 0) -> None:
        view = memoryview(data).cast("B")
        while view:
            view = view[self.send(view, flags) :]

    def settimeout(self, timeout: Optional[float]) -> None:
        if timeout is not None and timeout < 0:
            raise ValueError("timeout must be non-negative")
        self._timeout = timeout

    def gettimeout(self) -> Optional[float]:
        return self._timeout

    def setblocking(self, flag: bool) -> None:
        self.settimeout(None if flag else 0.0)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._raw.shutdown(socket.SHUT_RDWR)  # wakes a thread waiting in recv or send
        except OSError:
            pass
        self._raw.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def shutdown(self, how: int) -> None:
        self._raw.shutdown(how)

    def fileno(self) -> int:
        return self._raw.fileno()

    def pending(self) -> int:
        """Decrypted bytes ready to read without touching the socket."""
        with self._state:
            return self._tls.pending()

    def getpeername(self) -> Any:
        return self._raw.getpeername()

    def getsockname(self) -> Any:
        return self._raw.getsockname()

    def setsockopt(self, *args: Any) -> None:
        self._raw.setsockopt(*args)

    def getsockopt(self, *args: Any) -> Any:
        return self._raw.getsockopt(*args)

    def version(self) -> Optional[str]:
        return self._tls.version()

    def cipher(self) -> Any:
        return self._tls.cipher()

    def getpeercert(self, binary_form: bool = False) -> Any:
        return self._tls.getpeercert(binary_form)

    def __enter__(self) -> "TLSStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else self.version()
        return f"<TLSStream {state} fd={self._raw.fileno()}>"

    # -- internals -------------------------------------------------------------

    def _handshake(self) -> None:
        deadline = self._deadline()
        while True:
            with self._state:
                try:
                    self._tls.do_handshake()
                    done = True
                except ssl.SSLWantReadError:
                    done = False
            self._flush(block=True)
            if done:
                return
            self._fill(deadline)

    def _deadline(self) -> Optional[float]:
        t = self._timeout
        return None if t is None else time.monotonic() + t

    def _fill(self, deadline: Optional[float]) -> None:
        """Move what the socket has (waiting for it until *deadline*) into the TLS object."""
        while True:
            try:
                chunk = self._raw.recv(_CHUNK)
                break
            except (BlockingIOError, InterruptedError):
                if self._timeout == 0:
                    raise BlockingIOError(11, "no data on the TLS stream") from None
                self._rwait(deadline)
        with self._state:
            if chunk:
                self._incoming.write(chunk)
            else:
                self._incoming.write_eof()

    def _flush(self, block: bool) -> None:
        """Send the ciphertext waiting in the outgoing buffer, in order.

        One thread drains at a time. With *block* false (the reader answering
        a key update) a thread that finds another draining leaves its bytes to
        it: that one checks the buffer again after letting go.
        """
        while True:
            if not self._writer.acquire(blocking=block):
                return
            try:
                while True:
                    with self._state:
                        chunk = self._outgoing.read()
                    if not chunk:
                        break
                    self._send_raw(chunk)
            finally:
                self._writer.release()
            with self._state:
                if not self._outgoing.pending:
                    return

    def _send_raw(self, chunk: bytes) -> None:
        view = memoryview(chunk)
        try:
            while view:
                try:
                    view = view[self._raw.send(view) :]
                except (BlockingIOError, InterruptedError):
                    self._wwait(None)
        except BaseException:
            # Part of a record went out and the rest never will: anything
            # sent after it would reach the peer as garbage.
            self._broken = True
            raise


def _waiter(raw: socket.socket, readable: bool) -> Callable[[Optional[float]], None]:
    """A function that waits until *raw* is readable (or writable), raising socket.timeout at the deadline.

    poll where there is one (no limit on the descriptor's number), select elsewhere.
    """
    if hasattr(select, "poll"):
        p = select.poll()
        p.register(raw.fileno(), select.POLLIN if readable else select.POLLOUT)

        def wait_poll(deadline: Optional[float]) -> None:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not p.poll(None if left is None else left * 1000) and left is not None:
                raise socket.timeout("timed out")

        return wait_poll

    def wait_select(deadline: Optional[float]) -> None:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        r, w, _ = select.select([raw] if readable else [], [] if readable else [raw], [], left)
        if not r and not w and left is not None:
            raise socket.timeout("timed out")

    return wait_select
