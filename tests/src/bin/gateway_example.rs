//! A gateway that links airlock as a library: the worker entry hook first, then a
//! supervisor that execs *this* binary (sealed) as its worker. Prints one result record.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use airlock::{CallOptions, Gate, Supervisor, SupervisorOptions, ToolCall};

const POLICY: &str = r#"version = 1
[profiles.default]
read = ["/usr"]
read_optional = ["/bin", "/lib", "/lib64", "/etc/ld.so.cache"]
tmpfs = { "/tmp" = "16MiB" }

[tools.hello]
description = "say hello"
command = ["/bin/echo", "hello from", "{name}"]
side_effect = "read"
input = { type = "object", properties = { name = { type = "string" } }, required = ["name"] }
"#;

fn main() {
    if let Some(code) = airlock_worker::run_if_worker() {
        std::process::exit(code);
    }
    let policy = airlock_policy::load_policy_str(POLICY, "gateway.toml")
        .unwrap()
        .policy;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let result = runtime.block_on(async {
        let supervisor = Arc::new(Supervisor::start(SupervisorOptions::default()).unwrap());
        let gate = Gate::new(Arc::clone(&supervisor), policy);
        let call = ToolCall {
            call_id: "g1".into(),
            tool: "hello".into(),
            arguments: r#"{"name": "gateway"}"#.into(),
        };
        let result = gate.call(&call, &CallOptions::default()).await;
        supervisor.close().await;
        result
    });
    println!("{}", serde_json::to_string(&result).unwrap());
}
