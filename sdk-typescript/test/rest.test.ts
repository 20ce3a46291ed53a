// The REST client against a real gateway: sessions, error mapping (401, 404, 429, typed 400s).

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import {
  RateLimitError,
  ResourcesExceededError,
  SandboxAPIError,
  SandboxClient,
  SandboxConnectionError,
  SandboxOperationError,
  SessionGoneError,
  SessionNotFoundError,
  UnauthorizedError,
  openTunnel,
} from "@sandgate/sdk";

import { type Gateway, SKIP, startGateway, token } from "./helpers.js";

describe("REST", { skip: SKIP }, () => {
  let gw: Gateway;
  let client: SandboxClient;
  before(async () => {
    gw = await startGateway({ keys: [token(), `other:${token()}`], args: ["--rate-limit", "100000"] });
    client = new SandboxClient({ baseUrl: gw.url, apiKey: gw.token });
  });
  after(async () => {
    await gw?.stop();
  });

  it("takes a session's name wherever it takes its id", async () => {
    const s = await client.createSession({ ttlSeconds: 600, name: "ts-names" });
    try {
      assert.equal(s.name, "ts-names");
      const got = await client.getSession("ts-names");
      assert.equal(got.id, s.id);
      assert.equal(got.name, "ts-names");
      if (s.isolation !== undefined) assert.equal(s.isolation, "none"); // workdir, not as root
    } finally {
      await client.deleteSession("ts-names");
    }
    await assert.rejects(client.getSession(s.id), SessionGoneError);
    await assert.rejects(client.createSession({ name: "" }), TypeError);
  });

  it("creates, gets, lists and deletes a session", async () => {
    const s = await client.createSession({ ttlSeconds: 600, metadata: { project: "ts" } });
    try {
      assert.match(s.id, /^sbx-[a-z2-7]{20}$/);
      assert.equal(s.sessionId, s.id);
      assert.equal(s.status, "running");
      assert.equal(s.ttl, 600);
      assert.deepEqual(s.metadata, { project: "ts" });
      assert.equal(s.sshInfo.username, "sandbox");
      assert.ok(s.sshInfo.password, "the create answer carries the password");
      assert.ok(s.sshInfo.hostKeys.length >= 1 && s.sshInfo.hostKeys[0]?.startsWith("ssh-ed25519 "));
      assert.equal(s.sshInfo.connectPath, `/v1/sessions/${s.id}`);
      assert.equal(s.replayed, false);
      assert.ok(!JSON.stringify(s).includes(s.sshInfo.password ?? "x"), "toJSON hides the password");

      const g = await client.getSession(s.id);
      assert.equal(g.id, s.id);
      assert.equal(g.sshInfo.password, undefined);
      assert.deepEqual(g.sshInfo.hostKeys, s.sshInfo.hostKeys);

      const list = await client.listSessions();
      assert.ok(list.some((x) => x.id === s.id));
      const page = await client.listSessionsPage();
      assert.ok(page.sessions.some((x) => x.id === s.id));
      assert.equal(page.limit, 50);

      const u = await client.updateSession(s.id, { ttlSeconds: 1200 });
      assert.equal(u.ttl, 1200);
    } finally {
      await s.destroy();
    }
    await assert.rejects(client.getSession(s.id), SessionNotFoundError);
  });

  it("accepts a base URL ending in /v1 and reads the environment", async () => {
    process.env["SANDBOX_API_URL"] = gw.url + "/v1/";
    process.env["SANDBOX_API_TOKEN"] = gw.token;
    try {
      const c = new SandboxClient();
      await c.listSessions();
    } finally {
      delete process.env["SANDBOX_API_URL"];
      delete process.env["SANDBOX_API_TOKEN"];
    }
    assert.throws(() => new SandboxClient(), TypeError);
  });

  it("replays a create with the same Idempotency-Key", async () => {
    const key = `ts-${token()}`;
    const a = await client.createSession({ ttlSeconds: 600, idempotencyKey: key });
    try {
      const b = await client.createSession({ ttlSeconds: 600, idempotencyKey: key });
      assert.equal(b.id, a.id);
      assert.equal(b.replayed, true);
      assert.equal(b.sshInfo.password, undefined);
    } finally {
      await a.destroy();
    }
  });

  it("checks arguments before sending anything", async () => {
    await assert.rejects(client.createSession({ ttlSeconds: 10 }), RangeError);
    await assert.rejects(client.createSession({ ttlSeconds: 1.5 }), TypeError);
    await assert.rejects(client.createSession({ resources: { memoryMiB: -1 } }), RangeError);
    await assert.rejects(client.listSessions({ limit: 0 }), RangeError);
  });

  it("401: a bad token, over REST and CONNECT", async () => {
    const bad = new SandboxClient({ baseUrl: gw.url, apiKey: "wrong" });
    const e = await bad.listSessions().then(
      () => assert.fail("no error"),
      (err: unknown) => err,
    );
    assert.ok(e instanceof UnauthorizedError && e instanceof SandboxAPIError);
    assert.equal(e.status, 401);
    assert.equal(e.code, "unauthorized");
    const s = await client.createSession({ ttlSeconds: 600 });
    try {
      const t = await openTunnel({ baseUrl: gw.url, apiKey: "wrong", sessionId: s.id }).then(
        () => assert.fail("no error"),
        (err: unknown) => err,
      );
      assert.ok(t instanceof UnauthorizedError);
      assert.equal(t.status, 401);
      assert.match(t.statusLine ?? "", /^HTTP\/1\.1 401/);
      await assert.rejects(bad.ssh(s.id), UnauthorizedError);
    } finally {
      await s.destroy();
    }
  });

  it("404: a missing session, and another tenant's, over REST and CONNECT", async () => {
    const missing = "sbx-aaaaaaaaaaaaaaaaaaaa";
    // One call at a time: a second promise rejecting before the first is
    // awaited would be an unhandled rejection.
    for (const call of [() => client.getSession(missing), () => client.deleteSession(missing)]) {
      const e = await call().then(
        () => assert.fail("no error"),
        (err: unknown) => err,
      );
      assert.ok(e instanceof SessionNotFoundError);
      assert.equal(e.status, 404);
      assert.equal(e.code, "not_found");
    }
    const t = await client.openTunnel(missing).then(
      () => assert.fail("no error"),
      (err: unknown) => err,
    );
    assert.ok(t instanceof SessionNotFoundError);
    assert.match(t.statusLine ?? "", / 404 /);

    const other = new SandboxClient({ baseUrl: gw.url, apiKey: gw.tokens[1] ?? "" });
    const s = await other.createSession({ ttlSeconds: 600 });
    try {
      await assert.rejects(client.getSession(s.id), SessionNotFoundError);
      await assert.rejects(client.openTunnel(s.id), SessionNotFoundError);
    } finally {
      await s.destroy();
    }
  });

  it("410: a deleted session is a SessionGoneError with its reason, over REST and CONNECT", async () => {
    const s = await client.createSession({ ttlSeconds: 600 });
    await s.destroy();
    for (const call of [() => client.getSession(s.id), () => client.openTunnel(s.id)]) {
      const e = await call().then(
        () => assert.fail("no error"),
        (err: unknown) => err,
      );
      assert.ok(e instanceof SessionGoneError && e instanceof SessionNotFoundError);
      assert.equal(e.status, 410);
      assert.equal(e.code, "session_gone");
      assert.equal(e.reason, "deleted");
    }
  });

  it("400 resources_exceeded is a ResourcesExceededError naming the resource", async () => {
    const e = await client.createSession({ resources: { memoryMiB: 1 << 30 } }).then(
      () => assert.fail("no error"),
      (err: unknown) => err,
    );
    assert.ok(e instanceof ResourcesExceededError && e instanceof SandboxOperationError);
    assert.equal(e.status, 400);
    assert.equal(e.code, "resources_exceeded");
    assert.equal(e.resource, "memoryMiB");
  });

  it("an unreachable gateway is a SandboxConnectionError", async () => {
    const c = new SandboxClient({ baseUrl: "http://127.0.0.1:1", apiKey: "k", timeoutMs: 5000 });
    await assert.rejects(c.getSession("sbx-aaaaaaaaaaaaaaaaaaaa"), SandboxConnectionError);
    await assert.rejects(c.openTunnel("sbx-aaaaaaaaaaaaaaaaaaaa"), SandboxConnectionError);
  });
});

describe("429 (a gateway with --rate-limit 5)", { skip: SKIP }, () => {
  let gw: Gateway;
  before(async () => {
    gw = await startGateway({ keys: [`a:${token()}`, `b:${token()}`], args: ["--rate-limit", "5"] });
  });
  after(async () => {
    await gw?.stop();
  });

  it("REST: the sixth request in a minute is a RateLimitError with the limits", async () => {
    const c = new SandboxClient({ baseUrl: gw.url, apiKey: gw.tokens[0] ?? "" });
    const s = await c.createSession({ ttlSeconds: 600 }); // 1
    for (let i = 0; i < 4; i++) await c.listSessions(); // 2..5
    const e = await c.getSession(s.id).then(
      () => assert.fail("no error"),
      (err: unknown) => err,
    );
    assert.ok(e instanceof RateLimitError && e instanceof SandboxAPIError);
    assert.equal(e.status, 429);
    assert.equal(e.code, "rate_limited");
    assert.equal(e.limit, 5);
    assert.equal(e.remaining, 0);
    const now = Date.now() / 1000;
    assert.ok(e.reset !== undefined && e.reset >= now - 5 && e.reset <= now + 65, `reset ${e.reset}`);
    assert.ok(e.retryAfter !== undefined && e.retryAfter >= 0 && e.retryAfter <= 61, `retryAfter ${e.retryAfter}`);
  });

  it("CONNECT: a RateLimitError with the status line", async () => {
    const c = new SandboxClient({ baseUrl: gw.url, apiKey: gw.tokens[1] ?? "" });
    const s = await c.createSession({ ttlSeconds: 600 }); // 1
    for (let i = 0; i < 4; i++) (await c.openTunnel(s.id)).destroy(); // 2..5
    const e = await c.openTunnel(s.id).then(
      () => assert.fail("no error"),
      (err: unknown) => err,
    );
    assert.ok(e instanceof RateLimitError);
    assert.match(e.statusLine ?? "", / 429 /);
    assert.equal(e.limit, 5);
    assert.equal(e.remaining, 0);
  });
});
