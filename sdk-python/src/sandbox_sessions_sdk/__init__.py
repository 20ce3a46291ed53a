"""Python SDK for sandgate sandbox sessions.

- :class:`SessionsClient`: the REST API: sessions (create, list, get,
  update, delete) and their data plane: commands (:meth:`~SessionsClient.run`,
  persistent shells: :class:`Shell`), files and background processes.
- :class:`SessionSSHClient`: SSH commands and SFTP in a session, with Paramiko,
  through the gateway's HTTP CONNECT tunnel; host keys pinned from the API.
- :class:`HTTPConnectTunnel`: the raw tunnel socket, for your own SSH client.
- :class:`AsyncSessionsClient`, :class:`AsyncSessionSSHClient`: the same for
  asyncio (httpx for REST; the Paramiko client in worker threads for SSH).
- :class:`SessionHandle`, :class:`AsyncSessionHandle`: one session as an
  object (``exec``, ``write``, ``read``, ``run_python``, ``destroy``), from
  ``open_session`` or ``session``.
- ``sandbox_sessions_sdk.openai_agents`` (the ``openai-agents`` extra):
  sandgate as a sandbox backend of the OpenAI Agents SDK.

``api_url`` and ``bearer_token`` default to ``$SANDBOX_API_URL`` and
``$SANDBOX_API_TOKEN``. Every error is a :class:`SandboxAPIError`.
"""

from . import errors
from ._dataplane import FileList
from ._version import __version__
from .aio import AsyncNDJSONStream, AsyncSessionsClient, AsyncSessionSSHClient, AsyncShell
from .client import SessionsClient, Shell
from .handle import AsyncSessionHandle, SessionHandle
from .errors import *  # noqa: F403 (the exception classes, errors.__all__)
from ._egress import EgressDecision, EgressDecisionPage, EgressPending, EgressPendingEvent
from .models import (
    AuditEvent,
    AuditPage,
    CommandResult,
    PortLink,
    PythonError,
    PythonResult,
    Session,
    SessionStats,
    Snapshot,
    Workspace,
)
from .ssh import SessionSSHClient
from .tunnel import HTTPConnectTunnel, TLSStream

__all__ = [
    "__version__",
    "EgressDecision",
    "EgressDecisionPage",
    "EgressPending",
    "EgressPendingEvent",
    "SessionsClient",
    "Shell",
    "SessionHandle",
    "AsyncSessionHandle",
    "FileList",
    "Session",
    "HTTPConnectTunnel",
    "TLSStream",
    "SessionSSHClient",
    "CommandResult",
    "Workspace",
    "Snapshot",
    "SessionStats",
    "PortLink",
    "PythonResult",
    "PythonError",
    "AuditEvent",
    "AuditPage",
    "AsyncSessionsClient",
    "AsyncShell",
    "AsyncNDJSONStream",
    "AsyncSessionSSHClient",
]
# Every exception class, as errors.py lists them.
__all__ += errors.__all__
