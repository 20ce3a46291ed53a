"""REST files against the real gateway: read_file, read_file_to, write_file,
list_files, delete_file, fetch_urls."""

from __future__ import annotations

import hashlib
import io
import os
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest
from conftest import Gateway, start_gateway

from sandbox_sessions_sdk import (
    FileList,
    FileNotFoundInSandboxError,
    SandboxOperationError,
    SandboxPermissionError,
    Session,
    SessionNotFoundError,
    SessionsClient,
)
from sandbox_sessions_sdk._dataplane import CHUNK_BYTES


def test_round_trip(client: SessionsClient, session: Session) -> None:
    sid = session.session_id
    entry = client.write_file(sid, "a/b/hello.txt", "héllo\n")
    assert entry["name"] == "hello.txt" and entry["path"] == "a/b/hello.txt"
    assert entry["type"] == "file" and entry["sizeBytes"] == len("héllo\n".encode())
    assert client.read_file(sid, "a/b/hello.txt") == "héllo\n".encode()
    # The sandbox sees it where commands run.
    assert client.run(sid, "cat a/b/hello.txt").stdout == "héllo\n"
    data = bytes(range(256)) * 100
    assert client.write_file(sid, "bin.dat", data, mode=0o600)["mode"] == "0600"
    assert client.read_file(sid, "bin.dat") == data
    # Replacing keeps the mode unless given; a str mode works too.
    assert client.write_file(sid, "bin.dat", b"new")["mode"] == "0600"
    assert client.write_file(sid, "bin.dat", bytearray(b"x"), mode="755")["mode"] == "0755"
    assert client.read_file(sid, "bin.dat") == b"x"
    # Empty files.
    assert client.write_file(sid, "empty", b"")["sizeBytes"] == 0
    assert client.read_file(sid, "empty") == b""
    assert client.read_file(sid, "empty", max_bytes=10) == b""
    # Absolute paths resolve inside the sandbox.
    pwd = client.run(sid, "pwd").stdout.strip()
    assert client.read_file(sid, pwd + "/a/b/hello.txt") == "héllo\n".encode()


def test_max_bytes(client: SessionsClient, session: Session) -> None:
    sid = session.session_id
    client.write_file(sid, "digits", b"0123456789")
    assert client.read_file(sid, "digits", max_bytes=4) == b"0123"
    assert client.read_file(sid, "digits", max_bytes=10) == b"0123456789"
    assert client.read_file(sid, "digits", max_bytes=100) == b"0123456789"
    with pytest.raises(ValueError):
        client.read_file(sid, "digits", max_bytes=0)


class _Reader(io.RawIOBase):
    """A binary stream that makes its bytes as they are read and records the
    read sizes, optionally without fileno/seek (a pipe's view)."""

    def __init__(self, size: int, seekable: bool) -> None:
        self._size = size
        self._pos = 0
        self._seekable = seekable
        self.largest_read = 0
        self.digest = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self._seekable

    def tell(self) -> int:
        if not self._seekable:
            raise io.UnsupportedOperation("tell")
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        if not self._seekable:
            raise io.UnsupportedOperation("seek")
        self._pos = {0: offset, 1: self._pos + offset, 2: self._size + offset}[whence]
        return self._pos

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            raise AssertionError("the SDK read the whole file at once")
        self.largest_read = max(self.largest_read, n)
        n = min(n, self._size - self._pos)
        chunk = bytes((self._pos + i) % 251 for i in range(min(n, 4096))) * (n // 4096 + 1)
        chunk = chunk[:n]
        self._pos += n
        self.digest.update(chunk)
        return chunk


def test_large_streamed_write_and_read_to(
    client: SessionsClient, session: Session, local_dir: Path, tmp_path: Path
) -> None:
    sid = session.session_id
    size = 50 * 1000 * 1000
    src = tmp_path / "big.bin"
    with open(src, "wb") as f:
        chunk = os.urandom(1 << 20)
        left = size
        while left:
            f.write(chunk[: min(left, len(chunk))])
            left -= min(left, len(chunk))
    want = hashlib.sha256(src.read_bytes()).hexdigest()
    with open(src, "rb") as f:
        entry = client.write_file(sid, "big/big.bin", f)
    assert entry["sizeBytes"] == size
    dest = local_dir / "back.bin"
    assert client.read_file_to(sid, "big/big.bin", dest) == size
    assert hashlib.sha256(dest.read_bytes()).hexdigest() == want
    # Into a file object.
    buf = io.BytesIO()
    assert client.read_file_to(sid, "big/big.bin", buf) == size
    assert hashlib.sha256(buf.getvalue()).hexdigest() == want
    # A file object is read a chunk at a time, seekable (Content-Length) or not (chunked).
    for seekable in (True, False):
        reader = _Reader(12 * 1000 * 1000 + 7, seekable)
        entry = client.write_file(sid, f"gen-{seekable}.bin", reader)
        assert entry["sizeBytes"] == 12 * 1000 * 1000 + 7
        assert 0 < reader.largest_read <= CHUNK_BYTES
        out = io.BytesIO()
        client.read_file_to(sid, f"gen-{seekable}.bin", out)
        assert hashlib.sha256(out.getvalue()).hexdigest() == reader.digest.hexdigest()
    # A text file object is sent as UTF-8.
    client.write_file(sid, "text.txt", io.StringIO("ünïcode\n" * 3))
    assert client.read_file(sid, "text.txt") == ("ünïcode\n" * 3).encode()


def test_read_file_to_missing_leaves_no_local_file(client: SessionsClient, session: Session, local_dir: Path) -> None:
    dest = local_dir / "nothing"
    with pytest.raises(FileNotFoundInSandboxError):
        client.read_file_to(session.session_id, "no-such-file", dest)
    assert not dest.exists()
    with pytest.raises(TypeError):
        client.read_file_to(session.session_id, "x", 3)  # type: ignore[arg-type]


def test_list_files(client: SessionsClient, session: Session) -> None:
    sid = session.session_id
    client.write_file(sid, "tree/a.txt", b"a")
    client.write_file(sid, "tree/sub/b.txt", b"bb")
    client.write_file(sid, "tree/sub/deeper/c.txt", b"ccc")
    top = client.list_files(sid, "tree")
    assert isinstance(top, FileList) and top.truncated is False
    assert sorted((e["name"], e["type"]) for e in top) == [("a.txt", "file"), ("sub", "dir")]
    assert {e["path"] for e in top} == {"tree/a.txt", "tree/sub"}
    every = client.list_files(sid, "tree", recursive=True)
    assert every.truncated is False
    paths = {e["path"]: e for e in every}
    assert set(paths) == {"tree/a.txt", "tree/sub", "tree/sub/b.txt", "tree/sub/deeper", "tree/sub/deeper/c.txt"}
    assert paths["tree/sub/deeper/c.txt"]["sizeBytes"] == 3
    assert paths["tree/a.txt"]["mode"] == "0644" and "mtime" in paths["tree/a.txt"]
    # The default lists the workspace.
    assert "tree" in {e["name"] for e in client.list_files(sid)}
    with pytest.raises(SandboxOperationError) as ei:
        client.list_files(sid, "tree/a.txt")
    assert ei.value.code == "not_a_directory"
    with pytest.raises(FileNotFoundInSandboxError):
        client.list_files(sid, "no-such-dir")


def test_delete_file(client: SessionsClient, session: Session) -> None:
    sid = session.session_id
    client.write_file(sid, "del/one.txt", b"1")
    client.write_file(sid, "del/sub/two.txt", b"2")
    assert client.delete_file(sid, "del/one.txt") is None
    with pytest.raises(FileNotFoundInSandboxError):
        client.read_file(sid, "del/one.txt")
    with pytest.raises(SandboxOperationError) as ei:
        client.delete_file(sid, "del")
    assert ei.value.code == "directory_not_empty" and ei.value.status_code == 409
    client.delete_file(sid, "del", recursive=True)
    assert "del" not in {e["name"] for e in client.list_files(sid)}
    with pytest.raises(FileNotFoundInSandboxError):
        client.delete_file(sid, "del")
    with pytest.raises(SandboxOperationError) as ei:
        client.delete_file(sid, ".", recursive=True)  # the workspace itself
    assert ei.value.code == "invalid_path"


def test_file_errors(client: SessionsClient, session: Session) -> None:
    sid = session.session_id
    with pytest.raises(FileNotFoundInSandboxError) as ei:
        client.read_file(sid, "missing/file.txt")
    e = ei.value
    # A SandboxOperationError and a FileNotFoundError at once, with the path.
    assert isinstance(e, SandboxOperationError) and isinstance(e, FileNotFoundError)
    assert e.code == "file_not_found" and e.status_code == 404 and e.filename == "missing/file.txt"
    with pytest.raises(FileNotFoundError):
        client.write_file(sid, "no/parent/x.txt", b"x", mkdirs=False)
    client.write_file(sid, "dir/f", b"f")
    with pytest.raises(SandboxOperationError) as ei2:
        client.read_file(sid, "dir")
    assert ei2.value.code == "is_a_directory"
    with pytest.raises(SandboxOperationError) as ei2:
        client.write_file(sid, "dir", b"x")
    assert ei2.value.code == "is_a_directory"
    with pytest.raises(SandboxOperationError) as ei2:
        client.write_file(sid, "dir/f/under-a-file", b"x")
    assert ei2.value.code == "not_a_directory"
    # Only the sandbox's root: a path outside it is not the host's.
    with pytest.raises((FileNotFoundInSandboxError, SandboxPermissionError)):
        client.read_file(sid, "/../../../../etc/no-such-host-file")
    # Another tenant's (or no) session.
    with pytest.raises(SessionNotFoundError):
        client.read_file("sbx-doesnotexist", "x")


def test_file_argument_checks(client: SessionsClient) -> None:
    sid = "sbx-doesnotexist"  # a request would raise SessionNotFoundError
    for exc, call in [
        (ValueError, lambda: client.read_file(sid, "")),
        (ValueError, lambda: client.read_file(sid, "a\x00b")),
        (ValueError, lambda: client.read_file(sid, "a" * 4097)),
        (TypeError, lambda: client.read_file(sid, b"x")),  # type: ignore[arg-type]
        (TypeError, lambda: client.read_file(sid, "x", max_bytes="1")),  # type: ignore[arg-type]
        (TypeError, lambda: client.write_file(sid, "x", 123)),  # type: ignore[arg-type]
        (ValueError, lambda: client.write_file(sid, "x", b"", mode="999")),
        (ValueError, lambda: client.write_file(sid, "x", b"", mode=0o1777)),
        (TypeError, lambda: client.write_file(sid, "x", b"", mode=True)),
        (TypeError, lambda: client.write_file(sid, "x", b"", mkdirs="yes")),  # type: ignore[arg-type]
        (TypeError, lambda: client.list_files(sid, ".", recursive=1)),  # type: ignore[arg-type]
        (TypeError, lambda: client.delete_file(sid, ".", recursive=None)),  # type: ignore[arg-type]
        (TypeError, lambda: client.fetch_urls(sid, "http://x/")),
        (ValueError, lambda: client.fetch_urls(sid, [])),
        (ValueError, lambda: client.fetch_urls(sid, ["http://x/"] * 201)),
        (TypeError, lambda: client.fetch_urls(sid, [1])),  # type: ignore[list-item]
        (ValueError, lambda: client.fetch_urls(sid, ["http://x/"], dest_dir="")),
    ]:
        with pytest.raises(exc):
            call()
    with pytest.raises(SessionNotFoundError):
        client.list_files(sid)


# -- fetch -------------------------------------------------------------------


class _Files(BaseHTTPRequestHandler):
    files: Dict[str, bytes] = {}

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = self.files.get(self.path.split("?", 1)[0])
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        if self.path.startswith("/named"):
            self.send_header("Content-Disposition", 'attachment; filename="report.csv"')
        if self.path.startswith("/dotted"):
            self.send_header("Content-Disposition", 'attachment; filename=".bashrc"')
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def file_server() -> Iterator[str]:
    """An HTTP server on 127.0.0.2 (a non-public address the gateway refuses unless allowed)."""
    try:
        server = ThreadingHTTPServer(("127.0.0.2", 0), _Files)
    except OSError as e:
        pytest.skip(f"cannot listen on 127.0.0.2: {e}")
    _Files.files = {"/data/one.txt": b"one\n", "/data/two.bin": bytes(range(256)), "/named": b"a,b\n", "/dotted": b"evil\n"}
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.2:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def fetch_gateway(sandgate_bin: str, scratch: Path) -> Iterator[Gateway]:
    """A gateway whose fetches (and egress) may reach 127.0.0.2."""
    gw = start_gateway(sandgate_bin, scratch, "--egress-allow-cidr", "127.0.0.2/32")
    try:
        yield gw
    finally:
        gw.stop()


@pytest.fixture
def fetch_session(fetch_gateway: Gateway) -> Iterator[tuple]:
    with SessionsClient(fetch_gateway.url, fetch_gateway.token) as c:
        s = c.create_session(ttl=600)
        try:
            yield c, s.session_id
        finally:
            c.delete_session(s.session_id)


def test_fetch_urls(fetch_session: tuple, file_server: str) -> None:
    client, sid = fetch_session
    res = client.fetch_urls(sid, [f"{file_server}/data/one.txt", f"{file_server}/data/two.bin", f"{file_server}/named"])
    assert res["status"] == "success" and res["errors"] == []
    assert [p.rsplit("/", 1)[-1] for p in res["fetched"]] == ["one.txt", "two.bin", "report.csv"]
    assert client.read_file(sid, "one.txt") == b"one\n"
    assert client.read_file(sid, "two.bin") == bytes(range(256))
    assert client.read_file(sid, "report.csv") == b"a,b\n"
    # Into a directory, created; one failure does not stop the others.
    res = client.fetch_urls(sid, [f"{file_server}/data/one.txt", f"{file_server}/missing"], dest_dir="dl/x")
    assert res["status"] == "partial_success"
    assert res["fetched"] == ["dl/x/one.txt"]
    assert [e["url"] for e in res["errors"]] == [f"{file_server}/missing"] and res["errors"][0]["error"]
    assert client.read_file(sid, "dl/x/one.txt") == b"one\n"
    with pytest.raises(SandboxOperationError) as ei:
        client.fetch_urls(sid, ["ftp://example.com/x"])
    assert ei.value.code == "invalid_url"


def test_fetch_urls_never_replaces(fetch_session: tuple, file_server: str) -> None:
    client, sid = fetch_session
    client.write_file(sid, "one.txt", b"mine\n")
    client.write_file(sid, ".bashrc", b"# mine\n")
    res = client.fetch_urls(sid, [f"{file_server}/data/one.txt", f"{file_server}/dotted"])
    assert res["status"] == "success" and res["fetched"] == ["one-1.txt", "bashrc"]
    assert client.read_file(sid, "one.txt") == b"mine\n"
    assert client.read_file(sid, ".bashrc") == b"# mine\n"
    assert client.read_file(sid, "one-1.txt") == b"one\n"
    res = client.fetch_urls(sid, [f"{file_server}/data/one.txt"], overwrite=True)
    assert res["fetched"] == ["one.txt"]
    assert client.read_file(sid, "one.txt") == b"one\n"
    with pytest.raises(TypeError):
        client.fetch_urls(sid, [f"{file_server}/data/one.txt"], overwrite="yes")  # type: ignore[arg-type]


def test_fetch_refuses_non_public_addresses(client: SessionsClient, session: Session, file_server: str) -> None:
    # The default gateway has no --egress-allow-cidr: 127.0.0.2 is refused.
    res = client.fetch_urls(session.session_id, [f"{file_server}/data/one.txt"])
    assert res["status"] == "failure" and res["fetched"] == [] and len(res["errors"]) == 1
    with pytest.raises(FileNotFoundInSandboxError):
        client.read_file(session.session_id, "one.txt")


def _free_port_closed() -> Optional[int]:
    s = socket.socket()
    s.bind(("127.0.0.2", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_fetch_failure_status(fetch_session: tuple) -> None:
    client, sid = fetch_session
    port = _free_port_closed()
    res = client.fetch_urls(sid, [f"http://127.0.0.2:{port}/nothing-listens"])
    assert res["status"] == "failure" and res["fetched"] == []
    errors: List[Dict[str, str]] = res["errors"]
    assert len(errors) == 1 and errors[0]["url"].endswith("/nothing-listens")
