//! What was refused during a call: the seccomp listener's answers, counted while the call
//! runs ([`SeccompWatch`]), and the pure function that lists every layer's refusals for
//! the result record ([`denials_of`]).
//!
//! The worker installs its filter with a listener and passes it to the supervisor. The
//! filter hands every refused syscall over (except the quiet ones, see the policy crate's
//! seccomp module); the watch reads which syscall it was, asks the same program what the
//! errno is and which argument rule refused it, counts it, and answers with that errno. A
//! refused syscall waits for the supervisor (a few microseconds), an allowed one never
//! does. A tool that spins on a refused syscall costs the supervisor about what it costs
//! the tool, within the tool's CPU limit; the counts are bounded and saturate.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex, PoisonError};

use airlock_policy::CompiledProfile;
use airlock_policy::seccomp::Notified;
use tokio::io::unix::AsyncFd;

use crate::egress::EgressSummary;
use crate::observe::{self, Finding, Watching};
use crate::result::{Denial, DenialLayer, ErrorKind, ToolResult};
use crate::sys::{self, ListenerState};

/// Most distinct seccomp refusals one call lists; past it they are counted as `other`.
const MAX_SYSCALL_ENTRIES: usize = 64;

/// One distinct seccomp refusal: the syscall's number, the errno, the argument rule.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct SyscallKey {
    nr: u32,
    name: Option<&'static str>,
    errno: u32,
    rule: Option<&'static str>,
}

/// The seccomp refusals of one call, counted, and what diagnosing it found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyscallDenials {
    counts: BTreeMap<SyscallKey, u64>,
    /// Refusals of syscalls past [`MAX_SYSCALL_ENTRIES`] distinct ones.
    other: u64,
    /// Diagnosed: paths the mounts lack or hold read-only, destinations the network cannot
    /// reach, by (is network, object, rule).
    found: BTreeMap<(bool, String, &'static str), u64>,
    /// Findings past [`MAX_SYSCALL_ENTRIES`] distinct ones, by (is network).
    found_other: BTreeMap<bool, u64>,
    /// The call was diagnosed: its mounts' refusals are reported.
    pub(crate) diagnosed: bool,
}

impl SyscallDenials {
    fn record(&mut self, refusal: &airlock_policy::seccomp::Refusal) {
        let key = SyscallKey {
            nr: refusal.nr,
            name: refusal.syscall,
            errno: refusal.errno,
            rule: refusal.rule,
        };
        if let Some(count) = self.counts.get_mut(&key) {
            *count = count.saturating_add(1);
        } else if self.counts.len() < MAX_SYSCALL_ENTRIES {
            self.counts.insert(key, 1);
        } else {
            self.other = self.other.saturating_add(1);
        }
    }

    fn record_finding(&mut self, finding: Finding) {
        let key = (finding.network, finding.object, finding.rule);
        if let Some(count) = self.found.get_mut(&key) {
            *count = count.saturating_add(1);
        } else if self.found.len() < MAX_SYSCALL_ENTRIES {
            self.found.insert(key, 1);
        } else {
            let other = self.found_other.entry(key.0).or_default();
            *other = other.saturating_add(1);
        }
    }

    /// Refusals, most frequent first, then what diagnosing found.
    fn listed(&self) -> Vec<Denial> {
        let mut listed: Vec<Denial> = self
            .counts
            .iter()
            .map(|(key, count)| Denial {
                layer: DenialLayer::Seccomp,
                object: key
                    .name
                    .map_or_else(|| format!("syscall_{}", key.nr), str::to_string),
                errno: Some(errno_name(key.errno)),
                rule: key.rule.map(str::to_string),
                count: *count,
            })
            .collect();
        listed.sort_by_key(|d| std::cmp::Reverse(d.count));
        if self.other > 0 {
            listed.push(Denial {
                layer: DenialLayer::Seccomp,
                object: "other".into(),
                errno: None,
                rule: None,
                count: self.other,
            });
        }
        let layer = |network: bool| {
            if network {
                DenialLayer::Network
            } else {
                DenialLayer::Mounts
            }
        };
        for ((network, object, rule), count) in &self.found {
            listed.push(Denial {
                layer: layer(*network),
                object: object.clone(),
                errno: None,
                rule: Some((*rule).to_string()),
                count: *count,
            });
        }
        for (network, count) in &self.found_other {
            listed.push(Denial {
                layer: layer(*network),
                object: "other".into(),
                errno: None,
                rule: None,
                count: *count,
            });
        }
        listed
    }
}

/// The symbolic name of the errnos a filter answers with.
fn errno_name(errno: u32) -> String {
    match i32::try_from(errno) {
        Ok(libc::EPERM) => "EPERM".into(),
        Ok(libc::ENOSYS) => "ENOSYS".into(),
        Ok(libc::EACCES) => "EACCES".into(),
        _ => format!("errno {errno}"),
    }
}

/// Answers a worker's seccomp listener while its call runs, counting what it refuses.
/// Dropped, it stops answering and closes the listener: a syscall handed over after that
/// fails with `ENOSYS`, never runs.
#[derive(Debug)]
pub struct SeccompWatch {
    counted: Arc<Mutex<SyscallDenials>>,
    task: tokio::task::JoinHandle<()>,
}

impl SeccompWatch {
    /// Starts answering `listener` for a worker of `profile`, whose filter is the
    /// profile's program (the reporting form). `None` when the runtime cannot watch it; the listener is closed then, and the
    /// worker's refusals fail with `ENOSYS` instead of their own errno.
    /// With `learning`, syscalls the program hands over to be observed (the learning form)
    /// are recorded there and let run; without, they are refused like any other.
    pub fn start(
        listener: OwnedFd,
        profile: Arc<CompiledProfile>,
        watching: Watching,
    ) -> Option<Self> {
        let listener = match sys::register_async_fd(listener) {
            Ok(listener) => listener,
            Err(error) => {
                tracing::warn!(%error, "seccomp listener: cannot watch it");
                return None;
            }
        };
        let counted = Arc::new(Mutex::new(SyscallDenials {
            diagnosed: matches!(watching, Watching::Diagnose),
            ..SyscallDenials::default()
        }));
        let task = tokio::spawn(answer(listener, profile, Arc::clone(&counted), watching));
        Some(Self { counted, task })
    }

    /// What was refused so far. Every refused syscall that returned was counted before it
    /// was answered, so once the tool has reported, this is all of its refusals.
    pub fn finish(self) -> SyscallDenials {
        self.counted
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for SeccompWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Notifications answered before the watch gives its thread back to the runtime.
const ANSWERS_PER_TURN: usize = 64;

/// The watch's loop: answer every notification that waits, then wait for more.
async fn answer(
    listener: AsyncFd<OwnedFd>,
    profile: Arc<CompiledProfile>,
    counted: Arc<Mutex<SyscallDenials>>,
    watching: Watching,
) {
    loop {
        let Ok(mut guard) = listener.readable().await else {
            return;
        };
        // Receiving blocks when nothing waits, so look first, every time. A tool whose
        // threads keep making refused syscalls keeps this queue from ever running dry: so
        // after a batch the thread is given back to the runtime, whose other tasks (the
        // call's own deadline among them) would otherwise wait for the tool to stop.
        let mut answered = 0;
        let drained = loop {
            if answered == ANSWERS_PER_TURN {
                break false;
            }
            answered += 1;
            let fd = listener.get_ref().as_fd();
            match sys::poll_listener(fd) {
                Ok(ListenerState::Pending) => {}
                Ok(ListenerState::Idle) => break true,
                Ok(ListenerState::Gone) | Err(_) => return,
            }
            let notification = match sys::receive_notification(fd) {
                Ok(notification) => notification,
                // The process was killed or interrupted since: nothing to answer.
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                Err(_) => return,
            };
            let notified = airlock_policy::seccomp::notification_of(
                &profile.spec.seccomp.program,
                notification.arch,
                notification.nr,
                notification.args,
            );
            // A syscall the program does not hand over cannot arrive here; if one did, it
            // is refused all the same (never let run) and not listed. So is one handed over
            // to be observed when this run is not learning.
            let errno = match (&notified, &watching) {
                (Some(Notified::Refused(refusal)), _) => {
                    counted
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .record(refusal);
                    i32::try_from(refusal.errno).unwrap_or(libc::EPERM)
                }
                (Some(Notified::Observed { syscall }), Watching::Learn(log)) => {
                    let seen = observe::seen(syscall, &notification);
                    if sys::notification_valid(fd, notification.id) {
                        observe::record(log, syscall, seen);
                    }
                    let _ = sys::continue_notification(fd, notification.id);
                    continue;
                }
                (Some(Notified::OutsideAllowlist { syscall }), Watching::Learn(log)) => {
                    observe::outside_allowlist(log, syscall);
                    let seen = observe::seen(syscall, &notification);
                    if sys::notification_valid(fd, notification.id) {
                        observe::record(log, syscall, seen);
                    }
                    let _ = sys::continue_notification(fd, notification.id);
                    continue;
                }
                (Some(Notified::Observed { syscall }), Watching::Diagnose) => {
                    let found = observe::diagnose(syscall, &notification, profile.spec.network);
                    // Read after the process may have died and its pid been reused: then
                    // what was looked at is another process's, and nothing is kept.
                    if !found.is_empty() && sys::notification_valid(fd, notification.id) {
                        let mut counted = counted.lock().unwrap_or_else(PoisonError::into_inner);
                        for finding in found {
                            counted.record_finding(finding);
                        }
                    }
                    let _ = sys::continue_notification(fd, notification.id);
                    continue;
                }
                _ => libc::EPERM,
            };
            // ENOENT: the process went away meanwhile; nothing else can fail here.
            let _ = sys::refuse_notification(fd, notification.id, errno);
        };
        if drained {
            guard.clear_ready();
        } else {
            // Still readable: the next turn starts at once, after the others' turns.
            drop(guard);
            tokio::task::yield_now().await;
        }
    }
}

/// Everything a call's record lists as refused, from each layer's evidence: the seccomp
/// listener's counts (`None` when the filter had no listener), the egress proxy's summary,
/// the cgroup's refused forks, and how the call ended. Pure, so each layer's rule is tested
/// on its own.
pub fn denials_of(
    seccomp: Option<&SyscallDenials>,
    network: Option<&EgressSummary>,
    refused_forks: u64,
    result: &ToolResult,
) -> Vec<Denial> {
    let mut listed = seccomp.map(SyscallDenials::listed).unwrap_or_default();
    if let Some(network) = network {
        listed.extend(network_denials(network));
    }
    let limit = |object: &str, rule: Option<&str>, count: u64| Denial {
        layer: DenialLayer::Limit,
        object: object.to_string(),
        errno: None,
        rule: rule.map(str::to_string),
        count,
    };
    let ended_by = result.error.as_ref().and_then(|e| match e.kind {
        ErrorKind::OutOfMemory => Some("memory"),
        ErrorKind::CpuTimeLimit => Some("cpu_time"),
        ErrorKind::FileSizeLimit => Some("file_size"),
        ErrorKind::Timeout => Some("deadline"),
        _ => None,
    });
    if let Some(object) = ended_by {
        listed.push(limit(object, None, 1));
    }
    let pids_ended = result
        .error
        .as_ref()
        .is_some_and(|e| e.kind == ErrorKind::PidsLimit);
    if refused_forks > 0 || pids_ended {
        listed.push(limit("pids", None, refused_forks.max(1)));
    }
    if result.stdout_truncated {
        listed.push(limit("output", Some("stdout"), 1));
    }
    if result.stderr_truncated {
        listed.push(limit("output", Some("stderr"), 1));
    }
    listed
}

/// The proxy's refusals, one line per destination and reason; refusals past the proxy's
/// event bound are counted under `other`.
fn network_denials(summary: &EgressSummary) -> Vec<Denial> {
    let mut counts: BTreeMap<(String, String), u64> = BTreeMap::new();
    for event in summary.events.iter().filter(|e| !e.allowed) {
        let object = if event.host.is_empty() {
            "unknown".to_string()
        } else {
            format!("{}:{}", event.host, event.port)
        };
        let count = counts
            .entry((object, event.rule_or_reason.clone()))
            .or_default();
        *count = count.saturating_add(1);
    }
    let listed_count: u64 = counts.values().sum();
    let mut listed: Vec<Denial> = counts
        .into_iter()
        .map(|((object, reason), count)| Denial {
            layer: DenialLayer::Network,
            object,
            errno: None,
            rule: Some(reason),
            count,
        })
        .collect();
    let unlisted = u64::from(summary.refused).saturating_sub(listed_count);
    if unlisted > 0 {
        listed.push(Denial {
            layer: DenialLayer::Network,
            object: "other".into(),
            errno: None,
            rule: None,
            count: unlisted,
        });
    }
    listed
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use airlock_policy::seccomp::Refusal;

    use super::*;
    use crate::egress::EgressEvent;
    use crate::egress::proxy::EgressKind;
    use crate::result::ToolError;

    fn refusal(nr: u32, name: Option<&'static str>, errno: u32) -> Refusal {
        Refusal {
            syscall: name,
            nr,
            errno,
            rule: None,
        }
    }

    fn ended(kind: Option<ErrorKind>) -> ToolResult {
        let mut result = ToolResult::rejected("c", "t", ToolError::new(ErrorKind::ToolFailed, ""));
        result.error = kind.map(|k| ToolError::new(k, ""));
        result
    }

    #[test]
    fn syscall_refusals_are_counted_most_frequent_first_and_bounded() {
        let mut counted = SyscallDenials::default();
        counted.record(&refusal(101, Some("ptrace"), 1));
        for _ in 0..3 {
            counted.record(&refusal(425, Some("io_uring_setup"), 38));
        }
        let listed = counted.listed();
        assert_eq!(listed[0].object, "io_uring_setup");
        assert_eq!(listed[0].errno.as_deref(), Some("ENOSYS"));
        assert_eq!(listed[0].count, 3);
        assert_eq!(listed[1].object, "ptrace");
        assert_eq!(listed[1].errno.as_deref(), Some("EPERM"));

        let mut many = SyscallDenials::default();
        for nr in 1000..1100 {
            many.record(&refusal(nr, None, 38));
        }
        many.record(&refusal(1000, None, 38));
        let listed = many.listed();
        assert_eq!(listed.len(), MAX_SYSCALL_ENTRIES + 1);
        assert_eq!(listed[0].object, "syscall_1000");
        assert_eq!(listed[0].count, 2);
        let other = listed.last().unwrap();
        assert_eq!((other.object.as_str(), other.count), ("other", 36));
    }

    #[test]
    fn the_limit_that_ended_a_call_is_listed_once() {
        for (kind, object) in [
            (ErrorKind::OutOfMemory, "memory"),
            (ErrorKind::CpuTimeLimit, "cpu_time"),
            (ErrorKind::FileSizeLimit, "file_size"),
            (ErrorKind::Timeout, "deadline"),
            (ErrorKind::PidsLimit, "pids"),
        ] {
            let listed = denials_of(None, None, 0, &ended(Some(kind)));
            assert_eq!(listed.len(), 1, "{kind:?}");
            assert_eq!(listed[0].layer, DenialLayer::Limit);
            assert_eq!(listed[0].object, object);
        }
        for kind in [ErrorKind::ToolFailed, ErrorKind::Cancelled] {
            assert!(denials_of(None, None, 0, &ended(Some(kind))).is_empty());
        }
        assert!(denials_of(None, None, 0, &ended(None)).is_empty());
    }

    #[test]
    fn refused_forks_and_cut_output_are_listed_even_when_the_call_succeeds() {
        let mut result = ended(None);
        result.stderr_truncated = true;
        let listed = denials_of(None, None, 4, &result);
        assert_eq!(listed.len(), 2);
        assert_eq!((listed[0].object.as_str(), listed[0].count), ("pids", 4));
        assert_eq!(listed[1].object, "output");
        assert_eq!(listed[1].rule.as_deref(), Some("stderr"));
        // A call ended by the pids limit lists it once, with the refused forks' count.
        let listed = denials_of(None, None, 3, &ended(Some(ErrorKind::PidsLimit)));
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].count, 3);
    }

    fn event(host: &str, port: u16, allowed: bool, reason: &str) -> EgressEvent {
        EgressEvent {
            kind: EgressKind::Connect,
            host: host.into(),
            port,
            address: None,
            allowed,
            rule_or_reason: reason.into(),
            bytes_up: 0,
            bytes_down: 0,
            end: None,
            error: None,
        }
    }

    #[test]
    fn refused_destinations_are_grouped_and_unlisted_refusals_counted() {
        let summary = EgressSummary {
            refused: 5,
            events: vec![
                event("example.com", 443, false, "host-not-allowed"),
                event("pypi.org", 443, true, "pypi.org"),
                event("example.com", 443, false, "host-not-allowed"),
                event("10.0.0.1", 80, false, "address-not-allowed: private"),
            ],
            ..EgressSummary::default()
        };
        let listed = denials_of(None, Some(&summary), 0, &ended(None));
        let lines: Vec<(&str, Option<&str>, u64)> = listed
            .iter()
            .map(|d| (d.object.as_str(), d.rule.as_deref(), d.count))
            .collect();
        assert_eq!(
            lines,
            [
                ("10.0.0.1:80", Some("address-not-allowed: private"), 1),
                ("example.com:443", Some("host-not-allowed"), 2),
                ("other", None, 2),
            ]
        );
        assert!(listed.iter().all(|d| d.layer == DenialLayer::Network));
    }
}
