// The REST data plane's shapes and request bodies (commands, files,
// background processes, the Python kernel), checked before anything is
// sent, as the Python SDK's _dataplane.py.

import { constants as osConstants } from "node:os";

import { checkInt, checkTimeout } from "./common.js";
import { SandboxConnectionError, SandboxOperationError } from "./errors.js";

/** Options of a command (`SandboxClient.run`, `Session.exec`); as the Python SDK's `run`. */
export interface ExecOptions {
  /** Program and arguments, run with no shell parsing; instead of the command text. */
  argv?: string[];
  /** The command's whole standard input (text, or bytes sent base64); it then gets EOF. Default: empty. */
  stdin?: string | Uint8Array;
  /** Variables for this command: only TERM, LANG, LC_* and the gateway's allow-list (else `env_not_allowed`). */
  env?: Record<string, string>;
  /** Where it runs: relative to the workspace, or absolute in the sandbox. */
  cwd?: string;
  /** How long the command may run, in ms (gateway default 60 s); past it its whole tree is killed: exit code 124, `timedOut`. */
  timeoutMs?: number;
  /** Bytes kept per stream (gateway default 1 MiB, capped by the gateway). */
  maxOutputBytes?: number;
  /** Run in the session's persistent shell of this name (`cd`, `export`... carry over); see `shell()`. */
  shell?: string;
  /** Keep running if this client goes away (its result then lands in `listCommands`). */
  background?: boolean;
  /**
   * Called with each chunk of standard output as it arrives (a string, or
   * the bytes of a chunk that is not UTF-8 text). Giving it or `onStderr`
   * streams the command (`Accept: application/x-ndjson`), as the Python
   * SDK's `on_stdout`. If a callback throws, the request is dropped (which
   * kills the command unless `background`) and the error propagates.
   */
  onStdout?: (chunk: string | Uint8Array) => void;
  /** Called with each chunk of standard error as it arrives (see `onStdout`). */
  onStderr?: (chunk: string | Uint8Array) => void;
}

/** What a command returns (`SandboxClient.run`, `Session.exec`, `Shell.run`). */
export interface ExecResult {
  /** The exit status; 124 when the command timed out; 128 + signal number when a signal ended it. */
  exitCode: number;
  /** The signal that ended the command, if one did (`KILL`, ...). */
  exitSignal?: string;
  /** Where the command ran; for a shell, the shell's directory after it. */
  cwd: string;
  /** stdout followed by stderr. */
  output: string;
  stdout: string;
  stderr: string;
  /** The raw bytes of stdout and stderr (non-UTF-8 output arrives base64-encoded and is decoded). */
  stdoutBytes: Uint8Array;
  stderrBytes: Uint8Array;
  /** The gateway cut the output at its bound. */
  truncated: boolean;
  /** The command passed its timeout and was killed. */
  timedOut: boolean;
  durationMs: number;
  /**
   * A persistent shell's command ran in a new shell that replaced one that
   * ended (a timeout, an `exit`, a gateway restart that could not keep it):
   * started from the saved directory, exported variables, functions and
   * aliases, without the plain variables and jobs.
   */
  stateLost: boolean;
}

/** One command of the session's history (`listCommands`). */
export interface CommandRecord {
  command: string;
  source: "ssh" | "rest";
  shell?: string;
  startedAt: string;
  durationMs: number;
  exitCode: number | null;
  exitSignal?: string;
  timedOut?: boolean;
  bytesOut: number;
}

/** One entry of a directory listing (`listFiles`). */
export interface FileEntry {
  name: string;
  /** The request's path joined with the name, relative if it was. */
  path: string;
  type: "file" | "dir" | "symlink" | "other";
  sizeBytes: number;
  /** Octal permission bits (`"0644"`). */
  mode: string;
  mtime: string;
}

/** A directory listing: its entries, and `truncated` when it stopped at the gateway's 10,000 entries (as Python's FileList). */
export type FileList = FileEntry[] & { truncated: boolean };

/** Options of `writeFile`. */
export interface WriteOptions {
  /** Create missing parent directories (default true). */
  mkdirs?: boolean;
  /** Permission bits, a number (`0o755`) or octal text (`"0755"`). */
  mode?: number | string;
}

/** Options of `startProcess`; as the Python SDK's `start_process`. */
export interface StartProcessOptions {
  /** Program and arguments, run as they are (instead of the command text). */
  argv?: string[];
  /** Variables to set (at most 64); names the gateway does not allow are ignored and listed in `envIgnored`. */
  env?: Record<string, string>;
  /** Where it starts (relative to the workspace when relative). */
  cwd?: string;
  /** A label of your own (at most 64 characters). */
  name?: string;
}

/** A background process (`startProcess`, `listProcesses`, `getProcess`). */
export interface ProcessInfo {
  /** The gateway's id (`p1`): what the other process methods take. */
  processId: string;
  /** The pid as the sandbox sees it, when the driver tells. */
  pid?: number;
  name?: string;
  command: string;
  argv?: string[];
  cwd?: string;
  status: "running" | "exited" | "killed";
  exitCode?: number;
  exitSignal?: string;
  startedAt: string;
  endedAt?: string;
  outputBytes: number;
  outputStartOffset: number;
  /** Set once the output stopped being kept, and why (`disk_full`: the session's disk size was full); the process runs on. */
  outputTruncated?: "disk_full";
  /** With `outputTruncated`: the bytes the process wrote since, not kept. */
  outputDiscardedBytes?: number;
  /** Only from `startProcess`: the `env` names that were not set. */
  envIgnored?: string[];
  [field: string]: unknown;
}

/**
 * One line of a process's output (`processOutput`): bytes of one stream
 * (`offset` and `stdout`, `stderr`, `stdoutBase64` or `stderrBase64`), or
 * bytes no longer kept (`droppedBytes`), once `truncated` (`disk_full`)
 * where the output stopped being kept, or last `done` with `nextOffset`
 * (and `exitCode` or `exitSignal` when `done` is true; `error` with code
 * `session_paused` when `done` is false because the session was paused:
 * following again from `nextOffset` resumes it).
 */
export interface ProcessOutputLine {
  offset?: number;
  stdout?: string;
  stderr?: string;
  stdoutBase64?: string;
  stderrBase64?: string;
  droppedBytes?: number;
  truncated?: "disk_full";
  done?: boolean;
  exitCode?: number;
  exitSignal?: string;
  nextOffset?: number;
  error?: { code: string; message: string };
}

/** Options of `processOutput`. */
export interface ProcessOutputOptions {
  /** The first byte (both streams counted together); negative: that many bytes before the end. Default 0. */
  offset?: number;
  /** Go on as the process writes, until it has ended (default true). False: stop at the output's current end. */
  follow?: boolean;
}

/** Options of `runPython`. */
export interface RunPythonOptions {
  /** The kernel (default `default`); created on first use. */
  kernel?: string;
  /** How long the code may run, in ms (gateway default 60 s): SIGINT, then a restart 2 s later. */
  timeoutMs?: number;
  /** Per stream, and for the result (default 1 MiB, capped by the gateway). */
  maxOutputBytes?: number;
}

/** An uncaught exception of `runPython`'s code, or the kernel's death under it. */
export interface PythonError {
  /** The exception's class name, or `KernelDied`, `KernelRestarted`, `KernelReset`. */
  name: string;
  value: string;
  traceback: string;
}

/** What `runPython` returns. */
export interface PythonResult {
  kernel: string;
  stdout: string;
  stderr: string;
  /** The `repr` of the last expression's value; null when there is none, it is None, or the code raised. */
  result: string | null;
  error: PythonError | null;
  durationMs: number;
  truncated: boolean;
  timedOut: boolean;
  interrupted: boolean;
  restarted: boolean;
  stateLost: boolean;
}

/** What `resetPython` returns. */
export interface PythonReset {
  kernel: string;
  /** Whether the kernel had an interpreter. */
  existed: boolean;
}

/** An image of the gateway (`listImages`). */
export interface ImageInfo {
  name: string;
  digest: string;
  sizeBytes: number;
  pulledAt: string;
  [field: string]: unknown;
}

/** A name the operator made stand for another image (`serve --image-alias NAME=REF`). */
export interface ImageAlias {
  /** The name a create may ask for, as the operator gave it. */
  name: string;
  /** The image it stands for, normalised, or `default` (the gateway's own root). */
  image: string;
}

/** What `listImages` returns: the images present, the patterns a create may pull on demand, and the aliases. */
export interface ImageList {
  images: ImageInfo[];
  allow: string[];
  aliases: ImageAlias[];
}

/** A presigned link (`fileLink`, `portLink`): anyone holding `url` may use it until `expiresAt`. */
export interface Link {
  url: string;
  expiresAt: string;
}

/** A one-use ticket for the session's WebSockets (`createTicket`). */
export interface Ticket {
  ticket: string;
  sessionId: string;
  expiresAt: string;
  ttlSeconds: number;
}

/** The gateway's bound on one stdin request, as the Python SDK sends it. */
export const STDIN_CHUNK = 45 * 1024;

const SHELL_NAME = /^[A-Za-z0-9_.-]{1,64}$/;
const KERNEL_NAME = /^[A-Za-z0-9_.-]{0,64}$/;
const SIGNALS = ["ABRT", "ALRM", "FPE", "HUP", "ILL", "INT", "KILL", "PIPE", "QUIT", "SEGV", "TERM", "USR1", "USR2"];

function isRecord(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === "object" && !Array.isArray(v);
}

export function checkText(name: string, v: unknown, allowEmpty = false): string {
  if (typeof v !== "string") throw new TypeError(`${name} must be a string`);
  if (!allowEmpty && !v) throw new RangeError(`${name} must be a non-empty string`);
  if (v.includes("\0")) throw new RangeError(`${name} must not contain NUL`);
  return v;
}

export function checkShellName(name: unknown): string {
  if (typeof name !== "string" || !SHELL_NAME.test(name)) throw new RangeError("shell name must be 1 to 64 of A-Z a-z 0-9 _ . -");
  return name;
}

function checkEnv(env: unknown): Record<string, string> {
  if (!isRecord(env)) throw new TypeError("env must be an object of strings");
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(env)) {
    if (!k || /[=\0]/.test(k)) throw new RangeError(`env name ${JSON.stringify(k)} is not valid`);
    if (typeof v !== "string") throw new TypeError(`env.${k} must be a string`);
    out[k] = v;
  }
  return out;
}

/** `command` or `argv`, exactly one of them, as the API's fields. */
function commandFields(command: unknown, argv: unknown): Record<string, unknown> {
  if ((command === undefined || command === null) === (argv === undefined || argv === null)) {
    throw new TypeError("give exactly one of command and argv");
  }
  if (argv !== undefined && argv !== null) {
    if (!Array.isArray(argv) || argv.length === 0 || argv.some((a) => typeof a !== "string")) {
      throw new TypeError("argv must be a non-empty array of strings");
    }
    return { argv: [...argv] };
  }
  return { command: checkText("command", command) };
}

function bytesOrText(name: string, v: unknown, field: string): Record<string, string> {
  if (typeof v === "string") return { [field]: v };
  if (v instanceof Uint8Array) return { [`${field}Base64`]: Buffer.from(v).toString("base64") };
  throw new TypeError(`${name} must be a string or a Uint8Array`);
}

/** The JSON body of `POST .../commands`. */
export function commandBody(command: string | undefined, opts: ExecOptions): Record<string, unknown> {
  const body = commandFields(command, opts.argv);
  if (opts.stdin !== undefined) Object.assign(body, bytesOrText("stdin", opts.stdin, "stdin"));
  if (opts.env !== undefined) body["env"] = checkEnv(opts.env);
  if (opts.cwd !== undefined) body["cwd"] = checkText("cwd", opts.cwd);
  if (opts.timeoutMs !== undefined) body["timeout"] = checkTimeout("timeoutMs", opts.timeoutMs) / 1000;
  if (opts.maxOutputBytes !== undefined) body["maxOutputBytes"] = checkInt("maxOutputBytes", opts.maxOutputBytes, 0);
  if (opts.shell !== undefined) body["shell"] = checkShellName(opts.shell);
  if (opts.background !== undefined) {
    if (typeof opts.background !== "boolean") throw new TypeError("background must be a boolean");
    if (opts.background) body["background"] = true;
  }
  return body;
}

/** How long to wait for a command's answer: its timeout (or the gateway's default, 60 s), plus the client's. */
export function commandWaitMs(body: Record<string, unknown>, clientMs: number): number {
  const t = typeof body["timeout"] === "number" ? body["timeout"] * 1000 : 60_000;
  return t + clientMs;
}

/** A stream of an answer: `name`, or `nameBase64` when it is not UTF-8. */
export function streamBytes(data: Record<string, unknown>, name: "stdout" | "stderr"): Uint8Array {
  const b64 = data[`${name}Base64`];
  if (typeof b64 === "string") return new Uint8Array(Buffer.from(b64, "base64"));
  const text = data[name];
  return new TextEncoder().encode(typeof text === "string" ? text : "");
}

export function exitCodeForSignal(name: string): number {
  const n = (osConstants.signals as Record<string, number>)["SIG" + name.toUpperCase().replace(/^SIG/, "")];
  return n ? 128 + n : -1;
}

/** A `CommandResult` of the API as an ExecResult (as Python's command_result). */
export function execResult(data: Record<string, unknown>): ExecResult {
  const stdoutBytes = streamBytes(data, "stdout");
  const stderrBytes = streamBytes(data, "stderr");
  const dec = (b: Uint8Array) => new TextDecoder().decode(b);
  const stdout = dec(stdoutBytes);
  const stderr = dec(stderrBytes);
  const timedOut = data["timedOut"] === true;
  const exitSignal = typeof data["exitSignal"] === "string" && data["exitSignal"] ? data["exitSignal"] : undefined;
  let exitCode = typeof data["exitCode"] === "number" ? data["exitCode"] : exitSignal ? exitCodeForSignal(exitSignal) : -1;
  if (timedOut) exitCode = 124;
  return {
    exitCode,
    exitSignal,
    cwd: typeof data["cwd"] === "string" ? data["cwd"] : "",
    output: stdout + stderr,
    stdout,
    stderr,
    stdoutBytes,
    stderrBytes,
    truncated: data["truncated"] === true,
    timedOut,
    durationMs: typeof data["durationMs"] === "number" ? data["durationMs"] : 0,
    stateLost: data["stateLost"] === true,
  };
}

/** The query of `PUT .../files`. */
export function writeParams(path: string, opts: WriteOptions): URLSearchParams {
  const q = new URLSearchParams({ path: checkText("path", path) });
  const mkdirs = opts.mkdirs ?? true;
  if (typeof mkdirs !== "boolean") throw new TypeError("mkdirs must be a boolean");
  q.set("mkdirs", String(mkdirs));
  if (opts.mode !== undefined) {
    let mode: string;
    if (typeof opts.mode === "number") {
      checkInt("mode", opts.mode, 0, 0o7777);
      mode = opts.mode.toString(8).padStart(4, "0");
    } else if (typeof opts.mode === "string" && /^[0-7]{3,4}$/.test(opts.mode)) {
      mode = opts.mode.padStart(4, "0");
    } else {
      throw new TypeError('mode must be a number (0o644) or octal text ("0644")');
    }
    q.set("mode", mode);
  }
  return q;
}

/** A listing answer as a FileList. */
export function fileList(data: Record<string, unknown>, what: string): FileList {
  const entries = data["entries"];
  if (!Array.isArray(entries)) {
    throw new SandboxOperationError(`${what}: answer has no 'entries' list`, { body: JSON.stringify(data).slice(0, 4096) });
  }
  const list = entries.filter(isRecord) as unknown as FileEntry[];
  return Object.assign(list, { truncated: data["truncated"] === true });
}

/** The JSON body of `POST .../processes`. */
export function processBody(command: string | undefined, opts: StartProcessOptions): Record<string, unknown> {
  const body = commandFields(command, opts.argv);
  if (opts.env !== undefined) {
    body["env"] = checkEnv(opts.env);
    if (Object.keys(body["env"] as object).length > 64) throw new RangeError("env may hold at most 64 variables");
  }
  if (opts.cwd !== undefined) body["cwd"] = checkText("cwd", opts.cwd);
  if (opts.name !== undefined) {
    body["name"] = checkText("name", opts.name, true);
    if (opts.name.length > 64) throw new RangeError("name must be at most 64 characters");
  }
  return body;
}

/** The JSON bodies of `POST .../stdin` that write `data` (in order), as the Python SDK's. */
export function stdinBodies(data: string | Uint8Array, eof: boolean): Record<string, unknown>[] {
  let raw: Uint8Array;
  let smallText = false;
  if (typeof data === "string") {
    raw = new TextEncoder().encode(data);
    smallText = raw.length <= STDIN_CHUNK;
  } else if (data instanceof Uint8Array) {
    raw = data;
  } else {
    throw new TypeError("data must be a string or a Uint8Array");
  }
  if (typeof eof !== "boolean") throw new TypeError("eof must be a boolean");
  const bodies: Record<string, unknown>[] = [];
  if (smallText && raw.length > 0) bodies.push({ data });
  else {
    for (let i = 0; i < raw.length; i += STDIN_CHUNK) {
      bodies.push({ dataBase64: Buffer.from(raw.subarray(i, i + STDIN_CHUNK)).toString("base64") });
    }
  }
  if (eof) {
    const last = bodies[bodies.length - 1];
    if (last) last["eof"] = true;
    else bodies.push({ eof: true });
  }
  return bodies;
}

/** The JSON body of `POST .../signal`: the name without SIG. */
export function signalBody(signal: string): { signal: string } {
  if (typeof signal !== "string") throw new TypeError("signal must be a signal name");
  const sig = signal.toUpperCase().replace(/^SIG/, "");
  if (!SIGNALS.includes(sig)) throw new RangeError(`signal must be one of ${SIGNALS.join(", ")}, got ${JSON.stringify(signal)}`);
  return { signal: sig };
}

export function checkKernel(kernel: unknown): string {
  if (typeof kernel !== "string" || !KERNEL_NAME.test(kernel)) throw new RangeError("kernel must be 0 to 64 of A-Z a-z 0-9 _ . -");
  return kernel;
}

/** The JSON body of `POST .../python`. */
export function pythonBody(code: string, opts: RunPythonOptions): Record<string, unknown> {
  if (typeof code !== "string") throw new TypeError("code must be a string");
  const body: Record<string, unknown> = { code };
  if (opts.kernel !== undefined) body["kernel"] = checkKernel(opts.kernel);
  if (opts.timeoutMs !== undefined) body["timeout"] = checkTimeout("timeoutMs", opts.timeoutMs) / 1000;
  if (opts.maxOutputBytes !== undefined) body["maxOutputBytes"] = checkInt("maxOutputBytes", opts.maxOutputBytes, 0);
  return body;
}

/** A `PythonResult` of the API, its output decoded. */
export function pythonResult(data: Record<string, unknown>): PythonResult {
  const dec = (b: Uint8Array) => new TextDecoder().decode(b);
  const err = data["error"];
  return {
    kernel: typeof data["kernel"] === "string" ? data["kernel"] : "default",
    stdout: dec(streamBytes(data, "stdout")),
    stderr: dec(streamBytes(data, "stderr")),
    result: typeof data["result"] === "string" ? data["result"] : null,
    error: isRecord(err) ? (err as unknown as PythonError) : null,
    durationMs: typeof data["durationMs"] === "number" ? data["durationMs"] : 0,
    truncated: data["truncated"] === true,
    timedOut: data["timedOut"] === true,
    interrupted: data["interrupted"] === true,
    restarted: data["restarted"] === true,
    stateLost: data["stateLost"] === true,
  };
}

/**
 * A process's output as it comes (`processOutput`): `for await (const line
 * of out)`, or `close()` to drop the connection early (the process is not
 * affected). Lines are the API's (`ProcessOutputLine`).
 */
export class ProcessOutput implements AsyncIterable<ProcessOutputLine> {
  readonly #body: ReadableStream<Uint8Array>;
  readonly #abort: AbortController;
  readonly #what: string;
  #used = false;

  /** @internal */
  constructor(body: ReadableStream<Uint8Array>, abort: AbortController, what: string) {
    this.#body = body;
    this.#abort = abort;
    this.#what = what;
  }

  /** Drops the connection (safe to call more than once). */
  close(): void {
    this.#abort.abort();
  }

  /** Every line to the end, then the collected text of both streams (bytes decoded as UTF-8). */
  async collect(): Promise<{ lines: ProcessOutputLine[]; stdout: string; stderr: string; last: ProcessOutputLine | undefined }> {
    const lines: ProcessOutputLine[] = [];
    for await (const line of this) lines.push(line);
    const join = (k: "stdout" | "stderr") =>
      new TextDecoder().decode(Buffer.concat(lines.map((l) => Buffer.from(streamBytes(l as Record<string, unknown>, k)))));
    return { lines, stdout: join("stdout"), stderr: join("stderr"), last: lines[lines.length - 1] };
  }

  async *[Symbol.asyncIterator](): AsyncIterator<ProcessOutputLine> {
    if (this.#used) throw new TypeError("a process output can be read once");
    this.#used = true;
    yield* ndjsonLines(this.#body, this.#abort, this.#what) as AsyncGenerator<ProcessOutputLine>;
  }
}

/** The JSON objects of an NDJSON body, one per line; an `{"error": ...}` line throws. Aborts the request when done. */
export async function* ndjsonLines(
  body: ReadableStream<Uint8Array>,
  abort: AbortController,
  what: string,
): AsyncGenerator<Record<string, unknown>> {
  const reader = body.getReader();
  let buf = Buffer.alloc(0);
  try {
    for (;;) {
      let chunk: { done: boolean; value?: Uint8Array };
      try {
        chunk = await reader.read();
      } catch (e) {
        if (abort.signal.aborted) return;
        throw new SandboxConnectionError(`${what}: the connection broke: ${(e as Error).message}`, { cause: e });
      }
      if (chunk.done || !chunk.value) break;
      buf = Buffer.concat([buf, Buffer.from(chunk.value)]);
      let nl: number;
      while ((nl = buf.indexOf(10)) >= 0) {
        const line = buf.subarray(0, nl).toString("utf8").trim();
        buf = buf.subarray(nl + 1);
        if (line) yield parseLine(line, what) as Record<string, unknown>;
      }
    }
    const rest = buf.toString("utf8").trim();
    if (rest) yield parseLine(rest, what) as Record<string, unknown>;
  } finally {
    abort.abort();
    reader.releaseLock();
  }
}

/**
 * The result of a streamed command from its NDJSON lines: output chunks go
 * to the callbacks (text, or bytes when not UTF-8), the last line is the
 * result; as the Python SDK's RunStream.
 */
export async function streamedResult(
  lines: AsyncIterable<Record<string, unknown>>,
  onStdout: ExecOptions["onStdout"],
  onStderr: ExecOptions["onStderr"],
  what: string,
): Promise<ExecResult> {
  const out: Buffer[] = [];
  const err: Buffer[] = [];
  for await (const line of lines) {
    let chunk = false;
    for (const [name, sink, cb] of [["stdout", out, onStdout], ["stderr", err, onStderr]] as const) {
      if (typeof line[name] === "string") {
        sink.push(Buffer.from(line[name] as string, "utf8"));
        cb?.(line[name] as string);
        chunk = true;
      } else if (typeof line[`${name}Base64`] === "string") {
        const bytes = Buffer.from(line[`${name}Base64`] as string, "base64");
        sink.push(bytes);
        cb?.(new Uint8Array(bytes));
        chunk = true;
      }
    }
    if (chunk) continue;
    if ("exitCode" in line || "timedOut" in line) {
      return execResult({
        ...line,
        stdoutBase64: Buffer.concat(out).toString("base64"),
        stderrBase64: Buffer.concat(err).toString("base64"),
      });
    }
  }
  throw new SandboxConnectionError(`${what}: the stream ended before the command's result`);
}

/** A streamed command answered whole (a gateway that does not stream): each callback gets its stream in one chunk. */
export function wholeResult(data: Record<string, unknown>, onStdout: ExecOptions["onStdout"], onStderr: ExecOptions["onStderr"]): ExecResult {
  const r = execResult(data);
  if (r.stdout && onStdout) onStdout(r.stdout);
  if (r.stderr && onStderr) onStderr(r.stderr);
  return r;
}

function parseLine(line: string, what: string): ProcessOutputLine {
  let data: unknown;
  try {
    data = JSON.parse(line);
  } catch {
    throw new SandboxOperationError(`${what}: a line of the answer is not JSON`, { body: line.slice(0, 4096) });
  }
  if (!isRecord(data)) throw new SandboxOperationError(`${what}: a line of the answer is not a JSON object`, { body: line.slice(0, 4096) });
  if (isRecord(data["error"])) {
    const e = data["error"];
    throw new SandboxOperationError(`${what}: ${String(e["message"] ?? "error")}`, {
      code: typeof e["code"] === "string" ? e["code"] : undefined,
      body: line.slice(0, 4096),
    });
  }
  return data as ProcessOutputLine;
}
