//! Network modes seen from inside: none (no socket but AF_UNIX), loopback (a private
//! loopback, never the host's), and the host network narrowed to TCP ports by Landlock.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::TcpListener;
use std::path::Path;

use airlock_tests::{
    Scratch, exec_json, sandbox_available, stdout_of, test_policy, wait_until_async,
};

const CONNECT: &str = "import socket, sys\nfor port in sys.argv[1:]:\n    try:\n        socket.create_connection(('127.0.0.1', int(port)), timeout=2).close()\n        print(port, 'connected')\n    except OSError as e:\n        print(port, 'errno', e.errno)\n";

/// The limits of a call that must finish: a deadline that is only a hang guard.
fn timeout() -> String {
    format!("timeout = {}", airlock_tests::hang_guard_toml())
}

fn python_available() -> bool {
    Path::new("/usr/bin/python3").exists()
}

#[test]
fn loopback_mode_has_its_own_loopback_and_cannot_reach_the_hosts() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() || !python_available() {
        return;
    }
    let host = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = host.local_addr().unwrap().port().to_string();
    let scratch = Scratch::new("net-loopback");
    let policy = scratch.write("p.toml", &test_policy(&[], &timeout(), "loopback"));
    let result = exec_json(
        Some(&policy),
        &[],
        &["/usr/bin/python3", "-c", CONNECT, &port],
    );
    // ECONNREFUSED (111): the sandbox's loopback is up but empty; the host listener is elsewhere.
    assert_eq!(
        stdout_of(&result),
        format!("{port} errno 111\n"),
        "{result}"
    );
}

#[test]
fn host_network_is_narrowed_to_the_allowed_tcp_ports() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() || !python_available() {
        return;
    }
    let allowed = TcpListener::bind("127.0.0.1:0").unwrap();
    let denied = TcpListener::bind("127.0.0.1:0").unwrap();
    let (a, d) = (
        allowed.local_addr().unwrap().port(),
        denied.local_addr().unwrap().port(),
    );
    let scratch = Scratch::new("net-host");
    let base = test_policy(&[], &timeout(), "none");
    let policy_text = base.replace(
        "network = \"none\"",
        &format!("network = {{ mode = \"host\", connect = [\"tcp:{a}\"] }}"),
    );
    let policy = scratch.write("p.toml", &policy_text);
    let result = exec_json(
        Some(&policy),
        &[],
        &[
            "/usr/bin/python3",
            "-c",
            CONNECT,
            &a.to_string(),
            &d.to_string(),
        ],
    );
    if result["error"]["kind"] == "sandbox_unavailable" {
        // Kernels without Landlock ABI 4 (TCP rules) or 6 (abstract-socket scoping) cannot
        // enforce this profile: it must fail closed there, never run unfiltered.
        assert!(
            result["error"]["message"]
                .as_str()
                .unwrap()
                .to_lowercase()
                .contains("landlock"),
            "{result}"
        );
        return;
    }
    // EACCES (13) from Landlock for the port not on the list.
    assert_eq!(
        stdout_of(&result),
        format!("{a} connected\n{d} errno 13\n"),
        "{result}"
    );
    let namespaces = result["isolation"]["namespaces"].as_array().unwrap();
    assert!(!namespaces.iter().any(|n| n == "net"), "{result}");
    assert!(namespaces.iter().any(|n| n == "net:host"), "{result}");
}

/// The landlock ABI of this kernel (0 without Landlock).
fn landlock_abi() -> i64 {
    airlock_worker::sys::landlock_abi_version().map_or(0, i64::from)
}

fn neighbours_policy(probe: &Path, shared_dir: &Path) -> String {
    let tool = |name: &str, args: &[&str]| {
        let fields: Vec<&str> = args
            .iter()
            .filter_map(|a| a.strip_prefix('{').and_then(|a| a.strip_suffix('}')))
            .collect();
        let command: Vec<String> = std::iter::once(probe.display().to_string())
            .chain(args.iter().map(|a| a.to_string()))
            .map(|a| format!("{a:?}"))
            .collect();
        let properties: Vec<String> = fields
            .iter()
            .map(|f| format!("{f} = {{ type = \"string\" }}"))
            .collect();
        let required: Vec<String> = fields.iter().map(|f| format!("{f:?}")).collect();
        format!(
            "[tools.{name}]\ndescription = \"probe\"\ncommand = [{}]\nside_effect = \"read\"\ninput = {{ type = \"object\", properties = {{ {} }}, required = [{}] }}\n",
            command.join(", "),
            properties.join(", "),
            required.join(", ")
        )
    };
    format!(
        r#"version = 1
[profiles.default]
read = ["/usr", {probe_dir:?}]
read_optional = ["/bin", "/lib", "/lib64", "/etc/ld.so.cache"]
write = [{shared:?}]
tmpfs = {{ "/tmp" = "16MiB" }}
network = "none"
limits = {{ timeout = {timeout} }}

{listen}
{connect}
{pair}
{tcp}"#,
        probe_dir = probe.parent().unwrap().display().to_string(),
        shared = shared_dir.display().to_string(),
        listen = tool(
            "listen",
            &["listen-abstract", "{name}", "{ready}", "{done}"]
        ),
        connect = tool("connect", &["connect-abstract", "{name}"]),
        pair = tool("pair", &["abstract-pair", "{name}"]),
        tcp = tool("tcp", &["connect-tcp", "{addr}"]),
        timeout = airlock_tests::hang_guard_toml(),
    )
}

/// The network namespace strategy (see docs/policy.md#network): by default every worker
/// has its own network namespace, so two workers running at the same time share no network
/// state at all. With the opt-in `SharedWhenSafe`, a root supervisor with Landlock ABI 6
/// gives `network = "none"` workers one shared, empty namespace; they must still be unable
/// to reach each other: here through an abstract unix socket (the only socket family the
/// filter leaves, and netns-scoped); IP sockets are refused outright, which `escape`
/// checks. Holds on every kernel of the matrix, and says which strategy ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_workers_have_their_own_network_namespace_by_default() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    neighbours_cannot_reach_each_other(airlock::NetworkNamespaces::PerWorker, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_sharing_a_network_namespace_by_opt_in_cannot_reach_each_other() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    // Root with scoping available shares; otherwise every worker has its own namespace.
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    neighbours_cannot_reach_each_other(
        airlock::NetworkNamespaces::SharedWhenSafe,
        root && landlock_abi() >= 6,
    )
    .await;
}

async fn neighbours_cannot_reach_each_other(
    strategy: airlock::NetworkNamespaces,
    expect_shared: bool,
) {
    use std::sync::Arc;

    use airlock::{CallOptions, Gate, Supervisor, SupervisorOptions, ToolCall};

    let scratch = Scratch::new("net-neighbours");
    let shared_dir = scratch.0.join("shared");
    std::fs::create_dir(&shared_dir).unwrap();
    // The sandbox root (65534 when we are root) must be able to create the ready file.
    std::fs::set_permissions(
        &shared_dir,
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let probe = scratch.stage("airlock-probe");
    let policy =
        airlock_policy::load_policy_str(&neighbours_policy(&probe, &shared_dir), "neighbours.toml")
            .unwrap()
            .policy;
    let supervisor = Arc::new(
        Supervisor::start(SupervisorOptions {
            worker_program: Some((airlock_tests::airlock_bin(), Vec::new())),
            network_namespaces: strategy,
            ..Default::default()
        })
        .unwrap(),
    );
    let gate = Arc::new(Gate::new(Arc::clone(&supervisor), policy));
    let name = format!("airlock-neighbour-{}-{strategy:?}", std::process::id());
    let ready_file = shared_dir.join("ready");
    let done_file = shared_dir.join("done");
    let call = |id: &str, tool: &str, arguments: serde_json::Value| ToolCall {
        call_id: id.into(),
        tool: tool.into(),
        arguments: arguments.to_string(),
    };

    // Control: inside one sandbox the listener and the client do reach each other.
    let pair = gate
        .call(
            &call(
                "pair",
                "pair",
                serde_json::json!({ "name": format!("{name}-pair") }),
            ),
            &CallOptions::default(),
        )
        .await;
    assert_eq!(pair.stdout, "ok\n", "{pair:?}");

    let listen = {
        let gate = Arc::clone(&gate);
        let arguments = serde_json::json!({
            "name": name,
            "ready": ready_file.display().to_string(),
            "done": done_file.display().to_string(),
        });
        tokio::spawn(async move {
            gate.call(
                &call("listen", "listen", arguments),
                &CallOptions::default(),
            )
            .await
        })
    };
    wait_until_async("the listener is ready", || ready_file.exists()).await;
    let connect = gate
        .call(
            &call("connect", "connect", serde_json::json!({ "name": name })),
            &CallOptions::default(),
        )
        .await;
    // The listener stays until told the attack is over, not for a time the connecting
    // sandbox's start could outlast: had it gone, the connect would be refused for want of
    // a listener, not by the boundary.
    std::fs::write(&done_file, b"done").unwrap();
    let listen = listen.await.unwrap();
    assert!(connect.ok, "{connect:?}");
    assert!(listen.ok, "{listen:?}");

    let shared = listen
        .isolation
        .as_ref()
        .unwrap()
        .namespaces
        .iter()
        .any(|n| n == "net:shared");
    assert_eq!(
        shared,
        connect
            .isolation
            .as_ref()
            .unwrap()
            .namespaces
            .iter()
            .any(|n| n == "net:shared")
    );
    assert_eq!(shared, expect_shared, "{listen:?}");

    let (outcome, listener_netns) = listen.stdout.trim().split_once(' ').unwrap();
    assert_eq!(outcome, "nobody", "{listen:?}");
    let host_netns = std::fs::read_link("/proc/self/ns/net").unwrap();
    assert_ne!(listener_netns, host_netns.display().to_string());
    if shared {
        // Same namespace, so the abstract name is visible: Landlock's scoping refuses the
        // connection (EPERM).
        assert_eq!(connect.stdout, "errno=1\n", "{connect:?}");
    } else {
        // Different namespaces: the name does not exist there (ECONNREFUSED).
        assert_eq!(connect.stdout, "errno=111\n", "{connect:?}");
    }
    // Nor through loopback: no IP socket can be made at all (the filter's EPERM), so a
    // neighbour listening on 127.0.0.1 is as unreachable as the host.
    let tcp = gate
        .call(
            &call("tcp", "tcp", serde_json::json!({ "addr": "127.0.0.1:9" })),
            &CallOptions::default(),
        )
        .await;
    assert_eq!(tcp.stdout, "errno=1\n", "{tcp:?}");
    supervisor.close().await;
}
