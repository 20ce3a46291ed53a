// SessionSSH: ssh2 SSH and SFTP into a session, through the CONNECT tunnel.

import { createHash } from "node:crypto";
import { promises as fsp } from "node:fs";
import { constants as osConstants } from "node:os";
import { StringDecoder } from "node:string_decoder";

import { Client, type ClientChannel, type ConnectConfig, type SFTPWrapper } from "ssh2";

import { checkInt, checkTimeout } from "./common.js";
import {
  CommandTimeoutError,
  HostKeyMismatchError,
  SandboxAPIError,
  SandboxConnectionError,
  SandboxOperationError,
} from "./errors.js";
import { type TLSOptions, type Transport, type TunnelSocket, openTunnel } from "./tunnel.js";

/** Default bound on the output runCommand keeps of each stream (10 MiB), as the Python SDK. */
export const DEFAULT_MAX_OUTPUT_BYTES = 10 * 1024 * 1024;
/** How long a killed command's channel may take to close on the gateway's side. */
const KILL_WAIT_MS = 2000;
/** SFTP requests kept in flight by uploadFile / downloadFile, and their size. */
const SFTP_CONCURRENCY = 64;
const SFTP_CHUNK = 32 * 1024;

export interface SSHOptions extends TLSOptions {
  /** SSH username; any name maps to the sandbox user (default `sandbox`). */
  username?: string;
  /** The session's SSH password; default: the one the Session carries (only a create's answer has it). */
  password?: string;
  /** A private key whose public half was given as `sshPublicKey` at create. */
  privateKey?: string | Buffer;
  passphrase?: string;
  /** Host keys to pin (authorized_keys lines); default: the session's `sshInfo.hostKeys`. */
  hostKeys?: string[];
  /** Time allowed for the tunnel and for the SSH handshake and authentication, each (default 20000). */
  timeoutMs?: number;
  /** `"connect"` (default), `"websocket"` for front ends that do not pass CONNECT, or `"auto"`: CONNECT, then the WebSocket when something refuses it (see openTunnel). */
  transport?: Transport;
}

export interface SSHConnectOptions extends SSHOptions {
  baseUrl?: string;
  apiKey?: string;
  sessionId: string;
}

export interface RunOptions {
  /** How long the command may run (ms); past it the command is killed and CommandTimeoutError thrown. */
  timeoutMs?: number;
  /** Called with each chunk of stdout, decoded as UTF-8. */
  onStdout?: (text: string) => void;
  /** Called with each chunk of stderr, decoded as UTF-8. */
  onStderr?: (text: string) => void;
  /** How much of each stream the result keeps (default 10 MiB); the rest is dropped and `truncated` set. */
  maxOutputBytes?: number;
}

export interface CommandResult {
  /** The command's exit status; 128 + signal number when a signal ended it. */
  exitCode: number;
  /** The signal that ended the command (`KILL`, `TERM`...), if one did. */
  exitSignal?: string;
  stdout: string;
  stderr: string;
  /** True when a stream passed maxOutputBytes and was cut. */
  truncated: boolean;
}

/** One piece of a command's output, as `SessionSSH.stream` yields it. */
export interface OutputChunk {
  stream: "stdout" | "stderr";
  data: Buffer;
}

/** A parsed authorized_keys / known_hosts line: the key type and its wire blob. */
interface PinnedKey {
  type: string;
  blob: Buffer;
}

/**
 * Parses `TYPE BASE64 [comment]` or `HOSTPATTERN TYPE BASE64`; undefined when
 * the line holds no key (a blob must start with its own type name).
 */
export function parseHostKey(line: string): PinnedKey | undefined {
  const fields = line.trim().split(/\s+/);
  for (let i = 0; i < Math.min(2, fields.length - 1); i++) {
    const type = fields[i] ?? "";
    const data = fields[i + 1] ?? "";
    if (!/^[A-Za-z0-9+/]+={0,2}$/.test(data)) continue;
    const blob = Buffer.from(data, "base64");
    if (blobType(blob) === type) return { type, blob };
  }
  return undefined;
}

function blobType(blob: Buffer): string | undefined {
  if (blob.length < 4) return undefined;
  const n = blob.readUInt32BE(0);
  if (n === 0 || n > 64 || blob.length < 4 + n) return undefined;
  return blob.subarray(4, 4 + n).toString("latin1");
}

function keyLine(blob: Buffer): string {
  return `${blobType(blob) ?? "unknown"} ${blob.toString("base64")}`;
}

/** OpenSSH-style SHA256 fingerprint of a key blob. */
export function fingerprint(blob: Buffer): string {
  return "SHA256:" + createHash("sha256").update(blob).digest("base64").replace(/=+$/, "");
}

function exitCodeForSignal(name: string): number {
  const n = (osConstants.signals as Record<string, number>)["SIG" + name.toUpperCase().replace(/^SIG/, "")];
  return n ? 128 + n : 255;
}

/** Collects one stream: at most `max` bytes kept; the callback sees all of it. */
class Collector {
  readonly #chunks: Buffer[] = [];
  #kept = 0;
  truncated = false;
  readonly #decoder = new StringDecoder("utf8");

  constructor(
    private readonly max: number,
    private readonly callback?: (text: string) => void,
  ) {}

  feed(data: Buffer): void {
    const room = this.max - this.#kept;
    if (data.length <= room) {
      this.#chunks.push(data);
      this.#kept += data.length;
    } else {
      if (room > 0) this.#chunks.push(data.subarray(0, room));
      this.#kept = this.max;
      this.truncated = true;
    }
    if (this.callback) {
      const text = this.#decoder.write(data);
      if (text) this.callback(text);
    }
  }

  flush(): void {
    if (this.callback) {
      const text = this.#decoder.end();
      if (text) this.callback(text);
    }
  }

  text(): string {
    return new TextDecoder().decode(Buffer.concat(this.#chunks));
  }
}

/**
 * The output of a running command as an async iterator of chunks, and its
 * result. Created by {@link SessionSSH.stream}.
 */
export class CommandStream implements AsyncIterable<OutputChunk> {
  /** The command's result (stdout/stderr here hold only what maxOutputBytes kept). */
  readonly result: Promise<CommandResult>;
  readonly #queue: OutputChunk[] = [];
  #wake: (() => void) | null = null;
  #ended = false;
  #error: unknown = undefined;
  readonly #kill: () => void;

  /** @internal */
  constructor(start: (sink: (c: OutputChunk) => void) => { done: Promise<CommandResult>; kill: () => void }) {
    const { done, kill } = start((c) => {
      this.#queue.push(c);
      this.#notify();
    });
    this.#kill = kill;
    this.result = done;
    done.then(
      () => {
        this.#ended = true;
        this.#notify();
      },
      (e) => {
        this.#ended = true;
        this.#error = e;
        this.#notify();
      },
    );
  }

  #notify(): void {
    const w = this.#wake;
    this.#wake = null;
    w?.();
  }

  /** Kills the command (SSH `signal` KILL, then the channel is closed). */
  kill(): void {
    this.#kill();
  }

  async *[Symbol.asyncIterator](): AsyncIterator<OutputChunk> {
    for (;;) {
      const c = this.#queue.shift();
      if (c) {
        yield c;
        continue;
      }
      if (this.#ended) {
        if (this.#error !== undefined) throw this.#error;
        return;
      }
      await new Promise<void>((resolve) => {
        this.#wake = resolve;
      });
    }
  }
}

/**
 * An SSH connection (ssh2) to one session, through the gateway's CONNECT
 * tunnel, with host keys pinned from the REST API. Get one with
 * `session.ssh()` or `client.ssh(sessionId)`; `close()` when done.
 */
export class SessionSSH {
  /** The ssh2 Client, for anything this class does not offer (shells, PTYs...). */
  readonly client: Client;
  readonly sessionId: string;
  /** The host keys pinned for this connection (authorized_keys lines). */
  readonly pinnedHostKeys: string[];
  readonly #sock: TunnelSocket;
  #sftp: Promise<SFTPWrapper> | null = null;
  #closed = false;
  #lastError: Error | undefined;

  private constructor(client: Client, sock: TunnelSocket, sessionId: string, pinned: string[]) {
    this.client = client;
    this.#sock = sock;
    this.sessionId = sessionId;
    this.pinnedHostKeys = pinned;
    // An error after the handshake (connection reset...) must not crash the
    // process; it shows as failures of the calls that use the connection.
    client.on("error", (e: Error) => {
      this.#lastError = e;
    });
    client.on("close", () => {
      this.#closed = true;
    });
  }

  /**
   * Opens the tunnel, does the SSH handshake, checks the host key and
   * authenticates: with the password and/or private key when given, else
   * with SSH `none` (the gateway grants it: the tunnel carried the token).
   *
   * Throws HostKeyMismatchError when the server's key is not a pinned one
   * (never a prompt), SandboxOperationError when authentication is refused,
   * SandboxConnectionError for the rest, and the tunnel's errors.
   */
  static async connect(opts: SSHConnectOptions): Promise<SessionSSH> {
    const timeoutMs = checkTimeout("timeoutMs", opts.timeoutMs ?? 20_000);
    const username = opts.username ?? "sandbox";
    if (typeof username !== "string" || !username) throw new TypeError("username must be a non-empty string");
    const pinned: PinnedKey[] = [];
    for (const line of opts.hostKeys ?? []) {
      const k = parseHostKey(line);
      if (k) pinned.push(k);
    }
    if ((opts.hostKeys ?? []).length > 0 && pinned.length === 0) {
      throw new TypeError("hostKeys holds no parsable key (authorized_keys lines: TYPE BASE64)");
    }
    const pinnedLines = pinned.map((k) => `${k.type} ${k.blob.toString("base64")}`);

    const sock = await openTunnel({
      baseUrl: opts.baseUrl,
      apiKey: opts.apiKey,
      sessionId: opts.sessionId,
      timeoutMs,
      ca: opts.ca,
      rejectUnauthorized: opts.rejectUnauthorized,
      servername: opts.servername,
      transport: opts.transport,
    });
    const client = new Client();
    let presented: Buffer | undefined;
    let mismatch = false;
    const auth: string[] = [];
    if (opts.privateKey !== undefined) auth.push("publickey");
    if (opts.password !== undefined) auth.push("password");
    if (auth.length === 0) auth.push("none");

    const config: ConnectConfig = {
      sock,
      username,
      readyTimeout: timeoutMs,
      keepaliveInterval: 0,
      authHandler: auth as ConnectConfig["authHandler"],
      hostVerifier: (key: Buffer) => {
        presented = Buffer.from(key);
        // No pinned keys at all (a gateway whose API lists none): accept, as the Python SDK.
        if (pinned.length === 0) return true;
        const ok = pinned.some((k) => k.blob.equals(key));
        if (!ok) mismatch = true;
        return ok;
      },
    };
    if (opts.password !== undefined) config.password = opts.password;
    if (opts.privateKey !== undefined) config.privateKey = opts.privateKey;
    if (opts.passphrase !== undefined) config.passphrase = opts.passphrase;

    await new Promise<void>((resolve, reject) => {
      let settled = false;
      const fail = (e: SandboxAPIError) => {
        if (settled) return;
        settled = true;
        client.removeListener("ready", onReady);
        client.on("error", () => {});
        client.end();
        sock.destroy();
        reject(e);
      };
      const onReady = () => {
        if (settled) return;
        settled = true;
        client.removeListener("error", onError);
        client.removeListener("close", onClose);
        resolve();
      };
      const onError = (err: Error & { level?: string }) => {
        if (mismatch && presented) {
          fail(
            new HostKeyMismatchError(
              `SSH host key mismatch for session ${opts.sessionId}: server presented ${blobType(presented) ?? "a key"} ` +
                `${fingerprint(presented)}, which is not one of the ${pinnedLines.length} pinned key(s)`,
              keyLine(presented),
              pinnedLines,
            ),
          );
          return;
        }
        if (err.level === "client-authentication") {
          fail(
            new SandboxOperationError(`SSH authentication (${auth.join("/")}) refused for session ${opts.sessionId}: ${err.message}`, {
              cause: err,
            }),
          );
          return;
        }
        if (err.level === "client-timeout") {
          fail(new SandboxConnectionError(`SSH handshake with session ${opts.sessionId} timed out after ${timeoutMs} ms`, { cause: err }));
          return;
        }
        fail(new SandboxConnectionError(`SSH handshake with session ${opts.sessionId} failed: ${err.message}`, { cause: err }));
      };
      const onClose = () => onError(new Error("the connection closed during the SSH handshake"));
      client.once("ready", onReady);
      client.on("error", onError);
      client.once("close", onClose);
      try {
        client.connect(config);
      } catch (e) {
        fail(new SandboxConnectionError(`SSH connect to session ${opts.sessionId} failed: ${(e as Error).message}`, { cause: e }));
      }
    });
    return new SessionSSH(client, sock, opts.sessionId, pinnedLines);
  }

  /** True until the connection closes. */
  get connected(): boolean {
    return !this.#closed;
  }

  #requireOpen(): void {
    if (this.#closed) {
      const why = this.#lastError ? `: ${this.#lastError.message}` : "";
      throw new SandboxOperationError(`the SSH connection to session ${this.sessionId} is closed${why}`);
    }
  }

  /**
   * Runs `command` (through the sandbox user's shell) and waits for it. Its
   * stdin is closed at once. A non-zero exit code is not an error; a signal
   * gives 128 + its number and `exitSignal`. Past `timeoutMs` the command is
   * sent SIGKILL (SSH `signal` request) and its channel closed, upon which
   * the gateway kills its whole process group, and CommandTimeoutError is
   * thrown with the output so far. The connection stays usable.
   */
  runCommand(command: string, opts: RunOptions = {}): Promise<CommandResult> {
    return this.#exec(command, opts).done;
  }

  /**
   * Runs `command` and yields its output as it arrives:
   *
   * ```ts
   * const cmd = ssh.stream("make test");
   * for await (const { stream, data } of cmd) process[stream].write(data);
   * const { exitCode } = await cmd.result;
   * ```
   */
  stream(command: string, opts: Omit<RunOptions, "onStdout" | "onStderr"> = {}): CommandStream {
    return new CommandStream((sink) => this.#exec(command, opts, sink));
  }

  #exec(
    command: string,
    opts: RunOptions,
    sink?: (c: OutputChunk) => void,
  ): { done: Promise<CommandResult>; kill: () => void } {
    let limit: number | undefined;
    let max: number;
    try {
      if (typeof command !== "string") throw new TypeError("command must be a string");
      limit = opts.timeoutMs === undefined ? undefined : checkTimeout("timeoutMs", opts.timeoutMs);
      max = checkInt("maxOutputBytes", opts.maxOutputBytes ?? DEFAULT_MAX_OUTPUT_BYTES, 0);
      this.#requireOpen();
    } catch (e) {
      // Errors, argument errors included, arrive as a rejected promise.
      return { done: Promise.reject(e), kill: () => {} };
    }
    const out = new Collector(max, opts.onStdout);
    const err = new Collector(max, opts.onStderr);
    let channel: ClientChannel | undefined;
    let killRequested = false;
    const killChannel = (ch: ClientChannel) => {
      try {
        ch.signal("KILL");
      } catch {
        // the channel may be gone already
      }
      try {
        ch.close();
      } catch {
        // idem
      }
    };
    const done = new Promise<CommandResult>((resolve, reject) => {
      let exitCode: number | undefined;
      let exitSignal: string | undefined;
      let timedOut = false;
      let timer: NodeJS.Timeout | undefined;
      let settled = false;
      const settle = (fn: () => void) => {
        if (settled) return;
        settled = true;
        if (timer) clearTimeout(timer);
        fn();
      };
      const onTimeout = () => {
        if (!channel) return;
        timedOut = true;
        const ch = channel;
        killChannel(ch);
        // Wait (briefly) for the gateway to close the channel, then give up waiting.
        const grace = setTimeout(() => finish(), KILL_WAIT_MS);
        ch.once("close", () => clearTimeout(grace));
      };
      const finish = () =>
        settle(() => {
          out.flush();
          err.flush();
          const truncated = out.truncated || err.truncated;
          if (timedOut) {
            reject(
              new CommandTimeoutError(`command did not finish within ${limit} ms and was killed: ${JSON.stringify(command.slice(0, 200))}`, {
                command,
                timeoutMs: limit ?? 0,
                stdout: out.text(),
                stderr: err.text(),
                truncated,
              }),
            );
            return;
          }
          if (exitSignal !== undefined) {
            resolve({ exitCode: exitCodeForSignal(exitSignal), exitSignal, stdout: out.text(), stderr: err.text(), truncated });
            return;
          }
          if (exitCode === undefined) {
            reject(
              new SandboxOperationError(
                killRequested
                  ? `the command was killed before it reported an exit status: ${JSON.stringify(command.slice(0, 200))}`
                  : `the SSH connection to session ${this.sessionId} broke while the command ran (was the session deleted?)`,
              ),
            );
            return;
          }
          resolve({ exitCode, stdout: out.text(), stderr: err.text(), truncated });
        });

      try {
        this.client.exec(command, (e, ch) => {
          if (e) {
            settle(() => reject(new SandboxOperationError(`the server refused to run the command: ${e.message}`, { cause: e })));
            return;
          }
          channel = ch;
          if (settled || killRequested) {
            killChannel(ch);
            return;
          }
          ch.on("data", (d: Buffer) => {
            out.feed(d);
            sink?.({ stream: "stdout", data: d });
          });
          ch.stderr.on("data", (d: Buffer) => {
            err.feed(d);
            sink?.({ stream: "stderr", data: d });
          });
          ch.on("exit", (code: number | null, signal?: string) => {
            if (typeof code === "number") exitCode = code;
            else if (signal) exitSignal = String(signal).replace(/^SIG/, "");
          });
          ch.on("close", () => finish());
          ch.end(); // stdin: EOF at once
        });
      } catch (e) {
        settle(() => reject(new SandboxOperationError(`cannot open an SSH channel in session ${this.sessionId}: ${(e as Error).message}`, { cause: e })));
        return;
      }
      if (limit !== undefined) timer = setTimeout(onTimeout, limit);
    });
    const kill = () => {
      killRequested = true;
      if (channel) killChannel(channel);
    };
    return { done, kill };
  }

  /** The connection's SFTP client (ssh2's SFTPWrapper), opened on first use and closed by close(). */
  sftp(): Promise<SFTPWrapper> {
    try {
      this.#requireOpen();
    } catch (e) {
      return Promise.reject(e);
    }
    if (!this.#sftp) {
      this.#sftp = new Promise<SFTPWrapper>((resolve, reject) => {
        this.client.sftp((e, sftp) => {
          if (e) {
            this.#sftp = null;
            reject(new SandboxOperationError(`cannot start SFTP in session ${this.sessionId}: ${e.message}`, { cause: e }));
            return;
          }
          sftp.on("close", () => {
            this.#sftp = null;
          });
          resolve(sftp);
        });
      });
    }
    return this.#sftp;
  }

  /**
   * Uploads the local file `localPath` to `remotePath` in the sandbox
   * (relative paths: the workspace) with pipelined SFTP writes (fastPut),
   * then checks the remote size.
   */
  async uploadFile(localPath: string, remotePath: string): Promise<void> {
    const sftp = await this.sftp();
    try {
      const st = await fsp.stat(localPath);
      await new Promise<void>((resolve, reject) =>
        sftp.fastPut(localPath, remotePath, { concurrency: SFTP_CONCURRENCY, chunkSize: SFTP_CHUNK }, (e) => (e ? reject(e) : resolve())),
      );
      const size = await new Promise<number>((resolve, reject) =>
        sftp.stat(remotePath, (e, s) => (e ? reject(e) : resolve(s.size))),
      );
      if (size !== st.size) throw new Error(`size mismatch: ${st.size} bytes sent, ${size} arrived`);
    } catch (e) {
      throw new SandboxOperationError(
        `upload ${JSON.stringify(localPath)} -> ${JSON.stringify(remotePath)} failed: ${(e as Error).message}`,
        { cause: e },
      );
    }
  }

  /**
   * Downloads `remotePath` from the sandbox to the local file `localPath`
   * with pipelined SFTP reads (fastGet), then checks the size. A failed
   * download removes the local file it created.
   */
  async downloadFile(remotePath: string, localPath: string): Promise<void> {
    const sftp = await this.sftp();
    const existed = await fsp
      .access(localPath)
      .then(() => true)
      .catch(() => false);
    try {
      const size = await new Promise<number>((resolve, reject) =>
        sftp.stat(remotePath, (e, s) => (e ? reject(e) : resolve(s.size))),
      );
      await new Promise<void>((resolve, reject) =>
        sftp.fastGet(remotePath, localPath, { concurrency: SFTP_CONCURRENCY, chunkSize: SFTP_CHUNK }, (e) => (e ? reject(e) : resolve())),
      );
      const st = await fsp.stat(localPath);
      if (st.size !== size) throw new Error(`size mismatch: remote ${size} bytes, ${st.size} arrived`);
    } catch (e) {
      if (!existed) await fsp.rm(localPath, { force: true }).catch(() => {});
      throw new SandboxOperationError(
        `download ${JSON.stringify(remotePath)} -> ${JSON.stringify(localPath)} failed: ${(e as Error).message}`,
        { cause: e },
      );
    }
  }

  /** Closes SFTP, then SSH, then the tunnel; resolves once the socket is closed. Safe to call twice. */
  async close(): Promise<void> {
    const sftp = this.#sftp;
    this.#sftp = null;
    if (sftp) {
      try {
        (await sftp).end();
      } catch {
        // already gone
      }
    }
    if (this.#sock.destroyed) {
      this.#closed = true;
      return;
    }
    await new Promise<void>((resolve) => {
      const t = setTimeout(() => {
        this.#sock.destroy();
        resolve();
      }, 2000);
      this.#sock.once("close", () => {
        clearTimeout(t);
        resolve();
      });
      this.client.end();
    });
    this.#closed = true;
  }
}
