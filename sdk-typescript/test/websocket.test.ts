// The websocket transport: SSH in a WebSocket (GET /v1/sessions/{id}/ssh) against the real gateway.

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";

import {
  SandboxClient,
  SessionNotFoundError,
  UnauthorizedError,
  openTunnel,
  websocketPath,
  type TunnelSocket,
} from "@sandgate/sdk";

import { type Gateway, SKIP, startGateway } from "./helpers.js";

function readN(sock: TunnelSocket, n: number): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    let buf = Buffer.alloc(0);
    const onData = (d: Buffer) => {
      buf = Buffer.concat([buf, d]);
      if (buf.length >= n) {
        sock.removeListener("data", onData);
        resolve(buf);
      }
    };
    sock.on("data", onData);
    sock.once("error", reject);
  });
}

describe("websocket path", () => {
  it("adds /v1 unless the URL ends in it", () => {
    assert.equal(websocketPath("http://gw:8080", "sbx-a"), "/v1/sessions/sbx-a/ssh");
    assert.equal(websocketPath("https://gw/v1/", "a b"), "/v1/sessions/a%20b/ssh");
    assert.equal(websocketPath("https://gw/prefix", "x"), "/prefix/v1/sessions/x/ssh");
  });
  it("refuses an unknown transport", async () => {
    await assert.rejects(
      openTunnel({ baseUrl: "http://127.0.0.1:1", apiKey: "k", sessionId: "s", transport: "pigeon" as "connect" }),
      TypeError,
    );
  });
});

describe("websocket transport (gateway)", { skip: SKIP }, () => {
  let gw: Gateway;
  let local: string;
  before(async () => {
    gw = await startGateway();
    local = mkdtempSync(join(tmpdir(), "sandgate-ts-ws-"));
  });
  after(async () => {
    await gw?.stop();
    if (local) rmSync(local, { recursive: true, force: true });
  });

  it("carries the SSH stream, SSH and SFTP, and the gateway's refusals", async () => {
    const client = new SandboxClient({ baseUrl: gw.url, apiKey: gw.token });
    const s = await client.createSession({ ttlSeconds: 600 });
    try {
      const sock = await s.openTunnel({ transport: "websocket" });
      const banner = await readN(sock, 8);
      assert.equal(banner.subarray(0, 8).toString(), "SSH-2.0-");
      sock.destroy();

      const ssh = await s.ssh({ transport: "websocket" });
      try {
        const r = await ssh.runCommand("echo ws; head -c 300000 /dev/zero | wc -c");
        assert.equal(r.stdout, "ws\n300000\n");
        const data = randomBytes(300_000);
        writeFileSync(join(local, "up.bin"), data);
        await ssh.uploadFile(join(local, "up.bin"), "up.bin");
        await ssh.downloadFile("up.bin", join(local, "down.bin"));
        assert.ok(readFileSync(join(local, "down.bin")).equals(data));
      } finally {
        await ssh.close();
      }
      await assert.rejects(
        openTunnel({ baseUrl: gw.url, apiKey: "bad", sessionId: s.id, transport: "websocket" }),
        UnauthorizedError,
      );
    } finally {
      await s.destroy();
    }
    await assert.rejects(client.openTunnel(s.id, { transport: "websocket" }), SessionNotFoundError);
  });
});
