//! airlock-worker: the single-threaded program that confines itself and runs one tool call.
//!
//! The supervisor execs this (from a sealed memfd) inside fresh namespaces; [`worker_main`]
//! speaks the protocol, runs [`confine::confine_worker`] — the whole recipe in one function
//! — and then runs the tool. All unsafe code sits in [`sys`].

pub mod builtin;
pub mod confine;
pub mod landlock;
pub mod mounts;
pub mod run;
pub mod serve;
pub mod sys;

pub use serve::worker_main;

/// The argv[1] that turns the `airlock` binary into a worker.
pub const WORKER_ARG: &str = "__airlock_worker";
