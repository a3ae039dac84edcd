//! A tool's declared `permissions` against what its profile grants: both ways, as errors.
//!
//! What each permission means, and how it is checked:
//!
//! | permission | the profile must | and without it the profile must not |
//! |---|---|---|
//! | `fs:read` | bind some host path (`read`, `read_optional`, `write` or a `workspace`) | — (every program reads its own files) |
//! | `fs:write` | have `write` paths or a `workspace` (tmpfs is gone after the call) | have `write` paths or a `workspace` |
//! | `network` | have a network other than `"none"` | have a network other than `"none"` |
//! | `subprocess` | allow 2 or more processes and one of `clone`, `fork`, `vfork` | — (the pids limit is the bound) |
//!
//! A declaration is the tool author's statement of what the tool needs; a profile that gives
//! less makes the tool fail at run time, and one that gives more (writes, network) hands a
//! model capabilities nobody asked for. Both are mistakes `airlock check` refuses.

use std::ops::Range;

use super::{Checker, Network, Profile};

/// Checks `declared` (already validated names) of tool `tool` against `profile`; `span` is
/// the `permissions` list's.
pub(super) fn check_permissions(
    c: &mut Checker<'_>,
    tool: &str,
    declared: &[String],
    profile: &Profile,
    span: Range<usize>,
) {
    let has = |permission: &str| declared.iter().any(|p| p == permission);
    let name = &profile.name;
    let mut problems = Vec::new();

    // A session workspace is files from the host, read-write: it grants what `write` does.
    let writes = profile.lasting_writes();
    if has("fs:read") && profile.read.is_empty() && writes.is_none() {
        problems.push(format!(
            "declares fs:read but profile {name} binds no host path (read, read_optional, write or workspace)"
        ));
    }
    match (has("fs:write"), writes) {
        (true, None) => problems.push(format!(
            "declares fs:write but profile {name} has no write paths or workspace (a tmpfs is gone after the call)"
        )),
        (false, Some(writes)) => problems.push(format!(
            "does not declare fs:write but profile {name} {writes}"
        )),
        _ => {}
    }
    match (has("network"), profile.network == Network::None) {
        (true, true) => problems.push(format!(
            "declares network but profile {name} has network = \"none\""
        )),
        (false, false) => problems.push(format!(
            "does not declare network but profile {name} has network"
        )),
        _ => {}
    }
    if has("subprocess") {
        if profile.limits.pids < 2 {
            problems.push(format!(
                "declares subprocess but profile {name} allows {} process (limits.pids)",
                profile.limits.pids
            ));
        }
        let allowed = |syscall: &str| {
            profile.syscalls.allow.contains(syscall) && !profile.syscalls.deny.contains(syscall)
        };
        if !["clone", "fork", "vfork"].iter().any(|s| allowed(s)) {
            problems.push(format!(
                "declares subprocess but profile {name}'s syscalls allow none of clone, fork and vfork"
            ));
        }
    }
    for problem in problems {
        c.error(span.clone(), format!("tool {tool} {problem}"));
    }
}
