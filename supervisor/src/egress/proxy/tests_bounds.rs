//! What bounds the proxy's work for the rest of the supervisor: the events it hands the
//! audit, and the name lookups it keeps running.

use std::sync::Condvar;
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

/// A gate that blocking work waits at until it opens.
#[derive(Debug, Default)]
struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
}

impl Gate {
    fn wait(&self) {
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.opened.wait(open).unwrap();
        }
    }

    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }
}

/// Opens the gate when dropped, so a failing test does not leave the runtime waiting for
/// blocking work that never ends.
struct OpenOnDrop(Arc<Gate>);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.open();
    }
}

/// A resolver whose lookups run on the blocking pool until the gate opens, whatever becomes
/// of the future that asked (as getaddrinfo does), then find nothing.
#[derive(Debug, Default)]
struct Stuck {
    gate: Arc<Gate>,
    in_flight: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
    started: Arc<AtomicUsize>,
}

impl Resolve for Stuck {
    fn resolve<'a>(&'a self, _name: &'a str) -> ResolveFuture<'a> {
        let gate = Arc::clone(&self.gate);
        let in_flight = Arc::clone(&self.in_flight);
        let most = Arc::clone(&self.most);
        self.started.fetch_add(1, Ordering::AcqRel);
        let work = tokio::task::spawn_blocking(move || {
            let now = in_flight.fetch_add(1, Ordering::AcqRel) + 1;
            most.fetch_max(now, Ordering::AcqRel);
            gate.wait();
            in_flight.fetch_sub(1, Ordering::AcqRel);
        });
        Box::pin(async move {
            let _ = work.await;
            Err(ResolveError::NotFound)
        })
    }
}

/// Asks the proxy for a tunnel to `name.test:443`; returns its answer.
async fn connect_name(proxy: SocketAddr) -> String {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    stream
        .write_all(b"CONNECT name.test:443 HTTP/1.1\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer).await;
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test]
async fn abandoned_lookups_hold_their_place_until_they_end() {
    const ROUND: usize = 12;
    let resolver = Arc::new(Stuck::default());
    let _open = OpenOnDrop(Arc::clone(&resolver.gate));
    let limits = EgressLimits {
        connect_timeout: Duration::from_millis(100),
        ..EgressLimits::default()
    };
    let proxy = serve_with(
        &["name.test".into()],
        limits,
        Arc::clone(&resolver) as Arc<dyn Resolve>,
        Arc::new(DiscardEvents),
    )
    .await;
    // Two rounds of connections whose lookups time out and keep running.
    for _ in 0..2 {
        let mut round = JoinSet::new();
        for _ in 0..ROUND {
            round.spawn(connect_name(proxy.address));
        }
        while let Some(answer) = round.join_next().await {
            let answer = answer.unwrap();
            assert!(answer.starts_with("HTTP/1.1 502"), "{answer}");
        }
    }
    let bound = usize::try_from(MAX_LOOKUPS).unwrap();
    assert_eq!(resolver.started.load(Ordering::Acquire), bound);
    assert!(
        resolver.most.load(Ordering::Acquire) <= bound,
        "{} lookups at once",
        resolver.most.load(Ordering::Acquire)
    );
    // Once they end, their places are free again (a moment after: the permit goes back
    // when the lookup's task next runs). The blocking threads must first be woken, which
    // a slow machine may take its time over: waited for, not counted in tries.
    resolver.gate.open();
    let woken_by = std::time::Instant::now() + Duration::from_secs(300);
    while resolver.in_flight.load(Ordering::Acquire) > 0 {
        assert!(
            std::time::Instant::now() < woken_by,
            "the lookups never ended"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let mut tries = 1;
    while !connect_name(proxy.address)
        .await
        .contains("the name has no addresses")
    {
        assert!(tries < 30, "no lookup starts again");
        tries += 1;
    }
    assert_eq!(resolver.started.load(Ordering::Acquire), bound + 1);
    let summary = proxy.finish().await;
    assert_eq!(summary.failed, u32::try_from(2 * ROUND + tries).unwrap());
    let waited = summary
        .events
        .iter()
        .filter(|e| e.error.as_deref().is_some_and(|e| e.contains("lookups")))
        .count();
    assert_eq!(
        waited,
        2 * ROUND - bound + tries - 1,
        "refused for want of a lookup"
    );
}

/// Maps one name to one public address that it says is this host's.
#[derive(Debug)]
struct SelfResolver {
    address: IpAddr,
}

impl Resolve for SelfResolver {
    fn resolve<'a>(&'a self, _name: &'a str) -> ResolveFuture<'a> {
        let address = self.address;
        Box::pin(async move { Ok(vec![address]) })
    }

    fn is_this_host(&self, address: IpAddr) -> bool {
        address == self.address
    }
}

#[tokio::test]
async fn a_name_resolving_to_this_hosts_own_public_address_is_refused() {
    let resolver = Arc::new(SelfResolver {
        address: "93.184.216.34".parse().unwrap(),
    });
    let sink = Arc::new(Room::new(8));
    let proxy = serve_with(
        &["self.example.com:443".to_string()],
        EgressLimits::default(),
        resolver,
        Arc::clone(&sink) as Arc<dyn EventSink>,
    )
    .await;
    let (_stream, head) = connect_via(proxy.address, "self.example.com:443").await;
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    assert!(
        head.contains("X-Airlock-Denied: address-not-allowed\r\n"),
        "{head}"
    );
    let summary = proxy.finish().await;
    assert_eq!(summary.refused, 1);
    assert!(
        summary.events[0].rule_or_reason.contains("this-host"),
        "{:?}",
        summary.events[0]
    );
}

#[test]
fn the_hosts_own_addresses_are_told_from_others() {
    assert!(super::resolve::is_this_host("127.0.0.1".parse().unwrap()));
    assert!(super::resolve::is_this_host(
        "::ffff:127.0.0.1".parse().unwrap()
    ));
    assert!(!super::resolve::is_this_host("192.0.2.77".parse().unwrap()));
}
