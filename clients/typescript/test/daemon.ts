/**
 * Test support: a real `airlock serve` started from the repository's build, on a socket in
 * a fresh scratch directory (see `scratchDir`), waited for by polling its socket (never by sleeping a fixed
 * time), and stopped by its own pid.
 */

import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { chmodSync, existsSync, lstatSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import * as net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

/** The repository's root (this file is clients/typescript/{test,dist-test}/daemon.*). */
export const REPO = fileURLToPath(new URL("../../../", import.meta.url));
export const PACKAGE = fileURLToPath(new URL("../", import.meta.url));

/** The airlock binary: $AIRLOCK_BIN, else target/debug/airlock, built when missing. */
export function airlockBinary(): string {
  const fromEnv = process.env["AIRLOCK_BIN"];
  if (fromEnv) {
    return fromEnv;
  }
  const binary = join(REPO, "target", "debug", "airlock");
  if (!existsSync(binary)) {
    const built = spawnSync("cargo", ["build", "-p", "airlock-cli"], { cwd: REPO, stdio: "inherit" });
    if (built.status !== 0) {
      throw new Error(`cargo build -p airlock-cli failed (${built.status ?? built.error})`);
    }
  }
  return binary;
}

/** The example policy of the driver, as shipped. */
export function driverPolicy(): string {
  return readFileSync(join(PACKAGE, "policy", "driver.toml"), "utf8");
}

/** The runner's command element of `run_js` in driver.toml, to give other tools the same runner. */
export function runnerCommand(): string {
  const match = /^command = \["\/usr\/bin\/node", "-e", '''[\s\S]*?'''\]$/m.exec(driverPolicy());
  if (!match) {
    throw new Error("driver.toml has no run_js command in the expected form");
  }
  return match[0];
}

/** driver.toml plus the tools the tests call. */
export function testPolicy(): string {
  const runner = runnerCommand();
  return `${driverPolicy()}

# ---- added by the tests ----

[profiles.tools]
read = ["/usr"]
read_optional = ["/bin", "/lib", "/lib64", "/etc/ld.so.cache", "/etc/alternatives"]
tmpfs = { "/tmp" = "16MiB" }
limits = { memory = "64MiB", pids = 8, timeout = "60s" }

[profiles.node_small]
read = ["/usr"]
read_optional = ["/bin", "/lib", "/lib64", "/etc/ld.so.cache", "/etc/alternatives"]
tmpfs = { "/tmp" = "16MiB" }
limits = { memory = "96MiB", pids = 32, timeout = "60s", output = "1MiB" }
env = { PATH = "/usr/bin:/bin", HOME = "/tmp" }

[tools.echo]
description = "Print a text"
profile = "tools"
command = ["/usr/bin/echo", "{text}"]
side_effect = "read"
concurrency_safe = true
input = { type = "object", properties = { text = { type = "string" } }, required = ["text"] }

[tools.sleep]
description = "Sleep for some seconds"
profile = "tools"
command = ["/usr/bin/sleep", "{seconds}"]
side_effect = "read"
concurrency_safe = true
input = { type = "object", properties = { seconds = { type = "string", pattern = "^[0-9]+$" } }, required = ["seconds"] }

[tools.guarded]
description = "Print a text, once a human approved it"
profile = "tools"
command = ["/usr/bin/echo", "{text}"]
side_effect = "write"
approval = "human"
input = { type = "object", properties = { text = { type = "string" } }, required = ["text"] }

[tools.run_js_short]
description = "run_js with a 1 s deadline"
profile = "node"
${runner}
stdin = "$input"
side_effect = "read"
concurrency_safe = true
timeout = "1s"
input = { type = "object", properties = { source = { type = "string" }, args = { type = "array" } }, required = ["source", "args"] }

[tools.run_js_small]
description = "run_js in 96 MiB"
profile = "node_small"
${runner}
stdin = "$input"
side_effect = "read"
concurrency_safe = true
input = { type = "object", properties = { source = { type = "string" }, args = { type = "array" } }, required = ["source", "args"] }
`;
}

export interface Daemon {
  readonly socket: string;
  readonly dir: string;
  readonly pid: number;
  /** SIGTERM, then wait for the exit. */
  stop(): Promise<void>;
  /** SIGKILL: the daemon dies mid-whatever, its socket file left behind. */
  kill(): Promise<void>;
  /** Starts a new daemon on the same socket and policy (after stop or kill). */
  restart(): Promise<void>;
  /** What the daemon wrote on stderr, for failure messages. */
  log(): string;
  /** Stops the daemon if running and removes the directory. */
  dispose(): Promise<void>;
}

export interface DaemonOptions {
  policy?: string;
  args?: string[];
}

/**
 * Where the daemons' directories go as root. Run as root, `airlock serve` refuses a policy
 * that anyone else could change through its path, and the system temporary directory is
 * writable by everyone (its sticky bit does not count); this one is root's, mode 0755. It is
 * left in place, empty, for the next run (ci-test removes it).
 */
export const TRUSTED_PARENT = "/run/airlock-client-tests";

/** A fresh directory for a daemon's policy and socket: under TRUSTED_PARENT as root. */
export function scratchDir(prefix: string): string {
  if (process.geteuid?.() !== 0) {
    return mkdtempSync(join(tmpdir(), prefix));
  }
  mkdirSync(TRUSTED_PARENT, { recursive: true, mode: 0o755 });
  const parent = lstatSync(TRUSTED_PARENT);
  if (!parent.isDirectory() || parent.uid !== 0) {
    throw new Error(`${TRUSTED_PARENT} is not a directory of root's`);
  }
  chmodSync(TRUSTED_PARENT, 0o755);
  return mkdtempSync(join(TRUSTED_PARENT, prefix));
}

/** Starts `airlock serve` and resolves once its socket accepts connections. */
export async function startDaemon(options: DaemonOptions = {}): Promise<Daemon> {
  const binary = airlockBinary();
  const dir = scratchDir("airlock-ts-");
  const policy = join(dir, "policy.toml");
  const socket = join(dir, "airlock.sock");
  writeFileSync(policy, options.policy ?? testPolicy());
  let child: ChildProcess | undefined;
  let stderr = "";
  let exited: Promise<void> = Promise.resolve();

  const launch = async () => {
    const proc = spawn(binary, ["serve", "--policy", policy, "--socket", socket, ...(options.args ?? [])], {
      stdio: ["ignore", "ignore", "pipe"],
    });
    child = proc;
    proc.stderr?.setEncoding("utf8");
    proc.stderr?.on("data", (chunk: string) => {
      stderr = (stderr + chunk).slice(-20000);
    });
    let hasExited = false;
    exited = new Promise((resolve) => {
      proc.once("exit", () => {
        hasExited = true;
        resolve();
      });
    });
    await waitForSocket(socket, () => hasExited, () => stderr);
  };

  const signal = async (name: NodeJS.Signals) => {
    const proc = child;
    if (proc && proc.exitCode === null && proc.signalCode === null) {
      proc.kill(name);
      await exited;
    }
  };

  await launch();
  return {
    socket,
    dir,
    get pid() {
      return child?.pid ?? -1;
    },
    stop: () => signal("SIGTERM"),
    kill: () => signal("SIGKILL"),
    restart: launch,
    log: () => stderr,
    async dispose() {
      await signal("SIGTERM");
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** Polls until `socket` accepts a connection; fails when the daemon exits or after 60 s. */
async function waitForSocket(socket: string, exited: () => boolean, log: () => string): Promise<void> {
  const deadline = Date.now() + 60_000;
  for (;;) {
    if (exited()) {
      throw new Error(`airlock serve exited before listening:\n${log()}`);
    }
    if (await canConnect(socket)) {
      return;
    }
    if (Date.now() > deadline) {
      throw new Error(`airlock serve did not listen on ${socket} within 60 s:\n${log()}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

function canConnect(socket: string): Promise<boolean> {
  return new Promise((resolve) => {
    const probe = net.createConnection({ path: socket });
    probe.once("connect", () => {
      probe.destroy();
      resolve(true);
    });
    probe.once("error", () => resolve(false));
  });
}

/** Polls `condition` every 10 ms until it holds (or throws after `timeoutMs`). */
export async function until(what: string, condition: () => Promise<boolean> | boolean, timeoutMs = 30_000) {
  const deadline = Date.now() + timeoutMs;
  while (!(await condition())) {
    if (Date.now() > deadline) {
      throw new Error(`timed out waiting for ${what}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}
