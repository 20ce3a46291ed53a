"""Helpers shared by the REST client, the tunnel and the SSH client."""

from __future__ import annotations

import json
import os
import ssl
from types import TracebackType
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Type, Union
from urllib.parse import quote, urlsplit

from .errors import (
    DiskFullError,
    EgressNotAllowedError,
    FileNotFoundInSandboxError,
    FileTooLargeError,
    InvalidEgressError,
    InvalidResourcesError,
    InvalidSecretError,
    ProcessExitedError,
    ProcessNotFoundError,
    RateLimitError,
    ResourcesExceededError,
    SandboxAPIError,
    SandboxOperationError,
    SandboxPermissionError,
    SessionGoneError,
    SessionNotFoundError,
    ShellBusyError,
    SnapshotNotFoundError,
    UnauthorizedError,
    UnknownSecretError,
    WorkspaceBusyError,
    WorkspaceExistsError,
    WorkspaceNotFoundError,
    WorkspacesUnavailableError,
)
from .models import Session

ENV_API_URL = "SANDBOX_API_URL"
ENV_API_TOKEN = "SANDBOX_API_TOKEN"

#: What ``verify_ssl`` accepts: a bool, or the path of a CA bundle (like requests' ``verify``).
VerifySSL = Union[bool, str]

# Bound on how much of an error body is kept in exceptions.
_MAX_ERROR_BODY = 4096

#: REST 400 error codes with a class of their own (all SandboxOperationError).
_TYPED_400: Dict[str, Type[SandboxOperationError]] = {
    "resources_exceeded": ResourcesExceededError,
    "invalid_resources": InvalidResourcesError,
    "invalid_egress": InvalidEgressError,
    "egress_not_allowed": EgressNotAllowedError,
    "unknown_secret": UnknownSecretError,
    "invalid_secret": InvalidSecretError,
}

#: Data plane error codes with a class of their own (all SandboxOperationError),
#: whatever the status (404, 403, 409, 413, 507).
_TYPED_CODES: Dict[str, Type[SandboxOperationError]] = {
    "file_not_found": FileNotFoundInSandboxError,
    "permission_denied": SandboxPermissionError,
    "file_too_large": FileTooLargeError,
    "disk_full": DiskFullError,
    "process_not_found": ProcessNotFoundError,
    "process_exited": ProcessExitedError,
    "workspace_not_found": WorkspaceNotFoundError,
    "workspace_exists": WorkspaceExistsError,
    "workspace_busy": WorkspaceBusyError,
    "snapshot_not_found": SnapshotNotFoundError,
    "workspaces_unavailable": WorkspacesUnavailableError,
}

#: 404 codes that name something inside a session that exists (a file, a
#: shell, a process): never SessionNotFoundError.
_NOT_SESSION_404 = frozenset(
    {"file_not_found", "shell_not_found", "process_not_found", "workspace_not_found", "snapshot_not_found", "pending_not_found"}
)

#: 429 codes with a class of their own (a RateLimitError, as every 429).
_TYPED_429: Dict[str, Type[RateLimitError]] = {"shell_busy": ShellBusyError}


# -- REST: argument checks, request bodies, answers (shared by SessionsClient and
# AsyncSessionsClient) ---------------------------------------------------------

MIN_TTL = 60
MAX_TTL = 28800

#: Pauses before create_session's retries (so two retries at most).
CREATE_RETRY_DELAYS: Tuple[float, ...] = (0.5, 1.0)
#: Answers after which a create is retried (with the same Idempotency-Key).
CREATE_RETRY_STATUSES = frozenset({500, 502, 503, 504})
#: Error codes among those answers that a retry would not change: a pull
#: that ran past the gateway's deadline, an image store that is full.
CREATE_NO_RETRY_CODES = frozenset({"image_pull_timeout", "image_store_full"})

#: The gateway's command timeout when a request gives none.
DEFAULT_COMMAND_TIMEOUT = 60.0


def check_idempotency_key(key: Any) -> str:
    if not isinstance(key, str):
        raise TypeError(f"idempotency_key must be a string, got {type(key).__name__}")
    if not 1 <= len(key) <= 255 or not all("!" <= c <= "~" for c in key):
        raise ValueError("idempotency_key must be 1 to 255 printable ASCII characters without spaces")
    return key


_RESOURCE_KEYS = {"memoryMiB": int, "cpus": float, "pids": int, "diskMiB": int}


def check_resources(resources: Any) -> Dict[str, Any]:
    """Check create_session's resources locally: known keys, numbers > 0."""
    if not isinstance(resources, Mapping):
        raise TypeError("resources must be a dict")
    out: Dict[str, Any] = {}
    for key, value in resources.items():
        kind = _RESOURCE_KEYS.get(key)
        if kind is None:
            raise ValueError(f"unknown resource {key!r}; known: {', '.join(_RESOURCE_KEYS)}")
        if value is None:
            continue
        ok = isinstance(value, (int, float)) if kind is float else isinstance(value, int)
        if not ok or isinstance(value, bool):
            raise TypeError(f"resources[{key!r}] must be {'a number' if kind is float else 'an int'}")
        if value <= 0:
            raise ValueError(f"resources[{key!r}] must be positive")
        out[key] = value
    return out


def check_hosts(name: str, value: Any) -> List[str]:
    """Check a list of egress entries (or a secret's hosts) locally: a
    sequence of non-empty strings, not a bare string. The gateway parses them."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{name} must be a list of strings (e.g. ['pypi.org']), got {type(value).__name__}")
    out: List[str] = []
    for i, entry in enumerate(value):
        if not isinstance(entry, str):
            raise TypeError(f"{name}[{i}] must be a string, got {type(entry).__name__}")
        if not entry.strip():
            raise ValueError(f"{name}[{i}] must be a non-empty string")
        out.append(entry)
    return out


_SECRET_KEYS = ("name", "hosts", "header", "format")


def check_secrets(secrets: Any) -> List[Any]:
    """Check create_session's secrets locally: names, or dicts with a name
    and optional hosts/header/format. The gateway checks the rest."""
    if isinstance(secrets, (str, bytes)) or not isinstance(secrets, Sequence):
        raise TypeError(f"secrets must be a list of names or dicts, got {type(secrets).__name__}")
    out: List[Any] = []
    for i, ref in enumerate(secrets):
        if isinstance(ref, str):
            if not ref:
                raise ValueError(f"secrets[{i}] must be a non-empty name")
            out.append(ref)
            continue
        if not isinstance(ref, Mapping):
            raise TypeError(f"secrets[{i}] must be a name or a dict, got {type(ref).__name__}")
        unknown = [k for k in ref if k not in _SECRET_KEYS]
        if unknown:
            raise ValueError(f"secrets[{i}]: unknown key {unknown[0]!r}; known: {', '.join(_SECRET_KEYS)}")
        item: Dict[str, Any] = {}
        for key in _SECRET_KEYS:
            value = ref.get(key)
            if value is None:
                continue
            if key == "hosts":
                item[key] = check_hosts(f"secrets[{i}]['hosts']", value)
                continue
            if not isinstance(value, str):
                raise TypeError(f"secrets[{i}][{key!r}] must be a string, got {type(value).__name__}")
            if not value:
                raise ValueError(f"secrets[{i}][{key!r}] must be a non-empty string")
            item[key] = value
        if "name" not in item:
            raise ValueError(f"secrets[{i}] needs a 'name'")
        out.append(item)
    return out


def create_session_body(
    ttl: Any,
    image: Any,
    metadata: Any,
    ssh_public_key: Any,
    resources: Any,
    labels: Any,
    egress: Any,
    secrets: Any,
    workspace: Any = None,
    from_snapshot: Any = None,
    name: Any = None,
    egress_mode: Any = None,
) -> Dict[str, Any]:
    """The JSON body of ``POST /v1/sessions``, checked locally."""
    from ._egress import check_egress, check_egress_mode

    body: Dict[str, Any] = {"ttl": check_int("ttl", ttl, MIN_TTL, MAX_TTL)}
    if name is not None:
        if not isinstance(name, str) or not name:
            raise ValueError("name must be a non-empty string")
        body["name"] = name
    if image is not None:
        if not isinstance(image, str) or not image:
            raise ValueError("image must be a non-empty string")
        body["image"] = image
    if metadata is not None and labels is not None:
        raise ValueError("give metadata or labels, not both: labels is another name for metadata")
    for name, value in (("metadata", metadata), ("labels", labels)):
        if value is not None:
            if not isinstance(value, Mapping):
                raise TypeError(f"{name} must be a dict")
            body[name] = dict(value)
    if resources is not None:
        body["resources"] = check_resources(resources)
    if egress is not None:
        body["egress"] = check_egress("egress", egress)
    if egress_mode is not None:
        body["egressMode"] = check_egress_mode(egress_mode)
    if secrets is not None:
        body["secrets"] = check_secrets(secrets)
    if ssh_public_key is not None:
        if not isinstance(ssh_public_key, str) or not ssh_public_key.strip():
            raise ValueError("ssh_public_key must be an authorized_keys line")
        body["sshPublicKey"] = ssh_public_key.strip()
    if workspace is not None and from_snapshot is not None:
        raise ValueError("give workspace or from_snapshot, not both")
    for name, key, value in (("workspace", "workspace", workspace), ("from_snapshot", "fromSnapshot", from_snapshot)):
        if value is not None:
            if not isinstance(value, str) or not value:
                raise ValueError(f"{name} must be a non-empty string")
            body[key] = value
    return body


def update_session_body(ttl: Any, egress: Any) -> Dict[str, Any]:
    """The JSON body of ``PATCH /v1/sessions/{id}``, checked locally."""
    body: Dict[str, Any] = {}
    if ttl is not None:
        body["ttl"] = check_int("ttl", ttl, MIN_TTL, MAX_TTL)
    if egress is not None:
        from ._egress import check_egress

        body["egress"] = check_egress("egress", egress)
    return body


def session_path(session_id: Any) -> str:
    """``/sessions/{id}``, the id URL-escaped; ValueError for an empty or non-str id."""
    if not isinstance(session_id, str) or not session_id:
        raise ValueError("session_id must be a non-empty string")
    return "/sessions/" + quote(session_id, safe="")


def process_path(session_id: Any, process_id: Any) -> str:
    """``/sessions/{id}/processes/{pid}``."""
    if not isinstance(process_id, str) or not process_id:
        raise ValueError("process_id must be a non-empty string")
    return session_path(session_id) + "/processes/" + quote(process_id, safe="")


def parse_session(data: Any, what: str) -> Session:
    """A Session from the API's JSON; SandboxOperationError when it is not one."""
    try:
        return Session.from_dict(data)
    except ValueError as e:
        raise SandboxOperationError(f"{what}: unexpected answer: {e}", body=str(data)[:4096]) from None


def is_replayed(headers: Mapping[str, str]) -> bool:
    """True when a create's answer is a replay of an earlier one (``Idempotent-Replayed: true``)."""
    return str(headers.get("Idempotent-Replayed", "")).strip().lower() == "true"


def session_page(data: Mapping[str, Any], limit: int, offset: int) -> Dict[str, Any]:
    """list_sessions' result from the API's answer."""
    items = data.get("sessions")
    if not isinstance(items, list):
        raise SandboxOperationError("list sessions: answer has no 'sessions' list", body=str(data)[:4096])
    return {
        "sessions": [parse_session(item, "list sessions") for item in items],
        "total": data.get("total", len(items)),
        "limit": data.get("limit", limit),
        "offset": data.get("offset", offset),
    }


def answer_list(data: Mapping[str, Any], key: str, what: str) -> List[Dict[str, Any]]:
    """The list of objects under *key* of an answer (``commands``, ``processes``...)."""
    items = data.get(key)
    if not isinstance(items, list):
        raise SandboxOperationError(f"{what}: answer has no {key!r} list", body=str(data)[:4096])
    return [dict(item) for item in items if isinstance(item, Mapping)]


def json_answer(status: int, content: bytes, headers: Mapping[str, str], what: str) -> Dict[str, Any]:
    """The JSON object of a successful answer ({} for an empty one or a 204)."""
    if status == 204 or not content:
        return {}
    try:
        data = json.loads(content)
    except (ValueError, UnicodeDecodeError):
        raise SandboxOperationError(
            f"{what}: HTTP {status} answer is not JSON",
            status_code=status,
            body=content[:4096].decode("utf-8", "replace"),
            headers=headers,
        ) from None
    if not isinstance(data, dict):
        raise SandboxOperationError(
            f"{what}: HTTP {status} answer is not a JSON object",
            status_code=status,
            body=content[:4096].decode("utf-8", "replace"),
        )
    return data


class ClosesOnExit:
    """Base of the SDK's context managers: ``__exit__`` calls ``close()``.

    Each subclass has its own ``__enter__`` (the REST client returns itself,
    the SSH client connects first, the tunnel returns its socket).
    """

    def close(self) -> None:  # pragma: no cover - every subclass overrides it
        raise NotImplementedError

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()


def resolve_settings(api_url: Optional[str], bearer_token: Optional[str]) -> Tuple[str, str]:
    """Return (api_url, bearer_token), taking omitted ones from the environment.

    Raises ValueError when either is still missing, or when api_url is not an
    http(s) URL.
    """
    url = api_url if api_url else os.environ.get(ENV_API_URL, "")
    token = bearer_token if bearer_token else os.environ.get(ENV_API_TOKEN, "")
    if not url:
        raise ValueError(f"api_url is required (pass it or set {ENV_API_URL})")
    if not token:
        raise ValueError(f"bearer_token is required (pass it or set {ENV_API_TOKEN})")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"api_url must be an http:// or https:// URL, got {url!r}")
    if parts.query or parts.fragment:
        raise ValueError("api_url must not carry a query or fragment")
    return url.rstrip("/"), token


def rest_base(api_url: str) -> str:
    """The REST base URL: api_url itself when its path ends in /v1, else api_url + '/v1'."""
    url = api_url.rstrip("/")
    if urlsplit(url).path.rstrip("/").endswith("/v1"):
        return url
    return url + "/v1"


def check_int(name: str, value: Any, lo: Optional[int] = None, hi: Optional[int] = None) -> int:
    """Return value if it is an int within [lo, hi]; raise TypeError/ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        if hi is None:
            raise ValueError(f"{name} must be >= {lo}, got {value}")
        raise ValueError(f"{name} must be between {lo} and {hi}, got {value}")
    return int(value)


def check_timeout(name: str, value: Any, allow_none: bool = True) -> Optional[float]:
    """Return value as a positive float (or None when allowed)."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds")
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    return float(value)


def ssl_context(verify_ssl: VerifySSL) -> ssl.SSLContext:
    """An SSL context that verifies like requests does for the same ``verify`` value.

    ``True`` trusts ``REQUESTS_CA_BUNDLE`` / ``CURL_CA_BUNDLE`` when set, else
    certifi's bundle (what requests uses), else the system store; a string
    is a CA bundle file or directory; ``False`` verifies nothing.
    """
    if verify_ssl is False:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    if isinstance(verify_ssl, str):
        if os.path.isdir(verify_ssl):
            return ssl.create_default_context(capath=verify_ssl)
        return ssl.create_default_context(cafile=verify_ssl)
    bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
    if not bundle:
        try:
            import certifi  # requests depends on it

            bundle = certifi.where()
        except ImportError:  # pragma: no cover - requests always brings certifi
            bundle = None
    if bundle and os.path.isdir(bundle):
        return ssl.create_default_context(capath=bundle)
    return ssl.create_default_context(cafile=bundle)


def _int_header(headers: Mapping[str, str], name: str) -> Optional[int]:
    try:
        return int(str(headers.get(name, "")).strip())
    except ValueError:
        return None


def _float_header(headers: Mapping[str, str], name: str) -> Optional[float]:
    try:
        return float(str(headers.get(name, "")).strip())
    except ValueError:
        return None


def parse_error_body(body: bytes, content_type: str = "") -> Tuple[Optional[str], Optional[str], str]:
    """Return (code, message, text) from an error body, JSON envelope or not."""
    text = body[:_MAX_ERROR_BODY].decode("utf-8", errors="replace")
    code: Optional[str] = None
    message: Optional[str] = None
    try:
        data = json.loads(body.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        data = None
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict):
            c, m = err.get("code"), err.get("message")
            code = c if isinstance(c, str) else None
            message = m if isinstance(m, str) else None
        elif isinstance(err, str):
            message = err
        elif isinstance(data.get("message"), str):
            message = data["message"]
    if message is None:
        stripped = " ".join(text.split())
        if stripped and "<" not in stripped[:1]:
            message = stripped[:200]
    return code, message, text


def error_for_status(
    status: int,
    reason: str,
    headers: Mapping[str, str],
    body: bytes,
    *,
    what: str,
    session_scoped: bool,
    status_line: Optional[str] = None,
    fallback: Type[SandboxAPIError] = SandboxOperationError,
) -> SandboxAPIError:
    """Build the exception for an HTTP error answer.

    401 -> UnauthorizedError, 404 -> SessionNotFoundError when the request
    named a session (*session_scoped*) and the code does not name something
    else (``_NOT_SESSION_404``), 410 ``session_gone`` -> SessionGoneError, 429 -> RateLimitError (or its subclass in
    ``_TYPED_429``), a REST 400 whose code is in ``_TYPED_400`` or a REST
    answer whose code is in ``_TYPED_CODES`` -> that class, anything else ->
    *fallback* (SandboxOperationError for REST, SandboxConnectionError for
    CONNECT).
    """
    code, message, text = parse_error_body(body, headers.get("Content-Type", ""))
    detail = message or reason or "no details"
    msg = f"{what}: HTTP {status}"
    if code:
        msg += f" {code}"
    msg += f": {detail}"
    kwargs: Dict[str, Any] = dict(status_code=status, code=code, status_line=status_line, body=text, headers=headers)
    if status == 401:
        return UnauthorizedError(msg, **kwargs)
    if status == 404 and session_scoped and code not in _NOT_SESSION_404:
        return SessionNotFoundError(msg, **kwargs)
    if status == 410 and code == "session_gone":
        return SessionGoneError(msg, **kwargs)
    if status == 429:
        return _TYPED_429.get(code or "", RateLimitError)(
            msg,
            limit=_int_header(headers, "X-RateLimit-Limit"),
            remaining=_int_header(headers, "X-RateLimit-Remaining"),
            reset=_int_header(headers, "X-RateLimit-Reset"),
            retry_after=_float_header(headers, "Retry-After"),
            **kwargs,
        )
    if status == 400 and fallback is SandboxOperationError:
        typed = _TYPED_400.get(code or "")
        if typed is not None:
            return typed(msg, **kwargs)
    if fallback is SandboxOperationError:
        typed = _TYPED_CODES.get(code or "")
        if typed is not None:
            return typed(msg, **kwargs)
    return fallback(msg, **kwargs)


class CaseInsensitiveHeaders(Dict[str, str]):
    """A minimal case-insensitive header mapping for CONNECT answers."""

    def __init__(self) -> None:
        super().__init__()
        self._lower: Dict[str, str] = {}

    def __setitem__(self, key: str, value: str) -> None:
        super().__setitem__(key, value)
        self._lower[key.lower()] = value

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override,unused-ignore]
        return self._lower.get(key.lower(), default)

    def __getitem__(self, key: str) -> str:
        return self._lower[key.lower()]

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key.lower() in self._lower
