"""What a real daemon cannot be made to do: speak another protocol version, refuse this
peer, never answer, send garbage. A scripted server on a scratch socket plays it; it also
records every request line the client sends, checked against the daemon's schema."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from airlock_client import (
    DEFAULT_MAX_ANSWER_BYTES,
    AnswerTooLarge,
    Client,
    ConnectionLost,
    DaemonUnavailable,
    Forbidden,
    ProtocolError,
    ProtocolMismatch,
)
from helpers import SCHEMA

Answer = Callable[[dict[str, Any]], Awaitable[None]]
Handler = Callable[[dict[str, Any], Answer], Coroutine[Any, Any, None]]

HEALTH = {"ok": True, "version": "0.1.0", "protocol_version": 1, "policy_version": "p"}


def record(call_id: str = "c", tool: str = "t", **changes: Any) -> dict[str, Any]:
    """A result record as the daemon writes one for a call that never got a worker."""
    base: dict[str, Any] = {
        "call_id": call_id,
        "tool": tool,
        "ok": True,
        "output": None,
        "error": None,
        "exit_code": 0,
        "signal": None,
        "stdout": "",
        "stderr": "",
        "stdout_truncated": False,
        "stderr_truncated": False,
        "duration_ms": 0,
        "attempts": 1,
        "usage": {"cpu_ms": 0, "peak_memory_bytes": None},
        "isolation": None,
        "denials": [],
        "network": None,
    }
    base.update(changes)
    return base


class Fake:
    def __init__(self, handler: Handler | None, greeting: bytes | None) -> None:
        self.handler = handler
        self.greeting = greeting
        self.requests: list[dict[str, Any]] = []
        self.connections = 0
        self.writers: list[asyncio.StreamWriter] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        if self.greeting is not None:
            writer.write(self.greeting)
            await writer.drain()
            writer.close()
            return

        async def answer(obj: dict[str, Any]) -> None:
            writer.write((json.dumps(obj) + "\n").encode())
            await writer.drain()

        tasks: set[asyncio.Task[None]] = set()
        while line := await reader.readline():
            request = json.loads(line)
            self.requests.append(request)
            if self.handler is not None:
                task = asyncio.create_task(self.handler(request, answer))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        writer.close()


@asynccontextmanager
async def fake_daemon(
    handler: Handler | None = None, greeting: bytes | None = None
) -> AsyncIterator[tuple[Fake, Path]]:
    directory = Path(tempfile.mkdtemp(prefix="airlock-fake-"))
    path = directory / "fake.sock"
    fake = Fake(handler, greeting)
    server = await asyncio.start_unix_server(fake.serve, path)
    try:
        yield fake, path
    finally:
        server.close()
        for writer in fake.writers:
            writer.close()
        shutil.rmtree(directory, ignore_errors=True)


def health_then(rest: Handler | None = None, health: dict[str, Any] = HEALTH) -> Handler:
    async def handle(request: dict[str, Any], answer: Answer) -> None:
        if request["op"] == "health":
            await answer({"id": request["id"], "result": health})
        elif rest is not None:
            await rest(request, answer)

    return handle


async def test_another_protocol_version_is_refused_naming_both() -> None:
    async with fake_daemon(health_then(health={**HEALTH, "protocol_version": 2})) as (fake, path):
        with pytest.raises(ProtocolMismatch) as caught:
            await Client.connect(path)
    assert caught.value.expected == 1 and caught.value.actual == 2
    assert "protocol_version 2" in str(caught.value) and "protocol_version 1" in str(caught.value)
    assert fake.connections == 1  # not retried: no retry would help


async def test_a_daemon_without_a_protocol_version_is_refused() -> None:
    old = {k: v for k, v in HEALTH.items() if k != "protocol_version"}
    async with fake_daemon(health_then(health=old)) as (_, path):
        with pytest.raises(ProtocolMismatch, match="does not say its protocol_version"):
            await Client.connect(path)


async def test_a_refused_peer_gets_forbidden_at_once() -> None:
    line = b'{"id":null,"error":{"kind":"forbidden","message":"peer uid 7 gid 7 is not allowed"}}\n'
    async with fake_daemon(greeting=line) as (fake, path):
        with pytest.raises(Forbidden, match="not allowed"):
            await Client.connect(path)
    assert fake.connections == 1


async def test_a_connection_refused_as_overloaded_is_retried_then_given_up() -> None:
    line = b'{"id":null,"error":{"kind":"overloaded","message":"128 connections","retry_after_ms":1}}\n'
    async with fake_daemon(greeting=line) as (fake, path):
        with pytest.raises(DaemonUnavailable, match="128 connections"):
            await Client.connect(path, reconnect_attempts=3, reconnect_delay=0.001)
    assert fake.connections == 3


async def test_a_daemon_that_never_answers_times_out() -> None:
    async with fake_daemon() as (_, path):
        with pytest.raises(DaemonUnavailable) as caught:
            await Client.connect(path, timeout=0.05, reconnect_attempts=2, reconnect_delay=0.001)
    assert isinstance(caught.value.__cause__, TimeoutError)


async def test_no_socket_is_daemon_unavailable() -> None:
    with pytest.raises(DaemonUnavailable, match="2 attempts"):
        await Client.connect("/nonexistent/airlock.sock", reconnect_attempts=2, reconnect_delay=0)


async def test_answers_are_matched_by_id_and_strays_ignored() -> None:
    async def calls(request: dict[str, Any], answer: Answer) -> None:
        await answer({"id": 10**9, "result": record()})  # no such request: ignored
        await answer({"id": request["id"], "result": record(call_id=request["call_id"])})

    async with fake_daemon(health_then(calls)) as (_, path), Client.connect(path) as client:
        results = await asyncio.gather(*(client.call("t", call_id=f"c{i}") for i in range(20)))
    assert [r.call_id for r in results] == [f"c{i}" for i in range(20)]


async def test_garbage_from_the_daemon_fails_the_calls_in_flight_and_reconnects() -> None:
    broken = asyncio.Event()

    async def calls(request: dict[str, Any], answer: Answer) -> None:
        if request["op"] == "call" and not broken.is_set():
            broken.set()
            await answer({"id": request["id"], "result": "not a record"})
            return
        await answer({"id": request["id"], "result": record()})

    async with fake_daemon(health_then(calls)) as (fake, path):
        async with Client.connect(path) as client:
            with pytest.raises(ProtocolError):
                await client.call("t")
            assert fake.connections == 1
            # Not JSON at all: the connection is dropped and the next call gets a new one.
            fake.writers[0].write(b"{oops\n")
            await _until(lambda: not client.connected)
            assert (await client.call("t")).ok
            assert fake.connections == 2


async def test_a_connection_lost_mid_call_says_so() -> None:
    async def hang_up(request: dict[str, Any], answer: Answer) -> None:
        fake.writers[-1].close()

    async with fake_daemon(health_then(hang_up)) as (fake, path), Client.connect(path) as client:
        with pytest.raises(ConnectionLost, match="closed the connection"):
            await client.call("t")


async def test_every_request_the_client_sends_is_one_the_schema_allows() -> None:
    approval = {
        "approval_id": "0" * 32, "tool": "t", "arguments": {}, "input_digest": "0" * 64,
        "argv_preview": [], "builtin": "read_file", "profile": "default", "timeout_ms": 1,
        "session": "s", "rule": "approval", "reason": "r", "policy_version": "p",
        "tool_version": "0" * 64, "expires_at_ms": 0,
    }
    held: dict[Any, Callable[[], Awaitable[None]]] = {}

    async def ops(request: dict[str, Any], answer: Answer) -> None:
        rid, op = request["id"], request["op"]
        if op == "call" and request.get("call_id") == "held":
            async def release() -> None:
                cancelled = record(ok=False, error={"kind": "cancelled", "message": "c"})
                await answer({"id": rid, "result": cancelled})
            held[rid] = release
            return
        if op == "cancel":
            await answer({"id": rid, "result": {"cancelled": True}})
            await held.pop(request["target"])()
            return
        result: Any = {
            "call": record(),
            "execute": record(),
            "propose": {"approval": approval},
            "reject": {"existed": True},
            "set_state": {"tool": request.get("tool"), "state": request.get("state")},
            "tools": {"tools": []},
            "stats": {},
        }[op]
        await answer({"id": rid, "result": result})

    async with fake_daemon(health_then(ops)) as (fake, path), Client.connect(path) as client:
        await client.call(
            "t", {"a": 1}, session="s", call_id="c", timeout_ms=5, plan_mode=True, dry_run=False
        )
        await client.call("t", arguments_json="{}")
        cancel = asyncio.Event()
        held_call = asyncio.create_task(client.call("t", call_id="held", cancel=cancel))
        await _until(lambda: bool(held))
        cancel.set()
        assert (await held_call).error is not None
        await client.propose("t", {"a": 1}, session="s", call_id="p", plan_mode=False)
        await client.execute("0" * 32, session="s")
        await client.execute("0" * 32)
        await client.reject("0" * 32)
        await client.set_state("t", "deferred")
        await client.tools()
    assert {r["op"] for r in fake.requests} == {
        "health", "call", "cancel", "propose", "execute", "reject", "set_state", "tools",
    }
    for request in fake.requests:
        problems = _request_problems(request)
        assert not problems, (request, problems)


def _request_problems(request: dict[str, Any]) -> list[str]:
    """What makes `request` one the schema's `request` does not allow: each op's fields and
    required fields, and the types of the fields the client fills in."""
    defs = json.loads(SCHEMA.read_text())["$defs"]
    for variant in defs["request"]["oneOf"]:
        properties = dict(variant.get("properties", {}))
        required = set(variant.get("required", []))
        if "$ref" in variant:
            base = defs[variant["$ref"].rsplit("/", 1)[1]]
            properties = {**base["properties"], **properties}
            required |= set(base.get("required", []))
        op = properties["op"]
        if request["op"] not in (op.get("enum") or [op.get("const")]):
            continue
        problems = [f"unknown field {k}" for k in request if k not in properties]
        problems += [f"missing field {k}" for k in required if k not in request]
        kinds = {"string": str, "integer": int, "boolean": bool}
        for key, value in request.items():
            spec = properties.get(key, {})
            if "$ref" in spec:
                spec = defs[spec["$ref"].rsplit("/", 1)[1]]
            expected = spec.get("type")
            if isinstance(expected, str) and expected in kinds:
                if not isinstance(value, kinds[expected]) or (
                    expected == "integer" and isinstance(value, bool)
                ):
                    problems.append(f"{key} is not a {expected}")
        return problems
    return [f"no request of op {request['op']!r} in the schema"]


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.001)


async def test_an_answer_that_comes_as_the_task_is_cancelled_is_not_waited_for_again() -> None:
    # The window between task.cancel() (which cancels the future the task awaits) and the
    # task running its handler: an answer read then must not be lost, or the handler
    # would wait cancel_grace for an answer that already came.
    async with fake_daemon(health_then()) as (fake, path):
        async with Client.connect(path, cancel_grace=3600) as client:
            task = asyncio.create_task(client.call("t", call_id="late"))
            await _until(lambda: any(r.get("call_id") == "late" for r in fake.requests))
            rid = fake.requests[-1]["id"]
            task.cancel()
            conn = client._conn
            assert conn is not None
            line = json.dumps({"id": rid, "result": record(call_id="late")}) + "\n"
            conn.data_received(line.encode())
            with pytest.raises(asyncio.CancelledError):
                await task
            assert not conn.orphans and not conn.pending
            # The call had ended: no cancel was sent for it.
            assert [r["op"] for r in fake.requests] == ["health", "call"]


async def test_a_cancelled_task_stops_waiting_for_a_silent_daemon_after_cancel_grace() -> None:
    async with fake_daemon(health_then()) as (fake, path):
        async with Client.connect(path, cancel_grace=0.01) as client:
            task = asyncio.create_task(client.call("t", call_id="silent"))
            await _until(lambda: any(r.get("call_id") == "silent" for r in fake.requests))
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await _until(lambda: fake.requests[-1]["op"] == "cancel")
            assert fake.requests[-1]["target"] == fake.requests[-2]["id"]
            assert client._conn is not None
            assert fake.requests[-2]["id"] not in client._conn.pending


async def test_an_overloaded_call_is_sent_again_no_sooner_than_retry_after_ms() -> None:
    seen: list[float] = []

    async def calls(request: dict[str, Any], answer: Answer) -> None:
        seen.append(asyncio.get_running_loop().time())
        if len(seen) < 3:
            error = {"kind": "overloaded", "message": "full", "retry_after_ms": 50}
            await answer({"id": request["id"], "result": record(ok=False, error=error)})
        else:
            await answer({"id": request["id"], "result": record(call_id=request["call_id"])})

    async with fake_daemon(health_then(calls)) as (fake, path), Client.connect(path) as client:
        result = await client.call("t", call_id="kept")
    assert result.ok and result.call_id == "kept"
    calls_sent = [r for r in fake.requests if r["op"] == "call"]
    assert len(calls_sent) == 3 and {r["call_id"] for r in calls_sent} == {"kept"}
    # A lower bound only: the client waited at least what the daemon asked.
    assert all(later - earlier >= 0.05 for earlier, later in zip(seen, seen[1:]))


async def test_retries_are_bounded_and_the_last_overloaded_record_returned() -> None:
    async def calls(request: dict[str, Any], answer: Answer) -> None:
        error = {"kind": "overloaded", "message": "full", "retry_after_ms": 0}
        await answer({"id": request["id"], "result": record(ok=False, error=error)})

    async with fake_daemon(health_then(calls)) as (fake, path):
        async with Client.connect(path, overload_retries=3) as client:
            result = await client.call("t")
    assert result.error is not None and result.error.kind == "overloaded"
    assert len([r for r in fake.requests if r["op"] == "call"]) == 4


def test_the_default_answer_limit_is_the_typescript_clients() -> None:
    assert DEFAULT_MAX_ANSWER_BYTES == 256 << 20
    assert Client("/nonexistent.sock").max_answer_bytes == DEFAULT_MAX_ANSWER_BYTES


async def test_an_answer_too_long_fails_only_its_call_and_the_connection_stays() -> None:
    limit = 4096

    def head(rid: Any) -> bytes:
        return b'{"id":%s,"result":{"call_id":"big","stdout":"' % json.dumps(rid).encode()

    tail = b'","tool":"t"}}\n'
    held: dict[str, Any] = {}

    async def calls(request: dict[str, Any], answer: Answer) -> None:
        writer = fake.writers[-1]
        call_id = request.get("call_id")
        if call_id == "small":
            held["small"] = request["id"]
        elif call_id == "big":
            # More than the limit and no newline yet: the rest comes with "release".
            held["big"] = request["id"]
            writer.write(head(request["id"]) + b"x" * (limit * 3))
        elif call_id == "whole":
            # An answer too long, whole, in one write.
            writer.write(head(request["id"]) + b"y" * (limit * 3) + tail)
        elif call_id == "release":
            if held.pop("big", None) is not None:
                writer.write(b"x" * (limit * 5) + tail)
                await answer({"id": held["small"], "result": record(call_id="small")})
            await answer({"id": request["id"], "result": record(call_id="release")})

    async with fake_daemon(health_then(calls)) as (fake, path):
        async with Client.connect(path, max_answer_bytes=limit) as client:
            small = asyncio.create_task(client.call("t", call_id="small"))
            await _until(lambda: any(r.get("call_id") == "small" for r in fake.requests))
            with pytest.raises(AnswerTooLarge) as caught:
                await client.call("t", call_id="big")
            assert caught.value.limit == limit
            assert (await client.call("t", call_id="release")).call_id == "release"
            assert (await small).call_id == "small"
            with pytest.raises(AnswerTooLarge):
                await client.call("t", call_id="whole")
            assert (await client.call("t", call_id="release")).call_id == "release"
            assert fake.connections == 1 and client.connected


async def test_an_answer_too_long_without_an_id_fails_every_call_then_reconnects() -> None:
    limit = 4096

    async def calls(request: dict[str, Any], answer: Answer) -> None:
        if request.get("call_id") == "big":
            fake.writers[-1].write(b'{"result":{"stdout":"' + b"x" * (limit * 3))
        elif request.get("call_id") == "after":
            await answer({"id": request["id"], "result": record(call_id="after")})

    async with fake_daemon(health_then(calls)) as (fake, path):
        async with Client.connect(path, max_answer_bytes=limit) as client:
            waiting = asyncio.create_task(client.call("t", call_id="waiting"))
            await _until(lambda: any(r.get("call_id") == "waiting" for r in fake.requests))
            with pytest.raises(AnswerTooLarge):
                await client.call("t", call_id="big")
            with pytest.raises(AnswerTooLarge):
                await waiting
            assert (await client.call("t", call_id="after")).call_id == "after"
            assert fake.connections == 2


def _cancelled_kind(result: Any) -> str | None:
    return None if result.error is None else result.error.kind


async def test_a_cancel_event_stops_waiting_for_a_silent_daemon_after_cancel_grace() -> None:
    # Calls and cancels go unanswered.
    async with fake_daemon(health_then()) as (fake, path):
        async with Client.connect(path, cancel_grace=0.05) as client:
            cancel = asyncio.Event()
            call = asyncio.create_task(client.call("t", call_id="silent", cancel=cancel))
            await _until(lambda: any(r.get("call_id") == "silent" for r in fake.requests))
            cancel.set()
            async with asyncio.timeout(60):  # a hang guard only
                result = await call
            assert _cancelled_kind(result) == "cancelled" and result.call_id == "silent"
            assert result.error is not None and "did not answer the cancel" in result.error.message
            sent = next(r for r in fake.requests if r.get("call_id") == "silent")
            await _until(lambda: fake.requests[-1]["op"] == "cancel")
            assert fake.requests[-1]["target"] == sent["id"]


async def test_a_cancel_event_set_before_the_call_sends_nothing() -> None:
    async with fake_daemon(health_then()) as (fake, path):
        async with Client.connect(path) as client:
            cancel = asyncio.Event()
            cancel.set()
            result = await client.call("t", call_id="never", cancel=cancel)
            assert _cancelled_kind(result) == "cancelled" and result.attempts == 0
            assert result.call_id == "never"
            # Requests go out in order: once this health is answered, a call sent before
            # it would have been seen.
            await client.health()
    assert [r["op"] for r in fake.requests] == ["health", "health"]


async def test_a_cancel_event_set_while_connecting_gives_a_cancelled_record() -> None:
    # The handshake is never answered: connecting goes on until the client closes.
    async with fake_daemon() as (fake, path):
        client = Client(path, timeout=3600)
        try:
            cancel = asyncio.Event()
            call = asyncio.create_task(client.call("t", call_id="early", cancel=cancel))
            await _until(lambda: bool(fake.requests))
            cancel.set()
            async with asyncio.timeout(60):  # a hang guard only
                result = await call
            assert _cancelled_kind(result) == "cancelled" and result.attempts == 0
        finally:
            await client.close()
    assert [r["op"] for r in fake.requests] == ["health"]


async def test_a_cancel_event_set_while_waiting_to_retry_gives_a_cancelled_record() -> None:
    async def calls(request: dict[str, Any], answer: Answer) -> None:
        if request["op"] == "cancel":
            await answer({"id": request["id"], "result": {"cancelled": False}})
            return
        error = {"kind": "overloaded", "message": "full", "retry_after_ms": 3_600_000}
        await answer(
            {"id": request["id"], "result": record(call_id="busy", ok=False, error=error)}
        )

    async with fake_daemon(health_then(calls)) as (fake, path):
        async with Client.connect(path) as client:
            cancel = asyncio.Event()
            call = asyncio.create_task(client.call("t", call_id="busy", cancel=cancel))
            # Answered overloaded at once: the event is set in the hour-long wait to retry
            # (or, on a slow turn, before the answer is read, which ends the same way).
            await _until(lambda: any(r.get("call_id") == "busy" for r in fake.requests))
            cancel.set()
            async with asyncio.timeout(60):  # a hang guard only
                result = await call
            assert _cancelled_kind(result) == "cancelled" and result.call_id == "busy"
            assert len([r for r in fake.requests if r["op"] == "call"]) == 1
