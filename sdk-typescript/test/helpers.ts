// Test support: a real sandgate binary on loopback.
//
// The binary is $SANDGATE_BIN, else ../bin/sandgate (make build). When it is
// missing the tests fail under CI=true and are skipped elsewhere.

import { type ChildProcess, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { accessSync, closeSync, constants, mkdtempSync, openSync, readFileSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

/** The sdk-typescript directory (this file runs from build-test/test/). */
export const SDK_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");
export const REPO_ROOT = resolve(SDK_ROOT, "..");

// Loopback must never go through a proxy from the environment; and the
// tests pass their URL and token explicitly unless they mean not to.
process.env["NO_PROXY"] = process.env["no_proxy"] = "127.0.0.1,localhost,::1";
delete process.env["SANDBOX_API_URL"];
delete process.env["SANDBOX_API_TOKEN"];

export function inCI(): boolean {
  return ["1", "true", "yes"].includes((process.env["CI"] ?? "").toLowerCase());
}

function findBinary(): { bin?: string; why?: string } {
  const env = process.env["SANDGATE_BIN"];
  const bin = env || join(REPO_ROOT, "bin", "sandgate");
  try {
    accessSync(bin, constants.X_OK);
    return { bin };
  } catch {
    return { why: env ? `SANDGATE_BIN=${env} is not an executable file` : `no sandgate binary at ${bin}: run make build or set SANDGATE_BIN` };
  }
}

const found = findBinary();
if (!found.bin && inCI()) {
  // Under CI a missing binary fails every test file, never skips it.
  throw new Error(`CI=true: ${found.why}`);
}
/** The binary, or undefined locally when there is none. */
export const SANDGATE_BIN: string | undefined = found.bin;
/** A `skip` value for describe(): the reason when the binary is missing (never under CI). */
export const SKIP: string | false = found.bin ? false : (found.why ?? "no sandgate binary");

/** The sandbox driver the tests use: workdir unless SANDGATE_TEST_SANDBOX says otherwise. */
export const SANDBOX_DRIVER = process.env["SANDGATE_TEST_SANDBOX"] || "workdir";

export interface Gateway {
  url: string;
  /** The first key's token (tenant default unless given as tenant:key). */
  token: string;
  tokens: string[];
  proc: ChildProcess;
  dir: string;
  log(): string;
  stop(): Promise<void>;
}

const running = new Set<ChildProcess>();
process.on("exit", () => {
  for (const p of running) p.kill("SIGKILL");
});

export function token(): string {
  return randomBytes(16).toString("hex");
}

/**
 * Starts `sandgate serve` on a free loopback port (--listen 127.0.0.1:0) and
 * waits for the URL it writes to --ready-file. `keys` are --api-key values.
 */
export async function startGateway(opts: { keys?: string[]; args?: string[] } = {}): Promise<Gateway> {
  if (!SANDGATE_BIN) throw new Error(SKIP || "no sandgate binary");
  const keys = opts.keys ?? [token()];
  const dir = mkdtempSync(join(tmpdir(), "sandgate-ts-"));
  const ready = join(dir, "ready");
  const logPath = join(dir, "sandgate.log");
  const args = ["serve", "--listen", "127.0.0.1:0", "--ready-file", ready, "--data-dir", join(dir, "data")];
  for (const k of keys) args.push("--api-key", k);
  args.push("--sandbox", SANDBOX_DRIVER, "--keep-sandboxes-on-exit=false", ...(opts.args ?? []));
  const fd = openSync(logPath, "w");
  const proc = spawn(SANDGATE_BIN, args, { stdio: ["ignore", fd, fd] });
  closeSync(fd);
  running.add(proc);
  let exited = false;
  const exitedP = new Promise<void>((r) => proc.once("exit", () => {
    exited = true;
    running.delete(proc);
    r();
  }));
  const log = () => {
    try {
      return readFileSync(logPath, "utf8");
    } catch {
      return "";
    }
  };
  const stop = async () => {
    if (!exited) {
      proc.kill("SIGTERM");
      const t = setTimeout(() => proc.kill("SIGKILL"), 20_000);
      await exitedP;
      clearTimeout(t);
    }
    rmSync(dir, { recursive: true, force: true });
  };
  const deadline = Date.now() + 20_000;
  while (Date.now() < deadline && !exited) {
    let url = "";
    try {
      url = readFileSync(ready, "utf8").trim();
    } catch {
      await new Promise((r) => setTimeout(r, 20));
      continue;
    }
    const tokens = keys.map((k) => k.slice(k.indexOf(":") + 1));
    return { url, token: tokens[0] ?? "", tokens, proc, dir, log, stop };
  }
  const text = log();
  await stop();
  throw new Error(`sandgate did not get ready; log:\n${text.slice(-4000)}`);
}

/** PIDs on this host whose command line contains `needle` (workdir commands are host processes). */
export function processesMatching(needle: string): number[] {
  const out: number[] = [];
  for (const e of readdirSync("/proc")) {
    if (!/^\d+$/.test(e) || Number(e) === process.pid) continue;
    try {
      const cmd = readFileSync(`/proc/${e}/cmdline`).toString().replace(/\0/g, " ");
      const stat = readFileSync(`/proc/${e}/stat`, "utf8");
      const state = stat.slice(stat.lastIndexOf(")") + 2).split(" ")[0];
      if (state !== "Z" && cmd.includes(needle)) out.push(Number(e));
    } catch {
      // gone
    }
  }
  return out;
}

export async function waitFor(cond: () => boolean, ms: number): Promise<boolean> {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (cond()) return true;
    await new Promise((r) => setTimeout(r, 50));
  }
  return cond();
}
