//! airlock: the trusted supervisor — spawn, cgroups, deadlines, the gate, results, daemon.
//!
//! [`Supervisor`] runs one call in one fresh, single-use worker: it creates the worker's
//! cgroup, clones the worker from a sealed image into fresh namespaces, speaks the
//! protocol, enforces the deadline and cancellation, kills and reaps everything, reads the
//! cgroup counters and returns one [`ToolResult`]. [`Gate`] puts the
//! agent frameworks' semantics in front of it (validation, rules, plan mode, approvals,
//! retries, rate limits, audit); [`daemon`] serves a gate on a Unix socket.
//!
//! A gateway that links the library:
//!
//! ```no_run
//! use std::sync::Arc;
//! use airlock::{CallOptions, Gate, Supervisor, SupervisorOptions, ToolCall};
//!
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     // Workers are this very binary, exec'd from a sealed copy: hook them in first.
//!     if let Some(code) = airlock_worker::run_if_worker() {
//!         std::process::exit(code);
//!     }
//!     let policy = airlock_policy::load_policy_file("policy.toml".as_ref())?.policy;
//!     let runtime = tokio::runtime::Runtime::new()?;
//!     runtime.block_on(async {
//!         // Or `worker_program: Some((PathBuf::from("/usr/bin/airlock"), vec![]))` to use
//!         // an installed airlock binary instead of the hook.
//!         let supervisor = Arc::new(Supervisor::start(SupervisorOptions::default())?);
//!         let gate = Gate::new(Arc::clone(&supervisor), policy);
//!         for tool in gate.tools() {
//!             if tool.state == airlock_policy::validate::ToolState::Active {
//!                 println!("{}: {}", tool.name, tool.input_schema); // hand these to the model
//!             }
//!         }
//!         let call = ToolCall { call_id: "c1".into(), tool: "word_count".into(), arguments: r#"{"text":"a b"}"#.into() };
//!         let result = gate.call(&call, &CallOptions::default()).await;
//!         println!("{}", serde_json::to_string(&result)?);
//!         supervisor.close().await; // every worker gone, every cgroup removed
//!         Ok::<(), Box<dyn std::error::Error>>(())
//!     })
//! }
//! ```

pub mod approvals;
pub mod audit;
pub mod backend;
pub mod call;
pub mod cancel;
pub mod cgroup;
mod channel;
mod clock;
pub mod daemon;
mod denials;
pub mod egress;
mod egress_audit;
pub mod gate;
mod heap;
pub mod landlock_audit;
pub mod listing;
pub mod mcp;
pub mod observe;
pub mod pool;
mod rate;
pub mod result;
pub mod sandbox;
mod serial;
pub mod session;
mod spawn;
mod sys;
mod template;

pub use backend::{Acknowledgement, Sandbox, UnsafeLocal};
pub use call::ToolCall;
pub use cancel::CancelSignal;
pub use gate::{Approval, CallOptions, Gate};
pub use result::{ErrorKind, ToolError, ToolResult};
pub use sandbox::{
    LandlockAuditState, NetworkNamespaces, SandboxRun, Supervisor, SupervisorOptions,
};
pub use session::{SessionError, Sessions};
pub use spawn::NamespaceCounts;
