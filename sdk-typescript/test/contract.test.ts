// The requests the SDK sends and how it reads answers, against a fake HTTP
// server: create retries, typed errors, and the data plane's wire contract
// (this block runs without the gateway's data-plane endpoints).

import assert from "node:assert/strict";
import * as http from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, describe, it } from "node:test";

import {
  EgressNotAllowedError,
  InvalidSecretError,
  SandboxAPIError,
  SandboxClient,
  SandboxOperationError,
  UnknownSecretError,
} from "@sandgate/sdk";

interface Seen {
  method: string;
  url: string;
  headers: http.IncomingHttpHeaders;
  body: Buffer;
}

type Handler = (req: Seen, res: http.ServerResponse) => void;

const SESSION = {
  sessionId: "sbx-aaaaaaaaaaaaaaaaaaaa",
  status: "running",
  image: "default",
  metadata: {},
  createdAt: "2026-01-01T00:00:00Z",
  expiresAt: "2026-01-01T01:00:00Z",
  lastActivityAt: "2026-01-01T00:00:00Z",
  ttl: 3600,
  egress: { allow: [], bytesIn: 0, bytesOut: 0 },
  ssh: { username: "sandbox", hostKeys: [], knownHostsLine: "", connectPath: "/v1/sessions/sbx-aaaaaaaaaaaaaaaaaaaa" },
};

function json(res: http.ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(text), ...headers });
  res.end(text);
}

describe("wire contract (fake server)", () => {
  let server: http.Server;
  let seen: Seen[] = [];
  let handler: Handler = () => {};
  let client: SandboxClient;
  before(async () => {
    server = http.createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", () => {
        const s = { method: req.method ?? "", url: req.url ?? "", headers: req.headers, body: Buffer.concat(chunks) };
        seen.push(s);
        handler(s, res);
      });
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    client = new SandboxClient({ baseUrl: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`, apiKey: "tok" });
  });
  after(() => {
    server.closeAllConnections();
    server.close();
  });
  const reset = (h: Handler) => {
    seen = [];
    handler = h;
  };

  it("createSession sends ttl and an Idempotency-Key, and retries 5xx with the same key", async () => {
    let n = 0;
    reset((_req, res) => (++n < 3 ? json(res, 503, { error: { code: "unavailable", message: "busy" } }) : json(res, 201, SESSION)));
    const s = await client.createSession({ ttlSeconds: 120, metadata: { a: 1 }, egress: ["pypi.org"] });
    assert.equal(s.id, SESSION.sessionId);
    assert.equal(seen.length, 3);
    const keys = seen.map((r) => r.headers["idempotency-key"]);
    assert.match(String(keys[0]), /^[0-9a-f-]{36}$/);
    assert.ok(keys.every((k) => k === keys[0]));
    assert.equal(seen[0]?.url, "/v1/sessions");
    assert.equal(seen[0]?.headers["authorization"], "Bearer tok");
    assert.deepEqual(JSON.parse(seen[0]?.body.toString() ?? ""), { ttl: 120, metadata: { a: 1 }, egress: ["pypi.org"] });
  });

  it("createSession does not retry an image pull past its deadline or a full image store", async () => {
    for (const [status, code] of [
      [502, "image_pull_timeout"],
      [503, "image_store_full"],
    ] as const) {
      reset((_req, res) => json(res, status, { error: { code, message: "no" } }));
      const e = await client.createSession({ image: "python:3" }).then(
        () => assert.fail("no error"),
        (err: unknown) => err,
      );
      assert.ok(e instanceof SandboxAPIError && e.code === code, String(e));
      assert.equal(seen.length, 1);
    }
  });

  it("createSession does not retry a 4xx, and maps typed 400 codes", async () => {
    for (const [code, message, cls] of [
      ["egress_not_allowed", 'egress not allowed by this gateway: "evil.com"', EgressNotAllowedError],
      ["unknown_secret", "unknown secrets: A, B", UnknownSecretError],
      ["invalid_secret", "bad", InvalidSecretError],
    ] as const) {
      reset((_req, res) => json(res, 400, { error: { code, message } }));
      const e = await client.createSession().then(
        () => assert.fail("no error"),
        (err: unknown) => err,
      );
      assert.ok(e instanceof cls && e instanceof SandboxOperationError, String(e));
      assert.equal(seen.length, 1);
      if (e instanceof EgressNotAllowedError) assert.deepEqual(e.entries, ["evil.com"]);
      if (e instanceof UnknownSecretError) assert.deepEqual(e.names, ["A", "B"]);
    }
  });

  it("exec: a one-shot command's request, and the answer with base64 streams and a timeout", async () => {
    reset((_req, res) => json(res, 200, SESSION));
    const s = await client.getSession(SESSION.sessionId);
    seen = [];
    handler = (_req, res) =>
      json(res, 200, {
        exitCode: 0,
        stdoutBase64: Buffer.from([0xff, 0x41]).toString("base64"),
        stderr: "e",
        truncated: false,
        timedOut: false,
        durationMs: 5,
        cwd: "/workspace/x",
      });
    const r = await s.exec("cd x", { timeoutMs: 1500 });
    assert.equal(seen[0]?.method, "POST");
    assert.equal(seen[0]?.url, `/v1/sessions/${SESSION.sessionId}/commands`);
    // exec is a fresh process each time (no shell), as Python's run.
    assert.deepEqual(JSON.parse(seen[0]?.body.toString() ?? ""), { command: "cd x", timeout: 1.5 });
    seen = [];
    await s.shell().run("cd x", { timeoutMs: 1500 });
    assert.deepEqual(JSON.parse(seen[0]?.body.toString() ?? ""), { command: "cd x", timeout: 1.5, shell: "default" });
    seen = [];
    await s.exec(undefined, { argv: ["ls", "-l"], stdin: new Uint8Array([0, 1]), env: { LANG: "C" }, cwd: "sub", maxOutputBytes: 10 });
    assert.deepEqual(JSON.parse(seen[0]?.body.toString() ?? ""), {
      argv: ["ls", "-l"],
      stdinBase64: "AAE=",
      env: { LANG: "C" },
      cwd: "sub",
      maxOutputBytes: 10,
    });
    assert.deepEqual([...r.stdoutBytes], [0xff, 0x41]);
    assert.equal(r.stdout, "\ufffdA");
    assert.equal(r.output, "\ufffdAe");
    assert.equal(r.cwd, "/workspace/x");
    assert.equal(r.durationMs, 5);
    assert.equal(r.stateLost, false);

    reset((_req, res) => json(res, 200, { exitCode: 137, stdout: "", stderr: "", timedOut: true, truncated: false, durationMs: 1000, cwd: "/" }));
    assert.equal((await s.exec("sleep 9", { timeoutMs: 1000 })).exitCode, 124);
    // The first command in a shell that replaced a lost one says so.
    reset((_req, res) => json(res, 200, { exitCode: 0, stdout: "", stderr: "", timedOut: false, truncated: false, durationMs: 1, cwd: "/", stateLost: true }));
    assert.equal((await s.exec("true")).stateLost, true);
  });

  it("write and read: query, raw body, Range", async () => {
    reset((_req, res) => json(res, 200, SESSION));
    const s = await client.getSession(SESSION.sessionId);
    reset((_req, res) => json(res, 200, { path: "a b/c", size: 3 }));
    await s.write("a b/c", new Uint8Array([1, 2, 3]));
    assert.equal(seen[0]?.method, "PUT");
    assert.equal(seen[0]?.url, `/v1/sessions/${SESSION.sessionId}/files?path=a+b%2Fc&mkdirs=true`);
    assert.deepEqual([...(seen[0]?.body ?? [])], [1, 2, 3]);

    reset((req, res) => {
      const range = req.headers["range"];
      res.writeHead(range ? 206 : 200, { "Content-Type": "application/octet-stream" });
      res.end(range ? "01" : "0123");
    });
    assert.equal(Buffer.from(await s.read("f")).toString(), "0123");
    assert.equal(seen[0]?.url, `/v1/sessions/${SESSION.sessionId}/files?path=f`);
    assert.equal(seen[0]?.headers["range"], undefined);
    assert.equal(Buffer.from(await s.read("f", { maxBytes: 2 })).toString(), "01");
    assert.equal(seen[1]?.headers["range"], "bytes=0-1");

    reset((_req, res) => json(res, 501, { error: { code: "not_implemented", message: "not implemented yet" } }));
    await assert.rejects(s.read("f"), (e: unknown) => e instanceof SandboxOperationError && e.status === 501 && e.code === "not_implemented");
  });
});
