/**
 * Errors the SDK throws. Every failure of an SDK call is a {@link SandboxAPIError}
 * (bad arguments throw the usual `TypeError` / `RangeError` before anything is sent):
 *
 * ```
 * SandboxAPIError
 * +-- SandboxConnectionError      network, TLS, tunnel (non-200 CONNECT), SSH handshake
 * |   +-- HostKeyMismatchError    the server's SSH host key is not a pinned one
 * +-- UnauthorizedError           HTTP 401 (REST or CONNECT)
 * +-- SessionNotFoundError        HTTP 404 for a session (REST or CONNECT)
 * |   +-- SessionGoneError        410 session_gone: deleted or expired lately (`reason` says why)
 * +-- RateLimitError              HTTP 429 (REST or CONNECT)
 * |   +-- ShellBusyError          429 shell_busy: 32 commands already wait for that persistent shell
 * +-- SandboxOperationError       other 4xx/5xx, SSH auth/exec/SFTP failures
 *     +-- CommandTimeoutError     runCommand() passed its timeout; the command was killed
 *     +-- ResourcesExceededError  400 resources_exceeded
 *     +-- InvalidResourcesError   400 invalid_resources
 *     +-- InvalidEgressError      400 invalid_egress
 *     +-- EgressNotAllowedError   400 egress_not_allowed
 *     +-- UnknownSecretError      400 unknown_secret
 *     +-- InvalidSecretError      400 invalid_secret
 *     +-- WorkspaceNotFoundError  404 workspace_not_found
 *     +-- WorkspaceExistsError    409 workspace_exists
 *     +-- WorkspaceBusyError      409 workspace_busy: a live session holds the workspace
 *     +-- SnapshotNotFoundError   404 snapshot_not_found
 *     +-- WorkspacesUnavailableError  400 workspaces_unavailable: the gateway keeps no workspaces
 *     +-- FileNotFoundInSandboxError  404 file_not_found: nothing at the path in the sandbox
 *     +-- ProcessNotFoundError    404 process_not_found
 *     +-- ShellNotFoundError      404 shell_not_found
 *     +-- ProcessExitedError      409 process_exited: the background process has ended
 *     +-- SandboxPermissionError  403 permission_denied: the sandbox's user may not
 *     +-- FileTooLargeError       413 file_too_large: a write over the gateway's --max-file-bytes
 *     +-- DiskFullError           507 disk_full: the sandbox's filesystem is full; nothing was written
 * ```
 *
 * The same classes, and the same mapping from the gateway's JSON `error.code`,
 * as the Python SDK (`sandbox_sessions_sdk.errors`).
 */

/** Details an error may carry about the answer that caused it. */
export interface ErrorDetails {
  /** The HTTP status of the answer, if there was one. */
  status?: number;
  /** The gateway's machine-readable `error.code`, if the answer carried one. */
  code?: string;
  /** The status line of a CONNECT answer (`HTTP/1.1 404 Not Found`). */
  statusLine?: string;
  /** The (bounded) body of the answer. */
  body?: string;
  /** The answer's headers, names lowercased. */
  headers?: Record<string, string>;
  /** The underlying error. */
  cause?: unknown;
}

/** Base class of every error the SDK throws. */
export class SandboxAPIError extends Error {
  /** The HTTP status of the answer that caused the error, if any. */
  readonly status: number | undefined;
  /** The gateway's `error.code` (`rate_limited`, `session_not_found`, ...), if any. */
  readonly code: string | undefined;
  /** The CONNECT answer's status line, for tunnel errors. */
  readonly statusLine: string | undefined;
  /** The answer's body, at most 4 KiB. */
  readonly body: string | undefined;
  /** The answer's headers (names lowercased); `{}` when there was no answer. */
  readonly headers: Record<string, string>;

  constructor(message: string, details: ErrorDetails = {}) {
    super(message, details.cause === undefined ? undefined : { cause: details.cause });
    this.name = new.target.name;
    this.status = details.status;
    this.code = details.code;
    this.statusLine = details.statusLine;
    this.body = details.body;
    this.headers = details.headers ?? {};
  }
}

/**
 * The gateway could not be reached or the connection broke: DNS/TCP/TLS
 * failures and timeouts, a CONNECT answered with anything but 200 (other than
 * 401, 404 and 429, which have their own classes), a failed SSH handshake.
 */
export class SandboxConnectionError extends SandboxAPIError {}

/** The SSH server presented a host key that is not one of the pinned keys. */
export class HostKeyMismatchError extends SandboxConnectionError {
  /** The key the server presented, as an authorized_keys line. */
  readonly presented: string;
  /** The pinned keys, as authorized_keys lines. */
  readonly expected: string[];

  constructor(message: string, presented: string, expected: string[]) {
    super(message);
    this.presented = presented;
    this.expected = [...expected];
  }
}

/** The bearer token was missing or rejected (HTTP 401). */
export class UnauthorizedError extends SandboxAPIError {}

/** The session does not exist, was deleted, expired, or is another tenant's (HTTP 404). */
export class SessionNotFoundError extends SandboxAPIError {}

/**
 * HTTP 410 `session_gone`: the session was deleted or expired within the
 * gateway's `--tombstone-ttl` (24h by default). `reason` is `deleted`,
 * `ttl_expired`, `idle_expired`, `failed` or `shutdown` (undefined if the
 * message does not say); the message says when, and who deleted it or why
 * it failed. A SessionNotFoundError, so code catching that catches this.
 */
export class SessionGoneError extends SessionNotFoundError {
  /** Why the session ended, parsed from the message. */
  readonly reason: string | undefined;

  constructor(message: string, details: ErrorDetails = {}) {
    super(message, details);
    this.reason = /\(reason: ([a-z_]+)\)/.exec(message)?.[1];
  }
}

/**
 * HTTP 429: the per-principal request rate (`code` `rate_limited`) or a
 * tenant quota: live sessions (`quota_exceeded`), kept workspaces
 * (`workspace_limit`) or snapshots (`snapshot_limit`).
 */
export class RateLimitError extends SandboxAPIError {
  /** `X-RateLimit-Limit`: requests allowed per window. */
  readonly limit: number | undefined;
  /** `X-RateLimit-Remaining`. */
  readonly remaining: number | undefined;
  /** `X-RateLimit-Reset`: when the window resets, in Unix seconds. */
  readonly reset: number | undefined;
  /** `Retry-After`: seconds to wait before retrying. */
  readonly retryAfter: number | undefined;

  constructor(
    message: string,
    rate: { limit?: number; remaining?: number; reset?: number; retryAfter?: number },
    details: ErrorDetails = {},
  ) {
    super(message, details);
    this.limit = rate.limit;
    this.remaining = rate.remaining;
    this.reset = rate.reset;
    this.retryAfter = rate.retryAfter;
  }
}

/**
 * An operation failed: HTTP errors other than 401/404/429 (400, 413, 501,
 * 5xx...), answers that cannot be understood, refused SSH authentication,
 * failed exec and SFTP operations.
 */
export class SandboxOperationError extends SandboxAPIError {}

/** `runCommand` did not finish within its timeout; the remote command was killed. */
export class CommandTimeoutError extends SandboxOperationError {
  /** The command that timed out. */
  readonly command: string;
  /** The timeout, in milliseconds. */
  readonly timeoutMs: number;
  /** Standard output received before the timeout. */
  readonly stdout: string;
  /** Standard error received before the timeout. */
  readonly stderr: string;
  /** True when stdout or stderr passed maxOutputBytes and was cut. */
  readonly truncated: boolean;

  constructor(
    message: string,
    info: { command: string; timeoutMs: number; stdout: string; stderr: string; truncated: boolean },
  ) {
    super(message);
    this.command = info.command;
    this.timeoutMs = info.timeoutMs;
    this.stdout = info.stdout;
    this.stderr = info.stderr;
    this.truncated = info.truncated;
  }
}

function resourceOf(message: string): string | undefined {
  return /resources\.(\w+)/.exec(message)?.[1];
}

/** 400 `resources_exceeded`: a resource above the gateway's cap; `resource` names the field. */
export class ResourcesExceededError extends SandboxOperationError {
  /** `memoryMiB`, `cpus`, `pids` or `diskMiB`; undefined if the message names none. */
  readonly resource: string | undefined;
  constructor(message: string, details: ErrorDetails = {}) {
    super(message, details);
    this.resource = resourceOf(message);
  }
}

/** 400 `invalid_resources`: a resource below its minimum; `resource` names the field. */
export class InvalidResourcesError extends SandboxOperationError {
  readonly resource: string | undefined;
  constructor(message: string, details: ErrorDetails = {}) {
    super(message, details);
    this.resource = resourceOf(message);
  }
}

/** 400 `invalid_egress`: an egress entry that does not parse. */
export class InvalidEgressError extends SandboxOperationError {}

/** The double-quoted strings (Go `%q`) in text, unescaped. */
function quoted(text: string): string[] {
  return [...text.matchAll(/"((?:[^"\\]|\\.)*)"/g)].map((m) => (m[1] ?? "").replace(/\\(.)/g, "$1"));
}

/** 400 `egress_not_allowed`: egress (or a secret's hosts) outside what the operator allows. */
export class EgressNotAllowedError extends SandboxOperationError {
  /** The refused entries the message names, as the gateway wrote them. */
  readonly entries: string[];
  constructor(message: string, details: ErrorDetails = {}) {
    super(message, details);
    const i = message.lastIndexOf(": ");
    this.entries = quoted(i >= 0 ? message.slice(i + 2) : message);
  }
}

/** 400 `unknown_secret`: secrets the gateway does not define for this tenant. */
export class UnknownSecretError extends SandboxOperationError {
  /** Every unknown name, in the order given. */
  readonly names: string[];
  constructor(message: string, details: ErrorDetails = {}) {
    super(message, details);
    const m = /unknown secrets?: (.*)$/.exec(message);
    this.names = m?.[1] ? m[1].split(",").map((n) => n.trim()).filter(Boolean) : [];
  }
}

/** 400 `invalid_secret`: a malformed secret reference. */
export class InvalidSecretError extends SandboxOperationError {}

/** 404 `workspace_not_found`: the tenant has no workspace of that name. */
export class WorkspaceNotFoundError extends SandboxOperationError {}

/** 409 `workspace_exists`: the tenant already has a workspace of that name. */
export class WorkspaceExistsError extends SandboxOperationError {}

/** 409 `workspace_busy`: a live session holds the workspace; end it first. */
export class WorkspaceBusyError extends SandboxOperationError {}

/** 404 `snapshot_not_found`: the tenant has no such snapshot. */
export class SnapshotNotFoundError extends SandboxOperationError {}

/** HTTP 404 `file_not_found`: nothing at the path in the sandbox (the session is there). */
export class FileNotFoundInSandboxError extends SandboxOperationError {}

/** HTTP 404 `process_not_found`: no background process by that id in the session. */
export class ProcessNotFoundError extends SandboxOperationError {}

/** HTTP 404 `shell_not_found`: no persistent shell by that name in the session. */
export class ShellNotFoundError extends SandboxOperationError {}

/** 400 `workspaces_unavailable`: this gateway keeps no workspaces. */
export class WorkspacesUnavailableError extends SandboxOperationError {}

/** HTTP 409 `process_exited`: the background process has ended; it takes no more input or signals. */
export class ProcessExitedError extends SandboxOperationError {}

/** HTTP 403 `permission_denied`: the sandbox's user may not read or write that path. */
export class SandboxPermissionError extends SandboxOperationError {}

/** HTTP 413 `file_too_large`: a write over the gateway's `--max-file-bytes`; nothing was written. */
export class FileTooLargeError extends SandboxOperationError {}

/** HTTP 507 `disk_full`: the sandbox's filesystem is full; nothing was written and the old file is intact. */
export class DiskFullError extends SandboxOperationError {}

/** HTTP 429 `shell_busy`: 32 commands already wait for this persistent shell. A RateLimitError, as every 429 is. */
export class ShellBusyError extends RateLimitError {}
