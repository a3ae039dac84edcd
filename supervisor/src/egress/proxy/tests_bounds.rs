//! What bounds the proxy's work for the rest of the supervisor: the events it hands the
//! audit.

use std::sync::atomic::AtomicUsize;

use super::tests::{connect_via, echo_server, loopback_only, ping};
use super::*;

/// A proxy serving `events` on loopback.
struct Served {
    address: SocketAddr,
    stop: CancelSignal,
    server: tokio::task::JoinHandle<EgressSummary>,
}

impl Served {
    async fn finish(self) -> EgressSummary {
        self.stop.cancel();
        self.server.await.unwrap()
    }
}

async fn serve_with(
    hosts: &[String],
    limits: EgressLimits,
    resolver: Arc<dyn Resolve>,
    events: Arc<dyn EventSink>,
) -> Served {
    let policy = Arc::new(EgressPolicy::parse(hosts, &loopback_only()).unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let stop = CancelSignal::new();
    let server = tokio::spawn(serve(
        listener,
        policy,
        limits,
        resolver,
        events,
        stop.clone(),
    ));
    Served {
        address,
        stop,
        server,
    }
}

/// Room for a fixed number of events, like a buffer nobody reads until the call ends:
/// what comes past it is lost.
#[derive(Debug)]
struct Room {
    room: usize,
    offered: AtomicUsize,
    kept: Mutex<Vec<EgressEvent>>,
}

impl Room {
    fn new(room: usize) -> Self {
        Room {
            room,
            offered: AtomicUsize::new(0),
            kept: Mutex::default(),
        }
    }
}

impl EventSink for Room {
    fn record(&self, event: &EgressEvent) {
        self.offered.fetch_add(1, Ordering::AcqRel);
        let mut kept = self.kept.lock().unwrap();
        if kept.len() < self.room {
            kept.push(event.clone());
        }
    }
}

/// Connects and closes without a word, waiting until the proxy has closed its side.
async fn knock(proxy: SocketAddr) {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    stream.shutdown().await.unwrap();
    let mut rest = Vec::new();
    let _ = stream.read_to_end(&mut rest).await;
}

#[tokio::test]
async fn allowed_connections_reach_the_audit_even_after_a_flood_of_refusals() {
    const FLOOD: u32 = 50;
    let upstream = echo_server("127.0.0.1:0").await;
    let limits = EgressLimits {
        max_connections: 2,
        ..EgressLimits::default()
    };
    // A buffer as large as the connection limit: it must never have to drop an event.
    let room = Arc::new(Room::new(2));
    let proxy = serve_with(
        &[format!("127.0.0.1:{}", upstream.port())],
        limits,
        Arc::new(SystemResolver),
        Arc::clone(&room) as Arc<dyn EventSink>,
    )
    .await;
    let (mut tunnel, head) = connect_via(proxy.address, &upstream.to_string()).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    ping(&mut tunnel).await;
    for _ in 0..FLOOD {
        knock(proxy.address).await;
    }
    // The tunnel's event goes out as it ends, after every refusal's.
    drop(tunnel);
    let summary = proxy.finish().await;
    let kept = room.kept.lock().unwrap().clone();
    assert!(
        kept.iter().any(|e| e.allowed && e.port == upstream.port()),
        "{kept:?}"
    );
    assert_eq!(
        room.offered.load(Ordering::Acquire),
        2,
        "one event per connection within the limit"
    );
    assert_eq!(
        (summary.connections, summary.refused, summary.failed),
        (1 + FLOOD, FLOOD, 0)
    );
    assert_eq!(summary.events.len(), 2);
    assert_eq!(summary.events_omitted, FLOOD - 1);
}
