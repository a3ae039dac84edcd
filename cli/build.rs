//! Builds the dedicated worker program (`worker/src/main.rs`) with the same cargo, profile
//! and target, and leaves it in `OUT_DIR` for the CLI to embed. A worker started from the
//! 0.5 MB image is ready ~0.4 ms sooner than one started from the whole 6.4 MB CLI, and an
//! idle one takes a third of the memory (`airlock bench`, docs/performance-breakdown.md).
//!
//! Built from the same source tree in the same build, it cannot drift from the supervisor
//! it serves. If it cannot be built here, the image is left empty and the CLI falls back to
//! execing itself as the worker (slower, equally confined); the build prints why, and
//! `airlock doctor` reports which image is in use.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let Some(manifest_dir) = env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from) else {
        return;
    };
    let Some(out_dir) = env::var_os("OUT_DIR").map(PathBuf::from) else {
        return;
    };
    let root = manifest_dir.parent().unwrap_or(&manifest_dir).to_path_buf();
    for input in ["worker", "protocol", "Cargo.toml", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", root.join(input).display());
    }
    let image = out_dir.join("airlock-worker");
    let built = choose_and_build_worker(&root, &out_dir).and_then(|(binary, target)| {
        std::fs::copy(&binary, &image)
            .map(|_| target)
            .map_err(|e| format!("cannot copy {}: {e}", binary.display()))
    });
    match built {
        Ok(target) => println!("cargo:rustc-env=AIRLOCK_WORKER_TARGET={target}"),
        Err(why) => {
            println!(
                "cargo:warning=the dedicated worker was not built ({why}); `airlock` will exec itself as its worker"
            );
            println!("cargo:rustc-env=AIRLOCK_WORKER_TARGET=");
            if let Err(e) = std::fs::write(&image, b"") {
                println!("cargo:warning=cannot write {}: {e}", image.display());
            }
        }
    }
}

/// Builds the worker against musl when that target's standard library is installed
/// (`rustup target add x86_64-unknown-linux-musl`), else against glibc, statically either
/// way; returns the binary and the target it was built for.
///
/// Why musl: every worker is a fresh exec, and glibc's start-up works out the CPU's
/// features and cache sizes with dozens of `cpuid` instructions (`init_cpu_features`,
/// `handle_intel` and `intel_check_word` for each cache level), each of which traps to the
/// hypervisor on a virtual machine. `perf stat -r 500` of the worker program alone on the
/// 2-core development VM: 0.78-0.81 ms of CPU with static glibc, 0.11-0.15 ms with static
/// musl. musl does none of that at start-up.
///
/// `AIRLOCK_WORKER_TARGET=<triple>` picks the worker's target instead (to compare the two
/// in a benchmark, or to keep glibc).
fn choose_and_build_worker(root: &Path, out_dir: &Path) -> Result<(PathBuf, String), String> {
    println!("cargo:rerun-if-env-changed=AIRLOCK_WORKER_TARGET");
    if let Some(chosen) = env::var("AIRLOCK_WORKER_TARGET")
        .ok()
        .filter(|t| !t.is_empty())
    {
        return build_worker(root, out_dir, &chosen).map(|binary| (binary, chosen));
    }
    let target = env::var("TARGET").map_err(|_| "TARGET is not set")?;
    let musl = target
        .strip_suffix("-linux-gnu")
        .map(|arch| format!("{arch}-linux-musl"));
    if let Some(musl) = musl {
        if standard_library_installed(&musl) {
            match build_worker(root, out_dir, &musl) {
                Ok(binary) => return Ok((binary, musl)),
                Err(why) => println!(
                    "cargo:warning=the musl worker did not build ({why}); building it against glibc"
                ),
            }
        } else if let Some(rustlib) = rustlib_dir() {
            // Run again once the musl target is installed: without this, a build made
            // before `rustup target add` kept its glibc worker until a source changed.
            // (Cargo scans a directory given here; rustlib holds ~170 entries.)
            println!("cargo:rerun-if-changed={}", rustlib.display());
        }
    }
    build_worker(root, out_dir, &target).map(|binary| (binary, target))
}

/// `<sysroot>/lib/rustlib`, where rustup installs each target's standard library.
fn rustlib_dir() -> Option<PathBuf> {
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let output = Command::new(rustc)
        .args(["--print", "sysroot"])
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let sysroot = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    Some(sysroot.join("lib").join("rustlib")).filter(|dir| dir.is_dir())
}

/// Whether rustc has the standard library of `target` (rustup's rust-std component).
fn standard_library_installed(target: &str) -> bool {
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let Ok(output) = Command::new(rustc)
        .args(["--print", "target-libdir", "--target", target])
        .output()
    else {
        return false;
    };
    let dir = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    output.status.success()
        && std::fs::read_dir(&dir).is_ok_and(|entries| {
            entries
                .flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with("libstd-"))
        })
}

/// Runs `cargo build` for the worker's binary in a target directory of its own (the outer
/// build holds the lock on ours) and returns the path of the result.
fn build_worker(root: &Path, out_dir: &Path, target: &str) -> Result<PathBuf, String> {
    let cargo = env::var_os("CARGO").ok_or("CARGO is not set")?;
    let profile = env::var("PROFILE").map_err(|_| "PROFILE is not set")?;
    // OUT_DIR is <target dir>/[<triple>/]<profile>/build/<package>-<hash>/out: the nested
    // build lives beside `build`, shared by every build of this profile.
    let profile_dir = out_dir
        .ancestors()
        .nth(3)
        .ok_or("OUT_DIR has an unexpected shape")?;
    let target_dir = profile_dir.join("airlock-worker-build");
    let mut command = Command::new(cargo);
    command
        .arg("build")
        .arg("--manifest-path")
        .arg(root.join("worker").join("Cargo.toml"))
        .args(["--bin", "airlock-worker", "--locked", "--offline"])
        .arg("--target-dir")
        .arg(&target_dir);
    if profile == "release" {
        command.arg("--release");
    }
    // Always an explicit --target: then the flags below reach only the worker, not the
    // build scripts and proc macros compiled for the host.
    command.args(["--target", target]);
    // A static worker (static-pie: still randomised): no dynamic loader, no libraries to
    // map and relocate at each of its execs — 63 -> 36 page faults and about 0.15 ms less
    // CPU per worker measured with `perf stat -r 300`. glibc warns at link time if code
    // needs its dynamic parts (NSS, dlopen); the worker uses none. musl targets link
    // statically by default.
    let mut flags = env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    if target.ends_with("-linux-gnu") {
        if !flags.is_empty() {
            flags.push('\x1f');
        }
        flags.push_str("-Ctarget-feature=+crt-static");
    }
    command.env("CARGO_ENCODED_RUSTFLAGS", flags);
    // `cargo clippy` lints through a workspace wrapper; the nested build only compiles.
    command.env_remove("RUSTC_WORKSPACE_WRAPPER");
    let output = command
        .output()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let last: Vec<&str> = stderr.lines().rev().take(5).collect();
        return Err(format!(
            "cargo build of the worker failed: {}",
            last.into_iter().rev().collect::<Vec<_>>().join(" | ")
        ));
    }
    let mut binary = target_dir;
    binary.push(target);
    binary.push(if profile == "release" {
        "release"
    } else {
        "debug"
    });
    binary.push("airlock-worker");
    Ok(binary)
}
