import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import {
  AirlockClient,
  SandboxCancelledError,
  SandboxError,
  SandboxFunctionError,
  SandboxOOMError,
  SandboxSerializationError,
  SandboxTimeoutError,
  createAirlockDriver,
  type AirlockDriver,
  type SandboxDriver,
} from "../dist/index.js";
import { startDaemon, until, type Daemon } from "./daemon.js";

const T = { timeout: 180_000 };

describe("the sandbox driver against a real daemon", T, () => {
  let daemon: Daemon;
  let driver: AirlockDriver;
  let observer: AirlockClient;

  before(async () => {
    daemon = await startDaemon();
    driver = createAirlockDriver({ socketPath: daemon.socket });
    observer = await AirlockClient.connect(daemon.socket);
  });
  after(async () => {
    await driver?.close();
    await observer?.close();
    await daemon?.dispose();
  });

  it("has the framework's shape", () => {
    const generic: SandboxDriver = driver;
    assert.equal(generic.name, "airlock");
    assert.equal(generic.permissions?.network, false);
    assert.equal(typeof generic.close, "function");
  });

  it("runs a function and resolves with its computed JSON value", async () => {
    const value = await driver.run(
      (a: number, b: number, words: string[]) => {
        console.log("noise on stdout goes to stderr, not into the result");
        return { sum: a + b, squares: [a, b].map((x) => x * x), joined: words.join("-"), nothing: null };
      },
      [3, 4, ["x", "y"]],
    );
    assert.deepEqual(value, { sum: 7, squares: [9, 16], joined: "x-y", nothing: null });
  });

  it("awaits async functions and passes undefined through", async () => {
    const value = await driver.run(async (n: number) => {
      await new Promise((resolve) => setTimeout(resolve, 5));
      return n * 2;
    }, [21]);
    assert.equal(value, 42);
    assert.equal(await driver.run(() => undefined, []), undefined);
    assert.equal(await driver.run(() => process.version.startsWith("v"), []), true);
  });

  it("runs a method written in shorthand", async () => {
    const helpers = {
      double(x: number) {
        return x * 2;
      },
      async triple(x: number) {
        return x * 3;
      },
    };
    assert.equal(await driver.run(helpers.double, [21]), 42);
    assert.equal(await driver.run(helpers.triple, [5]), 15);
  });

  it("rejects with the function's error when it throws", async () => {
    await assert.rejects(
      driver.run(() => {
        throw new TypeError("the input was wrong");
      }, []),
      (error: unknown) => {
        assert.ok(error instanceof SandboxFunctionError, String(error));
        assert.ok(error instanceof SandboxError);
        assert.equal(error.message, "the input was wrong");
        assert.equal(error.remoteName, "TypeError");
        assert.equal(error.kind, "function_threw");
        assert.match(error.remoteStack, /the input was wrong/);
        return true;
      },
    );
    await assert.rejects(
      driver.run(async () => Promise.reject(new RangeError("async too")), []),
      (error: unknown) => error instanceof SandboxFunctionError && error.message === "async too",
    );
  });

  it("says so when the function reached for a closure that does not exist in the sandbox", async () => {
    const secret = 42;
    await assert.rejects(driver.run(() => secret + 1, []), (error: unknown) => {
      assert.ok(error instanceof SandboxFunctionError);
      assert.equal(error.remoteName, "ReferenceError");
      assert.match(error.message, /secret is not defined/);
      assert.match(error.message, /pass them as args/);
      return true;
    });
  });

  it("refuses native and bound functions and non-JSON arguments before sending anything", async () => {
    const before = (await observer.stats()).requests;
    await assert.rejects(driver.run(Math.max as never, [1, 2]), SandboxSerializationError);
    await assert.rejects(driver.run(((x: number) => x).bind(null), [1]), SandboxSerializationError);
    await assert.rejects(driver.run(class Foo {} as never, []), SandboxSerializationError);
    await assert.rejects(driver.run((m: unknown) => m, [new Map()]), /Map, not plain JSON/);
    await assert.rejects(driver.run((n: unknown) => n, [Number.NaN]), /JSON cannot carry/);
    await assert.rejects(driver.run((n: unknown) => n, [() => 1]), /function, which JSON cannot carry/);
    const cyclic: Record<string, unknown> = {};
    cyclic["self"] = cyclic;
    await assert.rejects(driver.run((n: unknown) => n, [cyclic]), /refers to itself/);
    assert.equal((await observer.stats()).requests, before + 1, "nothing reached the daemon");
  });

  it("rejects a result JSON cannot carry", async () => {
    await assert.rejects(driver.run(() => BigInt(1), []), (error: unknown) => {
      assert.ok(error instanceof SandboxFunctionError);
      assert.match(error.message, /BigInt/);
      return true;
    });
  });

  it("confines the function: no host files but the system's, no network", async () => {
    await assert.rejects(
      driver.run(() => require("fs").readFileSync("/etc/passwd", "utf8"), []),
      (error: unknown) => error instanceof SandboxFunctionError && /ENOENT/.test(error.message),
    );
    await assert.rejects(
      driver.run(() => require("fs").writeFileSync("/usr/owned", "x"), []),
      (error: unknown) => error instanceof SandboxFunctionError && /EROFS|EACCES|EPERM/.test(error.message),
    );
    const connect = () =>
      new Promise((resolve, reject) => {
        const socket = require("net").connect(53, "1.1.1.1");
        socket.on("connect", () => resolve("connected"));
        socket.on("error", (e: Error) => reject(e));
      });
    await assert.rejects(driver.run(connect, []), SandboxFunctionError);
  });

  it("rejects with SandboxTimeoutError when the function loops past the tool's deadline", async () => {
    const short = createAirlockDriver({ socketPath: daemon.socket, tool: "run_js_short" });
    try {
      const started = Date.now();
      await assert.rejects(
        short.run(() => {
          for (;;) {
            // spin
          }
        }, []),
        (error: unknown) => {
          assert.ok(error instanceof SandboxTimeoutError, String(error));
          assert.equal(error.kind, "timeout");
          assert.equal(error.result?.error?.timeout_ms, 1000);
          return true;
        },
      );
      assert.ok(Date.now() - started < 30_000);
    } finally {
      await short.close();
    }
  });

  it("rejects with SandboxOOMError when the function allocates past the memory limit", async () => {
    const small = createAirlockDriver({ socketPath: daemon.socket, tool: "run_js_small" });
    try {
      await assert.rejects(
        small.run(() => {
          const kept: Buffer[] = [];
          for (;;) {
            kept.push(Buffer.alloc(1 << 20, 1));
          }
        }, []),
        (error: unknown) => {
          assert.ok(error instanceof SandboxOOMError, String(error));
          return true;
        },
      );
    } finally {
      await small.close();
    }
  });

  it("cancels a run through its AbortSignal", async () => {
    const controller = new AbortController();
    const run = driver.run(() => new Promise(() => setInterval(() => {}, 1000)), [], { signal: controller.signal });
    await until("the function to be running", async () => (await observer.stats()).in_flight >= 1);
    controller.abort();
    await assert.rejects(run, (error: unknown) => {
      assert.ok(error instanceof SandboxCancelledError, String(error));
      assert.equal(error.kind, "cancelled");
      return true;
    });
  });

  it("refuses to run once closed", async () => {
    const own = createAirlockDriver({ socketPath: daemon.socket });
    assert.equal(await own.run(() => 1, []), 1);
    await own.close();
    await assert.rejects(own.run(() => 1, []), SandboxError);
  });
});
