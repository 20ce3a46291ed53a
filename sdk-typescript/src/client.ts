// SandboxClient: the REST API (/v1/sessions) and a session's REST data plane.

import { randomUUID } from "node:crypto";

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

export const MIN_TTL = 60;
export const MAX_TTL = 28800;

/**
 * The `type` of the warning (`process.emitWarning`) a client emits once, the
 * first time the gateway answers a session with `"isolation": "none"` (its
 * workdir driver isolates nothing and enforces no limit). Filter it by this
 * type in a `process.on("warning")` listener, or by its code
 * (`node --disable-warning=SANDGATE_NO_ISOLATION`).
 */
export const ISOLATION_WARNING = "IsolationWarning";
/** The `code` of that warning. */
export const ISOLATION_WARNING_CODE = "SANDGATE_NO_ISOLATION";

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

export interface Egress {
  allow: string[];
  bytesIn?: number;
  bytesOut?: number;
}

/** A secret given to a session: a name, or a secret bound to hosts. */
export type SecretRef = string | { name: string; hosts?: string[]; header?: string; format?: string };

export interface CreateSessionOptions {
  /** Sandbox image; the gateway's default when omitted. */
  image?: string;
  /** Lifetime in seconds, 60..28800 (default 3600); sent as `ttl`. */
  ttlSeconds?: number;
  /** A JSON object stored with the session. */
  metadata?: Record<string, unknown>;
  /** Hosts the sandbox may reach through the gateway's egress proxy. */
  egress?: string[];
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

export interface ExecOptions {
  /** How long the command may run, in ms; sent as `timeout` in whole seconds (rounded up). */
  timeoutMs?: number;
}

/** What `Session.exec` returns. */
export interface ExecResult {
  /** The exit status; 124 when the command timed out. */
  exitCode: number;
  /** The signal that ended the command, if one did (`KILL`, ...). */
  exitSignal?: string;
  /** The shell's working directory after the command. */
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

export interface SessionList {
  sessions: Session[];
  total: number;
  limit: number;
  offset: number;
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
   * Runs `cmd` in the session's persistent shell (`POST
   * /v1/sessions/{id}/commands`, shell `default`): `cd` and `export` persist
   * from one call to the next. A timeout is not an error: the result has
   * `timedOut` and exit code 124.
   */
  async exec(cmd: string, opts: ExecOptions = {}): Promise<ExecResult> {
    if (typeof cmd !== "string") throw new TypeError("cmd must be a string");
    const body: Record<string, unknown> = { command: cmd, shell: "default" };
    let waitMs = 60_000;
    if (opts.timeoutMs !== undefined) {
      checkTimeout("timeoutMs", opts.timeoutMs);
      body["timeout"] = Math.ceil(opts.timeoutMs / 1000);
      waitMs = (body["timeout"] as number) * 1000;
    }
    const ans = await this.#client._request("POST", `${sessionPath(this.id)}/commands`, {
      what: "exec",
      sessionScoped: true,
      json: body,
      timeoutMs: waitMs + this.#client.timeoutMs,
    });
    const data = parseJSONObject(ans, "exec");
    const stdoutBytes = streamBytes(data, "stdout");
    const stderrBytes = streamBytes(data, "stderr");
    const dec = (b: Uint8Array) => new TextDecoder().decode(b);
    const stdout = dec(stdoutBytes);
    const stderr = dec(stderrBytes);
    const timedOut = data["timedOut"] === true;
    const exitSignal = typeof data["exitSignal"] === "string" && data["exitSignal"] ? data["exitSignal"] : undefined;
    return {
      exitCode: timedOut ? 124 : typeof data["exitCode"] === "number" ? data["exitCode"] : -1,
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

  /** Writes a file (`PUT /v1/sessions/{id}/files?path=P&mkdirs=true`, the raw bytes as the body). */
  async write(path: string, content: string | Uint8Array): Promise<void> {
    checkPath(path);
    const body = typeof content === "string" ? new TextEncoder().encode(content) : content;
    if (!(body instanceof Uint8Array)) throw new TypeError("content must be a string or a Uint8Array");
    await this.#client._request("PUT", `${sessionPath(this.id)}/files?${new URLSearchParams({ path, mkdirs: "true" })}`, {
      what: "write file",
      sessionScoped: true,
      body,
      headers: { "Content-Type": "application/octet-stream" },
    });
  }

  /** Reads a file (`GET /v1/sessions/{id}/files?path=P`); with maxBytes, at most that many bytes from its start. */
  async read(path: string, opts: ReadOptions = {}): Promise<Uint8Array> {
    checkPath(path);
    const headers: Record<string, string> = {};
    if (opts.maxBytes !== undefined) {
      checkInt("maxBytes", opts.maxBytes, 0);
      if (opts.maxBytes === 0) return new Uint8Array(0);
      headers["Range"] = `bytes=0-${opts.maxBytes - 1}`;
    }
    const ans = await this.#client._request("GET", `${sessionPath(this.id)}/files?${new URLSearchParams({ path })}`, {
      what: "read file",
      sessionScoped: true,
      headers,
      // An empty file has no byte 0: a range request of it is 416.
      accept: opts.maxBytes !== undefined ? [416] : [],
    });
    if (ans.status === 416) return new Uint8Array(0);
    return opts.maxBytes !== undefined && ans.body.length > opts.maxBytes ? ans.body.slice(0, opts.maxBytes) : ans.body;
  }

  /**
   * Has the gateway download `urls` into the sandbox (`POST .../files/fetch`):
   * public addresses only, each file named after its `Content-Disposition`
   * or URL (a name the remote server chose never starts with a dot).
   */
  async fetchUrls(urls: string[], opts: FetchOptions = {}): Promise<FetchResult> {
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
    const ans = await this.#client._request("POST", `${sessionPath(this.id)}/files/fetch`, {
      what: "fetch urls",
      sessionScoped: true,
      json: body,
      // Downloads take time: wait for them beyond the usual timeout.
      timeoutMs: Math.max(this.#client.timeoutMs, 600_000),
    });
    const data = parseJSONObject(ans, "fetch urls");
    if (!Array.isArray(data["fetched"]) || !Array.isArray(data["errors"])) {
      throw new SandboxOperationError("fetch urls: unexpected answer", { body: JSON.stringify(data).slice(0, 4096) });
    }
    return data as unknown as FetchResult;
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
  #isolationWarned = false;

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
    if (opts.egress !== undefined) body["egress"] = checkHosts("egress", opts.egress);
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

  /** Lists this tenant's sessions, oldest first (`GET /v1/sessions`). */
  async listSessions(opts: { limit?: number; offset?: number } = {}): Promise<SessionList> {
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
  async updateSession(id: string, opts: { ttlSeconds?: number; egress?: string[] }): Promise<Session> {
    const body: Record<string, unknown> = {};
    if (opts.ttlSeconds !== undefined) body["ttl"] = checkInt("ttlSeconds", opts.ttlSeconds, MIN_TTL, MAX_TTL);
    if (opts.egress !== undefined) body["egress"] = checkHosts("egress", opts.egress);
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

  /** Warns once per client (`process.emitWarning`, type `IsolationWarning`) that the gateway isolates nothing. */
  #warnIsolation(session: Session): void {
    if (this.#isolationWarned) return;
    this.#isolationWarned = true;
    const unenforced = Array.isArray(session.raw["unenforced"]) ? (session.raw["unenforced"] as unknown[]).join(", ") : "";
    process.emitWarning(
      `the sandgate gateway at ${this.baseUrl} does not isolate sessions ("isolation": "none", its workdir driver): ` +
        "their processes run as the gateway's user, with the host's files and network" +
        (unenforced ? `; not enforced: ${unenforced}` : ""),
      { type: ISOLATION_WARNING, code: ISOLATION_WARNING_CODE },
    );
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

/** A stream of a command answer: `stdout`, or `stdoutBase64` for output that is not UTF-8. */
function streamBytes(data: Record<string, unknown>, name: "stdout" | "stderr"): Uint8Array {
  const b64 = data[`${name}Base64`];
  if (typeof b64 === "string") return new Uint8Array(Buffer.from(b64, "base64"));
  const text = data[name];
  return new TextEncoder().encode(typeof text === "string" ? text : "");
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
