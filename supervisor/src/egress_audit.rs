//! A call through the gate whose profile has an egress proxy: each connection becomes a
//! `network.allowed` or `network.denied` event as it ends, while the call runs.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::audit::Event;
use crate::cancel::CancelSignal;
use crate::egress::{EgressEvent, EventSink};
use crate::result::ToolResult;
use crate::sandbox::{SandboxRun, Supervisor};

/// Runs `run` on `supervisor`, giving `emit` one event per egress connection as it ends.
/// Without an egress proxy in the profile it is a plain run.
pub(crate) async fn run_audited(
    supervisor: &Supervisor,
    run: SandboxRun,
    cancel: Option<&CancelSignal>,
    session: Option<&str>,
    emit: impl Fn(Event),
) -> ToolResult {
    // Boxed: inline, the sandbox's future made every gate call's future large enough to
    // overflow a debug build's thread stack.
    if run.profile.egress.is_none() {
        return Box::pin(supervisor.run(run, cancel)).await;
    }
    let (call_id, tool) = (run.call_id.clone(), run.tool.clone());
    let (sink, receiver) = event_channel();
    let call = Box::pin(supervisor.run_observed(run, cancel, Some(sink)));
    relay(call, receiver, |connection| {
        emit(Event::network(&call_id, session, &tool, connection));
    })
    .await
}

/// The proxy's end of the way its events go to the audit, and the audit's. Unbounded, so
/// that no event is ever dropped (a tunnel's comes last, when it ends: a buffer filled by
/// refusals would lose the one connection that carried data out). What it can hold is
/// bounded all the same: the proxy sends one event for each of its call's first
/// `max_connections` connections and none past them (`EgressLimits`, set by whoever
/// starts the supervisor, not by a policy).
fn event_channel() -> (Arc<dyn EventSink>, mpsc::UnboundedReceiver<EgressEvent>) {
    let (sender, receiver) = mpsc::unbounded_channel::<EgressEvent>();
    (Arc::new(sender), receiver)
}

/// Awaits `call`, handing each event to `emit` as it comes and the rest once `call` is
/// done.
async fn relay<T>(
    call: impl Future<Output = T>,
    mut receiver: mpsc::UnboundedReceiver<EgressEvent>,
    emit: impl Fn(&EgressEvent),
) -> T {
    tokio::pin!(call);
    let answer = loop {
        tokio::select! {
            answer = &mut call => break answer,
            Some(connection) = receiver.recv() => emit(&connection),
        }
    };
    // The proxy has stopped by the time the call answers: what is left is all there is.
    while let Ok(connection) = receiver.try_recv() {
        emit(&connection);
    }
    answer
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    fn connection(port: u16) -> EgressEvent {
        EgressEvent {
            kind: crate::egress::proxy::EgressKind::Connect,
            host: "example.com".into(),
            port,
            address: None,
            allowed: true,
            rule_or_reason: "example.com".into(),
            bytes_up: 1,
            bytes_down: 1,
            end: None,
            error: None,
        }
    }

    #[tokio::test]
    async fn every_connection_event_reaches_the_audit_however_far_behind_it_is() {
        // The proxy sends at most its call's `max_connections` events, which an embedder
        // may set well above any fixed buffer; here the audit reads none until all are in.
        const SENT: u16 = 5000;
        let (sink, receiver) = event_channel();
        for port in 0..SENT {
            sink.record(&connection(port));
        }
        let emitted = Mutex::new(Vec::new());
        let answer = relay(async { "done" }, receiver, |event| {
            emitted.lock().unwrap().push(event.port);
        })
        .await;
        assert_eq!(answer, "done");
        let emitted = emitted.into_inner().unwrap();
        assert_eq!(emitted.len(), usize::from(SENT));
        assert!(emitted.iter().copied().eq(0..SENT), "in the order sent");
    }
}
