"""Data types returned by the REST API."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Dict, List, Mapping, Optional

__all__ = ["Session"]

_RFC3339 = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?"
    r"(?:([Zz])|([+-])(\d{2}):?(\d{2}))?$"
)


def parse_timestamp(value: Any) -> Optional[datetime]:
    """Parse an RFC 3339 timestamp (Go's format, nanoseconds included).

    Returns an aware :class:`datetime` (UTC when the text has no offset), or
    ``None`` when *value* is empty or not a timestamp.
    """
    if not isinstance(value, str) or not value:
        return None
    m = _RFC3339.match(value.strip())
    if not m:
        return None
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    frac = m.group(7) or ""
    micro = int((frac + "000000")[:6])
    tz = timezone.utc
    if m.group(9):
        offset = timedelta(hours=int(m.group(10)), minutes=int(m.group(11)))
        tz = timezone(offset if m.group(9) == "+" else -offset)
    try:
        return datetime(year, month, day, hour, minute, min(second, 59), micro, tzinfo=tz)
    except ValueError:
        return None


@dataclass
class Session:
    """A sandbox session, as the REST API describes it.

    Attributes:
        session_id: The session's id (``sbx-...``).
        status: ``running``, ``deleted``, ``expired`` or ``failed``.
        image: The sandbox image.
        metadata: The metadata given at creation.
        created_at: When the session was created (aware datetime, UTC).
        expires_at: When the session's TTL runs out.
        last_activity_at: When the session was last used over REST or SSH.
        ttl: The session's time to live in seconds.
        username: The SSH username to use (``sandbox``).
        password: The per-session SSH password. Only the create response
            carries it; it is ``None`` on sessions read later. Hidden from repr.
        host_keys: The gateway's SSH host keys as authorized_keys lines
            (``ssh-ed25519 AAAA...``), ed25519 first. ``SessionSSHClient``
            pins these.
        known_hosts_line: A ready ``known_hosts`` line for OpenSSH.
        connect_path: The path to CONNECT to for this session's tunnel.
        raw: The JSON object the server sent, unchanged.
    """

    session_id: str
    status: str
    image: str
    metadata: Dict[str, Any]
    created_at: Optional[datetime]
    expires_at: Optional[datetime]
    last_activity_at: Optional[datetime] = None
    ttl: Optional[int] = None
    username: Optional[str] = None
    password: Optional[str] = field(default=None, repr=False)
    host_keys: List[str] = field(default_factory=list)
    known_hosts_line: Optional[str] = None
    connect_path: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Session":
        """Build a Session from the API's JSON object (camelCase fields)."""
        if not isinstance(data, Mapping) or not isinstance(data.get("sessionId"), str):
            raise ValueError("not a session object: missing sessionId")
        ssh = data.get("ssh") or {}
        if not isinstance(ssh, Mapping):
            ssh = {}
        ttl = data.get("ttl")
        host_keys = ssh.get("hostKeys") or []
        return cls(
            session_id=data["sessionId"],
            status=str(data.get("status") or ""),
            image=str(data.get("image") or ""),
            metadata=dict(data.get("metadata") or {}),
            created_at=parse_timestamp(data.get("createdAt")),
            expires_at=parse_timestamp(data.get("expiresAt")),
            last_activity_at=parse_timestamp(data.get("lastActivityAt")),
            ttl=ttl if isinstance(ttl, int) and not isinstance(ttl, bool) else None,
            username=ssh.get("username") or None,
            password=ssh.get("password") or None,
            host_keys=[k for k in host_keys if isinstance(k, str) and k.strip()],
            known_hosts_line=ssh.get("knownHostsLine") or None,
            connect_path=ssh.get("connectPath") or None,
            raw=dict(data),
        )
