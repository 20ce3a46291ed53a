// What the TypeScript SDK gained to match the Python SDK (issue 39), against
// a real gateway: one-shot commands with argv/env/cwd/stdin, persistent
// shells, file list/delete, background processes, the Python kernel,
// stop, logs, images, host keys, links, tickets, listSessions as an array
// and as pages, and transport "auto" through a front that refuses CONNECT.

import assert from "node:assert/strict";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import * as net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";

import {
  FileNotFoundInSandboxError,
  ProcessExitedError,
  ProcessNotFoundError,
  SandboxClient,
  type Session,
  SessionNotFoundError,
  UnauthorizedError,
  connectRefused,
  openTunnel,
} from "@sandgate/sdk";

import { type Gateway, SKIP, startGateway, token } from "./helpers.js";

describe("parity with the Python SDK", { skip: SKIP }, () => {
  let gw: Gateway;
  let client: SandboxClient;
  let session: Session;
  before(async () => {
    gw = await startGateway({ args: ["--rate-limit", "100000", "--image-alias", "sg-alias-test:1=default"] });
    client = new SandboxClient({ baseUrl: gw.url, apiKey: gw.token });
    session = await client.createSession({ ttlSeconds: 600 });
  });
  after(async () => {
    await session?.destroy().catch(() => {});
    await gw?.stop();
  });

  it("exec/run: argv without a shell, env, cwd and stdin", async () => {
    await session.writeFile("wd/x.txt", "x");
    const r = await session.exec(undefined, { argv: ["sh", "-c", 'pwd; echo "$LC_TSP"; cat', "ignored $HOME"], env: { LC_TSP: "v" }, cwd: "wd", stdin: "in\n" });
    assert.equal(r.exitCode, 0, r.stderr);
    assert.match(r.stdout, /\/wd\nv\nin\n$/);
    // argv words are not expanded.
    const lit = await client.run(session.id, undefined, { argv: ["echo", "$HOME", "*"] });
    assert.equal(lit.stdout, "$HOME *\n");
    // Bytes as stdin go base64.
    const bin = await session.run("od -An -tx1", { stdin: new Uint8Array([0xff, 0x00, 0x41]) });
    assert.match(bin.stdout, /ff 00 41/);
    await assert.rejects(session.exec(), TypeError);
    await assert.rejects(session.exec("true", { argv: ["true"] }), TypeError);
    // The history has them.
    const hist = await client.listCommands(session.id, { limit: 1000 });
    assert.ok(hist.some((c) => c.command.includes("od -An")));
  });

  it("run streams output to onStdout/onStderr as it comes, as Python's on_stdout", { timeout: 60_000 }, async () => {
    const out: (string | Uint8Array)[] = [];
    const err: (string | Uint8Array)[] = [];
    const r = await session.exec("echo one; sleep 1; echo two >&2; printf '\\377'; exit 5", {
      onStdout: (c) => {
        out.push(c);
      },
      onStderr: (c) => err.push(c),
    });
    assert.equal(r.exitCode, 5);
    assert.equal(out[0], "one\n");
    assert.ok(out.some((c) => c instanceof Uint8Array && c[0] === 0xff), "a chunk that is not UTF-8 comes as bytes");
    assert.deepEqual(err, ["two\n"]);
    assert.deepEqual([...r.stdoutBytes], [...Buffer.from("one\n"), 0xff]);
    assert.equal(r.stderr, "two\n");
    // A callback that throws drops the request, which kills the command.
    const marker = `tsp-cb-${Date.now()}`;
    await assert.rejects(
      session.exec(`echo go; sleep 30; touch ${marker}`, {
        onStdout: () => {
          throw new Error("stop here");
        },
      }),
      /stop here/,
    );
    await new Promise((r) => setTimeout(r, 1500));
    assert.equal((await session.exec(`test -e ${marker}; echo $?`)).stdout, "1\n");
  });

  it("readFileTo streams a file to a local path", async () => {
    const big = Buffer.alloc(3 * 1024 * 1024 + 7, 0x61);
    await session.writeFile("big.bin", big);
    const dir = mkdtempSync(join(tmpdir(), "tsp-"));
    try {
      const dest = join(dir, "big.bin");
      assert.equal(await client.readFileTo(session.id, "big.bin", dest), big.length);
      assert.ok(readFileSync(dest).equals(big));
      const missing = join(dir, "missing.bin");
      await assert.rejects(session.readFileTo("nope.bin", missing), FileNotFoundInSandboxError);
      assert.equal(existsSync(missing), false);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("execInShell, deprecated, still runs in the persistent shell", async () => {
    await session.execInShell("export TSP_DEP=kept");
    assert.equal((await session.shell().run('echo "$TSP_DEP"')).stdout, "kept\n");
  });

  it("files: listFiles, deleteFile, writeFile with a mode, readFile", async () => {
    await client.writeFile(session.id, "tree/a.txt", "aa");
    await client.writeFile(session.id, "tree/sub/b.sh", "echo b", { mode: 0o755 });
    const top = await session.listFiles("tree");
    assert.deepEqual(top.map((e) => e.name).sort(), ["a.txt", "sub"]);
    assert.equal(top.truncated, false);
    const a = top.find((e) => e.name === "a.txt");
    assert.equal(a?.type, "file");
    assert.equal(a?.sizeBytes, 2);
    const all = await client.listFiles(session.id, "tree", { recursive: true });
    const b = all.find((e) => e.name === "b.sh");
    assert.equal(b?.mode, "0755");
    assert.equal(new TextDecoder().decode(await session.readFile("tree/sub/b.sh")), "echo b");
    await session.deleteFile("tree/a.txt");
    await assert.rejects(session.readFile("tree/a.txt"), FileNotFoundInSandboxError);
    await assert.rejects(session.deleteFile("tree/a.txt"), FileNotFoundInSandboxError);
    await assert.rejects(session.deleteFile("tree"), (e: Error & { code?: string }) => e.code === "directory_not_empty");
    await session.deleteFile("tree", { recursive: true });
    await assert.rejects(session.listFiles("tree"), FileNotFoundInSandboxError);
  });

  it("processes: start, list, get, follow the output, stdin, kill", { timeout: 60_000 }, async () => {
    const p = await session.startProcess("echo one; sleep 0.3; echo two >&2; exit 4", { name: "job" });
    assert.equal(p.status, "running");
    assert.equal(p.name, "job");
    const out = await (await session.processOutput(p.processId)).collect();
    assert.equal(out.stdout, "one\n");
    assert.equal(out.stderr, "two\n");
    assert.equal(out.last?.done, true);
    assert.equal(out.last?.exitCode, 4);
    const got = await client.getProcess(session.id, p.processId);
    assert.equal(got.status, "exited");
    assert.equal(got.exitCode, 4);
    assert.ok((await client.listProcesses(session.id)).some((q) => q.processId === p.processId));
    // Read again from an offset, without following.
    const again = await (await client.processOutput(session.id, p.processId, { offset: 4, follow: false })).collect();
    assert.equal(again.stderr, "two\n");
    await assert.rejects(session.sendProcessInput(p.processId, "x"), ProcessExitedError);

    // stdin, then a signal.
    const cat = await session.startProcess(undefined, { argv: ["cat"] });
    const follow = await session.processOutput(cat.processId);
    await session.sendProcessInput(cat.processId, "hello\n");
    const it = follow[Symbol.asyncIterator]();
    const first = await it.next();
    assert.equal((first.value as { stdout?: string }).stdout, "hello\n");
    await session.signalProcess(cat.processId, "KILL");
    let last: { done?: boolean; exitSignal?: string } = {};
    for (let n = await it.next(); !n.done; n = await it.next()) last = n.value;
    assert.equal(last.done, true);
    assert.equal(last.exitSignal, "KILL");
    assert.equal((await session.getProcess(cat.processId)).status, "killed");
    await assert.rejects(session.signalProcess(cat.processId, "TERM"), ProcessExitedError);
    await assert.rejects(session.getProcess("p999"), ProcessNotFoundError);
    await assert.rejects(session.signalProcess(cat.processId, "NOPE"), RangeError);

    // Closing a followed output early leaves the process alone.
    const sl = await session.startProcess("sleep 30");
    const early = await session.processOutput(sl.processId);
    early.close();
    assert.equal((await session.getProcess(sl.processId)).status, "running");
    await session.signalProcess(sl.processId, "SIGTERM");
  });

  it("runPython: state persists in a kernel; errors are results; reset forgets", { timeout: 60_000 }, async () => {
    const a = await session.runPython("x = 20\nx + 1");
    assert.equal(a.result, "21");
    assert.equal(a.error, null);
    assert.equal(a.kernel, "default");
    const b = await client.runPython(session.id, "print(x * 2)");
    assert.equal(b.stdout, "40\n");
    assert.equal(b.result, null);
    const c = await session.runPython("{}['k']");
    assert.equal(c.error?.name, "KeyError");
    const other = await session.runPython("'x' in dir()", { kernel: "k2" });
    assert.equal(other.result, "False");
    const reset = await session.resetPython();
    assert.deepEqual(reset, { kernel: "default", existed: true });
    const d = await session.runPython("x");
    assert.equal(d.error?.name, "NameError");
  });

  it("stopSession keeps the files; the next command starts it again", { timeout: 60_000 }, async () => {
    const s = await client.createSession({ ttlSeconds: 600 });
    try {
      await s.writeFile("keep.txt", "kept");
      const stopped = await client.stopSession(s.id);
      assert.equal(stopped.status, "stopped");
      assert.equal((await s.stop()).status, "stopped");
      assert.equal((await s.exec("cat keep.txt")).stdout, "kept");
      assert.equal((await s.refresh()).status, "running");
      await assert.rejects(client.stopSession("sbx-aaaaaaaaaaaaaaaaaaaa"), SessionNotFoundError);
    } finally {
      await s.destroy();
    }
  });

  it("pauseSession keeps the kernel's memory; the next call resumes it", { timeout: 60_000 }, async () => {
    const s = await client.createSession({ ttlSeconds: 600 });
    try {
      assert.equal((await s.runPython("kept = 6 * 7")).error, null);
      if (s.raw["isolation"] === "none") {
        // The workdir driver cannot pause.
        await assert.rejects(client.pauseSession(s.id), (e: unknown) => (e as { code?: string }).code === "pause_unsupported");
        return;
      }
      const paused = await client.pauseSession(s.id);
      assert.equal(paused.status, "paused");
      assert.equal((paused.raw["pause"] as { method: string }).method, "freeze");
      assert.equal((await s.runPython("kept")).result, "42");
      assert.equal((await s.refresh()).status, "running");
      assert.equal((await s.pause()).status, "paused");
      assert.equal((await s.resume()).status, "running");
      await assert.rejects(client.pauseSession("sbx-aaaaaaaaaaaaaaaaaaaa"), SessionNotFoundError);
    } finally {
      await s.destroy();
    }
  });

  it("forkSession: fork_unsupported without serve --checkpoint, invalid_count past 8", async () => {
    await assert.rejects(client.forkSession(session.id, { count: 2 }), (e: unknown) => (e as { code?: string }).code === "fork_unsupported");
    await assert.rejects(session.fork(), (e: unknown) => (e as { code?: string }).code === "fork_unsupported");
    await assert.rejects(client.forkSession(session.id, { count: 9 }), (e: unknown) => (e as { code?: string }).code === "invalid_count");
    await assert.rejects(client.forkSession(session.id, { count: 0 }), RangeError);
    await assert.rejects(client.forkSession("sbx-aaaaaaaaaaaaaaaaaaaa"), SessionNotFoundError);
  });

  it("logs, images, host keys, file links, tickets", async () => {
    await session.exec("echo for-the-logs");
    const logs = await client.sessionLogs(session.id, { tail: 50 });
    assert.match(logs, /== commands/);
    assert.match(logs, /echo for-the-logs/);
    await assert.rejects(client.sessionLogs(session.id, { tail: 0 }), RangeError);
    const images = await client.listImages();
    assert.ok(Array.isArray(images.images));
    assert.ok(Array.isArray(images.allow));
    assert.deepEqual(images.aliases, [{ name: "sg-alias-test:1", image: "default" }]);
    const keys = await client.hostKeys();
    assert.deepEqual(keys, session.sshInfo.hostKeys);
    await session.writeFile("linked.txt", "by link");
    const link = await client.fileLink(session.id, "linked.txt", { expiresIn: 60 });
    const got = await fetch(link.url);
    assert.equal(got.status, 200);
    assert.equal(await got.text(), "by link");
    const t = await client.createTicket(session.id);
    assert.equal(t.sessionId, session.id);
    assert.ok(t.ticket.length > 10);
  });

  it("listSessions: awaited, an array of every session over pages; iterated, the pages", async () => {
    const made: Session[] = [];
    try {
      for (let i = 0; i < 3; i++) made.push(await client.createSession({ ttlSeconds: 600 }));
      const all = await client.listSessions();
      assert.ok(Array.isArray(all));
      const ids = all.map((s) => s.id);
      for (const s of [session, ...made]) assert.ok(ids.includes(s.id));
      assert.equal(new Set(ids).size, ids.length);
      // The old page fields stay, deprecated, for one release.
      assert.equal(all.sessions, all);
      assert.equal(all.total, all.length);
      const pages: string[][] = [];
      for await (const page of client.listSessions()) pages.push(page.map((s) => s.id));
      assert.deepEqual(pages.flat(), ids);
      // An explicit limit or offset keeps its old meaning, one page, for
      // one release (deprecated): awaited or iterated.
      const two = await client.listSessions({ limit: 2 });
      assert.deepEqual(two.map((s) => s.id), ids.slice(0, 2));
      assert.equal(two.total, ids.length);
      const from1 = await client.listSessions({ offset: 1 });
      assert.deepEqual(from1.map((s) => s.id), ids.slice(1));
      const onePage: string[][] = [];
      for await (const page of client.listSessions({ limit: 2 })) onePage.push(page.map((s) => s.id));
      assert.deepEqual(onePage, [ids.slice(0, 2)]);
      const page = await client.listSessionsPage({ limit: 1 });
      assert.equal(page.sessions.length, 1);
      assert.equal(page.total, ids.length);
      await assert.rejects(client.listSessions({ limit: 0 }), RangeError);
      const bad = new SandboxClient({ baseUrl: gw.url, apiKey: token() });
      await assert.rejects(bad.listSessions(), UnauthorizedError);
    } finally {
      for (const s of made) await s.destroy();
    }
  });

  it('transport "auto": CONNECT when it passes, the WebSocket when a front refuses it', { timeout: 60_000 }, async () => {
    const direct = await openTunnel({ baseUrl: gw.url, apiKey: gw.token, sessionId: session.id, transport: "auto" });
    assert.match(await firstLine(direct), /^SSH-2\.0-/);

    const front = await refusingFront(gw.url);
    try {
      await assert.rejects(
        openTunnel({ baseUrl: front.url, apiKey: gw.token, sessionId: session.id, transport: "connect" }),
        (e: unknown) => connectRefused(e),
      );
      const sock = await openTunnel({ baseUrl: front.url, apiKey: gw.token, sessionId: session.id, transport: "auto" });
      assert.match(await firstLine(sock), /^SSH-2\.0-/);
      assert.ok(front.upgrades() >= 1, "the WebSocket went through the front");
      // SSH over it, end to end (REST passes the front as it is).
      const viaFront = new SandboxClient({ baseUrl: front.url, apiKey: gw.token });
      const ssh = await viaFront.ssh(session.id, { transport: "auto" });
      try {
        assert.equal((await ssh.runCommand("echo over-ws")).stdout, "over-ws\n");
      } finally {
        await ssh.close();
      }
      // The gateway's own refusals are final: no fallback on a 404.
      await assert.rejects(
        openTunnel({ baseUrl: gw.url, apiKey: gw.token, sessionId: "sbx-aaaaaaaaaaaaaaaaaaaa", transport: "auto" }),
        SessionNotFoundError,
      );
    } finally {
      await front.close();
    }
  });
});

/** The first line the stream sends (the SSH server's version line), then closes it. */
function firstLine(sock: NodeJS.ReadableStream & { destroy(): void }): Promise<string> {
  return new Promise((resolve, reject) => {
    let buf = "";
    const onData = (c: Buffer) => {
      buf += c.toString("latin1");
      const i = buf.indexOf("\n");
      if (i >= 0) {
        sock.removeListener("data", onData);
        sock.destroy();
        resolve(buf.slice(0, i).trim());
      }
    };
    sock.on("data", onData);
    sock.once("error", reject);
  });
}

/**
 * A front that refuses CONNECT (405, no gateway envelope) and passes every
 * other request, WebSocket upgrades included, to the gateway byte for byte.
 */
async function refusingFront(gatewayUrl: string): Promise<{ url: string; upgrades(): number; close(): Promise<void> }> {
  const gw = new URL(gatewayUrl);
  let upgrades = 0;
  const socks = new Set<net.Socket>();
  const server = net.createServer((c) => {
    socks.add(c);
    c.on("close", () => socks.delete(c));
    let head = Buffer.alloc(0);
    const onData = (chunk: Buffer) => {
      head = Buffer.concat([head, chunk]);
      if (head.indexOf("\r\n\r\n") < 0) return;
      c.removeListener("data", onData);
      const text = head.toString("latin1");
      if (text.startsWith("CONNECT ")) {
        c.end("HTTP/1.1 405 Method Not Allowed\r\nContent-Type: text/plain\r\nContent-Length: 18\r\nConnection: close\r\n\r\nMethod Not Allowed");
        return;
      }
      if (/^upgrade:\s*websocket/im.test(text)) upgrades++;
      const up = net.connect(Number(gw.port), gw.hostname, () => {
        up.write(head);
        c.pipe(up);
        up.pipe(c);
      });
      socks.add(up);
      up.on("close", () => {
        socks.delete(up);
        c.destroy();
      });
      up.on("error", () => c.destroy());
      c.on("close", () => up.destroy());
    };
    c.on("data", onData);
    c.on("error", () => {});
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const port = (server.address() as net.AddressInfo).port;
  return {
    url: `http://127.0.0.1:${port}`,
    upgrades: () => upgrades,
    close: () =>
      new Promise<void>((r) => {
        for (const s of socks) s.destroy();
        server.close(() => r());
      }),
  };
}
