"""The asyncio client for ``airlock serve``'s JSON-lines socket.

One :class:`Client` holds one connection and multiplexes every request over it: each gets
a fresh integer ``id`` and its answer is matched by that id, so any number of calls may be
in flight at once. See the package's README for the error model and the retry rules.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import itertools
import json
import logging
import os
import re
from collections.abc import Generator, Iterator, Mapping
from types import TracebackType
from typing import Any, Literal, overload

from .errors import (
    AirlockError,
    AnswerTooLarge,
    ClientClosed,
    ConnectionLost,
    DaemonUnavailable,
    Forbidden,
    Overloaded,
    ProtocolError,
    ProtocolMismatch,
    RequestError,
    TransportError,
)
from .session import Session
from .types import (
    Approval,
    CallResult,
    Change,
    DryRun,
    Health,
    SessionInfo,
    SessionSettings,
    StateChange,
    Stats,
    ToolListing,
    ToolState,
)

PROTOCOL_VERSION = 1
"""The version of the daemon's wire contract this package was written for."""

MAX_REQUEST_BYTES = 2 << 20
"""The daemon's longest request line; it refuses a longer one without saying which."""

MAX_ID_BYTES = 256
"""The longest ``call_id`` or ``session``, in bytes of UTF-8."""

DEFAULT_MAX_ANSWER_BYTES = 256 << 20
"""The longest answer line read by default (``max_answer_bytes``): 256 MiB, as in the
TypeScript client. A result record carries stdout and stderr, each up to the policy's
``limits.output`` (at most 4 MiB), as JSON strings, where a control byte takes six bytes
(``\\u0000``): even the worst case at the largest limit (about 50 MiB) fits."""

_ID_HEAD_BYTES = 512
"""Bytes at the start of an answer line searched for its id: ``{"id":`` and 256 of id."""

_LEADING_ID = re.compile(rb'\s*\{\s*"id"\s*:\s*("(?:[^"\\\x00-\x1f]|\\.)*"|-?[0-9]+)\s*[,}]')

_STATES = ("active", "deferred", "suspended")

log = logging.getLogger("airlock_client")


class RequestTooLarge(AirlockError, ValueError):
    """A request line longer than the daemon reads (``MAX_REQUEST_BYTES``); not sent."""


def _short_text(name: str, value: object) -> str:
    """``call_id`` and ``session`` as the daemon takes them: 1-256 bytes, no control
    characters. Checked here so that a bad one is a ValueError for the caller instead of an
    ``invalid_request`` that looks like a bug in the client."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    size = len(value.encode("utf-8", "surrogatepass"))
    if not 1 <= size <= MAX_ID_BYTES or any(
        ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in value
    ):
        raise ValueError(f"{name} must be 1 to {MAX_ID_BYTES} bytes without control characters")
    return value


def _encode(body: Mapping[str, Any]) -> bytes:
    """A request's JSON text, without its id (added by :func:`_with_id`)."""
    text = json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    line = text.encode("utf-8")
    # 32 bytes: `"id":<integer>,` and the newline.
    if len(line) + 32 > MAX_REQUEST_BYTES:
        raise RequestTooLarge(
            f"the request is {len(line)} bytes of JSON; the daemon reads lines of at most "
            f"{MAX_REQUEST_BYTES} bytes"
        )
    return line


def _with_id(rid: int, body: bytes) -> bytes:
    """The request line: ``body`` (a JSON object's text) with ``"id"`` put first."""
    if body == b"{}":
        return b'{"id":%d}\n' % rid
    return b'{"id":%d,%s\n' % (rid, body[1:])


def _leading_id(head: bytes) -> int | str | None:
    """The id an answer line begins with (the daemon writes ``id`` first in every answer
    with a ``result``); None when it does not begin with one."""
    match = _LEADING_ID.match(head)
    if match is None:
        return None
    try:
        rid = json.loads(match.group(1))
    except ValueError:
        return None
    return rid if isinstance(rid, (int, str)) else None


def _consume(future: asyncio.Future[Any]) -> None:
    """Marks a future's exception as seen: an abandoned request's failure is no news."""
    if not future.cancelled():
        future.exception()


class _Connection(asyncio.Protocol):
    """One socket. Request lines are written as they come; each answer line is handed, as
    it is read, to the future of its id. When the socket fails, every request in flight
    fails with it at once: nothing waits for an answer that cannot come."""

    def __init__(self, ids: Iterator[int], max_answer_bytes: int) -> None:
        self._ids = ids
        self._limit = max_answer_bytes
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._scanned = 0  # bytes of the buffer known to hold no newline
        self._skipping = False  # discarding the rest of an answer too long to read
        self._paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        # Answers whose future was cancelled (its task was) before they came: kept for
        # the cancelled task, which still wants to know how its call ended.
        self.orphans: dict[int, dict[str, Any]] = {}
        self.refusal: RequestError | None = None
        self._lost: tuple[type[TransportError], str] | None = None

    @property
    def closed(self) -> bool:
        return self._lost is not None

    def _error(self) -> TransportError:
        kind, message = self._lost or (ConnectionLost, "the connection is closed")
        if kind is ConnectionLost:
            return ConnectionLost(message, self.refusal)
        if kind is AnswerTooLarge:
            return AnswerTooLarge(message, self._limit)
        return kind(message)

    def expect(self, rid: int) -> asyncio.Future[dict[str, Any]]:
        """A future for the answer to request ``rid``."""
        if self._lost is not None:
            raise self._error()
        future: asyncio.Future[dict[str, Any]] = self._loop.create_future()
        future.add_done_callback(_consume)
        self.pending[rid] = future
        return future

    def send(self, rid: int, line: bytes) -> asyncio.Future[dict[str, Any]]:
        """Writes one request line; its answer will be the future's result."""
        future = self.expect(rid)
        assert self._transport is not None
        self._transport.write(line)
        return future

    async def drain(self) -> None:
        """Waits while the socket's send buffer is full."""
        if self._paused and self._lost is None:
            waiter: asyncio.Future[None] = self._loop.create_future()
            self._drain_waiters.append(waiter)
            await waiter

    def cancel(self, target: int) -> None:
        """Sends the daemon's ``cancel`` op for request ``target``; its own answer
        (``{"cancelled": bool}``) is not waited for: the target's answer says the rest."""
        if self._lost is None:
            rid = next(self._ids)
            self.send(rid, _with_id(rid, _encode({"op": "cancel", "target": target})))

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        if self._skipping:
            end = data.find(b"\n")
            if end < 0:
                return
            self._skipping = False
            data = data[end + 1 :]
        buffer = self._buffer
        buffer += data
        start = 0
        while (end := buffer.find(b"\n", self._scanned)) >= 0:
            # A complete line is held to the limit as an unfinished one is: a line too long
            # is never parsed, however it came.
            too_long = end - start > self._limit
            line = bytes(buffer[start : start + _ID_HEAD_BYTES] if too_long else buffer[start:end])
            start = self._scanned = end + 1
            if not (self._too_long(line) if too_long else self._answer(line)):
                return
        if start:
            del buffer[:start]
        self._scanned = len(buffer)
        if len(buffer) > self._limit:
            head = bytes(buffer[:_ID_HEAD_BYTES])
            buffer.clear()
            self._scanned = 0
            self._skipping = self._too_long(head)

    def _too_long(self, head: bytes) -> bool:
        """An answer longer than the limit, of which ``head`` is the start: fails the
        request whose id it begins with and says to skip the rest of the line (True), or,
        with no id to read, drops the connection (False)."""
        rid = _leading_id(head)
        if rid is None:
            # No telling whose answer this is: skipping it would leave its request waiting
            # for ever (a call has no deadline of its own here), so every request fails.
            self._abort(
                AnswerTooLarge,
                f"the daemon sent an answer longer than {self._limit} bytes "
                "(max_answer_bytes) that does not begin with its id: every request in "
                "flight failed and the connection was dropped",
            )
            return False
        if not isinstance(rid, int) or (future := self.pending.pop(rid, None)) is None:
            log.debug("skipped an answer too long to read for no request in flight: id %r", rid)
        elif future.cancelled():
            self.orphans[rid] = {"id": rid}  # answered, if unreadably: nothing to wait for
        elif not future.done():
            future.set_exception(
                AnswerTooLarge(
                    f"the daemon's answer is longer than {self._limit} bytes "
                    "(max_answer_bytes): raise max_answer_bytes, or lower the policy's "
                    "limits.output",
                    self._limit,
                )
            )
        return True

    def _answer(self, line: bytes) -> bool:
        try:
            answer = json.loads(line)
        except ValueError as e:
            self._abort(ProtocolError, f"the daemon sent a line that is not JSON: {e}")
            return False
        if not isinstance(answer, dict):
            self._abort(ProtocolError, "the daemon sent a line that is not an object")
            return False
        rid = answer.get("id")
        if type(rid) is int and (future := self.pending.pop(rid, None)) is not None:
            if future.cancelled():
                self.orphans[rid] = answer
            elif not future.done():
                future.set_result(answer)
        elif rid is None and isinstance(answer.get("error"), dict):
            # A refusal of the whole connection (forbidden, overloaded): the daemon closes
            # it next, and the requests in flight fail saying why.
            self.refusal = RequestError.from_json(answer["error"])
            log.warning("airlock serve refused the connection: %s", self.refusal)
        else:
            log.debug("ignored an answer to no request in flight: id %r", rid)
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is None:
            message = "the daemon closed the connection"
        else:
            message = f"the connection to the daemon failed: {exc}"
        if self.refusal is not None:
            message = f"{message} after refusing it: {self.refusal}"
        self._fail(ConnectionLost, message)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._wake_drainers()

    # ending

    def _wake_drainers(self) -> None:
        waiters, self._drain_waiters = self._drain_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _fail(self, kind: type[TransportError], message: str) -> None:
        if self._lost is None:
            self._lost = (kind, message)
        pending, self.pending = self.pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(self._error())
        self._wake_drainers()

    def _abort(self, kind: type[TransportError], message: str) -> None:
        self._fail(kind, message)
        if self._transport is not None:
            self._transport.abort()

    def close(self) -> None:
        self._fail(ClientClosed, "the client was closed")
        if self._transport is not None:
            self._transport.close()


class _Connecting:
    """What :meth:`Client.connect` returns: await it for the client, or use it in
    ``async with`` to have the client closed at the end."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def __await__(self) -> Generator[Any, None, Client]:
        return self._open().__await__()

    async def _open(self) -> Client:
        try:
            await self._client._connection()
        except BaseException:
            await self._client.close()
            raise
        return self._client

    async def __aenter__(self) -> Client:
        return await self._open()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._client.close()


class Client:
    """A connection to ``airlock serve``, shared by any number of concurrent requests.

    Construct it with :meth:`connect`. Options (keywords):

    - ``timeout`` (seconds, 10): one connection attempt, its ``health`` handshake included.
    - ``reconnect_attempts`` (5), ``reconnect_delay`` (0.05 s), ``reconnect_max_delay``
      (1 s): connecting, at first and whenever a request finds the connection gone, tries
      this many times, waiting ``reconnect_delay`` doubled each time up to the maximum (or
      the daemon's ``retry_after_ms`` when it said ``overloaded``), then raises
      :class:`DaemonUnavailable`. Requests waiting meanwhile share the attempts.
    - ``overload_retries`` (5): a call or execute answered ``overloaded`` with
      ``retry_after_ms`` is sent again after that wait, at most this many times; the last
      ``overloaded`` result is returned after that. 0 turns retrying off. Nothing ran
      for an ``overloaded`` call, so retrying it is always safe.
    - ``cancel_grace`` (30 s): how long a cancelled call (its ``cancel`` event set, or its
      task cancelled) waits for the daemon to answer the cancel before it gives up waiting.
    - ``max_answer_bytes`` (``DEFAULT_MAX_ANSWER_BYTES``, 256 MiB): the longest answer
      line read. A longer one fails the request it answers with :class:`AnswerTooLarge`
      and the connection goes on (see :data:`DEFAULT_MAX_ANSWER_BYTES` for the size).

    Not thread-safe: use it from one event loop.
    """

    def __init__(
        self,
        socket_path: str | os.PathLike[str],
        *,
        timeout: float = 10.0,
        reconnect_attempts: int = 5,
        reconnect_delay: float = 0.05,
        reconnect_max_delay: float = 1.0,
        overload_retries: int = 5,
        cancel_grace: float = 30.0,
        max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
    ) -> None:
        self.socket_path = os.fspath(socket_path)
        self.timeout = timeout
        self.reconnect_attempts = max(1, reconnect_attempts)
        self.reconnect_delay = reconnect_delay
        self.reconnect_max_delay = reconnect_max_delay
        self.overload_retries = max(0, overload_retries)
        self.cancel_grace = cancel_grace
        self.max_answer_bytes = max_answer_bytes
        self.daemon_health: Health | None = None
        """The ``health`` answer of the current connection's handshake."""
        self._ids = itertools.count(1)
        self._conn: _Connection | None = None
        self._connecting: asyncio.Task[_Connection] | None = None
        self._closed = False

    @classmethod
    def connect(
        cls,
        socket_path: str | os.PathLike[str],
        *,
        timeout: float = 10.0,
        reconnect_attempts: int = 5,
        reconnect_delay: float = 0.05,
        reconnect_max_delay: float = 1.0,
        overload_retries: int = 5,
        cancel_grace: float = 30.0,
        max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
    ) -> _Connecting:
        """Connects, sends ``health`` and checks its ``protocol_version``.

        ``client = await Client.connect(path)`` or ``async with Client.connect(path) as
        client:`` (``async with await Client.connect(path) as client:`` works too).
        Raises :class:`ProtocolMismatch`, :class:`Forbidden` or :class:`DaemonUnavailable`.
        """
        client = cls(
            socket_path,
            timeout=timeout,
            reconnect_attempts=reconnect_attempts,
            reconnect_delay=reconnect_delay,
            reconnect_max_delay=reconnect_max_delay,
            overload_retries=overload_retries,
            cancel_grace=cancel_grace,
            max_answer_bytes=max_answer_bytes,
        )
        return _Connecting(client)

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def connected(self) -> bool:
        """Whether the client holds a live connection (the next request needs none made)."""
        return self._conn is not None and not self._conn.closed

    async def close(self) -> None:
        """Closes the connection; requests in flight fail with :class:`ClientClosed` (the
        daemon cancels their calls). Later requests raise :class:`ClientClosed`."""
        self._closed = True
        if self._connecting is not None:
            self._connecting.cancel()
        if self._conn is not None:
            self._conn.close()

    # --- connecting -------------------------------------------------------------------

    async def _connection(self) -> _Connection:
        conn = self._conn
        if conn is not None and not conn.closed:
            return conn
        if self._closed:
            raise ClientClosed("the client is closed")
        task = self._connecting
        if task is None:
            task = asyncio.get_running_loop().create_task(self._connect_with_retries())
            task.add_done_callback(self._connect_done)
            self._connecting = task
        # Shielded: one caller's cancel does not end the attempts the others wait on.
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled() and self._closed:
                raise ClientClosed("the client was closed while connecting") from None
            raise

    def _connect_done(self, task: asyncio.Task[_Connection]) -> None:
        if self._connecting is task:
            self._connecting = None
        if not task.cancelled():
            task.exception()

    async def _connect_with_retries(self) -> _Connection:
        delay = self.reconnect_delay
        wait = 0.0
        last: BaseException | None = None
        for attempt in range(self.reconnect_attempts):
            if attempt:
                await asyncio.sleep(wait)
            try:
                conn = await self._open()
            except (ProtocolMismatch, Forbidden):
                raise
            except Overloaded as e:
                last = e
                wait = max(delay, (e.retry_after_ms or 0) / 1000)
            except (OSError, TimeoutError, TransportError, RequestError) as e:
                last = e
                wait = delay
            else:
                if self._closed:
                    conn.close()
                    raise ClientClosed("the client is closed")
                self._conn = conn
                return conn
            delay = min(delay * 2, self.reconnect_max_delay)
        raise DaemonUnavailable(
            f"cannot reach airlock serve at {self.socket_path} "
            f"({self.reconnect_attempts} attempts): {last}"
        ) from last

    async def _open(self) -> _Connection:
        """One attempt: connect and check the daemon's protocol version."""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.timeout):
            _, conn = await loop.create_unix_connection(
                lambda: _Connection(self._ids, self.max_answer_bytes), self.socket_path
            )
            try:
                rid = next(self._ids)
                future = conn.send(rid, _with_id(rid, _encode({"op": "health"})))
                try:
                    answer = await future
                except ConnectionLost as e:
                    if e.refusal is not None:
                        raise e.refusal from e
                    raise
                result = _result_of(answer)
                # Checked before the rest of the answer is read: a daemon of another
                # version may answer health with other fields too.
                version = result.get("protocol_version") if isinstance(result, dict) else None
                if type(version) is not int or version != PROTOCOL_VERSION:
                    release = result.get("version") if isinstance(result, dict) else None
                    raise ProtocolMismatch(
                        PROTOCOL_VERSION, version, release if isinstance(release, str) else None
                    )
                health = Health.from_json(result)
            except BaseException:
                conn.close()
                raise
        self.daemon_health = health
        return conn

    # --- one request ------------------------------------------------------------------

    async def _roundtrip(self, body: Mapping[str, Any]) -> Any:
        """Sends a request that is not a call and returns its answer's ``result``."""
        line = _encode(body)
        conn = await self._connection()
        rid = next(self._ids)
        future = conn.send(rid, _with_id(rid, line))
        try:
            await conn.drain()
            answer = await future
        finally:
            conn.pending.pop(rid, None)
            conn.orphans.pop(rid, None)
        return _result_of(answer)

    async def _connection_unless(self, cancel: asyncio.Event) -> _Connection | None:
        """The connection, or None when ``cancel`` is set first (the attempts go on for
        the other requests waiting on them)."""
        connecting = asyncio.ensure_future(self._connection())
        waiter = asyncio.ensure_future(cancel.wait())
        try:
            await asyncio.wait((connecting, waiter), return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            if not connecting.done():
                # Only this wait ends: the attempts it shared are shielded.
                connecting.cancel()
                connecting.add_done_callback(_consume)
        if not connecting.done():
            return None
        return connecting.result()

    async def _call_once(
        self, line: bytes, cancel: asyncio.Event | None, call_id: str, tool: str
    ) -> Any:
        """Sends one call or execute; cancels it through the daemon when ``cancel`` is set
        or the awaiting task is cancelled. ``cancel`` set before the call was sent sends
        nothing; set after, the daemon's answer is waited for at most ``cancel_grace``.
        ``call_id`` and ``tool`` name the call in a record made here."""
        if cancel is None:
            conn = await self._connection()
        elif cancel.is_set():
            return _cancelled(call_id, tool, "cancelled before it was sent to the daemon")
        elif (maybe := await self._connection_unless(cancel)) is None:
            return _cancelled(call_id, tool, "cancelled while connecting to the daemon")
        else:
            conn = maybe
        rid = next(self._ids)
        future = conn.send(rid, _with_id(rid, line))
        try:
            await conn.drain()
            if cancel is not None and not future.done():
                waiter = asyncio.ensure_future(cancel.wait())
                try:
                    await asyncio.wait((future, waiter), return_when=asyncio.FIRST_COMPLETED)
                finally:
                    waiter.cancel()
                if not future.done():
                    conn.cancel(rid)
                    await asyncio.wait((future,), timeout=self.cancel_grace)
                    if not future.done():
                        return _cancelled(
                            call_id,
                            tool,
                            f"the daemon did not answer the cancel within {self.cancel_grace} s: "
                            "the call may still be running",
                        )
            answer = await future
        except asyncio.CancelledError:
            # The task was cancelled (which cancelled the future it awaited): have the
            # daemon kill the call's processes and wait for it to say so, so that a
            # cancelled task leaves nothing running; then let the cancellation go on.
            if rid not in conn.orphans and not conn.closed:
                if future.cancelled():
                    future = conn.expect(rid)
                if not future.done():
                    conn.cancel(rid)
                    await asyncio.wait((future,), timeout=self.cancel_grace)
            raise
        finally:
            conn.pending.pop(rid, None)
            conn.orphans.pop(rid, None)
        return _result_of(answer)

    async def _call_with_retries(
        self, line: bytes, cancel: asyncio.Event | None, call_id: str, tool: str
    ) -> Any:
        retries = 0
        while True:
            result = await self._call_once(line, cancel, call_id, tool)
            wait = _overloaded_wait(result)
            if wait is None or retries >= self.overload_retries:
                return result
            retries += 1
            log.debug("airlock serve is overloaded; retrying in %.3f s", wait)
            if cancel is None:
                await asyncio.sleep(wait)
                continue
            try:
                await asyncio.wait_for(cancel.wait(), wait)
            except TimeoutError:
                continue
            # Cancelled while waiting to retry: nothing ran, and a cancelled call says so.
            return _cancelled(
                _text_of(result, "call_id", call_id),
                _text_of(result, "tool", tool),
                "cancelled while waiting to retry an overloaded daemon",
            )

    # --- the ops ----------------------------------------------------------------------

    async def health(self) -> Health:
        """``health``: airlock's release, the protocol and policy versions."""
        return Health.from_json(await self._roundtrip({"op": "health"}))

    async def stats(self) -> Stats:
        """``stats``: the daemon's counters and limits."""
        return Stats.from_json(await self._roundtrip({"op": "stats"}))

    async def tools(self, *, session: str | None = None) -> list[ToolListing]:
        """``tools``: every tool of the policy with its state and schemas; with
        ``session``, the states calls in that open session see (its own
        :meth:`set_state` over the daemon-wide one)."""
        body: dict[str, Any] = {"op": "tools"}
        if session is not None:
            body["session"] = _short_text("session", session)
        result = await self._roundtrip(body)
        if not isinstance(result, dict) or not isinstance(result.get("tools"), list):
            raise ProtocolError(f"the tools answer has no list of tools: {result!r:.200}")
        return [ToolListing.from_json(t) for t in result["tools"]]

    @overload
    async def call(
        self,
        tool: str,
        arguments: Any = None,
        *,
        arguments_json: str | None = None,
        session: str | None = None,
        call_id: str | None = None,
        timeout_ms: int | None = None,
        plan_mode: bool | None = None,
        dry_run: Literal[False] = False,
        cancel: asyncio.Event | None = None,
    ) -> CallResult: ...

    @overload
    async def call(
        self,
        tool: str,
        arguments: Any = None,
        *,
        arguments_json: str | None = None,
        session: str | None = None,
        call_id: str | None = None,
        timeout_ms: int | None = None,
        plan_mode: bool | None = None,
        dry_run: Literal[True],
        cancel: asyncio.Event | None = None,
    ) -> DryRun | CallResult: ...

    @overload
    async def call(
        self,
        tool: str,
        arguments: Any = None,
        *,
        arguments_json: str | None = None,
        session: str | None = None,
        call_id: str | None = None,
        timeout_ms: int | None = None,
        plan_mode: bool | None = None,
        dry_run: bool,
        cancel: asyncio.Event | None = None,
    ) -> CallResult | DryRun: ...

    async def call(
        self,
        tool: str,
        arguments: Any = None,
        *,
        arguments_json: str | None = None,
        session: str | None = None,
        call_id: str | None = None,
        timeout_ms: int | None = None,
        plan_mode: bool | None = None,
        dry_run: bool = False,
        cancel: asyncio.Event | None = None,
    ) -> CallResult | DryRun:
        """``call``: runs ``tool`` and returns its result record, whatever happened.

        ``arguments`` is any JSON value (None sends none: the daemon takes ``{}``), or
        give ``arguments_json`` as text. A failed, refused, timed-out or cancelled call is
        a :class:`CallResult` with ``ok`` false and ``error`` saying why; only transport
        and protocol problems raise. Setting ``cancel``, or cancelling the awaiting task,
        sends the daemon's ``cancel`` for this call: with ``cancel`` the call returns the
        daemon's answer (``error.kind == "cancelled"``, or the result if it finished
        first), or after ``cancel_grace`` without one a ``cancelled`` record saying so; an
        event set before the call was sent (or while connecting, or while waiting to retry)
        sends nothing more and returns a ``cancelled`` record with ``attempts`` 0. A
        cancelled task waits for that answer (at most ``cancel_grace``) and then raises
        ``CancelledError`` as asyncio expects. ``overloaded`` answers are retried after
        their ``retry_after_ms`` (see ``overload_retries``).

        ``dry_run=True`` returns a :class:`DryRun` saying what would run, or the result
        record of a call refused before deciding (unknown tool, invalid input).
        """
        body = _call_body("call", tool, arguments, arguments_json, session, call_id, plan_mode)
        if timeout_ms is not None:
            if type(timeout_ms) is not int or timeout_ms < 1:
                raise ValueError("timeout_ms must be an int of at least 1")
            body["timeout_ms"] = timeout_ms
        if dry_run:
            body["dry_run"] = True
            result = await self._call_once(_encode(body), cancel, call_id or "", tool)
            if isinstance(result, dict) and "dry_run" in result:
                return DryRun.from_json(result["dry_run"])
            return CallResult.from_json(result)
        line = _encode(body)
        return CallResult.from_json(await self._call_with_retries(line, cancel, call_id or "", tool))

    async def propose(
        self,
        tool: str,
        arguments: Any = None,
        *,
        arguments_json: str | None = None,
        session: str | None = None,
        call_id: str | None = None,
        plan_mode: bool | None = None,
    ) -> Approval | CallResult:
        """``propose``: stores an approval for a call that needs a human and returns it
        (exactly what :meth:`execute` will run), or the result record of a refusal."""
        body = _call_body("propose", tool, arguments, arguments_json, session, call_id, plan_mode)
        result = await self._roundtrip(body)
        if isinstance(result, dict) and "approval" in result:
            return Approval.from_json(result["approval"])
        return CallResult.from_json(result)

    async def execute(
        self,
        approval_id: str,
        *,
        session: str | None = None,
        cancel: asyncio.Event | None = None,
    ) -> CallResult:
        """``execute``: runs an approval once and returns its result record
        (``approval_invalid`` when it expired, was used or rejected, or belongs to another
        session). Cancelling and ``overloaded`` retries work as for :meth:`call`."""
        body: dict[str, Any] = {"op": "execute", "approval_id": _str("approval_id", approval_id)}
        if session is not None:
            body["session"] = _short_text("session", session)
        return CallResult.from_json(await self._call_with_retries(_encode(body), cancel, "", ""))

    async def reject(self, approval_id: str) -> bool:
        """``reject``: deletes a pending approval; whether it existed."""
        body = {"op": "reject", "approval_id": _str("approval_id", approval_id)}
        result = await self._roundtrip(body)
        existed = result.get("existed") if isinstance(result, dict) else None
        if not isinstance(existed, bool):
            raise ProtocolError(f"the reject answer has no existed flag: {result!r:.200}")
        return existed

    async def set_state(
        self, tool: str, state: ToolState, *, session: str | None = None
    ) -> StateChange:
        """``set_state``: makes a tool ``active``, ``deferred`` or ``suspended``:
        daemon-wide, or with ``session`` for the calls in that open session only (its
        state wins over the daemon-wide one until the session closes). Raises
        :class:`~airlock_client.UnknownTool` for no such tool,
        :class:`~airlock_client.SessionUnknown` for a session that is not open and
        :class:`~airlock_client.Forbidden` for a peer that may not approve."""
        if state not in _STATES:
            raise ValueError(f"state must be one of {', '.join(_STATES)}, not {state!r}")
        body = {"op": "set_state", "tool": _str("tool", tool), "state": state}
        if session is not None:
            body["session"] = _short_text("session", session)
        return StateChange.from_json(await self._roundtrip(body))

    async def request(self, request: Mapping[str, Any]) -> Any:
        """Sends any request object (without ``id``: the client adds its own) and returns
        its answer's ``result`` as parsed JSON; raises :class:`RequestError` for a refusal.
        For ops this package does not wrap yet. Not for calls: they are not cancelled
        with the task that awaits them."""
        if "id" in request:
            raise ValueError("the client gives every request its own id")
        return await self._roundtrip(request)

    def session(self, name: str) -> Session:
        """A view of this client whose calls, proposals and executions carry ``session``
        (what the daemon's rate limits and audit log count calls by). To reach a workspace
        of the daemon, name the id of an open session, or use :meth:`open_session`."""
        return Session(self, name)

    # --- session workspaces -----------------------------------------------------------

    async def open_session(
        self,
        *,
        base: str | None = None,
        size: int | str | None = None,
        plan_mode: bool | None = None,
    ) -> Session:
        """``session_open``: a workspace of files kept across calls, as a :class:`Session`.

        ``base``: a host directory under the policy's ``sessions.bases`` to start from a
        copy of; ``size``: the size limit, bytes or a size such as ``"64MiB"`` (default:
        the policy's); ``plan_mode``: every call in the session is in plan mode (only
        read-only tools run), which no call can lift. Raises :class:`~airlock_client.SessionLimit` when ``max_sessions``
        are open, :class:`~airlock_client.InvalidRequest` for a bad base or size."""
        body: dict[str, Any] = {"op": "session_open"}
        if base is not None:
            body["base"] = _str("base", base)
        if size is not None:
            if isinstance(size, bool) or not isinstance(size, (int, str)):
                raise TypeError(f"size must be an int or a str, not {type(size).__name__}")
            body["size"] = size
        if plan_mode is not None:
            if not isinstance(plan_mode, bool):
                raise TypeError("plan_mode must be a bool")
            body["plan_mode"] = plan_mode
        info = SessionInfo.from_json(await self._roundtrip(body))
        return Session(self, info.session, info)

    async def put_file(self, session: str, path: str, content: bytes | str) -> int:
        """``put_file``: writes ``content`` (a str as UTF-8) at ``path``, relative to the
        session's workspace, making parent directories; returns its size. Raises
        :class:`~airlock_client.WorkspaceFull` when it does not fit,
        :class:`~airlock_client.SessionUnknown` for no such open session."""
        data = content.encode("utf-8") if isinstance(content, str) else content
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"content must be bytes or a str, not {type(content).__name__}")
        body = {
            "op": "put_file",
            "session": _short_text("session", session),
            "path": _str("path", path),
            "content_base64": base64.b64encode(data).decode("ascii"),
        }
        result = await self._roundtrip(body)
        size = result.get("size") if isinstance(result, dict) else None
        if type(size) is not int:
            raise ProtocolError(f"the put_file answer has no size: {result!r:.200}")
        return size

    async def get_file(self, session: str, path: str) -> bytes:
        """``get_file``: the bytes of the file at ``path`` (at most 1 MiB)."""
        body = {
            "op": "get_file",
            "session": _short_text("session", session),
            "path": _str("path", path),
        }
        result = await self._roundtrip(body)
        encoded = result.get("content_base64") if isinstance(result, dict) else None
        if not isinstance(encoded, str):
            raise ProtocolError(f"the get_file answer has no content_base64: {result!r:.200}")
        try:
            return base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError) as e:
            raise ProtocolError(f"the get_file answer's content_base64 is not base64: {e}") from None

    async def changes(self, session: str) -> list[Change]:
        """``changes``: every path of the workspace that differs from its base (every
        file, without one), in path order."""
        body = {"op": "changes", "session": _short_text("session", session)}
        result = await self._roundtrip(body)
        changes = result.get("changes") if isinstance(result, dict) else None
        if not isinstance(changes, list):
            raise ProtocolError(f"the changes answer has no list of changes: {result!r:.200}")
        return [Change.from_json(c) for c in changes]

    async def set_plan_mode(self, session: str, plan_mode: bool) -> SessionSettings:
        """``session_set``: puts every call in the open ``session`` in plan mode
        (``True``), or lifts that (``False``), for the calls decided from then on. Anyone may
        put a session in plan mode; lifting it raises :class:`~airlock_client.Forbidden`
        unless this peer is one of the daemon's approvers (when it has any). Raises
        :class:`~airlock_client.SessionUnknown` for a session that is not open."""
        if not isinstance(plan_mode, bool):
            raise TypeError("plan_mode must be a bool")
        body = {
            "op": "session_set",
            "session": _short_text("session", session),
            "plan_mode": plan_mode,
        }
        return SessionSettings.from_json(await self._roundtrip(body))

    async def close_session(self, session: str) -> None:
        """``session_close``: closes the session and removes its files."""
        await self._roundtrip({"op": "session_close", "session": _short_text("session", session)})


def _str(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    return value


def _call_body(
    op: str,
    tool: str,
    arguments: Any,
    arguments_json: str | None,
    session: str | None,
    call_id: str | None,
    plan_mode: bool | None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"op": op, "tool": _str("tool", tool)}
    if arguments_json is not None:
        if arguments is not None:
            raise ValueError("give arguments or arguments_json, not both")
        body["arguments_json"] = _str("arguments_json", arguments_json)
    elif arguments is not None:
        body["arguments"] = arguments
    if call_id is not None:
        body["call_id"] = _short_text("call_id", call_id)
    if session is not None:
        body["session"] = _short_text("session", session)
    if plan_mode is not None:
        if not isinstance(plan_mode, bool):
            raise TypeError("plan_mode must be a bool")
        body["plan_mode"] = plan_mode
    return body


def _result_of(answer: dict[str, Any]) -> Any:
    """An answer's ``result``; its ``error`` raised as the typed refusal."""
    if "result" in answer:
        return answer["result"]
    error = answer.get("error")
    if isinstance(error, dict):
        raise RequestError.from_json(error)
    raise ProtocolError(f"an answer with neither result nor error: {answer!r:.200}")


def _cancelled(call_id: str, tool: str, message: str) -> dict[str, Any]:
    """A ``cancelled`` result record made by the client, for want of the daemon's: the call
    was never sent (``attempts`` 0), or the daemon did not answer its cancel."""
    return {
        "call_id": call_id,
        "tool": tool,
        "ok": False,
        "output": None,
        "error": {"kind": "cancelled", "message": message},
        "exit_code": None,
        "signal": None,
        "stdout": "",
        "stderr": "",
        "stdout_truncated": False,
        "stderr_truncated": False,
        "duration_ms": 0,
        "attempts": 0,
        "usage": {"cpu_ms": 0, "peak_memory_bytes": None},
        "isolation": None,
        "network": None,
        "denials": [],
    }


def _text_of(result: Any, key: str, default: str) -> str:
    value = result.get(key) if isinstance(result, dict) else None
    return value if isinstance(value, str) else default


def _overloaded_wait(result: Any) -> float | None:
    """Seconds to wait before retrying an ``overloaded`` result; None for any other."""
    if not isinstance(result, dict):
        return None
    error = result.get("error")
    if not isinstance(error, dict) or error.get("kind") != "overloaded":
        return None
    retry = error.get("retry_after_ms")
    if type(retry) is not int or retry < 0:
        return None  # shutting down: no retry would help
    return retry / 1000
