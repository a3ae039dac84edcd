export * from "./protocol.js";
export * from "./errors.js";
export {
  AirlockClient,
  DEFAULT_MAX_ANSWER_BYTES,
  MAX_REQUEST_BYTES,
  isApproval,
  isDryRun,
  type CallOptions,
  type ConnectOptions,
  type ExecuteOptions,
  type OverloadRetryOptions,
  type ProposeOptions,
  type ProposeResult,
  type ReconnectOptions,
} from "./client.js";
export { Session, type SessionCallOptions, type SessionOpenOptions } from "./session.js";
export * from "./driver.js";
