//! The explanation as text, one line per fact, for a human reviewing a policy.

use airlock_policy::rules::Decision;
use airlock_policy::validate::{Approval, SideEffect, ToolState};

use super::facts::{Explanation, GateFacts, PathFacts, ProfileFacts, ToolFacts};

pub(super) fn render(e: &Explanation) -> String {
    let mut out = String::new();
    let mut line = |text: String| {
        out.push_str(&text);
        out.push('\n');
    };
    if let Some(tool) = &e.tool {
        render_tool(tool, &mut line);
        line(String::new());
    }
    render_profile(&e.profile, &e.policy, &mut line);
    if !e.warnings.is_empty() {
        line(String::new());
        line(format!("Warnings from `airlock check` for {}:", e.policy));
        for warning in &e.warnings {
            line(format!("  {warning}"));
        }
    }
    out
}

fn render_tool(tool: &ToolFacts, line: &mut impl FnMut(String)) {
    line(format!("Tool {}: {}", tool.name, tool.description));
    match &tool.builtin {
        Some(builtin) => line(format!(
            "  runs:        the built-in {builtin}, inside the sandbox (a confined child of the \
             worker), never on the host"
        )),
        None => {
            let argv: Vec<String> = tool.command.iter().map(|a| display_arg(a)).collect();
            line(format!("  runs:        {}", argv.join(" ")));
            if tool.command.iter().any(|a| a.starts_with('{')) {
                line(
                    "               each {field} becomes that input field as exactly one \
                     argument; no shell sees it"
                        .into(),
                );
            }
        }
    }
    line(format!("  stdin:       {}", tool.stdin));
    line(format!(
        "  side effect: {}",
        match tool.side_effect {
            SideEffect::Read => "read (only reads)",
            SideEffect::Write => "write (changes state)",
            SideEffect::Destructive => "destructive (may change state irreversibly)",
        }
    ));
    line(format!(
        "  category:    {}",
        tool.category.as_deref().unwrap_or("none")
    ));
    line(format!(
        "  approval:    {}",
        match tool.approval {
            Approval::Auto =>
                "auto (the tool itself demands no approval; the gate rules below decide)",
            Approval::Human =>
                "human (every call waits for a human's approval: propose, then execute)",
        }
    ));
    line(format!(
        "  retries:     {} extra attempt(s) after a retryable failure",
        tool.retries
    ));
    line(format!(
        "  timeout:     {} per attempt, then the whole process tree is killed",
        tool.timeout
    ));
    line(format!(
        "  input:       a JSON object checked against its schema before anything runs; \
         required: {}",
        if tool.input.required.is_empty() {
            "none".to_string()
        } else {
            tool.input.required.join(", ")
        }
    ));
    for field in &tool.input.fields {
        let mut words = vec![field.kind.clone()];
        words.push(
            if field.required {
                "required"
            } else {
                "optional"
            }
            .into(),
        );
        words.extend(field.constraints.iter().cloned());
        line(format!(
            "               {}: {}",
            field.name,
            words.join(", ")
        ));
    }
    if tool.input.other_fields_refused {
        line("               other fields are refused".into());
    }
    line(format!(
        "  output:      {}",
        if tool.output_schema {
            "JSON on stdout, checked against the output schema"
        } else {
            "stdout as text"
        }
    ));
    render_gate(&tool.gate, line);
    line(format!("  profile:     {} (below)", tool.profile));
}

fn render_paths(paths: &[PathFacts], optional: bool) -> String {
    let list: Vec<&str> = paths
        .iter()
        .filter(|p| p.optional == optional)
        .map(|p| p.path.as_str())
        .collect();
    if list.is_empty() {
        "none".into()
    } else {
        list.join(", ")
    }
}

fn render_profile(p: &ProfileFacts, policy: &str, line: &mut impl FnMut(String)) {
    line(format!("Profile {} (policy {policy})", p.name));
    line(
        "  filesystem:  a fresh tmpfs root holding only what is listed here; nothing else of \
         the host is visible"
            .into(),
    );
    line(format!(
        "    read-only:            {}",
        render_paths(&p.read_only, false)
    ));
    if p.read_only.iter().any(|g| g.optional) {
        line(format!(
            "    read-only if present: {}",
            render_paths(&p.read_only, true)
        ));
    }
    let mut writable = render_paths(&p.read_write, false);
    if p.read_write.iter().any(|g| g.optional) {
        writable = format!(
            "{writable}; if present: {}",
            render_paths(&p.read_write, true)
        );
    }
    if !p.read_write.is_empty() {
        writable.push_str(" (nosuid, nodev; writable by the sandbox's host uid)");
    }
    line(format!("    read-write:           {writable}"));
    let tmpfs: Vec<String> = p
        .tmpfs
        .iter()
        .map(|t| format!("{} ({}, emptied after each call)", t.path, t.size))
        .collect();
    line(format!(
        "    tmpfs:                {}",
        if tmpfs.is_empty() {
            "none".into()
        } else {
            tmpfs.join(", ")
        }
    ));
    if let Some(w) = &p.workspace {
        line(format!(
            "    workspace:            {} (read-write, nosuid, nodev: the named session's files, \
             kept across its calls; {} unless the session asks otherwise)",
            w.path, w.size
        ));
    }
    line(
        "    always:               a fresh /proc; /dev with only null, zero, full, random, \
         urandom"
            .into(),
    );
    line(match p.proc.view {
        "masked" => format!(
            "    /proc:                masked: {} read as empty (proc = \"full\" shows them)",
            p.proc.hidden.join(", ")
        ),
        _ => "    /proc:                full: every entry, host-wide ones included".into(),
    });
    line(format!("    working directory:    {}", p.cwd));
    line(format!("  network:     {}", p.network.summary));

    let s = &p.syscalls;
    line(format!(
        "  syscalls:    seccomp allowlist of {} syscalls; any other gets {}",
        s.allowed_count, s.otherwise
    ));
    let groups: Vec<String> = s
        .groups
        .iter()
        .map(|g| {
            if g.allowed == g.of {
                g.name.to_string()
            } else {
                format!("{} ({} of {})", g.name, g.allowed, g.of)
            }
        })
        .collect();
    line(format!("    allowed groups:       {}", groups.join(", ")));
    line(format!(
        "    added to the base:    {}",
        if s.added.is_empty() {
            "none".into()
        } else {
            s.added.join(", ")
        }
    ));
    if !s.denied_by_profile.is_empty() {
        line(format!(
            "    denied by profile:    {} (EPERM)",
            s.denied_by_profile.join(", ")
        ));
    }
    line(format!(
        "    sockets:              {} only",
        s.socket_families.join(", ")
    ));
    line("    always EPERM:".into());
    for group in &s.always_eperm {
        line(format!(
            "      {}: {}",
            group.category,
            group.syscalls.join(", ")
        ));
    }
    for rule in &s.argument_rules {
        line(format!("      {rule}"));
    }
    line(format!(
        "    always ENOSYS:        {} (so libc and runtimes fall back)",
        s.always_enosys.join(", ")
    ));

    let l = &p.limits;
    line("  limits:".into());
    line(format!(
        "    memory:               {} (cgroup; swap not allowed; OOM kills the call)",
        l.memory
    ));
    line(format!(
        "    processes:            {} (cgroup pids, threads included)",
        l.pids
    ));
    line(format!(
        "    timeout:              {} wall clock, then the whole tree is killed",
        l.timeout
    ));
    line(format!(
        "    cpu time:             {}{}",
        l.cpu,
        if l.cpu_seconds.is_some() {
            " (RLIMIT_CPU)"
        } else {
            ""
        }
    ));
    line(format!(
        "    output:               {} per stream (stdout, stderr), the rest is cut",
        l.output
    ));
    line(format!(
        "    open files:           {} (RLIMIT_NOFILE)",
        l.open_files
    ));
    line(format!(
        "    file size:            {} per file written (RLIMIT_FSIZE)",
        l.file_size
    ));
    let d = &p.denials;
    line("  denials:     what a call's result lists as refused (`denials`), by layer".into());
    for (layer, says) in [
        ("seccomp", d.seccomp),
        ("landlock", d.landlock),
        ("mounts", d.mounts),
        ("network", d.network),
        ("limits", d.limits),
    ] {
        line(format!("    {layer:<22}{says}"));
    }
    line("  environment: (the whole environment; nothing is inherited from the host)".into());
    for (name, value) in &p.env {
        line(format!("    {name}={value}"));
    }
    line(format!("  hostname:    {}", p.hostname));
    line("  layers:".into());
    line(format!(
        "    namespaces:           {} (always)",
        p.namespaces.join(", ")
    ));
    let layer = |word: &str| match word {
        "required" => {
            "required (the call fails with sandbox_unavailable if the kernel cannot \
                       enforce it)"
        }
        _ => "best effort (applied as far as the kernel allows; the result reports the level)",
    };
    line(format!(
        "    Landlock:             {}",
        layer(p.require.landlock)
    ));
    line(format!(
        "    seccomp:              {}",
        layer(p.require.seccomp)
    ));
    line(format!(
        "    cgroup limits:        {}",
        layer(p.require.cgroup)
    ));
    line(
        "    always:               no capabilities, no_new_privs, the sandbox root mapped to \
         an unprivileged host uid"
            .into(),
    );
}

fn decision_word(decision: Decision) -> &'static str {
    match decision {
        Decision::Allow => "allow",
        Decision::Deny => "deny",
        Decision::Review => "review (a human approves first)",
    }
}

fn render_gate(gate: &GateFacts, line: &mut impl FnMut(String)) {
    line(format!(
        "  state:       {}",
        match gate.state {
            ToolState::Active => "active (listed and callable)",
            ToolState::Deferred => "deferred (known, not offered yet)",
            ToolState::Suspended => "suspended (taken out of service)",
        }
    ));
    line("  gate rules:  in order, the first that matches decides".into());
    for rule in &gate.rules {
        line(format!(
            "               {}: {} -> {}",
            rule.name,
            rule.matches,
            decision_word(rule.decision)
        ));
    }
    let by = if gate.decision_rule == "default" {
        "the default decision".to_string()
    } else {
        format!("rule {}", gate.decision_rule)
    };
    let lead = if gate.rules.iter().any(|r| r.conditional) {
        "otherwise"
    } else {
        "every call"
    };
    line(format!(
        "               {lead}: {}, by {by}",
        decision_word(gate.decision)
    ));
    line(format!("  human approval: {}", gate.human_approval));
    line(format!(
        "  plan mode:   {}",
        if gate.plan_mode {
            "allowed (read-only tool)"
        } else {
            "refused (not a read-only tool)"
        }
    ));
    line(format!(
        "  rate limits: {}",
        if gate.rate_limits.is_empty() {
            "none".to_string()
        } else {
            gate.rate_limits.join("; ")
        }
    ));
    line(format!(
        "  permissions: {}{}",
        gate.permissions
            .as_ref()
            .map_or("not declared".to_string(), |p| p.join(", ")),
        if gate.concurrency_safe {
            "; safe to run concurrently"
        } else {
            ""
        }
    ));
}

/// Quotes an argv element for display when it holds spaces or quotes.
fn display_arg(arg: &str) -> String {
    if !arg.is_empty()
        && arg
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+=:,{}@%".contains(c))
    {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_with_spaces_are_quoted_for_display() {
        assert_eq!(display_arg("/usr/bin/wc"), "/usr/bin/wc");
        assert_eq!(display_arg("{text}"), "{text}");
        assert_eq!(display_arg("a b"), "'a b'");
        assert_eq!(display_arg("it's"), "'it'\\''s'");
    }
}
