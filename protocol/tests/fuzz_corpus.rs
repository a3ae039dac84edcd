//! Keeps the committed seed corpus of the `decode_frame` fuzz target (fuzz/corpus/decode_frame)
//! valid: regenerate it with
//! `cargo test -p airlock-protocol --test fuzz_corpus -- --ignored`.
//!
//! Each file is a byte stream of frames in one direction; the name says which
//! (`supervisor-*` or `worker-*`).
// Test helpers outside `#[test]` fns are not covered by clippy.toml's allow-*-in-tests.
#![allow(clippy::unwrap_used, clippy::panic)]

mod common;

use std::path::PathBuf;

use airlock_protocol::frame::{FrameDecoder, encode_frame};
use airlock_protocol::{SupervisorMessage, WorkerMessage};
use serde::Serialize;

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/decode_frame")
}

fn stream_of<T: Serialize>(messages: &[T]) -> Vec<u8> {
    messages
        .iter()
        .flat_map(|message| encode_frame(message).unwrap())
        .collect()
}

/// (file name, bytes) of every seed.
fn seeds() -> Vec<(String, Vec<u8>)> {
    let supervisor = common::sample_supervisor_messages();
    let worker = common::sample_worker_messages();
    let mut seeds = Vec::new();
    for (i, message) in supervisor.iter().enumerate() {
        let name = format!("supervisor-{i}-{}.bin", message.name().to_lowercase());
        seeds.push((name, encode_frame(message).unwrap()));
    }
    for (i, message) in worker.iter().enumerate() {
        let name = format!("worker-{i}-{}.bin", message.name().to_lowercase());
        seeds.push((name, encode_frame(message).unwrap()));
    }
    seeds.push(("supervisor-conversation.bin".into(), stream_of(&supervisor)));
    seeds.push(("worker-conversation.bin".into(), stream_of(&worker)));
    seeds
}

fn decode_stream<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Vec<T> {
    let mut decoder = FrameDecoder::new();
    let mut input = bytes;
    let mut out = Vec::new();
    while let Some(message) = decoder.decode_message(&mut input).unwrap() {
        out.push(message);
    }
    decoder.end_of_stream().unwrap();
    out
}

#[test]
#[ignore = "writes fuzz/corpus/decode_frame; run by hand after a protocol change"]
fn regenerate_decode_frame_corpus() {
    let dir = corpus_dir();
    std::fs::create_dir_all(&dir).unwrap();
    for (name, bytes) in seeds() {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}

#[test]
fn committed_decode_frame_corpus_matches_the_current_encoding() {
    for (name, bytes) in seeds() {
        let path = corpus_dir().join(&name);
        let committed = std::fs::read(&path)
            .unwrap_or_else(|e| panic!("{}: {e}; regenerate the corpus", path.display()));
        assert_eq!(committed, bytes, "{name} is stale; regenerate the corpus");
        if name.starts_with("supervisor-") {
            assert!(!decode_stream::<SupervisorMessage>(&committed).is_empty());
        } else {
            assert!(!decode_stream::<WorkerMessage>(&committed).is_empty());
        }
    }
}
