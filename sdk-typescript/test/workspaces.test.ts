// Workspaces, snapshots, stats, port links and the audit trail against a real gateway.

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import http from "node:http";
import { createServer } from "node:net";
import { after, before, describe, it } from "node:test";

import {
  SandboxClient,
  SnapshotNotFoundError,
  WorkspaceBusyError,
  WorkspaceExistsError,
  WorkspaceNotFoundError,
} from "@sandgate/sdk";

import { type Gateway, SKIP, startGateway } from "./helpers.js";

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.once("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const addr = srv.address();
      srv.close(() => resolve(typeof addr === "object" && addr ? addr.port : 0));
    });
  });
}

describe("workspaces, snapshots, stats, ports, audit", { skip: SKIP }, () => {
  let gw: Gateway;
  let client: SandboxClient;
  before(async () => {
    gw = await startGateway({ args: ["--rate-limit", "100000"] });
    client = new SandboxClient({ baseUrl: gw.url, apiKey: gw.token });
  });
  after(async () => {
    await gw?.stop();
  });

  it("checks arguments before sending", async () => {
    await assert.rejects(client.createSession({ workspace: "w", fromSnapshot: "snap_x" }), TypeError);
    await assert.rejects(client.createWorkspace("-lead"), TypeError);
    await assert.rejects(client.createWorkspace("a..b"), TypeError);
    await assert.rejects(client.deleteSession("sbx-x", { discard: "yes" as unknown as boolean }), TypeError);
    await assert.rejects(client.portLink("sbx-x", 70000), RangeError);
    await assert.rejects(client.listAudit({ limit: 0 }), RangeError);
    assert.equal(client.previewUrl("sbx-a", 8080), `${gw.url}/v1/sessions/sbx-a/ports/8080/`);
  });

  it("reads a session's timeline, by kind and after a seq", async () => {
    const s = await client.createSession({ ttlSeconds: 300 });
    try {
      await s.exec("echo on-the-timeline");
      await s.write("t.txt", "t");
      const page = await client.sessionTimeline(s.id);
      assert.ok(page.events.length > 0);
      assert.ok(page.events.every((e) => e.session === s.id && ["command", "egress", "file", "session"].includes(e.kind)));
      assert.ok(page.events.some((e) => e.kind === "command" && String(e["command"]).includes("on-the-timeline")));
      const seqs = page.events.map((e) => e.seq);
      assert.deepEqual(seqs, [...seqs].sort((x, y) => y - x));
      const files = await client.sessionTimeline(s.id, { kind: "file" });
      assert.ok(files.events.length > 0 && files.events.every((e) => e.kind === "file"));
      const newest = Math.max(...seqs);
      assert.deepEqual((await client.sessionTimeline(s.id, { after: newest })).events, []);
      await s.exec("echo later");
      const newer = await client.sessionTimeline(s.id, { after: newest, kind: ["command"] });
      assert.deepEqual(newer.events.map((e) => e["command"]), ["echo later"]);
      await assert.rejects(client.sessionTimeline(s.id, { kind: "rest" as never }), RangeError);
      await assert.rejects(client.sessionTimeline(s.id, { kind: [] }), RangeError);
      await assert.rejects(client.sessionTimeline(s.id, { limit: 1001 }), RangeError);
      await assert.rejects(client.sessionTimeline(s.id, { after: -1 }), RangeError);
    } finally {
      await s.destroy();
    }
  });

  it("ends a session without saving its workspace with discard", async () => {
    const name = `ts-${randomBytes(6).toString("hex")}`;
    await client.createWorkspace(name);
    const a = await client.createSession({ ttlSeconds: 300, workspace: name });
    await a.write("kept.txt", "v1");
    await a.destroy();
    const b = await client.createSession({ ttlSeconds: 300, workspace: name });
    await b.write("kept.txt", "v2");
    await b.destroy({ discard: true });
    const c = await client.createSession({ ttlSeconds: 300, workspace: name });
    try {
      assert.equal(new TextDecoder().decode(await c.read("kept.txt")), "v1");
    } finally {
      await c.destroy();
      await client.deleteWorkspace(name);
    }
  });

  it("keeps a workspace's files across sessions, one holder at a time", async () => {
    const name = `ts-${randomBytes(6).toString("hex")}`;
    const ws = await client.createWorkspace(name);
    assert.equal(ws.name, name);
    await assert.rejects(client.createWorkspace(name), WorkspaceExistsError);
    const a = await client.createSession({ ttlSeconds: 300, workspace: name });
    try {
      assert.equal(a.workspace, name);
      await a.write("kept.txt", "from a");
      await assert.rejects(client.createSession({ ttlSeconds: 300, workspace: name }), (e: unknown) => {
        assert.ok(e instanceof WorkspaceBusyError);
        assert.equal(e.status, 409);
        assert.equal(e.code, "workspace_busy");
        return true;
      });
      assert.equal((await client.listWorkspaces()).find((w) => w.name === name)?.inUseBy, a.id);
    } finally {
      await client.deleteSession(a.id);
    }
    const b = await client.createSession({ ttlSeconds: 300, workspace: name });
    try {
      assert.equal(new TextDecoder().decode(await b.read("kept.txt")), "from a");
    } finally {
      await client.deleteSession(b.id);
    }
    await client.deleteWorkspace(name);
    await assert.rejects(client.deleteWorkspace(name), WorkspaceNotFoundError);
    await assert.rejects(client.createSession({ ttlSeconds: 300, workspace: name }), WorkspaceNotFoundError);
  });

  it("snapshots, forks, lists and deletes snapshots", async () => {
    const src = await client.createSession({ ttlSeconds: 300 });
    let fork: string | undefined;
    try {
      await src.write("state.txt", "v1");
      const snap = await client.createSnapshot(src.id);
      assert.match(snap.snapshotId, /^snap_[0-9a-f]{24}$/);
      await src.write("state.txt", "v2");
      const f = await client.createSession({ ttlSeconds: 300, fromSnapshot: snap.snapshotId });
      fork = f.id;
      assert.equal(f.fromSnapshot, snap.snapshotId);
      assert.equal(new TextDecoder().decode(await f.read("state.txt")), "v1");
      assert.deepEqual((await client.listSnapshots({ session: src.id })).map((s) => s.snapshotId), [snap.snapshotId]);
      await client.deleteSnapshot(snap.snapshotId);
      assert.deepEqual(await client.listSnapshots({ session: src.id }), []);
      await assert.rejects(client.deleteSnapshot(snap.snapshotId), SnapshotNotFoundError);
    } finally {
      if (fork) await client.deleteSession(fork);
      await client.deleteSession(src.id);
    }
  });

  it("reports stats, pages the audit trail, and links a port", async () => {
    const s = await client.createSession({ ttlSeconds: 300 });
    try {
      await s.write("blob.bin", new Uint8Array(32768));
      const st = await client.sessionStats(s.id);
      assert.equal(st.sessionId, s.id);
      assert.ok((st.disk?.usedBytes ?? 0) >= 32768, JSON.stringify(st));

      await s.exec("echo one");
      await s.exec("echo two");
      const first = await client.listAudit({ session: s.id, limit: 1 });
      assert.equal(first.events.length, 1);
      assert.ok(first.nextCursor);
      const events = [];
      for await (const e of client.iterAudit({ session: s.id, limit: 2 })) events.push(e);
      assert.ok(events.every((e) => e.session === s.id));
      const seqs = events.map((e) => e.seq);
      assert.deepEqual(seqs, [...seqs].sort((x, y) => y - x));
      assert.equal(new Set(seqs).size, seqs.length);
      assert.ok(events.some((e) => e.kind === "session" && e.op === "created"));
      assert.ok(events.filter((e) => e.kind === "command").length >= 2);

      const port = await freePort();
      await s.write("site/index.html", "hello ts\n");
      await s.exec(`cd site && nohup python3 -m http.server ${port} --bind 127.0.0.1 >/dev/null 2>&1 &`);
      const link = await client.portLink(s.id, port, { expiresIn: 600 });
      // An origin of its own: p{port}-{label}.localhost on the API's port.
      const origin = new URL(link.url);
      assert.ok(origin.hostname.startsWith(`p${port}-`) && origin.hostname.endsWith(".localhost"), link.url);
      assert.equal(origin.port, new URL(gw.url).port);
      assert.equal(origin.pathname, "/");
      let body = "";
      for (let i = 0; i < 150 && body !== "hello ts\n"; i++) {
        const r = await getVia(gw.url, origin.host, "/index.html");
        body = r.status === 200 ? r.body : "";
        if (body !== "hello ts\n") await new Promise((res) => setTimeout(res, 200));
      }
      assert.equal(body, "hello ts\n");
      const url = client.previewUrl(s.id, port, "/index.html");
      assert.equal(url, `${gw.url}/v1/sessions/${s.id}/ports/${port}/index.html`);
      const authed = await fetch(url, { headers: { Authorization: `Bearer ${gw.token}` } });
      assert.equal(authed.headers.get("content-security-policy"), "sandbox");
      assert.equal(await authed.text(), "hello ts\n");
      assert.equal((await fetch(url)).status, 401);
    } finally {
      await client.deleteSession(s.id);
    }
  });
});

/**
 * GETs path on the gateway at base with the Host header host: a preview
 * origin's name (*.localhost is the loopback in browsers and curl; Node's
 * resolver may not know it).
 */
function getVia(base: string, host: string, path: string): Promise<{ status: number; body: string }> {
  const u = new URL(base);
  return new Promise((resolve, reject) => {
    const req = http.request({ host: u.hostname, port: u.port, path, headers: { Host: host } }, (res) => {
      let body = "";
      res.setEncoding("utf8");
      res.on("data", (c: string) => (body += c));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on("error", reject);
    req.end();
  });
}
