"""What the client raises.

A tool call's own failures — invalid input, a denial, a timeout, a cancel, an overloaded
daemon — are never raised: they come back as a :class:`~airlock_client.CallResult` whose
``error`` says why. What is raised is what keeps the client from getting a result at all:

- :class:`TransportError`: no usable connection (:class:`DaemonUnavailable` when
  connecting failed every bounded attempt, :class:`ConnectionLost` for a request in
  flight when the connection dropped, :class:`ClientClosed` after ``close()``) or an
  answer that breaks the contract (:class:`ProtocolError`);
- :class:`ProtocolMismatch`: the daemon speaks another version of the wire contract;
- :class:`RequestError`: the daemon refused the request itself — ``invalid_request``
  (a bug in the client or a field it does not know), ``forbidden`` (this peer may not
  connect, or may not approve), ``unknown_tool`` (``set_state`` of no such tool),
  ``overloaded`` (a connection beyond the daemon's limits), and the session ops' refusals
  ``workspace_full``, ``session_unknown``, ``session_limit``, ``sandbox_unavailable``.
"""

from __future__ import annotations

from typing import Any


class AirlockError(Exception):
    """Base of everything this package raises."""


class TransportError(AirlockError):
    """The connection to the daemon is unusable, or the daemon broke the contract."""


class DaemonUnavailable(TransportError):
    """Connecting to the daemon failed, every one of the bounded attempts."""


class ConnectionLost(TransportError):
    """The connection dropped while the request was in flight.

    Whether a call ran is unknown: the daemon cancels the calls of a connection that goes
    away, but one may have finished first. The client never retries such a call on its
    own; the next request reconnects.
    """

    def __init__(self, message: str, refusal: RequestError | None = None) -> None:
        super().__init__(message)
        self.refusal = refusal
        """The daemon's last word before it closed the connection, if it said one."""


class ClientClosed(TransportError):
    """The client was closed."""


class ProtocolError(TransportError):
    """An answer that does not follow the daemon's contract."""


class AnswerTooLarge(ProtocolError):
    """An answer line longer than the client's ``max_answer_bytes``.

    When the line begins with its id (the daemon's answers do) only the request it answers
    fails and the rest of the line is skipped; otherwise there is no telling whose answer
    it is, every request in flight fails and the connection is dropped.
    """

    def __init__(self, message: str, limit: int) -> None:
        super().__init__(message)
        self.limit = limit
        """The ``max_answer_bytes`` the answer was longer than."""


class ProtocolMismatch(AirlockError):
    """The daemon speaks a version of the wire contract this client was not written for."""

    def __init__(self, expected: int, actual: Any, daemon_version: str | None = None) -> None:
        daemon = f"airlock serve {daemon_version}" if daemon_version else "airlock serve"
        if actual is None:
            said = f"{daemon} does not say its protocol_version (a release before version 1?)"
        else:
            said = f"{daemon} speaks protocol_version {actual!r}"
        super().__init__(
            f"{said}; this airlock-client speaks protocol_version {expected}: "
            "use a client and a daemon written for the same version"
        )
        self.expected = expected
        self.actual = actual
        self.daemon_version = daemon_version


class RequestError(AirlockError):
    """The daemon refused the request (its answer carried ``error``, not ``result``)."""

    def __init__(self, kind: str, message: str, retry_after_ms: int | None = None) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message
        self.retry_after_ms = retry_after_ms

    @staticmethod
    def from_json(error: dict[str, Any]) -> RequestError:
        """The typed refusal for an answer's ``error`` object."""
        kind = str(error.get("kind"))
        message = str(error.get("message", ""))
        retry = error.get("retry_after_ms")
        cls = _REFUSALS.get(kind, RequestError)
        return cls(kind, message, retry if isinstance(retry, int) else None)


class InvalidRequest(RequestError):
    """``invalid_request``: the daemon could not read the request; nothing ran."""


class Forbidden(RequestError):
    """``forbidden``: this peer may not connect, or may not execute, reject or set_state."""


class UnknownTool(RequestError):
    """``unknown_tool``: ``set_state`` named no tool of the policy."""


class Overloaded(RequestError):
    """``overloaded`` for a whole connection (too many connections, or too many bytes of
    unfinished requests); the daemon closes the connection after saying it."""


class WorkspaceFull(RequestError):
    """``workspace_full``: the session's workspace has no room for the file."""


class SessionUnknown(RequestError):
    """``session_unknown``: no open session has this id (never opened, closed, expired)."""


class SessionLimit(RequestError):
    """``session_limit``: as many sessions are open as the policy allows."""


class SandboxUnavailable(RequestError):
    """``sandbox_unavailable``: the daemon's session storage failed."""


_REFUSALS: dict[str, type[RequestError]] = {
    "invalid_request": InvalidRequest,
    "forbidden": Forbidden,
    "unknown_tool": UnknownTool,
    "overloaded": Overloaded,
    "workspace_full": WorkspaceFull,
    "session_unknown": SessionUnknown,
    "session_limit": SessionLimit,
    "sandbox_unavailable": SandboxUnavailable,
}
