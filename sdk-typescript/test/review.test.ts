// Regressions of a review of the TypeScript SDK's parity work, against a
// real gateway.

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { SandboxClient, type Session } from "@sandgate/sdk";

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
});
