//! airlock-worker: the single-threaded program that confines itself and runs one tool call.
//!
//! The supervisor execs this (from a sealed memfd) inside fresh namespaces; [`worker_main`]
//! speaks the protocol, runs [`confine::confine_worker`] — the whole recipe in one function
//! — and then runs the tool. All unsafe code sits in [`sys`].

pub mod builtin;
pub mod confine;
pub mod landlock;
pub mod mounts;
pub mod paths;
pub mod run;
pub mod serve;
pub mod sys;

pub use serve::worker_main;

/// The argv[1] that turns the `airlock` binary into a worker.
pub const WORKER_ARG: &str = "__airlock_worker";

/// The worker entry hook for programs that link airlock as a library: call it first thing in
/// `main`, before any thread starts. When the supervisor has exec'd this program as a worker
/// it serves and returns the exit code to exit with; otherwise it returns `None` at once.
///
/// ```no_run
/// fn main() {
///     if let Some(code) = airlock_worker::run_if_worker() {
///         std::process::exit(code);
///     }
///     // ... the gateway: build a Supervisor, which execs this same binary as its worker.
/// }
/// ```
// The example is precisely about what goes first in `main`.
#[allow(clippy::needless_doctest_main)]
pub fn run_if_worker() -> Option<i32> {
    let args: Vec<String> = std::env::args().collect();
    run_if_worker_arguments(&args)
}

/// [`run_if_worker`] on a given command line (`args[0]` is the program name), for a
/// program whose `std::env::args` is empty: std fills it from glibc's start-up hook only,
/// so the musl-linked worker program with its own C `main` passes `argv` itself.
pub fn run_if_worker_arguments(args: &[String]) -> Option<i32> {
    (args.get(1).map(String::as_str) == Some(WORKER_ARG)).then(|| worker_main(&args[2..]))
}
