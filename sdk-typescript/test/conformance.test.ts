// The SDK conformance suite (conformance/scenarios.json), run with the
// TypeScript SDK against a real gateway. The Python SDK runs the same file
// (sdk-python/tests/test_conformance.py): steps name operations by their
// Python name, and each runner maps them to its SDK (camelCased) and its
// results to the scenario's plain shape (see conformance/README.md).

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";

import * as sdk from "@sandgate/sdk";
import { type ExecResult, type ProcessInfo, SandboxClient, type Session } from "@sandgate/sdk";

import { type Gateway, REPO_ROOT, SKIP, startGateway, token } from "./helpers.js";

type Args = Record<string, unknown>;
type Plain = Record<string, unknown> | undefined;
interface Step {
  op: string;
  args?: Args;
  save?: string;
  as?: string;
  expect?: Record<string, unknown>;
  error?: { class: string; status?: number; code?: string };
}
interface Scenario {
  name: string;
  steps: Step[];
}

const SCENARIOS: Scenario[] = JSON.parse(readFileSync(join(REPO_ROOT, "conformance", "scenarios.json"), "utf8")).scenarios;

// -- results in the scenarios' plain shape ------------------------------------

function plainSession(s: Session): Plain {
  return {
    id: s.id,
    status: s.status,
    ttl: s.ttl,
    name: s.name ?? null,
    metadata: s.metadata,
    workspace: s.workspace ?? null,
    from_snapshot: s.fromSnapshot ?? null,
  };
}

function plainCommand(r: ExecResult): Plain {
  return {
    exit_code: r.exitCode,
    exit_signal: r.exitSignal ?? null,
    stdout: r.stdout,
    stderr: r.stderr,
    timed_out: r.timedOut,
    truncated: r.truncated,
    cwd: r.cwd,
  };
}

function plainProcess(p: ProcessInfo): Plain {
  return {
    process_id: p.processId,
    status: p.status,
    name: p.name ?? null,
    exit_code: p.exitCode ?? null,
    exit_signal: p.exitSignal ?? null,
  };
}

const names = (xs: { name: string }[]) => xs.map((x) => x.name).sort();
const str = (v: unknown) => v as string;
const secs = (v: unknown) => (v === undefined ? undefined : (v as number) * 1000);

/** Options with the keys that are set (undefined ones dropped). */
function opts<T extends object>(o: T): T {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as T;
}

/** The SDK call the scenario's op names (its Python name, camelCased), its result in the plain shape. */
async function doOp(c: SandboxClient, op: string, a: Args): Promise<Plain> {
  const sid = str(a["session"]);
  switch (op) {
    case "create_session":
      return plainSession(
        await c.createSession(
          opts({
            ttlSeconds: a["ttl"] as number,
            name: a["name"] as string,
            metadata: a["metadata"] as Record<string, unknown>,
            workspace: a["workspace"] as string,
            fromSnapshot: a["from_snapshot"] as string,
            resources: a["resources"] as sdk.Resources,
            secrets: a["secrets"] as string[],
            image: a["image"] as string,
          }),
        ),
      );
    case "get_session":
      return plainSession(await c.getSession(sid));
    case "update_session":
      return plainSession(await c.updateSession(sid, { ttlSeconds: a["ttl"] as number }));
    case "list_sessions": {
      const all = await c.listSessions();
      return { ids: all.map((s) => s.id), total: all.length };
    }
    case "delete_session":
      await c.deleteSession(sid);
      return undefined;
    case "stop_session":
      return plainSession(await c.stopSession(sid));
    case "run": {
      const out: (string | Uint8Array)[] = [];
      const err: (string | Uint8Array)[] = [];
      const stream = a["stream"] === true;
      const r = plainCommand(
        await c.run(
          sid,
          a["command"] as string | undefined,
          opts({
            argv: a["argv"] as string[],
            stdin: a["stdin"] as string,
            env: a["env"] as Record<string, string>,
            cwd: a["cwd"] as string,
            timeoutMs: secs(a["timeout"]),
            shell: a["shell"] as string,
            onStdout: stream ? (x: string | Uint8Array) => out.push(x) : undefined,
            onStderr: stream ? (x: string | Uint8Array) => err.push(x) : undefined,
          }),
        ),
      );
      const join = (xs: (string | Uint8Array)[]) => xs.map((x) => (typeof x === "string" ? x : new TextDecoder().decode(x))).join("");
      return stream ? { ...r, streamed_stdout: join(out), streamed_stderr: join(err) } : r;
    }
    case "session_logs":
      return { text: await c.sessionLogs(sid, opts({ tail: a["tail"] as number })) };
    case "host_keys": {
      const keys = await c.hostKeys();
      return { first: keys[0] ?? null, count: keys.length };
    }
    case "file_link": {
      const link = await c.fileLink(sid, str(a["path"]), opts({ expiresIn: a["expires_in"] as number }));
      return { fetched: await (await fetch(link.url)).text() };
    }
    case "create_ticket":
      return { session_id: (await c.createTicket(sid)).sessionId };
    case "list_images": {
      const images = await c.listImages();
      return { has_allow: Array.isArray(images.allow), images: images.images.map((i) => i.name) };
    }
    case "delete_shell":
      return { value: await c.deleteShell(sid, str(a["name"])) };
    case "write_file":
      await c.writeFile(sid, str(a["path"]), str(a["data"]));
      return undefined;
    case "read_file":
      return { text: new TextDecoder().decode(await c.readFile(sid, str(a["path"]), opts({ maxBytes: a["max_bytes"] as number }))) };
    case "list_files": {
      const fl = await c.listFiles(sid, (a["path"] as string) ?? ".", opts({ recursive: a["recursive"] as boolean }));
      return { names: names(fl), truncated: fl.truncated };
    }
    case "delete_file":
      await c.deleteFile(sid, str(a["path"]), opts({ recursive: a["recursive"] as boolean }));
      return undefined;
    case "start_process":
      return plainProcess(
        await c.startProcess(
          sid,
          a["command"] as string | undefined,
          opts({ argv: a["argv"] as string[], env: a["env"] as Record<string, string>, cwd: a["cwd"] as string, name: a["name"] as string }),
        ),
      );
    case "process_output": {
      const out = await (
        await c.processOutput(sid, str(a["process_id"]), opts({ offset: a["offset"] as number, follow: a["follow"] as boolean }))
      ).collect();
      return {
        stdout: out.stdout,
        stderr: out.stderr,
        done: out.last?.done ?? null,
        exit_code: out.last?.exitCode ?? null,
        exit_signal: out.last?.exitSignal ?? null,
      };
    }
    case "get_process":
      return plainProcess(await c.getProcess(sid, str(a["process_id"])));
    case "list_processes":
      return { process_ids: (await c.listProcesses(sid)).map((p) => p.processId) };
    case "send_process_input":
      await c.sendProcessInput(sid, str(a["process_id"]), str(a["data"]), opts({ eof: a["eof"] as boolean }));
      return undefined;
    case "signal_process":
      await c.signalProcess(sid, str(a["process_id"]), str(a["signal"]));
      return undefined;
    case "run_python": {
      const r = await c.runPython(sid, str(a["code"]), opts({ kernel: a["kernel"] as string, timeoutMs: secs(a["timeout"]) }));
      return { kernel: r.kernel, result: r.result, stdout: r.stdout, stderr: r.stderr, error_name: r.error?.name ?? null };
    }
    case "reset_python":
      return { ...(await c.resetPython(sid, opts({ kernel: a["kernel"] as string }))) } as unknown as Plain;
    case "create_workspace":
      return { name: (await c.createWorkspace(str(a["name"]))).name };
    case "list_workspaces":
      return { names: names(await c.listWorkspaces()) };
    case "delete_workspace":
      await c.deleteWorkspace(str(a["name"]));
      return undefined;
    case "create_snapshot":
      return { snapshot_id: (await c.createSnapshot(sid)).snapshotId };
    case "list_snapshots":
      return { snapshot_ids: (await c.listSnapshots(opts({ session: a["session"] as string }))).map((s) => s.snapshotId) };
    case "delete_snapshot":
      await c.deleteSnapshot(str(a["snapshot_id"]));
      return undefined;
  }
  throw new Error(`the TypeScript runner does not know op ${JSON.stringify(op)}`);
}

// -- the scenario language ------------------------------------------------------

const REF = /^\$([A-Za-z_]\w*)\.([A-Za-z_]\w*)$/;
const INTERP = /\$\{([A-Za-z_]\w*)(?:\.([A-Za-z_]\w*))?\}/g;

/** `v` with `$var.field` (a whole value) and `${var}` / `${var.field}` (in text) replaced. */
function resolve(v: unknown, env: Record<string, unknown>): unknown {
  if (typeof v === "string") {
    const m = REF.exec(v);
    if (m && m[1]! in env) return (env[m[1]!] as Record<string, unknown>)[m[2]!];
    return v.replace(INTERP, (_all, name: string, field?: string) =>
      String(field === undefined ? env[name] : (env[name] as Record<string, unknown>)[field]),
    );
  }
  if (Array.isArray(v)) return v.map((x) => resolve(x, env));
  if (v !== null && typeof v === "object") return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, resolve(x, env)]));
  return v;
}

function check(got: unknown, want: unknown, where: string): void {
  if (want !== null && typeof want === "object" && !Array.isArray(want)) {
    const keys = Object.keys(want);
    const kind = keys[0];
    if (keys.length === 1 && kind?.startsWith("$")) {
      const arg = (want as Record<string, unknown>)[kind];
      if (kind === "$match") assert.ok(typeof got === "string" && new RegExp(str(arg)).test(got), `${where}: ${JSON.stringify(got)} does not match ${arg}`);
      else if (kind === "$contains") assert.ok((got as unknown[]).includes(arg), `${where}: ${JSON.stringify(arg)} not in ${JSON.stringify(got)}`);
      else if (kind === "$excludes") assert.ok(!(got as unknown[]).includes(arg), `${where}: ${JSON.stringify(arg)} in ${JSON.stringify(got)}`);
      else assert.fail(`${where}: unknown matcher ${kind}`);
      return;
    }
  }
  assert.deepEqual(got, want, `${where}: got ${JSON.stringify(got)}, want ${JSON.stringify(want)}`);
}

function checkError(e: unknown, want: NonNullable<Step["error"]>, where: string): void {
  if (want.class === "ArgumentError") {
    // Bad arguments: TypeScript's TypeError or RangeError, thrown before anything is sent.
    assert.ok(e instanceof TypeError || e instanceof RangeError, `${where}: ${String(e)}`);
    return;
  }
  const cls = (sdk as unknown as Record<string, unknown>)[want.class];
  assert.equal(typeof cls, "function", `${where}: the TypeScript SDK has no error class ${want.class}`);
  assert.ok(e instanceof (cls as new (...a: never[]) => Error), `${where}: threw ${(e as Error)?.name}: ${(e as Error)?.message}, want ${want.class}`);
  const err = e as sdk.SandboxAPIError;
  if (want.status !== undefined) assert.equal(err.status, want.status, `${where}: status`);
  if (want.code !== undefined) assert.equal(err.code, want.code, `${where}: code`);
}

async function runScenario(scenario: Scenario, client: SandboxClient, bad: SandboxClient): Promise<void> {
  const env: Record<string, unknown> = { rand: randomBytes(4).toString("hex") };
  const made: string[] = [];
  try {
    for (const [i, step] of scenario.steps.entries()) {
      const where = `${JSON.stringify(scenario.name)} step ${i + 1} (${step.op})`;
      const args = resolve(step.args ?? {}, env) as Args;
      let got: Plain;
      try {
        got = await doOp(step.as === "bad_token" ? bad : client, step.op, args);
      } catch (e) {
        if (!step.error) throw new Error(`${where}: threw ${(e as Error)?.name}: ${(e as Error)?.message}`, { cause: e });
        checkError(e, step.error, where);
        continue;
      }
      assert.ok(!step.error, `${where}: succeeded (${JSON.stringify(got)}), want ${JSON.stringify(step.error)}`);
      if (step.op === "create_session" && got) made.push(str(got["id"]));
      if (step.save) env[step.save] = got;
      for (const [key, want] of Object.entries(resolve(step.expect ?? {}, env) as Record<string, unknown>)) {
        check(got?.[key], want, `${where}: ${key}`);
      }
    }
  } finally {
    for (const id of made) await client.deleteSession(id).catch(() => {});
  }
}

describe("conformance (conformance/scenarios.json)", { skip: SKIP }, () => {
  let gw: Gateway;
  let client: SandboxClient;
  let bad: SandboxClient;
  before(async () => {
    gw = await startGateway({ args: ["--rate-limit", "100000"] });
    client = new SandboxClient({ baseUrl: gw.url, apiKey: gw.token });
    bad = new SandboxClient({ baseUrl: gw.url, apiKey: token() });
  });
  after(async () => {
    await gw?.stop();
  });

  for (const scenario of SCENARIOS) {
    it(scenario.name, { timeout: 120_000 }, async () => {
      await runScenario(scenario, client, bad);
    });
  }

  it("every op of the scenarios has a TypeScript runner", () => {
    const src = readFileSync(join(REPO_ROOT, "sdk-typescript", "test", "conformance.test.ts"), "utf8");
    const ops = new Set(SCENARIOS.flatMap((s) => s.steps.map((st) => st.op)));
    const missing = [...ops].filter((op) => !src.includes(`case "${op}":`)).sort();
    assert.deepEqual(missing, []);
  });
});
