"""Workspaces, snapshots, stats, port links and the audit trail: request
parameters and answers, shared by SessionsClient and AsyncSessionsClient."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Dict, List, Mapping, Type, TypeVar, Union
from urllib.parse import quote

from ._common import check_int, session_path
from .errors import SandboxOperationError
from .models import AuditEvent, AuditPage, PortLink, parse_timestamp

_WORKSPACE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")

T = TypeVar("T")


def workspace_path(name: Any) -> str:
    """``/workspaces/{name}``; ValueError for a name the API would refuse."""
    return "/workspaces/" + quote(check_workspace_name(name), safe="")


def check_workspace_name(name: Any) -> str:
    if not isinstance(name, str) or not _WORKSPACE_NAME.match(name) or ".." in name:
        raise ValueError(
            "workspace name must be 1 to 63 of A-Z a-z 0-9 . _ -, starting with a letter or digit, without '..'"
        )
    return name


def snapshot_path(snapshot_id: Any) -> str:
    if not isinstance(snapshot_id, str) or not snapshot_id:
        raise ValueError("snapshot_id must be a non-empty string")
    return "/snapshots/" + quote(snapshot_id, safe="")


def delete_session_params(keep_workspace: Any, discard: Any = None) -> Dict[str, str]:
    """The query of ``DELETE /v1/sessions/{id}``: ``keepWorkspace`` and ``discard`` when given."""
    params: Dict[str, str] = {}
    for name, key, value in (("keep_workspace", "keepWorkspace", keep_workspace), ("discard", "discard", discard)):
        if value is None:
            continue
        if not isinstance(value, bool):
            raise TypeError(name + " must be a bool")
        params[key] = "true" if value else "false"
    return params


def parse_one(cls: Type[T], data: Any, what: str) -> T:
    """``cls.from_dict(data)``; SandboxOperationError when it is not one."""
    try:
        return cls.from_dict(data)  # type: ignore[attr-defined,no-any-return]
    except ValueError as e:
        raise SandboxOperationError(f"{what}: unexpected answer: {e}", body=str(data)[:4096]) from None


def parse_list(cls: Type[T], data: Mapping[str, Any], key: str, what: str) -> List[T]:
    items = data.get(key)
    if not isinstance(items, list):
        raise SandboxOperationError(f"{what}: answer has no {key!r} list", body=str(data)[:4096])
    return [parse_one(cls, item, what) for item in items]


def snapshot_params(session: Any) -> Dict[str, str]:
    if session is None:
        return {}
    if not isinstance(session, str) or not session:
        raise ValueError("session must be a non-empty string")
    return {"session": session}


def audit_params(session: Any, since: Any, limit: Any, cursor: Any) -> Dict[str, Any]:
    """The query of ``GET /v1/audit``, checked locally."""
    params: Dict[str, Any] = {"limit": check_int("limit", limit, 1, 1000)}
    if session is not None:
        if not isinstance(session, str) or not session:
            raise ValueError("session must be a non-empty string")
        params["session"] = session
    if since is not None:
        params["since"] = format_since(since)
    if cursor is not None:
        if not isinstance(cursor, str) or not cursor:
            raise ValueError("cursor must be a non-empty string (a page's next_cursor)")
        params["cursor"] = cursor
    return params


def format_since(since: Union[str, datetime]) -> str:
    """An RFC 3339 text of *since* (an aware datetime, or text already in that form)."""
    if isinstance(since, datetime):
        if since.tzinfo is None:
            raise ValueError("since must be an aware datetime (e.g. datetime.now(timezone.utc))")
        return since.isoformat()
    if isinstance(since, str) and parse_timestamp(since) is not None:
        return since
    raise ValueError("since must be an aware datetime or an RFC 3339 timestamp")


def audit_page(data: Mapping[str, Any]) -> AuditPage:
    cursor = data.get("nextCursor")
    return AuditPage(
        events=parse_list(AuditEvent, data, "events", "list audit"),
        next_cursor=cursor if isinstance(cursor, str) and cursor else None,
    )


TIMELINE_KINDS = ("command", "egress", "file", "session")


def timeline_params(kind: Any, after: Any, limit: Any, cursor: Any) -> Dict[str, Any]:
    """The query of ``GET /v1/sessions/{id}/timeline``, checked locally."""
    params: Dict[str, Any] = {"limit": check_int("limit", limit, 1, 1000)}
    if kind is not None:
        kinds = [kind] if isinstance(kind, str) else kind
        if not isinstance(kinds, (list, tuple)) or not kinds or any(k not in TIMELINE_KINDS for k in kinds):
            raise ValueError(f"kind must be one or a list of {', '.join(TIMELINE_KINDS)}")
        params["kind"] = ",".join(kinds)
    if after is not None:
        params["after"] = check_int("after", after, 0)
    if cursor is not None:
        if not isinstance(cursor, str) or not cursor:
            raise ValueError("cursor must be a non-empty string (a page's next_cursor)")
        params["cursor"] = cursor
    return params


def timeline_page(data: Mapping[str, Any]) -> AuditPage:
    cursor = data.get("nextCursor")
    return AuditPage(
        events=parse_list(AuditEvent, data, "entries", "session timeline"),
        next_cursor=cursor if isinstance(cursor, str) and cursor else None,
    )


def port_link_body(port: Any, expires_in: Any) -> Dict[str, Any]:
    body: Dict[str, Any] = {"port": check_int("port", port, 1, 65535)}
    if expires_in is not None:
        body["expiresIn"] = check_int("expires_in", expires_in, 1, 604800)
    return body


def port_link(data: Mapping[str, Any]) -> PortLink:
    url = data.get("url")
    if not isinstance(url, str) or not url:
        raise SandboxOperationError("port link: answer has no 'url'", body=str(data)[:4096])
    return PortLink(url=url, expires_at=parse_timestamp(data.get("expiresAt")))


def preview_url(base: str, session_id: Any, port: Any, path: Any) -> str:
    """``<base>/sessions/{id}/ports/{port}/{path}``: the bearer-authenticated preview URL."""
    check_int("port", port, 1, 65535)
    if not isinstance(path, str):
        raise TypeError("path must be a string")
    return f"{base}{session_path(session_id)}/ports/{port}/" + path.lstrip("/")
