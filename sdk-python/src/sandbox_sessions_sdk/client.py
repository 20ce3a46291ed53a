"""SessionsClient: the REST API (``/v1/sessions``)."""

from __future__ import annotations

import time
import uuid
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple
from urllib.parse import quote

import requests

from ._common import (
    ClosesOnExit,
    VerifySSL,
    check_int,
    check_timeout,
    error_for_status,
    resolve_settings,
    rest_base,
)
from ._version import __version__
from .errors import SandboxAPIError, SandboxConnectionError, SandboxOperationError
from .models import Session

__all__ = ["SessionsClient"]

MIN_TTL = 60
MAX_TTL = 28800

#: Pauses before create_session's retries (so two retries at most).
_CREATE_RETRY_DELAYS: Tuple[float, ...] = (0.5, 1.0)
#: Answers after which a create is retried (with the same Idempotency-Key).
_CREATE_RETRY_STATUSES = frozenset({500, 502, 503, 504})


def _check_idempotency_key(key: Any) -> str:
    if not isinstance(key, str):
        raise TypeError(f"idempotency_key must be a string, got {type(key).__name__}")
    if not 1 <= len(key) <= 255 or not all("!" <= c <= "~" for c in key):
        raise ValueError("idempotency_key must be 1 to 255 printable ASCII characters without spaces")
    return key


_RESOURCE_KEYS = {"memoryMiB": int, "cpus": float, "pids": int, "diskMiB": int}


def _check_resources(resources: Any) -> Dict[str, Any]:
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


def _check_hosts(name: str, value: Any) -> List[str]:
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


def _check_secrets(secrets: Any) -> List[Any]:
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
                item[key] = _check_hosts(f"secrets[{i}]['hosts']", value)
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


def _create_retryable(e: SandboxAPIError) -> bool:
    """A failed create worth sending again: the outcome is unknown or the failure transient."""
    if isinstance(e, SandboxConnectionError):
        return not isinstance(e.__cause__, requests.exceptions.SSLError)
    return e.status_code in _CREATE_RETRY_STATUSES


class SessionsClient(ClosesOnExit):
    """Client of the sandgate REST API. Use it as a context manager::

        with SessionsClient(api_url="https://gw.example.com", bearer_token=TOKEN) as sessions:
            session = sessions.create_session(ttl=600, metadata={"project": "demo"})

    Args:
        api_url: The gateway's base URL, e.g. ``https://gw.example.com`` or
            ``https://gw.example.com/v1``; REST calls go to ``<base>/v1/sessions``
            (``/v1`` is not doubled). Defaults to ``$SANDBOX_API_URL``.
        bearer_token: The API key or JWT. Defaults to ``$SANDBOX_API_TOKEN``.
        timeout: Seconds to wait for the gateway (connect and each read).
        verify_ssl: Verify the server's TLS certificate: ``True``, ``False``,
            or the path of a CA bundle, exactly like requests' ``verify``.

    Raises:
        ValueError: when api_url or bearer_token is missing or malformed.
    """

    def __init__(
        self,
        api_url: Optional[str] = None,
        bearer_token: Optional[str] = None,
        timeout: float = 30,
        verify_ssl: VerifySSL = True,
    ) -> None:
        self.api_url, self._token = resolve_settings(api_url, bearer_token)
        self.timeout: Optional[float] = check_timeout("timeout", timeout)
        self.verify_ssl: VerifySSL = verify_ssl
        self._base = rest_base(self.api_url)
        self._http = requests.Session()
        self._http.headers.update(
            {
                "Authorization": f"Bearer {self._token}",
                "Accept": "application/json",
                "User-Agent": f"sandbox-sessions-sdk-python/{__version__}",
            }
        )

    def __repr__(self) -> str:
        return f"SessionsClient(api_url={self.api_url!r})"

    # -- context manager -------------------------------------------------

    def __enter__(self) -> "SessionsClient":
        return self

    def close(self) -> None:
        """Close the underlying HTTP connections. Safe to call twice."""
        self._http.close()

    # -- API ---------------------------------------------------------------

    def create_session(
        self,
        ttl: int = 3600,
        image: Optional[str] = None,
        metadata: Optional[Mapping[str, Any]] = None,
        ssh_public_key: Optional[str] = None,
        idempotency_key: Optional[str] = None,
        resources: Optional[Mapping[str, Any]] = None,
        labels: Optional[Mapping[str, Any]] = None,
        egress: Optional[Sequence[str]] = None,
        secrets: Optional[Sequence[Any]] = None,
    ) -> Session:
        """Create a session and its sandbox (``POST /v1/sessions``).

        Args:
            ttl: Lifetime in seconds, 60..28800.
            image: Sandbox image; the server's default when None.
            metadata: A JSON-serialisable dict stored with the session.
            ssh_public_key: An authorized_keys line; the matching private key
                then authenticates over SSH (``SessionSSHClient(pkey=...)``).
            idempotency_key: Sent as the ``Idempotency-Key`` header: the
                gateway answers a repeated key (same tenant, within 24 h)
                with the session the first request created instead of
                creating another. None (the default) sends a fresh random
                UUID. 1 to 255 printable ASCII characters, no spaces. Pass
                your own key to make retries across calls (or processes) safe.
            resources: The sandbox's limits, with the API's names:
                ``{"memoryMiB": 1024, "cpus": 2, "pids": 512, "diskMiB": 4096}``;
                any key may be left out (the gateway's default). Above the
                gateway's cap: :class:`ResourcesExceededError`; below the
                minimum: :class:`InvalidResourcesError`. The Session's
                ``resources`` show what is in force.
            labels: Another name for ``metadata`` (give one of the two).
            egress: The hosts the sandbox may reach, through the gateway's
                egress proxy: hostnames (``"pypi.org"``), wildcards
                (``"*.pythonhosted.org"``: any subdomain, not the apex), IP
                literals (``"10.0.0.5"``, ``"[2001:db8::1]"``), each with an
                optional ``:port`` (none: ports 80 and 443). None or ``[]``:
                no network. The Session's ``egress_allow`` shows the list in
                canonical form. An entry that does not parse:
                :class:`InvalidEgressError`; outside what the gateway's
                operator allows: :class:`EgressNotAllowedError`.
            secrets: Operator-defined secrets (``serve --secrets-file``) to
                give the session, by name. A name (``"PYPI_TOKEN"``) sets
                the environment variable of that name to the secret's value
                in every command, shell and SFTP process. A dict
                ``{"name": "GITHUB_TOKEN", "hosts": ["api.github.com"],
                "header": "Authorization", "format": "Bearer {value}"}``
                keeps the value out of the sandbox: the variable holds a
                placeholder and the egress proxy sets ``header`` (default
                ``Authorization``) to ``format`` (default ``Bearer
                {value}``) on HTTPS requests to ``hosts``, which ``egress``
                must cover. Names the gateway does not define:
                :class:`UnknownSecretError`; a malformed reference:
                :class:`InvalidSecretError`; hosts outside ``egress``:
                :class:`EgressNotAllowedError`. Values never appear in the
                Session.

        Retries: when the gateway cannot be reached, the connection breaks,
        the request times out, or it answers 500, 502, 503 or 504, the create
        is sent again, up to twice more (after 0.5 s, then 1 s), with the
        same key, so a retry never makes a second session. TLS errors and
        other answers (4xx, 429 included) are raised at once.

        Returns:
            The Session. Its ``password`` is set only in the answer that
            created it: keep it if you want SSH password authentication
            later. When the gateway replayed an earlier create of the same
            key (``Idempotent-Replayed: true``, e.g. the first answer was
            lost on the way), the Session has ``replayed=True`` and
            ``password`` None; SessionSSHClient then authenticates with the
            bearer token (SSH ``none``) or a key given as ``ssh_public_key``.

        Raises:
            ValueError, TypeError: bad arguments (nothing is sent).
            UnauthorizedError, RateLimitError, SandboxOperationError,
            SandboxConnectionError: see the README's error table.
        """
        body: Dict[str, Any] = {"ttl": check_int("ttl", ttl, MIN_TTL, MAX_TTL)}
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
            body["resources"] = _check_resources(resources)
        if egress is not None:
            body["egress"] = _check_hosts("egress", egress)
        if secrets is not None:
            body["secrets"] = _check_secrets(secrets)
        if ssh_public_key is not None:
            if not isinstance(ssh_public_key, str) or not ssh_public_key.strip():
                raise ValueError("ssh_public_key must be an authorized_keys line")
            body["sshPublicKey"] = ssh_public_key.strip()
        key = _check_idempotency_key(idempotency_key) if idempotency_key is not None else str(uuid.uuid4())
        for attempt in range(len(_CREATE_RETRY_DELAYS) + 1):
            try:
                data, headers = self._call(
                    "POST", "/sessions", what="create session", json=body, headers={"Idempotency-Key": key}
                )
                break
            except SandboxAPIError as e:
                if attempt == len(_CREATE_RETRY_DELAYS) or not _create_retryable(e):
                    raise
                time.sleep(_CREATE_RETRY_DELAYS[attempt])
        session = self._session(data, "create session")
        session.replayed = str(headers.get("Idempotent-Replayed", "")).strip().lower() == "true"
        return session

    def list_sessions(self, limit: int = 50, offset: int = 0) -> Dict[str, Any]:
        """List this tenant's sessions (``GET /v1/sessions``).

        Args:
            limit: Page size, 1..100.
            offset: Number of sessions to skip, >= 0.

        Returns:
            ``{"sessions": [Session, ...], "total": int, "limit": int, "offset": int}``
        """
        check_int("limit", limit, 1, 100)
        check_int("offset", offset, 0)
        data = self._request("GET", "/sessions", what="list sessions", params={"limit": limit, "offset": offset})
        items = data.get("sessions")
        if not isinstance(items, list):
            raise SandboxOperationError("list sessions: answer has no 'sessions' list", body=str(data)[:4096])
        return {
            "sessions": [self._session(item, "list sessions") for item in items],
            "total": data.get("total", len(items)),
            "limit": data.get("limit", limit),
            "offset": data.get("offset", offset),
        }

    def get_session(self, session_id: str) -> Session:
        """Fetch one session (``GET /v1/sessions/{id}``).

        Raises:
            SessionNotFoundError: no such session for this token's tenant.
        """
        data = self._request("GET", self._session_path(session_id), what="get session", session_scoped=True)
        return self._session(data, "get session")

    def update_session(
        self, session_id: str, ttl: Optional[int] = None, egress: Optional[Sequence[str]] = None
    ) -> Session:
        """Change a session (``PATCH /v1/sessions/{id}``).

        With neither argument, nothing changes (an empty PATCH, which still
        counts as activity and returns the session).

        Args:
            ttl: When given, the session expires ``ttl`` seconds from now
                (60..28800) and that becomes its ``ttl``; call it again
                before ``expires_at`` to keep a long task's session alive.
                The change survives a gateway restart. None changes nothing.
            egress: When given, replaces the running session's egress
                allow-list (entries as for :meth:`create_session`); new
                connections follow it at once. ``[]`` takes the network
                away. None changes nothing.

        Returns:
            The session after the change.

        Raises:
            ValueError, TypeError: bad arguments (nothing is sent).
            SessionNotFoundError: no such session for this token's tenant.
            InvalidEgressError, EgressNotAllowedError: as for create_session.
            SandboxOperationError: the session is not running (``.code``
                ``session_not_running``), or the gateway could not record
                the change (503 ``store_failed``; nothing changed).
        """
        body: Dict[str, Any] = {}
        if ttl is not None:
            body["ttl"] = check_int("ttl", ttl, MIN_TTL, MAX_TTL)
        if egress is not None:
            body["egress"] = _check_hosts("egress", egress)
        data = self._request(
            "PATCH", self._session_path(session_id), what="update session", session_scoped=True, json=body
        )
        return self._session(data, "update session")

    def delete_session(self, session_id: str) -> None:
        """Delete a session and everything in its sandbox (``DELETE /v1/sessions/{id}``).

        200 and 204 both count as success.

        Raises:
            SessionNotFoundError: no such session (or already deleted).
        """
        self._request("DELETE", self._session_path(session_id), what="delete session", session_scoped=True)

    # -- internals ---------------------------------------------------------

    @staticmethod
    def _session_path(session_id: str) -> str:
        if not isinstance(session_id, str) or not session_id:
            raise ValueError("session_id must be a non-empty string")
        return "/sessions/" + quote(session_id, safe="")

    @staticmethod
    def _session(data: Any, what: str) -> Session:
        try:
            return Session.from_dict(data)
        except ValueError as e:
            raise SandboxOperationError(f"{what}: unexpected answer: {e}", body=str(data)[:4096]) from None

    def _request(
        self,
        method: str,
        path: str,
        *,
        what: str,
        session_scoped: bool = False,
        **kwargs: Any,
    ) -> Dict[str, Any]:
        return self._call(method, path, what=what, session_scoped=session_scoped, **kwargs)[0]

    def _call(
        self,
        method: str,
        path: str,
        *,
        what: str,
        session_scoped: bool = False,
        **kwargs: Any,
    ) -> Tuple[Dict[str, Any], Mapping[str, str]]:
        """Send one request; return the answer's JSON object and its headers."""
        url = self._base + path
        try:
            # verify is passed per request: requests lets REQUESTS_CA_BUNDLE
            # override a Session-level verify (psf/requests#3829).
            resp = self._http.request(method, url, timeout=self.timeout, verify=self.verify_ssl, **kwargs)
        except requests.exceptions.SSLError as e:
            raise SandboxConnectionError(f"{what}: TLS error talking to {self.api_url}: {e}") from e
        except requests.exceptions.Timeout as e:
            raise SandboxConnectionError(f"{what}: timed out after {self.timeout}s talking to {self.api_url}") from e
        except requests.exceptions.RequestException as e:
            raise SandboxConnectionError(f"{what}: cannot reach {self.api_url}: {e}") from e
        with resp:
            if resp.status_code >= 400:
                raise error_for_status(
                    resp.status_code,
                    resp.reason or "",
                    resp.headers,
                    resp.content,
                    what=what,
                    session_scoped=session_scoped,
                )
            if resp.status_code == 204 or not resp.content:
                return {}, resp.headers
            try:
                data = resp.json()
            except ValueError:
                raise SandboxOperationError(
                    f"{what}: HTTP {resp.status_code} answer is not JSON",
                    status_code=resp.status_code,
                    body=resp.text[:4096],
                    headers=resp.headers,
                ) from None
            if not isinstance(data, dict):
                raise SandboxOperationError(
                    f"{what}: HTTP {resp.status_code} answer is not a JSON object",
                    status_code=resp.status_code,
                    body=resp.text[:4096],
                )
            return data, resp.headers
