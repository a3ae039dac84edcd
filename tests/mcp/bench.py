#!/usr/bin/env python3
"""Round trip of one built-in tool call: `airlock mcp` on stdio against `airlock serve` on its
socket, one call at a time, both with a pool of 2, runs interleaved; prints p50 and p90.

    python3 tests/mcp/bench.py [CALLS] [ORDER...]   # default 1000, mcp daemon mcp daemon
                                                    # (also: daemon-session)

Uses AIRLOCK_BIN, else target/release/airlock (build it with `cargo build --release`).
Run as root, as the sandboxes need here. Standard library only.
"""
import json
import os
import socket
import stat
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AIRLOCK = os.environ.get("AIRLOCK_BIN", os.path.join(REPO, "target", "release", "airlock"))
WARMUP = 20
ARGS = {"path": "/usr/lib/os-release"}
POLICY = """version = 1
[profiles.default]
read = ["/usr"]
read_optional = ["/bin", "/lib", "/lib64", "/etc/ld.so.cache", "/etc/alternatives"]
tmpfs = { "/tmp" = "16MiB" }

[tools.read_file]
description = "Read a file"
builtin = "read_file"
"""


def mcp(policy, calls):
    proc = subprocess.Popen(
        [AIRLOCK, "mcp", "--policy", policy, "--pool", "2"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )

    def rpc(message):
        proc.stdin.write((json.dumps(message) + "\n").encode())
        proc.stdin.flush()
        while "id" in message:
            answer = json.loads(proc.stdout.readline())
            if answer.get("id") == message["id"]:
                return answer
        return None

    rpc({"jsonrpc": "2.0", "id": 0, "method": "initialize",
         "params": {"protocolVersion": "2025-06-18", "capabilities": {}}})
    rpc({"jsonrpc": "2.0", "method": "notifications/initialized"})
    times = []
    for i in range(calls + WARMUP):
        start = time.perf_counter()
        answer = rpc({"jsonrpc": "2.0", "id": i + 1, "method": "tools/call",
                      "params": {"name": "read_file", "arguments": ARGS}})
        elapsed = time.perf_counter() - start
        assert not answer["result"].get("isError"), answer
        if i >= WARMUP:
            times.append(elapsed)
    proc.stdin.close()
    proc.wait()
    return times


def daemon(policy, calls, session=None):
    path = os.path.join(os.path.dirname(policy), "airlock.sock")
    proc = subprocess.Popen([AIRLOCK, "serve", "--policy", policy, "--socket", path, "--pool", "2"])
    while not os.path.exists(path):
        time.sleep(0.05)
    conn = socket.socket(socket.AF_UNIX)
    conn.connect(path)
    stream = conn.makefile("rwb")
    times = []
    for i in range(calls + WARMUP):
        start = time.perf_counter()
        request = {"id": i, "op": "call", "tool": "read_file", "arguments": ARGS}
        if session:
            request["session"] = session
        stream.write((json.dumps(request) + "\n").encode())
        stream.flush()
        answer = json.loads(stream.readline())
        elapsed = time.perf_counter() - start
        assert answer["result"]["ok"], answer
        if i >= WARMUP:
            times.append(elapsed)
    conn.close()
    proc.terminate()
    proc.wait()
    return times


def scratch_parent():
    """Where the policy's directory goes: run as root, `airlock serve` and `airlock mcp` refuse
    a policy that anyone else could change through its path, and the temporary directory is
    everyone's (sticky bit or not), so as root under /run/airlock-mcp-tests, root's and mode
    0755 (left in place, empty); else the temporary directory."""
    if os.geteuid() != 0:
        return None
    parent = "/run/airlock-mcp-tests"
    os.makedirs(parent, mode=0o755, exist_ok=True)
    st = os.lstat(parent)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0:
        raise SystemExit(f"bench: {parent} is not a directory of root's")
    os.chmod(parent, 0o755)
    return parent


def main():
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    order = sys.argv[2:] or ["mcp", "daemon", "mcp", "daemon"]
    results = {"mcp": [], "daemon": [], "daemon-session": []}
    with tempfile.TemporaryDirectory(prefix="airlock-mcp-bench-", dir=scratch_parent()) as scratch:
        policy = os.path.join(scratch, "policy.toml")
        with open(policy, "w") as f:
            f.write(POLICY)
        for name in order:
            if name == "mcp":
                results[name] += mcp(policy, calls)
            elif name == "daemon-session":
                # What a gateway session label alone costs (MCP calls carry one).
                results[name] += daemon(policy, calls, session="bench")
            else:
                results[name] += daemon(policy, calls)
    for name, times in results.items():
        if times:
            times.sort()
            p50, p90 = times[len(times) // 2] * 1000, times[int(len(times) * 0.9)] * 1000
            print(f"{name}: {len(times)} calls, p50 {p50:.3f} ms, p90 {p90:.3f} ms")


if __name__ == "__main__":
    main()
