"""The REST operations the clients had no method for (issue 39's parity
table, docs/sdk.md): stopping a session, the Python kernel, a session's
logs, the gateway's images and host keys, file links and WebSocket tickets.

Mixed into :class:`~sandbox_sessions_sdk.SessionsClient` (:class:`ExtraOps`)
and :class:`~sandbox_sessions_sdk.aio.AsyncSessionsClient`
(:class:`AsyncExtraOps`); each is one plain call (an :class:`~._rest.Op`),
so the two differ only by ``await``.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping, Optional

from ._common import check_int, check_timeout, parse_session, session_path
from ._dataplane import check_path, run_read_timeout
from ._rest import Op
from .errors import SandboxOperationError
from .models import Session

_KERNEL = re.compile(r"^[A-Za-z0-9_.-]{0,64}$")

#: The slack, past a kernel call's own timeout, for its restart (SIGINT, then a kill 2 s later).
_KERNEL_SLACK = 2.0


def _kernel(kernel: Any) -> str:
    if not isinstance(kernel, str) or not _KERNEL.match(kernel):
        raise ValueError("kernel must be 0 to 64 of A-Z a-z 0-9 _ . -")
    return kernel


def _keyed(data: Mapping[str, Any], key: str, what: str) -> Dict[str, Any]:
    if key not in data:
        raise SandboxOperationError(f"{what}: unexpected answer: no {key}", body=str(data)[:4096])
    return dict(data)


class extra_ops:
    """The builders of the calls below (arguments are checked before anything is sent)."""

    @staticmethod
    def stop_session(session_id: Any) -> Op:
        return Op(
            "POST",
            session_path(session_id) + "/stop",
            "stop session",
            True,
            parse=lambda d, h: parse_session(d, "stop session"),
        )

    @staticmethod
    def run_python(
        session_id: Any, code: Any, kernel: Any, timeout: Any, max_output_bytes: Any, client_timeout: Optional[float]
    ) -> Op:
        if not isinstance(code, str):
            raise TypeError(f"code must be a string, got {type(code).__name__}")
        body: Dict[str, Any] = {"code": code}
        if kernel is not None:
            body["kernel"] = _kernel(kernel)
        if timeout is not None:
            body["timeout"] = check_timeout("timeout", timeout)
        if max_output_bytes is not None:
            body["maxOutputBytes"] = check_int("max_output_bytes", max_output_bytes, 0)
        read = run_read_timeout(body, client_timeout)
        return Op(
            "POST",
            session_path(session_id) + "/python",
            "run python",
            True,
            json=body,
            read_timeout=None if read is None else read + _KERNEL_SLACK,
            parse=lambda d, h: _keyed(d, "kernel", "run python"),
        )

    @staticmethod
    def reset_python(session_id: Any, kernel: Any) -> Op:
        body = {} if kernel is None else {"kernel": _kernel(kernel)}
        return Op(
            "POST",
            session_path(session_id) + "/python/reset",
            "reset python",
            True,
            json=body,
            parse=lambda d, h: _keyed(d, "kernel", "reset python"),
        )

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

    def stop_session(self, session_id: str) -> Session:
        """Stop a session, keeping its files (``POST /v1/sessions/{id}/stop``).

        Every process ends (shells, background processes, the Python
        kernel) and its memory and CPU are freed; the files stay. The next
        command, SSH session or kernel call starts it again. Stopping a
        stopped session changes nothing.

        Raises:
            SandboxOperationError: ``.code`` ``stop_unsupported`` (a driver
                that cannot stop sessions), ``session_not_running`` (failed).
        """
        return self._do(extra_ops.stop_session(session_id))  # type: ignore[attr-defined,no-any-return]

    def run_python(
        self,
        session_id: str,
        code: str,
        *,
        kernel: Optional[str] = None,
        timeout: Optional[float] = None,
        max_output_bytes: Optional[int] = None,
    ) -> Dict[str, Any]:
        """Run *code* in the session's persistent Python kernel (``POST .../python``).

        Like a notebook cell: variables and imports persist from one call to
        the next in the same *kernel* (default ``default``).

        Returns:
            The API's ``PythonResult`` dict: ``result`` (the ``repr`` of a
            final expression, or None), ``error`` (``{"name", "value",
            "traceback"}`` for an uncaught exception, or None: not raised),
            ``stdout``, ``stderr``, ``timedOut``, ``interrupted``,
            ``restarted``, ``stateLost``, ``durationMs``, ``kernel``.
        """
        op = extra_ops.run_python(session_id, code, kernel, timeout, max_output_bytes, self.timeout)
        return self._do(op)  # type: ignore[attr-defined,no-any-return]

    def reset_python(self, session_id: str, kernel: Optional[str] = None) -> Dict[str, Any]:
        """Forget a kernel's state (``POST .../python/reset``): ``{"kernel", "existed"}``."""
        return self._do(extra_ops.reset_python(session_id, kernel))  # type: ignore[attr-defined,no-any-return]

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
        """The images sessions may use (``GET /v1/images``): ``{"images": [...], "allow": [patterns]}``."""
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

    async def stop_session(self, session_id: str) -> Session:
        return await self._do(extra_ops.stop_session(session_id))  # type: ignore[attr-defined,no-any-return]

    async def run_python(
        self,
        session_id: str,
        code: str,
        *,
        kernel: Optional[str] = None,
        timeout: Optional[float] = None,
        max_output_bytes: Optional[int] = None,
    ) -> Dict[str, Any]:
        op = extra_ops.run_python(session_id, code, kernel, timeout, max_output_bytes, self.timeout)
        return await self._do(op)  # type: ignore[attr-defined,no-any-return]

    async def reset_python(self, session_id: str, kernel: Optional[str] = None) -> Dict[str, Any]:
        return await self._do(extra_ops.reset_python(session_id, kernel))  # type: ignore[attr-defined,no-any-return]

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
