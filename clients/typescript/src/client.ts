/**
 * `AirlockClient`: one connection to `airlock serve`, many requests in flight on it.
 */

import { constants as bufferConstants } from "node:buffer";
import * as net from "node:net";

import {
  AnswerTooLargeError,
  ClientClosedError,
  ConnectError,
  ConnectionLostError,
  DaemonRefusedError,
  ProtocolMismatchError,
  RequestError,
  TransportError,
  WireError,
  describe,
  requestError,
} from "./errors.js";
import {
  PROTOCOL_VERSION,
  type Answer,
  type ApprovalAnswer,
  type CallRequest,
  type Change,
  type ChangesAnswer,
  type DryRunAnswer,
  type ExecuteRequest,
  type GetFileAnswer,
  type Health,
  type ProposeRequest,
  type PutFileAnswer,
  type Request,
  type SessionOpenAnswer,
  type SessionOpenRequest,
  type SessionSetAnswer,
  type SessionSetRequest,
  type SetStateAnswer,
  type SetStateRequest,
  type Stats,
  type ToolListing,
  type ToolResult,
  type ToolState,
  type ToolsRequest,
} from "./protocol.js";
import { Session, type SessionOpenOptions } from "./session.js";

/** The daemon's longest request line (`MAX_REQUEST_BYTES`), newline included. */
export const MAX_REQUEST_BYTES = 2 * 1024 * 1024;

/**
 * The longest answer line read by default (`maxAnswerBytes`): 256 MiB. A result record
 * carries stdout and stderr, each up to the policy's `limits.output` (at most 4 MiB), as
 * JSON strings, where a control byte takes 6 bytes (`\u0000`): even the worst case at the
 * largest limit (about 50 MiB) fits.
 */
export const DEFAULT_MAX_ANSWER_BYTES = 256 * 1024 * 1024;

/** Bytes at the start of an answer line searched for its id: `{"id":` and 256 bytes of id. */
const ID_HEAD_BYTES = 512;

export interface ReconnectOptions {
  /** Connection attempts after a drop, the first at once (default 5). */
  attempts?: number;
  /** Wait before the second attempt; doubled each time (default 50). */
  initialDelayMs?: number;
  /** Longest wait between attempts (default 2000). */
  maxDelayMs?: number;
}

export interface OverloadRetryOptions {
  /** Retries of a call answered `overloaded` (default 5). */
  maxRetries?: number;
  /** The longest `retry_after_ms` honoured; longer hints are cut to it (default 5000). */
  maxDelayMs?: number;
}

export interface ConnectOptions {
  /**
   * Give up one connection attempt after this long, its `health` handshake included
   * (default 5000): a daemon that is stopped or out of descriptors leaves connections
   * waiting unaccepted, and only the handshake's answer tells.
   */
  connectTimeoutMs?: number;
  /** Attempts `connect` makes before it throws (default 1: fail fast). */
  connectAttempts?: number;
  /** How a request after a dropped connection reconnects; `false`: it throws instead. */
  reconnect?: ReconnectOptions | false;
  /** How calls answered `overloaded` are retried; `false`: they return that result. */
  overloadRetry?: OverloadRetryOptions | false;
  /** The session of every call, propose and execute that names none. */
  session?: string;
  /** Aborting it while `connect` is under way gives up: `connect` rejects with `ClientClosedError`. */
  signal?: AbortSignal;
  /**
   * After a call's signal aborts, how long to wait for the daemon's answer (default 30000,
   * as the Python client's `cancel_grace`); then the call resolves with a `cancelled`
   * record the client made, saying the daemon did not answer.
   */
  cancelGraceMs?: number;
  /**
   * The longest answer line read (default `DEFAULT_MAX_ANSWER_BYTES`, 256 MiB; at most
   * `buffer.constants.MAX_STRING_LENGTH`). A longer answer fails its request with
   * `AnswerTooLargeError`; see there.
   */
  maxAnswerBytes?: number;
}

export interface CallOptions {
  /** Aborting sends the daemon `cancel` for this call; it then resolves with kind `cancelled`. */
  signal?: AbortSignal;
  /** A deadline shorter than the tool's (`timeout_ms`); a longer one is cut to the tool's. */
  timeoutMs?: number;
  /** Rate limits, one-at-a-time queues and the audit log count calls by session. */
  session?: string;
  /** Names the call in its result and the audit log (default: a fresh one from the daemon). */
  callId?: string;
  /** Refuse every tool that is not read-only (`rule: "plan_mode"`). */
  planMode?: boolean;
  /** Validate and decide, run nothing: resolves with `{dry_run}` (or a refusal's record). */
  dryRun?: boolean;
}

export interface ProposeOptions {
  session?: string;
  callId?: string;
  planMode?: boolean;
}

export interface ExecuteOptions {
  signal?: AbortSignal;
  /** Must be the proposer's session (the daemon refuses another). */
  session?: string;
}

/** The answer of `propose`: the stored approval, or the result record of a refusal. */
export type ProposeResult = ApprovalAnswer | ToolResult;

/** True for a `propose` answer that stored an approval. */
export function isApproval(answer: ProposeResult): answer is ApprovalAnswer {
  return "approval" in answer && !("call_id" in answer);
}

/** True for a `call` answer of a dry run. */
export function isDryRun(answer: ToolResult | DryRunAnswer): answer is DryRunAnswer {
  return "dry_run" in answer && !("call_id" in answer);
}

interface Pending {
  resolve(answer: Answer): void;
  reject(error: Error): void;
}

/** One socket and the requests in flight on it. */
class Connection {
  closed = false;
  private readonly pending = new Map<string, Pending>();
  /** The unfinished answer line, in the pieces it came in (none holds a newline). */
  private parts: Buffer[] = [];
  private partBytes = 0;
  /** Discarding the rest of an answer too long to read, up to its newline. */
  private skipping = false;
  private refusal: DaemonRefusedError | undefined;
  private failure: Error | undefined;
  private closeError: Error | undefined;
  private readonly whenClosed: Promise<void>;

  private constructor(
    private readonly socket: net.Socket,
    private readonly socketPath: string,
    private readonly maxAnswerBytes: number,
  ) {
    socket.on("data", (chunk: Buffer) => this.onData(chunk));
    socket.on("error", (error) => {
      this.failure ??= error;
    });
    this.whenClosed = new Promise((resolve) => {
      socket.on("close", () => {
        this.onClose();
        resolve();
      });
    });
  }

  /** Connects; aborting `stop` first destroys the socket and rejects with its reason. */
  static open(socketPath: string, maxAnswerBytes: number, stop: AbortSignal): Promise<Connection> {
    return new Promise((resolve, reject) => {
      if (stop.aborted) {
        reject(stop.reason);
        return;
      }
      const socket = net.createConnection({ path: socketPath });
      const abandon = () => {
        socket.destroy();
        reject(stop.reason);
      };
      stop.addEventListener("abort", abandon, { once: true });
      const failed = (error: Error) => {
        stop.removeEventListener("abort", abandon);
        reject(error);
      };
      socket.once("error", failed);
      socket.once("connect", () => {
        socket.off("error", failed);
        const connection = new Connection(socket, socketPath, maxAnswerBytes);
        // One turn of the event loop before the first write: a daemon turning the
        // connection away writes its refusal line at once and closes, and a write to the
        // closed socket (EPIPE) would discard that line unread.
        setImmediate(() => {
          stop.removeEventListener("abort", abandon);
          if (stop.aborted) {
            void connection.destroy(stop.reason as Error);
            reject(stop.reason);
          } else {
            resolve(connection);
          }
        });
      });
    });
  }

  /** Sends `request` under `id`; resolves with its answer line. */
  send(id: string, request: Request): Promise<Answer> {
    if (this.closed) {
      return Promise.reject(this.lostError(1));
    }
    const line = JSON.stringify({ id, ...request }) + "\n";
    const bytes = Buffer.byteLength(line);
    if (bytes > MAX_REQUEST_BYTES) {
      return Promise.reject(
        new RequestError({
          kind: "invalid_request",
          message: `the request is ${bytes} bytes, more than the daemon's limit of ${MAX_REQUEST_BYTES} (not sent)`,
        }),
      );
    }
    return new Promise<Answer>((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      this.socket.write(line);
    });
  }

  /** Stops waiting for request `id`'s answer: it is dropped when it comes. */
  forget(id: string): void {
    this.pending.delete(id);
  }

  /** Asks the daemon to cancel request `target`, if it is still in flight here. */
  cancel(cancelId: string, target: string): void {
    if (this.closed || !this.pending.has(target)) {
      return;
    }
    // The answer ({"cancelled": bool}) is of no use: the call's own answer says how it ended.
    this.send(cancelId, { op: "cancel", target }).catch(() => {});
  }

  /** Closes the socket; requests in flight fail with `error`. */
  destroy(error: Error): Promise<void> {
    this.closeError ??= error;
    this.socket.destroy();
    return this.whenClosed;
  }

  /**
   * Splits what comes into answer lines. Only the new chunk is searched for a newline (the
   * pieces kept hold none), and a line is joined once, when it is complete: linear in
   * what the daemon sends. A line past `maxAnswerBytes` is never joined.
   */
  private onData(chunk: Buffer): void {
    let start = 0;
    if (this.skipping) {
      const end = chunk.indexOf(0x0a);
      if (end < 0) {
        return;
      }
      this.skipping = false;
      start = end + 1;
    }
    let end: number;
    while ((end = chunk.indexOf(0x0a, start)) >= 0) {
      const piece = chunk.subarray(start, end);
      start = end + 1;
      const size = this.partBytes + piece.length;
      const parts = this.parts;
      this.parts = [];
      this.partBytes = 0;
      if (size > this.maxAnswerBytes) {
        if (!this.tooLong(lineHead(parts, piece))) {
          return;
        }
        continue;
      }
      this.onLine(parts.length === 0 ? piece : Buffer.concat([...parts, piece], size));
      if (this.socket.destroyed) {
        return;
      }
    }
    if (start < chunk.length) {
      const rest = chunk.subarray(start);
      if (this.partBytes + rest.length > this.maxAnswerBytes) {
        const head = lineHead(this.parts, rest);
        this.parts = [];
        this.partBytes = 0;
        this.skipping = this.tooLong(head);
        return;
      }
      this.parts.push(rest);
      this.partBytes += rest.length;
    }
  }

  /**
   * An answer longer than `maxAnswerBytes`, of which `head` is the start: fails the request
   * whose id it begins with and says to skip the rest of the line (true), or, with no id to
   * read, drops the connection (false).
   */
  private tooLong(head: Buffer): boolean {
    const id = leadingId(head);
    const limit = this.maxAnswerBytes;
    if (id === undefined) {
      // No telling whose answer this is: skipping it would leave its request waiting for
      // ever (calls have no deadline of their own here), so every request fails.
      this.destroy(
        new AnswerTooLargeError(
          limit,
          `the airlock daemon sent an answer longer than ${limit} bytes (maxAnswerBytes) that does not begin ` +
            "with its id: every request in flight failed and the connection was dropped",
        ),
      );
      return false;
    }
    const pending = this.pending.get(id);
    if (pending) {
      this.pending.delete(id);
      pending.reject(
        new AnswerTooLargeError(
          limit,
          `the airlock daemon's answer is longer than ${limit} bytes (maxAnswerBytes): raise maxAnswerBytes, ` +
            "or lower the policy's limits.output",
        ),
      );
    }
    return true;
  }

  private onLine(bytes: Buffer): void {
    let line: string;
    let answer: Answer;
    try {
      line = bytes.toString("utf8");
      if (line.trim() === "") {
        return;
      }
      answer = JSON.parse(line) as Answer;
    } catch (error) {
      this.destroy(new WireError(`the daemon sent a line that is not JSON: ${describe(error)}`));
      return;
    }
    if (answer === null || typeof answer !== "object" || !("id" in answer)) {
      this.destroy(new WireError(`the daemon sent an answer without an id: ${line.slice(0, 200)}`));
      return;
    }
    if (answer.id === null) {
      // Not an answer to any request: the daemon turning the whole connection away (it
      // closes it next). An id-less `invalid_request` (a line that is not JSON, or longer
      // than 2 MiB) cannot come from this client, which sends neither.
      if (answer.error && (answer.error.kind === "forbidden" || answer.error.kind === "overloaded")) {
        this.refusal = new DaemonRefusedError(answer.error);
      }
      return;
    }
    const key = typeof answer.id === "string" ? answer.id : JSON.stringify(answer.id);
    const pending = this.pending.get(key);
    if (pending) {
      this.pending.delete(key);
      pending.resolve(answer);
    }
  }

  private onClose(): void {
    this.closed = true;
    const waiting = [...this.pending.values()];
    this.pending.clear();
    const error = this.closeError ?? this.refusal ?? this.lostError(waiting.length);
    for (const p of waiting) {
      p.reject(error);
    }
  }

  private lostError(inFlight: number): Error {
    if (this.closeError) {
      return this.closeError;
    }
    if (this.refusal) {
      return this.refusal;
    }
    const why = this.failure ? `: ${describe(this.failure)}` : "";
    return new ConnectionLostError(
      `the connection to the airlock daemon at ${this.socketPath} was lost with ${inFlight} request(s) in flight${why}`,
      { cause: this.failure },
    );
  }
}

const RECONNECT_DEFAULTS: Required<ReconnectOptions> = { attempts: 5, initialDelayMs: 50, maxDelayMs: 2000 };
const OVERLOAD_DEFAULTS: Required<OverloadRetryOptions> = { maxRetries: 5, maxDelayMs: 5000 };

/**
 * A client of `airlock serve`. Requests share one connection and are matched to their
 * answers by id, so any number may be in flight. Results of calls are the daemon's result
 * records, unchanged: a tool or gate failure resolves (`ok: false`, `error.kind`), and only
 * transport problems, a protocol mismatch and requests the daemon refuses as malformed
 * throw.
 */
export class AirlockClient {
  private connection: Connection | undefined;
  private opening: Promise<Connection> | undefined;
  private closed = false;
  private readonly closing = new AbortController();
  private counter = 0;
  private readonly reconnect: Required<ReconnectOptions> | false;
  private readonly overloadRetry: Required<OverloadRetryOptions> | false;
  private lastHealth: Health | undefined;
  private readonly maxAnswerBytes: number;
  private readonly cancelGraceMs: number;

  private constructor(
    readonly socketPath: string,
    private readonly options: ConnectOptions,
  ) {
    this.reconnect = options.reconnect === false ? false : { ...RECONNECT_DEFAULTS, ...options.reconnect };
    this.overloadRetry =
      options.overloadRetry === false ? false : { ...OVERLOAD_DEFAULTS, ...options.overloadRetry };
    this.cancelGraceMs = Math.max(0, options.cancelGraceMs ?? 30_000);
    this.maxAnswerBytes = Math.min(
      Math.max(1, options.maxAnswerBytes ?? DEFAULT_MAX_ANSWER_BYTES),
      bufferConstants.MAX_STRING_LENGTH,
    );
  }

  /**
   * Connects, asks `health` and checks the daemon's `protocol_version` against
   * `PROTOCOL_VERSION`: another version throws `ProtocolMismatchError` naming both.
   */
  static async connect(socketPath: string, options: ConnectOptions = {}): Promise<AirlockClient> {
    const client = new AirlockClient(socketPath, options);
    const signal = options.signal;
    const giveUp = () => void client.close();
    signal?.addEventListener("abort", giveUp, { once: true });
    try {
      if (signal?.aborted) {
        throw new ClientClosedError();
      }
      client.connection = await client.open(Math.max(1, options.connectAttempts ?? 1));
      return client;
    } catch (error) {
      await client.close();
      throw error;
    } finally {
      signal?.removeEventListener("abort", giveUp);
    }
  }

  /** The `health` answer of the current connection's handshake. */
  get daemon(): Health | undefined {
    return this.lastHealth;
  }

  /** Whether a connection is open now (a request opens one when not). */
  get connected(): boolean {
    return this.connection !== undefined && !this.connection.closed;
  }

  /**
   * Every tool of the policy, with its state, schemas and limits; with `session`, the
   * states calls in that open session see (its own `setState` over the daemon-wide one).
   */
  async tools(options: { session?: string } = {}): Promise<ToolListing[]> {
    const request: ToolsRequest = { op: "tools" };
    if (options.session !== undefined) request.session = options.session;
    const result = await this.simple<{ tools: ToolListing[] }>(request);
    return result.tools;
  }

  async health(): Promise<Health> {
    return this.simple<Health>({ op: "health" });
  }

  async stats(): Promise<Stats> {
    return this.simple<Stats>({ op: "stats" });
  }

  /**
   * Calls `tool` with `args` (a JSON value; default `{}`). Resolves with the result record
   * for every outcome of the tool and the gate. With `dryRun` it resolves with `{dry_run}`
   * instead (or the record of a refusal before deciding).
   */
  call(tool: string, args?: unknown, options?: CallOptions & { dryRun?: false }): Promise<ToolResult>;
  call(tool: string, args: unknown, options: CallOptions & { dryRun: true }): Promise<ToolResult | DryRunAnswer>;
  call(tool: string, args?: unknown, options?: CallOptions): Promise<ToolResult | DryRunAnswer>;
  async call(tool: string, args: unknown = {}, options: CallOptions = {}): Promise<ToolResult | DryRunAnswer> {
    const request: CallRequest = { op: "call", tool, arguments: args };
    const session = options.session ?? this.options.session;
    if (options.callId !== undefined) request.call_id = options.callId;
    if (session !== undefined) request.session = session;
    if (options.planMode) request.plan_mode = true;
    if (options.timeoutMs !== undefined) request.timeout_ms = options.timeoutMs;
    if (options.dryRun) request.dry_run = true;
    return this.runCall(request, tool, options.signal);
  }

  /**
   * Stores an approval for a call that needs a human: resolves with `{approval}` (exactly
   * what `execute` will run), or with the result record of a refusal (invalid input,
   * denied, ...). `isApproval` tells which.
   */
  async propose(tool: string, args: unknown = {}, options: ProposeOptions = {}): Promise<ProposeResult> {
    const request: ProposeRequest = { op: "propose", tool, arguments: args };
    const session = options.session ?? this.options.session;
    if (options.callId !== undefined) request.call_id = options.callId;
    if (session !== undefined) request.session = session;
    if (options.planMode) request.plan_mode = true;
    return this.simple<ProposeResult>(request);
  }

  /** Runs a stored approval once; resolves with its result record (`approval_invalid` when spent). */
  async execute(approvalId: string, options: ExecuteOptions = {}): Promise<ToolResult> {
    const request: ExecuteRequest = { op: "execute", approval_id: approvalId };
    const session = options.session ?? this.options.session;
    if (session !== undefined) request.session = session;
    return (await this.runCall(request, "", options.signal)) as ToolResult;
  }

  /** Deletes a pending approval; resolves whether it existed. */
  async reject(approvalId: string): Promise<boolean> {
    const result = await this.simple<{ existed: boolean }>({ op: "reject", approval_id: approvalId });
    return result.existed;
  }

  /**
   * Makes a tool `active`, `deferred` or `suspended` (an unknown tool throws `RequestError`):
   * daemon-wide, or with `session` for the calls in that open session only (its state wins
   * over the daemon-wide one until it closes; a session that is gone throws
   * `SessionUnknownError`).
   */
  async setState(tool: string, state: ToolState, options: { session?: string } = {}): Promise<SetStateAnswer> {
    const request: SetStateRequest = { op: "set_state", tool, state };
    if (options.session !== undefined) request.session = options.session;
    return this.simple<SetStateAnswer>(request);
  }

  /**
   * Opens a session workspace (`session_open`). Throws `SessionLimitError` when the policy's
   * `max_sessions` are open, and `RequestError` (`invalid_request`) for a bad base or size.
   */
  async openSession(options: SessionOpenOptions = {}): Promise<Session> {
    const request: SessionOpenRequest = { op: "session_open" };
    if (options.base !== undefined) request.base = options.base;
    if (options.size !== undefined) request.size = options.size;
    if (options.planMode) request.plan_mode = true;
    return new Session(this, await this.simple<SessionOpenAnswer>(request));
  }

  /**
   * Writes a file of a session's workspace (`put_file`); a string is written as UTF-8.
   * Throws `WorkspaceFullError` when it does not fit, `SessionUnknownError` for no such session.
   */
  async putFile(session: string, path: string, content: Uint8Array | string): Promise<PutFileAnswer> {
    const bytes = typeof content === "string" ? Buffer.from(content, "utf8") : Buffer.from(content);
    return this.simple<PutFileAnswer>({
      op: "put_file",
      session,
      path,
      content_base64: bytes.toString("base64"),
    });
  }

  /** Reads a file of a session's workspace (`get_file`, at most 1 MiB). */
  async getFile(session: string, path: string): Promise<Buffer> {
    const answer = await this.simple<GetFileAnswer>({ op: "get_file", session, path });
    return Buffer.from(answer.content_base64, "base64");
  }

  /** What differs in a session's workspace from its base (`changes`). */
  async changes(session: string): Promise<Change[]> {
    return (await this.simple<ChangesAnswer>({ op: "changes", session })).changes;
  }

  /**
   * Puts every call in an open session in plan mode, or lifts that (`session_set`). Anyone
   * may put a session in plan mode; lifting it throws `RequestError` (`forbidden`) unless
   * this peer is one of the daemon's approvers (when it has any).
   */
  async setPlanMode(session: string, planMode: boolean): Promise<SessionSetAnswer> {
    const request: SessionSetRequest = { op: "session_set", session, plan_mode: planMode };
    return this.simple<SessionSetAnswer>(request);
  }

  /** Closes a session and removes its files (`session_close`). */
  async closeSession(session: string): Promise<void> {
    await this.simple<{ closed: true }>({ op: "session_close", session });
  }

  /** Closes the connection; requests in flight reject with `ClientClosedError` and the daemon cancels them. */
  async close(): Promise<void> {
    if (this.closed) {
      return;
    }
    this.closed = true;
    this.closing.abort();
    const connection = this.connection;
    this.connection = undefined;
    if (connection) {
      await connection.destroy(new ClientClosedError());
    }
  }

  // ---- internals ------------------------------------------------------------------------

  private nextId(): string {
    this.counter += 1;
    return `ts-${this.counter}`;
  }

  /** The open connection, or a new one (after a drop) within the reconnect bounds. */
  private async current(): Promise<Connection> {
    if (this.closed) {
      throw new ClientClosedError();
    }
    if (this.connection && !this.connection.closed) {
      return this.connection;
    }
    if (this.reconnect === false) {
      throw new ConnectionLostError(
        `the connection to the airlock daemon at ${this.socketPath} is closed and reconnect is off`,
      );
    }
    if (!this.opening) {
      this.opening = this.open(this.reconnect.attempts).then(
        (connection) => {
          this.opening = undefined;
          if (this.closed) {
            void connection.destroy(new ClientClosedError());
            throw new ClientClosedError();
          }
          this.connection = connection;
          return connection;
        },
        (error: unknown) => {
          this.opening = undefined;
          throw error;
        },
      );
    }
    return this.opening;
  }

  /** Up to `attempts` connections with a doubling delay between them, each checked by `health`. */
  private async open(attempts: number): Promise<Connection> {
    const backoff = this.reconnect === false ? RECONNECT_DEFAULTS : this.reconnect;
    let lastError: unknown;
    let delay = backoff.initialDelayMs;
    for (let attempt = 1; attempt <= attempts; attempt += 1) {
      if (attempt > 1) {
        const hinted = lastError instanceof DaemonRefusedError ? (lastError.retryAfterMs ?? 0) : 0;
        if (!(await pause(Math.max(delay, hinted), this.closing.signal))) {
          throw new ClientClosedError();
        }
        delay = Math.min(delay * 2, backoff.maxDelayMs);
      }
      if (this.closed) {
        throw new ClientClosedError();
      }
      let connection: Connection;
      let answer: Answer;
      try {
        ({ connection, answer } = await this.attempt());
      } catch (error) {
        if (error instanceof ClientClosedError) {
          throw error;
        }
        if (error instanceof DaemonRefusedError && error.kind === "forbidden") {
          throw error;
        }
        lastError =
          error instanceof ConnectionLostError
            ? new ConnectionLostError(
                `the airlock daemon at ${this.socketPath} closed the connection before answering the handshake ` +
                  `(${describe(error.cause ?? error)}): it may be turning connections away (--max-connections) ` +
                  "or refusing this peer, and closed before its refusal could be read",
                { cause: error },
              )
            : error;
        continue;
      }
      const health = answer.result as Health | undefined;
      if (!health || health.protocol_version !== PROTOCOL_VERSION) {
        void connection.destroy(new ConnectionLostError("protocol mismatch"));
        throw new ProtocolMismatchError(PROTOCOL_VERSION, health?.protocol_version, health?.version);
      }
      this.lastHealth = health;
      return connection;
    }
    if (lastError instanceof TransportError) {
      throw lastError;
    }
    throw new ConnectError(this.socketPath, attempts, lastError);
  }

  /**
   * One connection attempt and its `health` handshake, within `connectTimeoutMs` together:
   * on a Unix socket the connection is made when the kernel queues it, so a daemon that is
   * stopped or out of descriptors is only seen by its silence. `close()` ends the attempt.
   * Whatever fails, the attempt's socket is destroyed.
   */
  private async attempt(): Promise<{ connection: Connection; answer: Answer }> {
    const timeoutMs = this.options.connectTimeoutMs ?? 5000;
    const stop = new AbortController();
    let connection: Connection | undefined;
    const timer = setTimeout(() => {
      stop.abort(
        new Error(
          connection
            ? `connected, but no answer to the handshake within ${timeoutMs} ms`
            : `no connection and handshake within ${timeoutMs} ms`,
        ),
      );
    }, timeoutMs);
    const closed = () => stop.abort(new ClientClosedError());
    this.closing.signal.addEventListener("abort", closed, { once: true });
    if (this.closing.signal.aborted) {
      closed();
    }
    const dropped = () => void connection?.destroy(stop.signal.reason as Error);
    try {
      connection = await Connection.open(this.socketPath, this.maxAnswerBytes, stop.signal);
      stop.signal.addEventListener("abort", dropped, { once: true });
      const answer = await connection.send(this.nextId(), { op: "health" });
      return { connection, answer };
    } catch (error) {
      void connection?.destroy(stop.signal.aborted ? (stop.signal.reason as Error) : new ConnectionLostError("handshake failed"));
      throw error;
    } finally {
      clearTimeout(timer);
      this.closing.signal.removeEventListener("abort", closed);
      stop.signal.removeEventListener("abort", dropped);
    }
  }

  /** One request whose answer is a `result`; an `error` answer throws `RequestError`. */
  private async simple<T>(request: Request): Promise<T> {
    const connection = await this.current();
    const answer = await connection.send(this.nextId(), request);
    if (answer.error) {
      throw requestError(answer.error);
    }
    return answer.result as T;
  }

  /** A `call` or `execute`: cancellable, and retried while the daemon is `overloaded`. */
  private async runCall(
    request: CallRequest | ExecuteRequest,
    tool: string,
    signal: AbortSignal | undefined,
  ): Promise<ToolResult | DryRunAnswer> {
    let retries = 0;
    let callId = request.op === "call" ? (request.call_id ?? "") : "";
    for (;;) {
      if (signal?.aborted) {
        return notSent(callId, tool, "cancelled before it was sent to the daemon");
      }
      const connection = await raceAbort(this.current(), signal);
      if (connection === undefined) {
        return notSent(callId, tool, "cancelled while connecting to the daemon");
      }
      const id = this.nextId();
      const answered = connection.send(id, request);
      // After an abort the daemon's answer says how the call ended, but it is waited for
      // only `cancelGraceMs`: a daemon that does not answer must not hold the caller.
      let graceTimer: ReturnType<typeof setTimeout> | undefined;
      let gaveUp: (() => void) | undefined;
      const graceOver = new Promise<undefined>((resolve) => {
        gaveUp = () => resolve(undefined);
      });
      const onAbort = () => {
        connection.cancel(this.nextId(), id);
        graceTimer = setTimeout(() => {
          connection.forget(id);
          gaveUp?.();
        }, this.cancelGraceMs);
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      // An abort between the connection's arrival and the listener has no event left.
      if (signal?.aborted) {
        signal.removeEventListener("abort", onAbort);
        onAbort();
      }
      let answer: Answer | undefined;
      try {
        answer = await Promise.race([answered, graceOver]);
      } finally {
        signal?.removeEventListener("abort", onAbort);
        clearTimeout(graceTimer);
      }
      if (answer === undefined) {
        return cancelledRecord(
          callId,
          tool,
          `the daemon did not answer the cancel within ${this.cancelGraceMs} ms: the call may still be running`,
        );
      }
      if (answer.error) {
        throw requestError(answer.error);
      }
      const result = answer.result as unknown as ToolResult | DryRunAnswer;
      const retry = this.overloadRetry;
      if (
        retry !== false &&
        "call_id" in result &&
        result.error?.kind === "overloaded" &&
        typeof result.error.retry_after_ms === "number" &&
        retries < retry.maxRetries
      ) {
        retries += 1;
        callId = result.call_id;
        tool = result.tool;
        const waited = Math.min(result.error.retry_after_ms, retry.maxDelayMs);
        if (!(await pause(waited, signal, this.closing.signal))) {
          if (this.closed) {
            throw new ClientClosedError();
          }
          return notSent(callId, tool, "cancelled while waiting to retry an overloaded daemon");
        }
        continue;
      }
      return result;
    }
  }
}

/** The first bytes of a line kept in `parts` and ending with `last`. */
function lineHead(parts: Buffer[], last: Buffer): Buffer {
  const pieces: Buffer[] = [];
  let bytes = 0;
  for (const piece of [...parts, last]) {
    if (bytes >= ID_HEAD_BYTES) break;
    const taken = piece.subarray(0, ID_HEAD_BYTES - bytes);
    pieces.push(taken);
    bytes += taken.length;
  }
  return Buffer.concat(pieces, bytes);
}

/** `{"id":` then a JSON string or integer, then what may follow a complete value. */
const LEADING_ID = /^\s*\{\s*"id"\s*:\s*("(?:[^"\\\u0000-\u001f]|\\.)*"|-?\d+)\s*[,}]/;

/**
 * The id an answer line begins with, as `pending` keys it; undefined when it does not
 * begin with one (the daemon writes `id` first in every answer with a `result`).
 */
function leadingId(head: Buffer): string | undefined {
  const match = LEADING_ID.exec(head.toString("utf8"));
  if (!match) {
    return undefined;
  }
  try {
    const id: unknown = JSON.parse(match[1] as string);
    return typeof id === "string" ? id : JSON.stringify(id);
  } catch {
    return undefined;
  }
}

/** The result record of a call cancelled before the daemon had it: nothing ran. */
export function notSent(callId: string, tool: string, message: string): ToolResult {
  return cancelledRecord(callId, tool, message);
}

/** A `cancelled` result record made by the client, for want of the daemon's. */
function cancelledRecord(callId: string, tool: string, message: string): ToolResult {
  return {
    call_id: callId,
    tool,
    ok: false,
    output: null,
    error: { kind: "cancelled", message },
    exit_code: null,
    signal: null,
    stdout: "",
    stderr: "",
    stdout_truncated: false,
    stderr_truncated: false,
    duration_ms: 0,
    attempts: 0,
    usage: { cpu_ms: 0, peak_memory_bytes: null },
    isolation: null,
    network: null,
    denials: [],
  };
}

/** Waits `ms`; false when a signal aborted first. */
function pause(ms: number, ...signals: (AbortSignal | undefined)[]): Promise<boolean> {
  return new Promise((resolve) => {
    const live = signals.filter((s): s is AbortSignal => s !== undefined);
    if (live.some((s) => s.aborted)) {
      resolve(false);
      return;
    }
    const done = (elapsed: boolean) => {
      clearTimeout(timer);
      for (const s of live) s.removeEventListener("abort", aborted);
      resolve(elapsed);
    };
    const aborted = () => done(false);
    const timer = setTimeout(() => done(true), ms);
    for (const s of live) s.addEventListener("abort", aborted, { once: true });
  });
}

/** `promise`'s value, or undefined once `signal` aborts (the promise goes on unobserved). */
export function raceAbort<T>(promise: Promise<T>, signal: AbortSignal | undefined): Promise<T | undefined> {
  if (!signal) {
    return promise;
  }
  return new Promise((resolve, reject) => {
    const aborted = () => resolve(undefined);
    signal.addEventListener("abort", aborted, { once: true });
    promise.then(
      (value) => {
        signal.removeEventListener("abort", aborted);
        resolve(value);
      },
      (error: unknown) => {
        signal.removeEventListener("abort", aborted);
        if (signal.aborted) resolve(undefined);
        else reject(error);
      },
    );
  });
}
