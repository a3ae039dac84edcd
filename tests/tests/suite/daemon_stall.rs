//! The daemon against clients that stall half way through a request: what they half sent
//! is dropped after `--read-timeout`, and meanwhile other clients' requests are still read
//! and their calls left running.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::thread::JoinHandle;

use airlock_tests::{sandbox_available, wait_until};
use serde_json::json;

use super::daemon_hostile::{call, connect, start, stats};

/// Three lines of almost the largest request each, never ended, on connections of their
/// own: more than a 4 MiB input budget between them. Each comes with the thread writing it,
/// which ends once the whole line is in the socket.
fn stall(daemon: &airlock_tests::daemon::Daemon) -> Vec<(UnixStream, JoinHandle<()>)> {
    let partial = format!(
        r#"{{"id":"half","op":"call","tool":"echo","arguments":{{"text":"{}"#,
        "x".repeat((2 << 20) - 100)
    );
    (0..3)
        .map(|_| {
            let stream = UnixStream::connect(&daemon.socket).unwrap();
            // Written on a thread of its own: the daemon reads the third line only when
            // there is room for it, and until then the write waits.
            let mut writer = stream.try_clone().unwrap();
            let partial = partial.clone();
            let writing = std::thread::spawn(move || {
                let _ = writer.write_all(partial.as_bytes());
            });
            (stream, writing)
        })
        .collect()
}

#[test]
fn half_sent_requests_filling_the_input_budget_never_lock_out_a_polite_client() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    // The read timeout outlasts the test, so the budget stays full however slow it runs.
    let guard = format!("{}s", airlock_tests::HANG_GUARD.as_secs());
    let daemon = start(&["--max-input", "4MiB", "--read-timeout", &guard]);
    let mut polite = connect(&daemon);
    polite.send(&call("running", "sleep", json!({"seconds": "2"})));
    let stalled = stall(&daemon);
    wait_until("the half-sent lines fill the input budget", || {
        let held = stats(&daemon)["input_bytes"].as_u64().unwrap();
        held + (64 << 10) >= 4 << 20
    });
    // A small request from a polite client is read all the same, and its call goes on.
    polite.send(&json!({"id": "h", "op": "health"}));
    let mut answers: Vec<_> = (0..2).map(|_| polite.next().unwrap()).collect();
    answers.sort_by_key(|answer| answer["id"].to_string());
    assert_eq!(answers[0]["id"], "h", "{answers:?}");
    assert_eq!(answers[0]["result"]["ok"], true, "{answers:?}");
    assert_eq!(answers[1]["id"], "running", "{answers:?}");
    assert_eq!(answers[1]["result"]["ok"], true, "{answers:?}");
    drop(stalled);
}

#[test]
fn half_sent_requests_are_dropped_after_the_read_timeout_and_their_connections_kept() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let daemon = start(&["--max-input", "4MiB", "--read-timeout", "1s"]);
    let stalled = stall(&daemon);
    // Each stalled request is answered by its id and dropped; its connection stays open.
    for (mut stream, writing) in stalled {
        let mut client = super::daemon_hostile::Client::from_stream(stream.try_clone().unwrap());
        let answer = client.next().unwrap();
        assert_eq!(answer["id"], "half", "{answer}");
        let kind = answer["error"]["kind"].as_str().unwrap();
        assert!(
            kind == "invalid_request" || kind == "overloaded",
            "{answer}"
        );
        // What follows on the line is dropped; the next line is a request again. The end
        // of the line goes after all of it: on a slow machine the daemon may give up on
        // the line while its head is still being written.
        writing.join().unwrap();
        stream.write_all(b"xyz\n").unwrap();
        let again = client.ask(json!({"id": "after", "op": "health"}));
        assert_eq!(again["result"]["ok"], true, "{again}");
    }
    wait_until("the budget is given back", || {
        stats(&daemon)["input_bytes"].as_u64().unwrap() <= 64 << 10
    });
    assert!(stats(&daemon)["input_refused"].as_u64().unwrap() >= 3);
    // And a request larger than the allowance finds room again.
    let text = "y".repeat(100_000);
    let answer = connect(&daemon).ask(call("large", "echo", json!({ "text": text })));
    assert_eq!(answer["result"]["ok"], true, "{answer}");
}

#[test]
fn a_client_that_trickles_its_answers_out_is_disconnected_after_the_write_timeout() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let daemon = start(&["--write-timeout", "3s"]);
    // Two-megabyte answers taken 16 KiB a second: bytes keep moving, but one answer
    // would take two minutes, holding its share of the output budget all along.
    let mut trickle = connect(&daemon);
    for i in 0..8 {
        trickle.send(&call(i, "big", json!({})));
    }
    let mut chunk = [0u8; 16 << 10];
    let mut reads = 0;
    let closed = loop {
        match std::io::Read::read(&mut trickle.stream, &mut chunk) {
            Ok(0) | Err(_) => break true,
            Ok(_) => {}
        }
        reads += 1;
        // A hang guard, far beyond the write timeout: the daemon closes the connection
        // when the timeout ends, however slow the machine.
        if reads > 120 {
            break false;
        }
        std::thread::sleep(std::time::Duration::from_secs(1));
    };
    assert!(closed, "still connected after {reads} slow reads");
    assert!(stats(&daemon)["closed_unread"].as_u64().unwrap() >= 1);
    let answer = connect(&daemon).ask(json!({"id": "h", "op": "health"}));
    assert_eq!(answer["result"]["ok"], true, "{answer}");
}
