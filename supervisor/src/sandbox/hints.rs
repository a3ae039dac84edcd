//! What a worker's set-up failure most likely means, for the ones whose bare errno says
//! little: both are what container runtimes and hardened service managers do by default.

/// A hint to append to a set-up failure's message (`""` when there is none).
pub(super) fn setup_hint(step: &str, message: &str) -> &'static str {
    let refused = message.contains("EPERM");
    match step {
        "mount" if refused && message.contains("mount proc") => {
            "; the kernel refuses a new /proc while the one this process sees has mounts over \
             its entries (a container's masked paths: podman --security-opt unmask=/proc/*; \
             systemd's ProtectProc and friends); run `airlock doctor`"
        }
        "hostname" if refused => {
            "; a seccomp profile refuses sethostname (a container runtime's default profile: \
             --security-opt seccomp=unconfined); run `airlock doctor`"
        }
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_proc_mount_and_hostname_point_at_the_container_settings() {
        let proc = setup_hint("mount", "mount proc /proc: EPERM: Operation not permitted");
        assert!(proc.contains("unmask=/proc/*"), "{proc}");
        let hostname = setup_hint("hostname", "EPERM: Operation not permitted");
        assert!(hostname.contains("seccomp=unconfined"), "{hostname}");
    }

    #[test]
    fn other_failures_get_no_hint() {
        assert_eq!(setup_hint("mount", "bind /usr: ENOENT: No such file"), "");
        assert_eq!(setup_hint("mount", "mount proc /proc: EBUSY"), "");
        assert_eq!(setup_hint("landlock", "EPERM"), "");
    }
}
