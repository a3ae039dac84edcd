//! Per-call network egress through a proxy the supervisor runs.
//!
//! A worker's network namespace has only `lo`; the supervisor puts a listening socket in it
//! and serves it from its own runtime with [`proxy::serve`], and the worker is pointed at it
//! with `HTTP_PROXY`, `HTTPS_PROXY` and `ALL_PROXY`. Every connection the worker makes is
//! then one the proxy decided on: `airlock_policy::egress` holds the allowlist model, [`http`] and
//! [`socks`] the two ways of asking (HTTP `CONNECT` or absolute-form, and SOCKS5), and
//! [`proxy`] the server that checks, resolves once, connects and relays.

pub mod http;
pub mod proxy;
pub mod socks;

pub use airlock_policy::egress::{
    AddressClass, Cidr, Decision, DenyReason, EgressPolicy, Host, HostRule,
};
pub use proxy::{
    EgressEvent, EgressLimits, EgressSummary, EventSink, Resolve, SystemResolver, serve,
};
