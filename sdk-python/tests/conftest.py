"""Fixtures: a real sandgate binary on loopback.

The binary comes from ``$SANDGATE_BIN``, or is built with ``go build`` from
the repository root. When neither works the tests fail under ``CI=true``
and are skipped elsewhere.
"""

from __future__ import annotations

import functools
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Mapping, Optional, Sequence

import pytest

from sandbox_sessions_sdk import Session, SessionNotFoundError, SessionsClient, SessionSSHClient

REPO_ROOT = Path(__file__).resolve().parents[2]
SDK_ROOT = Path(__file__).resolve().parents[1]

# Loopback must never go through a proxy from the environment.
os.environ["NO_PROXY"] = os.environ["no_proxy"] = "127.0.0.1,localhost,::1"
for _name in ("SANDBOX_API_URL", "SANDBOX_API_TOKEN"):
    os.environ.pop(_name, None)


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def fail_or_skip(msg: str) -> None:
    """Missing prerequisites fail the run in CI and skip the tests locally."""
    if in_ci():
        pytest.fail(msg, pytrace=False)
    pytest.skip(msg)


@dataclass
class Gateway:
    """A running sandgate serve process."""

    url: str
    token: str
    proc: subprocess.Popen
    data_dir: str
    log_path: str
    other_token: Optional[str] = None
    tokens: List[str] = field(default_factory=list)

    def log(self) -> str:
        try:
            return Path(self.log_path).read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM, wait, and make sure the gateway and everything it started are gone.

        Leftovers (processes the gateway had started, mounts under its data
        dir) fail the test run; they are then removed so that the machine
        stays clean.
        """
        started = descendants(self.proc.pid)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
                raise AssertionError(
                    f"sandgate did not exit within 20s of SIGTERM; log:\n{self.log()[-4000:]}"
                ) from None
        assert self.proc.returncode is not None, "sandgate still running"
        problems = []
        deadline = time.monotonic() + 5
        left = {p: st for p, st in started.items() if alive(p, st)}
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            left = {p: st for p, st in left.items() if alive(p, st)}
        if left:
            problems.append("processes outlived the gateway: " + ", ".join(f"{p} {cmdline(p)!r}" for p in left))
            for p in left:
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
        mounts = mounts_under(self.data_dir)
        if mounts:
            problems.append("mounts outlived the gateway: " + ", ".join(mounts))
            for m in reversed(mounts):
                subprocess.run(["umount", "-l", m], capture_output=True)
        if problems:
            raise AssertionError("; ".join(problems))


def _stat_fields(pid: int) -> Optional[List[str]]:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode(errors="replace")
    except OSError:
        return None
    # The fields after "(comm)": state is [0], ppid [1], starttime [19].
    return data.rsplit(")", 1)[1].split()


def descendants(root: int) -> Dict[int, str]:
    """Live descendants of *root*: pid -> start time (to tell reused pids apart)."""
    children: Dict[int, List[int]] = {}
    starts: Dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat_fields(int(entry))
        if fields is None or fields[0] == "Z":
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
        starts[int(entry)] = fields[19]
    out: Dict[int, str] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid in out or pid not in starts:
            continue
        out[pid] = starts[pid]
        todo += children.get(pid, [])
    return out


def alive(pid: int, start: str) -> bool:
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z" and fields[19] == start


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def mounts_under(path: str) -> List[str]:
    """Mount points at or below *path* in this mount namespace."""
    root = os.path.realpath(path)
    found = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                point = line.split()[4].replace("\\040", " ")
                if point == root or point.startswith(root + "/"):
                    found.append(point)
    except OSError:
        pass
    return found


@functools.lru_cache(maxsize=None)
def serve_help(binary: str) -> str:
    """The text of `sandgate serve --help`, to pass flags only where they exist."""
    res = subprocess.run([binary, "serve", "--help"], capture_output=True, text=True, timeout=30)
    return res.stdout + res.stderr


@pytest.fixture(scope="session")
def scratch() -> Iterator[Path]:
    """One temp dir for the whole run, removed at the end."""
    d = Path(tempfile.mkdtemp(prefix="sandgate-sdk-tests-"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def sandgate_bin(scratch: Path) -> str:
    env_bin = os.environ.get("SANDGATE_BIN")
    if env_bin:
        if os.path.isfile(env_bin) and os.access(env_bin, os.X_OK):
            return env_bin
        fail_or_skip(f"SANDGATE_BIN={env_bin} is not an executable file")
    go = shutil.which("go")
    if go is None or not (REPO_ROOT / "go.mod").is_file():
        fail_or_skip("no sandgate binary: set SANDGATE_BIN or install Go to build it")
    out = scratch / "sandgate"
    try:
        res = subprocess.run(
            [go, "build", "-o", str(out), "./cmd/sandgate"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
    except subprocess.TimeoutExpired:
        fail_or_skip("go build of sandgate timed out")
    if res.returncode != 0:
        fail_or_skip(f"go build of sandgate failed:\n{res.stderr[-4000:]}")
    return str(out)


def start_gateway(
    binary: str,
    base: Path,
    *extra: str,
    keys: Optional[List[str]] = None,
    scheme: str = "http",
    secrets_file: Optional[Mapping[str, str]] = None,
    egress_allow: Sequence[str] = (),
) -> Gateway:
    """Start sandgate serve on a free loopback port and wait until it listens.

    The kernel picks the port (``--listen 127.0.0.1:0``) and the gateway
    writes its URL to ``--ready-file`` once the listener is bound.
    *keys* are ``--api-key`` values (``key`` or ``tenant:key``); use
    ``scheme="https"`` together with ``--tls-cert``/``--tls-key`` in *extra*.
    *secrets_file* maps ``NAME`` (or ``tenant/NAME``) to a value: they are
    written to a file (mode 0600) passed as ``--secrets-file``.
    *egress_allow* are ``--egress-allow`` patterns (none: the gateway's
    default, any public host).
    """
    keys = keys or [secrets.token_hex(16)]
    data_dir = tempfile.mkdtemp(prefix="gw-", dir=base)
    log_path = os.path.join(data_dir, "sandgate.log")
    ready_path = os.path.join(data_dir, "ready")
    args = [binary, "serve", "--listen", "127.0.0.1:0", "--data-dir", os.path.join(data_dir, "data")]
    args += ["--ready-file", ready_path]
    for k in keys:
        args += ["--api-key", k]
    if secrets_file is not None:
        path = os.path.join(data_dir, "secrets")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.writelines(f"{name}={value}\n" for name, value in secrets_file.items())
        args += ["--secrets-file", path]
    for pattern in egress_allow:
        args += ["--egress-allow", pattern]
    if "-keep-sandboxes-on-exit" in serve_help(binary):
        # Its default keeps linux sandboxes running for the next start.
        args.append("--keep-sandboxes-on-exit=false")
    args += list(extra)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    gw = Gateway(url="", token=keys[0].split(":", 1)[-1], proc=proc, data_dir=data_dir, log_path=log_path)
    gw.tokens = [k.split(":", 1)[-1] for k in keys]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            # Written whole (temp file, then rename): present means complete.
            gw.url = Path(ready_path).read_text().strip()
        except FileNotFoundError:
            time.sleep(0.02)
            continue
        if not gw.url.startswith(scheme + "://"):
            gw.stop()
            raise RuntimeError(f"sandgate serves {gw.url}, expected {scheme}://")
        return gw
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)
    raise RuntimeError(f"sandgate did not get ready; log:\n{gw.log()[-4000:]}")


@pytest.fixture(scope="session")
def gateway(sandgate_bin: str, scratch: Path) -> Iterator[Gateway]:
    """The main gateway: tenant 'default' (gw.token) and tenant 'other' (gw.other_token)."""
    main, other = secrets.token_hex(16), secrets.token_hex(16)
    gw = start_gateway(sandgate_bin, scratch, "--rate-limit", "100000", keys=[main, f"other:{other}"])
    gw.other_token = other
    try:
        yield gw
    finally:
        gw.stop()


@pytest.fixture
def client(gateway: Gateway) -> Iterator[SessionsClient]:
    with SessionsClient(api_url=gateway.url, bearer_token=gateway.token) as c:
        yield c


@pytest.fixture
def session(client: SessionsClient) -> Iterator[Session]:
    """A fresh session (create response, so its password is set), deleted afterwards."""
    s = client.create_session(ttl=600, metadata={"test": "sdk"})
    try:
        yield s
    finally:
        try:
            client.delete_session(s.session_id)
        except SessionNotFoundError:
            pass


@pytest.fixture
def ssh(gateway: Gateway, session: Session) -> Iterator[SessionSSHClient]:
    with SessionSSHClient(
        api_url=gateway.url, bearer_token=gateway.token, session_id=session.session_id, username="sandbox"
    ) as c:
        yield c


@pytest.fixture
def local_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="sdk-test-local-"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def processes_matching(needle: str) -> List[int]:
    """PIDs on this host whose command line contains *needle* (the workdir
    driver runs sandbox processes as host processes)."""
    pids = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{entry}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in cmd and state != b"Z":
            pids.append(int(entry))
    return pids


def wait_present(needle: str, within: float = 5.0) -> List[int]:
    """Wait until some process matches *needle*; return the matches. A
    command whose first output has arrived may still be in its ``exec``,
    when its ``/proc`` command line reads empty for a moment."""
    deadline = time.monotonic() + within
    found = processes_matching(needle)
    while not found and time.monotonic() < deadline:
        time.sleep(0.02)
        found = processes_matching(needle)
    return found


def wait_gone(needle: str, within: float = 5.0) -> List[int]:
    """Wait until no process matches *needle*; return what is left."""
    deadline = time.monotonic() + within
    left = processes_matching(needle)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = processes_matching(needle)
    return left


def echo_from_threads(ssh: SessionSSHClient, threads: int = 3, each: int = 15) -> "Callable[[], Optional[BaseException]]":
    """Start *threads* threads that each run *each* quick ``echo`` commands
    on *ssh* and check their output; return a function that waits for them
    and returns the first error (None when all passed)."""
    errors: List[BaseException] = []

    def work(k: int) -> None:
        try:
            for i in range(each):
                r = ssh.run_command(f"echo {k}-{i}")
                assert r["stdout"] == f"{k}-{i}\n", r
        except BaseException as e:  # returned by finish
            errors.append(e)

    started = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for t in started:
        t.start()

    def finish() -> Optional[BaseException]:
        for t in started:
            t.join(60)
        return errors[0] if errors else None

    return finish
