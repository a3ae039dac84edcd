//! airlock-policy: policy files from TOML text to a compiled sandbox spec.
#![forbid(unsafe_code)]

pub mod diagnostic;
pub mod model;
pub mod schema;
pub mod seccomp;
pub mod syscalls;
pub mod units;
