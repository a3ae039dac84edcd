//! The suite's tracing subscriber. A process has one global subscriber and the suite is one
//! process, so the tests that want log lines share it: it prints what `RUST_LOG` selects on
//! stderr (from the first test that installs it on: `cleanup`'s, or `gate`'s capture), and
//! while a [`Capture`] is alive it keeps every line at every level for the test that holds
//! it. Otherwise it keeps nothing: the other tests' calls (the soak's thousands) are not
//! formatted into a buffer nobody reads.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Captures alive now.
static CAPTURES: AtomicUsize = AtomicUsize::new(0);

/// What was logged while a capture was alive.
static CAPTURED: Mutex<Vec<u8>> = Mutex::new(Vec::new());

/// Installs the subscriber, once per process; later calls do nothing.
pub fn install() {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let to_stderr = std::env::var_os("RUST_LOG").is_some().then(|| {
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(std::io::stderr)
                .with_filter(EnvFilter::from_default_env())
        });
        // A dynamic filter: asked at every event, not once per call site (a cached "no"
        // from before a capture began would hide that call site for good).
        let captured = tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_writer(|| CaptureWriter)
            .with_filter(tracing_subscriber::filter::dynamic_filter_fn(|_, _| {
                CAPTURES.load(Ordering::SeqCst) > 0
            }));
        tracing_subscriber::registry()
            .with(to_stderr)
            .with(captured)
            .try_init()
            .expect("no other tracing subscriber in the suite");
    });
}

/// Every log line of this process, at every level, while it lives (those of tests running
/// beside its own too: a test looks in them for what must never be logged).
#[derive(Debug)]
pub struct Capture(());

impl Capture {
    pub fn start() -> Self {
        install();
        CAPTURES.fetch_add(1, Ordering::SeqCst);
        Self(())
    }

    /// What was logged so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&CAPTURED.lock().unwrap()).into_owned()
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        if CAPTURES.fetch_sub(1, Ordering::SeqCst) == 1 {
            CAPTURED.lock().unwrap().clear();
        }
    }
}

struct CaptureWriter;

impl Write for CaptureWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        CAPTURED.lock().unwrap().extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
