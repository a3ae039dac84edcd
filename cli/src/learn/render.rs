//! The learner's output: a whole policy holding the learned profile (its base's settings
//! plus what the command needed, each addition with its evidence in a comment), or, for a
//! base profile in a policy file, the additions alone for review.

use std::fmt::Write;

use airlock_policy::egress::EgressPolicy;
use airlock_policy::seccomp::DEFAULT_ALLOW;
use airlock_policy::units::{format_duration, format_size};
use airlock_policy::validated::{Network, ProcView, Profile};
use airlock_protocol::Requirement;

use super::propose::{Grant, Proposal};

/// A TOML basic string (JSON's escapes are TOML's).
fn quoted(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_else(|_| "\"\"".into())
}

/// `text` fit for a comment: every control character (a newline would end the comment and
/// let what follows be read as policy) written as its escape. Evidence quotes what the
/// command named, which it chose.
fn comment(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            let escaped: Vec<char> = if c.is_control() {
                c.escape_default().collect()
            } else {
                vec![c]
            };
            escaped
        })
        .collect()
}

/// One array of paths, one per line, the learned ones with their evidence.
fn path_array(out: &mut String, key: &str, kept: &[String], learned: &[Grant]) {
    if kept.is_empty() && learned.is_empty() {
        return;
    }
    let _ = writeln!(out, "{key} = [");
    for path in kept {
        let _ = writeln!(out, "  {},", quoted(path));
    }
    for grant in learned {
        let _ = writeln!(
            out,
            "  {},  # learned: {}",
            quoted(&grant.path),
            comment(&grant.evidence.join("; "))
        );
    }
    let _ = writeln!(out, "]");
}

fn requirement(r: Requirement) -> &'static str {
    match r {
        Requirement::Required => "required",
        Requirement::BestEffort => "best_effort",
    }
}

/// A whole policy whose profile `name` is `base` plus `proposal`.
pub(super) fn new_policy(
    name: &str,
    base: &Profile,
    policy_name: &str,
    argv: &[String],
    proposal: &Proposal,
) -> anyhow::Result<String> {
    let learned_network = !proposal.network.allow.is_empty();
    let network = match &base.network {
        Network::Egress(policy) => egress_line(policy, proposal),
        // The egress proxy's loopback-only namespace is the loopback profile's too.
        Network::None | Network::Loopback if learned_network => {
            egress_line(&EgressPolicy::default(), proposal)
        }
        Network::None => "\"none\"".to_string(),
        Network::Loopback => "\"loopback\"".to_string(),
        Network::Host {
            tcp: None,
            udp: false,
        } => "\"host\"".to_string(),
        _ => anyhow::bail!(
            "profile {:?} has a network setting a new policy cannot restate; learn against the \
             policy file (--policy) to get the additions instead",
            base.name
        ),
    };
    let removed: Vec<&str> = DEFAULT_ALLOW
        .iter()
        .copied()
        .filter(|s| !base.syscalls.allow.contains(*s))
        .collect();
    if !removed.is_empty() || base.limits.cpu_quota_percent.is_some() {
        anyhow::bail!(
            "profile {:?} has settings a new policy cannot restate; learn against the policy \
             file (--policy) to get the additions instead",
            base.name
        );
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Learned by `airlock learn` for: {}",
        comment(&argv.join(" "))
    );
    let _ = writeln!(
        out,
        "# Based on profile {:?} of {policy_name}; each learned line says what it was for.",
        base.name
    );
    for note in &proposal.notes {
        let _ = writeln!(out, "# note: {}", comment(note));
    }
    let _ = writeln!(out, "version = 1\n\n[profiles.{}]", quoted(name));
    let paths = |optional: bool, grants: &[airlock_policy::validated::PathGrant]| -> Vec<String> {
        grants
            .iter()
            .filter(|g| g.optional == optional)
            .map(|g| g.path.clone())
            .collect()
    };
    path_array(&mut out, "read", &paths(false, &base.read), &proposal.read);
    path_array(&mut out, "read_optional", &paths(true, &base.read), &[]);
    path_array(
        &mut out,
        "write",
        &paths(false, &base.write),
        &proposal.write,
    );
    if !base.tmpfs.is_empty() {
        let entries: Vec<String> = base
            .tmpfs
            .iter()
            .map(|(path, size)| format!("{} = {}", quoted(path), quoted(&format_size(*size))))
            .collect();
        let _ = writeln!(out, "tmpfs = {{ {} }}", entries.join(", "));
    }
    let _ = writeln!(out, "network = {network}");
    let added: Vec<String> = base
        .syscalls
        .allow
        .iter()
        .filter(|s| !DEFAULT_ALLOW.contains(&s.as_str()))
        .map(|s| quoted(s))
        .chain(proposal.syscalls.iter().map(|(s, _)| quoted(s)))
        .collect();
    let denied: Vec<String> = base.syscalls.deny.iter().map(|s| quoted(s)).collect();
    if !added.is_empty() || !denied.is_empty() {
        let learned: Vec<String> = proposal
            .syscalls
            .iter()
            .map(|(s, n)| format!("{s} {n}x"))
            .collect();
        let _ = writeln!(
            out,
            "syscalls = {{ allow = [{}], deny = [{}] }}{}",
            added.join(", "),
            denied.join(", "),
            if learned.is_empty() {
                String::new()
            } else {
                format!("  # learned: {}", learned.join(", "))
            }
        );
    }
    let l = &base.limits;
    let memory = proposal.memory_bytes.unwrap_or(l.memory_bytes);
    let mut limits = vec![
        format!("memory = {}", quoted(&format_size(memory))),
        format!("pids = {}", l.pids),
        format!("timeout = {}", quoted(&format_duration(l.timeout))),
        format!("output = {}", quoted(&format_size(l.output_bytes))),
        format!("open_files = {}", l.open_files),
        format!("file_size = {}", quoted(&format_size(l.file_size_bytes))),
    ];
    if let Some(cpu) = l.cpu {
        limits.push(format!("cpu = {}", quoted(&format_duration(cpu))));
    }
    let _ = writeln!(
        out,
        "limits = {{ {} }}{}",
        limits.join(", "),
        if proposal.memory_bytes.is_some() {
            "  # learned: memory is twice the peak seen"
        } else {
            ""
        }
    );
    let env: Vec<String> = base
        .env
        .iter()
        .map(|(k, v)| format!("{} = {}", quoted(k), quoted(v)))
        .collect();
    let _ = writeln!(out, "env = {{ {} }}", env.join(", "));
    let _ = writeln!(out, "hostname = {}", quoted(&base.hostname));
    let _ = writeln!(out, "cwd = {}", quoted(&base.cwd));
    if base.proc == ProcView::Full {
        let _ = writeln!(out, "proc = \"full\"");
    }
    if let Some(workspace) = &base.workspace {
        let _ = writeln!(out, "workspace = {}", quoted(&workspace.path));
        let _ = writeln!(
            out,
            "workspace_size = {}",
            quoted(&format_size(workspace.size_bytes))
        );
    }
    let r = &base.require;
    let _ = writeln!(
        out,
        "require = {{ landlock = \"{}\", seccomp = \"{}\", cgroup = \"{}\" }}",
        requirement(r.landlock),
        requirement(r.seccomp),
        requirement(r.cgroup)
    );
    Ok(out)
}

/// `network = { allow = [...], allow_addresses = [...] }`: the base allowlist's entries and
/// the learned ones (sorted, distinct), with the learned ones' evidence in a comment.
fn egress_line(base: &EgressPolicy, proposal: &Proposal) -> String {
    let learned = &proposal.network;
    let mut allow: Vec<String> = base.hosts().iter().map(ToString::to_string).collect();
    allow.extend(learned.allow.iter().map(|g| g.entry.clone()));
    let mut addresses: Vec<String> = base.addresses().iter().map(ToString::to_string).collect();
    addresses.extend(learned.allow_addresses.iter().map(|g| g.entry.clone()));
    let list = |mut entries: Vec<String>| {
        entries.sort();
        entries.dedup();
        entries
            .iter()
            .map(|e| quoted(e))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut line = format!("{{ allow = [{}]", list(allow));
    if !addresses.is_empty() {
        let _ = write!(line, ", allow_addresses = [{}]", list(addresses));
    }
    line.push_str(" }");
    let evidence: Vec<String> = learned
        .allow
        .iter()
        .chain(&learned.allow_addresses)
        .flat_map(|g| g.evidence.iter().cloned())
        .collect();
    if !evidence.is_empty() {
        let _ = write!(line, "  # learned: {}", comment(&evidence.join("; ")));
    }
    line
}

/// What learning would add to `base_name` of `policy_name`, one reviewable line each.
pub(super) fn additions(
    policy_name: &str,
    base_name: &str,
    argv: &[String],
    proposal: &Proposal,
    result: &airlock::ToolResult,
    cwd: Option<&str>,
) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# What `airlock learn` would add to profile {base_name:?} of {policy_name} for: {}",
        comment(&argv.join(" "))
    );
    let _ = writeln!(
        out,
        "# ({policy_name} is not changed; each line's evidence follows `#`.)"
    );
    let mut lines = 0;
    for (key, grants) in [("read", &proposal.read), ("write", &proposal.write)] {
        for grant in grants {
            let _ = writeln!(
                out,
                "+ {key} {}  # {}",
                quoted(&grant.path),
                comment(&grant.evidence.join("; "))
            );
            lines += 1;
        }
    }
    for (key, grants) in [
        ("allow", &proposal.network.allow),
        ("allow_addresses", &proposal.network.allow_addresses),
    ] {
        for grant in grants {
            let _ = writeln!(
                out,
                "+ network {key} {}  # {}",
                quoted(&grant.entry),
                comment(&grant.evidence.join("; "))
            );
            lines += 1;
        }
    }
    if let Some(was) = proposal.network.replaces {
        let _ = writeln!(
            out,
            "~ network {{ allow = [...] }}  # was {was}: the egress proxy with these entries (it has loopback too)"
        );
        lines += 1;
    }
    for (name, count) in &proposal.syscalls {
        let _ = writeln!(out, "+ syscalls.allow {}  # made {count}x", quoted(name));
        lines += 1;
    }
    if let (Some(memory), Some(limit)) = (
        proposal.memory_bytes,
        result.isolation.as_ref().map(|i| i.limits.memory_bytes),
    ) && memory > limit
    {
        let _ = writeln!(
            out,
            "~ limits.memory {}  # twice the peak seen; the profile has {}",
            quoted(&format_size(memory)),
            format_size(limit)
        );
        lines += 1;
    }
    if let Some(cwd) = cwd {
        let _ = writeln!(out, "~ cwd {}  # where it ran while learning", quoted(cwd));
        lines += 1;
    }
    if lines == 0 {
        let _ = writeln!(
            out,
            "# nothing to add: the profile already grants what it used"
        );
    }
    for note in &proposal.notes {
        let _ = writeln!(out, "# note: {}", comment(note));
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::learn::network::{NetworkGrant, NetworkProposal};

    fn default_profile() -> Profile {
        let text = airlock_policy::presets::preset_text("default").unwrap();
        let file = airlock_policy::parse_policy_str(text, "default.toml").unwrap();
        let (mut valid, _) = airlock_policy::validate::validate_policy(
            &file,
            airlock_policy::Source::new("default.toml", text),
        )
        .unwrap();
        valid.profiles.remove("default").unwrap()
    }

    #[test]
    fn evidence_a_command_named_cannot_add_lines_to_the_learned_policy() {
        let hostile = "openat /ws/x\n[profiles.evil]\nread = [\"/\"]\r\n# (1x)";
        let proposal = Proposal {
            write: vec![Grant {
                path: "/ws".into(),
                evidence: vec![hostile.into()],
            }],
            network: NetworkProposal {
                allow: vec![NetworkGrant {
                    entry: "example.com:443".into(),
                    evidence: vec![format!("CONNECT {hostile}")],
                }],
                ..NetworkProposal::default()
            },
            notes: vec![format!("not granted: {hostile}")],
            ..Proposal::default()
        };
        let argv = vec!["sh".to_string(), "-c".into(), hostile.into()];
        let text = new_policy(
            "learned",
            &default_profile(),
            "preset:default",
            &argv,
            &proposal,
        )
        .unwrap();
        let file = airlock_policy::parse_policy_str(&text, "learned.toml").unwrap();
        let (valid, _) = airlock_policy::validate::validate_policy(
            &file,
            airlock_policy::Source::new("l", &text),
        )
        .unwrap();
        assert_eq!(
            valid.profiles.keys().collect::<Vec<_>>(),
            ["learned"],
            "{text}"
        );
        let learned = &valid.profiles["learned"];
        assert!(learned.read.iter().all(|g| g.path != "/"), "{text}");
        assert!(text.contains("\\n[profiles.evil]"), "{text}");
    }

    #[test]
    fn a_learned_allowlist_keeps_the_bases_entries_sorted_and_once() {
        let text = "version = 1\n[profiles.p]\nnetwork = { allow = [\"pypi.org\", \"b.example:8443\"], allow_addresses = [\"10.0.0.0/8\"] }\n";
        let file = airlock_policy::parse_policy_str(text, "p.toml").unwrap();
        let (mut valid, _) = airlock_policy::validate::validate_policy(
            &file,
            airlock_policy::Source::new("p", text),
        )
        .unwrap();
        let base = valid.profiles.remove("p").unwrap();
        let Network::Egress(policy) = &base.network else {
            panic!("not egress");
        };
        let proposal = Proposal {
            network: NetworkProposal {
                allow: vec![NetworkGrant {
                    entry: "a.example:443".into(),
                    evidence: vec!["CONNECT a.example:443 (2x)".into()],
                }],
                ..NetworkProposal::default()
            },
            ..Proposal::default()
        };
        assert_eq!(
            egress_line(policy, &proposal),
            "{ allow = [\"a.example:443\", \"b.example:8443\", \"pypi.org\"], allow_addresses = \
             [\"10.0.0.0/8\"] }  # learned: CONNECT a.example:443 (2x)"
        );
    }
}
