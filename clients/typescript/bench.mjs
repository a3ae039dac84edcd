#!/usr/bin/env node
// What @airlock/client costs over a bare socket: 1,000 sequential calls of a built-in tool
// (`builtin = "read_file"` on a 64-byte file) through AirlockClient, and 1,000 through a raw
// Unix socket speaking JSON lines with nothing but `net`, against one daemon, in one run.
// The two are interleaved in rounds of 100 (alternating which goes first) so that drift
// of the machine hits both alike. Prints p50/p90/p99 per path.
//
//   npm run bench                     # builds dist/, then runs this
//   AIRLOCK_BIN=target/release/airlock node bench.mjs [--calls 1000] [--json]
//
// The daemon is started here (target/debug/airlock unless AIRLOCK_BIN says otherwise) on a
// socket in a fresh scratch directory, and stopped at the end.

import { spawn } from "node:child_process";
import { chmodSync, lstatSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import * as net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { fileURLToPath } from "node:url";

import { AirlockClient } from "./dist/index.js";

const args = process.argv.slice(2);
const calls = Number(args[args.indexOf("--calls") + 1] || 1000) || 1000;
const asJson = args.includes("--json");
const ROUND = 100;
const WARMUP = 50;

const repo = fileURLToPath(new URL("../../", import.meta.url));
const binary = process.env.AIRLOCK_BIN || join(repo, "target", "debug", "airlock");

// Run as root, `airlock serve` refuses a policy that anyone else could change through its
// path, and the system temporary directory is everyone's (sticky bit or not): as root the
// directory goes under /run/airlock-client-tests, root's and mode 0755, left in place empty.
function scratchDir() {
  if (process.geteuid?.() !== 0) {
    return mkdtempSync(join(tmpdir(), "airlock-ts-bench-"));
  }
  const parent = "/run/airlock-client-tests";
  mkdirSync(parent, { recursive: true, mode: 0o755 });
  const st = lstatSync(parent);
  if (!st.isDirectory() || st.uid !== 0) {
    throw new Error(`${parent} is not a directory of root's`);
  }
  chmodSync(parent, 0o755);
  return mkdtempSync(join(parent, "airlock-ts-bench-"));
}

const dir = scratchDir();
const data = join(dir, "data");
const file = join(data, "small.txt");
const socket = join(dir, "airlock.sock");
// The sandbox's uid (nobody, under a root daemon) must be able to reach the file.
chmodSync(dir, 0o755);
mkdirSync(data, { mode: 0o755 });
writeFileSync(file, "a small file for the benchmark: sixty-four bytes of text, or so\n", { mode: 0o644 });
writeFileSync(
  join(dir, "policy.toml"),
  `version = 1

[profiles.reader]
read = ["/usr", ${JSON.stringify(data)}]
read_optional = ["/bin", "/lib", "/lib64", "/etc/ld.so.cache"]
tmpfs = { "/tmp" = "4MiB" }

[tools.read_small]
description = "Read a file"
builtin = "read_file"
profile = "reader"
`,
);

const daemon = spawn(binary, ["serve", "--policy", join(dir, "policy.toml"), "--socket", socket], {
  stdio: ["ignore", "ignore", "inherit"],
});
const exited = new Promise((resolve) => daemon.once("exit", resolve));

function canConnect() {
  return new Promise((resolve) => {
    const probe = net.createConnection({ path: socket });
    probe.once("connect", () => {
      probe.destroy();
      resolve(true);
    });
    probe.once("error", () => resolve(false));
  });
}

/** A bare JSON-lines client: one request, wait for its line, parse it. */
async function rawClient() {
  const sock = net.createConnection({ path: socket });
  await new Promise((resolve, reject) => {
    sock.once("connect", resolve);
    sock.once("error", reject);
  });
  sock.setEncoding("utf8");
  let buffer = "";
  let waiting;
  sock.on("data", (chunk) => {
    buffer += chunk;
    const newline = buffer.indexOf("\n");
    if (newline >= 0 && waiting) {
      const line = buffer.slice(0, newline);
      buffer = buffer.slice(newline + 1);
      const resolve = waiting;
      waiting = undefined;
      resolve(JSON.parse(line));
    }
  });
  let id = 0;
  return {
    call(tool, args) {
      id += 1;
      return new Promise((resolve) => {
        waiting = resolve;
        sock.write(JSON.stringify({ id, op: "call", tool, arguments: args }) + "\n");
      });
    },
    close: () => sock.destroy(),
  };
}

function percentile(sorted, p) {
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
}

function summary(samples) {
  const sorted = [...samples].sort((a, b) => a - b);
  const mean = samples.reduce((a, b) => a + b, 0) / samples.length;
  return { n: samples.length, p50: percentile(sorted, 50), p90: percentile(sorted, 90), p99: percentile(sorted, 99), mean };
}

let client;
let raw;
try {
  const deadline = Date.now() + 60_000;
  while (!(await canConnect())) {
    if (daemon.exitCode !== null || Date.now() > deadline) throw new Error("the daemon did not start");
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  client = await AirlockClient.connect(socket);
  raw = await rawClient();
  const input = { path: file };

  const viaClient = async () => {
    const started = performance.now();
    const result = await client.call("read_small", input);
    const took = performance.now() - started;
    if (!result.ok) throw new Error(`client call failed: ${JSON.stringify(result.error)}`);
    return took;
  };
  const viaRaw = async () => {
    const started = performance.now();
    const answer = await raw.call("read_small", input);
    const took = performance.now() - started;
    if (!answer.result?.ok) throw new Error(`raw call failed: ${JSON.stringify(answer)}`);
    return took;
  };

  for (let i = 0; i < WARMUP; i++) {
    await viaClient();
    await viaRaw();
  }
  const samples = { client: [], raw: [] };
  for (let round = 0; samples.client.length < calls; round++) {
    const n = Math.min(ROUND, calls - samples.client.length);
    const order = round % 2 === 0 ? ["client", "raw"] : ["raw", "client"];
    for (const which of order) {
      for (let i = 0; i < n; i++) {
        samples[which].push(await (which === "client" ? viaClient() : viaRaw()));
      }
    }
  }
  const report = {
    calls,
    tool: "read_file (built-in), 64-byte file",
    node: process.version,
    airlock: client.daemon?.version,
    client: summary(samples.client),
    raw: summary(samples.raw),
  };
  if (asJson) {
    console.log(JSON.stringify(report));
  } else {
    const ms = (x) => `${x.toFixed(3)} ms`;
    console.log(`${calls} sequential calls each, ${report.tool}, node ${report.node}, airlock ${report.airlock}`);
    for (const which of ["client", "raw"]) {
      const s = report[which];
      console.log(
        `  ${which === "client" ? "AirlockClient " : "raw socket    "} p50 ${ms(s.p50)}  p90 ${ms(s.p90)}  p99 ${ms(s.p99)}  mean ${ms(s.mean)}`,
      );
    }
    console.log(`  client - raw at p50: ${ms(report.client.p50 - report.raw.p50)}`);
  }
} finally {
  await client?.close();
  raw?.close();
  if (daemon.exitCode === null) daemon.kill("SIGTERM");
  await exited;
  rmSync(dir, { recursive: true, force: true });
}
