//! [`classify`] over the facts of real runtimes: the mountinfo lines are podman's (runc,
//! cgroup v1) as seen from inside a container started with its defaults.

use super::*;

const PODMAN_DEFAULT_MOUNTINFO: &str = "\
80 52 0:41 / / rw,relatime - overlay overlay rw,lowerdir=/var/lib/containers/storage/overlay/l/X
81 80 0:44 / /sys ro,nosuid,nodev,noexec,relatime - sysfs sysfs ro
85 80 0:45 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
95 81 0:48 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - tmpfs tmpfs rw,mode=755
99 95 0:32 /libpod_parent/libpod-f2f6 /sys/fs/cgroup/memory ro,nosuid,nodev,noexec,relatime - cgroup cgroup rw,memory
103 95 0:36 /libpod_parent/libpod-f2f6 /sys/fs/cgroup/pids ro,nosuid,nodev,noexec,relatime - cgroup cgroup rw,pids
56 85 0:45 /sys /proc/sys ro,nosuid,nodev,noexec,relatime - proc proc rw
57 85 0:49 / /proc/acpi ro,relatime - tmpfs tmpfs ro
58 85 0:46 /null /proc/keys rw,nosuid,noexec - tmpfs tmpfs rw,size=65536k,mode=755
";

/// The same container started with the settings docs/containers.md gives for cgroup v1.
const PODMAN_SETTINGS_MOUNTINFO: &str = "\
80 52 0:41 / / rw,relatime - overlay overlay rw,lowerdir=/var/lib/containers/storage/overlay/l/X
81 80 0:44 / /sys ro,nosuid,nodev,noexec,relatime - sysfs sysfs ro
85 80 0:45 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
95 81 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
99 95 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
103 95 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
";

const HOST_MOUNTINFO: &str = "\
23 1 254:0 / / rw,relatime - ext4 /dev/vda rw
24 23 0:22 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
25 24 0:40 / /proc/sys/fs/binfmt_misc rw,relatime - binfmt_misc binfmt_misc rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
";

const LIBPOD_CGROUP: &str = "4:memory:/libpod_parent/libpod-f2f6\n0::/libpod_parent/libpod-f2f6\n";

fn podman_default() -> ContainerFacts {
    ContainerFacts {
        containerenv: true,
        container_var: Some("podman".into()),
        self_cgroup: LIBPOD_CGROUP.into(),
        mountinfo: PODMAN_DEFAULT_MOUNTINFO.into(),
        seccomp_filters: 1,
        hostname_errno: Some(libc::EPERM),
        ..ContainerFacts::default()
    }
}

fn check<'a>(checks: &'a [Check], id: &str) -> &'a Check {
    checks
        .iter()
        .find(|c| c.id == id)
        .unwrap_or_else(|| panic!("no check {id}: {checks:#?}"))
}

fn fix(check: &Check) -> &str {
    check.fix.as_deref().unwrap_or("")
}

#[test]
fn a_host_without_markers_is_not_a_container_and_binfmt_misc_does_not_cover_proc() {
    let facts = ContainerFacts {
        self_cgroup: "4:memory:/user.slice\n0::/user.slice\n".into(),
        mountinfo: HOST_MOUNTINFO.into(),
        ..ContainerFacts::default()
    };
    let checks = classify(&facts);
    assert_eq!(checks.len(), 2, "{checks:#?}");
    assert_eq!(check(&checks, "container").detail, "not in a container");
    assert_eq!(check(&checks, "proc.visible").status, Status::Ok);
}

#[test]
fn podman_defaults_name_the_unmask_the_cgroup_bind_and_the_seccomp_setting() {
    let checks = classify(&podman_default());
    let container = check(&checks, "container");
    assert!(container.detail.contains("podman"), "{container:?}");
    assert!(
        container.detail.contains("/run/.containerenv"),
        "{container:?}"
    );
    assert!(container.detail.contains("overlay root"), "{container:?}");

    let proc = check(&checks, "proc.visible");
    assert_eq!(proc.status, Status::Fail);
    assert!(proc.detail.contains("/proc/sys") && proc.detail.contains("/proc/keys"));
    assert_eq!(fix(proc), "podman run --security-opt unmask=/proc/*");

    let cgroup = check(&checks, "container.cgroup");
    assert_eq!(cgroup.status, Status::Fail);
    // This host is v1 (hybrid): the v2-only unmask would not help.
    assert!(
        fix(cgroup).contains("-v /sys/fs/cgroup:/sys/fs/cgroup:rw"),
        "{cgroup:?}"
    );

    let seccomp = check(&checks, "container.seccomp");
    assert_eq!(seccomp.status, Status::Fail);
    assert!(seccomp.detail.contains("sethostname"), "{seccomp:?}");
    assert!(fix(seccomp).contains("seccomp=unconfined"), "{seccomp:?}");
}

#[test]
fn podman_with_the_documented_settings_passes_every_container_check() {
    let facts = ContainerFacts {
        mountinfo: PODMAN_SETTINGS_MOUNTINFO.into(),
        seccomp_filters: 0,
        hostname_errno: None,
        no_new_privs: true,
        ..podman_default()
    };
    let checks = classify(&facts);
    for c in &checks {
        assert_eq!(c.status, Status::Ok, "{c:?}");
    }
    assert!(
        check(&checks, "container")
            .detail
            .contains("no_new_privs is set")
    );
}

#[test]
fn on_cgroup_v2_podman_is_told_to_unmask_its_own_cgroup_namespace() {
    let facts = ContainerFacts {
        self_cgroup: "0::/\n".into(),
        mountinfo: "85 80 0:45 / /proc rw - proc proc rw\n\
                    95 81 0:48 / /sys/fs/cgroup ro,nosuid - cgroup2 cgroup2 rw\n"
            .into(),
        ..podman_default()
    };
    let checks = classify(&facts);
    let cgroup = check(&checks, "container.cgroup");
    assert_eq!(cgroup.status, Status::Fail);
    assert!(
        fix(cgroup).contains("--cgroupns=private --security-opt unmask=/sys/fs/cgroup"),
        "{cgroup:?}"
    );
    assert_eq!(check(&checks, "proc.visible").status, Status::Ok);
}

#[test]
fn docker_refusing_user_namespaces_is_blamed_on_its_seccomp_and_apparmor_profiles() {
    let facts = ContainerFacts {
        dockerenv: true,
        self_cgroup: "0::/system.slice/docker-abc.scope\n".into(),
        mountinfo: PODMAN_DEFAULT_MOUNTINFO.into(),
        seccomp_filters: 1,
        userns_errno: Some(libc::EPERM),
        hostname_errno: Some(libc::EPERM),
        ..ContainerFacts::default()
    };
    let checks = classify(&facts);
    assert!(check(&checks, "container").detail.contains("(docker)"));
    assert_eq!(check(&checks, "container.mount").status, Status::Warn);
    let seccomp = check(&checks, "container.seccomp");
    assert_eq!(seccomp.status, Status::Fail);
    assert!(seccomp.detail.contains("user namespace"), "{seccomp:?}");
    assert!(fix(seccomp).contains("apparmor=unconfined"), "{seccomp:?}");
    assert_eq!(
        fix(check(&checks, "proc.visible")),
        "docker run --security-opt systempaths=unconfined"
    );
}

#[test]
fn a_pod_is_told_the_kubernetes_fields() {
    let facts = ContainerFacts {
        kubernetes: true,
        self_cgroup: "0::/kubepods.slice/kubepods-burstable.slice/cri-containerd-1.scope\n".into(),
        mountinfo: PODMAN_DEFAULT_MOUNTINFO.into(),
        seccomp_filters: 1,
        hostname_errno: Some(libc::EPERM),
        ..ContainerFacts::default()
    };
    let checks = classify(&facts);
    assert!(check(&checks, "container").detail.contains("(kubernetes)"));
    assert!(fix(check(&checks, "proc.visible")).contains("procMount: Unmasked"));
    assert!(fix(check(&checks, "container.cgroup")).contains("privileged: true"));
    assert!(fix(check(&checks, "container.seccomp")).contains("seccompProfile.type: Unconfined"));
}

#[test]
fn a_masked_proc_outside_a_container_names_systemds_settings() {
    let facts = ContainerFacts {
        mountinfo: format!("{HOST_MOUNTINFO}26 24 0:22 /sys /proc/sys ro,nosuid - proc proc rw\n"),
        ..ContainerFacts::default()
    };
    let checks = classify(&facts);
    let proc = check(&checks, "proc.visible");
    assert_eq!(proc.status, Status::Fail);
    assert!(fix(proc).contains("ProtectKernelTunables"), "{proc:?}");
}

#[test]
fn mountinfo_octal_escapes_are_decoded_and_garbage_lines_are_skipped() {
    let text = "garbage\n1 2 0:1 / /proc/a\\040b rw - tmpfs tmpfs rw\n3 4 0:1 / /x rw\n";
    assert_eq!(proc_covers(text), vec!["/proc/a b".to_string()]);
    assert_eq!(unescape_octal("a\\134b\\04"), "a\\b\\04");
    assert_eq!(
        cgroup_read_only("1 2 0:1 / /proc rw - proc proc rw\n"),
        None
    );
}

#[test]
fn a_cgroup_without_a_container_marker_is_not_mistaken_for_one() {
    let facts = ContainerFacts {
        self_cgroup: "0::/user.slice/user-1000.slice/session-2.scope\n".into(),
        ..ContainerFacts::default()
    };
    assert!(detect(&facts).is_none());
    assert!(cgroup_v2_only(&facts.self_cgroup));
    assert!(!cgroup_v2_only(LIBPOD_CGROUP));
    assert!(!cgroup_v2_only(""));
}

#[test]
fn an_apparmor_profile_denying_mount_is_named_with_its_setting() {
    let facts = ContainerFacts {
        dockerenv: true,
        mountinfo: PODMAN_SETTINGS_MOUNTINFO.into(),
        mount_errno: Some(libc::EACCES),
        apparmor: Some("docker-default (enforce)".into()),
        ..ContainerFacts::default()
    };
    let checks = classify(&facts);
    let mount = check(&checks, "container.mount");
    assert_eq!(mount.status, Status::Fail);
    assert!(
        mount.detail.contains("docker-default (enforce)"),
        "{mount:?}"
    );
    assert_eq!(fix(mount), "docker run --security-opt apparmor=unconfined");
}
