"""Fixtures: real daemons, and `async def` tests run without a plugin (each in its own event
loop, under the hang guard)."""

from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import Callable, Iterator

import pytest

from helpers import GUARD, Daemon, sandbox_works


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    names = pyfuncitem._fixtureinfo.argnames
    kwargs = {name: pyfuncitem.funcargs[name] for name in names}
    asyncio.run(asyncio.wait_for(pyfuncitem.obj(**kwargs), GUARD))
    return True


@pytest.fixture(scope="session")
def sandbox() -> None:
    """Skips a test that runs tools where the sandbox cannot start (fails instead with
    AIRLOCK_MUST_WORK=1, as the project's CI runs)."""
    works, why = sandbox_works()
    if not works:
        if os.environ.get("AIRLOCK_MUST_WORK") == "1":
            pytest.fail(f"sandbox unavailable and AIRLOCK_MUST_WORK=1: {why}")
        pytest.skip(f"sandbox unavailable on this machine: {why}")


@pytest.fixture(scope="session")
def daemon() -> Iterator[Daemon]:
    """One daemon for the tests that leave it as they found it."""
    d = Daemon().start()
    yield d
    d.cleanup()


@pytest.fixture
def make_daemon() -> Iterator[Callable[..., Daemon]]:
    """Daemons of a test's own (other flags, or to be killed); stopped at its end."""
    made: list[Daemon] = []

    def make(*extra: str) -> Daemon:
        d = Daemon(*extra)
        made.append(d)
        return d.start()

    yield make
    for d in made:
        d.cleanup()
