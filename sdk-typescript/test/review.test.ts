// Regressions of a review of the TypeScript SDK's parity work, against a
// real gateway.

import assert from "node:assert/strict";
import { existsSync, mkdtempSync, rmSync, statSync } from "node:fs";
import * as http from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";

import { SandboxClient, SandboxConnectionError, type Session, connectRefused } from "@sandgate/sdk";

import { type Gateway, SKIP, startGateway } from "./helpers.js";

describe("review fixes", { skip: SKIP }, () => {
  let gw: Gateway;
  let client: SandboxClient;
  let session: Session;
  before(async () => {
    gw = await startGateway({ args: ["--rate-limit", "100000"] });
    client = new SandboxClient({ baseUrl: gw.url, apiKey: gw.token });
    session = await client.createSession({ ttlSeconds: 600 });
  });
  after(async () => {
    await session?.destroy().catch(() => {});
    await gw?.stop();
  });

  it("a streamed run quiet for longer than the client's timeoutMs is not killed", { timeout: 60_000 }, async () => {
    const quick = new SandboxClient({ baseUrl: gw.url, apiKey: gw.token, timeoutMs: 1000 });
    const out: string[] = [];
    const r = await quick.run(session.id, "sleep 2; echo done", { onStdout: (c) => void out.push(String(c)) });
    assert.equal(r.exitCode, 0);
    assert.deepEqual(out, ["done\n"]);
  });

  it("readFileTo into a directory throws the open's own error and leaves the directory", async () => {
    await session.writeFile("r.txt", "r");
    const dir = mkdtempSync(join(tmpdir(), "tsr-"));
    try {
      await assert.rejects(client.readFileTo(session.id, "r.txt", dir), (e: unknown) => {
        assert.equal((e as { code?: string }).code, "EISDIR", String(e));
        return true;
      });
      assert.ok(statSync(dir).isDirectory());
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("listSessions with an explicit limit or offset is one page (deprecated), without both every session", async () => {
    const made: Session[] = [];
    try {
      for (let i = 0; i < 2; i++) made.push(await client.createSession({ ttlSeconds: 600 }));
      const ids = (await client.listSessions()).map((s) => s.id);
      assert.ok(ids.length >= 3);
      assert.deepEqual((await client.listSessions({ limit: 1 })).map((s) => s.id), ids.slice(0, 1));
      assert.deepEqual((await client.listSessions({ offset: 1, limit: 1 })).map((s) => s.id), ids.slice(1, 2));
      const pages: string[][] = [];
      for await (const p of client.listSessions({ limit: 1 })) pages.push(p.map((s) => s.id));
      assert.deepEqual(pages, [ids.slice(0, 1)]);
    } finally {
      for (const s of made) await s.destroy();
    }
  });
});

describe("review fixes, without a gateway", () => {
  it("connectRefused: 401 and 403 are final even without the gateway's envelope", () => {
    for (const status of [401, 403]) {
      assert.equal(connectRefused(new SandboxConnectionError("x", { status })), false, `${status}`);
    }
    assert.equal(connectRefused(new SandboxConnectionError("x", { status: 405 })), true);
    assert.equal(connectRefused(new SandboxConnectionError("x", { status: 502 })), true, "a front's code-less 502");
  });

  it("timeouts must be finite", async () => {
    assert.throws(() => new SandboxClient({ baseUrl: "http://127.0.0.1:1", apiKey: "k", timeoutMs: Infinity }), RangeError);
    const c = new SandboxClient({ baseUrl: "http://127.0.0.1:1", apiKey: "k" });
    await assert.rejects(c.run("sbx-aaaaaaaaaaaaaaaaaaaa", "true", { timeoutMs: Infinity }), RangeError);
  });

  it("readFileTo: a stalled body fails after the client's timeout, and the partial file goes", { timeout: 60_000 }, async () => {
    // A server that sends the head and 5 bytes of 100, then nothing.
    const held: http.ServerResponse[] = [];
    const srv = http.createServer((_req, res) => {
      res.writeHead(200, { "Content-Type": "application/octet-stream", "Content-Length": "100" });
      res.write("hello");
      held.push(res);
    });
    await new Promise<void>((r) => srv.listen(0, "127.0.0.1", r));
    const dir = mkdtempSync(join(tmpdir(), "tsr-"));
    try {
      const url = `http://127.0.0.1:${(srv.address() as AddressInfo).port}`;
      const c = new SandboxClient({ baseUrl: url, apiKey: "k", timeoutMs: 1000 });
      const dest = join(dir, "f.bin");
      await assert.rejects(c.readFileTo("sbx-aaaaaaaaaaaaaaaaaaaa", "f.bin", dest), (e: unknown) => {
        assert.ok(e instanceof SandboxConnectionError, String(e));
        assert.match((e as Error).message, /stalled/);
        return true;
      });
      assert.equal(existsSync(dest), false);
    } finally {
      for (const r of held) r.destroy();
      srv.closeAllConnections();
      await new Promise((r) => srv.close(r));
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
