"""The client against a real `airlock serve` of this checkout's build."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable

import pytest

from airlock_client import (
    PROTOCOL_VERSION,
    Approval,
    CallResult,
    Client,
    ClientClosed,
    ConnectionLost,
    DaemonUnavailable,
    DryRun,
    InvalidRequest,
    RequestTooLarge,
    UnknownTool,
)
from helpers import Daemon, processes_with, until


def marker() -> str:
    """Seconds for the sleep tool that no other process's command line holds: the test
    finds its sleep by it. Hours: it ends only by the test's doing."""
    return f"3600.{secrets.randbelow(10**9):09d}"


async def sleep_running(mark: str) -> None:
    await until(f"the sleep {mark} runs", lambda: bool(processes_with(mark)))


async def sleep_gone(mark: str) -> None:
    await until(f"the sleep {mark} is gone", lambda: not processes_with(mark))


def ok(result: CallResult | DryRun | Approval) -> CallResult:
    assert isinstance(result, CallResult), result
    assert result.ok, result
    return result


async def test_connect_checks_the_protocol_version(daemon: Daemon) -> None:
    async with Client.connect(daemon.socket) as client:
        assert client.connected
        assert client.daemon_health is not None
        assert client.daemon_health.protocol_version == PROTOCOL_VERSION == 1
        health = await client.health()
        assert health.ok is True
        assert health.protocol_version == 1
        assert health.version and health.policy_version
    assert not client.connected
    # The other spelling works too.
    async with await Client.connect(daemon.socket) as client:
        assert (await client.health()).ok


async def test_tools_are_listed_with_their_schemas_and_states(daemon: Daemon) -> None:
    async with Client.connect(daemon.socket) as client:
        tools = {t.name: t for t in await client.tools()}
    assert {"word_count", "sleep", "gate", "echo_json", "guarded", "read_file"} <= set(tools)
    wc = tools["word_count"]
    assert wc.description == "Count the words in a text"
    assert wc.input_schema["properties"]["text"] == {"type": "string"}
    assert wc.output_schema is None
    assert (wc.side_effect, wc.approval, wc.state, wc.category) == ("read", "auto", "active", "text")
    assert wc.concurrency_safe is True and wc.retries == 0 and wc.timeout_ms == 600_000
    assert tools["echo_json"].output_schema is not None
    assert tools["guarded"].approval == "human"
    assert tools["read_file"].category is None


async def test_a_successful_call_returns_its_result_record(daemon: Daemon, sandbox: None) -> None:
    async with Client.connect(daemon.socket) as client:
        result = ok(
            await client.call("word_count", {"text": "one two three"}, call_id="wc-1", session="s")
        )
    assert result.call_id == "wc-1" and result.tool == "word_count"
    assert result.stdout == "3\n" and result.stderr == "" and result.output is None
    assert result.exit_code == 0 and result.signal is None and result.error is None
    assert result.attempts == 1 and result.duration_ms >= 0
    assert not result.stdout_truncated and not result.stderr_truncated
    assert result.usage.cpu_ms >= 0
    assert result.isolation is not None and result.isolation.backend == "airlock"
    assert result.isolation.limits.timeout_ms == 600_000
    assert result.network is None


async def test_a_tool_with_an_output_schema_returns_parsed_output(
    daemon: Daemon, sandbox: None
) -> None:
    async with Client.connect(daemon.socket) as client:
        result = ok(await client.call("echo_json", arguments_json='{"text": "hi"}'))
    assert result.output == {"text": "hi"} and result.stdout == ""


async def test_the_read_file_builtin_reads_a_file(daemon: Daemon, sandbox: None) -> None:
    path = daemon.data / "small.txt"
    path.write_text("small file\n")
    path.chmod(0o644)
    async with Client.connect(daemon.socket) as client:
        result = ok(await client.call("read_file", {"path": str(path)}))
    assert result.stdout == "small file\n"


async def test_invalid_input_is_a_result_never_an_exception(daemon: Daemon) -> None:
    async with Client.connect(daemon.socket) as client:
        wrong_type = await client.call("word_count", {"text": 5})
        missing = await client.call("word_count", {})
        no_arguments = await client.call("word_count")
    for result in (wrong_type, missing, no_arguments):
        assert not result.ok and result.error is not None
        assert result.error.kind == "invalid_input", result
        assert result.error.violations, result
        assert result.isolation is None and result.attempts == 0
    assert wrong_type.error is not None and wrong_type.error.violations is not None
    (violation,) = wrong_type.error.violations
    assert (violation.path, violation.keyword) == ("/text", "type")


async def test_an_unknown_tool_is_a_result(daemon: Daemon) -> None:
    async with Client.connect(daemon.socket) as client:
        result = await client.call("no_such_tool", {})
    assert not result.ok and result.error is not None
    assert result.error.kind == "unknown_tool" and result.tool == "no_such_tool"


async def test_a_deadline_shorter_than_the_tools(daemon: Daemon, sandbox: None) -> None:
    async with Client.connect(daemon.socket) as client:
        result = await client.call("sleep", {"seconds": marker()}, timeout_ms=1)
    assert result.error is not None and result.error.kind == "timeout"
    assert result.error.timeout_ms == 1


async def test_many_concurrent_calls_on_one_connection_get_their_own_answers(
    daemon: Daemon, sandbox: None
) -> None:
    async with Client.connect(daemon.socket) as client:
        # A slow call first: it is still running when every fast one has answered, so the
        # answers come back out of order however slow the machine.
        stop = asyncio.Event()
        mark = marker()
        slow = asyncio.create_task(client.call("sleep", {"seconds": mark}, cancel=stop))
        await sleep_running(mark)
        counts = list(range(1, 41))
        results = await asyncio.gather(
            *(
                client.call("word_count", {"text": " ".join(["w"] * n)}, call_id=f"c{n}")
                for n in counts
            )
        )
        assert not slow.done()
        for n, result in zip(counts, results, strict=True):
            assert result.ok and result.call_id == f"c{n}" and result.stdout == f"{n}\n", result
        stop.set()
        cancelled = await slow
        assert cancelled.error is not None and cancelled.error.kind == "cancelled"
        assert client.connected


async def test_setting_the_cancel_event_kills_the_tool(daemon: Daemon, sandbox: None) -> None:
    mark = marker()
    async with Client.connect(daemon.socket) as client:
        cancel = asyncio.Event()
        task = asyncio.create_task(client.call("sleep", {"seconds": mark}, cancel=cancel))
        await sleep_running(mark)
        cancel.set()
        result = await task
        assert not result.ok and result.error is not None
        assert result.error.kind == "cancelled", result
        await sleep_gone(mark)
        # The connection carries on.
        ok(await client.call("word_count", {"text": "still here"}))


async def test_an_event_set_before_the_call_cancels_it_at_once(
    daemon: Daemon, sandbox: None
) -> None:
    cancel = asyncio.Event()
    cancel.set()
    async with Client.connect(daemon.socket) as client:
        result = await client.call("sleep", {"seconds": marker()}, cancel=cancel)
    assert result.error is not None and result.error.kind == "cancelled"


async def test_cancelling_the_task_cancels_the_call_in_the_daemon(
    daemon: Daemon, sandbox: None
) -> None:
    mark = marker()
    call_id = f"task-cancel-{mark}"
    async with Client.connect(daemon.socket) as client:
        task = asyncio.create_task(client.call("sleep", {"seconds": mark}, call_id=call_id))
        await sleep_running(mark)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The task ended only once the daemon had answered the cancelled call.
        assert (await client.stats()).in_flight == 0
        await sleep_gone(mark)

    def audited() -> bool:
        return any(
            r.get("call_id") == call_id and r.get("outcome") == "cancelled"
            for r in daemon.audit_records()
        )

    await until("the daemon audits the call as cancelled", audited)


async def test_an_asyncio_timeout_still_raises_timeout_error(
    daemon: Daemon, sandbox: None
) -> None:
    # The client passes cancellation on as asyncio expects: asyncio.timeout() turns it into
    # TimeoutError. The deadline is moved to now once the tool runs: no timing guess.
    mark = marker()
    scopes: list[asyncio.Timeout] = []
    async with Client.connect(daemon.socket) as client:

        async def bounded() -> CallResult:
            async with asyncio.timeout(None) as scope:
                scopes.append(scope)
                return await client.call("sleep", {"seconds": mark})

        task = asyncio.create_task(bounded())
        await sleep_running(mark)
        scopes[0].reschedule(asyncio.get_running_loop().time())
        with pytest.raises(TimeoutError):
            await task
        await sleep_gone(mark)
        ok(await client.call("word_count", {"text": "after"}))


async def test_overloaded_calls_are_retried_after_retry_after_ms(
    make_daemon: Callable[..., Daemon], sandbox: None
) -> None:
    daemon = make_daemon("--max-concurrent", "1", "--max-queued", "0")
    go = daemon.data / f"go-{secrets.token_hex(4)}"
    # A large bound so that a slow machine cannot exhaust it; each retry waits the
    # daemon's retry_after_ms.
    async with Client.connect(daemon.socket, overload_retries=10_000) as client:
        first = asyncio.create_task(client.call("gate", {"path": str(go)}))
        await until("the first call holds the only slot", _in_flight(client, 1))
        second = asyncio.create_task(client.call("word_count", {"text": "two words"}))
        await until("the second call is turned away", _overloaded(client, 1))
        assert not second.done()  # retrying, not answered
        go.touch()
        first_result, second_result = await asyncio.gather(first, second)
        assert ok(first_result).stdout == "open\n"
        assert ok(second_result).stdout == "2\n"
        assert (await client.stats()).overloaded >= 1


async def test_with_retries_off_an_overloaded_call_returns_its_result(
    make_daemon: Callable[..., Daemon], sandbox: None
) -> None:
    daemon = make_daemon("--max-concurrent", "1", "--max-queued", "0")
    go = daemon.data / f"go-{secrets.token_hex(4)}"
    async with Client.connect(daemon.socket, overload_retries=0) as client:
        first = asyncio.create_task(client.call("gate", {"path": str(go)}))
        await until("the first call holds the only slot", _in_flight(client, 1))
        refused = await client.call("word_count", {"text": "x"}, call_id="refused")
        assert not refused.ok and refused.error is not None
        assert refused.error.kind == "overloaded" and refused.call_id == "refused"
        assert refused.error.retry_after_ms is not None and refused.error.retry_after_ms > 0
        go.touch()
        ok(await first)


async def test_approvals_propose_execute_reject(daemon: Daemon, sandbox: None) -> None:
    async with Client.connect(daemon.socket) as client:
        direct = await client.call("guarded", {"text": "x"})
        assert direct.error is not None and direct.error.kind == "approval_required"
        assert direct.error.rule == "approval"

        approval = await client.propose("guarded", {"text": "approved"})
        assert isinstance(approval, Approval), approval
        assert approval.tool == "guarded" and approval.arguments == {"text": "approved"}
        assert approval.argv_preview == ("/bin/echo", "approved") and approval.builtin is None
        assert approval.session is None and len(approval.approval_id) == 32
        assert (await client.stats()).pending_approvals >= 1

        executed = ok(await client.execute(approval.approval_id))
        assert executed.stdout == "approved\n" and executed.tool == "guarded"
        again = await client.execute(approval.approval_id)
        assert again.error is not None and again.error.kind == "approval_invalid"
        assert await client.reject(approval.approval_id) is False

        rejected = await client.propose("guarded", {"text": "never"})
        assert isinstance(rejected, Approval)
        assert await client.reject(rejected.approval_id) is True
        late = await client.execute(rejected.approval_id)
        assert late.error is not None and late.error.kind == "approval_invalid"

        refused = await client.propose("guarded", {"text": 1})
        assert isinstance(refused, CallResult) and refused.error is not None
        assert refused.error.kind == "invalid_input"


async def test_an_approval_belongs_to_its_session(daemon: Daemon, sandbox: None) -> None:
    async with Client.connect(daemon.socket) as client:
        alice = client.session("alice")
        approval = await alice.propose("guarded", {"text": "hers"})
        assert isinstance(approval, Approval) and approval.session == "alice"
        other = await client.session("bob").execute(approval.approval_id)
        assert other.error is not None and other.error.kind == "approval_invalid"
        assert "another session" in other.error.message
        # (The refused execute used the approval up: the proposer proposes again.)
        approval = await alice.propose("guarded", {"text": "hers"})
        assert isinstance(approval, Approval)
        assert ok(await alice.execute(approval.approval_id)).stdout == "hers\n"
        assert ok(await alice.call("word_count", {"text": "a b"})).stdout == "2\n"


async def test_set_state_suspends_and_restores_a_tool(daemon: Daemon) -> None:
    async with Client.connect(daemon.socket) as client:
        change = await client.set_state("echo_json", "suspended")
        assert (change.tool, change.state) == ("echo_json", "suspended")
        try:
            listed = {t.name: t.state for t in await client.tools()}
            assert listed["echo_json"] == "suspended"
            result = await client.call("echo_json", {"text": "x"})
            assert result.error is not None and result.error.kind == "tool_unavailable"
            assert result.error.state == "suspended"
        finally:
            await client.set_state("echo_json", "active")
        with pytest.raises(UnknownTool):
            await client.set_state("no_such_tool", "active")
        with pytest.raises(ValueError):
            await client.set_state("echo_json", "asleep")  # type: ignore[arg-type]


async def test_dry_run_says_what_would_run(daemon: Daemon) -> None:
    async with Client.connect(daemon.socket) as client:
        dry = await client.call("word_count", {"text": "a b"}, dry_run=True)
        assert isinstance(dry, DryRun), dry
        assert dry.decision == "allow" and dry.argv == ("/usr/bin/wc", "-w")
        assert dry.approval_required is False and dry.stdin_bytes == 3
        guarded = await client.call("guarded", {"text": "a"}, dry_run=True)
        assert isinstance(guarded, DryRun) and guarded.approval_required is True
        unknown = await client.call("no_such_tool", {}, dry_run=True)
        assert isinstance(unknown, CallResult) and unknown.error is not None
        assert unknown.error.kind == "unknown_tool"


async def test_plan_mode_refuses_tools_that_write(daemon: Daemon) -> None:
    async with Client.connect(daemon.socket) as client:
        result = await client.call("guarded", {"text": "x"}, plan_mode=True)
    assert result.error is not None
    assert (result.error.kind, result.error.rule) == ("denied", "plan_mode")


async def test_stats_are_typed(daemon: Daemon) -> None:
    async with Client.connect(daemon.socket) as client:
        stats = await client.stats()
    assert stats.max_concurrent == 8 and stats.max_queued == 64
    assert stats.connections_open >= 1 and "hits" in stats.pool


async def test_an_invalid_request_raises_and_the_connection_stays_usable(daemon: Daemon) -> None:
    async with Client.connect(daemon.socket) as client:
        before = (await client.stats()).connections
        with pytest.raises(InvalidRequest, match="dry_runn"):
            await client.request({"op": "call", "tool": "word_count", "dry_runn": True})
        with pytest.raises(InvalidRequest, match="op"):
            await client.request({})
        assert client.connected
        assert (await client.stats()).connections == before  # the same connection
        health = await client.request({"op": "health"})
        assert health == {
            "ok": True,
            "version": client.daemon_health.version if client.daemon_health else None,
            "protocol_version": 1,
            "policy_version": client.daemon_health.policy_version if client.daemon_health else None,
            "ready": health["ready"],
            "not_ready": None if health["ready"] else health["not_ready"],
        }
        assert isinstance(health["ready"], bool)


async def test_bad_arguments_are_refused_before_anything_is_sent(daemon: Daemon) -> None:
    async with Client.connect(daemon.socket) as client:
        before = (await client.stats()).requests
        with pytest.raises(ValueError):
            await client.call("word_count", {"text": "x"}, session="two\nlines")
        with pytest.raises(ValueError):
            await client.call("word_count", {"text": "x"}, call_id="x" * 257)
        with pytest.raises(ValueError):
            await client.call("word_count", {"text": "x"}, timeout_ms=0)
        with pytest.raises(ValueError):
            await client.call("word_count", {"text": float("nan")})
        with pytest.raises(ValueError):
            await client.call("word_count", {"text": "x"}, arguments_json="{}")
        with pytest.raises(RequestTooLarge):
            await client.call("word_count", {"text": "x" * (2 << 20)})
        # Only the stats request itself reached the daemon since.
        assert (await client.stats()).requests == before + 1


async def test_closing_the_client_ends_calls_in_flight(daemon: Daemon, sandbox: None) -> None:
    mark = marker()
    client = await Client.connect(daemon.socket)
    task = asyncio.create_task(client.call("sleep", {"seconds": mark}))
    await sleep_running(mark)
    await client.close()
    with pytest.raises(ClientClosed):
        await task
    with pytest.raises(ClientClosed):
        await client.health()
    # The daemon cancels a departed client's calls.
    await sleep_gone(mark)


async def test_a_daemon_killed_mid_call_is_a_transport_error_not_a_hang(
    make_daemon: Callable[..., Daemon], sandbox: None
) -> None:
    daemon = make_daemon()
    mark = marker()
    async with Client.connect(daemon.socket, reconnect_attempts=2, reconnect_delay=0.01) as client:
        calls = [
            asyncio.create_task(client.call("sleep", {"seconds": mark})),
            asyncio.create_task(client.call("sleep", {"seconds": mark}, cancel=asyncio.Event())),
        ]
        await until("both sleeps run", lambda: len(processes_with(mark)) == 2)
        daemon.kill()
        for call in calls:
            with pytest.raises(ConnectionLost):
                await call
        assert not client.connected
        # Nobody listens any more: the next call tries a bounded number of times.
        with pytest.raises(DaemonUnavailable):
            await client.call("word_count", {"text": "x"})
    # The daemon's workers die with it.
    await sleep_gone(mark)


async def test_the_next_call_reconnects_after_a_daemon_restart(
    make_daemon: Callable[..., Daemon], sandbox: None
) -> None:
    daemon = make_daemon()
    async with Client.connect(daemon.socket, reconnect_attempts=2, reconnect_delay=0.01) as client:
        ok(await client.call("word_count", {"text": "before"}))
        first_health = client.daemon_health
        await daemon.stop_async()
        await until("the client sees the hang-up", lambda: not client.connected)
        with pytest.raises(DaemonUnavailable):
            await client.call("word_count", {"text": "while down"})
        daemon.start()
        assert ok(await client.call("word_count", {"text": "after the restart"})).stdout == "3\n"
        assert client.connected and client.daemon_health is not None
        assert client.daemon_health is not first_health


async def test_calls_waiting_for_a_reconnect_share_it(
    make_daemon: Callable[..., Daemon], sandbox: None
) -> None:
    daemon = make_daemon()
    async with Client.connect(daemon.socket) as client:
        await daemon.stop_async()
        await until("the client sees the hang-up", lambda: not client.connected)
        daemon.start()
        results = await asyncio.gather(
            *(client.call("word_count", {"text": "w " * n}) for n in range(1, 11))
        )
        assert [r.stdout for r in results] == [f"{n}\n" for n in range(1, 11)]
        stats = await client.stats()
        assert stats.connections == 1  # one connection to the new daemon


def _in_flight(client: Client, n: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return (await client.stats()).in_flight >= n

    return check


def _overloaded(client: Client, n: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return (await client.stats()).overloaded >= n

    return check
