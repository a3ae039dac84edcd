//! Session workspaces over the daemon: isolation between sessions, persistence across a
//! session's calls, an untouched base with exact `changes`, everything a tool plants kept
//! inside (symlinks, FIFOs, devices, setuid bits, hard links), nothing left after close,
//! and typed errors at every limit. How sessions end on their own is in `session_expiry`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use airlock_tests::daemon::Daemon;
use airlock_tests::{Scratch, sandbox_available};
use serde_json::{Value, json};

/// A policy whose `sh` tool runs a script in the session's workspace; bases under `bases`.
fn policy(bases: &Path) -> String {
    format!(
        r#"version = 1
[sessions]
bases = ["{}"]
max_sessions = 3
max_size = "4MiB"
max_inodes = 256

[profiles.default]
read = ["/usr"]
read_optional = ["/bin", "/lib", "/lib64", "/etc/ld.so.cache", "/etc/alternatives"]
tmpfs = {{ "/tmp" = "16MiB" }}
# airlock_tests::HANG_GUARD
limits = {{ timeout = "300s" }}
workspace = "/workspace"
workspace_size = "1MiB"
cwd = "/workspace"

[tools.sh]
description = "run a script in the workspace"
command = ["/bin/sh", "-c", "{{script}}"]
side_effect = "write"
concurrency_safe = true
input = {{ type = "object", properties = {{ script = {{ type = "string" }} }}, required = ["script"] }}
"#,
        bases.display()
    )
}

/// A daemon serving [`policy`], with its bases directory.
struct Fixture {
    daemon: Daemon,
    bases: Scratch,
}

impl Fixture {
    fn start() -> Self {
        let bases = Scratch::new("workspace-bases");
        let daemon = Daemon::start_with(&policy(&bases.0), &[]);
        Self { daemon, bases }
    }

    fn client(&self) -> Client {
        Client::connect(&self.daemon.socket)
    }

    /// The daemon's session state directory.
    fn state_dir(&self) -> PathBuf {
        let mut path = self.daemon.socket.clone().into_os_string();
        path.push(".sessions");
        PathBuf::from(path)
    }

    fn sessions_on_disk(&self) -> Vec<PathBuf> {
        std::fs::read_dir(self.state_dir())
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect()
    }
}

/// A JSON-lines client asking one question at a time.
struct Client {
    stream: UnixStream,
    reader: BufReader<UnixStream>,
}

impl Client {
    fn connect(socket: &Path) -> Self {
        let stream = UnixStream::connect(socket).unwrap();
        let reader = BufReader::new(stream.try_clone().unwrap());
        Self { stream, reader }
    }

    fn ask(&mut self, request: Value) -> Value {
        self.stream
            .write_all(format!("{request}\n").as_bytes())
            .unwrap();
        let mut line = String::new();
        self.reader.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap()
    }

    fn open(&mut self, fields: Value) -> Value {
        let mut request = json!({"id": 1, "op": "session_open"});
        for (k, v) in fields.as_object().unwrap() {
            request[k] = v.clone();
        }
        self.ask(request)
    }

    fn open_id(&mut self, fields: Value) -> String {
        let answer = self.open(fields);
        answer["result"]["session"]
            .as_str()
            .unwrap_or_else(|| panic!("no session in {answer}"))
            .to_string()
    }

    fn put(&mut self, session: &str, path: &str, content: &[u8]) -> Value {
        self.ask(
            json!({"id": 2, "op": "put_file", "session": session, "path": path,
            "content_base64": b64(content)}),
        )
    }

    fn get(&mut self, session: &str, path: &str) -> Value {
        self.ask(json!({"id": 3, "op": "get_file", "session": session, "path": path}))
    }

    fn get_bytes(&mut self, session: &str, path: &str) -> Vec<u8> {
        let answer = self.get(session, path);
        let text = answer["result"]["content_base64"]
            .as_str()
            .unwrap_or_else(|| panic!("get_file {path}: {answer}"));
        unb64(text)
    }

    fn sh(&mut self, session: &str, script: &str) -> Value {
        let answer = self.ask(
            json!({"id": 4, "op": "call", "tool": "sh", "session": session,
            "arguments": {"script": script}}),
        );
        answer["result"].clone()
    }

    fn changes(&mut self, session: &str) -> Value {
        self.ask(json!({"id": 5, "op": "changes", "session": session}))
    }

    fn close(&mut self, session: &str) -> Value {
        self.ask(json!({"id": 6, "op": "session_close", "session": session}))
    }
}

fn error_kind(answer: &Value) -> &str {
    answer["error"]["kind"].as_str().unwrap_or("")
}

/// How a session must hold a base at `base` here, where that is certain: a copy for an
/// unprivileged daemon; as root an overlay, whose idmapped lower layer needs a filesystem
/// that allows idmapped mounts (ext4, xfs, btrfs; tmpfs from Linux 6.3).
fn expected_view(base: &Path) -> Option<&'static str> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("copy");
    }
    let path = std::ffi::CString::new(base.display().to_string()).unwrap();
    // SAFETY: an all-zero statfs is a valid value of a plain C struct.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: statfs fills the struct it is given from a NUL-terminated path.
    assert_eq!(unsafe { libc::statfs(path.as_ptr(), &mut fs) }, 0);
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut version = release.trim().split(['.', '-']);
    let major: u32 = version.next().unwrap().parse().unwrap();
    let minor: u32 = version.next().unwrap().parse().unwrap();
    let idmaps_tmpfs = (major, minor) >= (6, 3);
    match fs.f_type {
        libc::EXT4_SUPER_MAGIC | libc::XFS_SUPER_MAGIC => Some("overlay"),
        libc::TMPFS_MAGIC if idmaps_tmpfs => Some("overlay"),
        libc::TMPFS_MAGIC => Some("copy"),
        _ => None,
    }
}

fn stdout(result: &Value) -> &str {
    result["stdout"].as_str().unwrap_or("")
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn b64(bytes: &[u8]) -> String {
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = (u32::from(chunk[0]) << 16)
            | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8)
            | u32::from(*chunk.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(B64[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn unb64(text: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for chunk in text.as_bytes().chunks(4) {
        let pad = chunk.iter().filter(|&&c| c == b'=').count();
        let mut n = 0u32;
        for &c in chunk {
            let v = if c == b'=' {
                0
            } else {
                B64.iter().position(|&a| a == c).unwrap() as u32
            };
            n = (n << 6) | v;
        }
        out.extend_from_slice(&[(n >> 16) as u8, (n >> 8) as u8, n as u8][..3 - pad]);
    }
    out
}

/// Every file under `dir` with its bytes (and symlinks with their targets), sorted.
fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let name = path.strip_prefix(dir).unwrap().display().to_string();
            if meta.is_dir() {
                stack.push(path.clone());
                out.push((name, b"<dir>".to_vec()));
            } else if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&path).unwrap();
                out.push((name, target.display().to_string().into_bytes()));
            } else if meta.is_file() {
                out.push((name, std::fs::read(&path).unwrap()));
            } else {
                // A FIFO or device: never opened (a FIFO would block).
                out.push((name, format!("<special {:o}>", meta.mode()).into_bytes()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn two_sessions_side_by_side_see_only_their_own_files() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let fixture = Fixture::start();
    let mut client = fixture.client();
    let a = client.open_id(json!({}));
    let b = client.open_id(json!({}));
    assert_ne!(a, b);
    assert!(a.len() >= 32, "ids carry 128 random bits: {a}");
    assert!(
        client
            .put(&a, "secret.txt", b"only a")
            .get("result")
            .is_some()
    );
    let in_b = client.sh(
        &b,
        "ls -A /workspace; cat /workspace/secret.txt; echo b > mine.txt",
    );
    assert_eq!(stdout(&in_b), "", "{in_b}");
    assert_eq!(error_kind(&client.get(&b, "secret.txt")), "invalid_request");
    let in_a = client.sh(&a, "cat secret.txt; ls -A");
    assert_eq!(stdout(&in_a), "only asecret.txt\n", "{in_a}");
    // A made-up id is no session at all, for calls and file ops alike.
    let forged = "0".repeat(32);
    let refused = client.sh(&forged, "true");
    assert_eq!(refused["error"]["kind"], "session_unknown", "{refused}");
    assert_eq!(
        error_kind(&client.get(&forged, "secret.txt")),
        "session_unknown"
    );
    // A call of a workspace profile naming no session is refused, not run without one.
    let bare =
        client.ask(json!({"id": 7, "op": "call", "tool": "sh", "arguments": {"script": "true"}}));
    assert_eq!(bare["result"]["error"]["kind"], "session_unknown", "{bare}");
}

#[test]
fn a_file_written_in_one_call_is_read_by_the_next() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let fixture = Fixture::start();
    let mut client = fixture.client();
    let s = client.open_id(json!({}));
    let first = client.sh(&s, "mkdir -p src && echo hello > src/note.txt");
    assert_eq!(first["ok"], true, "{first}");
    let second = client.sh(&s, "cat src/note.txt");
    assert_eq!(stdout(&second), "hello\n", "{second}");
    assert_eq!(client.get_bytes(&s, "src/note.txt"), b"hello\n");
    client.put(&s, "src/from-client.txt", b"\x00\xffbinary");
    let third = client.sh(&s, "od -An -tx1 src/from-client.txt | tr -d ' \\n'");
    assert_eq!(stdout(&third), "00ff62696e617279", "{third}");
    let changes = client.changes(&s);
    assert_eq!(
        changes["result"]["changes"],
        json!([
            {"path": "src/from-client.txt", "kind": "added", "size": 8},
            {"path": "src/note.txt", "kind": "added", "size": 6},
        ]),
        "{changes}"
    );
}

#[test]
fn the_base_is_never_modified_and_changes_lists_exactly_the_edits() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let fixture = Fixture::start();
    let base = fixture.bases.0.join("repo");
    std::fs::create_dir_all(base.join("sub")).unwrap();
    std::fs::write(base.join("edit.txt"), "before\n").unwrap();
    std::fs::write(base.join("delete.txt"), "doomed\n").unwrap();
    std::fs::write(base.join("sub/keep.txt"), "kept\n").unwrap();
    std::os::unix::fs::symlink("sub/keep.txt", base.join("link")).unwrap();
    let before = snapshot(&base);

    let mut client = fixture.client();
    let opened = client.open(json!({"base": base.display().to_string()}));
    let view = opened["result"]["isolation"].as_str().unwrap_or_default();
    if let Some(expected) = expected_view(&base) {
        assert_eq!(view, expected, "{opened}");
    }
    let s = opened["result"]["session"].as_str().unwrap().to_string();
    let seen = client.sh(&s, "cat edit.txt sub/keep.txt link");
    assert_eq!(stdout(&seen), "before\nkept\nkept\n", "{seen}");
    assert_eq!(seen["isolation"]["workspace"], view, "{seen}");
    let edit = client.sh(
        &s,
        "echo after > edit.txt && rm delete.txt && echo new > sub/new.txt",
    );
    assert_eq!(edit["ok"], true, "{edit}");

    assert_eq!(snapshot(&base), before, "the host base changed");
    let changes = client.changes(&s);
    assert_eq!(
        changes["result"]["changes"],
        json!([
            {"path": "delete.txt", "kind": "deleted", "size": 0},
            {"path": "edit.txt", "kind": "modified", "size": 6},
            {"path": "sub/new.txt", "kind": "added", "size": 4},
        ]),
        "{changes}"
    );
    // A base outside the policy's bases is refused, however it is spelled.
    let outside = client.open(json!({"base": "/etc"}));
    assert_eq!(error_kind(&outside), "invalid_request", "{outside}");
    let escape = fixture.bases.0.join("escape");
    std::os::unix::fs::symlink("/etc", &escape).unwrap();
    let linked = client.open(json!({"base": escape.display().to_string()}));
    assert_eq!(error_kind(&linked), "invalid_request", "{linked}");
    let dotted = format!("{}/../../etc", base.display());
    assert_eq!(
        error_kind(&client.open(json!({"base": dotted}))),
        "invalid_request"
    );
}

#[test]
fn sessions_over_one_base_keep_their_writes_apart_and_the_base_untouched() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let fixture = Fixture::start();
    let base = fixture.bases.0.join("shared");
    std::fs::create_dir_all(base.join("src")).unwrap();
    std::fs::write(base.join("src/main.c"), "int main;\n").unwrap();
    std::fs::write(base.join("theirs.txt"), "another owner's\n").unwrap();
    // Unprivileged, the file stays ours (the check of another owner's file is root's).
    let _ = std::os::unix::fs::chown(base.join("theirs.txt"), Some(4321), Some(4321));
    let fifo = std::ffi::CString::new(base.join("pipe").display().to_string()).unwrap();
    // SAFETY: mkfifo on a NUL-terminated path we own.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o666) }, 0);
    // The host's end of the base's FIFO, open before any call: nothing a tool writes to
    // its workspace's `pipe` may arrive here.
    let host_end = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(base.join("pipe"))
        .unwrap();
    let before = snapshot(&base);

    let mut client = fixture.client();
    let opened = client.open(json!({"base": base.display().to_string(), "size": "256KiB"}));
    let view = opened["result"]["isolation"].as_str().unwrap().to_string();
    if let Some(expected) = expected_view(&base) {
        assert_eq!(view, expected, "{opened}");
    }
    let a = opened["result"]["session"].as_str().unwrap().to_string();
    let b = client.open_id(json!({"base": base.display().to_string()}));
    let edit = client.sh(
        &a,
        "echo 'int main(void) { return 0; }' > src/main.c && ln src/main.c hard && \
         rm -rf src/gone; mkdir -p build && echo obj > build/main.o",
    );
    assert_eq!(edit["ok"], true, "{edit}");
    let other = client.sh(&b, "cat src/main.c; ls -A");
    assert_eq!(
        stdout(&other),
        "int main;\npipe\nsrc\ntheirs.txt\n"
            .replace("pipe\n", if view == "overlay" { "pipe\n" } else { "" }),
        "{other}"
    );
    // The FIFO the tool sees is not the host's.
    if view == "overlay" {
        let wrote = client.sh(&a, "exec 3<>pipe; echo leaked >&3; echo done");
        assert_eq!(stdout(&wrote), "done\n", "{wrote}");
        let mut buf = [0u8; 16];
        let read = std::io::Read::read(&mut &host_end, &mut buf);
        assert!(
            matches!(&read, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
                || matches!(read, Ok(0)),
            "{read:?}"
        );
        // Another owner's file is read-only to tools, as on the host.
        let theirs = client.sh(&a, "cat theirs.txt; echo x >> theirs.txt || echo refused");
        assert_eq!(stdout(&theirs), "another owner's\nrefused\n", "{theirs}");
        // Writes are bounded by the session's size, copy-ups too.
        let filled = client.sh(&a, "head -c 400000 /dev/zero > fill");
        assert_eq!(filled["error"]["kind"], "workspace_full", "{filled}");
        client.sh(&a, "rm -f fill");
    }
    assert_eq!(snapshot(&base), before, "the host base changed");
    let changes = client.changes(&a);
    assert_eq!(
        changes["result"]["changes"],
        json!([
            {"path": "build/main.o", "kind": "added", "size": 4},
            {"path": "hard", "kind": "added", "size": 29},
            {"path": "src/main.c", "kind": "modified", "size": 29},
        ]),
        "{changes}"
    );
    assert_eq!(client.changes(&b)["result"]["changes"], json!([]));

    // Closing takes every mount of the session with it: the overlay, its lower layer and
    // the session's tmpfs.
    let on_disk = fixture.sessions_on_disk();
    client.close(&a);
    client.close(&b);
    assert!(fixture.sessions_on_disk().is_empty());
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    for dir in on_disk {
        assert!(
            !mountinfo.contains(&dir.display().to_string()),
            "{mountinfo}"
        );
    }
    assert_eq!(snapshot(&base), before, "the host base changed");
}

#[test]
fn what_a_tool_plants_stays_inside_its_session() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let fixture = Fixture::start();
    let mut client = fixture.client();
    let s = client.open_id(json!({}));
    let plant = client.sh(
        &s,
        "ln -s /etc/passwd passwd; ln -s /etc etc; ln -s .. up; mkfifo fifo; \
         mkdir dir; echo inside > dir/file",
    );
    assert_eq!(plant["ok"], true, "{plant}");
    // get_file follows no symlink, opens nothing but a regular file, and never blocks on
    // a FIFO (the answer coming back at all is the proof).
    for path in ["passwd", "etc/passwd", "up/anything", "fifo", "dir"] {
        let answer = client.get(&s, path);
        assert_eq!(error_kind(&answer), "invalid_request", "{path}: {answer}");
    }
    assert_eq!(client.get_bytes(&s, "dir/file"), b"inside\n");
    // put_file writes through no symlink either, and names nothing outside.
    for path in [
        "etc/airlock-planted",
        "passwd",
        "up/x",
        "../x",
        "/etc/x",
        "a//b",
        "./a",
        "",
    ] {
        let answer = client.put(&s, path, b"x");
        assert_eq!(error_kind(&answer), "invalid_request", "{path}: {answer}");
    }
    assert!(!Path::new("/etc/airlock-planted").exists());
    // The workspace is nosuid and nodev, and no host file can be hard-linked into it.
    let mounts = client.sh(&s, "grep ' /workspace ' /proc/self/mountinfo");
    let line = stdout(&mounts);
    assert!(
        line.contains("nosuid") && line.contains("nodev"),
        "{mounts}"
    );
    let link = client.sh(&s, "ln /usr/bin/env hard 2>/dev/null; ls -A");
    assert!(!stdout(&link).lines().any(|l| l == "hard"), "{link}");
    let device = client.sh(&s, "mknod null c 1 3 2>/dev/null; ls -A");
    assert!(!stdout(&device).lines().any(|l| l == "null"), "{device}");
}

#[test]
fn close_leaves_no_mount_directory_or_session() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let fixture = Fixture::start();
    let mut client = fixture.client();
    let s = client.open_id(json!({}));
    let ran = client.sh(&s, "mkdir -p a/b && echo x > a/b/c && chmod 000 a/b a .");
    assert_eq!(ran["ok"], true, "{ran}");
    let on_disk = fixture.sessions_on_disk();
    assert_eq!(on_disk.len(), 1);
    let closed = client.close(&s);
    assert_eq!(closed["result"]["closed"], true, "{closed}");
    assert!(fixture.sessions_on_disk().is_empty());
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mountinfo.contains(&on_disk[0].display().to_string()));
    assert_eq!(error_kind(&client.changes(&s)), "session_unknown");
    assert_eq!(error_kind(&client.close(&s)), "session_unknown");
}

#[test]
fn limits_are_typed_errors() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let fixture = Fixture::start();
    let mut client = fixture.client();
    let s = client.open_id(json!({"size": "64KiB"}));
    let big = vec![7u8; 100 << 10];
    assert_eq!(error_kind(&client.put(&s, "big", &big)), "workspace_full");
    // A tool that fills the workspace gets ENOSPC (as root: a tmpfs of that size; else
    // the overshoot is counted after the call), and the call is a typed workspace_full.
    let filled = client.sh(&s, "head -c 200000 /dev/zero > fill");
    assert_eq!(filled["error"]["kind"], "workspace_full", "{filled}");
    let too_big = client.open(json!({"size": "5MiB"}));
    assert_eq!(error_kind(&too_big), "invalid_request", "{too_big}");
    client.open_id(json!({}));
    client.open_id(json!({}));
    let fourth = client.open(json!({}));
    assert_eq!(error_kind(&fourth), "session_limit", "{fourth}");
    client.close(&s);
    client.open_id(json!({}));
}

/// A validator for one definition of the daemon's published schema.
fn schema_of(definition: &str) -> jsonschema::Validator {
    let root: Value = serde_json::from_str(airlock::daemon::PROTOCOL_SCHEMA).unwrap();
    let schema = json!({
        "$schema": root["$schema"],
        "$defs": root["$defs"],
        "$ref": format!("#/$defs/{definition}"),
    });
    jsonschema::validator_for(&schema).unwrap()
}

#[test]
fn every_session_answer_matches_the_published_schema() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let fixture = Fixture::start();
    let mut client = fixture.client();
    let requests = schema_of("request");
    let answers = schema_of("answer");
    let check = |client: &mut Client, request: Value| -> Value {
        let op = request["op"].as_str().unwrap().to_string();
        let refused: Vec<String> = requests
            .iter_errors(&request)
            .map(|e| e.to_string())
            .collect();
        assert!(refused.is_empty(), "{request}: {refused:?}");
        let answer = client.ask(request.clone());
        for validator in [&answers, &schema_of(&format!("answers/properties/{op}"))] {
            let found: Vec<String> = validator
                .iter_errors(&answer)
                .map(|e| e.to_string())
                .collect();
            assert!(found.is_empty(), "{request} -> {answer}: {found:?}");
        }
        answer
    };
    let opened = check(
        &mut client,
        json!({"id": 1, "op": "session_open", "size": 65536}),
    );
    let s = opened["result"]["session"].as_str().unwrap().to_string();
    check(
        &mut client,
        json!({"id": 2, "op": "put_file", "session": s, "path": "a/b.txt", "content_base64": "aGk="}),
    );
    let got = check(
        &mut client,
        json!({"id": 3, "op": "get_file", "session": s, "path": "a/b.txt"}),
    );
    assert_eq!(got["result"], json!({"content_base64": "aGk=", "size": 2}));
    check(&mut client, json!({"id": 4, "op": "changes", "session": s}));
    let set = check(
        &mut client,
        json!({"id": 41, "op": "session_set", "session": s, "plan_mode": true}),
    );
    assert_eq!(set["result"]["plan_mode"], true, "{set}");
    let stats = client.ask(json!({"id": "s", "op": "stats"}));
    assert_eq!(stats["result"]["sessions_open"], 1, "{stats}");
    let full = check(
        &mut client,
        json!({"id": 5, "op": "put_file", "session": s, "path": "big",
        "content_base64": b64(&vec![0u8; 70_000])}),
    );
    assert_eq!(error_kind(&full), "workspace_full");
    check(
        &mut client,
        json!({"id": 6, "op": "session_close", "session": s}),
    );
    let gone = check(&mut client, json!({"id": 7, "op": "changes", "session": s}));
    assert_eq!(error_kind(&gone), "session_unknown");
    // What the schema refuses, the daemon refuses too.
    for bad in [
        json!({"id": 8, "op": "get_file", "session": s, "path": "../x"}),
        json!({"id": 9, "op": "get_file", "session": s, "path": "/etc/passwd"}),
        json!({"id": 10, "op": "session_open", "extra": true}),
    ] {
        assert!(
            requests.iter_errors(&bad).next().is_some(),
            "the schema takes {bad}"
        );
        let answer = client.ask(bad.clone());
        assert_eq!(error_kind(&answer), "invalid_request", "{answer}");
    }
}

#[test]
fn a_base_is_taken_without_following_links_opening_fifos_or_honouring_setuid() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let fixture = Fixture::start();
    let base = fixture.bases.0.join("odd");
    std::fs::create_dir_all(&base).unwrap();
    std::os::unix::fs::symlink("/etc/shadow", base.join("shadow")).unwrap();
    let fifo = std::ffi::CString::new(base.join("pipe").display().to_string()).unwrap();
    // SAFETY: mkfifo on a NUL-terminated path we own.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    std::fs::write(base.join("suid"), "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(base.join("suid"), std::fs::Permissions::from_mode(0o4755)).unwrap();
    let before = snapshot(&base);

    let mut client = fixture.client();
    let opened = client.open(json!({"base": base.display().to_string()}));
    let s = opened["result"]["session"].as_str().unwrap().to_string();
    let listed = client.sh(&s, "ls -A; stat -c %a suid; readlink shadow");
    // A copy leaves the FIFO out and drops the setuid bit; an overlay shows both as they
    // are, on a nosuid mount, the FIFO an inode of the overlay's (below).
    let expected = match opened["result"]["isolation"].as_str() {
        Some("overlay") => "pipe\nshadow\nsuid\n4755\n/etc/shadow\n",
        _ => "shadow\nsuid\n755\n/etc/shadow\n",
    };
    assert_eq!(stdout(&listed), expected, "{listed}");
    assert_eq!(error_kind(&client.get(&s, "pipe")), "invalid_request");
    assert_eq!(error_kind(&client.get(&s, "shadow")), "invalid_request");
    let changes = client.changes(&s);
    assert_eq!(changes["result"]["changes"], json!([]), "{changes}");
    assert_eq!(snapshot(&base), before);

    // A base larger than the workspace: a copy is refused whole and leaves nothing
    // behind; under an overlay only what the session writes counts, so a tool may read it
    // all, and copying it up (a write) is what overflows.
    let big = fixture.bases.0.join("big");
    std::fs::create_dir_all(&big).unwrap();
    std::fs::write(big.join("blob"), vec![1u8; 200 << 10]).unwrap();
    let on_disk = fixture.sessions_on_disk().len();
    let opened = client.open(json!({"base": big.display().to_string(), "size": "64KiB"}));
    if opened["result"]["isolation"] == "overlay" {
        let s = opened["result"]["session"].as_str().unwrap().to_string();
        let read = client.sh(&s, "wc -c < blob");
        assert_eq!(stdout(&read), "204800\n", "{read}");
        // The kernel refuses the copy-up and keeps nothing of it, so the workspace is not
        // full afterwards: the tool's own failure is what the call reports.
        let grown = client.sh(&s, "echo more >> blob");
        assert_eq!(grown["ok"], false, "{grown}");
        assert!(
            grown["stderr"]
                .as_str()
                .unwrap()
                .contains("No space left on device"),
            "{grown}"
        );
        assert_eq!(stdout(&client.sh(&s, "wc -c < blob")), "204800\n");
        client.close(&s);
    } else {
        assert_eq!(error_kind(&opened), "workspace_full", "{opened}");
    }
    assert_eq!(fixture.sessions_on_disk().len(), on_disk);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_library_gate_runs_calls_in_sessions_and_other_calls_as_before() {
    let _guard = airlock_tests::shared();
    if !sandbox_available() {
        return;
    }
    let scratch = Scratch::new("workspace-library");
    let text = format!(
        "{}\n[profiles.plain]\nread = [\"/usr\"]\nread_optional = [\"/bin\", \"/lib\", \"/lib64\"]\n\
         [tools.plain]\ndescription = \"d\"\nprofile = \"plain\"\ncommand = [\"/bin/echo\", \"plain\"]\n\
         side_effect = \"read\"\ninput = {{ type = \"object\" }}\n",
        policy(&scratch.0)
    );
    let policy = airlock_policy::load_policy_str(&text, "p.toml")
        .unwrap()
        .policy;
    let bounds = policy.sessions.clone();
    let supervisor = Arc::new(airlock_tests::supervisor());
    let call = |tool: &str, script: &str| airlock::ToolCall {
        call_id: "c".into(),
        tool: tool.into(),
        arguments: json!({"script": script}).to_string(),
    };
    let in_session = |session: &str| airlock::CallOptions {
        session: Some(session.into()),
        ..Default::default()
    };

    // A gate serving no sessions refuses a workspace tool, and runs the others.
    let bare = airlock::Gate::new(Arc::clone(&supervisor), policy.clone());
    let refused = bare.call(&call("sh", "true"), &in_session("any")).await;
    assert_eq!(
        refused.error.map(|e| e.kind),
        Some(airlock::ErrorKind::SessionUnknown)
    );
    let plain = bare
        .call(&call("plain", ""), &airlock::CallOptions::default())
        .await;
    assert!(plain.ok, "{plain:?}");

    let sessions = Arc::new(
        airlock::Sessions::new(
            &scratch.0.join("sessions"),
            supervisor.sandbox_ids(),
            Arc::new(airlock::gate::SystemClock),
        )
        .unwrap(),
    );
    let gate =
        airlock::Gate::new(Arc::clone(&supervisor), policy).with_sessions(Arc::clone(&sessions));
    let opened = sessions.open(&bounds, None, None, 1 << 20).unwrap();
    assert_eq!(opened.isolation, "empty");
    let wrote = gate
        .call(
            &call("sh", "echo from-call > f"),
            &in_session(&opened.session),
        )
        .await;
    assert!(wrote.ok, "{wrote:?}");
    assert_eq!(
        sessions.get_file(&bounds, &opened.session, "f").unwrap(),
        b"from-call\n"
    );
    let changes = sessions.changes(&bounds, &opened.session).unwrap();
    assert_eq!(changes.len(), 1);
    assert_eq!(changes[0].kind, airlock::session::ChangeKind::Added);
    sessions.close(&opened.session).unwrap();
    assert_eq!(sessions.count(), 0);
    supervisor.close().await;
}
