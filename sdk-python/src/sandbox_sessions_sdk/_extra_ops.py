"""The REST operations the clients had no method for (issue 39's parity
table, docs/sdk.md): a session's logs, the gateway's images and host keys,
file links and WebSocket tickets. (Stopping a session and the Python kernel
are the clients' own methods, in client.py and aio.py.)

Mixed into :class:`~sandbox_sessions_sdk.SessionsClient` (:class:`ExtraOps`)
and :class:`~sandbox_sessions_sdk.aio.AsyncSessionsClient`
(:class:`AsyncExtraOps`); each is one plain call (an :class:`~._rest.Op`),
so the two differ only by ``await``.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from ._common import check_int, session_path
from ._dataplane import check_path
from ._rest import Op
from .errors import SandboxOperationError


def _keyed(data: Mapping[str, Any], key: str, what: str) -> Dict[str, Any]:
    if key not in data:
        raise SandboxOperationError(f"{what}: unexpected answer: no {key}", body=str(data)[:4096])
    return dict(data)


class extra_ops:
    """The builders of the calls below (arguments are checked before anything is sent)."""

    @staticmethod
    def logs_params(tail: Any) -> Dict[str, Any]:
        return {} if tail is None else {"tail": check_int("tail", tail, 1, 10000)}

    @staticmethod
    def list_images() -> Op:
        return Op("GET", "/images", "list images", parse=lambda d, h: _keyed(d, "images", "list images"))

    @staticmethod
    def host_keys() -> Op:
        def parse(d: Dict[str, Any], h: Any) -> List[str]:
            keys = d.get("hostKeys")
            if not isinstance(keys, list):
                raise SandboxOperationError("host keys: answer has no 'hostKeys' list", body=str(d)[:4096])
            return [k for k in keys if isinstance(k, str)]

        return Op("GET", "/host-keys", "host keys", parse=parse)

    @staticmethod
    def file_link(session_id: Any, path: Any, expires_in: Any) -> Op:
        body: Dict[str, Any] = {"path": check_path("path", path)}
        if expires_in is not None:
            body["expiresIn"] = check_int("expires_in", expires_in, 1, 604800)
        return Op(
            "POST",
            session_path(session_id) + "/files/link",
            "file link",
            True,
            json=body,
            filename=body["path"],
            parse=lambda d, h: _keyed(d, "url", "file link"),
        )

    @staticmethod
    def create_ticket(session_id: Any) -> Op:
        return Op(
            "POST",
            session_path(session_id) + "/tickets",
            "create ticket",
            True,
            parse=lambda d, h: _keyed(d, "ticket", "create ticket"),
        )


def _logs_text(resp: Any) -> str:
    return resp.content.decode(resp.charset_encoding or "utf-8", errors="replace")


class ExtraOps:
    """:class:`SessionsClient`'s methods for these calls."""

    timeout: Optional[float]

    def session_logs(self, session_id: str, tail: Optional[int] = None) -> str:
        """The session's recent commands and process output, as text for people (``GET .../logs``)."""
        params = extra_ops.logs_params(tail)
        resp = self._send(  # type: ignore[attr-defined]
            "GET",
            session_path(session_id) + "/logs",
            what="session logs",
            session_scoped=True,
            params=params,
            headers={"Accept": "text/plain"},
        )
        return _logs_text(resp)

    def list_images(self) -> Dict[str, Any]:
        """The images sessions may use (``GET /v1/images``): ``{"images": [...], "allow": [patterns],
        "aliases": [{"name", "image"}]}`` (the names ``serve --image-alias`` made stand for other images)."""
        return self._do(extra_ops.list_images())  # type: ignore[attr-defined,no-any-return]

    def host_keys(self) -> List[str]:
        """The gateway's SSH host keys, ed25519 first (``GET /v1/host-keys``)."""
        return self._do(extra_ops.host_keys())  # type: ignore[attr-defined,no-any-return]

    def file_link(self, session_id: str, path: str, expires_in: Optional[int] = None) -> Dict[str, Any]:
        """A presigned link to a sandbox file (``POST .../files/link``): ``{"url", "expiresAt"}``; anyone holding it may GET the file."""
        return self._do(extra_ops.file_link(session_id, path, expires_in))  # type: ignore[attr-defined,no-any-return]

    def create_ticket(self, session_id: str) -> Dict[str, Any]:
        """A one-use ticket (30 s) standing in for the token on one of the session's WebSockets (``POST .../tickets``)."""
        return self._do(extra_ops.create_ticket(session_id))  # type: ignore[attr-defined,no-any-return]


class AsyncExtraOps:
    """:class:`AsyncSessionsClient`'s methods for these calls (as :class:`ExtraOps`)."""

    timeout: Optional[float]

    async def session_logs(self, session_id: str, tail: Optional[int] = None) -> str:
        params = extra_ops.logs_params(tail)
        resp = await self._send(  # type: ignore[attr-defined]
            "GET",
            session_path(session_id) + "/logs",
            what="session logs",
            session_scoped=True,
            params=params,
            headers={"Accept": "text/plain"},
        )
        return _logs_text(resp)

    async def list_images(self) -> Dict[str, Any]:
        return await self._do(extra_ops.list_images())  # type: ignore[attr-defined,no-any-return]

    async def host_keys(self) -> List[str]:
        return await self._do(extra_ops.host_keys())  # type: ignore[attr-defined,no-any-return]

    async def file_link(self, session_id: str, path: str, expires_in: Optional[int] = None) -> Dict[str, Any]:
        return await self._do(extra_ops.file_link(session_id, path, expires_in))  # type: ignore[attr-defined,no-any-return]

    async def create_ticket(self, session_id: str) -> Dict[str, Any]:
        return await self._do(extra_ops.create_ticket(session_id))  # type: ignore[attr-defined,no-any-return]
