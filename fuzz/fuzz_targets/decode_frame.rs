//! Fuzz target: arbitrary bytes as a stream from a hostile peer, through every decoding path.
//!
//! Checks that nothing panics or aborts, that `FrameDecoder` (whole input and in chunks) and
//! the blocking `read_frame_bytes` agree frame for frame and on how the stream ends, that no
//! frame exceeds the maximum, and that every message that decodes re-encodes to the same
//! value. Seeds: `corpus/decode_frame/*.bin` (kept current by protocol/tests/fuzz_corpus.rs,
//! except the hand-assembled `mixed-*.bin`).
#![no_main]

use std::io::Cursor;

use airlock_protocol::codec;
use airlock_protocol::frame::{FrameDecoder, read_frame_bytes};
use airlock_protocol::{SupervisorMessage, WorkerMessage};
use libfuzzer_sys::fuzz_target;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// A small maximum so oversized prefixes are common in fuzz inputs.
const MAX_FRAME: usize = 1024;

/// Read sizes cycled through by the chunked decoder; the rotation depends on the input.
const CHUNK_SIZES: [usize; 8] = [1, 2, 3, 5, 8, 13, 64, 1024];

/// Frames in order, then how the stream ended (`Debug` of the final result).
type Outcome = (Vec<Vec<u8>>, String);

fn via_decoder(data: &[u8], chunked: bool) -> Outcome {
    let mut decoder = FrameDecoder::with_max_frame_bytes(MAX_FRAME);
    let mut frames = Vec::new();
    let rotation = data.len() % CHUNK_SIZES.len();
    let mut sizes = CHUNK_SIZES.iter().cycle().skip(rotation);
    let mut rest = data;
    while !rest.is_empty() {
        let size = if chunked {
            sizes.next().copied().unwrap_or(1)
        } else {
            rest.len()
        };
        let (chunk, tail) = rest.split_at(size.min(rest.len()));
        rest = tail;
        let mut input = chunk;
        loop {
            match decoder.decode_frame(&mut input) {
                Ok(Some(frame)) => frames.push(frame),
                Ok(None) => break,
                Err(error) => return (frames, format!("{:?}", Err::<(), _>(error))),
            }
        }
        assert!(input.is_empty(), "decoder left input unconsumed mid-frame");
    }
    (frames, format!("{:?}", decoder.end_of_stream()))
}

fn via_reader(data: &[u8]) -> Outcome {
    let mut reader = Cursor::new(data);
    let mut frames = Vec::new();
    loop {
        match read_frame_bytes(&mut reader, MAX_FRAME) {
            Ok(Some(frame)) => frames.push(frame),
            Ok(None) => return (frames, format!("{:?}", Ok::<(), ()>(()))),
            Err(error) => return (frames, format!("{:?}", Err::<(), _>(error))),
        }
    }
}

/// Decodes `bytes` as a `T`; on success, the value must survive a re-encode.
fn check_message<T>(bytes: &[u8]) -> Option<T>
where
    T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let message = codec::decode::<T>(bytes).ok()?;
    let encoded = codec::encode(&message).expect("a decoded message re-encodes");
    let again = codec::decode::<T>(&encoded).expect("a re-encoded message decodes");
    assert_eq!(again, message);
    Some(message)
}

fuzz_target!(|data: &[u8]| {
    // The codec alone, on the raw input.
    let _ = check_message::<SupervisorMessage>(data);
    let _ = check_message::<WorkerMessage>(data);

    // Framing: three ways of reading the same stream must agree.
    let whole = via_decoder(data, false);
    let chunked = via_decoder(data, true);
    let blocking = via_reader(data);
    assert_eq!(whole, chunked, "chunking changed the framing");
    assert_eq!(
        whole, blocking,
        "FrameDecoder and read_frame_bytes disagree"
    );

    // Every frame, as either direction.
    for frame in &whole.0 {
        assert!(frame.len() <= MAX_FRAME);
        let _ = check_message::<SupervisorMessage>(frame);
        let _ = check_message::<WorkerMessage>(frame);
    }
});
