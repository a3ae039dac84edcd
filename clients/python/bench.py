#!/usr/bin/env python3
"""What the client costs: a built-in `read_file` call of a small file, made sequentially
through airlock_client and through a bare asyncio JSON-lines socket, against one
`airlock serve` in the same run, in alternating rounds so that both see the same machine.

usage: bench.py [--calls N] [--rounds R] [--airlock PATH]

Starts its own daemon (this checkout's target/debug/airlock unless --airlock or
AIRLOCK_BIN says otherwise) on a scratch socket and stops it at the end. Prints the median,
90th percentile and mean of each, and the client's difference.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import stat
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from airlock_client import CallResult, Client

REPO = Path(__file__).resolve().parents[2]

POLICY = """version = 1
[profiles.files]
read = ["/usr", "{data}"]
read_optional = ["/bin", "/lib", "/lib64", "/etc/ld.so.cache", "/etc/alternatives"]

[tools.read_file]
description = "Read a file"
builtin = "read_file"
profile = "files"
"""


async def through_client(client: Client, arguments: dict[str, str], n: int) -> list[int]:
    times = []
    for _ in range(n):
        start = time.perf_counter_ns()
        result = await client.call("read_file", arguments)
        times.append(time.perf_counter_ns() - start)
        check(result.ok, result)
    return times


async def through_socket(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, arguments: dict[str, str], n: int
) -> list[int]:
    times = []
    for i in range(n):
        start = time.perf_counter_ns()
        request = {"id": i, "op": "call", "tool": "read_file", "arguments": arguments}
        writer.write((json.dumps(request) + "\n").encode())
        await writer.drain()
        answer = json.loads(await reader.readline())
        times.append(time.perf_counter_ns() - start)
        check(answer["result"]["ok"], answer)
    return times


def check(ok: bool, result: CallResult | object) -> None:
    if not ok:
        raise SystemExit(f"bench: a call failed: {result}")


def summary(name: str, times: list[int]) -> float:
    ms = sorted(t / 1e6 for t in times)
    p50 = statistics.median(ms)
    p90 = ms[int(len(ms) * 0.9)]
    print(f"{name:<14} p50 {p50:.3f} ms   p90 {p90:.3f} ms   mean {statistics.fmean(ms):.3f} ms")
    return p50


async def bench(socket: Path, small: Path, calls: int, rounds: int) -> None:
    arguments = {"path": str(small)}
    per_round = max(1, calls // rounds)
    reader, writer = await asyncio.open_unix_connection(socket)
    async with Client.connect(socket) as client:
        await through_client(client, arguments, 50)  # warm: pools, caches, the JIT of nothing
        await through_socket(reader, writer, arguments, 50)
        client_times: list[int] = []
        raw_times: list[int] = []
        for r in range(rounds):
            if r % 2:
                raw_times += await through_socket(reader, writer, arguments, per_round)
                client_times += await through_client(client, arguments, per_round)
            else:
                client_times += await through_client(client, arguments, per_round)
                raw_times += await through_socket(reader, writer, arguments, per_round)
    writer.close()
    print(f"{len(client_times)} sequential read_file calls each, {rounds} alternating rounds")
    client_p50 = summary("airlock_client", client_times)
    raw_p50 = summary("raw socket", raw_times)
    diff = client_p50 - raw_p50
    print(f"difference     p50 {diff * 1000:+.0f} µs ({client_p50 / raw_p50:.3f}×)")


def scratch_dir() -> Path:
    """A fresh directory of mode 0755 for the daemon's policy, socket and file. Run as root,
    `airlock serve` refuses a policy that anyone else could change through its path, and the
    temporary directory is everyone's (sticky bit or not): as root it goes under
    /run/airlock-client-tests, root's and mode 0755, which is left in place, empty."""
    parent = None
    if os.geteuid() == 0:
        parent = Path("/run/airlock-client-tests")
        parent.mkdir(mode=0o755, exist_ok=True)
        st = parent.lstat()
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0:
            raise SystemExit(f"bench: {parent} is not a directory of root's")
        parent.chmod(0o755)
    path = Path(tempfile.mkdtemp(prefix="airlock-bench-", dir=parent))
    path.chmod(0o755)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=10)
    default_bin = os.environ.get("AIRLOCK_BIN", str(REPO / "target" / "debug" / "airlock"))
    parser.add_argument("--airlock", default=default_bin)
    args = parser.parse_args()

    scratch = scratch_dir()
    small = scratch / "small.txt"
    small.write_text("a small file\n")
    small.chmod(0o644)
    policy = scratch / "policy.toml"
    policy.write_text(POLICY.format(data=scratch))
    socket = scratch / "airlock.sock"
    daemon = subprocess.Popen(
        [args.airlock, "serve", "--policy", str(policy), "--socket", str(socket)],
        stdin=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while not socket.exists():
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("bench: airlock serve did not create its socket")
            time.sleep(0.005)
        print(f"airlock serve: {args.airlock}")
        asyncio.run(bench(socket, small, args.calls, args.rounds))
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
