/**
 * Session workspaces against a real daemon: the agent loop (open, put a file, a tool edits
 * it, read it back, list the changes, close), isolation between sessions, and the typed
 * errors of a session that is gone or of one too many.
 */

import assert from "node:assert/strict";
import { chmodSync } from "node:fs";
import { after, before, describe, it } from "node:test";

import {
  AirlockClient,
  RequestError,
  SessionLimitError,
  SessionUnknownError,
  WorkspaceFullError,
  type Session,
} from "../dist/index.js";
import { startDaemon, testPolicy, type Daemon } from "./daemon.js";

const T = { timeout: 120_000 };

/** The tests' policy plus sessions and a tool that runs a script in the workspace. */
function sessionPolicy(): string {
  return `${testPolicy()}

[sessions]
max_sessions = 2
max_size = "1MiB"

[profiles.workspace]
read = ["/usr"]
read_optional = ["/bin", "/lib", "/lib64", "/etc/ld.so.cache", "/etc/alternatives"]
tmpfs = { "/tmp" = "16MiB" }
limits = { timeout = "60s" }
workspace = "/workspace"
workspace_size = "64KiB"
cwd = "/workspace"

[tools.sh]
description = "Run a script in the session's workspace"
profile = "workspace"
command = ["/bin/sh", "-c", "{script}"]
side_effect = "write"
concurrency_safe = true
input = { type = "object", properties = { script = { type = "string" } }, required = ["script"] }
`;
}

describe("session workspaces against a real daemon", T, () => {
  let daemon: Daemon;
  let client: AirlockClient;

  before(async () => {
    daemon = await startDaemon({ policy: sessionPolicy() });
    // As root the sandbox runs as uid 65534, which must pass through the socket's
    // directory to reach its session's files.
    chmodSync(daemon.dir, 0o755);
    client = await AirlockClient.connect(daemon.socket);
  });
  after(async () => {
    await client?.close();
    await daemon?.dispose();
  });

  it("runs the agent loop: put, a tool edits, get sees it, changes list it, close", async () => {
    const session = await client.openSession();
    assert.match(session.id, /^[0-9a-f]{32}$/);
    assert.equal(session.isolation, "empty");
    assert.equal(session.size, 64 * 1024);
    assert.ok(session.expiresAt > Date.now() - 60_000);

    assert.deepEqual(await session.putFile("src/notes.txt", "one\n"), { size: 4 });
    await session.putFile("data.bin", new Uint8Array([0, 1, 2, 255]));
    const edited = await session.call("sh", { script: "echo two >> src/notes.txt && cat src/notes.txt" });
    assert.equal(edited.ok, true, JSON.stringify(edited.error) + edited.stderr);
    assert.equal(edited.stdout, "one\ntwo\n");

    assert.equal((await session.getFile("src/notes.txt")).toString("utf8"), "one\ntwo\n");
    assert.deepEqual([...(await session.getFile("data.bin"))], [0, 1, 2, 255]);
    assert.deepEqual(await session.changes(), [
      { path: "data.bin", kind: "added", size: 4 },
      { path: "src/notes.txt", kind: "added", size: 8 },
    ]);

    await session.close();
    await assert.rejects(session.getFile("src/notes.txt"), SessionUnknownError);
    await assert.rejects(session.changes(), SessionUnknownError);
    await assert.rejects(session.close(), SessionUnknownError);
    const refused = await session.call("sh", { script: "true" });
    assert.equal(refused.ok, false);
    assert.equal(refused.error?.kind, "session_unknown");
  });

  it("keeps each session's files from every other session", async () => {
    const first = await client.openSession();
    const second = await client.openSession();
    try {
      await first.putFile("secret.txt", "first's");
      await assert.rejects(second.getFile("secret.txt"), (error: unknown) => {
        assert.ok(error instanceof RequestError && !(error instanceof SessionUnknownError), String(error));
        return true;
      });
      const looked = await second.call("sh", { script: "ls -A /workspace" });
      assert.equal(looked.ok, true, JSON.stringify(looked.error));
      assert.equal(looked.stdout, "");
      assert.deepEqual(await second.changes(), []);
    } finally {
      await first.close();
      await second.close();
    }
  });

  it("throws typed errors for one session too many and a file that does not fit", async () => {
    const a = await client.openSession();
    const b = await client.openSession();
    try {
      await assert.rejects(client.openSession(), SessionLimitError);
      await assert.rejects(a.putFile("big", new Uint8Array(128 * 1024)), WorkspaceFullError);
      await assert.rejects(a.putFile("../escape", "x"), (error: unknown) => {
        assert.ok(error instanceof RequestError, String(error));
        assert.equal(error.kind, "invalid_request");
        return true;
      });
    } finally {
      await a.close();
      await b.close();
    }
    const again: Session = await client.openSession({ size: "16KiB" });
    assert.equal(again.size, 16 * 1024);
    await again.close();
  });

  it("sets a tool's state and plan mode for one session only", async () => {
    const narrowed = await client.openSession();
    const planning = await client.openSession({ planMode: true });
    try {
      assert.deepEqual(await narrowed.setState("echo", "suspended"), { tool: "echo", state: "suspended" });
      const refused = await narrowed.call("echo", { text: "hi" });
      assert.equal(refused.error?.kind, "tool_unavailable");
      assert.equal(refused.error?.state, "suspended");
      const elsewhere = await planning.call("echo", { text: "hi" }, { dryRun: true });
      assert.ok("dry_run" in elsewhere && elsewhere.dry_run.decision === "allow", JSON.stringify(elsewhere));
      assert.equal((await client.tools()).find((t) => t.name === "echo")?.state, "active");
      assert.equal((await narrowed.tools()).find((t) => t.name === "echo")?.state, "suspended");
      assert.equal((await planning.tools()).find((t) => t.name === "echo")?.state, "active");

      const denied = await planning.call("sh", { script: "touch x" }, { planMode: false });
      assert.equal(denied.error?.kind, "denied");
      assert.equal(denied.error?.rule, "plan_mode");
      assert.deepEqual(await planning.changes(), []);
    } finally {
      await narrowed.close();
      await planning.close();
    }
    await assert.rejects(narrowed.setState("echo", "active"), SessionUnknownError);
    await assert.rejects(planning.setPlanMode(true), SessionUnknownError);
    await assert.rejects(client.setState("echo", "active", { session: narrowed.id }), SessionUnknownError);
    await assert.rejects(client.setState("nope", "active", { session: narrowed.id }), (error: unknown) => {
      assert.ok(error instanceof RequestError && error.kind === "unknown_tool", String(error));
      return true;
    });
  });

  it("changes a session's plan mode after it opened", async () => {
    const session = await client.openSession();
    try {
      assert.deepEqual(await session.setPlanMode(true), { session: session.id, plan_mode: true });
      const denied = await session.call("sh", { script: "touch x" });
      assert.equal(denied.error?.rule, "plan_mode");
      // No approver role on this daemon: every allowed peer may lift it.
      assert.deepEqual(await client.setPlanMode(session.id, false), { session: session.id, plan_mode: false });
      const ran = await session.call("sh", { script: "touch x" });
      assert.equal(ran.ok, true, JSON.stringify(ran));
    } finally {
      await session.close();
    }
  });
});

describe("a session's plan mode with an approver role", T, () => {
  it("is tightened by anyone and lifted by approvers only", async () => {
    const daemon = await startDaemon({ policy: sessionPolicy(), args: ["--approver-uid", "4242"] });
    const client = await AirlockClient.connect(daemon.socket);
    try {
      const session = await client.openSession();
      await session.setPlanMode(true);
      await assert.rejects(session.setPlanMode(false), (error: unknown) => {
        assert.ok(error instanceof RequestError && error.kind === "forbidden", String(error));
        return true;
      });
      const still = await session.call("sh", { script: "true" }, { dryRun: true });
      assert.ok("dry_run" in still && still.dry_run.decision === "deny", JSON.stringify(still));
    } finally {
      await client.close();
      await daemon.dispose();
    }
  });
});
