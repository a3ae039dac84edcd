// airlock mcp driven by the official MCP TypeScript SDK client: what a real MCP host sees.
// Every wait is for an event (an answer, a notification, a process gone), never a clock.
import { test } from "node:test";
import assert from "node:assert/strict";
import {
  chmodSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  readdirSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import {
  ElicitRequestSchema,
  ToolListChangedNotificationSchema,
} from "@modelcontextprotocol/sdk/types.js";

const here = dirname(fileURLToPath(import.meta.url));
const airlock = process.env.AIRLOCK_BIN ?? resolve(here, "../../../target/debug/airlock");
const policyText = readFileSync(join(here, "..", "policy.toml"), "utf8");

/**
 * A fresh directory for a copy of the policy. Run as root, `airlock mcp` refuses a policy
 * that anyone else could change through its path, and the system temporary directory is
 * everyone's (sticky bit or not): as root it goes under /run/airlock-mcp-tests, root's and
 * mode 0755, left in place empty (ci-test removes it).
 */
function scratchDir() {
  if (process.geteuid() !== 0) {
    return mkdtempSync(join(tmpdir(), "airlock-mcp-"));
  }
  const parent = "/run/airlock-mcp-tests";
  mkdirSync(parent, { recursive: true, mode: 0o755 });
  const st = lstatSync(parent);
  if (!st.isDirectory() || st.uid !== 0) {
    throw new Error(`${parent} is not a directory of root's`);
  }
  chmodSync(parent, 0o755);
  return mkdtempSync(join(parent, "airlock-mcp-"));
}

/** A client connected to a fresh `airlock mcp` on a copy of the policy. */
async function connect({ elicitation = null, extra = [] } = {}) {
  const dir = scratchDir();
  const policy = join(dir, "policy.toml");
  writeFileSync(policy, policyText);
  const transport = new StdioClientTransport({
    command: airlock,
    args: ["mcp", "--policy", policy, ...extra],
    stderr: "inherit",
  });
  const capabilities = elicitation ? { elicitation: {} } : {};
  const client = new Client({ name: "airlock-conformance", version: "0" }, { capabilities });
  if (elicitation) {
    client.setRequestHandler(ElicitRequestSchema, elicitation);
  }
  await client.connect(transport);
  return {
    client,
    transport,
    policy,
    async close() {
      await client.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

function text(result) {
  return result.content?.[0]?.text ?? "";
}

/** Host processes whose command line contains `marker`. */
function processesWith(marker) {
  const found = [];
  for (const pid of readdirSync("/proc")) {
    if (!/^[0-9]+$/.test(pid)) continue;
    try {
      const cmdline = readFileSync(`/proc/${pid}/cmdline`, "utf8").replaceAll("\0", " ");
      if (cmdline.includes(marker)) found.push(pid);
    } catch {
      // gone meanwhile
    }
  }
  return found;
}

/** Resolves once `done()` holds, checking between turns of the event loop. */
async function until(done) {
  while (!done()) {
    await new Promise((r) => setTimeout(r, 20));
  }
}

let sleeps = 0;
/** Seconds for a sleep no other call has, far longer than any test. */
function sleepMarker() {
  sleeps += 1;
  return `${process.pid}${String(sleeps).padStart(4, "0")}.5`;
}

test("tools/list offers the active tools with their schemas", async () => {
  const s = await connect();
  try {
    const { tools } = await s.client.listTools();
    assert.deepEqual(tools.map((t) => t.name), ["echo", "guarded", "pair", "sleep"]);
    const pair = tools.find((t) => t.name === "pair");
    assert.equal(pair.outputSchema.type, "object");
    assert.deepEqual(pair.inputSchema.required, ["a", "b"]);
    assert.equal(tools.find((t) => t.name === "echo").annotations.readOnlyHint, true);
    assert.equal(s.client.getServerCapabilities().tools.listChanged, true);
  } finally {
    await s.close();
  }
});

test("a call returns text, and structuredContent under an output schema", async () => {
  const s = await connect();
  try {
    const echoed = await s.client.callTool({ name: "echo", arguments: { text: "hello" } });
    assert.equal(echoed.isError ?? false, false);
    assert.equal(text(echoed), "hello\n");
    await s.client.listTools(); // the SDK checks structured results against listed schemas
    const pair = await s.client.callTool({ name: "pair", arguments: { a: "x", b: "y" } });
    assert.deepEqual(pair.structuredContent, { a: "x", b: "y" });
  } finally {
    await s.close();
  }
});

test("invalid input is an error result naming its kind, without the arguments", async () => {
  const s = await connect();
  try {
    const secret = "hunter2-not-for-logs";
    const result = await s.client.callTool({ name: "sleep", arguments: { seconds: secret } });
    assert.equal(result.isError, true);
    assert.match(text(result), /^invalid_input: /);
    assert.ok(!JSON.stringify(result).includes(secret));
  } finally {
    await s.close();
  }
});

test("aborting a call sends notifications/cancelled and its worker is killed", async () => {
  const s = await connect();
  try {
    const marker = sleepMarker();
    const abort = new AbortController();
    const call = s.client.callTool({ name: "sleep", arguments: { seconds: marker } }, undefined, {
      signal: abort.signal,
    });
    await until(() => processesWith(`sleep ${marker}`).length > 0);
    abort.abort("changed my mind");
    await assert.rejects(call);
    await until(() => processesWith(`sleep ${marker}`).length === 0);
    const after = await s.client.callTool({ name: "echo", arguments: { text: "still here" } });
    assert.equal(text(after), "still here\n");
  } finally {
    await s.close();
  }
});

test("without elicitation a call needing approval names the pending approval", async () => {
  const s = await connect();
  try {
    const result = await s.client.callTool({ name: "guarded", arguments: { text: "x" } });
    assert.equal(result.isError, true);
    assert.match(text(result), /^approval_required: .*approval [0-9a-f]{32} is pending/);
  } finally {
    await s.close();
  }
});

test("with elicitation the user's accept runs the call and a decline does not", async () => {
  const answers = ["accept", "decline"];
  const asked = [];
  const s = await connect({
    elicitation: async (request) => {
      asked.push(request.params.message);
      return { action: answers.shift() };
    },
  });
  try {
    const accepted = await s.client.callTool({ name: "guarded", arguments: { text: "approved" } });
    assert.equal(text(accepted), "approved\n");
    const declined = await s.client.callTool({ name: "guarded", arguments: { text: "no" } });
    assert.equal(declined.isError, true);
    assert.match(text(declined), /^denied: /);
    assert.equal(asked.length, 2);
    assert.match(asked[0], /guarded/);
  } finally {
    await s.close();
  }
});

test("a reload that changes the tools sends tools/list_changed", async () => {
  const s = await connect();
  try {
    const changed = new Promise((resolve) =>
      s.client.setNotificationHandler(ToolListChangedNotificationSchema, () => resolve()),
    );
    writeFileSync(
      s.policy,
      `${policyText}
[tools.shout]
description = "a new tool"
command = ["/bin/echo", "{text}"]
side_effect = "read"
input = { type = "object", properties = { text = { type = "string" } }, required = ["text"] }
`,
    );
    process.kill(s.transport.pid, "SIGHUP");
    await changed;
    const { tools } = await s.client.listTools();
    assert.ok(tools.some((t) => t.name === "shout"));
  } finally {
    await s.close();
  }
});
