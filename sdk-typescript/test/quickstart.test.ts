// The README's example, run verbatim: README.md must include
// examples/quickstart.ts as it is, and that file runs against a real gateway.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { promisify } from "node:util";

import { SandboxClient } from "@sandgate/sdk";

import { type Gateway, SDK_ROOT, SKIP, startGateway } from "./helpers.js";

describe("README example", { skip: SKIP }, () => {
  let gw: Gateway;
  before(async () => {
    gw = await startGateway();
  });
  after(async () => {
    await gw?.stop();
  });

  it("README.md includes examples/quickstart.ts verbatim", () => {
    const readme = readFileSync(join(SDK_ROOT, "README.md"), "utf8");
    const example = readFileSync(join(SDK_ROOT, "examples", "quickstart.ts"), "utf8");
    assert.ok(readme.includes("```ts\n" + example + "```\n"), "README.md's example block differs from examples/quickstart.ts");
  });

  it("runs against the gateway", { timeout: 60_000 }, async () => {
    const cwd = mkdtempSync(join(tmpdir(), "sandgate-ts-example-"));
    try {
      const script = join(SDK_ROOT, "build-test", "examples", "quickstart.js");
      const env = { ...process.env, SANDBOX_API_URL: gw.url + "/v1", SANDBOX_API_TOKEN: gw.token };
      const { stdout } = await promisify(execFile)(process.execPath, [script], { cwd, env, timeout: 50_000 });
      assert.match(stdout, /^hello from \S+ exit 0$/m);
      assert.equal(readFileSync(join(cwd, "output.txt"), "utf8"), "made in the sandbox\n");
      // The example deleted its session.
      const client = new SandboxClient({ baseUrl: gw.url, apiKey: gw.token });
      assert.equal((await client.listSessions()).sessions.length, 0);
    } finally {
      rmSync(cwd, { recursive: true, force: true });
    }
  });
});
