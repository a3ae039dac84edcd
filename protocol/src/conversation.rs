//! The version handshake and the order of the supervisor↔worker conversation, as a pure state
//! machine both sides can run over the messages they send and receive.
//!
//! The order (also documented in [`message`](crate::message)):
//!
//! ```text
//! AwaitingWorkerHello      --worker Hello{v}, v == PROTOCOL_VERSION-->  AwaitingSupervisorHello
//! AwaitingSupervisorHello  --supervisor Hello{PROTOCOL_VERSION}----->   AwaitingSetup
//! AwaitingSetup            --supervisor Setup----------------------->   Confining
//! Confining                --worker Log------------------------------>  Confining
//! Confining                --worker Ready---------------------------->  Idle
//! Confining                --worker SetupFailed---------------------->  Closed
//! Idle                     --supervisor Run-------------------------->  Running
//! Running                  --worker Log------------------------------>  Running
//! Running                  --worker Exited | RunFailed--------------->  Idle
//! any state but Closed     --supervisor Shutdown--------------------->  Closed
//! ```
//!
//! Anything else is a protocol violation ([`ConversationError`]); the supervisor answers one by
//! killing the worker. The machine is fused: after a violation it stays failed.

use crate::message::{PROTOCOL_VERSION, SupervisorMessage, WorkerMessage};

/// Why a conversation step was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConversationError {
    /// The peer speaks another protocol version.
    #[error("protocol version mismatch: ours is {ours}, theirs is {theirs}")]
    VersionMismatch {
        /// Our [`PROTOCOL_VERSION`].
        ours: u32,
        /// The version the peer announced.
        theirs: u32,
    },
    /// The worker sent a message that is not allowed in the current phase.
    #[error("worker sent {message} while {phase}")]
    UnexpectedWorkerMessage {
        /// Name of the message ([`WorkerMessage::name`]).
        message: &'static str,
        /// The phase it arrived in.
        phase: Phase,
    },
    /// The supervisor sent a message that is not allowed in the current phase.
    #[error("supervisor sent {message} while {phase}")]
    UnexpectedSupervisorMessage {
        /// Name of the message ([`SupervisorMessage::name`]).
        message: &'static str,
        /// The phase it was sent in.
        phase: Phase,
    },
    /// The conversation already failed; no further message is accepted.
    #[error("conversation already failed")]
    AlreadyFailed,
}

/// Checks a version announced by the peer against ours: they must be equal.
pub fn check_version(peer: u32) -> Result<(), ConversationError> {
    if peer == PROTOCOL_VERSION {
        Ok(())
    } else {
        Err(ConversationError::VersionMismatch {
            ours: PROTOCOL_VERSION,
            theirs: peer,
        })
    }
}

/// Where a conversation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Nothing exchanged yet; the worker speaks first.
    AwaitingWorkerHello,
    /// The worker said hello; the supervisor answers.
    AwaitingSupervisorHello,
    /// Versions agreed; the supervisor sends the sandbox spec.
    AwaitingSetup,
    /// The worker is confining itself.
    Confining,
    /// Confined and waiting for a run.
    Idle,
    /// A tool is running.
    Running,
    /// Shut down, or setup failed; nothing more may be sent.
    Closed,
    /// A violation happened; nothing more is accepted.
    Failed,
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::AwaitingWorkerHello => "awaiting the worker hello",
            Self::AwaitingSupervisorHello => "awaiting the supervisor hello",
            Self::AwaitingSetup => "awaiting setup",
            Self::Confining => "confining",
            Self::Idle => "idle",
            Self::Running => "running a tool",
            Self::Closed => "closed",
            Self::Failed => "failed",
        })
    }
}

/// The conversation state machine. Feed it every message in the order it was sent or
/// received; each side runs its own copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conversation {
    phase: Phase,
}

impl Default for Conversation {
    fn default() -> Self {
        Self::new()
    }
}

impl Conversation {
    /// A conversation that has not started.
    pub fn new() -> Self {
        Self {
            phase: Phase::AwaitingWorkerHello,
        }
    }

    /// The current phase.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// Records a message from the worker, or reports why it is not allowed now.
    pub fn observe_worker(&mut self, message: &WorkerMessage) -> Result<(), ConversationError> {
        use Phase as P;
        use WorkerMessage as W;
        let next = match (self.phase, message) {
            (P::Failed, _) => return Err(ConversationError::AlreadyFailed),
            (P::AwaitingWorkerHello, W::Hello { version }) => {
                self.fail_on(check_version(*version))?;
                P::AwaitingSupervisorHello
            }
            (P::Confining, W::Log(_)) => P::Confining,
            (P::Confining, W::Ready(_)) => P::Idle,
            (P::Confining, W::SetupFailed(_)) => P::Closed,
            (P::Running, W::Log(_)) => P::Running,
            (P::Running, W::Exited(_) | W::RunFailed { .. }) => P::Idle,
            (phase, message) => {
                self.phase = P::Failed;
                return Err(ConversationError::UnexpectedWorkerMessage {
                    message: message.name(),
                    phase,
                });
            }
        };
        self.phase = next;
        Ok(())
    }

    /// Records a message from the supervisor, or reports why it is not allowed now.
    pub fn observe_supervisor(
        &mut self,
        message: &SupervisorMessage,
    ) -> Result<(), ConversationError> {
        use Phase as P;
        use SupervisorMessage as S;
        let next = match (self.phase, message) {
            (P::Failed, _) => return Err(ConversationError::AlreadyFailed),
            (P::AwaitingSupervisorHello, S::Hello { version }) => {
                self.fail_on(check_version(*version))?;
                P::AwaitingSetup
            }
            (P::AwaitingSetup, S::Setup(_)) => P::Confining,
            (P::Idle, S::Run(_)) => P::Running,
            (phase, S::Shutdown) if phase != P::Closed => P::Closed,
            (phase, message) => {
                self.phase = P::Failed;
                return Err(ConversationError::UnexpectedSupervisorMessage {
                    message: message.name(),
                    phase,
                });
            }
        };
        self.phase = next;
        Ok(())
    }

    fn fail_on(&mut self, result: Result<(), ConversationError>) -> Result<(), ConversationError> {
        if result.is_err() {
            self.phase = Phase::Failed;
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{
        AppliedIsolation, ExitStatus, LogLevel, LogRecord, RunRequest, SetupFailure, StdioMode,
        ToolExit,
    };
    use crate::spec::{LandlockSpec, NetworkMode, Requirement, Rlimits, SandboxSpec, SeccompSpec};

    fn spec() -> SandboxSpec {
        SandboxSpec {
            profile: "p".into(),
            hostname: "h".into(),
            mounts: vec![],
            root: crate::spec::RootSource::Build,
            network: NetworkMode::None,
            rlimits: Rlimits {
                open_files: 1,
                file_size_bytes: 1,
                cpu_seconds: None,
            },
            landlock: LandlockSpec {
                requirement: Requirement::Required,
                read: vec![],
                write: vec![],
                tcp_bind: vec![],
                tcp_connect: vec![],
                restrict_tcp: false,
            },
            seccomp: SeccompSpec {
                requirement: Requirement::Required,
                program: vec![],
                digest: String::new(),
            },
            env: vec![],
            cwd: "/".into(),
        }
    }

    fn run() -> SupervisorMessage {
        SupervisorMessage::Run(RunRequest {
            call_id: "c".into(),
            tool: "t".into(),
            argv: vec![],
            stdin: vec![],
            arguments_json: "{}".into(),
            output_limit_bytes: 1,
            stdio: StdioMode::Capture,
            builtin: None,
        })
    }

    fn log() -> WorkerMessage {
        WorkerMessage::Log(LogRecord {
            level: LogLevel::Info,
            message: "m".into(),
        })
    }

    fn exited() -> WorkerMessage {
        WorkerMessage::Exited(ToolExit {
            status: ExitStatus::Code(0),
            stdout: vec![],
            stderr: vec![],
            stdout_truncated: false,
            stderr_truncated: false,
            user_cpu_us: 0,
            system_cpu_us: 0,
        })
    }

    fn ready() -> WorkerMessage {
        WorkerMessage::Ready(AppliedIsolation {
            namespaces: vec![],
            landlock_abi: 0,
            landlock_fully_enforced: false,
            seccomp_installed: false,
        })
    }

    fn hello_worker() -> WorkerMessage {
        WorkerMessage::Hello {
            version: PROTOCOL_VERSION,
        }
    }

    fn hello_supervisor() -> SupervisorMessage {
        SupervisorMessage::Hello {
            version: PROTOCOL_VERSION,
        }
    }

    fn confined() -> Conversation {
        let mut c = Conversation::new();
        c.observe_worker(&hello_worker()).unwrap();
        c.observe_supervisor(&hello_supervisor()).unwrap();
        c.observe_supervisor(&SupervisorMessage::Setup(Box::new(spec())))
            .unwrap();
        c.observe_worker(&log()).unwrap();
        c.observe_worker(&ready()).unwrap();
        c
    }

    #[test]
    fn matching_version_is_accepted() {
        assert_eq!(check_version(PROTOCOL_VERSION), Ok(()));
    }

    #[test]
    fn wrong_version_is_a_typed_mismatch() {
        assert_eq!(
            check_version(PROTOCOL_VERSION + 1),
            Err(ConversationError::VersionMismatch {
                ours: PROTOCOL_VERSION,
                theirs: PROTOCOL_VERSION + 1
            })
        );
    }

    #[test]
    fn worker_hello_with_wrong_version_fails_the_conversation() {
        let mut c = Conversation::new();
        let err = c.observe_worker(&WorkerMessage::Hello { version: 0 });
        assert_eq!(
            err,
            Err(ConversationError::VersionMismatch {
                ours: PROTOCOL_VERSION,
                theirs: 0
            })
        );
        assert_eq!(c.phase(), Phase::Failed);
        assert_eq!(
            c.observe_worker(&hello_worker()),
            Err(ConversationError::AlreadyFailed)
        );
    }

    #[test]
    fn supervisor_hello_with_wrong_version_is_refused() {
        let mut c = Conversation::new();
        c.observe_worker(&hello_worker()).unwrap();
        assert!(matches!(
            c.observe_supervisor(&SupervisorMessage::Hello { version: 9 }),
            Err(ConversationError::VersionMismatch { theirs: 9, .. })
        ));
    }

    #[test]
    fn full_conversation_is_accepted() {
        let mut c = confined();
        for _ in 0..2 {
            c.observe_supervisor(&run()).unwrap();
            c.observe_worker(&log()).unwrap();
            c.observe_worker(&exited()).unwrap();
        }
        c.observe_supervisor(&run()).unwrap();
        c.observe_worker(&WorkerMessage::RunFailed {
            message: "exec failed".into(),
            errno: Some(2),
        })
        .unwrap();
        c.observe_supervisor(&SupervisorMessage::Shutdown).unwrap();
        assert_eq!(c.phase(), Phase::Closed);
    }

    #[test]
    fn setup_failure_closes_the_conversation() {
        let mut c = Conversation::new();
        c.observe_worker(&hello_worker()).unwrap();
        c.observe_supervisor(&hello_supervisor()).unwrap();
        c.observe_supervisor(&SupervisorMessage::Setup(Box::new(spec())))
            .unwrap();
        c.observe_worker(&WorkerMessage::SetupFailed(SetupFailure {
            step: "landlock".into(),
            message: "m".into(),
            errno: None,
            feature_missing: true,
        }))
        .unwrap();
        assert_eq!(c.phase(), Phase::Closed);
        assert!(c.observe_supervisor(&SupervisorMessage::Shutdown).is_err());
    }

    #[test]
    fn worker_speaking_out_of_turn_is_a_violation() {
        let mut c = Conversation::new();
        assert_eq!(
            c.observe_worker(&ready()),
            Err(ConversationError::UnexpectedWorkerMessage {
                message: "Ready",
                phase: Phase::AwaitingWorkerHello
            })
        );
        let mut c = confined();
        assert_eq!(
            c.observe_worker(&exited()),
            Err(ConversationError::UnexpectedWorkerMessage {
                message: "Exited",
                phase: Phase::Idle
            })
        );
        let mut c = confined();
        c.observe_supervisor(&run()).unwrap();
        assert!(c.observe_worker(&hello_worker()).is_err());
    }

    #[test]
    fn supervisor_running_twice_is_a_violation() {
        let mut c = confined();
        c.observe_supervisor(&run()).unwrap();
        assert_eq!(
            c.observe_supervisor(&run()),
            Err(ConversationError::UnexpectedSupervisorMessage {
                message: "Run",
                phase: Phase::Running
            })
        );
    }

    #[test]
    fn shutdown_is_allowed_mid_run() {
        let mut c = confined();
        c.observe_supervisor(&run()).unwrap();
        c.observe_supervisor(&SupervisorMessage::Shutdown).unwrap();
        assert_eq!(c.phase(), Phase::Closed);
        assert!(c.observe_worker(&exited()).is_err());
    }

    #[test]
    fn error_messages_are_lower_case() {
        let errors = [
            ConversationError::VersionMismatch { ours: 1, theirs: 2 },
            ConversationError::UnexpectedWorkerMessage {
                message: "Ready",
                phase: Phase::Idle,
            },
            ConversationError::UnexpectedSupervisorMessage {
                message: "Run",
                phase: Phase::Running,
            },
            ConversationError::AlreadyFailed,
        ];
        for error in errors {
            let text = error.to_string();
            assert!(text.starts_with(|c: char| c.is_lowercase()), "{text}");
        }
    }
}
