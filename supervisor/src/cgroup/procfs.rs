//! Parsing /proc/self/cgroup and /proc/self/mountinfo, and the directory of our cgroup
//! they point to.

use std::path::{Component, Path, PathBuf};

/// One line of /proc/self/cgroup: `hierarchy-id:controller-list:cgroup-path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ProcCgroupEntry<'a> {
    pub(super) hierarchy_id: &'a str,
    pub(super) controllers: Vec<&'a str>,
    pub(super) path: &'a str,
}

pub(super) fn parse_proc_self_cgroup(text: &str) -> Vec<ProcCgroupEntry<'_>> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.splitn(3, ':');
            let hierarchy_id = fields.next()?;
            let controllers = fields.next()?;
            let path = fields.next()?;
            Some(ProcCgroupEntry {
                hierarchy_id,
                controllers: controllers.split(',').filter(|c| !c.is_empty()).collect(),
                path,
            })
        })
        .collect()
}

/// The fields of one /proc/self/mountinfo line that locate a cgroup hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct MountEntry {
    /// The directory of the filesystem mounted here (not "/" in bind mounts and namespaces).
    root: PathBuf,
    mount_point: PathBuf,
    fs_type: String,
    super_options: Vec<String>,
}

pub(super) fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            // id parent major:minor root mount-point options [optional...] - type source super
            let fields: Vec<&str> = line.split(' ').collect();
            let separator = fields.iter().skip(6).position(|f| *f == "-")? + 6;
            Some(MountEntry {
                root: PathBuf::from(unescape_mountinfo(fields.get(3)?)),
                mount_point: PathBuf::from(unescape_mountinfo(fields.get(4)?)),
                fs_type: (*fields.get(separator + 1)?).to_string(),
                super_options: fields
                    .get(separator + 3)?
                    .split(',')
                    .map(String::from)
                    .collect(),
            })
        })
        .collect()
}

/// The kernel escapes space, tab, newline and backslash in mountinfo paths as `\ooo`.
fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|digits| bytes[i] == b'\\' && digits.iter().all(|d| (b'0'..=b'7').contains(d)));
        match octal {
            Some(digits) => {
                let value = digits
                    .iter()
                    .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                out.push(u8::try_from(value).unwrap_or(b'?'));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The directory of `cgroup_path` under the first mount of `fs_type` (and `controller` among
/// its options) whose root contains it. A path with `..` (our cgroup lies outside our cgroup
/// namespace) is refused: resolving it would point above or beside our own cgroup.
pub(super) fn locate_cgroup_dir(
    mounts: &[MountEntry],
    fs_type: &str,
    controller: Option<&str>,
    cgroup_path: &str,
    fs_root: &Path,
) -> Result<PathBuf, String> {
    let path = Path::new(cgroup_path);
    if !path.is_absolute() || path.components().any(|c| c == Component::ParentDir) {
        return Err(format!(
            "our cgroup path {cgroup_path:?} lies outside our cgroup namespace"
        ));
    }
    mounts
        .iter()
        .filter(|m| m.fs_type == fs_type)
        .filter(|m| controller.is_none_or(|c| m.super_options.iter().any(|o| o == c)))
        .find_map(|m| {
            let relative = path.strip_prefix(&m.root).ok()?;
            let mount_point = m.mount_point.strip_prefix("/").ok()?;
            Some(fs_root.join(mount_point).join(relative))
        })
        .ok_or_else(|| match controller {
            Some(c) => format!("no {fs_type} mount with {c} holds our cgroup {cgroup_path:?}"),
            None => format!("no {fs_type} mount holds our cgroup {cgroup_path:?}"),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::fake_tree::{
        HYBRID_MOUNTINFO, OWN_MEMORY, V2_MOUNTINFO, hybrid_proc_self_cgroup,
    };

    #[test]
    fn proc_self_cgroup_parses_hybrid_layout() {
        let text = hybrid_proc_self_cgroup();
        let entries = parse_proc_self_cgroup(&text);
        assert_eq!(entries.len(), 10);
        assert_eq!(
            entries[5],
            ProcCgroupEntry {
                hierarchy_id: "4",
                controllers: vec!["memory"],
                path: OWN_MEMORY
            }
        );
        assert_eq!(
            entries[9],
            ProcCgroupEntry {
                hierarchy_id: "0",
                controllers: vec![],
                path: "/"
            }
        );
    }

    #[test]
    fn proc_self_cgroup_keeps_colons_in_the_path() {
        let entries = parse_proc_self_cgroup("2:cpu,cpuacct:/a:b\n0::/x\n");
        assert_eq!(entries[0].controllers, vec!["cpu", "cpuacct"]);
        assert_eq!(entries[0].path, "/a:b");
    }

    #[test]
    fn mountinfo_parses_optional_fields_and_escaped_paths() {
        let mounts = parse_mountinfo(
            "26 25 0:23 /sub /sys/fs/my\\040cgroup rw shared:9 master:2 - cgroup cgroup rw,cpu,cpuacct\n",
        );
        assert_eq!(
            mounts,
            vec![MountEntry {
                root: PathBuf::from("/sub"),
                mount_point: PathBuf::from("/sys/fs/my cgroup"),
                fs_type: "cgroup".into(),
                super_options: vec!["rw".into(), "cpu".into(), "cpuacct".into()],
            }]
        );
    }

    #[test]
    fn mountinfo_parses_the_hybrid_layout() {
        let mounts = parse_mountinfo(HYBRID_MOUNTINFO);
        assert_eq!(mounts.len(), 12);
        let unified = mounts.iter().find(|m| m.fs_type == "cgroup2").unwrap();
        assert_eq!(unified.mount_point, Path::new("/sys/fs/cgroup/unified"));
    }

    #[test]
    fn cgroup_dir_strips_the_mount_root() {
        let mounts =
            parse_mountinfo("35 31 0:32 /process_api /mnt/memory rw - cgroup cgroup rw,memory\n");
        let dir = locate_cgroup_dir(
            &mounts,
            "cgroup",
            Some("memory"),
            "/process_api/abc",
            Path::new("/root"),
        );
        assert_eq!(dir, Ok(PathBuf::from("/root/mnt/memory/abc")));
    }

    #[test]
    fn cgroup_path_outside_our_namespace_is_refused() {
        let mounts = parse_mountinfo(V2_MOUNTINFO);
        let dir = locate_cgroup_dir(&mounts, "cgroup2", None, "/../sibling", Path::new("/"));
        assert!(dir.unwrap_err().contains("outside our cgroup namespace"));
    }
}
