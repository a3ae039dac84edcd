//! The dedicated worker program: the worker crate alone, without the CLI's async runtime,
//! argument parser or schema validator. The `airlock` binary embeds it (see
//! `cli/build.rs`) and its supervisors exec it from a sealed memfd: a 0.5 MB image instead of
//! the 6.4 MB CLI, so each worker starts faster and takes less memory.

fn main() {
    let code = airlock_worker::run_if_worker().unwrap_or_else(|| {
        eprintln!("airlock-worker: run by airlock's supervisor only, not by hand");
        2
    });
    std::process::exit(code);
}
