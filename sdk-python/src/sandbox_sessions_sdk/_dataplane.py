"""Helpers of the REST data plane (commands, files, processes): argument
checks, request bodies, NDJSON reading and answer mapping."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import signal as _signal
import stat
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Union
from urllib.parse import quote

from ._common import DEFAULT_COMMAND_TIMEOUT, check_int, check_timeout
from .errors import SandboxConnectionError, SandboxOperationError
from .models import CommandResult

#: What ``on_stdout`` / ``on_stderr`` of :meth:`SessionsClient.run` receive:
#: text, or bytes for a chunk that is not UTF-8 text.
ChunkCallback = Callable[[Union[str, bytes]], None]

#: Bytes read from a file object per chunk of an upload or a download.
CHUNK_BYTES = 1 << 20

#: The longest sandbox path the gateway takes (bytes of UTF-8).
MAX_PATH_BYTES = 4096

_SHELL_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_MODE = re.compile(r"^[0-7]{1,4}$")

#: The signal names the gateway takes (SSH's), without ``SIG``.
SIGNALS = frozenset(
    {"ABRT", "ALRM", "FPE", "HUP", "ILL", "INT", "KILL", "PIPE", "QUIT", "SEGV", "TERM", "USR1", "USR2"}
)

#: A stdin write's raw bytes per request: base64 of it stays under the
#: gateway's 64 KiB body limit.
STDIN_CHUNK = 45 * 1024


def check_text(name: str, value: Any, *, allow_empty: bool = False) -> str:
    """A str without NUL characters (non-empty unless *allow_empty*)."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, got {type(value).__name__}")
    if not allow_empty and not value.strip():
        raise ValueError(f"{name} must be a non-empty string")
    if "\x00" in value:
        raise ValueError(f"{name} must not hold NUL characters")
    return value


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def check_path(name: str, value: Any) -> str:
    """A sandbox path: a non-empty str (or os.PathLike), no NUL, at most 4096 bytes."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, got {type(value).__name__}")
    if not value:
        raise ValueError(f"{name} must be a non-empty string")
    if "\x00" in value:
        raise ValueError(f"{name} must not hold NUL characters")
    if len(value.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        raise ValueError(f"{name} must be at most {MAX_PATH_BYTES} bytes")
    return value


def check_shell_name(name: Any) -> str:
    if not isinstance(name, str):
        raise TypeError(f"shell name must be a string, got {type(name).__name__}")
    if not _SHELL_NAME.match(name):
        raise ValueError(f"shell name must be 1 to 64 letters, digits, '_', '.' or '-', got {name!r}")
    return name


def check_callback(name: str, value: Any) -> Optional[ChunkCallback]:
    if value is not None and not callable(value):
        raise TypeError(f"{name} must be callable")
    return value


def command_fields(command: Any, argv: Any) -> Dict[str, Any]:
    """``{"command": ...}`` or ``{"argv": [...]}``: exactly one of the two."""
    if (command is None) == (argv is None):
        raise ValueError("give exactly one of command (shell text) and argv (a list of words)")
    if command is not None:
        return {"command": check_text("command", command)}
    if isinstance(argv, (str, bytes)) or not isinstance(argv, Sequence):
        raise TypeError(f"argv must be a list of strings, got {type(argv).__name__}")
    words = [check_text(f"argv[{i}]", w, allow_empty=i > 0) for i, w in enumerate(argv)]
    if not words:
        raise ValueError("argv must hold at least a program name")
    return {"argv": words}


def check_env(env: Any) -> Dict[str, str]:
    if not isinstance(env, Mapping):
        raise TypeError(f"env must be a dict of strings, got {type(env).__name__}")
    out: Dict[str, str] = {}
    for key, value in env.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"env must map strings to strings, got {key!r}: {type(value).__name__}")
        if not key or "=" in key or "\x00" in key or "\x00" in value:
            raise ValueError(f"env: {key!r} is not a valid variable name and value")
        out[key] = value
    return out


def command_body(
    command: Any,
    argv: Any,
    *,
    stdin: Any,
    env: Any,
    cwd: Any,
    timeout: Any,
    max_output_bytes: Any,
    shell: Any,
    background: Any,
) -> Dict[str, Any]:
    """The JSON body of ``POST .../commands``, checked locally."""
    body = command_fields(command, argv)
    if stdin is not None:
        if isinstance(stdin, str):
            body["stdin"] = stdin
        elif isinstance(stdin, (bytes, bytearray, memoryview)):
            body["stdinBase64"] = base64.b64encode(bytes(stdin)).decode("ascii")
        else:
            raise TypeError(f"stdin must be str or bytes, got {type(stdin).__name__}")
    if env is not None:
        body["env"] = check_env(env)
    if cwd is not None:
        body["cwd"] = check_text("cwd", cwd)
    t = check_timeout("timeout", timeout)
    if t is not None:
        body["timeout"] = t
    if max_output_bytes is not None:
        body["maxOutputBytes"] = check_int("max_output_bytes", max_output_bytes, 0)
    if shell is not None:
        body["shell"] = check_shell_name(shell)
    if check_bool("background", background):
        body["background"] = True
    return body


def exit_code_for_signal(name: str) -> int:
    """``128 + signal number`` (what a shell's ``$?`` shows), 255 for an unknown signal."""
    try:
        return 128 + int(_signal.Signals["SIG" + name.upper().replace("SIG", "", 1)])
    except (KeyError, ValueError):
        return 255


def _stream_text(data: Mapping[str, Any], name: str) -> Optional[str]:
    text = data.get(name)
    if isinstance(text, str):
        return text
    b64 = data.get(name + "Base64")
    if isinstance(b64, str):
        try:
            return base64.b64decode(b64).decode("utf-8", errors="replace")
        except ValueError:
            return None
    return None


def command_result(
    data: Mapping[str, Any], stdout: Optional[str] = None, stderr: Optional[str] = None
) -> CommandResult:
    """Map a ``CommandResult`` of the API (camelCase) to :class:`CommandResult`.

    *stdout* / *stderr* stand in for the answer's output (a stream's last
    line has none). A null ``exitCode`` with an ``exitSignal`` becomes
    ``128 + signal number``; with neither, -1.
    """
    sig = data.get("exitSignal") if isinstance(data.get("exitSignal"), str) else None
    code = data.get("exitCode")
    if not isinstance(code, int) or isinstance(code, bool):
        code = exit_code_for_signal(sig) if sig else -1
    duration = data.get("durationMs")
    cwd = data.get("cwd")
    return CommandResult(
        stdout=stdout if stdout is not None else (_stream_text(data, "stdout") or ""),
        stderr=stderr if stderr is not None else (_stream_text(data, "stderr") or ""),
        exit_code=code,
        exit_signal=sig or None,
        truncated=data.get("truncated") is True,
        timed_out=data.get("timedOut") is True,
        cwd=cwd if isinstance(cwd, str) else None,
        duration_ms=duration if isinstance(duration, int) and not isinstance(duration, bool) else None,
        state_lost=data.get("stateLost") is True,
    )


class NDJSONSplitter:
    """Newline-delimited JSON objects from chunks of bytes, fed as they arrive
    (the same parser for a sync and an async body)."""

    def __init__(self, what: str) -> None:
        self._what = what
        self._buf = b""

    def feed(self, chunk: bytes) -> List[Dict[str, Any]]:
        """The complete lines *chunk* ends, as dicts."""
        self._buf += chunk
        out: List[Dict[str, Any]] = []
        while True:
            i = self._buf.find(b"\n")
            if i < 0:
                return out
            line, self._buf = self._buf[:i], self._buf[i + 1 :]
            if line.strip():
                out.append(_json_line(line, self._what))

    def finish(self) -> List[Dict[str, Any]]:
        """At the end of the body: a last line without a newline, if any."""
        buf, self._buf = self._buf, b""
        return [_json_line(buf, self._what)] if buf.strip() else []


def ndjson_lines(chunks: Iterator[bytes], what: str) -> Iterator[Dict[str, Any]]:
    """Parse newline-delimited JSON objects from *chunks* as they arrive."""
    splitter = NDJSONSplitter(what)
    for chunk in chunks:
        yield from splitter.feed(chunk)
    yield from splitter.finish()


def _json_line(line: bytes, what: str) -> Dict[str, Any]:
    try:
        data = json.loads(line.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise SandboxOperationError(
            f"{what}: a line of the stream is not JSON", body=line[:4096].decode("utf-8", "replace")
        ) from None
    if not isinstance(data, dict):
        raise SandboxOperationError(f"{what}: a line of the stream is not a JSON object", body=str(data)[:4096])
    return data


def stream_error(data: Mapping[str, Any], what: str) -> Optional[SandboxOperationError]:
    """The error a stream's last line ``{"error": {...}}`` reports, if it is one."""
    err = data.get("error")
    if not isinstance(err, Mapping):
        return None
    code = err.get("code") if isinstance(err.get("code"), str) else None
    message = err.get("message") if isinstance(err.get("message"), str) else "no details"
    return SandboxOperationError(f"{what}: {code or 'error'}: {message}", code=code, body=json.dumps(data)[:4096])


class OutputCollector:
    """One stream of a streamed command: hands each chunk to its callback and keeps the bytes."""

    def __init__(self, callback: Optional[ChunkCallback]) -> None:
        self._callback = callback
        self._parts: List[bytes] = []

    def add(self, chunk: Union[str, bytes]) -> None:
        self._parts.append(chunk.encode("utf-8") if isinstance(chunk, str) else chunk)
        if self._callback is not None:
            self._callback(chunk)

    def text(self) -> str:
        return b"".join(self._parts).decode("utf-8", errors="replace")


def stream_chunk(line: Mapping[str, Any], name: str, what: str) -> Optional[Union[str, bytes]]:
    """The chunk of stream *name* (``stdout``/``stderr``) a line carries: text, bytes for base64, or None."""
    text = line.get(name)
    if isinstance(text, str):
        return text
    b64 = line.get(name + "Base64")
    if isinstance(b64, str):
        try:
            return base64.b64decode(b64)
        except ValueError:
            raise SandboxOperationError(f"{what}: bad base64 in the stream", body=b64[:4096]) from None
    return None


def check_mode(mode: Any) -> str:
    """A file mode as the gateway takes it: ``0o644`` or ``"644"`` / ``"0644"`` -> ``"0644"``."""
    if isinstance(mode, bool):
        raise TypeError("mode must be an int (0o644) or an octal string ('644')")
    if isinstance(mode, int):
        if not 0 <= mode <= 0o777:
            raise ValueError(f"mode must be between 0o000 and 0o777, got {oct(mode)}")
        return f"{mode:04o}"
    if isinstance(mode, str):
        if not _MODE.match(mode) or int(mode, 8) > 0o777:
            raise ValueError(f"mode must be octal 0000 to 0777, got {mode!r}")
        return f"{int(mode, 8):04o}"
    raise TypeError("mode must be an int (0o644) or an octal string ('644')")


def _known_length(f: Any) -> Optional[int]:
    """The bytes left in binary file object *f*, when they can be known without reading it."""
    if isinstance(f, io.TextIOBase):
        return None
    try:
        st = os.fstat(f.fileno())
        if stat.S_ISREG(st.st_mode):
            return max(0, st.st_size - f.tell())
        return None
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        pass
    try:
        if f.seekable():
            pos = f.tell()
            end = f.seek(0, os.SEEK_END)
            f.seek(pos)
            return max(0, end - pos)
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        pass
    return None


def _read_chunks(f: Any, what: str) -> Iterator[bytes]:
    while True:
        chunk = f.read(CHUNK_BYTES)
        if not chunk:
            return
        if isinstance(chunk, str):
            chunk = chunk.encode("utf-8")
        elif not isinstance(chunk, (bytes, bytearray, memoryview)):
            raise TypeError(f"{what}: the file object's read() returned {type(chunk).__name__}, not bytes or str")
        yield bytes(chunk)


class _SizedBody:
    """A file object's chunks with a known length: sent with a
    ``Content-Length``, reading the file as it goes."""

    def __init__(self, f: Any, length: int, what: str) -> None:
        self._f = f
        self._length = length
        self._what = what
        self.sent = 0

    def __len__(self) -> int:
        return self._length

    def __iter__(self) -> Iterator[bytes]:
        for chunk in _read_chunks(self._f, self._what):
            self.sent += len(chunk)
            yield chunk


def upload_body(data: Any, what: str) -> Any:
    """What is sent for ``write_file``'s data: bytes as they are, a
    file object chunk by chunk (with ``Content-Length`` when its size is
    known, else chunked), never read whole."""
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    if not callable(getattr(data, "read", None)):
        raise TypeError(f"data must be bytes, str or a readable file object, got {type(data).__name__}")
    length = _known_length(data)
    if length is not None and length > 0:
        return _SizedBody(data, length, what)
    if length == 0:
        return b""
    return _read_chunks(data, what)


class FileList(List[Dict[str, Any]]):
    """What :meth:`SessionsClient.list_files` returns: a list of entry dicts
    (the API's ``FileEntry``: ``name``, ``path``, ``type``, ``sizeBytes``,
    ``mode``, ``mtime``), plus :attr:`truncated`, True when the listing
    stopped at the gateway's 10,000 entries."""

    truncated: bool

    def __init__(self, entries: Sequence[Dict[str, Any]] = (), truncated: bool = False) -> None:
        super().__init__(entries)
        self.truncated = truncated

    def __repr__(self) -> str:
        return f"FileList({list.__repr__(self)}, truncated={self.truncated})"


class NDJSONStream(Iterator[Dict[str, Any]]):
    """An iterator over the JSON lines of an open HTTP answer; closes the
    answer when exhausted, on :meth:`close`, or at the end of a ``with``."""

    def __init__(self, resp: Any, what: str, on_error: Callable[[Exception], Exception]) -> None:
        self._resp = resp
        self._what = what
        self._lines = ndjson_lines(resp.iter_bytes(), what)
        self._on_error = on_error
        self._closed = False

    def __iter__(self) -> "NDJSONStream":
        return self

    def __next__(self) -> Dict[str, Any]:
        if self._closed:
            raise StopIteration
        try:
            return next(self._lines)
        except StopIteration:
            self.close()
            raise
        except SandboxOperationError:
            self.close()
            raise
        except Exception as e:
            self.close()
            mapped = self._on_error(e)
            if mapped is e:
                raise
            raise mapped from e

    def close(self) -> None:
        """Close the connection (the process is not affected). Safe to call twice."""
        if not self._closed:
            self._closed = True
            self._resp.close()

    def __enter__(self) -> "NDJSONStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class RunStream:
    """The lines of a streamed ``run`` (``application/x-ndjson``): output
    chunks go to the callbacks, the last line becomes the result."""

    def __init__(self, on_stdout: Optional[ChunkCallback], on_stderr: Optional[ChunkCallback], what: str) -> None:
        self.stdout = OutputCollector(on_stdout)
        self.stderr = OutputCollector(on_stderr)
        self._what = what

    def line(self, line: Mapping[str, Any]) -> Optional[CommandResult]:
        """Handle one line: the CommandResult when it is the last, else None;
        raises the error an error line reports."""
        out_chunk = stream_chunk(line, "stdout", self._what)
        err_chunk = stream_chunk(line, "stderr", self._what)
        if out_chunk is not None:
            self.stdout.add(out_chunk)
        if err_chunk is not None:
            self.stderr.add(err_chunk)
        if out_chunk is not None or err_chunk is not None:
            return None
        failed = stream_error(line, self._what)
        if failed is not None:
            raise failed
        if "exitCode" in line or "timedOut" in line:
            return command_result(line, self.stdout.text(), self.stderr.text())
        return None

    def ended_early(self) -> SandboxConnectionError:
        return SandboxConnectionError(f"{self._what}: the stream ended before the command's result")


def whole_result(
    data: Mapping[str, Any], on_stdout: Optional[ChunkCallback], on_stderr: Optional[ChunkCallback]
) -> CommandResult:
    """A streamed run answered with the whole result (a gateway that does not
    stream): the callbacks get each stream in one chunk."""
    res = command_result(data)
    if res.stdout and on_stdout is not None:
        on_stdout(res.stdout)
    if res.stderr and on_stderr is not None:
        on_stderr(res.stderr)
    return res


def run_read_timeout(body: Mapping[str, Any], client_timeout: Optional[float]) -> Optional[float]:
    """How long to wait for a run's answer: the command's timeout plus the client's."""
    if client_timeout is None:
        return None
    return float(body.get("timeout", DEFAULT_COMMAND_TIMEOUT)) + client_timeout


def shell_path(session_path: str, name: Any) -> str:
    return session_path + "/shells/" + quote(check_shell_name(name), safe="")


def read_headers(max_bytes: Optional[int]) -> Dict[str, str]:
    """read_file's headers: a ``Range`` for *max_bytes*."""
    headers = {"Accept": "application/octet-stream"}
    if max_bytes is not None:
        headers["Range"] = f"bytes=0-{check_int('max_bytes', max_bytes, 1) - 1}"
    return headers


def write_params(mkdirs: Any, mode: Any) -> Dict[str, str]:
    params = {"mkdirs": "true" if check_bool("mkdirs", mkdirs) else "false"}
    if mode is not None:
        params["mode"] = check_mode(mode)
    return params


def list_params(recursive: Any) -> Dict[str, str]:
    params = {"list": "true"}
    if check_bool("recursive", recursive):
        params["recursive"] = "true"
    return params


def file_list(data: Mapping[str, Any], what: str) -> FileList:
    entries = data.get("entries")
    if not isinstance(entries, list):
        raise SandboxOperationError(f"{what}: answer has no 'entries' list", body=str(data)[:4096])
    return FileList([dict(e) for e in entries if isinstance(e, Mapping)], data.get("truncated") is True)


def fetch_body(urls: Any, dest_dir: Any, overwrite: Any = False) -> Dict[str, Any]:
    """The JSON body of ``POST .../files/fetch``, checked locally."""
    if isinstance(urls, (str, bytes)) or not isinstance(urls, Sequence):
        raise TypeError(f"urls must be a list of strings, got {type(urls).__name__}")
    checked = [check_text(f"urls[{i}]", u) for i, u in enumerate(urls)]
    if not 1 <= len(checked) <= 200:
        raise ValueError(f"urls must hold 1 to 200 URLs, got {len(checked)}")
    body: Dict[str, Any] = {"urls": checked, "destDir": check_path("dest_dir", dest_dir)}
    if check_bool("overwrite", overwrite):
        body["overwrite"] = True
    return body


def process_body(command: Any, argv: Any, env: Any, cwd: Any, name: Any) -> Dict[str, Any]:
    """The JSON body of ``POST .../processes``, checked locally."""
    body = command_fields(command, argv)
    if env is not None:
        body["env"] = check_env(env)
        if len(body["env"]) > 64:
            raise ValueError("env may hold at most 64 variables")
    if cwd is not None:
        body["cwd"] = check_text("cwd", cwd)
    if name is not None:
        body["name"] = check_text("name", name, allow_empty=True)
        if len(name) > 64:
            raise ValueError("name must be at most 64 characters")
    return body


def output_params(offset: Any, follow: Any) -> Dict[str, Any]:
    check_int("offset", offset)
    return {"offset": offset, "follow": "true" if check_bool("follow", follow) else "false"}


def stdin_bodies(data: Any, eof: Any) -> List[Dict[str, Any]]:
    """The JSON bodies of ``POST .../stdin`` that write *data* (in order)."""
    if isinstance(data, str):
        raw = data.encode("utf-8")
        small_text = len(raw) <= STDIN_CHUNK
    elif isinstance(data, (bytes, bytearray, memoryview)):
        raw, small_text = bytes(data), False
    else:
        raise TypeError(f"data must be str or bytes, got {type(data).__name__}")
    check_bool("eof", eof)
    bodies: List[Dict[str, Any]] = []
    if small_text and raw:
        bodies.append({"data": data})
    else:
        for i in range(0, len(raw), STDIN_CHUNK):
            bodies.append({"dataBase64": base64.b64encode(raw[i : i + STDIN_CHUNK]).decode("ascii")})
    if eof:
        if bodies:
            bodies[-1]["eof"] = True
        else:
            bodies.append({"eof": True})
    return bodies


def signal_body(signal: Any) -> Dict[str, str]:
    """The JSON body of ``POST .../signal``: the name without ``SIG``."""
    if isinstance(signal, _signal.Signals):
        signal = signal.name
    if not isinstance(signal, str):
        raise TypeError(f"signal must be a signal name, got {type(signal).__name__}")
    sig = signal.upper()
    sig = sig[3:] if sig.startswith("SIG") else sig
    if sig not in SIGNALS:
        raise ValueError(f"unknown signal {signal!r}; known: {', '.join(sorted(SIGNALS))}")
    return {"signal": sig}
