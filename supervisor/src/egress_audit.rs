//! A call through the gate whose profile has an egress proxy: each connection becomes a
//! `network.allowed` or `network.denied` event as it ends, while the call runs.

use std::sync::Arc;

use tokio::sync::mpsc;

use crate::audit::Event;
use crate::cancel::CancelSignal;
use crate::egress::{EgressEvent, EventSink};
use crate::result::ToolResult;
use crate::sandbox::{SandboxRun, Supervisor};

/// Connection events buffered between the proxy and the audit; past this the proxy drops
/// events rather than wait (the result's `network` section still counts them).
const EVENT_BUFFER: usize = 1024;

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
    let (sender, mut receiver) = mpsc::channel::<EgressEvent>(EVENT_BUFFER);
    let sink: Arc<dyn EventSink> = Arc::new(sender);
    let mut call = Box::pin(supervisor.run_observed(run, cancel, Some(sink)));
    let to_event = |connection: &EgressEvent| Event::network(&call_id, session, &tool, connection);
    let result = loop {
        tokio::select! {
            result = &mut call => break result,
            Some(connection) = receiver.recv() => emit(to_event(&connection)),
        }
    };
    // The proxy has stopped by the time the call answers: what is left is all there is.
    while let Ok(connection) = receiver.try_recv() {
        emit(to_event(&connection));
    }
    result
}
