/**
 * A sandbox driver for TypeScript agent frameworks: runs a JavaScript function in a fresh
 * Node process confined by an airlock profile, through a policy tool (see
 * `policy/driver.toml`, tool `run_js`).
 *
 * What crosses into the sandbox is the function's *source text* (`fn.toString()`) and its
 * JSON arguments; what comes back is its JSON result. A closure does not cross: a variable
 * the function captured from the host is simply not defined in the sandbox (a
 * `ReferenceError` there, reported as `SandboxFunctionError`). Pass what it needs as
 * arguments. Native and bound functions have no source and are refused before anything is
 * sent, as are classes and arguments that are not plain JSON.
 */

import { AirlockClient, notSent, raceAbort, type CallOptions, type ConnectOptions } from "./client.js";
import { AirlockError, RequestError, describe } from "./errors.js";
import type { ErrorKind, ToolResult } from "./protocol.js";

/** What a sandbox lets the code it runs do, as agent frameworks describe it. */
export interface SandboxPermissions {
  /** Host paths the code can read and write (`false`: none at all). */
  fs?: { read: string[]; write: string[] } | false;
  /** Whether the code can open network connections. */
  network?: boolean;
  /** Whether the code can start processes (threads count: Node needs `clone`). */
  subprocess?: boolean;
}

export interface SandboxRunOptions {
  signal?: AbortSignal;
}

/** The shape TypeScript agent frameworks expect of a sandbox. */
export interface SandboxDriver {
  name: string;
  permissions?: SandboxPermissions;
  run(
    fn: (...args: unknown[]) => Promise<unknown>,
    args: unknown[],
    options?: SandboxRunOptions,
  ): Promise<unknown>;
  close?(): Promise<void>;
}

export interface AirlockDriverOptions {
  /** The daemon's socket; the driver connects on its first run and `close` disconnects. */
  socketPath?: string;
  /** A client to use instead of `socketPath`; `close` leaves it open. */
  client?: AirlockClient;
  /** The policy tool that runs a function (default `run_js`, as in `policy/driver.toml`). */
  tool?: string;
  /** The driver's name (default `airlock`). */
  name?: string;
  /** The session calls count against (rate limits, audit). */
  session?: string;
  /** A deadline shorter than the tool's, per run. */
  timeoutMs?: number;
  /** What the tool's profile grants, as reported to the framework (default: `policy/driver.toml`'s). */
  permissions?: SandboxPermissions;
  /** Options of the connection the driver opens from `socketPath`. */
  connect?: ConnectOptions;
}

/** What `policy/driver.toml`'s `node` profile grants. */
export const DRIVER_TOML_PERMISSIONS: SandboxPermissions = {
  fs: {
    read: ["/usr", "/bin", "/lib", "/lib64", "/etc/ld.so.cache", "/etc/alternatives", "/etc/ssl/certs"],
    write: [],
  },
  network: false,
  subprocess: true,
};

/** The kinds a run fails with that are not the daemon's own. */
export type DriverErrorKind = "function_threw" | "not_serialisable" | "no_result" | "transport" | "request_refused";

/** A run failed: `kind` is the result record's `error.kind` or one of the driver's own. */
export class SandboxError extends AirlockError {
  constructor(
    message: string,
    readonly kind: ErrorKind | DriverErrorKind,
    /** The daemon's result record, when there was one. */
    readonly result?: ToolResult,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

/** The function ran past its deadline (the tool's timeout, or the driver's `timeoutMs`). */
export class SandboxTimeoutError extends SandboxError {}
/** The function ran out of memory: the profile's cgroup limit, or V8's heap limit. */
export class SandboxOOMError extends SandboxError {}
/** The gate refused the run (a rule, plan mode, an approval), or the sandbox a syscall. */
export class SandboxDeniedError extends SandboxError {}
/** The run was cancelled: the caller's AbortSignal, or the daemon shutting down. */
export class SandboxCancelledError extends SandboxError {}
/** The function threw (or rejected) in the sandbox; `remoteName`/`remoteStack` are its error's. */
export class SandboxFunctionError extends SandboxError {
  constructor(
    message: string,
    readonly remoteName: string,
    readonly remoteStack: string,
    result: ToolResult,
  ) {
    super(message, "function_threw", result);
  }
}
/** The function or its arguments cannot be sent: nothing was run. */
export class SandboxSerializationError extends SandboxError {
  constructor(message: string) {
    super(message, "not_serialisable");
  }
}

/** The runner's last line on stdout. */
interface Envelope {
  ok: boolean;
  value?: unknown;
  error?: { name: string; message: string; stack: string };
}

/** Creates a driver; it connects lazily, on its first `run`. */
export function createAirlockDriver(options: AirlockDriverOptions): AirlockDriver {
  return new AirlockDriver(options);
}

export class AirlockDriver implements SandboxDriver {
  readonly name: string;
  readonly permissions: SandboxPermissions;
  private readonly tool: string;
  private client: Promise<AirlockClient> | undefined;
  private readonly owned: boolean;
  private closed = false;
  /** Aborted by `close`: ends a connection under way. */
  private readonly closing = new AbortController();

  constructor(private readonly options: AirlockDriverOptions) {
    if (!options.client && !options.socketPath) {
      throw new TypeError("createAirlockDriver needs a socketPath or a client");
    }
    this.name = options.name ?? "airlock";
    this.permissions = options.permissions ?? DRIVER_TOML_PERMISSIONS;
    this.tool = options.tool ?? "run_js";
    this.owned = !options.client;
    if (options.client) {
      this.client = Promise.resolve(options.client);
    }
  }

  /**
   * Runs `fn(...args)` in the sandbox and resolves with its JSON result (`undefined` when it
   * returned nothing). Rejects with a `SandboxError`: `SandboxTimeoutError`,
   * `SandboxOOMError`, `SandboxDeniedError`, `SandboxCancelledError`, `SandboxFunctionError`
   * (it threw), `SandboxSerializationError` (nothing ran), or the base class for the rest.
   */
  async run(
    fn: (...args: any[]) => unknown,
    args: unknown[] = [],
    options: SandboxRunOptions = {},
  ): Promise<unknown> {
    if (this.closed) {
      throw new SandboxError("the driver is closed", "transport");
    }
    const source = functionSource(fn);
    if (!Array.isArray(args)) {
      throw new SandboxSerializationError("args must be an array");
    }
    checkJson(args, "args", new Set());
    let result: ToolResult;
    try {
      // The first run's connection is shared by the runs waiting on it: a run's signal
      // stops its own wait, not the connection (which `connectTimeoutMs` bounds).
      const client = await raceAbort(this.connect(), options.signal);
      if (client === undefined) {
        throw errorOf(notSent("", this.tool, "cancelled while connecting to the daemon"));
      }
      const callOptions: CallOptions & { dryRun?: false } = {};
      if (options.signal) callOptions.signal = options.signal;
      if (this.options.session !== undefined) callOptions.session = this.options.session;
      if (this.options.timeoutMs !== undefined) callOptions.timeoutMs = this.options.timeoutMs;
      result = await client.call(this.tool, { source, args }, callOptions);
    } catch (error) {
      if (error instanceof SandboxError) {
        throw error;
      }
      const refused = error instanceof RequestError;
      const what = refused ? "the daemon refused the run" : "the sandbox could not be reached";
      throw new SandboxError(`${what}: ${describe(error)}`, refused ? "request_refused" : "transport", undefined, {
        cause: error,
      });
    }
    if (!result.ok) {
      throw errorOf(result);
    }
    const envelope = lastEnvelope(result.stdout);
    if (!envelope) {
      throw new SandboxError(
        "the function's sandbox printed no result: its promise never settled, or it wrote over stdout" +
          stderrTail(result),
        "no_result",
        result,
      );
    }
    if (envelope.ok) {
      return envelope.value;
    }
    const thrown = envelope.error ?? { name: "Error", message: "unknown error", stack: "" };
    const hint =
      thrown.name === "ReferenceError"
        ? " (the function runs in another process: variables it closes over in the host do not exist there; pass them as args)"
        : "";
    throw new SandboxFunctionError(`${thrown.message}${hint}`, thrown.name, thrown.stack, result);
  }

  /** Releases the connection (a client passed in stays open). */
  async close(): Promise<void> {
    this.closed = true;
    this.closing.abort();
    const client = this.client;
    this.client = undefined;
    if (client && this.owned) {
      await client.then(
        (c) => c.close(),
        () => {},
      );
    }
  }

  private connect(): Promise<AirlockClient> {
    if (!this.client) {
      const given = this.options.connect?.signal;
      const stop = new AbortController();
      const onAbort = () => stop.abort();
      for (const signal of [given, this.closing.signal]) {
        if (signal?.aborted) stop.abort();
        signal?.addEventListener("abort", onAbort, { once: true });
      }
      const attempt = AirlockClient.connect(this.options.socketPath as string, {
        ...this.options.connect,
        signal: stop.signal,
      });
      const settled = () => {
        given?.removeEventListener("abort", onAbort);
        this.closing.signal.removeEventListener("abort", onAbort);
      };
      attempt.then(settled, settled);
      this.client = attempt;
      // A failed first connection is not kept: the next run tries again.
      attempt.catch(() => {
        if (this.client === attempt) this.client = undefined;
      });
    }
    return this.client;
  }
}

/** The source of `fn` as an expression that evaluates to the function. */
export function functionSource(fn: unknown): string {
  if (typeof fn !== "function") {
    throw new SandboxSerializationError(`run takes a function, not ${typeof fn}`);
  }
  const source = Function.prototype.toString.call(fn);
  if (/\{\s*\[native code\]\s*\}\s*$/.test(source)) {
    throw new SandboxSerializationError(
      `${fn.name || "the function"} is native or bound: it has no source to send to the sandbox ` +
        "(write the function out, and pass what a bound function closed over as args)",
    );
  }
  if (/^class\b/.test(source)) {
    throw new SandboxSerializationError("a class is not a function the sandbox can call");
  }
  if (parsesAsExpression(source)) {
    return source;
  }
  // A method written in shorthand (`run() {...}`, `async run() {...}`, `*gen() {...}`):
  // its source is not an expression by itself, but the body of an object literal.
  if (!/^(get|set)\s/.test(source)) {
    const wrapped = `Object.values({ ${source} })[0]`;
    if (parsesAsExpression(wrapped)) {
      return wrapped;
    }
  }
  throw new SandboxSerializationError("the function's source is not an expression the sandbox can evaluate");
}

function parsesAsExpression(source: string): boolean {
  try {
    // Compiled, never called: only the syntax is checked.
    new Function(`return (${source}\n);`);
    return true;
  } catch (error) {
    // Code generation refused in this process (not a syntax error): let the sandbox judge.
    return !(error instanceof SyntaxError);
  }
}

/** Refuses what JSON would silently change: functions, undefined in arrays, NaN, Dates, Maps, cycles. */
function checkJson(value: unknown, path: string, ancestors: Set<object>): void {
  switch (typeof value) {
    case "string":
    case "boolean":
      return;
    case "number":
      if (!Number.isFinite(value)) {
        throw new SandboxSerializationError(`${path} is ${value}, which JSON cannot carry`);
      }
      return;
    case "object":
      break;
    default:
      throw new SandboxSerializationError(`${path} is a ${typeof value}, which JSON cannot carry`);
  }
  if (value === null) {
    return;
  }
  if (ancestors.has(value)) {
    throw new SandboxSerializationError(`${path} refers to itself`);
  }
  ancestors.add(value);
  if (Array.isArray(value)) {
    value.forEach((item, i) => checkJson(item, `${path}[${i}]`, ancestors));
  } else {
    const proto = Object.getPrototypeOf(value);
    if (proto !== Object.prototype && proto !== null) {
      const kind = (value as object).constructor?.name ?? "object";
      throw new SandboxSerializationError(`${path} is a ${kind}, not plain JSON: convert it first`);
    }
    for (const [key, item] of Object.entries(value)) {
      if (item !== undefined) {
        checkJson(item, `${path}.${key}`, ancestors);
      }
    }
  }
  ancestors.delete(value);
}

function lastEnvelope(stdout: string): Envelope | undefined {
  const lines = stdout.split("\n").filter((l) => l.trim() !== "");
  const last = lines[lines.length - 1];
  if (last === undefined) {
    return undefined;
  }
  try {
    const parsed = JSON.parse(last) as Envelope;
    return parsed && typeof parsed === "object" && typeof parsed.ok === "boolean" ? parsed : undefined;
  } catch {
    return undefined;
  }
}

function stderrTail(result: ToolResult): string {
  const tail = result.stderr.trim().split("\n").slice(-3).join(" | ");
  return tail ? ` (stderr: ${tail.slice(0, 500)})` : "";
}

const DENIED: ReadonlySet<string> = new Set(["denied", "approval_required", "seccomp_violation"]);

function errorOf(result: ToolResult): SandboxError {
  const error = result.error ?? { kind: "tool_failed" as const, message: "the run failed" };
  const message = `${error.kind}: ${error.message}`;
  switch (error.kind) {
    case "timeout":
      return new SandboxTimeoutError(message, error.kind, result);
    case "out_of_memory":
      return new SandboxOOMError(message, error.kind, result);
    case "cancelled":
      return new SandboxCancelledError(message, error.kind, result);
    default:
      break;
  }
  if (DENIED.has(error.kind)) {
    return new SandboxDeniedError(message, error.kind, result);
  }
  if (error.kind === "tool_failed" && /JavaScript heap out of memory|Reached heap limit/.test(result.stderr)) {
    return new SandboxOOMError(`${message}: V8's heap limit`, "out_of_memory", result);
  }
  return new SandboxError(message + stderrTail(result), error.kind, result);
}
