"""asyncio client for ``airlock serve``, the airlock tool-call gate on a Unix socket.

    async with Client.connect("/run/airlock.sock") as client:
        result = await client.call("word_count", {"text": "one two"})
        print(result.ok, result.stdout, result.error)

Standard library only. The wire contract is the daemon's (docs/daemon.md,
supervisor/src/daemon/protocol.schema.json); this package speaks
``PROTOCOL_VERSION`` 1 of it.
"""

from .client import (
    MAX_ID_BYTES,
    MAX_REQUEST_BYTES,
    PROTOCOL_VERSION,
    Client,
    RequestTooLarge,
    Session,
)
from .errors import (
    AirlockError,
    ClientClosed,
    ConnectionLost,
    DaemonUnavailable,
    Forbidden,
    InvalidRequest,
    Overloaded,
    ProtocolError,
    ProtocolMismatch,
    RequestError,
    SandboxUnavailable,
    SessionLimit,
    SessionUnknown,
    TransportError,
    UnknownTool,
    WorkspaceFull,
)
from .types import (
    Approval,
    ApprovalMode,
    CallResult,
    Decision,
    DryRun,
    ErrorKind,
    Health,
    Isolation,
    Limits,
    Network,
    NetworkEvent,
    SideEffect,
    StateChange,
    Stats,
    ToolError,
    ToolListing,
    ToolState,
    Usage,
    Violation,
)

__version__ = "0.1.0"

__all__ = [
    "MAX_ID_BYTES",
    "MAX_REQUEST_BYTES",
    "PROTOCOL_VERSION",
    "AirlockError",
    "Approval",
    "ApprovalMode",
    "CallResult",
    "Client",
    "ClientClosed",
    "ConnectionLost",
    "DaemonUnavailable",
    "Decision",
    "DryRun",
    "ErrorKind",
    "Forbidden",
    "Health",
    "InvalidRequest",
    "Isolation",
    "Limits",
    "Network",
    "NetworkEvent",
    "Overloaded",
    "ProtocolError",
    "ProtocolMismatch",
    "RequestError",
    "RequestTooLarge",
    "SandboxUnavailable",
    "Session",
    "SessionLimit",
    "SessionUnknown",
    "SideEffect",
    "StateChange",
    "Stats",
    "ToolError",
    "ToolListing",
    "ToolState",
    "TransportError",
    "UnknownTool",
    "Usage",
    "Violation",
    "WorkspaceFull",
]
