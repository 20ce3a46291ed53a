#!/usr/bin/env python3
"""Row 7 of sgbench: Paramiko command latency on an open connection.

--mode sdk    sandbox_sessions_sdk.SessionSSHClient(...).run_command(cmd)
--mode plain  plain paramiko against OpenSSH sshd, doing what run_command does:
              open a session channel, exec, shut down writing, read to EOF,
              take the exit status.

Connecting is not timed. Prints one JSON object: {"samples": [seconds...],
"via": "..."} or {"skip": reason} or {"error": message}.
"""

import argparse
import base64
import json
import select
import sys
import time


def out(obj):
    sys.stdout.write(json.dumps(obj))
    sys.stdout.flush()


def run_sdk(a):
    try:
        from sandbox_sessions_sdk import SessionSSHClient  # noqa: F401
    except ImportError as e:
        try:
            from sandbox_sessions_sdk.ssh import SessionSSHClient  # noqa: F811
        except ImportError:
            return {"skip": f"sandbox_sessions_sdk.SessionSSHClient not importable yet ({e})"}
    client = SessionSSHClient(api_url=a.api_url, bearer_token=a.token, session_id=a.session, username="sandbox")
    with client as c:
        for _ in range(2):  # warm-up
            c.run_command(a.cmd)
        samples = []
        for _ in range(a.n):
            t0 = time.perf_counter()
            r = c.run_command(a.cmd)
            samples.append(time.perf_counter() - t0)
            code = r["exit_code"] if isinstance(r, dict) else getattr(r, "exit_code", 0)
            if code != 0:
                return {"error": f"run_command({a.cmd!r}) exited {code}"}
    return {"samples": samples, "via": "SDK SessionSSHClient.run_command"}


def run_plain(a):
    import paramiko

    kt, kb = a.host_key.split()[:2]
    key = paramiko.PKey.from_type_string(kt, base64.b64decode(kb))
    client = paramiko.SSHClient()
    client.get_host_keys().add(f"[{a.host}]:{a.port}", key.get_name(), key)
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    pkey = paramiko.Ed25519Key.from_private_key_file(a.key)
    client.connect(a.host, port=a.port, username=a.user, pkey=pkey, allow_agent=False, look_for_keys=False, timeout=20)
    t = client.get_transport()

    def once():
        chan = t.open_session()
        try:
            chan.exec_command(a.cmd)
            chan.shutdown_write()
            while True:
                if chan.recv_ready():
                    chan.recv(65536)
                    continue
                if chan.recv_stderr_ready():
                    chan.recv_stderr(65536)
                    continue
                if chan.eof_received or chan.closed:
                    break
                # Block until something arrives, like the SDK's select on fileno().
                select.select([chan], [], [], 0.5)
            return chan.recv_exit_status()
        finally:
            chan.close()

    try:
        for _ in range(2):
            once()
        samples = []
        for _ in range(a.n):
            t0 = time.perf_counter()
            code = once()
            samples.append(time.perf_counter() - t0)
            if code != 0:
                return {"error": f"exec {a.cmd!r} exited {code}"}
    finally:
        client.close()
    return {"samples": samples, "via": "plain paramiko"}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["sdk", "plain"], required=True)
    p.add_argument("--n", type=int, default=20)
    p.add_argument("--cmd", default="true")
    p.add_argument("--api-url")
    p.add_argument("--token")
    p.add_argument("--session")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--user")
    p.add_argument("--key")
    p.add_argument("--host-key")
    a = p.parse_args()
    try:
        import paramiko  # noqa: F401
    except ImportError:
        out({"skip": "paramiko is not installed (pip install paramiko, or the SDK with its deps)"})
        return
    try:
        out(run_sdk(a) if a.mode == "sdk" else run_plain(a))
    except Exception as e:  # report, do not traceback into the table
        out({"error": f"{type(e).__name__}: {e}"})


if __name__ == "__main__":
    main()
