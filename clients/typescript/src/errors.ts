/**
 * What the client throws. A tool or the gate failing is never thrown: it is a result record
 * with `ok: false` and an `error.kind`. Thrown are only
 *
 * - `TransportError` and its subclasses: the socket could not be reached, dropped, was
 *   closed by you, or the daemon refused the whole connection;
 * - `ProtocolMismatchError`: the daemon speaks another version of the wire contract;
 * - `RequestError`: the daemon refused the request itself (`invalid_request`, `forbidden`,
 *   `unknown_tool` from `set_state`): a bug in the caller or a missing permission, not an
 *   outcome of a tool. The session ops' refusals are its subclasses `SessionUnknownError`,
 *   `SessionLimitError` and `WorkspaceFullError`, so that an agent loop can tell "the
 *   session is gone" from "too many sessions" from "no room" without comparing strings.
 */

import type { RequestErrorBody } from "./protocol.js";

export class AirlockError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** The daemon could not be talked to. */
export class TransportError extends AirlockError {}

/** Connecting failed (after the configured attempts); `cause` is the last socket error. */
export class ConnectError extends TransportError {
  constructor(
    readonly socketPath: string,
    readonly attempts: number,
    cause: unknown,
  ) {
    super(
      `cannot connect to the airlock daemon at ${socketPath} (${attempts} attempt${attempts === 1 ? "" : "s"}): ${describe(cause)}`,
      { cause },
    );
  }
}

/**
 * The connection ended while this request was in flight: its outcome is unknown (a call may
 * have run, or be cancelled by the daemon, which cancels a departed client's calls).
 */
export class ConnectionLostError extends TransportError {}

/** The client was closed (`close()`), before or while the request was in flight. */
export class ClientClosedError extends TransportError {
  constructor() {
    super("the airlock client is closed");
  }
}

/**
 * The daemon turned the whole connection away (`{"id": null, "error": ...}`, then closed it):
 * `forbidden` (this peer may not connect) or `overloaded` (too many connections, or the
 * daemon's input budget is spent; `retryAfterMs` says when to try again).
 */
export class DaemonRefusedError extends TransportError {
  readonly kind: string;
  readonly retryAfterMs: number | undefined;
  constructor(body: RequestErrorBody) {
    super(`the airlock daemon refused the connection: ${body.kind}: ${body.message}`);
    this.kind = body.kind;
    this.retryAfterMs = body.retry_after_ms;
  }
}

/** The daemon sent something that is not a JSON answer line; the connection is dropped. */
export class WireError extends TransportError {}

/**
 * An answer line longer than the client's `maxAnswerBytes`. When the line begins with its
 * id (the daemon's answers do) only the request it answers fails and the rest of the line
 * is skipped; otherwise there is no telling whose answer it is, every request in flight
 * fails and the connection is dropped.
 */
export class AnswerTooLargeError extends WireError {
  constructor(
    readonly limit: number,
    message: string,
  ) {
    super(message);
  }
}

/** The daemon speaks another version of the wire contract than this package. */
export class ProtocolMismatchError extends AirlockError {
  constructor(
    readonly expected: number,
    readonly actual: unknown,
    readonly daemonVersion?: string,
  ) {
    super(
      `the airlock daemon${daemonVersion ? ` (airlock ${daemonVersion})` : ""} speaks protocol_version ` +
        `${JSON.stringify(actual)}; @airlock/client is written for protocol_version ${expected}`,
    );
  }
}

/** The daemon refused the request itself (`{"id", "error": {kind, message}}`). */
export class RequestError extends AirlockError {
  readonly kind: RequestErrorBody["kind"];
  readonly retryAfterMs: number | undefined;
  constructor(body: RequestErrorBody) {
    super(`${body.kind}: ${body.message}`);
    this.kind = body.kind;
    this.retryAfterMs = body.retry_after_ms;
  }
}

/** `session_unknown`: no open session has this id (never opened, closed or expired). */
export class SessionUnknownError extends RequestError {}

/** `session_limit`: as many sessions are open as the policy's `max_sessions`. */
export class SessionLimitError extends RequestError {}

/** `workspace_full`: the session's workspace has no room for the file. */
export class WorkspaceFullError extends RequestError {}

/** The `RequestError` (or the subclass of its kind) for an answer's `error`. */
export function requestError(body: RequestErrorBody): RequestError {
  switch (body.kind) {
    case "session_unknown":
      return new SessionUnknownError(body);
    case "session_limit":
      return new SessionLimitError(body);
    case "workspace_full":
      return new WorkspaceFullError(body);
    default:
      return new RequestError(body);
  }
}

export function describe(error: unknown): string {
  if (error instanceof Error) {
    const code = (error as NodeJS.ErrnoException).code;
    return code && !error.message.includes(code) ? `${code}: ${error.message}` : error.message;
  }
  return String(error);
}
