"""A real `airlock serve` for the tests: started on a scratch socket with the tests' policy,
waited for by polling for its socket, killed at the end. Only processes these helpers
started are ever signalled."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
SCHEMA = REPO / "supervisor" / "src" / "daemon" / "protocol.schema.json"

# A guard against a hang, never a timing assumption: every wait below ends as soon as what
# it waits for happens.
GUARD = float(os.environ.get("AIRLOCK_TEST_GUARD", "180"))


def airlock_bin() -> Path:
    path = Path(os.environ.get("AIRLOCK_BIN", REPO / "target" / "debug" / "airlock"))
    if not path.is_file():
        raise RuntimeError(f"no airlock binary at {path}: run `cargo build -p airlock-cli` first")
    return path


# The sandbox's root is uid 65534 when airlock runs as root: the data directory and its
# files must be readable by it. `gate` waits for a file to appear (the test decides when
# it finishes, however slow the machine); `sleep` lasts until cancelled (its deadline is
# the hang guard); `guarded` needs a human.
POLICY = """version = 1
[profiles.default]
read = ["/usr"]
read_optional = ["/bin", "/lib", "/lib64", "/etc/ld.so.cache", "/etc/alternatives"]
tmpfs = {{ "/tmp" = "16MiB" }}
limits = {{ timeout = "600s" }}

[profiles.files]
read = ["/usr", "{data}"]
read_optional = ["/bin", "/lib", "/lib64", "/etc/ld.so.cache", "/etc/alternatives"]
limits = {{ timeout = "600s" }}

[tools.word_count]
description = "Count the words in a text"
command = ["/usr/bin/wc", "-w"]
stdin = "text"
side_effect = "read"
concurrency_safe = true
category = "text"
input = {{ type = "object", properties = {{ text = {{ type = "string" }} }}, required = ["text"] }}

[tools.sleep]
description = "Sleep until cancelled"
command = ["/bin/sleep", "{{seconds}}"]
side_effect = "read"
concurrency_safe = true
input = {{ type = "object", properties = {{ seconds = {{ type = "string", pattern = "^[0-9.]+$" }} }}, required = ["seconds"] }}

[tools.gate]
description = "Wait until the test creates a file, then say so"
profile = "files"
command = ["/bin/sh", "-c", "while [ ! -e \\"$0\\" ]; do sleep 0.01; done; echo open", "{{path}}"]
side_effect = "read"
concurrency_safe = true
input = {{ type = "object", properties = {{ path = {{ type = "string" }} }}, required = ["path"] }}

[tools.echo_json]
description = "Say the input back, as JSON"
command = ["/bin/cat"]
stdin = "$input"
side_effect = "read"
concurrency_safe = true
input = {{ type = "object", properties = {{ text = {{ type = "string" }} }}, required = ["text"] }}
output = {{ type = "object", properties = {{ text = {{ type = "string" }} }}, required = ["text"] }}

[tools.guarded]
description = "Print a text, once a human approves"
command = ["/bin/echo", "{{text}}"]
side_effect = "write"
approval = "human"
input = {{ type = "object", properties = {{ text = {{ type = "string" }} }}, required = ["text"] }}

[tools.read_file]
description = "Read a file of the test's data directory"
builtin = "read_file"
profile = "files"
"""


# Run as root, `airlock serve` refuses a policy that anyone else could change through its
# path, and the system temporary directory is writable by everyone (its sticky bit does not
# count): as root the daemons' directories go under this one, root's and mode 0755. It is
# left in place, empty, for the next run (ci-test removes it).
TRUSTED_PARENT = Path("/run/airlock-client-tests")


def scratch_dir(prefix: str) -> Path:
    """A fresh directory of mode 0755 (the sandbox's uid reads data in it) for a daemon's
    policy, socket and data: under TRUSTED_PARENT as root, else in the temporary directory."""
    parent = None
    if os.geteuid() == 0:
        parent = TRUSTED_PARENT
        parent.mkdir(mode=0o755, exist_ok=True)
        st = parent.lstat()
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0:
            raise RuntimeError(f"{parent} is not a directory of root's")
        parent.chmod(0o755)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    path.chmod(0o755)
    return path


class Daemon:
    """`airlock serve` of this checkout's build, on a socket in a scratch directory."""

    def __init__(self, *extra: str, policy: str = POLICY) -> None:
        self.extra = list(extra)
        self.dir = scratch_dir("airlock-py-")
        self.data = self.dir / "data"
        self.data.mkdir(mode=0o755)
        self.data.chmod(0o755)
        self.policy = self.dir / "policy.toml"
        self.policy.write_text(policy.format(data=self.data))
        self.socket = self.dir / "airlock.sock"
        self.audit = self.dir / "audit.jsonl"
        self.log = self.dir / "daemon.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Daemon:
        # A socket left by a daemon that was killed would pass for the new one's.
        self.socket.unlink(missing_ok=True)
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [
                    str(airlock_bin()),
                    "serve",
                    "--policy",
                    str(self.policy),
                    "--socket",
                    str(self.socket),
                    "--audit",
                    str(self.audit),
                    *self.extra,
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        process = self.process

        def ready() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"airlock serve exited ({process.returncode}): {self.log_text()}")
            return self.socket.exists()

        wait_until("the daemon creates its socket", ready)
        return self

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def kill(self) -> None:
        """SIGKILL: the daemon gets no chance to answer anything."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=GUARD)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it has not ended within the guard."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=GUARD)
        except subprocess.TimeoutExpired:
            self.kill()

    async def stop_async(self) -> None:
        """SIGTERM and wait, letting the event loop run (clients notice the hang-up)."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        await until("the daemon exits", lambda: process.poll() is not None)

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def audit_records(self) -> list[dict[str, Any]]:
        import json

        if not self.audit.exists():
            return []
        return [json.loads(line) for line in self.audit.read_text().splitlines() if line.strip()]


def wait_until(what: str, condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + GUARD
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {GUARD} s waiting until {what}")
        time.sleep(0.005)


async def until(what: str, condition: Callable[[], bool | Awaitable[bool]]) -> None:
    """Polls `condition` (a plain or async predicate) while the event loop runs."""
    deadline = time.monotonic() + GUARD
    while True:
        value = condition()
        if not isinstance(value, bool):
            value = await value
        if value:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {GUARD} s waiting until {what}")
        await asyncio.sleep(0.005)


def processes_with(marker: str) -> list[int]:
    """Pids whose command line contains `marker` (the tests' sleeps carry a unique one)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(entry))
    return found


def sandbox_works() -> tuple[bool, str]:
    out = subprocess.run(
        [str(airlock_bin()), "exec", "--json", "--", "/bin/true"],
        capture_output=True,
        timeout=GUARD,
    )
    return out.returncode == 0, (out.stdout + out.stderr).decode(errors="replace")
