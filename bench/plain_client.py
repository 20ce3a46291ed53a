#!/usr/bin/env python3
"""Row 11e of bench/cmd/sgbench: the REST rows as a plain client sees them.

Python's http.client over loopback, one keep-alive connection, no SDK:
  first: POST /v1/sessions {}, then POST .../commands {"command": "true"}
         (timed together), then DELETE (timed alone);
  rtt:   POST .../commands with BODY on one session, N times (ENDPOINT
         instead of commands: python for the kernel; the first call, which
         starts the kernel or shell, is not timed).
Prints JSON: {"runs": [[seconds...], ...], "delete": [[seconds...], ...]}.

usage: plain_client.py URL TOKEN first|rtt N RUNS [BODY [ENDPOINT]]
"""
import http.client
import json
import sys
import time
import urllib.parse


def main():
    url, token, mode, n, runs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    body = sys.argv[6] if len(sys.argv) > 6 else '{"command": "true"}'
    endpoint = sys.argv[7] if len(sys.argv) > 7 else "commands"
    u = urllib.parse.urlsplit(url)
    c = http.client.HTTPConnection(u.hostname, u.port)
    h = {"Authorization": "Bearer " + token, "Content-Type": "application/json"}

    def call(method, path, b=None):
        c.request(method, path, body=b, headers=h)
        r = c.getresponse()
        d = r.read()
        if r.status >= 300:
            raise SystemExit(f"{method} {path}: {r.status} {d[:200]!r}")
        return d

    out = {"runs": [], "delete": []}
    for _ in range(runs):
        ts, ds = [], []
        if mode == "first":
            for _ in range(n):
                t0 = time.perf_counter()
                sid = json.loads(call("POST", "/v1/sessions", "{}"))["sessionId"]
                call("POST", f"/v1/sessions/{sid}/commands", body)
                t1 = time.perf_counter()
                call("DELETE", f"/v1/sessions/{sid}")
                ts.append(t1 - t0)
                ds.append(time.perf_counter() - t1)
        else:
            sid = json.loads(call("POST", "/v1/sessions", "{}"))["sessionId"]
            call("POST", f"/v1/sessions/{sid}/{endpoint}", body)
            for _ in range(n):
                t0 = time.perf_counter()
                call("POST", f"/v1/sessions/{sid}/{endpoint}", body)
                ts.append(time.perf_counter() - t0)
            call("DELETE", f"/v1/sessions/{sid}")
        out["runs"].append(ts)
        out["delete"].append(ds)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
