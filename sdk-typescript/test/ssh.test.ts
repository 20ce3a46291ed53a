// SSH and SFTP (ssh2) through the CONNECT tunnel, against a real gateway.

import assert from "node:assert/strict";
import { createHash, generateKeyPairSync, randomBytes } from "node:crypto";
import { createReadStream, createWriteStream, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";

import {
  CommandTimeoutError,
  HostKeyMismatchError,
  SandboxClient,
  SandboxConnectionError,
  SandboxOperationError,
  type Session,
  type SessionSSH,
} from "@sandgate/sdk";

import { type Gateway, SKIP, processesMatching, startGateway, waitFor } from "./helpers.js";

/** An authorized_keys line of a fresh ed25519 key: a key the gateway does not have. */
function strangerKey(): string {
  const { publicKey } = generateKeyPairSync("ed25519");
  const raw = publicKey.export({ format: "der", type: "spki" }).subarray(-32);
  const field = (b: Buffer) => {
    const len = Buffer.alloc(4);
    len.writeUInt32BE(b.length);
    return Buffer.concat([len, b]);
  };
  return `ssh-ed25519 ${Buffer.concat([field(Buffer.from("ssh-ed25519")), field(raw)]).toString("base64")}`;
}

async function sha256File(path: string): Promise<string> {
  const h = createHash("sha256");
  for await (const chunk of createReadStream(path)) h.update(chunk as Buffer);
  return h.digest("hex");
}

describe("SSH", { skip: SKIP }, () => {
  let gw: Gateway;
  let client: SandboxClient;
  let session: Session;
  let ssh: SessionSSH;
  let local: string;
  before(async () => {
    gw = await startGateway();
    client = new SandboxClient({ baseUrl: gw.url, apiKey: gw.token });
    session = await client.createSession({ ttlSeconds: 1200 });
    ssh = await session.ssh();
    local = mkdtempSync(join(tmpdir(), "sandgate-ts-local-"));
  });
  after(async () => {
    await ssh?.close();
    await session?.destroy().catch(() => {});
    await gw?.stop();
    if (local) rmSync(local, { recursive: true, force: true });
  });

  it("runs commands: stdout, stderr, exit codes, signals", async () => {
    const r = await ssh.runCommand("echo out; echo err >&2; exit 7");
    assert.deepEqual(r, { exitCode: 7, stdout: "out\n", stderr: "err\n", truncated: false });
    const k = await ssh.runCommand("kill -TERM $$");
    assert.equal(k.exitSignal, "TERM");
    assert.equal(k.exitCode, 143);
    const n = await ssh.runCommand("cat"); // stdin is closed at once
    assert.equal(n.exitCode, 0);
  });

  it("passes output to callbacks and bounds what it keeps", async () => {
    const seen: string[] = [];
    const r = await ssh.runCommand("printf 0123456789", { onStdout: (t) => seen.push(t), maxOutputBytes: 4 });
    assert.equal(seen.join(""), "0123456789");
    assert.equal(r.stdout, "0123");
    assert.equal(r.truncated, true);
  });

  it("streams output as an async iterator", async () => {
    const cmd = ssh.stream("for i in 1 2 3; do echo $i; sleep 0.05; done; echo e >&2");
    const chunks: string[] = [];
    for await (const c of cmd) chunks.push(`${c.stream}:${c.data.toString()}`);
    assert.equal(chunks.filter((c) => c.startsWith("stdout:")).map((c) => c.slice(7)).join(""), "1\n2\n3\n");
    assert.ok(chunks.includes("stderr:e\n"));
    assert.equal((await cmd.result).exitCode, 0);
  });

  it("times out: CommandTimeoutError, and the remote command is ended", { timeout: 30_000 }, async () => {
    const marker = `30.${randomBytes(3).readUIntBE(0, 3) % 1000000}`;
    const t0 = Date.now();
    const e = await ssh.runCommand(`echo started; sleep ${marker}`, { timeoutMs: 1500 }).then(
      () => assert.fail("no timeout"),
      (err: unknown) => err,
    );
    assert.ok(e instanceof CommandTimeoutError && e instanceof SandboxOperationError);
    assert.equal(e.timeoutMs, 1500);
    assert.equal(e.stdout, "started\n");
    assert.ok(Date.now() - t0 < 10_000);
    assert.ok(await waitFor(() => processesMatching(`sleep ${marker}`).length === 0, 5000), "the sleep still runs");
    // The connection stays usable.
    assert.equal((await ssh.runCommand("echo ok")).stdout, "ok\n");
  });

  it("moves 100 MB over SFTP and back, content checked by hash", { timeout: 240_000 }, async () => {
    const src = join(local, "big.bin");
    const back = join(local, "big.back");
    const h = createHash("sha256");
    const w = createWriteStream(src);
    for (let i = 0; i < 100; i++) {
      const chunk = randomBytes(1 << 20);
      h.update(chunk);
      if (!w.write(chunk)) await new Promise<void>((r) => w.once("drain", () => r()));
    }
    await new Promise<void>((r, j) => w.end((e?: Error | null) => (e ? j(e) : r())));
    const want = h.digest("hex");
    await ssh.uploadFile(src, "big.bin");
    const remote = await ssh.runCommand("sha256sum big.bin 2>/dev/null || busybox sha256sum big.bin");
    assert.equal(remote.stdout.split(/\s/)[0], want);
    await ssh.downloadFile("big.bin", back);
    assert.equal(await sha256File(back), want);
    await ssh.runCommand("rm -f big.bin");
  });

  it("SFTP failures are SandboxOperationErrors and leave no local file", async () => {
    await assert.rejects(ssh.downloadFile("no/such/file", join(local, "nothing")), SandboxOperationError);
    await assert.rejects(import("node:fs/promises").then((f) => f.access(join(local, "nothing"))));
    await assert.rejects(ssh.uploadFile(join(local, "missing"), "x"), SandboxOperationError);
  });

  it("authenticates with none when no password is known", async () => {
    const c = await client.ssh(session.id); // a GET answer: no password
    try {
      assert.equal((await c.runCommand("echo none")).stdout, "none\n");
      assert.deepEqual(c.pinnedHostKeys, session.sshInfo.hostKeys.map((k) => k.split(" ").slice(0, 2).join(" ")));
    } finally {
      await c.close();
    }
    assert.match(gw.log(), /method=none/);
  });

  it("a wrong password is refused", async () => {
    await assert.rejects(session.ssh({ password: "wrong" }), SandboxOperationError);
  });

  it("a host key that is not the pinned one is a HostKeyMismatchError, never a prompt", async () => {
    const pinned = strangerKey();
    const e = await session.ssh({ hostKeys: [pinned] }).then(
      (c) => {
        void c.close();
        assert.fail("connected despite a wrong pinned key");
      },
      (err: unknown) => err,
    );
    assert.ok(e instanceof HostKeyMismatchError && e instanceof SandboxConnectionError, String(e));
    assert.deepEqual(e.expected, [pinned]);
    assert.ok(session.sshInfo.hostKeys.some((k) => k.startsWith(e.presented)), e.presented);
    assert.match(e.message, /SHA256:/);
  });

  it("a deleted session's connection fails the next command", async () => {
    const s = await client.createSession({ ttlSeconds: 600 });
    const c = await s.ssh();
    await s.destroy();
    await assert.rejects(c.runCommand("echo x", { timeoutMs: 10_000 }), SandboxOperationError);
    await c.close();
  });
});
