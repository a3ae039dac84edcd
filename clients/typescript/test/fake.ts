/**
 * Test support: stand-ins for a daemon, for what a real one cannot be made to do on cue
 * (freeze, stay silent, send an answer too long to read). Every wait is for an event
 * (a request arriving, a socket closing), never a fixed time.
 */

import { spawn, type ChildProcess } from "node:child_process";
import { EventEmitter, once } from "node:events";
import { mkdtempSync, rmSync } from "node:fs";
import * as net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";

export type Json = Record<string, unknown>;

export const HEALTH = { ok: true, version: "0.1.0", protocol_version: 1, policy_version: "p" };

/** A result record as the daemon writes one; `changes` replace its fields. */
export function record(changes: Json = {}): Json {
  return {
    call_id: "c",
    tool: "t",
    ok: true,
    output: null,
    error: null,
    exit_code: 0,
    signal: null,
    stdout: "",
    stderr: "",
    stdout_truncated: false,
    stderr_truncated: false,
    duration_ms: 0,
    attempts: 1,
    usage: { cpu_ms: 0, peak_memory_bytes: null },
    isolation: null,
    network: null,
    denials: [],
    ...changes,
  };
}

/** One accepted connection of a fake daemon. */
export interface FakeConnection {
  readonly socket: net.Socket;
  /** Writes `value` as one answer line. */
  answer(value: Json): void;
  /** Resolves once the client's side of the connection is gone. */
  readonly ended: Promise<void>;
}

/**
 * What the fake does with a request other than the handshake's `health` (which it answers
 * itself unless `silent` says so for that connection).
 */
export type Handler = (request: Json, connection: FakeConnection) => void;

export interface FakeOptions {
  /** Connections (numbered from 1) that read requests but never answer any. */
  silent?: (connectionNumber: number) => boolean;
}

export interface Fake {
  readonly path: string;
  /** Every request received, on any connection, in order. */
  readonly requests: Json[];
  readonly connections: FakeConnection[];
  /** Resolves with the first request (past or future) that `match` accepts. */
  request(match: (request: Json) => boolean): Promise<Json>;
  /** Resolves once `count` connections have been accepted. */
  accepted(count: number): Promise<FakeConnection>;
  close(): Promise<void>;
}

/** A daemon stand-in on a socket in a fresh temporary directory. */
export async function startFake(handler: Handler = () => {}, options: FakeOptions = {}): Promise<Fake> {
  const dir = mkdtempSync(join(tmpdir(), "airlock-ts-fake-"));
  const path = join(dir, "fake.sock");
  const events = new EventEmitter();
  const requests: Json[] = [];
  const connections: FakeConnection[] = [];
  const sockets = new Set<net.Socket>();

  const server = net.createServer((socket) => {
    sockets.add(socket);
    const number = connections.length + 1;
    const silent = options.silent?.(number) ?? false;
    const connection: FakeConnection = {
      socket,
      answer: (value) => {
        if (!socket.destroyed) socket.write(JSON.stringify(value) + "\n");
      },
      ended: new Promise((resolve) => socket.once("close", () => resolve())),
    };
    connection.ended.then(() => sockets.delete(socket));
    connections.push(connection);
    events.emit("connection");
    socket.on("error", () => {});
    let buffered = "";
    socket.setEncoding("utf8");
    socket.on("data", (chunk: string) => {
      buffered += chunk;
      let newline: number;
      while ((newline = buffered.indexOf("\n")) >= 0) {
        const request = JSON.parse(buffered.slice(0, newline)) as Json;
        buffered = buffered.slice(newline + 1);
        requests.push(request);
        events.emit("request");
        if (silent) continue;
        if (request["op"] === "health") {
          connection.answer({ id: request["id"], result: HEALTH });
        } else {
          handler(request, connection);
        }
      }
    });
  });
  server.listen(path);
  await once(server, "listening");

  return {
    path,
    requests,
    connections,
    async request(match) {
      for (;;) {
        const found = requests.find(match);
        if (found) return found;
        await once(events, "request");
      }
    },
    async accepted(count) {
      while (connections.length < count) {
        await once(events, "connection");
      }
      return connections[count - 1] as FakeConnection;
    },
    async close() {
      for (const socket of sockets) socket.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/**
 * A socket that listens but never accepts, as a daemon that is stopped (SIGSTOP) or out of
 * descriptors looks to a client: a child process listens and then blocks its own event
 * loop, so connections wait in the kernel's backlog. Stopped by the child's pid.
 */
export interface FrozenListener {
  readonly path: string;
  stop(): Promise<void>;
}

const FREEZE = `
const net = require("node:net");
const server = net.createServer();
server.listen(process.argv[1], () => {
  process.stdout.write("listening\\n", () => {
    // Blocked, but not past its parent's end: an orphan would never be stopped.
    const parent = Number(process.argv[2]);
    while (process.ppid === parent) {
      Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 1000);
    }
    process.exit(0);
  });
});
`;

export async function startFrozenListener(): Promise<FrozenListener> {
  const dir = mkdtempSync(join(tmpdir(), "airlock-ts-frozen-"));
  const path = join(dir, "frozen.sock");
  const child: ChildProcess = spawn(process.execPath, ["-e", FREEZE, path, String(process.pid)], { stdio: ["ignore", "pipe", "inherit"] });
  const exited = once(child, "exit");
  child.stdout?.setEncoding("utf8");
  let said = "";
  await new Promise<void>((resolve, reject) => {
    child.stdout?.on("data", (chunk: string) => {
      said += chunk;
      if (said.includes("listening\n")) resolve();
    });
    child.once("exit", (code, signal) => reject(new Error(`the frozen listener exited (${code ?? signal})`)));
  });
  return {
    path,
    async stop() {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill("SIGKILL");
        await exited;
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
