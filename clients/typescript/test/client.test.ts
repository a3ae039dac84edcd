import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import * as net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";

import {
  AirlockClient,
  ClientClosedError,
  ConnectError,
  ConnectionLostError,
  DaemonRefusedError,
  PROTOCOL_VERSION,
  ProtocolMismatchError,
  RequestError,
  TransportError,
  isApproval,
  isDryRun,
  type ToolResult,
} from "../dist/index.js";
import { startDaemon, until, type Daemon } from "./daemon.js";

const T = { timeout: 120_000 };

describe("a client against a real daemon", T, () => {
  let daemon: Daemon;
  let client: AirlockClient;

  before(async () => {
    daemon = await startDaemon();
    client = await AirlockClient.connect(daemon.socket);
  });
  after(async () => {
    await client?.close();
    await daemon?.dispose();
  });

  it("checks the protocol version on connect and answers health", async () => {
    assert.equal(client.daemon?.protocol_version, PROTOCOL_VERSION);
    const health = await client.health();
    assert.equal(health.ok, true);
    assert.equal(health.protocol_version, 1);
    assert.equal(typeof health.version, "string");
    assert.equal(typeof health.policy_version, "string");
  });

  it("lists the policy's tools with their schemas and states", async () => {
    const tools = await client.tools();
    const names = tools.map((t) => t.name);
    for (const name of ["echo", "sleep", "guarded", "run_js"]) {
      assert.ok(names.includes(name), `${name} in ${names}`);
    }
    const echo = tools.find((t) => t.name === "echo");
    assert.equal(echo?.state, "active");
    assert.equal(echo?.side_effect, "read");
    assert.deepEqual((echo?.input_schema as { required: string[] }).required, ["text"]);
    assert.equal(tools.find((t) => t.name === "guarded")?.approval, "human");
  });

  it("calls a tool and resolves with the daemon's result record, unchanged", async () => {
    const result = await client.call("echo", { text: "hello" }, { callId: "ts-call-1", session: "s1" });
    assert.equal(result.ok, true, JSON.stringify(result));
    assert.equal(result.stdout, "hello\n");
    assert.equal(result.exit_code, 0);
    assert.equal(result.call_id, "ts-call-1");
    assert.equal(result.tool, "echo");
    assert.equal(result.error, null);
    assert.equal(result.attempts, 1);
    assert.equal(typeof result.duration_ms, "number");
    assert.equal(result.isolation?.backend, "airlock");
  });

  it("answers a dry run with what would run", async () => {
    const answer = await client.call("echo", { text: "x" }, { dryRun: true });
    assert.ok(isDryRun(answer), JSON.stringify(answer));
    assert.equal(answer.dry_run.decision, "allow");
    assert.deepEqual(answer.dry_run.argv, ["/usr/bin/echo", "x"]);
  });

  it("resolves invalid input as a result, never a throw", async () => {
    const result = await client.call("echo", { text: 5 });
    assert.equal(result.ok, false);
    assert.equal(result.error?.kind, "invalid_input");
    assert.ok((result.error?.violations?.length ?? 0) > 0, JSON.stringify(result.error));
  });

  it("resolves an unknown tool as a result", async () => {
    const result = await client.call("no_such_tool", {});
    assert.equal(result.ok, false);
    assert.equal(result.error?.kind, "unknown_tool");
  });

  it("throws RequestError for a request the daemon refuses as malformed, and stays usable", async () => {
    await assert.rejects(client.call("echo", { text: "x" }, { timeoutMs: 0 }), (error: unknown) => {
      assert.ok(error instanceof RequestError);
      assert.equal(error.kind, "invalid_request");
      assert.match(error.message, /timeout_ms/);
      return true;
    });
    await assert.rejects(client.setState("no_such_tool", "suspended"), (error: unknown) => {
      assert.ok(error instanceof RequestError);
      assert.equal(error.kind, "unknown_tool");
      return true;
    });
    const big = "x".repeat(3 * 1024 * 1024);
    await assert.rejects(client.call("echo", { text: big }), RequestError);
    assert.equal((await client.call("echo", { text: "still here" })).stdout, "still here\n");
  });

  it("matches many concurrent calls on one connection to their answers", async () => {
    const slow = new AbortController();
    const sleeping = client.call("sleep", { seconds: "3600" }, { signal: slow.signal });
    let slowDone = false;
    void sleeping.then(() => (slowDone = true));
    const texts = Array.from({ length: 40 }, (_, i) => `call number ${i} ${"!".repeat(i)}`);
    const results = await Promise.all(texts.map((text) => client.call("echo", { text })));
    results.forEach((result, i) => {
      assert.equal(result.ok, true, JSON.stringify(result));
      assert.equal(result.stdout, `${texts[i]}\n`);
    });
    // The slow call was sent first and is answered last: answers came out of order.
    assert.equal(slowDone, false);
    slow.abort();
    const ended = await sleeping;
    assert.equal(ended.error?.kind, "cancelled");
  });

  it("cancels a running call through its AbortSignal", async () => {
    const controller = new AbortController();
    const before = await client.stats();
    const call = client.call("sleep", { seconds: "3600" }, { signal: controller.signal });
    await until("the sleep to be running", async () => (await client.stats()).in_flight >= 1);
    const started = Date.now();
    controller.abort();
    const result = await call;
    assert.equal(result.ok, false);
    assert.equal(result.error?.kind, "cancelled", JSON.stringify(result));
    assert.ok(result.attempts >= 1, "it ran, then was cancelled");
    assert.ok(Date.now() - started < 30_000);
    assert.ok((await client.stats()).calls > before.calls);
  });

  it("does not send a call whose signal is already aborted", async () => {
    const controller = new AbortController();
    controller.abort();
    const before = (await client.stats()).requests;
    const result = await client.call("echo", { text: "x" }, { signal: controller.signal });
    assert.equal(result.error?.kind, "cancelled");
    assert.equal(result.attempts, 0);
    // Only the stats request itself reached the daemon.
    assert.equal((await client.stats()).requests, before + 1);
  });

  it("runs approvals: propose, execute once, reject", async () => {
    const needs = await client.call("guarded", { text: "approved" });
    assert.equal(needs.error?.kind, "approval_required");
    assert.equal(needs.error?.rule, "approval");

    const proposed = await client.propose("guarded", { text: "approved" }, { session: "human-1" });
    assert.ok(isApproval(proposed), JSON.stringify(proposed));
    const approval = proposed.approval;
    assert.match(approval.approval_id, /^[0-9a-f]{32}$/);
    assert.deepEqual(approval.arguments, { text: "approved" });
    assert.deepEqual(approval.argv_preview, ["/usr/bin/echo", "approved"]);
    assert.equal(approval.session, "human-1");
    assert.equal((await client.stats()).pending_approvals, 1);

    const wrongSession = await client.execute(approval.approval_id, { session: "someone-else" });
    assert.equal(wrongSession.error?.kind, "approval_invalid");

    const second = await client.propose("guarded", { text: "approved" }, { session: "human-1" });
    assert.ok(isApproval(second));
    const executed = await client.execute(second.approval.approval_id, { session: "human-1" });
    assert.equal(executed.ok, true, JSON.stringify(executed));
    assert.equal(executed.stdout, "approved\n");
    const again = await client.execute(second.approval.approval_id, { session: "human-1" });
    assert.equal(again.error?.kind, "approval_invalid");
    assert.equal(await client.reject(second.approval.approval_id), false);

    const third = await client.propose("guarded", { text: "no" });
    assert.ok(isApproval(third));
    assert.equal(await client.reject(third.approval.approval_id), true);
    const refused = await client.propose("guarded", { text: 5 });
    assert.ok(!isApproval(refused));
    assert.equal(refused.error?.kind, "invalid_input");
  });

  it("sets a tool's state", async () => {
    assert.deepEqual(await client.setState("echo", "suspended"), { tool: "echo", state: "suspended" });
    const result = await client.call("echo", { text: "x" });
    assert.equal(result.error?.kind, "tool_unavailable");
    assert.equal(result.error?.state, "suspended");
    await client.setState("echo", "active");
    assert.equal((await client.call("echo", { text: "x" })).ok, true);
  });

  it("counts calls in stats", async () => {
    const stats = await client.stats();
    assert.ok(stats.calls >= 5, JSON.stringify(stats));
    assert.equal(stats.max_concurrent, 8);
    assert.equal(typeof stats.pool, "object");
  });
});

describe("protocol version", T, () => {
  it("refuses a daemon speaking another protocol_version, naming both", async () => {
    // A stand-in daemon: only the handshake matters here.
    const dir = mkdtempSync(join(tmpdir(), "airlock-ts-fake-"));
    const path = join(dir, "fake.sock");
    const server = net.createServer((socket) => {
      socket.setEncoding("utf8");
      socket.on("data", (line: string) => {
        const request = JSON.parse(line.trim()) as { id: string };
        const result = { ok: true, version: "9.9.9", protocol_version: 2, policy_version: "x" };
        socket.write(JSON.stringify({ id: request.id, result }) + "\n");
      });
    });
    await new Promise<void>((resolve) => server.listen(path, resolve));
    try {
      await assert.rejects(AirlockClient.connect(path), (error: unknown) => {
        assert.ok(error instanceof ProtocolMismatchError);
        assert.equal(error.expected, 1);
        assert.equal(error.actual, 2);
        assert.match(error.message, /protocol_version 2/);
        assert.match(error.message, /protocol_version 1/);
        return true;
      });
    } finally {
      server.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("throws ConnectError when nothing listens", async () => {
    await assert.rejects(AirlockClient.connect("/nonexistent/airlock.sock"), (error: unknown) => {
      assert.ok(error instanceof ConnectError);
      assert.ok(error instanceof TransportError);
      assert.match(error.message, /ENOENT/);
      return true;
    });
  });
});

describe("a daemon with one slot and no queue", T, () => {
  let daemon: Daemon;
  let holder: AirlockClient;

  before(async () => {
    daemon = await startDaemon({ args: ["--max-concurrent", "1", "--max-queued", "0"] });
    holder = await AirlockClient.connect(daemon.socket);
  });
  after(async () => {
    await holder?.close();
    await daemon?.dispose();
  });

  /** Takes the only slot until the returned function is called. */
  async function holdTheSlot(): Promise<() => Promise<ToolResult>> {
    const controller = new AbortController();
    const call = holder.call("sleep", { seconds: "3600" }, { signal: controller.signal });
    await until("the slot to be taken", async () => (await holder.stats()).in_flight === 1);
    return async () => {
      controller.abort();
      return call;
    };
  }

  it("answers overloaded with retry_after_ms when retries are off", async () => {
    const release = await holdTheSlot();
    const client = await AirlockClient.connect(daemon.socket, { overloadRetry: false });
    try {
      const result = await client.call("echo", { text: "x" }, { callId: "turned-away" });
      assert.equal(result.error?.kind, "overloaded", JSON.stringify(result));
      assert.equal(typeof result.error?.retry_after_ms, "number");
      assert.equal(result.call_id, "turned-away");
    } finally {
      assert.equal((await release()).error?.kind, "cancelled");
      await client.close();
    }
  });

  it("retries an overloaded call after retry_after_ms until it gets the slot", async () => {
    const release = await holdTheSlot();
    // Enough retries (about 100 ms apart) to outlast the holder's cancellation on a busy machine.
    const client = await AirlockClient.connect(daemon.socket, { overloadRetry: { maxRetries: 300 } });
    try {
      const before = (await holder.stats()).overloaded;
      const call = client.call("echo", { text: "patient" });
      await until("two turned-away attempts", async () => (await holder.stats()).overloaded >= before + 2);
      await release();
      const result = await call;
      assert.equal(result.ok, true, JSON.stringify(result));
      assert.equal(result.stdout, "patient\n");
    } finally {
      await client.close();
    }
  });

  it("bounds the retries and then resolves with the overloaded result", async () => {
    const release = await holdTheSlot();
    const client = await AirlockClient.connect(daemon.socket, { overloadRetry: { maxRetries: 2, maxDelayMs: 20 } });
    try {
      const before = (await holder.stats()).overloaded;
      const result = await client.call("echo", { text: "x" });
      assert.equal(result.error?.kind, "overloaded");
      assert.equal((await holder.stats()).overloaded - before, 3, "one attempt and two retries");
    } finally {
      await release();
      await client.close();
    }
  });

  it("stops retrying when the signal aborts", async () => {
    const release = await holdTheSlot();
    const client = await AirlockClient.connect(daemon.socket, { overloadRetry: { maxRetries: 1000 } });
    try {
      const before = (await holder.stats()).overloaded;
      const controller = new AbortController();
      const call = client.call("echo", { text: "x" }, { signal: controller.signal });
      await until("a turned-away attempt", async () => (await holder.stats()).overloaded > before);
      controller.abort();
      const result = await call;
      assert.equal(result.error?.kind, "cancelled");
    } finally {
      await release();
      await client.close();
    }
  });
});

describe("a daemon that turns away a second connection", T, () => {
  let daemon: Daemon;
  before(async () => {
    daemon = await startDaemon({ args: ["--max-connections", "1"] });
  });
  after(async () => daemon?.dispose());

  it("throws a transport error, DaemonRefusedError with the retry hint when it could read it", async () => {
    // The probe that saw the socket listening may still hold the one place for a moment.
    const first = await AirlockClient.connect(daemon.socket, { connectAttempts: 10 });
    try {
      await assert.rejects(AirlockClient.connect(daemon.socket), (error: unknown) => {
        // The daemon writes its refusal and closes at once: when the handshake's write
        // comes after the close (EPIPE), the refusal line is gone unread.
        assert.ok(error instanceof TransportError, String(error));
        if (error instanceof DaemonRefusedError) {
          assert.equal(error.kind, "overloaded");
          assert.equal(typeof error.retryAfterMs, "number");
        } else {
          assert.ok(error instanceof ConnectionLostError, String(error));
          assert.match(error.message, /before answering the handshake/);
        }
        return true;
      });
    } finally {
      await first.close();
    }
  });
});

describe("a daemon that dies and comes back", T, () => {
  let daemon: Daemon;
  let client: AirlockClient;
  before(async () => {
    daemon = await startDaemon();
    client = await AirlockClient.connect(daemon.socket, { reconnect: { attempts: 3, initialDelayMs: 10, maxDelayMs: 50 } });
  });
  after(async () => {
    await client?.close();
    await daemon?.dispose();
  });

  it("fails the calls in flight with a transport error instead of hanging", async () => {
    const sleeping = client.call("sleep", { seconds: "3600" });
    const other = client.call("sleep", { seconds: "3600" });
    // Observed from the start: they reject while the daemon is being killed.
    const failures = [sleeping, other].map((call) =>
      assert.rejects(call, (error: unknown) => {
        assert.ok(error instanceof ConnectionLostError, String(error));
        assert.ok(error instanceof TransportError);
        return true;
      }),
    );
    await until("both calls to run", async () => (await client.stats()).in_flight >= 2);
    await daemon.kill();
    await Promise.all(failures);
    assert.equal(client.connected, false);
  });

  it("gives up reconnecting after its bounded attempts while the daemon is down", async () => {
    const started = Date.now();
    await assert.rejects(client.call("echo", { text: "x" }), (error: unknown) => {
      assert.ok(error instanceof ConnectError, String(error));
      assert.equal(error.attempts, 3);
      return true;
    });
    assert.ok(Date.now() - started < 10_000);
  });

  it("reconnects on the next call once the daemon is back", async () => {
    await daemon.restart();
    const result = await client.call("echo", { text: "back" });
    assert.equal(result.ok, true, JSON.stringify(result));
    assert.equal(result.stdout, "back\n");
    assert.equal(client.connected, true);
    assert.equal(client.daemon?.protocol_version, 1);
  });

  it("rejects in-flight and later requests once closed", async () => {
    const call = client.call("sleep", { seconds: "3600" });
    await until("the call to run", async () => (await client.stats()).in_flight >= 1);
    await client.close();
    await assert.rejects(call, ClientClosedError);
    await assert.rejects(client.call("echo", { text: "x" }), ClientClosedError);
  });
});
