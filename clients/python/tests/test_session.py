"""Session workspaces against a real `airlock serve`: the agent loop (open, put a file, a
tool edits it, read it back, list the changes, close), isolation between sessions, and the
typed refusals of a session that is gone, of one too many and of a file that does not fit."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from airlock_client import (
    Change,
    Client,
    DryRun,
    Forbidden,
    InvalidRequest,
    SessionInfo,
    SessionLimit,
    SessionUnknown,
    UnknownTool,
    WorkspaceFull,
)
from helpers import POLICY, Daemon

# The tests' policy plus sessions and a tool that runs a script in the workspace.
SESSION_POLICY = (
    POLICY
    + """
[sessions]
max_sessions = 2
max_size = "1MiB"

[profiles.workspace]
read = ["/usr"]
read_optional = ["/bin", "/lib", "/lib64", "/etc/ld.so.cache", "/etc/alternatives"]
tmpfs = {{ "/tmp" = "16MiB" }}
limits = {{ timeout = "600s" }}
workspace = "/workspace"
workspace_size = "64KiB"
cwd = "/workspace"

[tools.sh]
description = "Run a script in the session's workspace"
profile = "workspace"
command = ["/bin/sh", "-c", "{{script}}"]
side_effect = "write"
concurrency_safe = true
input = {{ type = "object", properties = {{ script = {{ type = "string" }} }}, required = ["script"] }}
"""
)


@pytest.fixture(scope="module")
def sessions_daemon() -> Iterator[Daemon]:
    d = Daemon(policy=SESSION_POLICY).start()
    yield d
    d.cleanup()


async def test_the_agent_loop(sessions_daemon: Daemon, sandbox: None) -> None:
    async with Client.connect(str(sessions_daemon.socket)) as client:
        session = await client.open_session()
        assert isinstance(session.info, SessionInfo)
        assert session.info.session == session.name and len(session.name) == 32
        assert session.info.isolation == "empty" and session.info.size == 64 * 1024

        assert await session.put_file("src/notes.txt", "one\n") == 4
        await session.put_file("data.bin", b"\x00\x01\x02\xff")
        edited = await session.call("sh", {"script": "echo two >> src/notes.txt && cat src/notes.txt"})
        assert edited.ok, (edited.error, edited.stderr)
        assert edited.stdout == "one\ntwo\n"

        assert await session.get_file("src/notes.txt") == b"one\ntwo\n"
        assert await session.get_file("data.bin") == b"\x00\x01\x02\xff"
        assert await session.changes() == [
            Change("data.bin", "added", 4),
            Change("src/notes.txt", "added", 8),
        ]

        await session.close()
        with pytest.raises(SessionUnknown):
            await session.get_file("src/notes.txt")
        with pytest.raises(SessionUnknown):
            await session.changes()
        with pytest.raises(SessionUnknown):
            await session.close()
        refused = await session.call("sh", {"script": "true"})
        assert not refused.ok and refused.error is not None
        assert refused.error.kind == "session_unknown"


async def test_a_session_sees_none_of_another_sessions_files(
    sessions_daemon: Daemon, sandbox: None
) -> None:
    async with Client.connect(str(sessions_daemon.socket)) as client:
        async with await client.open_session() as first, await client.open_session() as second:
            await first.put_file("secret.txt", "first's")
            with pytest.raises(InvalidRequest):
                await second.get_file("secret.txt")  # no such file in this workspace
            looked = await second.call("sh", {"script": "ls -A /workspace"})
            assert looked.ok, looked.error
            assert looked.stdout == ""
            assert await second.changes() == []
        # `async with` closed both.
        with pytest.raises(SessionUnknown):
            await first.changes()
        assert (await client.stats()).sessions_open == 0


async def test_typed_refusals(sessions_daemon: Daemon) -> None:
    async with Client.connect(str(sessions_daemon.socket)) as client:
        async with await client.open_session() as a, await client.open_session():
            with pytest.raises(SessionLimit):
                await client.open_session()
            with pytest.raises(WorkspaceFull):
                await a.put_file("big", bytes(128 * 1024))
            with pytest.raises(InvalidRequest):
                await a.put_file("../escape", "x")
            with pytest.raises(TypeError):
                await a.put_file("x", 5)  # type: ignore[arg-type]
        async with await client.open_session(size="16KiB") as small:
            assert small.info is not None and small.info.size == 16 * 1024
        with pytest.raises(SessionUnknown):
            await client.get_file("0" * 32, "x")


async def test_a_sessions_own_tool_state_and_plan_mode(sessions_daemon: Daemon) -> None:
    async with Client.connect(str(sessions_daemon.socket)) as client:
        async with await client.open_session() as narrowed, await client.open_session(
            plan_mode=True
        ) as planning:
            change = await narrowed.set_state("word_count", "suspended")
            assert (change.tool, change.state) == ("word_count", "suspended")
            refused = await narrowed.call("word_count", {"text": "a b"})
            assert refused.error is not None and refused.error.kind == "tool_unavailable"
            assert refused.error.state == "suspended"
            elsewhere = await planning.client.call(
                "word_count", {"text": "a b"}, session=planning.name, dry_run=True
            )
            assert isinstance(elsewhere, DryRun) and elsewhere.decision == "allow"
            tools = {t.name: t.state for t in await client.tools()}
            assert tools["word_count"] == "active"
            assert {t.name: t.state for t in await narrowed.tools()}["word_count"] == "suspended"
            assert {t.name: t.state for t in await planning.tools()}["word_count"] == "active"

            denied = await planning.call("sh", {"script": "touch x"}, plan_mode=False)
            assert denied.error is not None and denied.error.kind == "denied"
            assert denied.error.rule == "plan_mode"
            assert await planning.changes() == []
        with pytest.raises(SessionUnknown):
            await narrowed.set_state("word_count", "active")
        with pytest.raises(UnknownTool):
            await client.set_state("nope", "active", session=planning.name)


async def test_a_sessions_plan_mode_changes_after_it_opened(sessions_daemon: Daemon) -> None:
    async with Client.connect(str(sessions_daemon.socket)) as client:
        async with await client.open_session() as session:
            settings = await session.set_plan_mode(True)
            assert (settings.session, settings.plan_mode) == (session.name, True)
            denied = await session.call("sh", {"script": "touch x"})
            assert denied.error is not None and denied.error.rule == "plan_mode"
            # No approver role on this daemon: every allowed peer may lift it.
            lifted = await client.set_plan_mode(session.name, False)
            assert lifted.plan_mode is False
            ran = await session.call("sh", {"script": "touch x"})
            assert ran.ok, ran
        with pytest.raises(SessionUnknown):
            await session.set_plan_mode(True)
        with pytest.raises(TypeError):
            await client.set_plan_mode(session.name, "yes")  # type: ignore[arg-type]


async def test_only_an_approver_lifts_a_sessions_plan_mode() -> None:
    daemon = Daemon("--approver-uid", "4242", policy=SESSION_POLICY).start()
    try:
        async with Client.connect(str(daemon.socket)) as client:
            async with await client.open_session() as session:
                await session.set_plan_mode(True)
                with pytest.raises(Forbidden):
                    await session.set_plan_mode(False)
                still = await client.call(
                    "sh", {"script": "true"}, session=session.name, dry_run=True
                )
                assert isinstance(still, DryRun) and still.decision == "deny"
    finally:
        daemon.cleanup()
