/**
 * The daemon's wire contract, as TypeScript types.
 *
 * Every type here mirrors one object of `supervisor/src/daemon/protocol.schema.json`, field
 * for field and in the daemon's own snake_case: a result record is handed to you exactly as
 * the daemon sent it, so nothing is renamed and nothing can be lost in a mapping. The test
 * `schema.test.ts` reads this file with the TypeScript compiler and the schema side by side,
 * and fails when a property, its optionality, its JSON type or an enum's members differ —
 * the table `SCHEMA_OF` at the end says which interface is which schema object.
 *
 * Only the options you pass in (`CallOptions`, `ConnectOptions`) are camelCase: they are
 * this package's API, not the wire's.
 */

/** The wire contract this package is written for; `connect` refuses a daemon speaking another. */
export const PROTOCOL_VERSION = 1;

/** A request id: the client makes them, unique for the client's lifetime. */
export type RequestId = string | number | null;

export type ToolState = "active" | "deferred" | "suspended";
export type SideEffect = "read" | "write" | "destructive";

/** Every `error.kind` of a result record. */
export type ErrorKind =
  | "invalid_input"
  | "unknown_tool"
  | "tool_unavailable"
  | "denied"
  | "approval_required"
  | "approval_invalid"
  | "timeout"
  | "out_of_memory"
  | "pids_limit"
  | "cpu_time_limit"
  | "file_size_limit"
  | "seccomp_violation"
  | "tool_failed"
  | "output_invalid"
  | "protocol_violation"
  | "sandbox_unavailable"
  | "cancelled"
  | "overloaded"
  | "rate_limited"
  | "workspace_full"
  | "session_unknown"
  | "session_limit";

/** One schema violation of `invalid_input`: where and which keyword, never the value. */
export interface Violation {
  path: string;
  keyword: string;
  message: string;
}

/** A result record's `error`: `kind`, `message`, and the fields its kind carries. */
export interface ToolError {
  kind: ErrorKind;
  message: string;
  /** invalid_input */
  violations?: Violation[];
  /** seccomp_violation */
  syscall?: string;
  /** sandbox_unavailable, protocol_violation: the step that failed */
  step?: string;
  /** timeout */
  timeout_ms?: number;
  /** denied, approval_required */
  rule?: string;
  /** overloaded */
  retry_after_ms?: number;
  /** tool_unavailable */
  state?: "deferred" | "suspended";
}

export interface Usage {
  cpu_ms: number;
  peak_memory_bytes: number | null;
}

export interface IsolationLimits {
  memory_bytes: number;
  pids: number;
  timeout_ms: number;
  output_bytes: number;
}

/** Per layer, whether `denials` can show its refusals; `unavailable`: an empty list says nothing of it. */
export interface DenialReporting {
  seccomp: "reported" | "unavailable";
  landlock: "reported" | "unavailable";
  mounts: "reported" | "unavailable";
  network: "reported" | "unavailable";
  limits: "reported" | "unavailable";
}

export interface Isolation {
  backend: "airlock" | "unsafe_local";
  namespaces: string[];
  landlock_abi: number;
  landlock: "full" | "partial" | "none";
  seccomp: string | null;
  cgroup: "v1" | "v2" | null;
  limits: IsolationLimits;
  denial_reporting: DenialReporting;
  /** For a call in a session: how its workspace holds the session's base. */
  workspace: "overlay" | "copy" | "empty" | null;
}

/** One kind of refusal during a call, counted: which layer refused what. */
export interface Denial {
  layer: "seccomp" | "landlock" | "mounts" | "network" | "limit";
  /** A syscall's name, a destination `host:port`, or a limit's name. */
  object: string;
  /** seccomp: the errno the syscall got. */
  errno?: string;
  /** seccomp: the argument rule; network: the reason; limit `output`: the stream. */
  rule?: string;
  count: number;
}

export interface NetworkEvent {
  kind: "unknown" | "connect" | "forward" | "socks5";
  host: string;
  port: number;
  address: string | null;
  allowed: boolean;
  rule_or_reason: string;
  bytes_up: number;
  bytes_down: number;
  end: "closed" | "client_error" | "upstream_error" | "byte_limit" | "stopped" | "unreachable" | null;
  error?: string;
}

/** What the egress proxy let through and refused (profiles with an allowlist). */
export interface NetworkReport {
  connections: number;
  refused: number;
  failed: number;
  bytes_up: number;
  bytes_down: number;
  events: NetworkEvent[];
  events_omitted: number;
}

/**
 * One call's outcome, whatever happened: the daemon's result record, unchanged.
 * `output` is the parsed JSON of a tool with an output schema (its `stdout` is then empty);
 * for every other tool it is null and the output is `stdout`.
 */
export interface ToolResult {
  call_id: string;
  tool: string;
  ok: boolean;
  output: unknown;
  error: ToolError | null;
  exit_code: number | null;
  signal: number | null;
  stdout: string;
  stderr: string;
  stdout_truncated: boolean;
  stderr_truncated: boolean;
  duration_ms: number;
  attempts: number;
  usage: Usage;
  isolation: Isolation | null;
  network: NetworkReport | null;
  /** What was refused during the call (see `isolation.denial_reporting`). */
  denials: Denial[];
}

/** Exactly what `execute` will run, and why it needs a human. */
export interface Approval {
  approval_id: string;
  tool: string;
  arguments: unknown;
  input_digest: string;
  argv_preview: string[];
  builtin: string | null;
  profile: string;
  timeout_ms: number;
  session: string | null;
  rule: string;
  reason: string;
  policy_version: string;
  tool_version: string;
  expires_at_ms: number;
}

/** What a `dry_run` call would run. */
export interface DryRun {
  tool: string;
  decision: "allow" | "deny" | "review";
  rule: string;
  approval_required: boolean;
  argv: string[];
  builtin: string | null;
  stdin_bytes: number;
  env: [string, string][];
  profile: string;
  sandbox: Record<string, unknown>;
  timeout_ms: number;
  input_digest: string;
}

/** One tool of the policy, whatever its state: offer a model the active ones. */
export interface ToolListing {
  name: string;
  description: string;
  input_schema: Record<string, unknown>;
  output_schema: Record<string, unknown> | null;
  side_effect: SideEffect;
  category: string | null;
  concurrency_safe: boolean;
  approval: "auto" | "human";
  timeout_ms: number;
  retries: number;
  state: ToolState;
}

export interface Health {
  ok: true;
  version: string;
  protocol_version: 1;
  policy_version: string;
  /** Ready for calls (policy loaded, pools warm); absent from daemons older than it. */
  ready?: boolean;
  /** Why the daemon is not ready; null when it is. */
  not_ready?: string | null;
}

export interface Stats {
  connections: number;
  connections_open: number;
  max_connections: number;
  refused_peers: number;
  requests: number;
  calls: number;
  in_flight: number;
  queued: number;
  overloaded: number;
  input_bytes: number;
  max_input_bytes: number;
  input_refused: number;
  output_bytes: number;
  max_output_bytes: number;
  closed_unread: number;
  write_timeout_ms: number;
  pending_approvals: number;
  pool: Record<string, unknown>;
  warm_pools: number;
  max_concurrent: number;
  max_queued: number;
  /** The daemon's soft open-file limit (raised to the hard limit at start). */
  max_open_files: number;
  /** Descriptors the daemon can hold at most with its flags (egress tunnels aside). */
  open_files_needed: number;
  sessions_open: number;
}

/** The answer of `call` with `dry_run`. */
export interface DryRunAnswer {
  dry_run: DryRun;
}

/** The answer of `propose` when the approval was stored. */
export interface ApprovalAnswer {
  approval: Approval;
}

export interface CancelAnswer {
  cancelled: boolean;
}

export interface RejectAnswer {
  existed: boolean;
}

export interface SetStateAnswer {
  tool: string;
  state: ToolState;
}

export interface ToolsAnswer {
  tools: ToolListing[];
}

/** The answer of `session_open`. */
export interface SessionOpenAnswer {
  session: string;
  expires_at: number;
  isolation: "overlay" | "copy" | "empty";
  size: number;
}

export interface PutFileAnswer {
  size: number;
}

export interface GetFileAnswer {
  content_base64: string;
  size: number;
}

/** One path of a session's workspace that differs from its base. */
export interface Change {
  path: string;
  kind: "added" | "modified" | "deleted";
  size: number;
}

export interface ChangesAnswer {
  changes: Change[];
}

export interface SessionCloseAnswer {
  closed: true;
}

export interface SessionSetAnswer {
  session: string;
  plan_mode: boolean;
}

/** A request the daemon did not take (`{"id", "error"}` instead of `{"id", "result"}`). */
export interface RequestErrorBody {
  kind:
    | "invalid_request"
    | "forbidden"
    | "overloaded"
    | "unknown_tool"
    | "workspace_full"
    | "session_unknown"
    | "session_limit"
    | "sandbox_unavailable";
  message: string;
  retry_after_ms?: number;
}

/** One answer line. */
export interface Answer {
  id: RequestId;
  result?: Record<string, unknown>;
  error?: RequestErrorBody;
}

// ---- requests, as they go on the wire ----------------------------------------------------

export interface CallRequest {
  id?: RequestId;
  op: "call";
  tool: string;
  arguments?: unknown;
  arguments_json?: string;
  call_id?: string;
  session?: string;
  plan_mode?: boolean;
  timeout_ms?: number;
  dry_run?: boolean;
}

export interface ProposeRequest {
  id?: RequestId;
  op: "propose";
  tool: string;
  arguments?: unknown;
  arguments_json?: string;
  call_id?: string;
  session?: string;
  plan_mode?: boolean;
}

export interface CancelRequest {
  id?: RequestId;
  op: "cancel";
  target: RequestId;
}

export interface ExecuteRequest {
  id?: RequestId;
  op: "execute";
  approval_id: string;
  session?: string;
}

export interface RejectRequest {
  id?: RequestId;
  op: "reject";
  approval_id: string;
}

export interface SetStateRequest {
  id?: RequestId;
  op: "set_state";
  tool: string;
  state: ToolState;
  session?: string;
}

export interface PlainRequest {
  id?: RequestId;
  op: "health" | "stats";
}

export interface ToolsRequest {
  id?: RequestId;
  op: "tools";
  session?: string;
}

export interface SessionOpenRequest {
  id?: RequestId;
  op: "session_open";
  base?: string;
  size?: number | string;
  plan_mode?: boolean;
}

export interface PutFileRequest {
  id?: RequestId;
  op: "put_file";
  session: string;
  path: string;
  content_base64: string;
}

export interface GetFileRequest {
  id?: RequestId;
  op: "get_file";
  session: string;
  path: string;
}

/** `changes` and `session_close`. */
export interface SessionRequest {
  id?: RequestId;
  op: "changes" | "session_close";
  session: string;
}

export interface SessionSetRequest {
  id?: RequestId;
  op: "session_set";
  session: string;
  plan_mode: boolean;
}

export type Request =
  | CallRequest
  | ProposeRequest
  | CancelRequest
  | ExecuteRequest
  | RejectRequest
  | SetStateRequest
  | PlainRequest
  | SessionOpenRequest
  | PutFileRequest
  | GetFileRequest
  | SessionRequest
  | SessionSetRequest
  | ToolsRequest;

/**
 * Which schema object each interface above mirrors (JSON pointers into
 * protocol.schema.json). `schema.test.ts` checks every entry both ways; an interface of
 * this file missing here fails the test too, so a new type cannot skip the check.
 */
export const SCHEMA_OF = {
  Violation: "/$defs/tool_error/properties/violations/items",
  ToolError: "/$defs/tool_error",
  Usage: "/$defs/tool_result/properties/usage",
  IsolationLimits: "/$defs/tool_result/properties/isolation/properties/limits",
  Isolation: "/$defs/tool_result/properties/isolation",
  DenialReporting: "/$defs/tool_result/properties/isolation/properties/denial_reporting",
  Denial: "/$defs/tool_result/properties/denials/items",
  NetworkEvent: "/$defs/tool_result/properties/network/properties/events/items",
  NetworkReport: "/$defs/tool_result/properties/network",
  ToolResult: "/$defs/tool_result",
  Approval: "/$defs/approval",
  DryRun: "/$defs/dry_run",
  ToolListing: "/$defs/tool_listing",
  Health: "/$defs/answers/properties/health/properties/result",
  Stats: "/$defs/answers/properties/stats/properties/result",
  DryRunAnswer: "/$defs/answers/properties/call/properties/result/oneOf/1",
  ApprovalAnswer: "/$defs/answers/properties/propose/properties/result/oneOf/1",
  CancelAnswer: "/$defs/answers/properties/cancel/properties/result",
  RejectAnswer: "/$defs/answers/properties/reject/properties/result",
  SetStateAnswer: "/$defs/answers/properties/set_state/properties/result",
  ToolsAnswer: "/$defs/answers/properties/tools/properties/result",
  SessionOpenAnswer: "/$defs/answers/properties/session_open/properties/result",
  PutFileAnswer: "/$defs/answers/properties/put_file/properties/result",
  GetFileAnswer: "/$defs/answers/properties/get_file/properties/result",
  Change: "/$defs/answers/properties/changes/properties/result/properties/changes/items",
  ChangesAnswer: "/$defs/answers/properties/changes/properties/result",
  SessionCloseAnswer: "/$defs/answers/properties/session_close/properties/result",
  SessionSetAnswer: "/$defs/answers/properties/session_set/properties/result",
  RequestErrorBody: "/$defs/request_error",
  Answer: "/$defs/answer",
  CallRequest: "/$defs/request/oneOf/0",
  ProposeRequest: "/$defs/request/oneOf/1",
  CancelRequest: "/$defs/request/oneOf/2",
  ExecuteRequest: "/$defs/request/oneOf/3",
  RejectRequest: "/$defs/request/oneOf/4",
  SetStateRequest: "/$defs/request/oneOf/5",
  PlainRequest: "/$defs/request/oneOf/6",
  SessionOpenRequest: "/$defs/request/oneOf/7",
  PutFileRequest: "/$defs/request/oneOf/8",
  GetFileRequest: "/$defs/request/oneOf/9",
  SessionRequest: "/$defs/request/oneOf/10",
  SessionSetRequest: "/$defs/request/oneOf/11",
  ToolsRequest: "/$defs/request/oneOf/12",
  ErrorKind: "/$defs/error_kind",
  ToolState: "/$defs/tool_listing/properties/state",
  SideEffect: "/$defs/tool_listing/properties/side_effect",
  RequestId: "/$defs/id",
} as const;
