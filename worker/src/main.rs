//! The dedicated worker program: the worker crate alone, without the CLI's async runtime,
//! argument parser or schema validator. The `airlock` binary embeds it (see
//! `cli/build.rs`) and its supervisors exec it from a sealed memfd: a 0.5 MB image instead of
//! the 6.4 MB CLI, so each worker starts faster and takes less memory.
//!
//! C's `main` directly, without Rust's runtime set-up, which reads /proc/self/maps to find
//! the main thread's stack, installs a stack-overflow handler on an alternate signal stack,
//! polls the standard descriptors and ignores SIGPIPE: start-up work, paid by every
//! worker, that a worker does not need. It sets every signal disposition itself (SIGPIPE
//! ignored) before it writes anything.
//!
//! It reads its arguments from `argv` itself: std's `env::args` is filled by a glibc
//! start-up hook that musl (which `cli/build.rs` links the worker against when it can)
//! does not have.
#![no_main]

/// Built against musl, the worker brings its own heap (see `sys::SingleThreadedHeap`):
/// musl's allocator returns pages to the kernel as small allocations are freed, and a
/// worker lives for one call.
#[cfg(target_env = "musl")]
#[global_allocator]
static HEAP: airlock_worker::sys::SingleThreadedHeap =
    airlock_worker::sys::SingleThreadedHeap::new();

#[unsafe(no_mangle)]
extern "C" fn main(argc: std::ffi::c_int, argv: *const *const std::ffi::c_char) -> std::ffi::c_int {
    // SAFETY: these are the C runtime's own argc and argv for main.
    let args = unsafe { airlock_worker::sys::arguments_of_main(argc, argv) };
    airlock_worker::run_if_worker_arguments(&args).unwrap_or_else(|| {
        eprintln!("airlock-worker: run by airlock's supervisor only, not by hand");
        2
    })
}
