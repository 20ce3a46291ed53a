"""Egress: entries with rules per request, the session's egress decisions
and approvals (``egressMode: "ask"``): request parameters and answers,
shared by SessionsClient and AsyncSessionsClient."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from ._common import check_int, session_path
from .errors import SandboxOperationError
from .models import parse_timestamp

#: An egress entry: ``"host[:port]"``, or a dict with rules per request,
#: ``{"host", "port", "methods", "paths"}``.
EgressEntry = Union[str, Dict[str, Any]]

_RULE_KEYS = ("host", "port", "methods", "paths")
EGRESS_MODES = ("deny", "ask")


def check_egress(name: str, value: Any) -> List[EgressEntry]:
    """Check egress entries locally: strings, or dicts with a ``host`` and
    optional ``port``, ``methods``, ``paths``. The gateway parses the rest."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{name} must be a list (e.g. ['pypi.org']), got {type(value).__name__}")
    out: List[EgressEntry] = []
    for i, entry in enumerate(value):
        if isinstance(entry, str):
            if not entry.strip():
                raise ValueError(f"{name}[{i}] must be a non-empty string")
            out.append(entry)
            continue
        if not isinstance(entry, Mapping):
            raise TypeError(f"{name}[{i}] must be a string or a dict, got {type(entry).__name__}")
        unknown = [k for k in entry if k not in _RULE_KEYS]
        if unknown:
            raise ValueError(f"{name}[{i}]: unknown key {unknown[0]!r}; known: {', '.join(_RULE_KEYS)}")
        host = entry.get("host")
        if not isinstance(host, str) or not host:
            raise ValueError(f"{name}[{i}] needs a 'host' (a non-empty string)")
        rule: Dict[str, Any] = {"host": host}
        if entry.get("port") is not None:
            rule["port"] = check_int(f"{name}[{i}]['port']", entry["port"], 1, 65535)
        for key in ("methods", "paths"):
            items = entry.get(key)
            if items is None:
                continue
            if isinstance(items, (str, bytes)) or not isinstance(items, Sequence) or not all(
                isinstance(x, str) and x for x in items
            ):
                raise TypeError(f"{name}[{i}][{key!r}] must be a list of non-empty strings")
            rule[key] = list(items)
        out.append(rule)
    return out


def check_egress_mode(mode: Any) -> str:
    if mode not in EGRESS_MODES:
        raise ValueError(f"egress_mode must be one of {', '.join(EGRESS_MODES)}, got {mode!r}")
    return mode


@dataclass
class EgressDecision:
    """One connection, request, refused name or approval of the session's
    egress (``GET /v1/sessions/{id}/egress``), written when it ended.

    Attributes:
        seq: Grows by one per decision of the session.
        kind: ``connect``, ``http``, ``https``, ``tcp``, ``dns`` or ``ask``.
        host, port: What was asked for (port 0 for ``dns``).
        address: The address dialled, None when none was.
        allowed: Whether it was let through.
        reason: Why it was denied, or what failed once allowed.
        bytes_in, bytes_out: Upstream to sandbox, sandbox to upstream.
        start: When it began. duration_ms: How long it lasted.
    """

    seq: int
    kind: str
    host: str
    port: int
    allowed: bool
    address: Optional[str] = None
    reason: Optional[str] = None
    bytes_in: int = 0
    bytes_out: int = 0
    start: Optional[datetime] = None
    duration_ms: int = 0
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "EgressDecision":
        if not isinstance(data, Mapping) or not isinstance(data.get("seq"), int) or not isinstance(data.get("kind"), str):
            raise ValueError("not an egress decision: missing seq or kind")
        return cls(
            seq=data["seq"],
            kind=data["kind"],
            host=str(data.get("host") or ""),
            port=int(data.get("port") or 0),
            allowed=bool(data.get("allowed")),
            address=data.get("address") or None,
            reason=data.get("reason") or None,
            bytes_in=int(data.get("bytesIn") or 0),
            bytes_out=int(data.get("bytesOut") or 0),
            start=parse_timestamp(data.get("start")),
            duration_ms=int(data.get("durationMs") or 0),
            raw=dict(data),
        )


@dataclass
class EgressDecisionPage:
    """One page of :meth:`SessionsClient.list_egress_decisions`, newest
    first; :attr:`next_cursor` (None on the last page) fetches older ones."""

    decisions: List[EgressDecision]
    next_cursor: Optional[str] = None


@dataclass
class EgressPending:
    """A connection of an ``egress_mode="ask"`` session waiting for a
    decision (``GET /v1/sessions/{id}/egress/pending``).

    Attributes:
        id: What :meth:`SessionsClient.decide_egress` names it by.
        host, port: Where it wants to go.
        since: When it was parked.
        via: ``proxy`` (HTTP(S)_PROXY) or ``transparent`` (any TCP).
        user_agent: A proxy request's User-Agent, if any. The process that
            asked is not known to the gateway.
    """

    id: str
    host: str
    port: int
    since: Optional[datetime] = None
    via: str = ""
    user_agent: Optional[str] = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "EgressPending":
        if not isinstance(data, Mapping) or not isinstance(data.get("id"), str):
            raise ValueError("not a pending connection: missing id")
        return cls(
            id=data["id"],
            host=str(data.get("host") or ""),
            port=int(data.get("port") or 0),
            since=parse_timestamp(data.get("since")),
            via=str(data.get("via") or ""),
            user_agent=data.get("userAgent") or None,
        )


def _items(cls: Any, data: Any, key: str, what: str) -> List[Any]:
    items = data.get(key) if isinstance(data, Mapping) else None
    if not isinstance(items, list):
        raise SandboxOperationError(f"{what}: answer has no {key!r} list", body=str(data)[:4096])
    try:
        return [cls.from_dict(x) for x in items]
    except (ValueError, TypeError) as e:
        raise SandboxOperationError(f"{what}: {e}", body=str(data)[:4096]) from None


def egress_decisions_params(limit: Any, cursor: Any) -> Dict[str, Any]:
    params: Dict[str, Any] = {"limit": check_int("limit", limit, 1, 1000)}
    if cursor is not None:
        if not isinstance(cursor, str) or not cursor:
            raise ValueError("cursor must be a non-empty string (a page's next_cursor)")
        params["cursor"] = cursor
    return params


def egress_decision_page(data: Mapping[str, Any]) -> EgressDecisionPage:
    cursor = data.get("nextCursor") if isinstance(data, Mapping) else None
    return EgressDecisionPage(
        decisions=_items(EgressDecision, data, "decisions", "list egress decisions"),
        next_cursor=cursor if isinstance(cursor, str) and cursor else None,
    )


def egress_pending_list(data: Mapping[str, Any]) -> List[EgressPending]:
    return _items(EgressPending, data, "pending", "list egress pending")


def pending_path(session_id: Any, pending_id: Any) -> str:
    if not isinstance(pending_id, str) or not pending_id:
        raise ValueError("pending_id must be a non-empty string (an EgressPending's id)")
    from urllib.parse import quote

    return session_path(session_id) + "/egress/pending/" + quote(pending_id, safe="")


def decide_body(decision: Any, remember: Any) -> Dict[str, Any]:
    if decision not in ("allow", "deny"):
        raise ValueError(f"decision must be 'allow' or 'deny', got {decision!r}")
    if not isinstance(remember, bool):
        raise TypeError("remember must be a bool")
    return {"decision": decision, "remember": remember}


def decided(data: Mapping[str, Any]) -> EgressPending:
    try:
        return EgressPending.from_dict(data)
    except (ValueError, TypeError) as e:
        raise SandboxOperationError(f"decide egress: {e}", body=str(data)[:4096]) from None


@dataclass
class EgressPendingEvent:
    """One event of :meth:`SessionsClient.follow_egress_pending`:
    ``pending`` (a connection parked: :attr:`pending` is set) or
    ``resolved`` (it no longer waits: decided, timed out or its client gone;
    :attr:`pending` holds its id, host and port)."""

    event: str
    pending: EgressPending


class SSEParser:
    """Turns the lines of ``text/event-stream`` into (event, data) pairs."""

    def __init__(self) -> None:
        self._event = ""
        self._data: List[str] = []

    def feed(self, line: str) -> Optional[EgressPendingEvent]:
        # httpx before 0.24 yields lines with their endings; later ones without.
        line = line.rstrip("\r\n")
        if line == "":
            event, data = self._event, "\n".join(self._data)
            self._event, self._data = "", []
            return pending_event(event, data)
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        return None


def pending_event(event: str, data: str) -> Optional[EgressPendingEvent]:
    import json

    if event not in ("pending", "resolved") or not data:
        return None
    try:
        obj = json.loads(data)
        if event == "resolved":
            obj = {"via": "", **obj}
        return EgressPendingEvent(event=event, pending=EgressPending.from_dict(obj))
    except (ValueError, TypeError) as e:
        raise SandboxOperationError(f"follow egress pending: bad event: {e}", body=data[:4096]) from None
