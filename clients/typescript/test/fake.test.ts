/**
 * The client against stand-ins for a daemon that freeze, stay silent, or send answers too
 * long to read: what a real daemon cannot be made to do on cue. Timeouts here are hang
 * guards only; every wait is for an event.
 */

import assert from "node:assert/strict";
import { once } from "node:events";
import type * as net from "node:net";
import { describe, it } from "node:test";

import {
  AirlockClient,
  AnswerTooLargeError,
  ClientClosedError,
  ConnectError,
  SandboxCancelledError,
  createAirlockDriver,
} from "../dist/index.js";
import { until } from "./daemon.js";
import { record, startFake, startFrozenListener, type FakeConnection, type Json } from "./fake.js";

const T = { timeout: 60_000 };

describe("connecting, the handshake included, is bounded", T, () => {
  it("rejects with ConnectError when the daemon never accepts the connection", async () => {
    const frozen = await startFrozenListener();
    try {
      await assert.rejects(AirlockClient.connect(frozen.path, { connectTimeoutMs: 200 }), (error: unknown) => {
        assert.ok(error instanceof ConnectError, String(error));
        assert.match(error.message, /handshake within 200 ms/);
        return true;
      });
    } finally {
      await frozen.stop();
    }
  });

  it("close() ends a reconnection to a silent daemon: its socket goes, waiting calls reject", async () => {
    const fake = await startFake((request, connection) => connection.answer({ id: request["id"], result: record() }), {
      silent: (n) => n > 1,
    });
    const client = await AirlockClient.connect(fake.path, { connectTimeoutMs: 600_000 });
    try {
      fake.connections[0]?.socket.destroy();
      await until("the client to see the drop", () => !client.connected);
      const call = client.call("t", {});
      const second = await fake.accepted(2);
      await fake.request((r) => r["op"] === "health" && fake.requests.indexOf(r) > 0);
      await client.close();
      await assert.rejects(call, ClientClosedError);
      await second.ended;
    } finally {
      await client.close();
      await fake.close();
    }
  });

  it("the driver gives up connecting when the run's signal aborts, and close() ends the attempt", async () => {
    const frozen = await startFrozenListener();
    const driver = createAirlockDriver({ socketPath: frozen.path, connect: { connectTimeoutMs: 600_000 } });
    try {
      const controller = new AbortController();
      const run = driver.run(() => 1, [], { signal: controller.signal });
      controller.abort();
      await assert.rejects(run, (error: unknown) => {
        assert.ok(error instanceof SandboxCancelledError, String(error));
        assert.equal(error.kind, "cancelled");
        return true;
      });
    } finally {
      await driver.close();
      await frozen.stop();
    }
  });
});

/** Writes `data` in pieces of `size` bytes, each after the last drained. */
async function writeInPieces(socket: net.Socket, data: Buffer, size: number): Promise<void> {
  for (let at = 0; at < data.length && !socket.destroyed; at += size) {
    if (!socket.write(data.subarray(at, at + size))) {
      await once(socket, "drain");
    }
  }
}

describe("answers are read in linear time, within maxAnswerBytes", T, () => {
  it("reads a 32 MiB answer that comes in 64 KiB writes", async () => {
    const stdout = "0123456789abcdef".repeat(2 * 1024 * 1024);
    const fake = await startFake((request, connection) => {
      const line = JSON.stringify({ id: request["id"], result: record({ stdout }) }) + "\n";
      void writeInPieces(connection.socket, Buffer.from(line), 64 * 1024);
    });
    const client = await AirlockClient.connect(fake.path);
    try {
      const result = await client.call("t", {});
      assert.equal(result.stdout.length, stdout.length);
      assert.ok(result.stdout === stdout, "the answer's stdout, intact");
    } finally {
      await client.close();
      await fake.close();
    }
  });

  it("fails only the call whose answer is too long, and the connection stays usable", async () => {
    const limit = 4096;
    const head = (id: unknown) => `{"id":${JSON.stringify(id)},"result":{"call_id":"big","stdout":"`;
    const tail = `","tool":"t"}}\n`;
    const held: { small?: Json; big?: Json } = {};
    let connection: FakeConnection | undefined;
    const fake = await startFake((request, conn) => {
      connection = conn;
      const callId = request["call_id"];
      if (callId === "small") {
        held.small = request;
      } else if (callId === "big") {
        // More than the limit and no newline yet: the rest comes on "release".
        held.big = request;
        conn.socket.write(head(request["id"]) + "x".repeat(limit * 3));
      } else if (callId === "whole") {
        // An oversized answer whole, in one write.
        conn.socket.write(head(request["id"]) + "y".repeat(limit * 3) + tail);
      } else if (callId === "release") {
        if (held.big) {
          conn.socket.write("x".repeat(limit * 5) + tail);
          conn.answer({ id: held.small?.["id"], result: record({ call_id: "small" }) });
          delete held.big;
        }
        conn.answer({ id: request["id"], result: record({ call_id: "release" }) });
      }
    });
    const client = await AirlockClient.connect(fake.path, { maxAnswerBytes: limit });
    try {
      const small = client.call("t", {}, { callId: "small" });
      await fake.request((r) => r["call_id"] === "small");
      await assert.rejects(client.call("t", {}, { callId: "big" }), (error: unknown) => {
        assert.ok(error instanceof AnswerTooLargeError, String(error));
        assert.equal(error.limit, limit);
        return true;
      });
      const released = await client.call("t", {}, { callId: "release" });
      assert.equal(released.call_id, "release");
      assert.equal((await small).call_id, "small");
      await assert.rejects(client.call("t", {}, { callId: "whole" }), AnswerTooLargeError);
      assert.equal((await client.call("t", {}, { callId: "release" })).call_id, "release");
      assert.equal(fake.connections.length, 1, "one connection throughout");
      assert.ok(connection && !connection.socket.destroyed);
    } finally {
      await client.close();
      await fake.close();
    }
  });

  it("fails every call in flight when a too long answer's id cannot be read, then reconnects", async () => {
    const limit = 4096;
    const fake = await startFake((request, connection) => {
      if (request["call_id"] === "big") {
        connection.socket.write(`{"result":{"stdout":"${"x".repeat(limit * 3)}`);
      } else if (request["call_id"] === "after") {
        connection.answer({ id: request["id"], result: record({ call_id: "after" }) });
      }
    });
    const client = await AirlockClient.connect(fake.path, { maxAnswerBytes: limit });
    try {
      const waiting = client.call("t", {}, { callId: "waiting" });
      await fake.request((r) => r["call_id"] === "waiting");
      const big = client.call("t", {}, { callId: "big" });
      await assert.rejects(big, AnswerTooLargeError);
      await assert.rejects(waiting, AnswerTooLargeError);
      assert.equal((await client.call("t", {}, { callId: "after" })).call_id, "after");
      assert.equal(fake.connections.length, 2);
    } finally {
      await client.close();
      await fake.close();
    }
  });
});

/**
 * A daemon whose calls run until cancelled. `stats` ends the calls still running with a
 * successful record, so a call whose cancel never came shows as not cancelled.
 */
async function startHoldingFake() {
  const held = new Map<unknown, FakeConnection>();
  const fake = await startFake((request, connection) => {
    const id = request["id"];
    if (request["op"] === "call") {
      held.set(id, connection);
    } else if (request["op"] === "cancel") {
      const target = held.get(request["target"]);
      held.delete(request["target"]);
      const error = { kind: "cancelled", message: "cancelled by the client" };
      target?.answer({ id: request["target"], result: record({ ok: false, error, exit_code: null }) });
      connection.answer({ id, result: { cancelled: target !== undefined } });
    } else if (request["op"] === "stats") {
      for (const [callId, conn] of held) conn.answer({ id: callId, result: record() });
      held.clear();
      connection.answer({ id, result: {} });
    }
  });
  return { fake, held };
}

describe("cancelling", T, () => {
  it("cancels a call whose signal aborts just after it was sent", async () => {
    const { fake } = await startHoldingFake();
    const client = await AirlockClient.connect(fake.path);
    try {
      // However many turns the abort comes after, it is not lost.
      for (let turns = 0; turns < 6; turns += 1) {
        const controller = new AbortController();
        const call = client.call("t", {}, { signal: controller.signal });
        for (let i = 0; i < turns; i += 1) await null;
        controller.abort();
        await client.stats();
        const result = await call;
        assert.equal(result.error?.kind, "cancelled", `aborted after ${turns} turns: ${JSON.stringify(result)}`);
      }
    } finally {
      await client.close();
      await fake.close();
    }
  });

  it("stops waiting for a daemon that does not answer the cancel after cancelGraceMs", async () => {
    // Calls and cancels go unanswered.
    const fake = await startFake();
    const client = await AirlockClient.connect(fake.path, { cancelGraceMs: 50 });
    try {
      const controller = new AbortController();
      const call = client.call("t", {}, { signal: controller.signal, callId: "silent" });
      const sent = await fake.request((r) => r["call_id"] === "silent");
      controller.abort();
      const result = await call;
      assert.equal(result.ok, false);
      assert.equal(result.error?.kind, "cancelled");
      assert.equal(result.call_id, "silent");
      assert.match(result.error?.message ?? "", /did not answer the cancel within 50 ms/);
      const cancel = await fake.request((r) => r["op"] === "cancel");
      assert.equal(cancel["target"], sent["id"]);
    } finally {
      await client.close();
      await fake.close();
    }
  });

  it("sends nothing for a signal aborted before the call", async () => {
    const fake = await startFake((request, connection) => connection.answer({ id: request["id"], result: {} }));
    const client = await AirlockClient.connect(fake.path);
    try {
      const controller = new AbortController();
      controller.abort();
      const result = await client.call("t", {}, { signal: controller.signal });
      assert.equal(result.error?.kind, "cancelled");
      assert.equal(result.attempts, 0);
      // Requests go out in order: once stats is answered, a call sent before it was seen.
      await client.stats();
    } finally {
      await client.close();
      await fake.close();
    }
    assert.deepEqual(
      fake.requests.map((r) => r["op"]),
      ["health", "stats"],
    );
  });

  it("resolves cancelled when aborted while waiting to retry an overloaded call", async () => {
    const overloaded = { kind: "overloaded", message: "full", retry_after_ms: 3_600_000 };
    const fake = await startFake((request, connection) => {
      const result = record({ ok: false, error: overloaded, exit_code: null, call_id: "busy", attempts: 0 });
      connection.answer({ id: request["id"], result });
    });
    const client = await AirlockClient.connect(fake.path, { overloadRetry: { maxDelayMs: 3_600_000 } });
    try {
      const controller = new AbortController();
      const call = client.call("t", {}, { signal: controller.signal, callId: "busy" });
      // Answered overloaded at once: the abort comes in the retry's hour-long wait (or, on
      // a slow turn, as the answer is read, which ends the same way).
      await fake.request((r) => r["call_id"] === "busy");
      controller.abort();
      const result = await call;
      assert.equal(result.error?.kind, "cancelled");
      assert.equal(result.call_id, "busy");
    } finally {
      await client.close();
      await fake.close();
    }
  });
});
