//! airlock: the trusted supervisor — spawn, cgroups, deadlines, results.
//!
//! [`sandbox::Supervisor`] runs one call in one fresh, single-use worker: it creates the
//! worker's cgroup, clones the worker from a sealed image into fresh namespaces
//! ([`spawn`]), speaks the protocol ([`channel`]), enforces the deadline and cancellation,
//! kills and reaps everything, reads the cgroup counters and returns one [`ToolResult`].

pub mod audit;
pub mod call;
pub mod cancel;
pub mod cgroup;
pub mod channel;
pub mod daemon;
pub mod gate;
pub mod result;
pub mod sandbox;
pub mod spawn;
mod sys;

pub use call::{ToolCall, call_tool};
pub use cancel::CancelSignal;
pub use gate::{Approval, CallOptions, Gate};
pub use result::{ErrorKind, ToolError, ToolResult};
pub use sandbox::{SandboxRun, Supervisor, SupervisorOptions};
