#!/usr/bin/env python3
"""A gateway written in another language: drives `airlock serve` over its JSON-lines
socket with nothing but the standard library. Used by tests/tests/suite/daemon.rs.

usage: daemon_client.py SOCKET SCENARIO
"""
import json
import signal
import socket
import sys
import time


class Client:
    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.file = self.sock.makefile("rwb")
        self.waiting = {}

    def send(self, request):
        self.file.write((json.dumps(request) + "\n").encode())
        self.file.flush()

    def send_raw(self, data):
        self.file.write(data)
        self.file.flush()

    def receive(self):
        line = self.file.readline()
        if not line:
            raise EOFError("daemon closed the connection")
        return json.loads(line)

    def call(self, request_id, tool, arguments, **extra):
        self.send({"id": request_id, "op": "call", "tool": tool, "arguments": arguments, **extra})


def expect(condition, message):
    if not condition:
        print("FAIL:", message, flush=True)
        sys.exit(1)


def basic(path):
    c = Client(path)
    c.send({"id": 1, "op": "health"})
    health = c.receive()
    expect(health["id"] == 1 and health["result"]["ok"] is True, health)

    c.send({"id": 2, "op": "tools"})
    tools = c.receive()["result"]["tools"]
    names = {t["name"] for t in tools}
    expect({"echo", "sleep"} <= names, names)
    expect(all("input_schema" in t for t in tools), tools)

    # Concurrent calls: a slow one first, fast ones after; answers come out of order. The
    # slow one runs until cancelled, so however long the fast ones take, it is still
    # running when they answer.
    c.call("slow", "sleep", {"seconds": "3600"})
    for i in range(3):
        c.call(f"fast-{i}", "echo", {"text": f"hello {i}"})
    for _ in range(3):
        response = c.receive()
        expect(response["id"].startswith("fast-"), f"responses should be out of order: {response}")
        result = response["result"]
        expect(result["ok"] is True, response)
        expect(result["stdout"] == "hello " + response["id"][5:] + "\n", result)

    # Cancel an in-flight call: the slow one.
    c.send({"id": "canceller", "op": "cancel", "target": "slow"})
    got = {}
    for _ in range(2):
        response = c.receive()
        got[response["id"]] = response
    expect(got["canceller"]["result"]["cancelled"] is True, got)
    expect(got["slow"]["result"]["error"]["kind"] == "cancelled", got)

    # Malformed requests get errors and the connection stays usable.
    c.send_raw(b"{not json\n")
    bad = c.receive()
    expect(bad["error"]["kind"] == "invalid_request" and bad["id"] is None, bad)
    c.send({"id": 3, "op": "frobnicate"})
    unknown = c.receive()
    expect(unknown["id"] == 3 and unknown["error"]["kind"] == "invalid_request", unknown)
    c.call(4, "echo", {"text": 5})
    invalid = c.receive()
    expect(invalid["result"]["error"]["kind"] == "invalid_input", invalid)
    c.call(5, "nope", {})
    expect(c.receive()["result"]["error"]["kind"] == "unknown_tool", "unknown tool")

    # Two-phase approval.
    c.send({"id": "p", "op": "propose", "tool": "guarded", "arguments": {"text": "approved"}})
    approval = c.receive()["result"]["approval"]
    c.send({"id": "e", "op": "execute", "approval_id": approval["approval_id"]})
    executed = c.receive()
    expect(executed["result"]["stdout"] == "approved\n", executed)
    c.send({"id": "e2", "op": "execute", "approval_id": approval["approval_id"]})
    again = c.receive()
    expect(again["result"]["error"]["kind"] == "approval_invalid", again)
    c.send({"id": "r", "op": "reject", "approval_id": approval["approval_id"]})
    expect(c.receive()["result"]["existed"] is False, "reject of a used approval")

    # Run-time tool state.
    c.send({"id": "s", "op": "set_state", "tool": "echo", "state": "suspended"})
    expect(c.receive()["result"]["state"] == "suspended", "set_state")
    c.call("after", "echo", {"text": "x"})
    error = c.receive()["result"]["error"]
    expect(error["kind"] == "tool_unavailable" and error["state"] == "suspended", error)
    c.send({"id": "s2", "op": "set_state", "tool": "echo", "state": "active"})
    c.receive()

    c.send({"id": "stats", "op": "stats"})
    stats = c.receive()["result"]
    expect(stats["calls"] >= 6, stats)
    print("ok", flush=True)


def disconnect(path):
    # Hang up when told to (SIGUSR1): the test first sees the call's tool running.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    c = Client(path)
    c.call("orphan", "sleep", {"seconds": sys.argv[3]})
    signal.sigwait({signal.SIGUSR1})
    c.sock.close()
    print("ok", flush=True)


def tools(path):
    c = Client(path)
    c.send({"id": 1, "op": "tools"})
    print(" ".join(sorted(t["name"] for t in c.receive()["result"]["tools"])), flush=True)


def refused(path):
    # The daemon answers a refused peer at once and hangs up: read, don't write.
    c = Client(path)
    response = c.receive()
    expect(response["error"]["kind"] == "forbidden", response)
    print("ok", flush=True)


def overload(path, together=False):
    c = Client(path)
    # The first call holds the only slot until cancelled, however slow the machine.
    first = {"id": "first", "op": "call", "tool": "sleep", "arguments": {"seconds": "3600"}}
    second = {"id": "second", "op": "call", "tool": "echo", "arguments": {"text": "x"}}
    if together:
        # Both requests in one write: the daemon reads them in one go.
        c.send_raw((json.dumps(first) + "\n" + json.dumps(second) + "\n").encode())
    else:
        c.send(first)
        # The second is sent once the first runs, in a write of its own.
        while True:
            c.send({"id": "stats", "op": "stats"})
            if c.receive()["result"]["in_flight"] == 1:
                break
            time.sleep(0.01)
        c.send(second)
    turned_away = c.receive()
    error = turned_away["result"].get("error") or {}
    expect(turned_away["id"] == "second" and error.get("kind") == "overloaded", turned_away)
    c.send({"id": "cancel", "op": "cancel", "target": "first"})
    responses = {}
    for _ in range(2):
        r = c.receive()
        responses[r["id"]] = r
    expect(responses["first"]["result"]["error"]["kind"] == "cancelled", responses)
    # The slot is free again once the first call is over.
    c.send(second)
    again = c.receive()
    expect(again["result"]["ok"] is True, again)
    print("ok", flush=True)


def overload_together(path):
    overload(path, together=True)


if __name__ == "__main__":
    {"basic": basic, "disconnect": disconnect, "tools": tools, "refused": refused, "overload": overload,
     "overload_together": overload_together}[sys.argv[2]](sys.argv[1])
