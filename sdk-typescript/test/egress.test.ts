// Egress rule objects, decisions and approvals (egressMode "ask") against a real gateway.

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { SandboxClient, SandboxOperationError, SessionNotFoundError } from "@sandgate/sdk";

import { type Gateway, SKIP, startGateway } from "./helpers.js";

const RULE = { host: "api.github.com", port: 443, methods: ["get", "POST"], paths: ["/repos/acme/*"] };

describe("egress: rules per request, decisions, approvals", { skip: SKIP }, () => {
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
    await assert.rejects(client.createSession({ egress: [{ port: 443 } as never] }), RangeError);
    await assert.rejects(client.createSession({ egress: [{ host: "a.b", path: ["/x"] } as never] }), RangeError);
    await assert.rejects(client.createSession({ egress: [{ host: "a.b", methods: "GET" } as never] }), TypeError);
    await assert.rejects(client.createSession({ egress: [42 as never] }), TypeError);
    await assert.rejects(client.createSession({ egressMode: "sometimes" as never }), RangeError);
    await assert.rejects(client.decideEgress("sbx-x", "p", "maybe" as never), RangeError);
    await assert.rejects(client.decideEgress("sbx-x", "", "allow"), TypeError);
    await assert.rejects(client.listEgressDecisions("sbx-x", { limit: 0 }), RangeError);
  });

  it("creates with rule objects in ask mode, lists decisions and pending, decides", async () => {
    const s = await client.createSession({ ttlSeconds: 120, egress: ["pypi.org", RULE], egressMode: "ask" });
    try {
      assert.deepEqual(s.egress?.allow, ["pypi.org", { host: "api.github.com", port: 443, methods: ["GET", "POST"], paths: ["/repos/acme/*"] }]);
      assert.equal(s.egress?.mode, "ask");
      assert.deepEqual(await client.listEgressPending(s.id), []);
      assert.deepEqual(await client.listEgressDecisions(s.id, { limit: 10 }), { decisions: [] });
      await assert.rejects(client.decideEgress(s.id, "nope", "allow", { remember: true }), (e: unknown) => {
        assert.ok(e instanceof SandboxOperationError && !(e instanceof SessionNotFoundError));
        assert.equal(e.code, "pending_not_found");
        assert.equal(e.status, 404);
        return true;
      });
      const u = await client.updateSession(s.id, { egress: [RULE] });
      assert.equal((u.egress?.allow[0] as { host: string }).host, "api.github.com");
    } finally {
      await client.deleteSession(s.id);
    }
    const d = await client.createSession({ ttlSeconds: 120, egress: [RULE] });
    assert.equal(d.egress?.mode, undefined);
    await client.deleteSession(d.id);
  });
});

describe("egress: following and deciding a parked connection", { skip: SKIP }, () => {
  it("sees a parked curl (HTTP_PROXY on the workdir driver), allows it, sees it resolved", async () => {
    const http = await import("node:http");
    const up = http.createServer((_req, res) => res.end("hello from upstream\n"));
    await new Promise<void>((resolve) => up.listen(0, "127.0.0.1", resolve));
    const port = (up.address() as { port: number }).port;
    const gw = await startGateway({ args: ["--egress-allow-cidr", "127.0.0.1/32", "--egress-resolve", "ask.test=127.0.0.1"] });
    try {
      const client = new SandboxClient({ baseUrl: gw.url, apiKey: gw.token });
      const s = await client.createSession({ ttlSeconds: 300, egress: ["ok.test:1"], egressMode: "ask" });
      const events: { event: string; id: string }[] = [];
      const follow = (async () => {
        for await (const ev of client.followEgressPending(s.id)) {
          events.push({ event: ev.event, id: ev.pending.id });
          if (ev.event === "pending") {
            assert.equal(ev.pending.host, "ask.test");
            assert.equal(ev.pending.port, port);
            await client.decideEgress(s.id, ev.pending.id, "allow");
          } else {
            return;
          }
        }
      })();
      const p = await client.startProcess(s.id, `curl -sS --max-time 60 http://ask.test:${port}/`);
      await follow;
      assert.deepEqual(events.map((e) => e.event), ["pending", "resolved"]);
      const out = await (await client.processOutput(s.id, p.processId)).collect();
      assert.equal(out.stdout, "hello from upstream\n");
      await client.deleteSession(s.id);
    } finally {
      await gw.stop();
      up.close();
    }
  });
});
