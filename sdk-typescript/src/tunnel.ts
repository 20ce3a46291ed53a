// openTunnel: a raw byte stream to a session's SSH server via HTTP CONNECT.

import * as net from "node:net";
import type { Duplex } from "node:stream";
import * as tls from "node:tls";

import { WebSocket, createWebSocketStream } from "ws";

import { USER_AGENT, bareHost, checkTimeout, errorForStatus, resolveSettings } from "./common.js";
import { SandboxAPIError, SandboxConnectionError } from "./errors.js";

export const DEFAULT_CONNECT_PATH = "/sessions/{sessionId}";

/** Bounds on the CONNECT answer the client is willing to read. */
const MAX_HEAD = 64 * 1024;
const MAX_BODY = 64 * 1024;

/** TLS verification for https gateways (the tunnel and SSH; REST uses fetch, see the README). */
export interface TLSOptions {
  /** Extra trusted CA certificates (PEM), replacing the default roots, as node:tls's `ca`. */
  ca?: string | Buffer | Array<string | Buffer>;
  /** Verify the gateway's certificate (default true). false verifies nothing. */
  rejectUnauthorized?: boolean;
  /** The TLS server name (SNI and certificate check); default: the URL's host. */
  servername?: string;
}

export interface TunnelOptions extends TLSOptions {
  /** The gateway URL (`http://` or `https://`); default `$SANDBOX_API_URL`. */
  baseUrl?: string;
  /** The API key or JWT; default `$SANDBOX_API_TOKEN`. */
  apiKey?: string;
  /** The session to connect to. */
  sessionId: string;
  /** Time allowed for TCP connect, TLS handshake and the CONNECT answer together (default 10000). */
  timeoutMs?: number;
  /** Path template joined to the URL's path; `{sessionId}` is replaced (default `/sessions/{sessionId}`). */
  connectPathTemplate?: string;
  /** More headers to send with the CONNECT request. */
  extraHeaders?: Record<string, string>;
  /**
   * `"connect"` (HTTP CONNECT, the default), `"websocket"`: the same SSH
   * stream in a WebSocket, `GET /v1/sessions/{id}/ssh` (see websocketPath),
   * for front ends that do not pass CONNECT (`connectPathTemplate` is then
   * not used), or `"auto"`: CONNECT, then the WebSocket when something in
   * the way refuses the CONNECT (see connectRefused).
   */
  transport?: Transport;
}

/**
 * How a tunnel reaches the gateway: `"connect"` (HTTP CONNECT, the
 * default), `"websocket"` (`GET /v1/sessions/{id}/ssh`), or `"auto"`:
 * CONNECT, then the WebSocket when something between client and gateway
 * refuses the CONNECT (an answer that is not HTTP or not the gateway's, or
 * 400, 405 or 501). The gateway's own refusals (404, 429...) are final, and so
 * are 401 and 403 from anyone.
 */
export type Transport = "connect" | "websocket" | "auto";

const TRANSPORTS: readonly string[] = ["connect", "websocket", "auto"];

/** Whether a failed CONNECT was refused by something in the way (so a WebSocket may pass), as `sandgate proxy --transport auto` decides. */
export function connectRefused(e: unknown): boolean {
  if (!(e instanceof SandboxConnectionError) && !(e instanceof SandboxAPIError)) return false;
  if (e.status !== undefined) {
    // 401 and 403 are final, even without the gateway's envelope (a front's own authentication).
    if (e.status === 401 || e.status === 403) return false;
    return e.status === 400 || e.status === 405 || e.status === 501 || !e.code;
  }
  // An answer that could not be read as HTTP, or none after the request was sent.
  return (e as { notHTTP?: boolean }).notHTTP === true;
}

/** The socket a tunnel returns: a net.Socket, a tls.TLSSocket for https, a Duplex for a WebSocket. */
export type TunnelSocket = net.Socket | tls.TLSSocket | Duplex;

/** The WebSocket path for a base URL and session: `/v1` added to the URL's path unless it ends so. */
export function websocketPath(baseUrl: string, sessionId: string): string {
  let p = new URL(baseUrl).pathname.replace(/\/+$/, "");
  if (!p.endsWith("/v1")) p += "/v1";
  return `${p}/sessions/${encodeURIComponent(sessionId)}/ssh`;
}

/** The CONNECT path for a base URL and session: the URL's path joined with the template. */
export function connectPath(baseUrl: string, sessionId: string, template = DEFAULT_CONNECT_PATH): string {
  const u = new URL(baseUrl);
  const p = template.replace("{sessionId}", encodeURIComponent(sessionId));
  return u.pathname.replace(/\/+$/, "") + "/" + p.replace(/^\/+/, "");
}

/**
 * Sends `CONNECT <path> HTTP/1.1` to the gateway and resolves to the socket
 * once it answers 200. The socket then carries the session's raw SSH stream:
 * any bytes the gateway sent right after the answer's head (its SSH version
 * line) are put back (`unshift`), so the socket starts exactly at the SSH
 * stream. It is in paused mode: nothing is lost before a reader attaches
 * (a 'data' listener, `pipe`, ssh2's `sock` option).
 *
 * The token goes in both `Proxy-Authorization: Bearer` and `Authorization:
 * Bearer`. Errors: UnauthorizedError (401), SessionNotFoundError (404),
 * RateLimitError (429), SandboxConnectionError for everything else (network,
 * TLS, timeout, any other answer); each carries the answer's `statusLine`
 * and `status` when there was an answer. A CONNECT refused because too many
 * tunnels are in SSH authentication (`429 too_many_ssh_startups`: the
 * caller's own budget; `503 ssh_startups_full`: the gateway's) is retried
 * after its `Retry-After` for as long as `timeoutMs` allows.
 */
export async function openTunnel(options: TunnelOptions): Promise<TunnelSocket> {
  const transport = options.transport ?? "connect";
  if (!TRANSPORTS.includes(transport)) {
    throw new TypeError(`transport must be "connect", "websocket" or "auto", not ${JSON.stringify(transport)}`);
  }
  const timeoutMs = checkTimeout("timeoutMs", options.timeoutMs ?? 10_000);
  const deadline = Date.now() + timeoutMs;
  if (transport === "auto") {
    // One deadline for both tries.
    try {
      return await openTunnel({ ...options, transport: "connect", timeoutMs });
    } catch (e) {
      if (!connectRefused(e)) throw e;
      return openTunnel({ ...options, transport: "websocket", timeoutMs: Math.max(1, deadline - Date.now()) });
    }
  }
  for (;;) {
    try {
      const once = { ...options, timeoutMs: Math.max(1, deadline - Date.now()) };
      return await (options.transport === "websocket" ? openWebSocketOnce(once) : openTunnelOnce(once));
    } catch (e) {
      const wait = startupRetry(e, deadline);
      if (wait === null) throw e;
      await new Promise((r) => setTimeout(r, wait));
    }
  }
}

/** CONNECT refusals that only say "too many tunnels in SSH authentication now". */
const STARTUP_CODES = new Set(["too_many_ssh_startups", "ssh_startups_full"]);

/** Milliseconds to wait before retrying a CONNECT refused with `e`, or null. */
function startupRetry(e: unknown, deadline: number): number | null {
  if (!(e instanceof SandboxAPIError) || !STARTUP_CODES.has(e.code ?? "")) return null;
  const after = Number.parseFloat(e.headers["retry-after"] ?? "");
  const wait = Math.min(Math.max(Number.isFinite(after) ? after * 1000 : 1000, 50), 5000);
  return Date.now() + wait >= deadline ? null : wait;
}

async function openTunnelOnce(options: TunnelOptions): Promise<net.Socket | tls.TLSSocket> {
  const { baseUrl, apiKey } = resolveSettings(options.baseUrl, options.apiKey);
  const sessionId = options.sessionId;
  if (typeof sessionId !== "string" || !sessionId) throw new TypeError("sessionId must be a non-empty string");
  const template = options.connectPathTemplate ?? DEFAULT_CONNECT_PATH;
  if (!template.includes("{sessionId}")) throw new TypeError("connectPathTemplate must contain {sessionId}");
  const timeoutMs = checkTimeout("timeoutMs", options.timeoutMs ?? 10_000);
  const extra = options.extraHeaders ?? {};
  for (const [k, v] of Object.entries(extra)) {
    if (/[\r\n\0]/.test(k + v)) throw new TypeError("extraHeaders must not contain CR, LF or NUL");
  }

  const url = new URL(baseUrl);
  const useTLS = url.protocol === "https:";
  const host = bareHost(url.hostname);
  const port = url.port ? Number(url.port) : useTLS ? 443 : 80;
  const where = `${host}:${port}`;
  const path = connectPath(baseUrl, sessionId, template);

  const lines = [
    `CONNECT ${path} HTTP/1.1`,
    `Host: ${url.host}`,
    `Proxy-Authorization: Bearer ${apiKey}`,
    `Authorization: Bearer ${apiKey}`,
    `User-Agent: ${USER_AGENT}`,
    ...Object.entries(extra).map(([k, v]) => `${k}: ${v}`),
  ];
  const request = Buffer.from(lines.join("\r\n") + "\r\n\r\n", "latin1");

  return new Promise<net.Socket | tls.TLSSocket>((resolve, reject) => {
    let tcpUp = false;
    let secured = false;
    let done = false;
    let sock: net.Socket | tls.TLSSocket;
    let head = Buffer.alloc(0);
    // After a non-200 head: the answer and how much body to wait for.
    let answer: { statusLine: string; status: number; reason: string; headers: Record<string, string>; want: number } | null =
      null;
    let body = Buffer.alloc(0);

    const finish = (err: SandboxAPIError | null) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      sock.removeListener("readable", onReadable);
      sock.removeListener("error", onError);
      sock.removeListener("close", onClose);
      sock.removeListener(useTLS ? "secureConnect" : "connect", onConnected);
      if (err) {
        sock.destroy();
        reject(err);
      }
    };

    const failAnswer = () => {
      if (!answer) return;
      finish(
        errorForStatus(answer.status, answer.reason, answer.headers, body.subarray(0, answer.want), {
          what: `tunnel: CONNECT ${path} answered ${JSON.stringify(answer.statusLine)}`,
          sessionScoped: true,
          statusLine: answer.statusLine,
          fallback: "connection",
        }),
      );
    };

    const onData = (chunk: Buffer) => {
      if (done) return;
      if (answer) {
        body = Buffer.concat([body, chunk]);
        if (body.length >= answer.want) failAnswer();
        return;
      }
      head = Buffer.concat([head, chunk]);
      let end = head.indexOf("\r\n\r\n");
      let sep = 4;
      const lf = head.indexOf("\n\n");
      if (lf >= 0 && (end < 0 || lf < end)) {
        end = lf;
        sep = 2;
      }
      if (end < 0) {
        if (head.length >= MAX_HEAD) finish(new SandboxConnectionError("tunnel: CONNECT answer head is too large"));
        return;
      }
      if (end + sep > MAX_HEAD) {
        finish(new SandboxConnectionError("tunnel: CONNECT answer head is too large"));
        return;
      }
      const rest = head.subarray(end + sep);
      let parsed;
      try {
        parsed = parseHead(head.subarray(0, end).toString("latin1"));
      } catch (e) {
        finish(e as SandboxAPIError);
        return;
      }
      if (parsed.status === 200) {
        finish(null);
        sock.setTimeout(0);
        // Paused mode (never flowing), so nothing is emitted before the
        // caller reads; attaching a 'data' listener starts the flow.
        if (rest.length > 0) sock.unshift(rest);
        resolve(sock);
        return;
      }
      const len = Number.parseInt(parsed.headers["content-length"] ?? "", 10);
      answer = { ...parsed, want: Number.isFinite(len) ? Math.max(0, Math.min(len, MAX_BODY)) : 0 };
      body = Buffer.from(rest);
      if (body.length >= answer.want) failAnswer();
    };

    const onReadable = () => {
      let chunk: Buffer | null;
      while (!done && (chunk = sock.read() as Buffer | null) !== null) onData(chunk);
    };

    const onError = (err: Error) => {
      if (done) return;
      if (answer) {
        failAnswer();
        return;
      }
      let msg: string;
      if (!tcpUp) msg = `tunnel: cannot connect to ${where}: ${err.message}`;
      else if (useTLS && !secured) msg = `tunnel: TLS handshake with ${where} failed: ${err.message}`;
      else msg = `tunnel: CONNECT ${path} failed: ${err.message}`;
      finish(new SandboxConnectionError(msg, { cause: err }));
    };

    const onClose = () => {
      if (done) return;
      if (answer) {
        failAnswer();
        return;
      }
      if (head.length === 0) {
        finish(notHTTP(new SandboxConnectionError("tunnel: the gateway closed the connection without answering CONNECT")));
      } else {
        finish(
          notHTTP(
            new SandboxConnectionError(
              "tunnel: the gateway closed the connection in the middle of its CONNECT answer: " +
                head.subarray(0, 200).toString("latin1"),
            ),
          ),
        );
      }
    };

    const onConnected = () => {
      secured = useTLS;
      if (done) return;
      sock.write(request);
    };

    const timer = setTimeout(() => {
      if (done) return;
      if (answer) {
        failAnswer();
        return;
      }
      const step = !tcpUp ? "connecting to" : useTLS && !secured ? "TLS handshake with" : "";
      finish(
        new SandboxConnectionError(
          step
            ? `tunnel: timed out ${step} ${where} after ${timeoutMs} ms`
            : `tunnel: no answer to CONNECT ${path} within ${timeoutMs} ms`,
        ),
      );
    }, timeoutMs);

    try {
      if (useTLS) {
        sock = tls.connect({
          host,
          port,
          servername: options.servername ?? (net.isIP(host) ? undefined : host),
          ca: options.ca,
          rejectUnauthorized: options.rejectUnauthorized ?? true,
          ALPNProtocols: ["http/1.1"],
        });
      } else {
        sock = net.connect({ host, port });
      }
    } catch (e) {
      // A bad option throws here, before there is a socket: the promise
      // rejects with it, and the timer must not fire later on no socket.
      done = true;
      clearTimeout(timer);
      throw e;
    }
    sock.once("connect", () => {
      tcpUp = true;
      try {
        sock.setNoDelay(true);
      } catch {
        // not fatal
      }
    });
    sock.on(useTLS ? "secureConnect" : "connect", onConnected);
    sock.on("readable", onReadable);
    sock.on("error", onError);
    sock.on("close", onClose);
  });
}

/** Opens the SSH WebSocket once and resolves to its byte stream. */
function openWebSocketOnce(options: TunnelOptions): Promise<Duplex> {
  const { baseUrl, apiKey } = resolveSettings(options.baseUrl, options.apiKey);
  const sessionId = options.sessionId;
  if (typeof sessionId !== "string" || !sessionId) throw new TypeError("sessionId must be a non-empty string");
  const timeoutMs = checkTimeout("timeoutMs", options.timeoutMs ?? 10_000);
  const extra = options.extraHeaders ?? {};
  for (const [k, v] of Object.entries(extra)) {
    if (/[\r\n\0]/.test(k + v)) throw new TypeError("extraHeaders must not contain CR, LF or NUL");
  }
  const url = new URL(baseUrl);
  const path = websocketPath(baseUrl, sessionId);
  const target = `${url.protocol === "https:" ? "wss:" : "ws:"}//${url.host}${path}`;
  return new Promise<Duplex>((resolve, reject) => {
    let done = false;
    const ws = new WebSocket(target, {
      headers: { Authorization: `Bearer ${apiKey}`, "User-Agent": USER_AGENT, ...extra },
      handshakeTimeout: timeoutMs,
      perMessageDeflate: false,
      followRedirects: false,
      ca: options.ca,
      rejectUnauthorized: options.rejectUnauthorized ?? true,
      // Handed on to tls.connect (ws's types do not list it).
      ...(options.servername !== undefined ? ({ servername: options.servername } as object) : {}),
    });
    const fail = (err: SandboxAPIError) => {
      if (done) return;
      done = true;
      ws.terminate();
      reject(err);
    };
    ws.once("open", () => {
      if (done) return;
      done = true;
      ws.removeAllListeners("error");
      // Not flowing until a reader attaches, as a CONNECT's socket (no
      // pause(): a 'data' listener would not start a paused stream).
      resolve(createWebSocketStream(ws));
    });
    ws.once("unexpected-response", (_req, res) => {
      const statusLine = `HTTP/${res.httpVersion} ${res.statusCode} ${res.statusMessage ?? ""}`.trim();
      const headers: Record<string, string> = {};
      for (const [k, v] of Object.entries(res.headers)) if (typeof v === "string") headers[k] = v;
      const chunks: Buffer[] = [];
      let size = 0;
      const end = () =>
        fail(
          errorForStatus(res.statusCode ?? 0, res.statusMessage ?? "", headers, Buffer.concat(chunks).subarray(0, MAX_BODY), {
            what: `tunnel: WebSocket ${path} answered ${JSON.stringify(statusLine)}`,
            sessionScoped: true,
            statusLine,
            fallback: "connection",
          }),
        );
      res.on("data", (c: Buffer) => {
        if (size < MAX_BODY) chunks.push(c);
        size += c.length;
      });
      res.once("end", end);
      res.once("error", end);
    });
    ws.on("error", (err: Error) => fail(new SandboxConnectionError(`tunnel: WebSocket ${path} failed: ${err.message}`, { cause: err })));
  });
}

function parseHead(text: string): { statusLine: string; status: number; reason: string; headers: Record<string, string> } {
  const lines = text.replace(/\r\n/g, "\n").split("\n");
  const statusLine = (lines[0] ?? "").trim();
  const m = /^(HTTP\/\S+) (\d{3})(?: (.*))?$/.exec(statusLine);
  if (!m) {
    throw notHTTP(new SandboxConnectionError(
      `tunnel: the gateway's answer to CONNECT is not HTTP: ${JSON.stringify(statusLine.slice(0, 200))}`,
      { statusLine: statusLine.slice(0, 200) },
    ));
  }
  const headers: Record<string, string> = {};
  for (const line of lines.slice(1)) {
    const i = line.indexOf(":");
    if (i > 0) headers[line.slice(0, i).trim().toLowerCase()] = line.slice(i + 1).trim();
  }
  return { statusLine, status: Number(m[2]), reason: m[3] ?? "", headers };
}

/** Marks a CONNECT error whose answer could not be read as HTTP (see connectRefused). */
function notHTTP(e: SandboxConnectionError): SandboxConnectionError {
  Object.defineProperty(e, "notHTTP", { value: true, enumerable: false });
  return e;
}
