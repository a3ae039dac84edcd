"""Sessions: a client's calls under one ``session`` id, and the daemon's session
workspaces (``session_open``): files kept across calls, written and read from outside."""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .errors import SessionUnknown
from .types import (
    Approval,
    CallResult,
    Change,
    SessionInfo,
    SessionSettings,
    StateChange,
    ToolListing,
    ToolState,
)

if TYPE_CHECKING:
    from .client import Client


class Session:
    """A client's calls under one ``session`` id.

    :meth:`Client.open_session` returns one for a workspace the daemon opened (``info``
    says what it was opened with): its calls see the session's files at their profile's
    ``workspace``, and :meth:`put_file`, :meth:`get_file` and :meth:`changes` reach them
    from outside. :meth:`Client.session` returns one for a name of your own, which only
    labels calls (the daemon's rate limits and audit log count calls by it); its file ops
    raise :class:`~airlock_client.SessionUnknown`.

    ``async with`` closes the session on the way out (a session that is already gone —
    closed, or expired on the daemon's idle timeout or at its ``max_lifetime`` — is no
    error there).
    """

    def __init__(self, client: Client, name: str, info: SessionInfo | None = None) -> None:
        # Imported here: the client module imports this one.
        from .client import _short_text

        self.client = client
        self.name = _short_text("session", name)
        self.info = info
        """The ``session_open`` answer; None for a name of your own."""

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self.close()
        except SessionUnknown:
            pass  # closed already, or expired: either way its files are gone

    async def call(
        self,
        tool: str,
        arguments: Any = None,
        *,
        arguments_json: str | None = None,
        call_id: str | None = None,
        timeout_ms: int | None = None,
        plan_mode: bool | None = None,
        cancel: asyncio.Event | None = None,
    ) -> CallResult:
        """:meth:`Client.call` in this session. In a session that is gone, a tool with a
        workspace answers, like every refused call, a result record of kind
        ``session_unknown``."""
        return await self.client.call(
            tool,
            arguments,
            arguments_json=arguments_json,
            session=self.name,
            call_id=call_id,
            timeout_ms=timeout_ms,
            plan_mode=plan_mode,
            cancel=cancel,
        )

    async def propose(
        self,
        tool: str,
        arguments: Any = None,
        *,
        arguments_json: str | None = None,
        call_id: str | None = None,
        plan_mode: bool | None = None,
    ) -> Approval | CallResult:
        """:meth:`Client.propose` in this session."""
        return await self.client.propose(
            tool,
            arguments,
            arguments_json=arguments_json,
            session=self.name,
            call_id=call_id,
            plan_mode=plan_mode,
        )

    async def execute(self, approval_id: str, *, cancel: asyncio.Event | None = None) -> CallResult:
        """:meth:`Client.execute` in this session."""
        return await self.client.execute(approval_id, session=self.name, cancel=cancel)

    async def put_file(self, path: str, content: bytes | str) -> int:
        """:meth:`Client.put_file` in this session."""
        return await self.client.put_file(self.name, path, content)

    async def get_file(self, path: str) -> bytes:
        """:meth:`Client.get_file` in this session."""
        return await self.client.get_file(self.name, path)

    async def changes(self) -> list[Change]:
        """:meth:`Client.changes` of this session."""
        return await self.client.changes(self.name)

    async def set_state(self, tool: str, state: ToolState) -> StateChange:
        """:meth:`Client.set_state` for this session's calls only: it wins over the
        daemon-wide state, no other session sees it, and it goes when the session closes."""
        return await self.client.set_state(tool, state, session=self.name)

    async def set_plan_mode(self, plan_mode: bool) -> SessionSettings:
        """:meth:`Client.set_plan_mode` of this session: lifting it is an approver's op."""
        return await self.client.set_plan_mode(self.name, plan_mode)

    async def tools(self) -> list[ToolListing]:
        """:meth:`Client.tools` with the states this session's calls see."""
        return await self.client.tools(session=self.name)

    async def close(self) -> None:
        """:meth:`Client.close_session`: the daemon removes the session's files."""
        await self.client.close_session(self.name)
