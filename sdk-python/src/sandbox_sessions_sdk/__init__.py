"""Python SDK for sandgate sandbox sessions.

- :class:`SessionsClient`: the REST API (create, list, get, delete sessions).
- :class:`SessionSSHClient`: SSH commands and SFTP in a session, with Paramiko,
  through the gateway's HTTP CONNECT tunnel; host keys pinned from the API.
- :class:`HTTPConnectTunnel`: the raw tunnel socket, for your own SSH client.

``api_url`` and ``bearer_token`` default to ``$SANDBOX_API_URL`` and
``$SANDBOX_API_TOKEN``. Every error is a :class:`SandboxAPIError`.
"""

from . import errors
from ._version import __version__
from .client import SessionsClient
from .errors import *  # noqa: F403 (the exception classes, errors.__all__)
from .models import CommandResult, Session
from .ssh import SessionSSHClient
from .tunnel import HTTPConnectTunnel

__all__ = [
    "__version__",
    "SessionsClient",
    "Session",
    "HTTPConnectTunnel",
    "SessionSSHClient",
    "CommandResult",
]
# Every exception class, as errors.py lists them.
__all__ += errors.__all__
