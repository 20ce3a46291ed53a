// SandboxClient: the REST API (/v1/sessions) and a session's REST data plane.

import { randomUUID } from "node:crypto";
import { createWriteStream } from "node:fs";
import { once } from "node:events";
import { rm } from "node:fs/promises";
import { Readable, Transform } from "node:stream";
import { pipeline } from "node:stream/promises";

import {
  USER_AGENT,
  checkInt,
  checkTimeout,
  errorForStatus,
  headersObject,
  resolveSettings,
  restBase,
  sleep,
} from "./common.js";
import { SandboxAPIError, SandboxConnectionError, SandboxOperationError } from "./errors.js";
import { SessionSSH, type SSHOptions } from "./ssh.js";
import { type TLSOptions, type Transport, type TunnelSocket, openTunnel } from "./tunnel.js";
import {
  type CommandRecord,
  type ExecOptions,
  type ExecResult,
  type FileList,
  type ImageAlias,
  type ImageList,
  type Link,
  type ProcessInfo,
  type ProcessOutputOptions,
  type PythonReset,
  type PythonResult,
  type RunPythonOptions,
  type StartProcessOptions,
  type Ticket,
  type WriteOptions,
  ProcessOutput,
  ndjsonLines,
  streamedResult,
  wholeResult,
  checkKernel,
  checkShellName,
  checkText,
  commandBody,
  commandWaitMs,
  execResult,
  fileList,
  processBody,
  pythonBody,
  pythonResult,
  signalBody,
  stdinBodies,
  writeParams,
} from "./dataplane.js";

export const MIN_TTL = 60;
export const MAX_TTL = 28800;

/**
 * The `type` of the warning (`process.emitWarning`) emitted once per process
 * per gateway, the first time it answers a session with `"isolation": "none"` (its
 * workdir driver isolates nothing and enforces no limit). Filter it by this
 * type in a `process.on("warning")` listener, or by its code
 * (`node --disable-warning=SANDGATE_NO_ISOLATION`).
 */
export const ISOLATION_WARNING = "IsolationWarning";
/** The `code` of that warning. */
export const ISOLATION_WARNING_CODE = "SANDGATE_NO_ISOLATION";

/**
 * The gateways (normalised REST base URLs) this process has warned about,
 * on `globalThis` so that two copies of this module (an ESM and a CommonJS
 * import) share it.
 */
const ISOLATION_WARNED: Set<string> = ((globalThis as Record<symbol, unknown>)[Symbol.for("@sandgate/sdk.isolationWarned")] ??=
  new Set<string>()) as Set<string>;

/** One gateway's REST base URL, spelled one way: scheme and host lower case, the default port dropped, no trailing `/`. */
function gatewayKey(base: string): string {
  try {
    const u = new URL(base);
    return `${u.protocol}//${u.host}${u.pathname.replace(/\/+$/, "")}`;
  } catch {
    return base.toLowerCase().replace(/\/+$/, "");
  }
}

/** Whether this process has not yet warned about the gateway at `base` (and now has). */
function firstIsolationWarning(base: string): boolean {
  const key = gatewayKey(base);
  if (ISOLATION_WARNED.has(key)) return false;
  ISOLATION_WARNED.add(key);
  return true;
}

/** Pauses before createSession's retries (so two retries at most), as the Python SDK. */
const CREATE_RETRY_DELAYS_MS = [500, 1000];
/** Answers after which a create is retried (with the same Idempotency-Key). */
const CREATE_RETRY_STATUSES = new Set([500, 502, 503, 504]);
/** Error codes among those answers that a retry would not change: a pull past the gateway's deadline, a full image store. */
const CREATE_NO_RETRY_CODES = new Set(["image_pull_timeout", "image_store_full"]);

export interface SandboxClientOptions {
  /** The gateway's base URL (`https://gw.example.com`, `/v1` at the end is fine); default `$SANDBOX_API_URL`. */
  baseUrl?: string;
  /** The API key or JWT; default `$SANDBOX_API_TOKEN`. */
  apiKey?: string;
  /** How long each REST request may take, in ms (default 30000). */
  timeoutMs?: number;
  /**
   * TLS options for the tunnel and SSH (node:tls). REST requests use the
   * global fetch, which trusts the system roots plus `NODE_EXTRA_CA_CERTS`;
   * pass `fetch` for anything else (e.g. undici's fetch with a dispatcher).
   */
  tls?: TLSOptions;
  /** The fetch implementation for REST (default: the global fetch). */
  fetch?: typeof fetch;
}

/** The SSH access details of a session, as the API sends them (`ssh`). */
export interface SSHAccess {
  username: string;
  /** Only on the session createSession returns (and not on a replay). */
  password?: string;
  /** The gateway's SSH host keys as authorized_keys lines, ed25519 first. */
  hostKeys: string[];
  knownHostsLine: string;
  connectPath: string;
}

export interface Resources {
  memoryMiB?: number;
  cpus?: number;
  pids?: number;
  diskMiB?: number;
}

/** An egress rule per request: only these methods (none: any) to these paths (none: any; a final `*` matches any rest). */
export interface EgressRule {
  host: string;
  /** None: 80 and 443. */
  port?: number;
  methods?: string[];
  paths?: string[];
}

/** An egress entry: `"host[:port]"`, `"*.domain"`, an IP literal, or a rule per request. */
export type EgressEntry = string | EgressRule;

/** What a connection to a destination outside a session's egress list meets: refused, or parked for approval. */
export type EgressMode = "deny" | "ask";

export interface Egress {
  allow: EgressEntry[];
  bytesIn?: number;
  bytesOut?: number;
  /** `"ask"` for a session created with `egressMode: "ask"`; absent: deny. */
  mode?: "ask";
  /** In ask mode, the host:ports a remembered decision denied. */
  deny?: string[];
}

/** An event of `followEgressPending`: a connection parked (`pending`), or no longer waiting (`resolved`: its id, host and port). */
export interface EgressPendingEvent {
  event: "pending" | "resolved";
  pending: EgressPending;
}

/** One connection, request, refused name or approval of a session's egress (`GET /v1/sessions/{id}/egress`). */
export interface EgressDecision {
  seq: number;
  kind: "connect" | "http" | "https" | "tcp" | "dns" | "ask";
  host: string;
  port: number;
  /** The address dialled, absent when none was. */
  address?: string;
  allowed: boolean;
  /** Why it was denied, or what failed once allowed. */
  reason?: string;
  bytesIn: number;
  bytesOut: number;
  start: string;
  durationMs: number;
}

/** A page of egress decisions, newest first; `nextCursor` fetches older ones. */
export interface EgressDecisionPage {
  decisions: EgressDecision[];
  nextCursor?: string;
}

/**
 * A connection of an `egressMode: "ask"` session waiting for a decision
 * (`GET /v1/sessions/{id}/egress/pending`). The process that asked is not
 * known to the gateway; `userAgent` is a proxy request's, if any.
 */
export interface EgressPending {
  id: string;
  host: string;
  port: number;
  since: string;
  via: "proxy" | "transparent";
  userAgent?: string;
}

/**
 * A secret given to a session: a name, or a secret bound to hosts. An
 * operator's `ssh-key` secret is bound to its hosts with no header or
 * format (`{ name: "DEPLOY_KEY", hosts: ["github.com:22"] }`): the gateway's
 * SSH agent at `SSH_AUTH_SOCK` signs with it, the key never in the sandbox.
 */
export type SecretRef = string | { name: string; hosts?: string[]; header?: string; format?: string };

export interface CreateSessionOptions {
  /** Sandbox image; the gateway's default when omitted. */
  image?: string;
  /** Lifetime in seconds, 60..28800 (default 3600); sent as `ttl`. */
  ttlSeconds?: number;
  /** A JSON object stored with the session. */
  metadata?: Record<string, unknown>;
  /** Hosts the sandbox may reach through the gateway's egress proxy: strings, or rules per request. */
  egress?: EgressEntry[];
  /** `"deny"` (default): a connection outside `egress` is refused; `"ask"`: it waits for approval (`listEgressPending`, `decideEgress`). */
  egressMode?: EgressMode;
  /** Operator-defined secrets to give the session, by name. */
  secrets?: SecretRef[];
  /** The sandbox's limits, with the API's names; omitted ones: the gateway's defaults. */
  resources?: Resources;
  /** An authorized_keys line whose private key may then authenticate over SSH. */
  sshPublicKey?: string;
  /** Sent as `Idempotency-Key`; default a fresh random UUID. */
  idempotencyKey?: string;
  /**
   * A named workspace of the tenant (`createWorkspace`) to mount at
   * `/workspace`; its files are kept when the session ends.
   * `WorkspaceNotFoundError`, or `WorkspaceBusyError` when another live
   * session holds it.
   */
  workspace?: string;
  /** A snapshot id (`createSnapshot`) whose files the new `/workspace` starts with; not with `workspace`. */
  fromSnapshot?: string;
  /**
   * A name for the session, unique among the tenant's live sessions
   * (`409 name_taken`). Every method that takes a session id also takes
   * it (an id always wins), and so does `sandgate proxy` (`ssh NAME.sandgate`).
   */
  name?: string;
}

/** How far the object store's copy of a workspace is behind (`sync`, `workspaceSync`). */
export interface SyncState {
  /** RFC 3339; null before the first sync. */
  lastSyncedAt: string | null;
  pendingBytes: number;
  lastError?: string;
}

/** A named workspace (`POST/GET /v1/workspaces`). */
export interface Workspace {
  name: string;
  sizeBytes: number;
  files: number;
  createdAt: string;
  lastUsedAt: string;
  /** The live session holding it, if any. */
  inUseBy?: string;
  sync?: SyncState;
}

/** A snapshot of a session's workspace. The last three fields come only from `createSnapshot`, `sessionId` only from `listSnapshots`. */
export interface Snapshot {
  snapshotId: string;
  sizeBytes: number;
  files: number;
  createdAt: string;
  sessionId?: string;
  storedBytes?: number;
  frozenMillis?: number;
  /** False where the driver cannot freeze processes (workdir): not a point-in-time copy. */
  consistent?: boolean;
}

export interface ByteCounts {
  bytesIn: number;
  bytesOut: number;
}

/** A session's resource use now (`GET /v1/sessions/{id}/stats`); groups the driver cannot measure are absent. */
export interface SessionStats {
  sessionId: string;
  status: "running" | "stopped";
  sampledAt: string;
  memory?: { currentBytes: number; peakBytes?: number; limitBytes?: number };
  cpu?: { seconds: number; limit?: number };
  pids?: { current: number; limit?: number };
  /** `usedBytes` includes `processOutputBytes`: background processes' output kept on the gateway's host, charged to the same size. */
  disk?: { usedBytes: number; totalBytes?: number; processOutputBytes?: number };
  tunnel: ByteCounts;
  egress: ByteCounts;
}

/**
 * A presigned preview link: anyone holding `url` reaches the port's server until `expiresAt`.
 * The URL is the preview's own origin (`http://p{port}-{label}.localhost:{api port}/` by default),
 * shared with no other session and not with the API.
 */
export interface PortLink {
  /** Ends in `/`; append the server's path. */
  url: string;
  expiresAt: string;
}

/** One audit event (fields a kind does not use are absent; see the API's AuditEvent). */
export interface AuditEvent {
  seq: number;
  time: string;
  kind: string;
  tenant?: string;
  session?: string;
  requestId?: string;
  op?: string;
  route?: string;
  method?: string;
  status?: number;
  result?: string;
  reason?: string;
  [field: string]: unknown;
}

/** A page of audit events, newest first; `nextCursor` (absent on the last page) fetches older ones. */
export interface AuditPage {
  events: AuditEvent[];
  nextCursor?: string;
}

export interface AuditQuery {
  /** Only this session's events. */
  session?: string;
  /** Only events at or after this time (a Date, or RFC 3339 text). */
  since?: Date | string;
  /** At most this many events per page, 1..1000 (default 100). */
  limit?: number;
  /** A previous page's `nextCursor`. */
  cursor?: string;
}

/** The query of `sessionTimeline` (`GET /v1/sessions/{id}/timeline`). */
export interface TimelineQuery {
  /** Only these kinds: `command`, `egress`, `file`, `session` (one or a list). */
  kind?: TimelineKind | TimelineKind[];
  /** Only events newer than the one with this `seq` (to follow a running session). */
  after?: number;
  /** At most this many events, 1..1000 (default 100); a page may hold fewer, or none, and still have a `nextCursor`. */
  limit?: number;
  /** A previous page's `nextCursor`, for older events. */
  cursor?: string;
}

/** The kinds of event a session's timeline holds. */
export type TimelineKind = "command" | "egress" | "file" | "session";

const TIMELINE_KINDS: readonly string[] = ["command", "egress", "file", "session"];

export interface ReadOptions {
  /** Read at most this many bytes from the start of the file (a `Range` request). */
  maxBytes?: number;
}

/** Options of `Session.fetchUrls`. */
export interface FetchOptions {
  /** The sandbox directory the files go to (default the workspace); created if missing. */
  destDir?: string;
  /**
   * Replace files already there. False (the default) never replaces
   * anything: a download takes the next free name (`a-1.csv`).
   */
  overwrite?: boolean;
}

/** What `Session.fetchUrls` did: one URL's failure is in `errors`, not thrown. */
export interface FetchResult {
  status: "success" | "partial_success" | "failure";
  /** The paths written, in the order of the URLs. */
  fetched: string[];
  errors: { url: string; error: string }[];
}

/** One page of `GET /v1/sessions` (`listSessionsPage`; Python's `list_sessions`). */
export interface SessionList {
  sessions: Session[];
  total: number;
  limit: number;
  offset: number;
}

/**
 * What awaiting `listSessions()` gives: the sessions, in an array. The
 * page's fields are kept on it for one release, for code written against
 * the old page-shaped answer.
 */
export type SessionArray = Session[] & {
  /** @deprecated The array itself is the list: use it (`for (const s of await client.listSessions())`). */
  readonly sessions: Session[];
  /** @deprecated Use `.length`, or `listSessionsPage()` for the gateway's count. */
  readonly total: number;
  /** @deprecated Use `listSessionsPage()` for one page. */
  readonly limit: number;
  /** @deprecated Use `listSessionsPage()` for one page. */
  readonly offset: number;
};

/**
 * What `listSessions()` returns: await it for every session (an array,
 * fetched page by page), or iterate it for the pages:
 * `for await (const page of client.listSessions())`. Given an explicit
 * `limit` or `offset` it is that one page only (deprecated, for one
 * release: use `listSessionsPage()`).
 */
export class SessionListing implements Promise<SessionArray>, AsyncIterable<Session[]> {
  readonly [Symbol.toStringTag] = "SessionListing";
  readonly #fetchPage: (offset: number) => Promise<SessionList>;
  readonly #offset: number;
  readonly #single: boolean;
  #all: Promise<SessionArray> | undefined;

  /** @internal */
  constructor(fetchPage: (offset: number) => Promise<SessionList>, offset: number, single = false) {
    this.#fetchPage = fetchPage;
    this.#offset = offset;
    this.#single = single;
  }

  async *[Symbol.asyncIterator](): AsyncIterator<Session[]> {
    let offset = this.#offset;
    for (;;) {
      const page = await this.#fetchPage(offset);
      if (page.sessions.length === 0) return;
      yield page.sessions;
      offset += page.sessions.length;
      if (this.#single || offset >= page.total) return;
    }
  }

  async #collect(): Promise<SessionArray> {
    const all: Session[] = [];
    let total = 0;
    let limit = 0;
    let offset = this.#offset;
    for (;;) {
      const page = await this.#fetchPage(offset);
      if (!limit) limit = page.limit;
      total = page.total;
      all.push(...page.sessions);
      offset += page.sessions.length;
      if (this.#single || page.sessions.length === 0 || offset >= page.total) break;
    }
    const arr = all as SessionArray;
    for (const [k, v] of [["sessions", all], ["total", total], ["limit", limit], ["offset", this.#offset]] as const) {
      Object.defineProperty(arr, k, { value: v, enumerable: false });
    }
    return arr;
  }

  then<R1 = SessionArray, R2 = never>(
    onfulfilled?: ((value: SessionArray) => R1 | PromiseLike<R1>) | null,
    onrejected?: ((reason: unknown) => R2 | PromiseLike<R2>) | null,
  ): Promise<R1 | R2> {
    this.#all ??= this.#collect();
    return this.#all.then(onfulfilled, onrejected);
  }

  catch<R = never>(onrejected?: ((reason: unknown) => R | PromiseLike<R>) | null): Promise<SessionArray | R> {
    return this.then(undefined, onrejected);
  }

  finally(onfinally?: (() => void) | null): Promise<SessionArray> {
    this.#all ??= this.#collect();
    return this.#all.finally(onfinally);
  }
}

/**
 * A handle on one of the session's persistent shells (`shell()`): its
 * commands share `cd`, `export`, functions and aliases. Created by its
 * first command; `close()` ends it. As the Python SDK's `Shell`.
 */
export class Shell {
  readonly sessionId: string;
  readonly name: string;
  readonly #client: SandboxClient;

  /** @internal */
  constructor(client: SandboxClient, sessionId: string, name: string) {
    this.#client = client;
    this.sessionId = sessionId;
    this.name = checkShellName(name);
  }

  /** Runs `command` (or `opts.argv`) in this shell. */
  run(command?: string, opts: Omit<ExecOptions, "shell"> = {}): Promise<ExecResult> {
    return this.#client.run(this.sessionId, command, { ...opts, shell: this.name });
  }

  /** Ends the shell (`DELETE .../shells/{name}`); false if there was none. */
  close(): Promise<boolean> {
    return this.#client.deleteShell(this.sessionId, this.name);
  }
}

interface Answer {
  status: number;
  headers: Record<string, string>;
  body: Uint8Array;
}

interface RequestOptions {
  what: string;
  sessionScoped?: boolean;
  json?: unknown;
  body?: Uint8Array;
  headers?: Record<string, string>;
  timeoutMs?: number;
  /** Statuses that are not errors besides 2xx. */
  accept?: number[];
}

/** A sandbox session, as the REST API describes it, with its data plane. */
export class Session {
  /** The session's id (`sbx-...`); the same as `sessionId`. */
  readonly id: string;
  readonly sessionId: string;
  readonly status: string;
  readonly statusReason: string | undefined;
  readonly image: string;
  readonly imageDigest: string | undefined;
  readonly metadata: Record<string, unknown>;
  readonly resources: Resources | undefined;
  readonly egress: Egress | undefined;
  readonly secrets: SecretRef[] | undefined;
  /** The name given at create, if any; it works wherever the id does. */
  readonly name: string | undefined;
  /** `"none"` when the gateway does not isolate sessions (its workdir driver; `raw.unenforced` lists the limits nothing enforces). */
  readonly isolation: string | undefined;
  /** The named workspace the session holds, if any. */
  readonly workspace: string | undefined;
  /** The snapshot the session started from, if any. */
  readonly fromSnapshot: string | undefined;
  /** The held workspace's sync state, if any. */
  readonly workspaceSync: SyncState | undefined;
  /** RFC 3339 timestamps, as sent. */
  readonly createdAt: string;
  readonly expiresAt: string;
  readonly lastActivityAt: string;
  readonly ttl: number;
  /**
   * The API's `ssh` object (username, password, hostKeys, knownHostsLine,
   * connectPath). Named `sshInfo` because `ssh()` connects.
   */
  readonly sshInfo: SSHAccess;
  /** The JSON object the gateway sent, unchanged. */
  readonly raw: Record<string, unknown>;
  /** True when createSession got a replay of an earlier create with the same Idempotency-Key. */
  readonly replayed: boolean;

  readonly #client: SandboxClient;

  /** @internal Built by SandboxClient from an API answer. */
  constructor(client: SandboxClient, data: Record<string, unknown>, replayed = false) {
    this.#client = client;
    const str = (k: string): string => {
      const v = data[k];
      if (typeof v !== "string") throw new TypeError(`field ${k} is not a string`);
      return v;
    };
    const optStr = (k: string): string | undefined => (typeof data[k] === "string" ? (data[k] as string) : undefined);
    this.sessionId = str("sessionId");
    this.id = this.sessionId;
    this.status = str("status");
    this.statusReason = optStr("statusReason");
    this.image = optStr("image") ?? "";
    this.imageDigest = optStr("imageDigest");
    this.metadata = isObject(data["metadata"]) ? (data["metadata"] as Record<string, unknown>) : {};
    this.resources = isObject(data["resources"]) ? (data["resources"] as Resources) : undefined;
    this.egress = isObject(data["egress"]) ? (data["egress"] as unknown as Egress) : undefined;
    this.secrets = Array.isArray(data["secrets"]) ? (data["secrets"] as SecretRef[]) : undefined;
    this.name = optStr("name");
    this.isolation = optStr("isolation");
    this.workspace = optStr("workspace");
    this.fromSnapshot = optStr("fromSnapshot");
    this.workspaceSync = isObject(data["workspaceSync"]) ? (data["workspaceSync"] as unknown as SyncState) : undefined;
    this.createdAt = optStr("createdAt") ?? "";
    this.expiresAt = optStr("expiresAt") ?? "";
    this.lastActivityAt = optStr("lastActivityAt") ?? "";
    this.ttl = typeof data["ttl"] === "number" ? data["ttl"] : 0;
    const ssh = isObject(data["ssh"]) ? (data["ssh"] as Record<string, unknown>) : {};
    this.sshInfo = {
      username: typeof ssh["username"] === "string" ? ssh["username"] : "sandbox",
      password: typeof ssh["password"] === "string" ? ssh["password"] : undefined,
      hostKeys: Array.isArray(ssh["hostKeys"]) ? ssh["hostKeys"].filter((k): k is string => typeof k === "string") : [],
      knownHostsLine: typeof ssh["knownHostsLine"] === "string" ? ssh["knownHostsLine"] : "",
      connectPath: typeof ssh["connectPath"] === "string" ? ssh["connectPath"] : "",
    };
    this.raw = data;
    this.replayed = replayed;
  }

  /** The client this session came from. */
  get client(): SandboxClient {
    return this.#client;
  }

  /** Keeps the password out of console.log / util.inspect. */
  [Symbol.for("nodejs.util.inspect.custom")](): string {
    return `Session { id: '${this.id}', status: '${this.status}', image: '${this.image}', expiresAt: '${this.expiresAt}' }`;
  }

  toJSON(): Record<string, unknown> {
    const { ssh, ...rest } = this.raw as { ssh?: Record<string, unknown> };
    if (!ssh) return { ...rest };
    const { password: _password, ...sshRest } = ssh;
    return { ...rest, ssh: sshRest };
  }

  /** A fresh copy of this session from the gateway (`GET /v1/sessions/{id}`). */
  refresh(): Promise<Session> {
    return this.#client.getSession(this.id);
  }

  /**
   * Runs a command in the sandbox (`POST /v1/sessions/{id}/commands`), a
   * fresh process each time, as the Python SDK's `run`: `cmd` is shell
   * text, or give `opts.argv` (no shell parsing) instead; `stdin`, `env`,
   * `cwd`, `timeoutMs`, `maxOutputBytes`. A timeout is not an error: the
   * result has `timedOut` and exit code 124. For `cd` and `export` that
   * carry over, use a persistent shell: `shell().run(cmd)` (or
   * `exec(cmd, { shell: "default" })`, what `exec` did before).
   */
  exec(cmd?: string, opts: ExecOptions = {}): Promise<ExecResult> {
    return this.#client.run(this.id, cmd, opts);
  }

  /** The same as `exec` (the Python SDK's name). */
  run(command?: string, opts: ExecOptions = {}): Promise<ExecResult> {
    return this.#client.run(this.id, command, opts);
  }

  /** A handle on the session's persistent shell `name` (default `default`); see `Shell`. */
  shell(name = "default"): Shell {
    return this.#client.shell(this.id, name);
  }

  /**
   * Runs `cmd` in the session's persistent shell `default`.
   * @deprecated `exec` now runs a fresh process, as in the Python SDK; use
   * `shell().run(cmd)` for the persistent shell. Kept for one release.
   */
  execInShell(cmd: string, opts: Omit<ExecOptions, "shell"> = {}): Promise<ExecResult> {
    return this.#client.run(this.id, cmd, { ...opts, shell: "default" });
  }

  /** Writes a file (`writeFile`); parent directories are created. */
  writeFile(path: string, content: string | Uint8Array, opts: WriteOptions = {}): Promise<void> {
    return this.#client.writeFile(this.id, path, content, opts);
  }

  /** Reads a file (`readFile`). */
  readFile(path: string, opts: ReadOptions = {}): Promise<Uint8Array> {
    return this.#client.readFile(this.id, path, opts);
  }

  /** Streams a file to a local path (`readFileTo`). */
  readFileTo(path: string, dest: string): Promise<number> {
    return this.#client.readFileTo(this.id, path, dest);
  }

  /** Lists a directory (`listFiles`). */
  listFiles(path = ".", opts: { recursive?: boolean } = {}): Promise<FileList> {
    return this.#client.listFiles(this.id, path, opts);
  }

  /** Deletes a file or directory (`deleteFile`). */
  deleteFile(path: string, opts: { recursive?: boolean } = {}): Promise<void> {
    return this.#client.deleteFile(this.id, path, opts);
  }

  /** Starts a background process (`startProcess`). */
  startProcess(command?: string, opts: StartProcessOptions = {}): Promise<ProcessInfo> {
    return this.#client.startProcess(this.id, command, opts);
  }

  /** The session's background processes (`listProcesses`). */
  listProcesses(): Promise<ProcessInfo[]> {
    return this.#client.listProcesses(this.id);
  }

  /** One background process (`getProcess`). */
  getProcess(processId: string): Promise<ProcessInfo> {
    return this.#client.getProcess(this.id, processId);
  }

  /** A background process's output, followed (`processOutput`). */
  processOutput(processId: string, opts: ProcessOutputOptions = {}): Promise<ProcessOutput> {
    return this.#client.processOutput(this.id, processId, opts);
  }

  /** Writes to a background process's stdin (`sendProcessInput`). */
  sendProcessInput(processId: string, data: string | Uint8Array, opts: { eof?: boolean } = {}): Promise<void> {
    return this.#client.sendProcessInput(this.id, processId, data, opts);
  }

  /** Signals a background process (`signalProcess`). */
  signalProcess(processId: string, signal = "TERM"): Promise<void> {
    return this.#client.signalProcess(this.id, processId, signal);
  }

  /** Runs Python in the session's persistent kernel (`runPython`). */
  runPython(code: string, opts: RunPythonOptions = {}): Promise<PythonResult> {
    return this.#client.runPython(this.id, code, opts);
  }

  /** Resets a Python kernel (`resetPython`). */
  resetPython(opts: { kernel?: string } = {}): Promise<PythonReset> {
    return this.#client.resetPython(this.id, opts);
  }

  /** Stops the session, keeping its files (`stopSession`). */
  stop(): Promise<Session> {
    return this.#client.stopSession(this.id);
  }

  /** Pauses the session's processes in place, memory kept (`pauseSession`). */
  pause(): Promise<Session> {
    return this.#client.pauseSession(this.id);
  }

  /** Resumes the paused session (`resumeSession`). */
  resume(): Promise<Session> {
    return this.#client.resumeSession(this.id);
  }

  /** Copies the running session, processes and memory included (`forkSession`). */
  fork(opts: { count?: number } = {}): Promise<Session[]> {
    return this.#client.forkSession(this.id, opts);
  }

  /** Snapshots the session's workspace (`createSnapshot`). */
  snapshot(): Promise<Snapshot> {
    return this.#client.createSnapshot(this.id);
  }

  /** Writes a file, as `writeFile` (the name seed 003's users know). */
  write(path: string, content: string | Uint8Array): Promise<void> {
    return this.#client.writeFile(this.id, path, content);
  }

  /** Reads a file, as `readFile` (the name seed 003's users know); with maxBytes, at most that many bytes from its start. */
  read(path: string, opts: ReadOptions = {}): Promise<Uint8Array> {
    return this.#client.readFile(this.id, path, opts);
  }

  /** Has the gateway download `urls` into the sandbox (`fetchUrls`). */
  fetchUrls(urls: string[], opts: FetchOptions = {}): Promise<FetchResult> {
    return this.#client.fetchUrls(this.id, urls, opts);
  }

  /**
   * Deletes the session and everything in its sandbox; `discard: true` ends
   * it without saving its named workspace (see `deleteSession`).
   */
  destroy(opts: { discard?: boolean } = {}): Promise<void> {
    return this.#client.deleteSession(this.id, opts);
  }

  /** Opens the CONNECT tunnel (or WebSocket) to this session's SSH server (see openTunnel). */
  openTunnel(opts: { timeoutMs?: number; transport?: Transport } = {}): Promise<TunnelSocket> {
    return this.#client.openTunnel(this.id, opts);
  }

  /**
   * Connects over SSH (ssh2) through the tunnel: host keys pinned from
   * `sshInfo.hostKeys`, the session's password when this object has it,
   * else SSH `none` authentication (the tunnel carried the bearer token).
   */
  ssh(opts: SSHOptions = {}): Promise<SessionSSH> {
    return this.#client._connectSSH(this.id, this.sshInfo, opts);
  }
}

/** Client of the sandgate REST API. */
export class SandboxClient {
  readonly baseUrl: string;
  readonly timeoutMs: number;
  readonly tls: TLSOptions;
  readonly #apiKey: string;
  readonly #base: string;
  readonly #fetch: typeof fetch;

  constructor(options: SandboxClientOptions = {}) {
    const { baseUrl, apiKey } = resolveSettings(options.baseUrl, options.apiKey);
    this.baseUrl = baseUrl;
    this.#apiKey = apiKey;
    this.#base = restBase(baseUrl);
    this.timeoutMs = checkTimeout("timeoutMs", options.timeoutMs ?? 30_000);
    this.tls = { ...(options.tls ?? {}) };
    this.#fetch = options.fetch ?? globalThis.fetch;
  }

  [Symbol.for("nodejs.util.inspect.custom")](): string {
    return `SandboxClient { baseUrl: '${this.baseUrl}' }`;
  }

  /**
   * Creates a session (`POST /v1/sessions`) with an `Idempotency-Key`. When
   * the gateway cannot be reached, the connection breaks, the request times
   * out, or it answers 500/502/503/504, the create is sent again with the
   * same key, up to twice more (after 0.5 s, then 1 s): a create whose
   * answer was lost never makes a second session. TLS errors,
   * `image_pull_timeout` and `image_store_full` (a retry would not change
   * them) and other answers (4xx, 429 included) are thrown at once.
   */
  async createSession(opts: CreateSessionOptions = {}): Promise<Session> {
    const body: Record<string, unknown> = { ttl: checkInt("ttlSeconds", opts.ttlSeconds ?? 3600, MIN_TTL, MAX_TTL) };
    if (opts.image !== undefined) {
      if (typeof opts.image !== "string" || !opts.image) throw new TypeError("image must be a non-empty string");
      body["image"] = opts.image;
    }
    if (opts.metadata !== undefined) {
      if (!isObject(opts.metadata)) throw new TypeError("metadata must be an object");
      body["metadata"] = opts.metadata;
    }
    if (opts.resources !== undefined) body["resources"] = checkResources(opts.resources);
    if (opts.egress !== undefined) body["egress"] = checkEgress("egress", opts.egress);
    if (opts.egressMode !== undefined) {
      if (opts.egressMode !== "deny" && opts.egressMode !== "ask") throw new RangeError('egressMode must be "deny" or "ask"');
      body["egressMode"] = opts.egressMode;
    }
    if (opts.secrets !== undefined) body["secrets"] = checkSecrets(opts.secrets);
    if (opts.sshPublicKey !== undefined) {
      if (typeof opts.sshPublicKey !== "string" || !opts.sshPublicKey.trim()) {
        throw new TypeError("sshPublicKey must be an authorized_keys line");
      }
      body["sshPublicKey"] = opts.sshPublicKey.trim();
    }
    if (opts.workspace !== undefined && opts.fromSnapshot !== undefined) {
      throw new TypeError("give workspace or fromSnapshot, not both");
    }
    if (opts.workspace !== undefined) body["workspace"] = checkName("workspace", opts.workspace);
    if (opts.fromSnapshot !== undefined) body["fromSnapshot"] = checkName("fromSnapshot", opts.fromSnapshot);
    if (opts.name !== undefined) body["name"] = checkName("name", opts.name);
    let key = opts.idempotencyKey;
    if (key !== undefined) {
      if (typeof key !== "string" || !/^[!-~]{1,255}$/.test(key)) {
        throw new TypeError("idempotencyKey must be 1 to 255 printable ASCII characters without spaces");
      }
    } else {
      key = randomUUID();
    }
    for (let attempt = 0; ; attempt++) {
      try {
        const ans = await this._request("POST", "/sessions", {
          what: "create session",
          json: body,
          headers: { "Idempotency-Key": key },
        });
        const replayed = (ans.headers["idempotent-replayed"] ?? "").trim().toLowerCase() === "true";
        return this.#session(parseJSONObject(ans, "create session"), "create session", replayed);
      } catch (e) {
        if (attempt >= CREATE_RETRY_DELAYS_MS.length || !createRetryable(e)) throw e;
        await sleep(CREATE_RETRY_DELAYS_MS[attempt] ?? 1000);
      }
    }
  }

  /** Fetches one session (`GET /v1/sessions/{id}`). */
  async getSession(id: string): Promise<Session> {
    const ans = await this._request("GET", sessionPath(id), { what: "get session", sessionScoped: true });
    return this.#session(parseJSONObject(ans, "get session"), "get session");
  }

  /**
   * This tenant's sessions, oldest first (`GET /v1/sessions`): await it
   * for all of them (an array, fetched 100 per page), or iterate it for the
   * pages (`for await (const page of client.listSessions())`).
   *
   * @deprecated with `limit` or `offset`: given either, it is that one page
   * only (an array of its sessions, with its `total`, `limit` and `offset`),
   * as before this release, and for one release more; use
   * `listSessionsPage({ limit, offset })` for one page.
   */
  listSessions(opts: { limit?: number; offset?: number } = {}): SessionListing {
    let limit: number;
    let offset: number;
    try {
      limit = checkInt("limit", opts.limit ?? 100, 1, 100);
      offset = checkInt("offset", opts.offset ?? 0, 0);
    } catch (e) {
      // Bad arguments reject (as they did when this returned a Promise), nothing is sent.
      return new SessionListing(() => Promise.reject(e), 0);
    }
    const single = opts.limit !== undefined || opts.offset !== undefined;
    return new SessionListing((off) => this.listSessionsPage({ limit, offset: off }), offset, single);
  }

  /** One page of this tenant's sessions (`GET /v1/sessions?limit&offset`), as Python's `list_sessions`. */
  async listSessionsPage(opts: { limit?: number; offset?: number } = {}): Promise<SessionList> {
    const limit = checkInt("limit", opts.limit ?? 50, 1, 100);
    const offset = checkInt("offset", opts.offset ?? 0, 0);
    const ans = await this._request("GET", `/sessions?limit=${limit}&offset=${offset}`, { what: "list sessions" });
    const data = parseJSONObject(ans, "list sessions");
    const items = data["sessions"];
    if (!Array.isArray(items)) {
      throw new SandboxOperationError("list sessions: answer has no 'sessions' list", { body: JSON.stringify(data).slice(0, 4096) });
    }
    return {
      sessions: items.map((it) => this.#session(it, "list sessions")),
      total: typeof data["total"] === "number" ? data["total"] : items.length,
      limit: typeof data["limit"] === "number" ? data["limit"] : limit,
      offset: typeof data["offset"] === "number" ? data["offset"] : offset,
    };
  }

  /** Changes a running session (`PATCH /v1/sessions/{id}`): a new ttl from now and/or a new egress list. */
  async updateSession(id: string, opts: { ttlSeconds?: number; egress?: EgressEntry[] }): Promise<Session> {
    const body: Record<string, unknown> = {};
    if (opts.ttlSeconds !== undefined) body["ttl"] = checkInt("ttlSeconds", opts.ttlSeconds, MIN_TTL, MAX_TTL);
    if (opts.egress !== undefined) body["egress"] = checkEgress("egress", opts.egress);
    const ans = await this._request("PATCH", sessionPath(id), { what: "update session", sessionScoped: true, json: body });
    return this.#session(parseJSONObject(ans, "update session"), "update session");
  }

  /**
   * Deletes a session (`DELETE /v1/sessions/{id}`); 200 and 204 both succeed.
   * `keepWorkspace: false` also removes the named workspace it holds.
   * A session holding a named workspace saves it first; when that fails the
   * session is not deleted and keeps its files (`SandboxOperationError` with
   * code `workspace_sync_failed`: 409 when its files hold more than the
   * workspace may, 503 when the gateway's store failed). `discard: true`
   * ends it without saving: what changed since the last sync is lost.
   */
  async deleteSession(id: string, opts: { keepWorkspace?: boolean; discard?: boolean } = {}): Promise<void> {
    const params: string[] = [];
    for (const [name, value] of [["keepWorkspace", opts.keepWorkspace], ["discard", opts.discard]] as const) {
      if (value === undefined) continue;
      if (typeof value !== "boolean") throw new TypeError(`${name} must be a boolean`);
      params.push(`${name}=${value}`);
    }
    const query = params.length > 0 ? "?" + params.join("&") : "";
    await this._request("DELETE", sessionPath(id) + query, { what: "delete session", sessionScoped: true });
  }

  /**
   * Stops a session, keeping its files (`POST /v1/sessions/{id}/stop`):
   * every process ends, memory and CPU are freed; the next command, SSH
   * session or kernel call starts it again on the same files. Stopping a
   * stopped session changes nothing. `400 stop_unsupported` where the
   * driver cannot stop sessions.
   */
  async stopSession(id: string): Promise<Session> {
    const ans = await this._request("POST", sessionPath(id) + "/stop", { what: "stop session", sessionScoped: true });
    return this.#session(parseJSONObject(ans, "stop session"), "stop session");
  }

  /**
   * Pauses a session's processes where they are (`POST /v1/sessions/{id}/pause`):
   * they keep their memory (kernel variables, background servers, shells'
   * `cd` and `export`) and take no CPU; SSH connections open at the pause
   * end. The next command, SSH session, kernel call or preview resumes it
   * (or `resumeSession`); a gateway restart keeps it paused. The answer's
   * `raw.pause` is the report (`method`: `checkpoint`, dumped to disk and
   * ended, its memory freed, or `freeze`, parked in memory; `residentBytes`;
   * `notKept`).
   * `400 pause_unsupported` where the driver cannot pause sessions.
   */
  async pauseSession(id: string): Promise<Session> {
    const ans = await this._request("POST", sessionPath(id) + "/pause", { what: "pause session", sessionScoped: true });
    return this.#session(parseJSONObject(ans, "pause session"), "pause session");
  }

  /** Resumes a paused session (`POST /v1/sessions/{id}/resume`); a running one is answered as it is. */
  async resumeSession(id: string): Promise<Session> {
    const ans = await this._request("POST", sessionPath(id) + "/resume", { what: "resume session", sessionScoped: true });
    return this.#session(parseJSONObject(ans, "resume session"), "resume session");
  }

  /**
   * Copies a running session, processes and memory included
   * (`POST /v1/sessions/{id}/fork`): `count` new sessions (1 to 8, default
   * 1), each a copy of this one as it was at one instant (its processes
   * with their memory, its workspace); the source keeps running. Each has
   * its own id, password, egress proxy and secret bindings, with the
   * source's settings. `400 fork_unsupported` unless the gateway runs
   * `serve --checkpoint`; `400 invalid_count` past 8; `503
   * fork_gateway_limit` while 2 forks run on the gateway already.
   */
  async forkSession(id: string, opts: { count?: number } = {}): Promise<Session[]> {
    const count = checkInt("count", opts.count ?? 1, 1);
    const ans = await this._request("POST", sessionPath(id) + "/fork", { what: "fork session", sessionScoped: true, json: { count } });
    const data = parseJSONObject(ans, "fork session");
    const items = data["sessions"];
    if (!Array.isArray(items)) {
      throw new SandboxOperationError("fork session: answer has no 'sessions' list", { body: JSON.stringify(data).slice(0, 4096) });
    }
    return items.map((it) => this.#session(it, "fork session"));
  }

  /** The session's recent commands and process output, as text for people (`GET .../logs`); `tail` 1..10000 (default 100). */
  async sessionLogs(id: string, opts: { tail?: number } = {}): Promise<string> {
    const q = opts.tail !== undefined ? `?tail=${checkInt("tail", opts.tail, 1, 10000)}` : "";
    const ans = await this._request("GET", sessionPath(id) + "/logs" + q, {
      what: "session logs",
      sessionScoped: true,
      headers: { Accept: "text/plain" },
    });
    return new TextDecoder().decode(ans.body);
  }

  /** The images sessions may use (`GET /v1/images`): those present, and the patterns a create may pull. */
  async listImages(): Promise<ImageList> {
    const ans = await this._request("GET", "/images", { what: "list images" });
    const data = parseJSONObject(ans, "list images");
    return {
      images: listOf(data, "images", "name", "list images"),
      allow: Array.isArray(data["allow"]) ? (data["allow"] as string[]) : [],
      // A gateway older than aliases answers none.
      aliases: data["aliases"] === undefined ? [] : listOf<ImageAlias>(data, "aliases", "name", "list images"),
    };
  }

  /** The gateway's SSH host keys, ed25519 first (`GET /v1/host-keys`), to pin before any session exists. */
  async hostKeys(): Promise<string[]> {
    const ans = await this._request("GET", "/host-keys", { what: "host keys" });
    const keys = parseJSONObject(ans, "host keys")["hostKeys"];
    if (!Array.isArray(keys)) throw new SandboxOperationError("host keys: answer has no 'hostKeys' list");
    return keys.filter((k): k is string => typeof k === "string");
  }

  /** A one-use ticket (30 s) standing in for the token on one of the session's WebSockets (`POST .../tickets`). */
  async createTicket(id: string): Promise<Ticket> {
    const ans = await this._request("POST", sessionPath(id) + "/tickets", { what: "create ticket", sessionScoped: true });
    return checked<Ticket>(parseJSONObject(ans, "create ticket"), "ticket", "create ticket");
  }

  // -- data plane: commands ---------------------------------------------------

  /**
   * Runs a command in the session's sandbox (`POST /v1/sessions/{id}/commands`),
   * as the Python SDK's `run`: `command` is shell text (`sh -c`, bash where
   * present), or give `opts.argv` instead (no shell parsing). Each command
   * is a fresh process unless `opts.shell` names a persistent shell. A
   * non-zero exit code or a timeout (exit code 124, `timedOut`) is a result,
   * not an error.
   */
  async run(sessionId: string, command?: string, opts: ExecOptions = {}): Promise<ExecResult> {
    const body = commandBody(command, opts);
    const { onStdout, onStderr } = opts;
    for (const [name, cb] of [["onStdout", onStdout], ["onStderr", onStderr]] as const) {
      if (cb !== undefined && typeof cb !== "function") throw new TypeError(`${name} must be a function`);
    }
    if (onStdout || onStderr) {
      const what = "run command";
      const { body: stream, abort, headers } = await this._stream("POST", `${sessionPath(sessionId)}/commands`, {
        what,
        sessionScoped: true,
        json: body,
        headers: { Accept: "application/x-ndjson" },
        // The command's own bound, not the client's: the gateway sends the
        // headers when the command starts, but an older one only with its
        // first output, which a quiet command writes late or never.
        timeoutMs: commandWaitMs(body, this.timeoutMs),
      });
      try {
        if (!(headers["content-type"] ?? "").startsWith("application/x-ndjson")) {
          const bytes = Buffer.from(await new Response(stream).arrayBuffer());
          return wholeResult(parseJSONObject({ status: 200, headers, body: bytes }, what), onStdout, onStderr);
        }
        return await streamedResult(ndjsonLines(stream, abort, what), onStdout, onStderr, what);
      } finally {
        // Dropping the request kills the command (unless background) when a callback threw.
        abort.abort();
      }
    }
    const ans = await this._request("POST", `${sessionPath(sessionId)}/commands`, {
      what: "run command",
      sessionScoped: true,
      json: body,
      timeoutMs: commandWaitMs(body, this.timeoutMs),
    });
    return execResult(parseJSONObject(ans, "run command"));
  }

  /** A handle on the session's persistent shell `name` (nothing is sent yet); see `Shell`. */
  shell(sessionId: string, name = "default"): Shell {
    sessionPath(sessionId);
    return new Shell(this, sessionId, name);
  }

  /** Ends the persistent shell `name` with its process tree (`DELETE .../shells/{name}`); false if there was none. */
  async deleteShell(sessionId: string, name: string): Promise<boolean> {
    try {
      await this._request("DELETE", `${sessionPath(sessionId)}/shells/${encodeURIComponent(checkShellName(name))}`, {
        what: "delete shell",
        sessionScoped: true,
      });
      return true;
    } catch (e) {
      if (e instanceof SandboxAPIError && e.status === 404 && e.code === "shell_not_found") return false;
      throw e;
    }
  }

  /** The session's command history, oldest first (`GET .../commands`); `limit` 1..1000. */
  async listCommands(sessionId: string, opts: { limit?: number } = {}): Promise<CommandRecord[]> {
    const q = opts.limit !== undefined ? `?limit=${checkInt("limit", opts.limit, 1, 1000)}` : "";
    const ans = await this._request("GET", `${sessionPath(sessionId)}/commands${q}`, { what: "list commands", sessionScoped: true });
    return listOf<CommandRecord>(parseJSONObject(ans, "list commands"), "commands", "command", "list commands");
  }

  // -- data plane: files ------------------------------------------------------

  /**
   * Writes a sandbox file (`PUT /v1/sessions/{id}/files`, the raw bytes as
   * the body): parent directories are created unless `mkdirs: false`;
   * `mode` sets its permission bits.
   */
  async writeFile(sessionId: string, path: string, content: string | Uint8Array, opts: WriteOptions = {}): Promise<void> {
    const q = writeParams(path, opts);
    const body = typeof content === "string" ? new TextEncoder().encode(content) : content;
    if (!(body instanceof Uint8Array)) throw new TypeError("content must be a string or a Uint8Array");
    await this._request("PUT", `${sessionPath(sessionId)}/files?${q}`, {
      what: `write file ${JSON.stringify(path)}`,
      sessionScoped: true,
      body,
      headers: { "Content-Type": "application/octet-stream" },
    });
  }

  /** Reads a sandbox file (`GET /v1/sessions/{id}/files?path=P`); with maxBytes, at most that many bytes from its start. */
  async readFile(sessionId: string, path: string, opts: ReadOptions = {}): Promise<Uint8Array> {
    checkPath(path);
    const headers: Record<string, string> = {};
    if (opts.maxBytes !== undefined) {
      checkInt("maxBytes", opts.maxBytes, 0);
      if (opts.maxBytes === 0) return new Uint8Array(0);
      headers["Range"] = `bytes=0-${opts.maxBytes - 1}`;
    }
    const ans = await this._request("GET", `${sessionPath(sessionId)}/files?${new URLSearchParams({ path })}`, {
      what: `read file ${JSON.stringify(path)}`,
      sessionScoped: true,
      headers,
      // An empty file has no byte 0: a range request of it is 416.
      accept: opts.maxBytes !== undefined ? [416] : [],
    });
    if (ans.status === 416) return new Uint8Array(0);
    return opts.maxBytes !== undefined && ans.body.length > opts.maxBytes ? ans.body.slice(0, opts.maxBytes) : ans.body;
  }

  /**
   * Streams a sandbox file to the local file `dest` (`GET .../files`),
   * never holding it whole; returns the bytes written. The local file is
   * removed again when the download fails (only a file this call opened:
   * a `dest` it could not open, a directory say, is left alone and that
   * error thrown as it is). A body that sends nothing for the client's
   * `timeoutMs` fails the download.
   */
  async readFileTo(sessionId: string, path: string, dest: string): Promise<number> {
    checkPath(path);
    if (typeof dest !== "string" || !dest) throw new TypeError("dest must be a local file path");
    const what = `read file ${JSON.stringify(path)}`;
    const { body, abort, headers } = await this._stream("GET", `${sessionPath(sessionId)}/files?${new URLSearchParams({ path })}`, {
      what,
      sessionScoped: true,
      headers: { Accept: "application/octet-stream" },
    });
    const idleMs = this.timeoutMs;
    let stalled = false;
    let idle: ReturnType<typeof setTimeout> | undefined;
    const arm = () => {
      clearTimeout(idle);
      idle = setTimeout(() => {
        stalled = true;
        abort.abort(new DOMException("no data", "TimeoutError"));
      }, idleMs);
    };
    let written = 0;
    const counter = new Transform({
      transform(chunk: Buffer, _enc, done) {
        written += chunk.length;
        arm();
        done(null, chunk);
      },
    });
    let opened = false;
    try {
      arm();
      const out = createWriteStream(dest);
      await once(out, "open");
      opened = true;
      await pipeline(Readable.fromWeb(body as import("node:stream/web").ReadableStream<Uint8Array>), counter, out);
      const expected = headers["content-length"];
      if (expected !== undefined && /^\d+$/.test(expected) && Number(expected) !== written) {
        throw new SandboxConnectionError(`${what}: got ${written} of ${expected} bytes`);
      }
    } catch (e) {
      if (opened) await rm(dest, { force: true }).catch(() => {}); // never hides e
      if (e instanceof SandboxAPIError) throw e;
      if (stalled) throw new SandboxConnectionError(`${what}: the download stalled: no data for ${idleMs} ms`, { cause: e });
      // A local file's error (ENOENT, EACCES, EISDIR, ENOSPC...) is thrown as it is.
      if (/^E[A-Z]+$/.test(String((e as { code?: unknown }).code ?? ""))) throw e;
      throw new SandboxConnectionError(`${what}: the connection broke: ${(e as Error).message}`, { cause: e });
    } finally {
      clearTimeout(idle);
      abort.abort();
    }
    return written;
  }

  /**
   * Lists the sandbox directory `path` (default the workspace; `GET
   * .../files?list=true`); `recursive` walks its subdirectories, breadth
   * first, never through a symlink. The array's `truncated` is true when
   * the listing stopped at the gateway's 10,000 entries.
   */
  async listFiles(sessionId: string, path = ".", opts: { recursive?: boolean } = {}): Promise<FileList> {
    const q = new URLSearchParams({ path: checkText("path", path), list: "true" });
    if (opts.recursive !== undefined && typeof opts.recursive !== "boolean") throw new TypeError("recursive must be a boolean");
    if (opts.recursive) q.set("recursive", "true");
    const what = `list files ${JSON.stringify(path)}`;
    const ans = await this._request("GET", `${sessionPath(sessionId)}/files?${q}`, { what, sessionScoped: true });
    return fileList(parseJSONObject(ans, what), what);
  }

  /**
   * Deletes a sandbox file, symlink or empty directory (`DELETE .../files`);
   * `recursive` removes a directory with everything in it.
   * `FileNotFoundInSandboxError` when nothing is there.
   */
  async deleteFile(sessionId: string, path: string, opts: { recursive?: boolean } = {}): Promise<void> {
    const q = new URLSearchParams({ path: checkText("path", path) });
    if (opts.recursive !== undefined && typeof opts.recursive !== "boolean") throw new TypeError("recursive must be a boolean");
    if (opts.recursive) q.set("recursive", "true");
    await this._request("DELETE", `${sessionPath(sessionId)}/files?${q}`, { what: `delete file ${JSON.stringify(path)}`, sessionScoped: true });
  }

  /**
   * Has the gateway download `urls` into the sandbox (`POST .../files/fetch`):
   * public addresses only, each file named after its `Content-Disposition`
   * or URL (a name the remote server chose never starts with a dot). One
   * URL's failure is in the result's `errors`, not thrown.
   */
  async fetchUrls(sessionId: string, urls: string[], opts: FetchOptions = {}): Promise<FetchResult> {
    if (!Array.isArray(urls) || urls.length < 1 || urls.length > 200 || urls.some((u) => typeof u !== "string")) {
      throw new TypeError("urls must hold 1 to 200 URL strings");
    }
    const body: Record<string, unknown> = { urls };
    if (opts.destDir !== undefined) {
      checkPath(opts.destDir);
      body["destDir"] = opts.destDir;
    }
    if (opts.overwrite !== undefined && typeof opts.overwrite !== "boolean") throw new TypeError("overwrite must be a boolean");
    if (opts.overwrite) body["overwrite"] = true;
    const ans = await this._request("POST", `${sessionPath(sessionId)}/files/fetch`, {
      what: "fetch urls",
      sessionScoped: true,
      json: body,
      // Downloads take time: wait for them beyond the usual timeout.
      timeoutMs: Math.max(this.timeoutMs, 600_000),
    });
    const data = parseJSONObject(ans, "fetch urls");
    if (!Array.isArray(data["fetched"]) || !Array.isArray(data["errors"])) {
      throw new SandboxOperationError("fetch urls: unexpected answer", { body: JSON.stringify(data).slice(0, 4096) });
    }
    return data as unknown as FetchResult;
  }

  /** A presigned link anyone may GET the file at `path` with, until `expiresIn` seconds (1..604800, default 3600) pass (`POST .../files/link`). */
  async fileLink(sessionId: string, path: string, opts: { expiresIn?: number } = {}): Promise<Link> {
    const body: Record<string, unknown> = { path: checkText("path", path) };
    if (opts.expiresIn !== undefined) body["expiresIn"] = checkInt("expiresIn", opts.expiresIn, 1, 604800);
    const ans = await this._request("POST", `${sessionPath(sessionId)}/files/link`, { what: "file link", sessionScoped: true, json: body });
    return checked<Link>(parseJSONObject(ans, "file link"), "url", "file link");
  }

  // -- data plane: background processes ---------------------------------------

  /**
   * Starts a background process (`POST /v1/sessions/{id}/processes`):
   * `command` is shell text, or give `opts.argv`. It runs until it exits,
   * is signalled, or the session ends; the gateway keeps the last 16 MiB
   * of its output. `RateLimitError` `too_many_processes` past 64 running.
   */
  async startProcess(sessionId: string, command?: string, opts: StartProcessOptions = {}): Promise<ProcessInfo> {
    const body = processBody(command, opts);
    const ans = await this._request("POST", `${sessionPath(sessionId)}/processes`, { what: "start process", sessionScoped: true, json: body });
    return checked<ProcessInfo>(parseJSONObject(ans, "start process"), "processId", "start process");
  }

  /** The session's background processes: the running ones and the 100 that finished last, in the order they started. */
  async listProcesses(sessionId: string): Promise<ProcessInfo[]> {
    const ans = await this._request("GET", `${sessionPath(sessionId)}/processes`, { what: "list processes", sessionScoped: true });
    return listOf<ProcessInfo>(parseJSONObject(ans, "list processes"), "processes", "processId", "list processes");
  }

  /** One background process; `ProcessNotFoundError` when there is none. */
  async getProcess(sessionId: string, processId: string): Promise<ProcessInfo> {
    const ans = await this._request("GET", processPath(sessionId, processId), { what: "get process", sessionScoped: true });
    return checked<ProcessInfo>(parseJSONObject(ans, "get process"), "processId", "get process");
  }

  /**
   * A background process's output (`GET .../processes/{pid}/output`): the
   * request is sent now (errors throw here), the lines are read as you
   * iterate; with `follow` (the default) until the process has ended.
   */
  async processOutput(sessionId: string, processId: string, opts: ProcessOutputOptions = {}): Promise<ProcessOutput> {
    const offset = checkInt("offset", opts.offset ?? 0);
    const follow = opts.follow ?? true;
    if (typeof follow !== "boolean") throw new TypeError("follow must be a boolean");
    const path = `${processPath(sessionId, processId)}/output?offset=${offset}&follow=${follow}`;
    const { body, abort } = await this._stream("GET", path, {
      what: "process output",
      sessionScoped: true,
      headers: { Accept: "application/x-ndjson" },
    });
    return new ProcessOutput(body, abort, "process output");
  }

  /**
   * Writes `data` to a background process's stdin (`POST .../stdin`), in
   * requests of at most 45 KiB, in order; `eof` closes it afterwards.
   * `ProcessExitedError` when the process has ended.
   */
  async sendProcessInput(sessionId: string, processId: string, data: string | Uint8Array, opts: { eof?: boolean } = {}): Promise<void> {
    const path = `${processPath(sessionId, processId)}/stdin`;
    for (const body of stdinBodies(data, opts.eof ?? false)) {
      await this._request("POST", path, { what: "process input", sessionScoped: true, json: body });
    }
  }

  /** Sends `signal` (ABRT ALRM FPE HUP ILL INT KILL PIPE QUIT SEGV TERM USR1 USR2, with or without SIG) to a background process's group. */
  async signalProcess(sessionId: string, processId: string, signal = "TERM"): Promise<void> {
    await this._request("POST", `${processPath(sessionId, processId)}/signal`, {
      what: "signal process",
      sessionScoped: true,
      json: signalBody(signal),
    });
  }

  // -- data plane: the Python kernel -----------------------------------------

  /**
   * Runs `code` in the session's persistent Python kernel (`POST
   * /v1/sessions/{id}/python`), like a notebook cell: variables and imports
   * persist from one call to the next in the same `kernel`. `result` is the
   * `repr` of a final expression; an uncaught exception is in `error`, not
   * thrown.
   */
  async runPython(sessionId: string, code: string, opts: RunPythonOptions = {}): Promise<PythonResult> {
    const body = pythonBody(code, opts);
    const ans = await this._request("POST", `${sessionPath(sessionId)}/python`, {
      what: "run python",
      sessionScoped: true,
      json: body,
      timeoutMs: commandWaitMs(body, this.timeoutMs) + 2000,
    });
    return pythonResult(parseJSONObject(ans, "run python"));
  }

  /** Forgets a kernel's state (`POST .../python/reset`): the next call starts a new interpreter. */
  async resetPython(sessionId: string, opts: { kernel?: string } = {}): Promise<PythonReset> {
    const body: Record<string, unknown> = {};
    if (opts.kernel !== undefined) body["kernel"] = checkKernel(opts.kernel);
    const ans = await this._request("POST", `${sessionPath(sessionId)}/python/reset`, { what: "reset python", sessionScoped: true, json: body });
    return checked<PythonReset>(parseJSONObject(ans, "reset python"), "kernel", "reset python");
  }

  // -- workspaces and snapshots ----------------------------------------------

  /** Creates an empty named workspace (`POST /v1/workspaces`); `WorkspaceExistsError` if the name is taken. */
  async createWorkspace(name: string): Promise<Workspace> {
    if (typeof name !== "string" || !WORKSPACE_NAME.test(name) || name.includes("..")) {
      throw new TypeError("workspace name must be 1 to 63 of A-Z a-z 0-9 . _ -, starting with a letter or digit, without '..'");
    }
    const ans = await this._request("POST", "/workspaces", { what: "create workspace", json: { name } });
    return checked<Workspace>(parseJSONObject(ans, "create workspace"), "name", "create workspace");
  }

  /** This tenant's workspaces, by name (`GET /v1/workspaces`). */
  async listWorkspaces(): Promise<Workspace[]> {
    const ans = await this._request("GET", "/workspaces", { what: "list workspaces" });
    return listOf<Workspace>(parseJSONObject(ans, "list workspaces"), "workspaces", "name", "list workspaces");
  }

  /** Deletes a workspace (`DELETE /v1/workspaces/{name}`): `WorkspaceNotFoundError`, `WorkspaceBusyError`. */
  async deleteWorkspace(name: string): Promise<void> {
    await this._request("DELETE", "/workspaces/" + encodeURIComponent(checkName("name", name)), { what: "delete workspace" });
  }

  /** Snapshots the session's `/workspace` (`POST /v1/sessions/{id}/snapshots`); fork with `createSession({ fromSnapshot })`. */
  async createSnapshot(sessionId: string): Promise<Snapshot> {
    const ans = await this._request("POST", sessionPath(sessionId) + "/snapshots", { what: "create snapshot", sessionScoped: true });
    return checked<Snapshot>(parseJSONObject(ans, "create snapshot"), "snapshotId", "create snapshot");
  }

  /** This tenant's snapshots, newest first (`GET /v1/snapshots`); only `session`'s when given. */
  async listSnapshots(opts: { session?: string } = {}): Promise<Snapshot[]> {
    const q = opts.session !== undefined ? `?session=${encodeURIComponent(checkName("session", opts.session))}` : "";
    const ans = await this._request("GET", "/snapshots" + q, { what: "list snapshots" });
    return listOf<Snapshot>(parseJSONObject(ans, "list snapshots"), "snapshots", "snapshotId", "list snapshots");
  }

  /** Deletes a snapshot (`DELETE /v1/snapshots/{id}`); `SnapshotNotFoundError` if there is none. */
  async deleteSnapshot(snapshotId: string): Promise<void> {
    await this._request("DELETE", "/snapshots/" + encodeURIComponent(checkName("snapshotId", snapshotId)), { what: "delete snapshot" });
  }

  // -- usage, previews, audit -------------------------------------------------

  /** The session's resource use now (`GET /v1/sessions/{id}/stats`). */
  async sessionStats(sessionId: string): Promise<SessionStats> {
    const ans = await this._request("GET", sessionPath(sessionId) + "/stats", { what: "session stats", sessionScoped: true });
    return checked<SessionStats>(parseJSONObject(ans, "session stats"), "sessionId", "session stats");
  }

  /** One page of the session's latest egress decisions, newest first (`GET /v1/sessions/{id}/egress`; at most 1000 kept). */
  async listEgressDecisions(sessionId: string, opts: { limit?: number; cursor?: string } = {}): Promise<EgressDecisionPage> {
    const q = new URLSearchParams({ limit: String(checkInt("limit", opts.limit ?? 100, 1, 1000)) });
    if (opts.cursor !== undefined) q.set("cursor", checkName("cursor", opts.cursor));
    const ans = await this._request("GET", `${sessionPath(sessionId)}/egress?${q}`, { what: "list egress decisions", sessionScoped: true });
    const data = parseJSONObject(ans, "list egress decisions");
    const decisions = listOf<EgressDecision>(data, "decisions", "seq", "list egress decisions");
    const next = data["nextCursor"];
    return typeof next === "string" && next ? { decisions, nextCursor: next } : { decisions };
  }

  /**
   * The session's connections waiting for approval, oldest first
   * (`GET /v1/sessions/{id}/egress/pending`; a session created with
   * `egressMode: "ask"`). A UI that waits for them can follow
   * `?follow=true`, a stream of server-sent events.
   */
  async listEgressPending(sessionId: string): Promise<EgressPending[]> {
    const ans = await this._request("GET", `${sessionPath(sessionId)}/egress/pending`, { what: "list egress pending", sessionScoped: true });
    return listOf<EgressPending>(parseJSONObject(ans, "list egress pending"), "pending", "id", "list egress pending");
  }

  /**
   * Waits for the session's connections that need approval
   * (`GET .../egress/pending?follow=true`, server-sent events):
   * `for await (const ev of client.followEgressPending(sid))` gets
   * `{ event: "pending", pending }` for each connection parked (those
   * waiting already first) and `{ event: "resolved", pending }` (its id,
   * host and port) once it no longer waits, until the session ends.
   * Leaving the loop closes the stream.
   */
  async *followEgressPending(sessionId: string): AsyncGenerator<EgressPendingEvent> {
    const { body, abort } = await this._stream("GET", `${sessionPath(sessionId)}/egress/pending?follow=true`, {
      what: "follow egress pending",
      sessionScoped: true,
      headers: { Accept: "text/event-stream" },
    });
    const reader = body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    let event = "";
    let data: string[] = [];
    try {
      for (;;) {
        let chunk: { done: boolean; value?: Uint8Array };
        try {
          chunk = await reader.read();
        } catch (e) {
          if (abort.signal.aborted) return;
          throw new SandboxConnectionError(`follow egress pending: the connection broke: ${(e as Error).message}`, { cause: e });
        }
        if (chunk.done || !chunk.value) return;
        buf += decoder.decode(chunk.value, { stream: true });
        let nl: number;
        while ((nl = buf.indexOf("\n")) >= 0) {
          const line = buf.slice(0, nl).replace(/\r$/, "");
          buf = buf.slice(nl + 1);
          if (line === "") {
            if ((event === "pending" || event === "resolved") && data.length) {
              let pending: EgressPending;
              try {
                pending = JSON.parse(data.join("\n")) as EgressPending;
              } catch {
                throw new SandboxOperationError("follow egress pending: bad event", { body: data.join("\n").slice(0, 4096) });
              }
              yield { event, pending };
            }
            event = "";
            data = [];
          } else if (line.startsWith("event:")) {
            event = line.slice(6).trim();
          } else if (line.startsWith("data:")) {
            data.push(line.slice(5).replace(/^ /, ""));
          }
        }
      }
    } finally {
      abort.abort();
      reader.releaseLock();
    }
  }

  /**
   * Allows or denies a connection waiting for approval
   * (`POST /v1/sessions/{id}/egress/pending/{pendingId}`). With `remember`,
   * the session keeps the decision for its host:port (its egress list, or
   * its deny list). A connection that no longer waits: `SandboxOperationError`
   * with code `pending_not_found`.
   */
  async decideEgress(sessionId: string, pendingId: string, decision: "allow" | "deny", opts: { remember?: boolean } = {}): Promise<EgressPending> {
    if (decision !== "allow" && decision !== "deny") throw new RangeError('decision must be "allow" or "deny"');
    const remember = opts.remember ?? false;
    if (typeof remember !== "boolean") throw new TypeError("remember must be a boolean");
    const path = `${sessionPath(sessionId)}/egress/pending/${encodeURIComponent(checkName("pendingId", pendingId))}`;
    const ans = await this._request("POST", path, { what: "decide egress", sessionScoped: true, json: { decision, remember } });
    return checked<EgressPending>(parseJSONObject(ans, "decide egress"), "id", "decide egress");
  }

  /**
   * The URL of the session's preview of `port` at `path`
   * (`.../v1/sessions/{id}/ports/{port}/{path}`); nothing is sent. It needs
   * this client's bearer token (`Authorization`) and is meant for programs:
   * it is on the API's origin, so its answers carry
   * `Content-Security-Policy: sandbox` and no cookies. For a browser, use
   * `portLink`, whose URL is an origin of the preview's own.
   */
  previewUrl(sessionId: string, port: number, path = "/"): string {
    checkInt("port", port, 1, 65535);
    if (typeof path !== "string") throw new TypeError("path must be a string");
    return `${this.#base}${sessionPath(sessionId)}/ports/${port}/${path.replace(/^\/+/, "")}`;
  }

  /** A presigned link to the session's `port` (`POST .../ports/link`), valid `expiresIn` seconds (1..604800; default 3600). */
  async portLink(sessionId: string, port: number, opts: { expiresIn?: number } = {}): Promise<PortLink> {
    const body: Record<string, unknown> = { port: checkInt("port", port, 1, 65535) };
    if (opts.expiresIn !== undefined) body["expiresIn"] = checkInt("expiresIn", opts.expiresIn, 1, 604800);
    const ans = await this._request("POST", sessionPath(sessionId) + "/ports/link", { what: "port link", sessionScoped: true, json: body });
    return checked<PortLink>(parseJSONObject(ans, "port link"), "url", "port link");
  }

  /** One page of this tenant's audit events, newest first (`GET /v1/audit`). */
  async listAudit(query: AuditQuery = {}): Promise<AuditPage> {
    const q = new URLSearchParams({ limit: String(checkInt("limit", query.limit ?? 100, 1, 1000)) });
    if (query.session !== undefined) q.set("session", checkName("session", query.session));
    if (query.since !== undefined) {
      if (query.since instanceof Date) q.set("since", query.since.toISOString());
      else q.set("since", checkName("since", query.since));
    }
    if (query.cursor !== undefined) q.set("cursor", checkName("cursor", query.cursor));
    const ans = await this._request("GET", `/audit?${q}`, { what: "list audit" });
    const data = parseJSONObject(ans, "list audit");
    const events = listOf<AuditEvent>(data, "events", "seq", "list audit");
    const next = data["nextCursor"];
    return typeof next === "string" && next ? { events, nextCursor: next } : { events };
  }

  /**
   * One page of what the session did, newest first (`GET /v1/sessions/{id}/timeline`):
   * its commands, egress decisions, file changes and lifecycle, as audit events.
   */
  async sessionTimeline(sessionId: string, query: TimelineQuery = {}): Promise<AuditPage> {
    const q = new URLSearchParams({ limit: String(checkInt("limit", query.limit ?? 100, 1, 1000)) });
    if (query.kind !== undefined) {
      const kinds: unknown[] = Array.isArray(query.kind) ? query.kind : [query.kind];
      if (kinds.length === 0 || kinds.some((k) => typeof k !== "string" || !TIMELINE_KINDS.includes(k))) {
        throw new RangeError(`kind must be one or a list of ${TIMELINE_KINDS.join(", ")}`);
      }
      q.set("kind", kinds.join(","));
    }
    if (query.after !== undefined) q.set("after", String(checkInt("after", query.after, 0)));
    if (query.cursor !== undefined) q.set("cursor", checkName("cursor", query.cursor));
    const ans = await this._request("GET", `${sessionPath(sessionId)}/timeline?${q}`, { what: "session timeline", sessionScoped: true });
    const data = parseJSONObject(ans, "session timeline");
    const events = listOf<AuditEvent>(data, "entries", "seq", "session timeline");
    const next = data["nextCursor"];
    return typeof next === "string" && next ? { events, nextCursor: next } : { events };
  }

  /** Every matching audit event, newest first, following `nextCursor`: `for await (const e of client.iterAudit({ session }))`. */
  async *iterAudit(query: Omit<AuditQuery, "cursor"> = {}): AsyncGenerator<AuditEvent> {
    let cursor: string | undefined;
    for (;;) {
      const page = await this.listAudit({ ...query, cursor });
      yield* page.events;
      if (page.nextCursor === undefined || page.nextCursor === cursor) return;
      cursor = page.nextCursor;
    }
  }

  /** Opens `CONNECT /v1/sessions/{id}`, or its WebSocket (see the module function openTunnel). */
  openTunnel(sessionId: string, opts: { timeoutMs?: number; transport?: Transport } = {}): Promise<TunnelSocket> {
    return openTunnel({
      ...this.tls,
      baseUrl: this.baseUrl,
      apiKey: this.#apiKey,
      sessionId,
      timeoutMs: opts.timeoutMs,
      transport: opts.transport,
    });
  }

  /** Connects over SSH to a session by id, pinning the host keys its REST answer lists. */
  async ssh(sessionId: string, opts: SSHOptions = {}): Promise<SessionSSH> {
    const s = await this.getSession(sessionId);
    return this._connectSSH(sessionId, s.sshInfo, opts);
  }

  /** @internal */
  _connectSSH(sessionId: string, info: SSHAccess, opts: SSHOptions): Promise<SessionSSH> {
    return SessionSSH.connect({
      ...this.tls,
      baseUrl: this.baseUrl,
      apiKey: this.#apiKey,
      sessionId,
      password: info.password,
      ...opts,
      hostKeys: opts.hostKeys ?? info.hostKeys,
    });
  }

  #session(data: unknown, what: string, replayed = false): Session {
    if (!isObject(data)) throw new SandboxOperationError(`${what}: unexpected answer: not a JSON object`);
    let session: Session;
    try {
      session = new Session(this, data as Record<string, unknown>, replayed);
    } catch (e) {
      throw new SandboxOperationError(`${what}: unexpected answer: ${(e as Error).message}`, {
        body: JSON.stringify(data).slice(0, 4096),
      });
    }
    if (session.isolation === "none") this.#warnIsolation(session);
    return session;
  }

  /**
   * Warns (`process.emitWarning`, type `IsolationWarning`) that the gateway
   * isolates nothing: once per process per gateway (its REST base URL,
   * normalised), however many clients talk to it, as the Python SDK.
   */
  #warnIsolation(session: Session): void {
    if (!firstIsolationWarning(this.#base)) return;
    const unenforced = Array.isArray(session.raw["unenforced"]) ? (session.raw["unenforced"] as unknown[]).join(", ") : "";
    process.emitWarning(
      `the sandgate gateway at ${this.baseUrl} does not isolate sessions ("isolation": "none", its workdir driver): ` +
        "their processes run as the gateway's user, with the host's files and network" +
        (unenforced ? `; not enforced: ${unenforced}` : ""),
      { type: ISOLATION_WARNING, code: ISOLATION_WARNING_CODE },
    );
  }

  /** @internal Sends one request whose answer's body is read later (a stream); errors are thrown here. */
  async _stream(
    method: string,
    path: string,
    opts: RequestOptions,
  ): Promise<{ body: ReadableStream<Uint8Array>; abort: AbortController; headers: Record<string, string> }> {
    const headers: Record<string, string> = {
      Authorization: `Bearer ${this.#apiKey}`,
      Accept: "application/json",
      "User-Agent": USER_AGENT,
      ...(opts.headers ?? {}),
    };
    let reqBody: string | undefined;
    if (opts.json !== undefined) {
      reqBody = JSON.stringify(opts.json);
      headers["Content-Type"] = "application/json";
    }
    const abort = new AbortController();
    const timeoutMs = opts.timeoutMs ?? this.timeoutMs;
    // The timeout is for the answer's head; the body may take as long as it takes.
    const timer = setTimeout(() => abort.abort(new DOMException("timed out", "TimeoutError")), timeoutMs);
    let resp: Response;
    try {
      resp = await this.#fetch(this.#base + path, { method, headers, body: reqBody, signal: abort.signal, redirect: "manual" });
    } catch (e) {
      throw fetchError(abort.signal.aborted ? abort.signal.reason : e, opts.what, this.baseUrl, timeoutMs);
    } finally {
      clearTimeout(timer);
    }
    if (resp.status >= 300 || !resp.body) {
      let bytes = new Uint8Array(0);
      try {
        bytes = new Uint8Array(await resp.arrayBuffer());
      } catch {
        // the status says enough
      }
      const h = headersObject(resp.headers);
      if (resp.status >= 400) {
        throw errorForStatus(resp.status, resp.statusText, h, bytes, { what: opts.what, sessionScoped: opts.sessionScoped ?? false });
      }
      throw new SandboxOperationError(`${opts.what}: unexpected HTTP ${resp.status} answer`, { status: resp.status, headers: h });
    }
    return { body: resp.body, abort, headers: headersObject(resp.headers) };
  }

  /** @internal Sends one request; returns the answer, or throws the mapped error. */
  async _request(method: string, path: string, opts: RequestOptions): Promise<Answer> {
    const headers: Record<string, string> = {
      Authorization: `Bearer ${this.#apiKey}`,
      Accept: "application/json",
      "User-Agent": USER_AGENT,
      ...(opts.headers ?? {}),
    };
    let body: Uint8Array | string | undefined = opts.body;
    if (opts.json !== undefined) {
      body = JSON.stringify(opts.json);
      headers["Content-Type"] = "application/json";
    }
    const timeoutMs = opts.timeoutMs ?? this.timeoutMs;
    let resp: Response;
    let bytes: Uint8Array;
    try {
      resp = await this.#fetch(this.#base + path, {
        method,
        headers,
        body,
        signal: AbortSignal.timeout(timeoutMs),
        redirect: "manual",
      });
      bytes = new Uint8Array(await resp.arrayBuffer());
    } catch (e) {
      throw fetchError(e, opts.what, this.baseUrl, timeoutMs);
    }
    const h = headersObject(resp.headers);
    if (resp.status >= 400 && !(opts.accept ?? []).includes(resp.status)) {
      throw errorForStatus(resp.status, resp.statusText, h, bytes, { what: opts.what, sessionScoped: opts.sessionScoped ?? false });
    }
    if (resp.status >= 300 && resp.status < 400) {
      throw new SandboxOperationError(`${opts.what}: unexpected HTTP ${resp.status} answer`, { status: resp.status, headers: h });
    }
    return { status: resp.status, headers: h, body: bytes };
  }
}

// -- helpers -------------------------------------------------------------------

function isObject(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === "object" && !Array.isArray(v);
}

const WORKSPACE_NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/;

function checkName(name: string, value: unknown): string {
  if (typeof value !== "string" || !value) throw new TypeError(`${name} must be a non-empty string`);
  return value;
}

/** `data` as a T once it has the string or number field `key`; SandboxOperationError otherwise. */
function checked<T>(data: unknown, key: string, what: string): T {
  if (!isObject(data) || (typeof data[key] !== "string" && typeof data[key] !== "number")) {
    throw new SandboxOperationError(`${what}: unexpected answer: no ${key}`, { body: JSON.stringify(data).slice(0, 4096) });
  }
  return data as T;
}

function listOf<T>(data: Record<string, unknown>, list: string, key: string, what: string): T[] {
  const items = data[list];
  if (!Array.isArray(items)) {
    throw new SandboxOperationError(`${what}: answer has no '${list}' list`, { body: JSON.stringify(data).slice(0, 4096) });
  }
  return items.map((it) => checked<T>(it, key, what));
}

function sessionPath(id: string): string {
  if (typeof id !== "string" || !id) throw new TypeError("session id must be a non-empty string");
  return "/sessions/" + encodeURIComponent(id);
}

function checkPath(path: string): void {
  if (typeof path !== "string" || !path) throw new TypeError("path must be a non-empty string");
}

function parseJSONObject(ans: Answer, what: string): Record<string, unknown> {
  if (ans.status === 204 || ans.body.length === 0) return {};
  let data: unknown;
  try {
    data = JSON.parse(new TextDecoder().decode(ans.body));
  } catch {
    throw new SandboxOperationError(`${what}: HTTP ${ans.status} answer is not JSON`, {
      status: ans.status,
      body: new TextDecoder().decode(ans.body.subarray(0, 4096)),
      headers: ans.headers,
    });
  }
  if (!isObject(data)) {
    throw new SandboxOperationError(`${what}: HTTP ${ans.status} answer is not a JSON object`, {
      status: ans.status,
      body: new TextDecoder().decode(ans.body.subarray(0, 4096)),
    });
  }
  return data;
}

function processPath(sessionId: string, processId: string): string {
  if (typeof processId !== "string" || !processId) throw new TypeError("processId must be a non-empty string");
  return `${sessionPath(sessionId)}/processes/${encodeURIComponent(processId)}`;
}

function errorChain(e: unknown): unknown[] {
  const out: unknown[] = [];
  for (let cur: unknown = e; cur && out.length < 5; cur = (cur as { cause?: unknown }).cause) out.push(cur);
  return out;
}

function isTLSError(e: unknown): boolean {
  return errorChain(e).some((c) => {
    const code = String((c as { code?: unknown }).code ?? "");
    return /^(ERR_TLS_|ERR_SSL_|CERT_|UNABLE_TO_|DEPTH_ZERO_|SELF_SIGNED_|HOSTNAME_MISMATCH)/.test(code);
  });
}

function fetchError(e: unknown, what: string, baseUrl: string, timeoutMs: number): SandboxAPIError {
  if (e instanceof SandboxAPIError) return e;
  const name = (e as { name?: string })?.name;
  if (name === "TimeoutError" || name === "AbortError") {
    return new SandboxConnectionError(`${what}: timed out after ${timeoutMs} ms talking to ${baseUrl}`, { cause: e });
  }
  const chain = errorChain(e);
  const detail = chain.map((c) => (c as Error)?.message).filter(Boolean).join(": ");
  if (isTLSError(e)) {
    return new SandboxConnectionError(`${what}: TLS error talking to ${baseUrl}: ${detail}`, { cause: e });
  }
  return new SandboxConnectionError(`${what}: cannot reach ${baseUrl}: ${detail}`, { cause: e });
}

function createRetryable(e: unknown): boolean {
  if (e instanceof SandboxConnectionError) return !isTLSError(e.cause);
  return (
    e instanceof SandboxAPIError &&
    e.status !== undefined &&
    CREATE_RETRY_STATUSES.has(e.status) &&
    !(e.code !== undefined && CREATE_NO_RETRY_CODES.has(e.code))
  );
}

const RESOURCE_KEYS: Record<string, "int" | "number"> = { memoryMiB: "int", cpus: "number", pids: "int", diskMiB: "int" };

function checkResources(resources: Resources): Resources {
  if (!isObject(resources)) throw new TypeError("resources must be an object");
  const out: Record<string, number> = {};
  for (const [k, v] of Object.entries(resources)) {
    const kind = RESOURCE_KEYS[k];
    if (!kind) throw new RangeError(`unknown resource ${JSON.stringify(k)}; known: ${Object.keys(RESOURCE_KEYS).join(", ")}`);
    if (v === undefined || v === null) continue;
    if (typeof v !== "number" || (kind === "int" && !Number.isInteger(v))) {
      throw new TypeError(`resources.${k} must be ${kind === "int" ? "an integer" : "a number"}`);
    }
    if (v <= 0) throw new RangeError(`resources.${k} must be positive`);
    out[k] = v;
  }
  return out;
}

function checkHosts(name: string, value: unknown): string[] {
  if (!Array.isArray(value)) throw new TypeError(`${name} must be an array of strings (e.g. ["pypi.org"])`);
  return value.map((entry, i) => {
    if (typeof entry !== "string") throw new TypeError(`${name}[${i}] must be a string`);
    if (!entry.trim()) throw new RangeError(`${name}[${i}] must be a non-empty string`);
    return entry;
  });
}

const RULE_KEYS = ["host", "port", "methods", "paths"];

function checkEgress(name: string, value: unknown): EgressEntry[] {
  if (!Array.isArray(value)) throw new TypeError(`${name} must be an array (e.g. ["pypi.org"])`);
  return value.map((entry, i): EgressEntry => {
    if (typeof entry === "string") {
      if (!entry.trim()) throw new RangeError(`${name}[${i}] must be a non-empty string`);
      return entry;
    }
    if (!isObject(entry)) throw new TypeError(`${name}[${i}] must be a string or an object`);
    const unknown = Object.keys(entry).filter((k) => !RULE_KEYS.includes(k));
    if (unknown.length) throw new RangeError(`${name}[${i}]: unknown key ${JSON.stringify(unknown[0])}; known: ${RULE_KEYS.join(", ")}`);
    const host = entry["host"];
    if (typeof host !== "string" || !host) throw new RangeError(`${name}[${i}] needs a host (a non-empty string)`);
    const rule: EgressRule = { host };
    if (entry["port"] !== undefined) rule.port = checkInt(`${name}[${i}].port`, entry["port"], 1, 65535);
    for (const key of ["methods", "paths"] as const) {
      const items = entry[key];
      if (items === undefined) continue;
      if (!Array.isArray(items) || !items.every((x) => typeof x === "string" && x)) {
        throw new TypeError(`${name}[${i}].${key} must be an array of non-empty strings`);
      }
      rule[key] = items as string[];
    }
    return rule;
  });
}

const SECRET_KEYS = ["name", "hosts", "header", "format"];

function checkSecrets(secrets: unknown): SecretRef[] {
  if (!Array.isArray(secrets)) throw new TypeError("secrets must be an array of names or objects");
  return secrets.map((ref, i) => {
    if (typeof ref === "string") {
      if (!ref) throw new RangeError(`secrets[${i}] must be a non-empty name`);
      return ref;
    }
    if (!isObject(ref)) throw new TypeError(`secrets[${i}] must be a name or an object`);
    const unknown = Object.keys(ref).filter((k) => !SECRET_KEYS.includes(k));
    if (unknown.length) throw new RangeError(`secrets[${i}]: unknown key ${JSON.stringify(unknown[0])}; known: ${SECRET_KEYS.join(", ")}`);
    const item: Record<string, unknown> = {};
    for (const k of SECRET_KEYS) {
      const v = ref[k];
      if (v === undefined || v === null) continue;
      if (k === "hosts") {
        item[k] = checkHosts(`secrets[${i}].hosts`, v);
        continue;
      }
      if (typeof v !== "string") throw new TypeError(`secrets[${i}].${k} must be a string`);
      if (!v) throw new RangeError(`secrets[${i}].${k} must be a non-empty string`);
      item[k] = v;
    }
    if (!("name" in item)) throw new RangeError(`secrets[${i}] needs a name`);
    return item as SecretRef;
  });
}
