"""Helpers shared by the REST client, the tunnel and the SSH client."""

from __future__ import annotations

import json
import os
import ssl
from types import TracebackType
from typing import Any, Dict, Mapping, Optional, Tuple, Type, Union
from urllib.parse import urlsplit

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
    SessionNotFoundError,
    ShellBusyError,
    UnauthorizedError,
    UnknownSecretError,
)

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
}

#: 404 codes that name something inside a session that exists (a file, a
#: shell, a process): never SessionNotFoundError.
_NOT_SESSION_404 = frozenset({"file_not_found", "shell_not_found", "process_not_found"})

#: 429 codes with a class of their own (a RateLimitError, as every 429).
_TYPED_429: Dict[str, Type[RateLimitError]] = {"shell_busy": ShellBusyError}


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
    else (``_NOT_SESSION_404``), 429 -> RateLimitError (or its subclass in
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
