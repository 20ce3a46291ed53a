// @sandgate/sdk: sandgate sessions over REST, the CONNECT tunnel, and SSH/SFTP (ssh2).

export {
  SandboxClient,
  Session,
  MIN_TTL,
  MAX_TTL,
  type SandboxClientOptions,
  type CreateSessionOptions,
  type ExecOptions,
  type ExecResult,
  type ReadOptions,
  type SessionList,
  type SSHAccess,
  type Resources,
  type Egress,
  type SecretRef,
} from "./client.js";
export {
  SessionSSH,
  CommandStream,
  DEFAULT_MAX_OUTPUT_BYTES,
  parseHostKey,
  fingerprint,
  type SSHOptions,
  type SSHConnectOptions,
  type RunOptions,
  type CommandResult,
  type OutputChunk,
} from "./ssh.js";
export { openTunnel, connectPath, DEFAULT_CONNECT_PATH, type TunnelOptions, type TLSOptions, type TunnelSocket } from "./tunnel.js";
export {
  SandboxAPIError,
  SandboxConnectionError,
  HostKeyMismatchError,
  UnauthorizedError,
  SessionNotFoundError,
  SessionGoneError,
  RateLimitError,
  SandboxOperationError,
  CommandTimeoutError,
  ResourcesExceededError,
  InvalidResourcesError,
  InvalidEgressError,
  EgressNotAllowedError,
  UnknownSecretError,
  InvalidSecretError,
  type ErrorDetails,
} from "./errors.js";
export { ENV_API_URL, ENV_API_TOKEN, SDK_VERSION } from "./common.js";
