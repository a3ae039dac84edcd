//! The session ops: `session_open`, `put_file`, `get_file`, `changes`, `session_close`,
//! `session_set`.
//! Their file work runs on the blocking pool, never on the connection's task.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::Semaphore;

use super::wire::{
    GetFileRequest, Op, PutFileRequest, SessionOpenRequest, SessionRequest, SessionSetRequest,
    SizeField, error_body,
};
use crate::gate::Gate;
use crate::session::{SessionError, Sessions};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

/// How often the daemon closes idle sessions besides the sweep every session op makes.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Closes idle sessions on a timer until aborted; none when the gate serves no sessions.
pub(super) fn keep_sweeping(gate: &Arc<Gate>) -> Option<tokio::task::JoinHandle<()>> {
    gate.sessions()?;
    let gate = Arc::clone(gate);
    Some(tokio::spawn(async move {
        let mut every = tokio::time::interval(SWEEP_EVERY);
        loop {
            every.tick().await;
            let gate = Arc::clone(&gate);
            let _ = tokio::task::spawn_blocking(move || {
                if let Some(sessions) = gate.sessions() {
                    sessions.sweep(&gate.policy().sessions);
                }
            })
            .await;
        }
    }))
}

/// Session ops running at once over all connections. Each may hold a workspace's listing
/// (`changes`: up to the walk's bound of paths, several times over while it is answered) or
/// a file's bytes: a hundred connections each asking at once would hold gigabytes.
pub(super) const SESSION_OPS_AT_ONCE: usize = 4;

/// Answers one session op (the `result` or `error` body), once one of `at_once` is free.
pub(super) async fn answer(gate: &Arc<Gate>, at_once: &Arc<Semaphore>, op: Op) -> Value {
    let gate = Arc::clone(gate);
    bounded(at_once, move || match gate.sessions() {
        Some(sessions) => run(&gate, sessions, op),
        None => error_body(
            "sandbox_unavailable",
            "this daemon serves no sessions (its state directory could not be made)",
        ),
    })
    .await
    .unwrap_or_else(|| error_body("sandbox_unavailable", "the session op failed"))
}

/// Runs `work` on the blocking pool while holding one of `at_once`; `None` if it panicked.
async fn bounded<T: Send + 'static>(
    at_once: &Arc<Semaphore>,
    work: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let permit = Arc::clone(at_once).acquire_owned().await.ok()?;
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        work()
    })
    .await
    .ok()
}

fn run(gate: &Gate, sessions: &Sessions, op: Op) -> Value {
    let policy = gate.policy();
    let bounds = &policy.sessions;
    let outcome = match op {
        Op::SessionOpen(SessionOpenRequest {
            base,
            size,
            plan_mode,
        }) => {
            let size = match size {
                None => None,
                Some(SizeField::Bytes(bytes)) => Some(bytes),
                Some(SizeField::Text(text)) => match airlock_policy::units::parse_size(&text) {
                    Ok(bytes) => Some(bytes),
                    Err(e) => {
                        return error_body("invalid_request", format!("session_open: size: {e}"));
                    }
                },
            };
            // A session opened without a size gets the largest any profile asks for.
            let default = policy
                .profiles
                .values()
                .filter_map(|p| p.workspace.as_ref().map(|w| w.size_bytes))
                .max()
                .unwrap_or(airlock_policy::validate::DEFAULT_WORKSPACE_BYTES);
            sessions
                .open(bounds, base.as_deref(), size, default)
                .and_then(|opened| {
                    // Before the id is answered, so no call in it can run outside plan mode.
                    if plan_mode
                        && let Err(error) =
                            sessions.set_plan_mode(bounds, "session_open", &opened.session, true)
                    {
                        let _ = sessions.close(&opened.session);
                        return Err(error);
                    }
                    Ok(json!(opened))
                })
        }
        Op::PutFile(PutFileRequest {
            session,
            path,
            content_base64,
        }) => match BASE64.decode(&content_base64) {
            Err(_) => Err(SessionError::Invalid {
                op: "put_file",
                reason: "content_base64 is not padded standard base64".into(),
            }),
            Ok(content) => sessions
                .put_file(bounds, &session, &path, &content)
                .map(|()| json!({"size": content.len()})),
        },
        Op::GetFile(GetFileRequest { session, path }) => sessions
            .get_file(bounds, &session, &path)
            .map(|bytes| json!({"content_base64": BASE64.encode(&bytes), "size": bytes.len()})),
        Op::Changes(SessionRequest { session }) => sessions
            .changes(bounds, &session)
            .map(|changes| json!({"changes": changes})),
        Op::SessionClose(SessionRequest { session }) => {
            sessions.close(&session).map(|()| json!({"closed": true}))
        }
        // Whether this peer may lift a plan mode was decided before (`dispatch`).
        Op::SessionSet(SessionSetRequest { session, plan_mode }) => sessions
            .set_plan_mode(bounds, "session_set", &session, plan_mode)
            .map(|()| json!({"session": session, "plan_mode": plan_mode})),
        _ => return error_body("invalid_request", "not a session op"),
    };
    match outcome {
        Ok(result) => json!({"result": result}),
        Err(error) => error_body(error.kind(), error.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn session_ops_wait_for_a_free_place() {
        let at_once = Arc::new(Semaphore::new(1));
        let held = Arc::clone(&at_once).acquire_owned().await.unwrap();
        let waiting = tokio::spawn({
            let at_once = Arc::clone(&at_once);
            async move { bounded(&at_once, || 7).await }
        });
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!waiting.is_finished(), "ran without a place");
        drop(held);
        assert_eq!(waiting.await.unwrap(), Some(7));
    }

    #[test]
    fn file_contents_are_strict_padded_standard_base64() {
        assert_eq!(BASE64.encode(b"foobar"), "Zm9vYmFy");
        assert_eq!(BASE64.encode(b"fo"), "Zm8=");
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(BASE64.decode(BASE64.encode(&all)).ok(), Some(all));
        for bad in [
            "Zm8", "Zm8==", "Z===", "Zm=8", "Zm8=Zm8=", "Zm9!", "Zm9=", "Zg=\n",
        ] {
            assert!(BASE64.decode(bad).is_err(), "{bad:?}");
        }
    }
}
