"""Bounded capture of one output stream of a command: its head and its tail."""

from __future__ import annotations

import codecs
from collections import deque
from typing import Deque, Optional

#: What ``run_command`` keeps of each stream by default.
DEFAULT_MAX_OUTPUT_BYTES = 10 * 1024 * 1024


def truncation_marker(dropped: int) -> str:
    """The line put between the head and the tail of a truncated stream."""
    return f"\n[... {dropped} bytes dropped ...]\n"


class OutputBuffer:
    """Keeps at most *limit* bytes of a byte stream fed to it in chunks.

    The first ``limit // 2`` bytes (the head) and the last
    ``limit - limit // 2`` bytes (the tail) are kept, whatever the total; the
    bytes between them are counted and dropped as they arrive, so memory
    stays bounded by *limit* (plus the chunk being fed). ``limit=None``
    keeps everything.
    """

    def __init__(self, limit: Optional[int]) -> None:
        self._head_max: Optional[int] = None if limit is None else limit // 2
        self._tail_max = 0 if limit is None else limit - limit // 2
        self._head = bytearray()
        self._tail: Deque[bytes] = deque()
        self._tail_len = 0
        #: Bytes fed so far.
        self.total = 0

    @property
    def truncated(self) -> bool:
        """True once bytes have been dropped."""
        return self._head_max is not None and self.total > self._head_max + self._tail_max

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        if self._head_max is None:
            self._head += data
            return
        room = self._head_max - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if not data:
            return
        if len(data) >= self._tail_max:
            self._tail.clear()
            self._tail.append(bytes(data[len(data) - self._tail_max :]))
            self._tail_len = self._tail_max
            return
        self._tail.append(bytes(data))
        self._tail_len += len(data)
        while self._tail_len > self._tail_max:
            excess = self._tail_len - self._tail_max
            first = self._tail[0]
            if len(first) <= excess:
                self._tail.popleft()
                self._tail_len -= len(first)
            else:
                self._tail[0] = first[excess:]
                self._tail_len -= excess

    def text(self) -> str:
        """The kept bytes decoded as UTF-8 (invalid bytes become U+FFFD).

        When bytes were dropped: the head, :func:`truncation_marker`, the
        tail. A UTF-8 character cut by either edge of the gap is dropped
        whole (and counted as dropped) rather than shown as U+FFFD.
        """
        head, tail = bytes(self._head), b"".join(self._tail)
        if not self.truncated:
            return (head + tail).decode("utf-8", errors="replace")
        dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        head_text = dec.decode(head)  # an incomplete last character stays in dec
        kept_head = len(head) - len(dec.getstate()[0])
        skip = 0
        while skip < min(3, len(tail)) and tail[skip] & 0xC0 == 0x80:  # continuation bytes
            skip += 1
        tail = tail[skip:]
        dropped = self.total - kept_head - len(tail)
        return head_text + truncation_marker(dropped) + tail.decode("utf-8", errors="replace")
