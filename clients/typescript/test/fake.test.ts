/**
 * The client against stand-ins for a daemon that freeze, stay silent, or send answers too
 * long to read: what a real daemon cannot be made to do on cue. Timeouts here are hang
 * guards only; every wait is for an event.
 */

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import {
  AirlockClient,
  ClientClosedError,
  ConnectError,
  SandboxCancelledError,
  createAirlockDriver,
} from "../dist/index.js";
import { until } from "./daemon.js";
import { record, startFake, startFrozenListener } from "./fake.js";

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
