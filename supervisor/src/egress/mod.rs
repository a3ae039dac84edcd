//! Per-call network egress through a proxy the supervisor runs.
//!
//! A worker of an egress profile has a network namespace of its own with only `lo`; it
//! listens on `127.0.0.1:3128` there and passes that socket to the supervisor, which serves
//! it from its own runtime with [`proxy::serve`]. The tools are pointed at it with
//! `HTTP_PROXY`, `HTTPS_PROXY` and `ALL_PROXY`, and no other way leads out: every
//! connection is one the proxy decided on. `airlock_policy::egress` holds the allowlist
//! model, [`http`] and [`socks`] the two ways of asking (HTTP `CONNECT` or absolute form,
//! and SOCKS5), and [`proxy`] the server that checks, resolves once, connects and relays.

pub mod http;
pub mod proxy;
pub mod socks;

pub use airlock_policy::egress::{
    AddressClass, Cidr, Decision, DenyReason, EgressPolicy, Host, HostRule,
};
pub use proxy::{
    EgressEvent, EgressLimits, EgressSummary, EventSink, Resolve, SystemResolver, serve,
};
