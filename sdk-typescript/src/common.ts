// Helpers shared by the REST client, the tunnel and the SSH client.

import {
  EgressNotAllowedError,
  type ErrorDetails,
  InvalidEgressError,
  InvalidResourcesError,
  InvalidSecretError,
  RateLimitError,
  ResourcesExceededError,
  SandboxAPIError,
  SandboxConnectionError,
  SandboxOperationError,
  SessionGoneError,
  SessionNotFoundError,
  UnauthorizedError,
  UnknownSecretError,
  SnapshotNotFoundError,
  WorkspaceBusyError,
  WorkspaceExistsError,
  WorkspaceNotFoundError,
  WorkspacesUnavailableError,
  FileNotFoundInSandboxError,
  ProcessNotFoundError,
  ShellNotFoundError,
  ProcessExitedError,
  SandboxPermissionError,
  FileTooLargeError,
  DiskFullError,
  ShellBusyError,
} from "./errors.js";

export const ENV_API_URL = "SANDBOX_API_URL";
export const ENV_API_TOKEN = "SANDBOX_API_TOKEN";
export const SDK_VERSION = "0.1.0";
export const USER_AGENT = `sandgate-sdk-typescript/${SDK_VERSION}`;

/** Bound on how much of an error body is kept in errors. */
export const MAX_ERROR_BODY = 4096;

type OperationErrorClass = new (message: string, details?: ErrorDetails) => SandboxOperationError;

/** REST 400 error codes with a class of their own (all SandboxOperationError). */
const TYPED_400: Record<string, OperationErrorClass> = {
  resources_exceeded: ResourcesExceededError,
  invalid_resources: InvalidResourcesError,
  invalid_egress: InvalidEgressError,
  egress_not_allowed: EgressNotAllowedError,
  unknown_secret: UnknownSecretError,
  invalid_secret: InvalidSecretError,
};

/** Error codes with a class of their own whatever the status (all SandboxOperationError). */
const TYPED_CODES: Record<string, OperationErrorClass> = {
  workspace_not_found: WorkspaceNotFoundError,
  workspace_exists: WorkspaceExistsError,
  workspace_busy: WorkspaceBusyError,
  snapshot_not_found: SnapshotNotFoundError,
  workspaces_unavailable: WorkspacesUnavailableError,
  file_not_found: FileNotFoundInSandboxError,
  process_not_found: ProcessNotFoundError,
  shell_not_found: ShellNotFoundError,
  process_exited: ProcessExitedError,
  permission_denied: SandboxPermissionError,
  file_too_large: FileTooLargeError,
  disk_full: DiskFullError,
};

/** The base URL and token, taking omitted ones from the environment. */
export function resolveSettings(baseUrl?: string, apiKey?: string): { baseUrl: string; apiKey: string } {
  const url = baseUrl || process.env[ENV_API_URL] || "";
  const token = apiKey || process.env[ENV_API_TOKEN] || "";
  if (!url) throw new TypeError(`baseUrl is required (pass it or set ${ENV_API_URL})`);
  if (!token) throw new TypeError(`apiKey is required (pass it or set ${ENV_API_TOKEN})`);
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw new TypeError(`baseUrl must be an http:// or https:// URL, got ${JSON.stringify(url)}`);
  }
  if ((parsed.protocol !== "http:" && parsed.protocol !== "https:") || !parsed.hostname) {
    throw new TypeError(`baseUrl must be an http:// or https:// URL, got ${JSON.stringify(url)}`);
  }
  if (parsed.search || parsed.hash) throw new TypeError("baseUrl must not carry a query or fragment");
  if (/[\r\n\0]/.test(token)) throw new TypeError("apiKey must not contain CR, LF or NUL");
  return { baseUrl: url.replace(/\/+$/, ""), apiKey: token };
}

/** The REST base URL: baseUrl itself when its path ends in /v1, else baseUrl + "/v1". */
export function restBase(baseUrl: string): string {
  const url = baseUrl.replace(/\/+$/, "");
  const path = new URL(url).pathname.replace(/\/+$/, "");
  return path.endsWith("/v1") ? url : url + "/v1";
}

export function checkInt(name: string, value: unknown, lo?: number, hi?: number): number {
  if (typeof value !== "number" || !Number.isInteger(value)) {
    throw new TypeError(`${name} must be an integer, got ${typeof value === "number" ? value : typeof value}`);
  }
  if ((lo !== undefined && value < lo) || (hi !== undefined && value > hi)) {
    throw new RangeError(
      hi === undefined ? `${name} must be >= ${lo}, got ${value}` : `${name} must be between ${lo} and ${hi}, got ${value}`,
    );
  }
  return value;
}

export function checkTimeout(name: string, value: unknown): number {
  if (typeof value !== "number" || Number.isNaN(value)) throw new TypeError(`${name} must be a number of milliseconds`);
  if (value <= 0) throw new RangeError(`${name} must be > 0, got ${value}`);
  if (!Number.isFinite(value)) throw new RangeError(`${name} must be a finite number of milliseconds, got ${value}`);
  return value;
}

/** The (code, message, text) of an error body, JSON envelope or not. */
export function parseErrorBody(body: Uint8Array): { code?: string; message?: string; text: string } {
  const text = new TextDecoder().decode(body.subarray(0, MAX_ERROR_BODY));
  let code: string | undefined;
  let message: string | undefined;
  let data: unknown;
  try {
    data = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(body));
  } catch {
    data = undefined;
  }
  if (data !== null && typeof data === "object" && !Array.isArray(data)) {
    const obj = data as Record<string, unknown>;
    const err = obj["error"];
    if (err !== null && typeof err === "object" && !Array.isArray(err)) {
      const e = err as Record<string, unknown>;
      if (typeof e["code"] === "string") code = e["code"];
      if (typeof e["message"] === "string") message = e["message"];
    } else if (typeof err === "string") {
      message = err;
    } else if (typeof obj["message"] === "string") {
      message = obj["message"];
    }
  }
  if (message === undefined) {
    const stripped = text.split(/\s+/).filter(Boolean).join(" ");
    if (stripped && !stripped.startsWith("<")) message = stripped.slice(0, 200);
  }
  return { code, message, text };
}

function intHeader(headers: Record<string, string>, name: string): number | undefined {
  const v = headers[name.toLowerCase()];
  if (v === undefined || !/^\s*-?\d+\s*$/.test(v)) return undefined;
  return parseInt(v, 10);
}

function floatHeader(headers: Record<string, string>, name: string): number | undefined {
  const v = headers[name.toLowerCase()];
  if (v === undefined || v.trim() === "") return undefined;
  const n = Number(v.trim());
  return Number.isFinite(n) ? n : undefined;
}

/** Headers of a fetch Response as a plain object with lowercased names. */
export function headersObject(h: Headers): Record<string, string> {
  const out: Record<string, string> = {};
  h.forEach((value, key) => {
    out[key.toLowerCase()] = value;
  });
  return out;
}

/**
 * The error for an HTTP error answer, as the Python SDK maps it: 401 ->
 * UnauthorizedError, 404 -> SessionNotFoundError when the request named a
 * session, 410 session_gone -> SessionGoneError, 429 -> RateLimitError, a
 * REST 400 whose code has a class of its own -> that class, anything else ->
 * the fallback (SandboxOperationError for REST, SandboxConnectionError for
 * CONNECT).
 */
export function errorForStatus(
  status: number,
  reason: string,
  headers: Record<string, string>,
  body: Uint8Array,
  opts: { what: string; sessionScoped: boolean; statusLine?: string; fallback?: "operation" | "connection" },
): SandboxAPIError {
  const { code, message, text } = parseErrorBody(body);
  const detail = message || reason || "no details";
  let msg = `${opts.what}: HTTP ${status}`;
  if (code) msg += ` ${code}`;
  msg += `: ${detail}`;
  const details: ErrorDetails = { status, code, statusLine: opts.statusLine, body: text, headers };
  if (status === 401) return new UnauthorizedError(msg, details);
  // A session's 404 is "not_found" (or has no envelope); a 404 of something
  // in a live session (a file, a process) has a code of its own.
  if (status === 404 && opts.sessionScoped && (!code || code === "not_found")) return new SessionNotFoundError(msg, details);
  if (status === 410 && code === "session_gone") return new SessionGoneError(msg, details);
  if (status === 429) {
    const cls = code === "shell_busy" ? ShellBusyError : RateLimitError;
    return new cls(
      msg,
      {
        limit: intHeader(headers, "X-RateLimit-Limit"),
        remaining: intHeader(headers, "X-RateLimit-Remaining"),
        reset: intHeader(headers, "X-RateLimit-Reset"),
        retryAfter: floatHeader(headers, "Retry-After"),
      },
      details,
    );
  }
  const fallback = opts.fallback ?? "operation";
  if (status === 400 && fallback === "operation" && code) {
    const typed = TYPED_400[code];
    if (typed) return new typed(msg, details);
  }
  if (fallback === "operation" && code && Object.hasOwn(TYPED_CODES, code)) {
    const typed = TYPED_CODES[code];
    if (typed) return new typed(msg, details);
  }
  return fallback === "connection" ? new SandboxConnectionError(msg, details) : new SandboxOperationError(msg, details);
}

/** Strips IPv6 brackets from a URL hostname. */
export function bareHost(hostname: string): string {
  return hostname.startsWith("[") && hostname.endsWith("]") ? hostname.slice(1, -1) : hostname;
}

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
