// The REST data plane: Session.exec / write / read.
//
// NEEDS the gateway's /v1/sessions/{id}/commands and /files endpoints. They
// are built on other branches; on a gateway without them (501
// not_implemented) every test in this "data plane" block fails.

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, describe, it } from "node:test";

import { FileNotFoundInSandboxError, SandboxClient, SessionNotFoundError, type Session } from "@sandgate/sdk";

import { type Gateway, SKIP, startGateway } from "./helpers.js";

describe("data plane (needs /commands and /files)", { skip: SKIP }, () => {
  let gw: Gateway;
  let client: SandboxClient;
  let session: Session;
  before(async () => {
    gw = await startGateway();
    client = new SandboxClient({ baseUrl: gw.url, apiKey: gw.token });
    session = await client.createSession({ ttlSeconds: 600 });
  });
  after(async () => {
    await session?.destroy().catch(() => {});
    await gw?.stop();
  });

  it("exec: output, exit code; a persistent shell's cwd and exports persist, exec's do not", async () => {
    const r = await session.exec("echo out; echo err >&2; false");
    assert.equal(r.exitCode, 1);
    assert.equal(r.stdout, "out\n");
    assert.equal(r.stderr, "err\n");
    assert.equal(r.output, "out\nerr\n");
    assert.equal(r.truncated, false);
    assert.ok(r.durationMs >= 0);

    // exec is a fresh process each time; a persistent shell keeps cd and export.
    const sh = session.shell();
    const cd = await sh.run("mkdir -p sub/dir && cd sub/dir && export GREETING=hi");
    assert.equal(cd.exitCode, 0);
    assert.match(cd.cwd, /\/sub\/dir$/);
    const again = await sh.run('pwd; echo "$GREETING"');
    assert.match(again.stdout, /\/sub\/dir\nhi\n$/);
    assert.match(again.cwd, /\/sub\/dir$/);
    const fresh = await session.exec('pwd; echo "[$GREETING]"');
    assert.doesNotMatch(fresh.stdout, /sub\/dir/);
    assert.match(fresh.stdout, /\[\]\n$/);
    assert.equal(await sh.close(), true);
    assert.equal(await sh.close(), false);
  });

  it("exec: a timeout gives exit code 124", { timeout: 30_000 }, async () => {
    const t0 = Date.now();
    const r = await session.exec("sleep 30", { timeoutMs: 1000 });
    assert.equal(r.exitCode, 124);
    assert.equal(r.timedOut, true);
    assert.ok(Date.now() - t0 < 15_000);
    assert.equal((await session.exec("echo alive")).stdout, "alive\n");
  });

  it("exec: output that is not UTF-8 arrives as bytes", async () => {
    const r = await session.exec("printf '\\377\\376ok'");
    assert.deepEqual([...r.stdoutBytes], [0xff, 0xfe, 0x6f, 0x6b]);
  });

  it("write and read: a round trip, parents made, strings and bytes", async () => {
    const data = new Uint8Array(randomBytes(300_000));
    await session.write("files/a/b/data.bin", data);
    assert.deepEqual(await session.read("files/a/b/data.bin"), data);
    await session.write("files/hello.txt", "héllo\n");
    assert.equal(new TextDecoder().decode(await session.read("files/hello.txt")), "héllo\n");
    // The shell sees what was written.
    assert.equal((await session.exec("cat files/hello.txt")).stdout, "héllo\n");
  });

  it("read: maxBytes reads only the start", async () => {
    await session.write("files/digits.txt", "0123456789");
    assert.equal(new TextDecoder().decode(await session.read("files/digits.txt", { maxBytes: 4 })), "0123");
    assert.equal(new TextDecoder().decode(await session.read("files/digits.txt", { maxBytes: 100 })), "0123456789");
    await session.write("files/empty", "");
    assert.equal((await session.read("files/empty", { maxBytes: 4 })).length, 0);
  });

  it("a deleted session's data plane is a SessionNotFoundError", async () => {
    const s = await client.createSession({ ttlSeconds: 600 });
    await s.destroy();
    await assert.rejects(s.exec("true"), SessionNotFoundError);
    await assert.rejects(s.read("x"), SessionNotFoundError);
  });

  it("a missing file is a FileNotFoundInSandboxError, not a missing session", async () => {
    await assert.rejects(session.read("no/such/file"), (e: unknown) => e instanceof FileNotFoundInSandboxError && !(e instanceof SessionNotFoundError));
  });
});

describe("fetchUrls (needs /files/fetch)", { skip: SKIP }, () => {
  let gw: Gateway;
  let session: Session;
  let server: Server;
  let base = "";
  before(async () => {
    // A file server on 127.0.0.2, which the gateway fetches from only when allowed.
    server = createServer((req, res) => {
      if (req.url === "/dotted") res.setHeader("Content-Disposition", 'attachment; filename=".bashrc"');
      res.end(req.url === "/dotted" ? "evil\n" : "one\n");
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.2", resolve));
    base = `http://127.0.0.2:${(server.address() as AddressInfo).port}`;
    gw = await startGateway({ args: ["--egress-allow-cidr", "127.0.0.2/32"] });
    session = await new SandboxClient({ baseUrl: gw.url, apiKey: gw.token }).createSession({ ttlSeconds: 600 });
  });
  after(async () => {
    await session?.destroy().catch(() => {});
    await gw?.stop();
    server?.close();
  });

  it("never replaces a file unless overwrite, and never takes a dotted name from the server", async () => {
    await session.write("one.txt", "mine\n");
    await session.write(".bashrc", "# mine\n");
    const r = await session.fetchUrls([`${base}/one.txt`, `${base}/dotted`]);
    assert.equal(r.status, "success");
    assert.deepEqual(r.fetched, ["one-1.txt", "bashrc"]);
    assert.equal(new TextDecoder().decode(await session.read("one.txt")), "mine\n");
    assert.equal(new TextDecoder().decode(await session.read(".bashrc")), "# mine\n");
    const o = await session.fetchUrls([`${base}/one.txt`], { overwrite: true });
    assert.deepEqual(o.fetched, ["one.txt"]);
    assert.equal(new TextDecoder().decode(await session.read("one.txt")), "one\n");
    await assert.rejects(session.fetchUrls([]), TypeError);
  });
});
