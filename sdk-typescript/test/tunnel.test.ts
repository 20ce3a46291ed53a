// openTunnel: against fake CONNECT servers (exact bytes) and the real gateway.

import assert from "node:assert/strict";
import * as net from "node:net";
import { after, before, describe, it } from "node:test";

import {
  RateLimitError,
  SandboxClient,
  SandboxConnectionError,
  SessionNotFoundError,
  UnauthorizedError,
  connectPath,
  openTunnel,
  type TunnelSocket,
} from "@sandgate/sdk";

import { type Gateway, SKIP, startGateway } from "./helpers.js";

/** A one-shot server: reads the request head, records it, answers with `reply`. */
async function fake(reply: (req: string, sock: net.Socket) => void): Promise<{ url: string; requests: string[]; close(): void }> {
  const requests: string[] = [];
  const server = net.createServer((sock) => {
    let buf = "";
    sock.on("data", (d) => {
      buf += d.toString("latin1");
      if (buf.includes("\r\n\r\n") && !requests.includes(buf)) {
        requests.push(buf);
        reply(buf, sock);
      }
    });
    sock.on("error", () => {});
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const port = (server.address() as net.AddressInfo).port;
  return { url: `http://127.0.0.1:${port}`, requests, close: () => server.close() };
}

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

describe("tunnel (fake servers)", () => {
  it("sends CONNECT with both bearer headers and keeps the bytes after 200", async () => {
    const srv = await fake((_req, sock) => sock.write("HTTP/1.1 200 Connection Established\r\nX-A: b\r\n\r\nSSH-2.0-fake\r\n"));
    try {
      const sock = await openTunnel({ baseUrl: srv.url + "/v1", apiKey: "tok", sessionId: "sbx-x" });
      const data = await readN(sock, 14);
      assert.equal(data.toString(), "SSH-2.0-fake\r\n");
      sock.destroy();
      const req = srv.requests[0] ?? "";
      assert.match(req, /^CONNECT \/v1\/sessions\/sbx-x HTTP\/1\.1\r\n/);
      assert.match(req, /\r\nProxy-Authorization: Bearer tok\r\n/);
      assert.match(req, /\r\nAuthorization: Bearer tok\r\n/);
      assert.match(req, /\r\nHost: 127\.0\.0\.1:\d+\r\n/);
    } finally {
      srv.close();
    }
  });

  it("joins the URL's path with the template", () => {
    assert.equal(connectPath("https://gw/v1", "sbx-a"), "/v1/sessions/sbx-a");
    assert.equal(connectPath("http://gw:8080", "sbx-a"), "/sessions/sbx-a");
    assert.equal(connectPath("http://gw/base/", "a/b"), "/base/sessions/a%2Fb");
  });

  it("maps the JSON envelope of an error answer", async () => {
    const body = JSON.stringify({ error: { code: "rate_limited", message: "slow down" } });
    const srv = await fake((_req, sock) =>
      sock.end(
        `HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n` +
          `X-RateLimit-Limit: 5\r\nX-RateLimit-Remaining: 0\r\nX-RateLimit-Reset: 1700000000\r\nRetry-After: 7\r\n\r\n${body}`,
      ),
    );
    try {
      const e = await openTunnel({ baseUrl: srv.url, apiKey: "t", sessionId: "sbx-x" }).then(
        () => assert.fail("no error"),
        (err: unknown) => err,
      );
      assert.ok(e instanceof RateLimitError);
      assert.equal(e.code, "rate_limited");
      assert.equal(e.statusLine, "HTTP/1.1 429 Too Many Requests");
      assert.deepEqual([e.limit, e.remaining, e.reset, e.retryAfter], [5, 0, 1700000000, 7]);
      assert.match(e.message, /slow down/);
    } finally {
      srv.close();
    }
  });

  it("other answers are SandboxConnectionErrors with the status line", async () => {
    const body = JSON.stringify({ error: { code: "session_not_running", message: "failed" } });
    const srv = await fake((_req, sock) => sock.end(`HTTP/1.1 409 Conflict\r\nContent-Length: ${body.length}\r\n\r\n${body}`));
    try {
      const e = await openTunnel({ baseUrl: srv.url, apiKey: "t", sessionId: "sbx-x" }).then(
        () => assert.fail("no error"),
        (err: unknown) => err,
      );
      assert.ok(e instanceof SandboxConnectionError);
      assert.equal(e.status, 409);
      assert.equal(e.code, "session_not_running");
      assert.equal(e.statusLine, "HTTP/1.1 409 Conflict");
    } finally {
      srv.close();
    }
  });

  it("refuses a head that is not HTTP, too large, or cut short", async () => {
    for (const [reply, re] of [
      ["SSH-2.0-direct\r\n\r\n", /not HTTP/],
      ["HTTP/1.1 200 OK\r\n" + "X: " + "a".repeat(70 * 1024), /too large/],
      ["HTTP/1.1 200 OK\r\nX: y", /in the middle of its CONNECT answer/],
      ["", /without answering/],
    ] as const) {
      const srv = await fake((_req, sock) => sock.end(reply));
      try {
        await assert.rejects(openTunnel({ baseUrl: srv.url, apiKey: "t", sessionId: "sbx-x" }), (e: unknown) => {
          assert.ok(e instanceof SandboxConnectionError, String(e));
          assert.match(e.message, re);
          return true;
        });
      } finally {
        srv.close();
      }
    }
  });

  it("times out when nothing answers", async () => {
    const srv = await fake(() => {});
    try {
      await assert.rejects(openTunnel({ baseUrl: srv.url, apiKey: "t", sessionId: "sbx-x", timeoutMs: 300 }), /no answer to CONNECT/);
    } finally {
      srv.close();
    }
  });

  it("an option the socket refuses rejects, and nothing fires later", async () => {
    // tls.connect throws at once on a CA that is not a string or Buffer
    // (an unset environment variable): the timeout must not fire on no socket.
    const bad = { ca: [undefined as unknown as string] };
    await assert.rejects(
      openTunnel({ baseUrl: "https://127.0.0.1:9", apiKey: "t", sessionId: "sbx-x", timeoutMs: 200, ...bad }),
      TypeError,
    );
    await new Promise((r) => setTimeout(r, 500)); // an uncaught error here fails the run
  });
});

describe("tunnel (gateway)", { skip: SKIP }, () => {
  let gw: Gateway;
  before(async () => {
    gw = await startGateway();
  });
  after(async () => {
    await gw?.stop();
  });

  it("carries the session's SSH stream from its first byte", async () => {
    const client = new SandboxClient({ baseUrl: gw.url, apiKey: gw.token });
    const s = await client.createSession({ ttlSeconds: 600 });
    try {
      const sock = await s.openTunnel();
      const banner = await readN(sock, 8);
      assert.equal(banner.subarray(0, 8).toString(), "SSH-2.0-");
      sock.destroy();
      await assert.rejects(openTunnel({ baseUrl: gw.url, apiKey: "bad", sessionId: s.id }), UnauthorizedError);
    } finally {
      await s.destroy();
    }
    await assert.rejects(client.openTunnel(s.id), SessionNotFoundError);
  });
});

describe("tunnel (startup budget)", { skip: SKIP }, () => {
  let gw: Gateway;
  before(async () => {
    gw = await startGateway({ args: ["--ssh-max-startups-per-principal", "2", "--ssh-handshake-timeout", "2s"] });
  });
  after(async () => {
    await gw?.stop();
  });

  it("is refused with 429 too_many_ssh_startups past the budget, and retried within the timeout", async () => {
    const client = new SandboxClient({ baseUrl: gw.url, apiKey: gw.token });
    const s = await client.createSession({ ttlSeconds: 600 });
    // Two tunnels that never start SSH hold the principal's budget ...
    const stalled = [await s.openTunnel(), await s.openTunnel()];
    try {
      // ... so a third is refused, with no time left to retry in ...
      await assert.rejects(openTunnel({ baseUrl: gw.url, apiKey: gw.token, sessionId: s.id, timeoutMs: 500 }), (e: unknown) => {
        assert.ok(e instanceof RateLimitError);
        assert.equal(e.status, 429);
        assert.equal(e.code, "too_many_ssh_startups");
        return true;
      });
      // ... and retried until the stalled ones reach their handshake deadline.
      const sock = await openTunnel({ baseUrl: gw.url, apiKey: gw.token, sessionId: s.id, timeoutMs: 15_000 });
      sock.destroy();
    } finally {
      for (const t of stalled) t.destroy();
      await s.destroy();
    }
  });
});
