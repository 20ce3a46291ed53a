"""SessionsClient: the REST API (``/v1/sessions``)."""

from __future__ import annotations

from types import TracebackType
from typing import Any, Dict, Mapping, Optional, Type
from urllib.parse import quote

import requests

from ._common import (
    VerifySSL,
    check_int,
    check_timeout,
    error_for_status,
    resolve_settings,
    rest_base,
)
from ._version import __version__
from .errors import SandboxConnectionError, SandboxOperationError
from .models import Session

__all__ = ["SessionsClient"]

MIN_TTL = 60
MAX_TTL = 28800


class SessionsClient:
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

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()

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
    ) -> Session:
        """Create a session and its sandbox (``POST /v1/sessions``).

        Args:
            ttl: Lifetime in seconds, 60..28800.
            image: Sandbox image; the server's default when None.
            metadata: A JSON-serialisable dict stored with the session.
            ssh_public_key: An authorized_keys line; the matching private key
                then authenticates over SSH (``SessionSSHClient(pkey=...)``).

        Returns:
            The new Session. Its ``password`` is set only here: keep it if
            you want SSH password authentication later.

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
        if metadata is not None:
            if not isinstance(metadata, Mapping):
                raise TypeError("metadata must be a dict")
            body["metadata"] = dict(metadata)
        if ssh_public_key is not None:
            if not isinstance(ssh_public_key, str) or not ssh_public_key.strip():
                raise ValueError("ssh_public_key must be an authorized_keys line")
            body["sshPublicKey"] = ssh_public_key.strip()
        data = self._request("POST", "/sessions", what="create session", json=body)
        return self._session(data, "create session")

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
                return {}
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
            return data
