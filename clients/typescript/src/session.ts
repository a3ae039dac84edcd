/**
 * `Session`: a workspace of files the daemon keeps across calls, and the calls bound to it.
 */

import type { AirlockClient, CallOptions } from "./client.js";
import type {
  Change,
  DryRunAnswer,
  PutFileAnswer,
  SessionOpenAnswer,
  SessionSetAnswer,
  SetStateAnswer,
  ToolListing,
  ToolResult,
  ToolState,
} from "./protocol.js";

/** What `openSession` sends: both optional, as in `session_open`. */
export interface SessionOpenOptions {
  /** A host directory under the policy's `sessions.bases`: the workspace starts as a copy of it. */
  base?: string;
  /** The workspace's size limit: bytes, or a size such as `"64MiB"` (default: the policy's). */
  size?: number | string;
  /** Every call in the session is in plan mode (only read-only tools run); a call cannot lift it (`setPlanMode` can). */
  planMode?: boolean;
}

/** Call options of a session's call: its `session` is the session's own. */
export type SessionCallOptions = Omit<CallOptions, "session">;

/**
 * One open session of the daemon (`openSession`). Its calls see its files at their
 * profile's `workspace`; `putFile`, `getFile` and `changes` read and write them from
 * outside. After `close` (or once the daemon closed it on its idle timeout or at its
 * `max_lifetime`) the file ops
 * throw `SessionUnknownError`, and calls of a workspace tool resolve with a result record
 * of kind `session_unknown`, like every refused call.
 */
export class Session {
  /** The daemon's id of the session: whoever holds it can use the session. */
  readonly id: string;
  /** `copy` when it started as a copy of `base`, `empty` otherwise. */
  readonly isolation: SessionOpenAnswer["isolation"];
  /** The workspace's size limit in bytes. */
  readonly size: number;
  private expires: number;

  /** @internal Made by `AirlockClient.openSession`. */
  constructor(
    private readonly client: AirlockClient,
    opened: SessionOpenAnswer,
  ) {
    this.id = opened.session;
    this.isolation = opened.isolation;
    this.size = opened.size;
    this.expires = opened.expires_at;
  }

  /**
   * When the daemon closes the session unless it is used before (milliseconds since the
   * Unix epoch), as of its opening: every op and call naming it moves this on, but never
   * past the policy's `max_lifetime` from the opening.
   */
  get expiresAt(): number {
    return this.expires;
  }

  /** Writes `content` (bytes, or a string as UTF-8) to `path`, relative to the workspace. */
  putFile(path: string, content: Uint8Array | string): Promise<PutFileAnswer> {
    return this.client.putFile(this.id, path, content);
  }

  /** The bytes of the file at `path` (at most 1 MiB). */
  getFile(path: string): Promise<Buffer> {
    return this.client.getFile(this.id, path);
  }

  /** Every path that differs from the base (or every file, without one), in path order. */
  changes(): Promise<Change[]> {
    return this.client.changes(this.id);
  }

  /** `AirlockClient.call` in this session. */
  call(tool: string, args?: unknown, options?: SessionCallOptions & { dryRun?: false }): Promise<ToolResult>;
  call(tool: string, args: unknown, options: SessionCallOptions & { dryRun: true }): Promise<ToolResult | DryRunAnswer>;
  call(tool: string, args?: unknown, options?: SessionCallOptions): Promise<ToolResult | DryRunAnswer>;
  call(tool: string, args: unknown = {}, options: SessionCallOptions = {}): Promise<ToolResult | DryRunAnswer> {
    return this.client.call(tool, args, { ...options, session: this.id });
  }

  /**
   * Sets a tool's state for this session's calls only (`set_state` with `session`): it wins
   * over the daemon-wide state and goes when the session closes. An approver's op.
   */
  setState(tool: string, state: ToolState): Promise<SetStateAnswer> {
    return this.client.setState(tool, state, { session: this.id });
  }

  /**
   * Puts this session's calls in plan mode (`true`) or lifts it (`false`, an approver's op:
   * see `AirlockClient.setPlanMode`), for the calls decided from then on.
   */
  setPlanMode(planMode: boolean): Promise<SessionSetAnswer> {
    return this.client.setPlanMode(this.id, planMode);
  }

  /** Every tool with the state calls in this session see: offer a model the `active` ones. */
  tools(): Promise<ToolListing[]> {
    return this.client.tools({ session: this.id });
  }

  /** Closes the session: the daemon removes its files. */
  close(): Promise<void> {
    return this.client.closeSession(this.id);
  }
}
