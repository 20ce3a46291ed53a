// A gateway that answers sessions with "isolation": "none" (its workdir
// driver) makes the SDK emit one IsolationWarning per process per gateway
// (its normalised URL), however many clients talk to it, as Python's.

import assert from "node:assert/strict";
import * as http from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, describe, it } from "node:test";

import { ISOLATION_WARNING, ISOLATION_WARNING_CODE, SandboxClient } from "@sandgate/sdk";

const SESSION = {
  sessionId: "sbx-aaaaaaaaaaaaaaaaaaaa",
  status: "running",
  image: "default",
  metadata: {},
  createdAt: "2026-01-01T00:00:00Z",
  expiresAt: "2026-01-01T01:00:00Z",
};

describe("IsolationWarning", () => {
  let server: http.Server;
  let isolation = true;
  let url = "";
  const warnings: Error[] = [];
  const onWarning = (w: Error) => {
    if (w.name === ISOLATION_WARNING) warnings.push(w);
  };
  before(async () => {
    server = http.createServer((req, res) => {
      req.resume();
      req.on("end", () => {
        const session = isolation
          ? { ...SESSION, isolation: "none", unenforced: ["memoryMiB", "cpus", "pids", "diskMiB"] }
          : SESSION;
        const body = req.url?.startsWith("/v1/sessions?")
          ? { sessions: [session], total: 1, limit: 50, offset: 0 }
          : session;
        const text = JSON.stringify(body);
        res.writeHead(req.method === "POST" ? 201 : 200, {
          "Content-Type": "application/json",
          "Content-Length": Buffer.byteLength(text),
        });
        res.end(text);
      });
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    process.on("warning", onWarning);
  });
  after(() => {
    process.off("warning", onWarning);
    server.closeAllConnections();
    server.close();
  });
  // Warnings are delivered on a later tick.
  const settle = () => new Promise((r) => setTimeout(r, 50));

  // First: once a gateway has been warned about, it is not again in this process.
  it("is not emitted by an isolating gateway", async () => {
    isolation = false;
    warnings.length = 0;
    const c = new SandboxClient({ baseUrl: url, apiKey: "tok" });
    const s = await c.createSession();
    assert.equal(s.isolation, undefined);
    await c.listSessions();
    await settle();
    assert.equal(warnings.length, 0);
  });

  it("is emitted once per process per gateway, not per client", async () => {
    isolation = true;
    warnings.length = 0;
    const a = new SandboxClient({ baseUrl: url, apiKey: "tok" });
    const s = await a.createSession();
    assert.equal(s.isolation, "none");
    await a.getSession(s.id);
    await a.listSessions();
    await a.updateSession(s.id, { ttlSeconds: 600 });
    await settle();
    assert.equal(warnings.length, 1);
    const w = warnings[0] as Error & { code?: string };
    assert.equal(w.code, ISOLATION_WARNING_CODE);
    assert.match(w.message, /"isolation": "none"/);
    assert.match(w.message, /memoryMiB/);
    // Another client of the same gateway, its URL spelled otherwise: no second warning.
    for (const other of [url, url + "/", url.replace("http://", "HTTP://")]) {
      const b = new SandboxClient({ baseUrl: other, apiKey: "tok" });
      await b.listSessions();
      await b.getSession(s.id);
    }
    await settle();
    assert.equal(warnings.length, 1);
    // Another gateway (here another name for the same server) warns once of its own.
    const port = new URL(url).port;
    for (const other of [`http://localhost:${port}`, `http://LOCALHOST:${port}/`]) {
      await new SandboxClient({ baseUrl: other, apiKey: "tok" }).listSessions();
    }
    await settle();
    assert.equal(warnings.length, 2);
    assert.match((warnings[1] as Error).message, /localhost/);
  });
});
