//! A call's egress proxy: started on the listener its worker passed, stopped when the
//! conversation ends (report, deadline, cancellation or close), which ends every tunnel.

use std::sync::Arc;

use airlock_policy::CompiledProfile;

use super::Supervisor;
use crate::cancel::CancelSignal;
use crate::egress::{EgressSummary, EventSink, proxy::DiscardEvents};

/// The proxy serving one call. Dropped before [`RunningProxy::finish`] (the call was given
/// up), it still stops: no tunnel outlives its call.
pub(super) struct RunningProxy {
    stop: CancelSignal,
    task: tokio::task::JoinHandle<EgressSummary>,
}

impl RunningProxy {
    /// Ends every tunnel and returns what the proxy did.
    pub(super) async fn finish(mut self) -> Option<EgressSummary> {
        self.stop.cancel();
        (&mut self.task).await.ok()
    }
}

impl Drop for RunningProxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Supervisor {
    /// Serves `listener` (in the worker's network namespace) for a call of `profile`. A
    /// profile without an allowlist gets no proxy: the listener closes and nothing leaves
    /// the namespace.
    pub(super) fn start_egress(
        &self,
        listener: std::net::TcpListener,
        profile: &CompiledProfile,
        events: Option<Arc<dyn EventSink>>,
    ) -> Option<RunningProxy> {
        let policy = Arc::clone(profile.egress.as_ref()?);
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(listener) => listener,
            Err(error) => {
                tracing::warn!(%error, "egress proxy: cannot serve the worker's listener");
                return None;
            }
        };
        let stop = CancelSignal::new();
        let events = events.unwrap_or_else(|| Arc::new(DiscardEvents));
        let task = tokio::spawn(crate::egress::serve(
            listener,
            policy,
            self.egress_limits,
            Arc::clone(&self.egress_resolver),
            events,
            stop.clone(),
        ));
        Some(RunningProxy { stop, task })
    }
}
