//! Property tests: every message round-trips through the codec, blocking framing, and the
//! incremental `FrameDecoder` fed in random chunk sizes.
// Test helpers outside `#[test]` fns are not covered by clippy.toml's allow-*-in-tests.
#![allow(clippy::unwrap_used, clippy::panic)]

mod common;

use std::io::Cursor;

use airlock_protocol::codec::{decode, encode};
use airlock_protocol::frame::{FrameDecoder, encode_frame, read_frame, write_frame};
use airlock_protocol::{SupervisorMessage, WorkerMessage};
use proptest::collection::vec;
use proptest::prelude::*;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Writes `messages` with `write_frame`, then reads them back with `read_frame` until EOF.
fn through_blocking_frames<T>(messages: &[T]) -> Vec<T>
where
    T: Serialize + DeserializeOwned,
{
    let mut stream = Vec::new();
    for message in messages {
        write_frame(&mut stream, message).unwrap();
    }
    let mut reader = Cursor::new(stream);
    let mut out = Vec::new();
    while let Some(message) = read_frame(&mut reader).unwrap() {
        out.push(message);
    }
    out
}

/// Feeds the concatenated frames of `messages` to a `FrameDecoder`, cycling through `chunks`
/// as the sizes of successive reads.
fn through_frame_decoder<T>(messages: &[T], chunks: &[usize]) -> Vec<T>
where
    T: Serialize + DeserializeOwned,
{
    let mut stream = Vec::new();
    for message in messages {
        stream.extend(encode_frame(message).unwrap());
    }
    let mut decoder = FrameDecoder::new();
    let mut out = Vec::new();
    let mut rest = stream.as_slice();
    for &size in chunks.iter().cycle() {
        if rest.is_empty() {
            break;
        }
        let (chunk, tail) = rest.split_at(size.min(rest.len()));
        rest = tail;
        let mut input = chunk;
        while let Some(message) = decoder.decode_message(&mut input).unwrap() {
            out.push(message);
        }
        assert!(input.is_empty(), "a partial frame consumes the whole chunk");
    }
    decoder.end_of_stream().unwrap();
    out
}

proptest! {
    #[test]
    fn supervisor_message_round_trips_through_codec(message in common::supervisor_message()) {
        let bytes = encode(&message).unwrap();
        prop_assert_eq!(decode::<SupervisorMessage>(&bytes).unwrap(), message);
    }

    #[test]
    fn worker_message_round_trips_through_codec(message in common::worker_message()) {
        let bytes = encode(&message).unwrap();
        prop_assert_eq!(decode::<WorkerMessage>(&bytes).unwrap(), message);
    }

    #[test]
    fn supervisor_messages_round_trip_through_blocking_frames(
        messages in vec(common::supervisor_message(), 0..6),
    ) {
        prop_assert_eq!(through_blocking_frames(&messages), messages);
    }

    #[test]
    fn worker_messages_round_trip_through_blocking_frames(
        messages in vec(common::worker_message(), 0..6),
    ) {
        prop_assert_eq!(through_blocking_frames(&messages), messages);
    }

    #[test]
    fn supervisor_messages_round_trip_through_frame_decoder_in_random_chunks(
        messages in vec(common::supervisor_message(), 0..6),
        chunks in vec(1_usize..40, 1..8),
    ) {
        prop_assert_eq!(through_frame_decoder(&messages, &chunks), messages);
    }

    #[test]
    fn worker_messages_round_trip_through_frame_decoder_in_random_chunks(
        messages in vec(common::worker_message(), 0..6),
        chunks in vec(1_usize..40, 1..8),
    ) {
        prop_assert_eq!(through_frame_decoder(&messages, &chunks), messages);
    }

    #[test]
    fn truncating_any_frame_is_reported_not_misread(
        message in common::worker_message(),
        cut_seed in any::<usize>(),
    ) {
        let frame = encode_frame(&message).unwrap();
        let cut = 1 + cut_seed % (frame.len() - 1);
        let mut reader = Cursor::new(frame[..cut].to_vec());
        let result = read_frame::<_, WorkerMessage>(&mut reader);
        let is_truncated = matches!(
            result,
            Err(airlock_protocol::FrameError::Truncated { received, .. }) if received == cut
        );
        prop_assert!(is_truncated);
    }
}

#[test]
fn sample_messages_round_trip() {
    let supervisor = common::sample_supervisor_messages();
    assert_eq!(through_blocking_frames(&supervisor), supervisor);
    assert_eq!(
        through_frame_decoder(&supervisor, &[1, 7, 1000]),
        supervisor
    );
    let worker = common::sample_worker_messages();
    assert_eq!(through_blocking_frames(&worker), worker);
    assert_eq!(through_frame_decoder(&worker, &[3, 1, 64]), worker);
}

/// Pins the wire format: a change here breaks every deployed worker of the other version,
/// so it must come with a `PROTOCOL_VERSION` bump.
#[test]
fn wire_format_of_hello_is_stable() {
    let hello = SupervisorMessage::Hello { version: 1 };
    assert_eq!(encode(&hello).unwrap(), [0, 1]);
    assert_eq!(encode_frame(&hello).unwrap(), [0, 0, 0, 2, 0, 1]);
    let run_failed = WorkerMessage::RunFailed {
        message: "x".into(),
        errno: Some(-1),
    };
    // variant 5, string len 1, 'x', Some, zigzag(-1) = 1.
    assert_eq!(encode(&run_failed).unwrap(), [5, 1, b'x', 1, 1]);
}
