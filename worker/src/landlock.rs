//! Applies the profile's Landlock rules to the worker (and so to every tool it starts).
//!
//! The ruleset handles every right of the kernel's own ABI, so "fully enforced" means every
//! right this kernel can restrict is restricted. A profile that needs something the kernel
//! lacks (TCP port rules need ABI 4) fails when Landlock is required.

use airlock_protocol::{LandlockSpec, Requirement};
use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, PathBeneath,
    RestrictSelfAttr, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope,
};
use nix::fcntl::{AT_FDCWD, OFlag, openat};
use nix::sys::stat::{Mode, SFlag};

use crate::paths::identify;
use crate::sys;

/// Why Landlock could not be applied as required.
#[derive(Debug, thiserror::Error)]
pub enum LandlockError {
    /// The kernel has no Landlock (compiled out, or not in `lsm=`).
    #[error(
        "landlock is not available on this kernel ({0}); enable it with lsm=...,landlock on the kernel command line, or set require.landlock = \"best_effort\""
    )]
    Unavailable(std::io::Error),
    /// The profile needs a newer ABI than the kernel has.
    #[error("landlock ABI {have} cannot {what} (needs ABI {need})")]
    AbiTooOld {
        /// The kernel's ABI.
        have: i32,
        /// The ABI needed.
        need: i32,
        /// What could not be enforced.
        what: &'static str,
    },
    /// Building or enforcing the ruleset failed.
    #[error("landlock ruleset: {0}")]
    Ruleset(#[from] landlock::RulesetError),
    /// The kernel enforced less than everything.
    #[error("landlock rules are only {0:?}")]
    NotFullyEnforced(RulesetStatus),
}

/// What was applied: the ABI used (0 when none) and whether every handled right holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LandlockOutcome {
    /// ABI version, 0 when Landlock was not applied.
    pub abi: u32,
    /// Every requested right is enforced.
    pub fully_enforced: bool,
    /// The domain logs its refusals, the tool's included, to the audit.
    pub logged: bool,
}

/// Restricts the calling (single-threaded) process with `spec`.
pub fn apply_landlock_to_current_process(
    spec: &LandlockSpec,
) -> Result<LandlockOutcome, LandlockError> {
    let required = spec.requirement == Requirement::Required;
    let version = match sys::landlock_abi_version() {
        Ok(v) if v >= 1 => v,
        Ok(_) => {
            return skip_or_fail(
                required,
                std::io::Error::from_raw_os_error(libc::EOPNOTSUPP),
            );
        }
        Err(e) => return skip_or_fail(required, e),
    };
    let abi = ABI::from(version);
    let mut fully = true;

    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(abi))?;
    let net_rules = spec.restrict_tcp && version >= 4;
    if spec.restrict_tcp && !net_rules {
        if required {
            return Err(LandlockError::AbiTooOld {
                have: version,
                need: 4,
                what: "filter TCP ports",
            });
        }
        fully = false;
    }
    if net_rules {
        ruleset = ruleset.handle_access(AccessNet::from_all(abi))?;
    }
    if version >= 6 {
        // Abstract unix sockets and signals are scoped to the sandbox: host daemons
        // listening on abstract names, and host processes, are out of reach.
        ruleset = ruleset.scope(Scope::from_all(abi))?;
    }
    let mut created = ruleset.create()?;
    for (paths, access) in [
        (&spec.read, AccessFs::from_read(abi)),
        (&spec.write, AccessFs::from_all(abi)),
    ] {
        for path in paths {
            // Optional binds that were absent on the host have no mount point here.
            // openat, not the `landlock` crate's `PathFd` (std's open, which musl follows
            // with an fcntl), and the kind from the descriptor, not a second walk of the
            // path: two syscalls less per rule.
            let Ok(fd) = openat(
                AT_FDCWD,
                path.as_str(),
                OFlag::O_PATH | OFlag::O_CLOEXEC,
                Mode::empty(),
            ) else {
                continue;
            };
            // Files (not directories) only accept file rights.
            let is_dir = identify(&fd).is_ok_and(|(_, kind)| kind == SFlag::S_IFDIR);
            let access = if is_dir {
                access
            } else {
                access & AccessFs::from_file(abi)
            };
            created = created.add_rule(PathBeneath::new(fd, access))?;
        }
    }
    if net_rules {
        for port in &spec.tcp_bind {
            created = created.add_rule(NetPort::new(*port, AccessNet::BindTcp))?;
        }
        for port in &spec.tcp_connect {
            created = created.add_rule(NetPort::new(*port, AccessNet::ConnectTcp))?;
        }
    }
    // The tool is a new exec, whose refusals a domain does not log by default; domains a
    // tool nests inside log nothing, so every logged record names this worker's domain and
    // this worker as its creator (nothing a tool creates can pass for a worker).
    let logged = spec.log_denials && version >= 7;
    if logged {
        created = created.log_new_exec(true)?.log_subdomains(false)?;
    }
    let status = created.restrict_self()?;
    if status.ruleset != RulesetStatus::FullyEnforced {
        if required {
            return Err(LandlockError::NotFullyEnforced(status.ruleset));
        }
        fully = false;
    }
    Ok(LandlockOutcome {
        abi: version as u32,
        fully_enforced: fully,
        logged: logged && status.log_new_exec && !status.log_subdomains,
    })
}

fn skip_or_fail(required: bool, cause: std::io::Error) -> Result<LandlockOutcome, LandlockError> {
    if required {
        Err(LandlockError::Unavailable(cause))
    } else {
        Ok(LandlockOutcome {
            abi: 0,
            fully_enforced: false,
            logged: false,
        })
    }
}
