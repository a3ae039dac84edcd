//! Hostile-peer tests: every malformed, oversized, truncated or out-of-protocol input is a typed
//! error (never a panic, never an unbounded allocation).
// Test helpers outside `#[test]` fns are not covered by clippy.toml's allow-*-in-tests.
#![allow(clippy::unwrap_used, clippy::panic)]

mod common;

use std::io::Cursor;

use airlock_protocol::codec::{self, CodecError, MAX_FRAME_BYTES};
use airlock_protocol::frame::{FrameDecoder, FrameError, encode_frame, read_frame};
use airlock_protocol::{PROTOCOL_VERSION, SupervisorMessage, WorkerMessage};
use proptest::collection::vec;
use proptest::prelude::*;

/// bincode varint marker: a little-endian u64 follows.
const VARINT_U64: u8 = 0xFD;

fn frame(body: &[u8]) -> Vec<u8> {
    let mut out = u32::try_from(body.len()).unwrap().to_be_bytes().to_vec();
    out.extend_from_slice(body);
    out
}

fn varint_u64(value: u64) -> Vec<u8> {
    let mut out = vec![VARINT_U64];
    out.extend_from_slice(&value.to_le_bytes());
    out
}

/// Reads one frame both ways (blocking and incremental) and checks they agree.
fn read_worker_frame(bytes: &[u8]) -> Result<Option<WorkerMessage>, FrameError> {
    let blocking = read_frame::<_, WorkerMessage>(&mut Cursor::new(bytes.to_vec()));
    let mut decoder = FrameDecoder::new();
    let mut input = bytes;
    let incremental = decoder
        .decode_message::<WorkerMessage>(&mut input)
        .and_then(|message| match message {
            Some(message) => Ok(Some(message)),
            None => decoder.end_of_stream().map(|()| None),
        });
    assert_eq!(
        format!("{blocking:?}"),
        format!("{incremental:?}"),
        "read_frame and FrameDecoder disagree"
    );
    blocking
}

#[test]
fn length_prefix_of_4_gib_is_too_large() {
    let result = read_worker_frame(&[0xFF, 0xFF, 0xFF, 0xFF]);
    assert!(matches!(
        result,
        Err(FrameError::TooLarge {
            len: 0xFFFF_FFFF,
            max: MAX_FRAME_BYTES
        })
    ));
}

#[test]
fn length_prefix_one_above_the_maximum_is_too_large() {
    let prefix = u32::try_from(MAX_FRAME_BYTES + 1).unwrap().to_be_bytes();
    assert!(matches!(
        read_worker_frame(&prefix),
        Err(FrameError::TooLarge { len, .. }) if len == MAX_FRAME_BYTES + 1
    ));
}

#[test]
fn string_claiming_two_to_the_sixty_bytes_is_limit_exceeded() {
    // WorkerMessage::RunFailed (variant 5) whose message claims 2^60 bytes.
    let mut body = vec![5];
    body.extend(varint_u64(1 << 60));
    body.extend_from_slice(b"tiny");
    assert!(matches!(
        read_worker_frame(&frame(&body)),
        Err(FrameError::Codec(CodecError::LimitExceeded { .. }))
    ));
}

#[test]
fn vec_claiming_two_to_the_sixty_elements_is_a_typed_error() {
    // WorkerMessage::Ready (variant 1) whose namespaces claim 2^60 strings.
    let mut namespaces = vec![1];
    namespaces.extend(varint_u64(1 << 60));
    namespaces.extend_from_slice(&[1, b'x']);
    // WorkerMessage::Exited (variant 4), status Code(0), stdout claiming 2^60 bytes.
    let mut stdout = vec![4, 0, 0];
    stdout.extend(varint_u64(1 << 60));
    stdout.extend_from_slice(&[0; 8]);
    // A vec length of u64::MAX.
    let mut max_len = vec![1];
    max_len.extend(varint_u64(u64::MAX));
    for body in [namespaces, stdout, max_len] {
        let result = read_worker_frame(&frame(&body));
        assert!(
            matches!(
                result,
                Err(FrameError::Codec(
                    CodecError::UnexpectedEnd | CodecError::LimitExceeded { .. }
                ))
            ),
            "{result:?}"
        );
    }
}

#[test]
fn huge_seccomp_program_claim_in_setup_is_a_typed_error() {
    // SupervisorMessage::Setup (variant 1): empty profile and hostname, then mounts
    // claiming 2^60 operations.
    let mut body = vec![1, 0, 0];
    body.extend(varint_u64(1 << 60));
    body.push(0);
    let result = read_frame::<_, SupervisorMessage>(&mut Cursor::new(frame(&body)));
    assert!(
        matches!(
            result,
            Err(FrameError::Codec(
                CodecError::UnexpectedEnd | CodecError::LimitExceeded { .. }
            ))
        ),
        "{result:?}"
    );
}

#[test]
fn prefix_only_is_truncated() {
    let message = WorkerMessage::Hello {
        version: PROTOCOL_VERSION,
    };
    let bytes = encode_frame(&message).unwrap();
    assert!(matches!(
        read_worker_frame(&bytes[..4]),
        Err(FrameError::Truncated {
            expected: 6,
            received: 4
        })
    ));
}

#[test]
fn half_a_body_is_truncated() {
    let message = common::sample_worker_messages().remove(2);
    let bytes = encode_frame(&message).unwrap();
    let half = 4 + (bytes.len() - 4) / 2;
    assert!(matches!(
        read_worker_frame(&bytes[..half]),
        Err(FrameError::Truncated { expected, received }) if expected == bytes.len() && received == half
    ));
}

#[test]
fn partial_prefix_is_truncated() {
    assert!(matches!(
        read_worker_frame(&[0, 0, 1]),
        Err(FrameError::Truncated {
            expected: 4,
            received: 3
        })
    ));
}

#[test]
fn empty_input_is_a_clean_end_of_stream() {
    assert!(matches!(read_worker_frame(&[]), Ok(None)));
}

#[test]
fn empty_frame_is_an_unexpected_end() {
    assert!(matches!(
        read_worker_frame(&[0, 0, 0, 0]),
        Err(FrameError::Codec(CodecError::UnexpectedEnd))
    ));
}

#[test]
fn body_shorter_than_the_message_is_an_unexpected_end() {
    // RunFailed with a 5-byte message but only 2 bytes of it inside the frame.
    assert!(matches!(
        read_worker_frame(&frame(&[5, 5, b'a', b'b'])),
        Err(FrameError::Codec(CodecError::UnexpectedEnd))
    ));
}

#[test]
fn trailing_bytes_after_a_valid_message_are_rejected() {
    let message = WorkerMessage::Hello {
        version: PROTOCOL_VERSION,
    };
    let mut body = codec::encode(&message).unwrap();
    body.push(0);
    assert_eq!(
        codec::decode::<WorkerMessage>(&body),
        Err(CodecError::TrailingBytes {
            consumed: 2,
            len: 3
        })
    );
    assert!(matches!(
        read_worker_frame(&frame(&body)),
        Err(FrameError::Codec(CodecError::TrailingBytes {
            consumed: 2,
            len: 3
        }))
    ));
}

#[test]
fn unknown_message_variant_is_malformed() {
    for index in [6_u8, 250] {
        match read_worker_frame(&frame(&[index])) {
            Err(FrameError::Codec(CodecError::Malformed { reason })) => {
                assert!(reason.contains("variant"), "{reason}");
            }
            other => panic!("variant {index}: {other:?}"),
        }
    }
    assert!(matches!(
        codec::decode::<SupervisorMessage>(&[5]),
        Err(CodecError::Malformed { .. })
    ));
}

#[test]
fn unknown_nested_variant_is_malformed() {
    // WorkerMessage::Exited with ExitStatus variant 2 (only Code and Signal exist).
    assert!(matches!(
        read_worker_frame(&frame(&[4, 2, 0])),
        Err(FrameError::Codec(CodecError::Malformed { .. }))
    ));
    // WorkerMessage::Log with LogLevel variant 9.
    assert!(matches!(
        read_worker_frame(&frame(&[3, 9, 0])),
        Err(FrameError::Codec(CodecError::Malformed { .. }))
    ));
}

#[test]
fn invalid_option_tag_boolean_and_utf8_are_malformed() {
    // RunFailed { message: "", errno: tag 2 }.
    let option = [5, 0, 2];
    // Ready { namespaces: [], landlock_abi: 0, landlock_fully_enforced: 2, .. }.
    let boolean = [1, 0, 0, 2, 0];
    // Log { Info, message: invalid UTF-8 }.
    let utf8 = [3, 1, 2, 0xC3, 0x28];
    for body in [&option[..], &boolean, &utf8] {
        let result = read_worker_frame(&frame(body));
        assert!(
            matches!(result, Err(FrameError::Codec(CodecError::Malformed { .. }))),
            "{body:?}: {result:?}"
        );
    }
}

#[test]
fn hello_of_another_protocol_version_decodes_with_that_version() {
    // The receiver refuses another version itself, so decoding must hand it over intact
    // rather than fail or guess.
    let hello = encode_frame(&WorkerMessage::Hello {
        version: PROTOCOL_VERSION + 1,
    })
    .unwrap();
    let Ok(Some(message)) = read_worker_frame(&hello) else {
        panic!("hello must decode");
    };
    assert_eq!(
        message,
        WorkerMessage::Hello {
            version: PROTOCOL_VERSION + 1
        }
    );
}

#[test]
fn worker_message_sent_to_the_worker_side_does_not_decode_as_a_supervisor_message() {
    // A `Ready` frame read by a side expecting SupervisorMessage: variant 1 is Setup, whose
    // body then fails to parse; whatever happens it must be a typed error, not a panic.
    let ready = encode_frame(&common::sample_worker_messages().remove(2)).unwrap();
    let result = read_frame::<_, SupervisorMessage>(&mut Cursor::new(ready));
    assert!(matches!(result, Err(FrameError::Codec(_))), "{result:?}");
}

#[test]
fn valid_frame_followed_by_a_huge_prefix_yields_the_frame_then_too_large() {
    let mut stream = encode_frame(&SupervisorMessage::Shutdown).unwrap();
    stream.extend_from_slice(&[0xFF, 0xFF, 0xFF, 0xFF]);
    let mut decoder = FrameDecoder::new();
    let mut input = stream.as_slice();
    assert_eq!(
        decoder
            .decode_message::<SupervisorMessage>(&mut input)
            .unwrap(),
        Some(SupervisorMessage::Shutdown)
    );
    assert!(matches!(
        decoder.decode_message::<SupervisorMessage>(&mut input),
        Err(FrameError::TooLarge { .. })
    ));
}

fn is_typed_frame_result<T>(result: &Result<Option<T>, FrameError>) -> bool {
    match result {
        Ok(_) => true,
        Err(FrameError::TooLarge { .. } | FrameError::Truncated { .. } | FrameError::Codec(_)) => {
            true
        }
        Err(FrameError::Io { .. } | FrameError::Desynchronized) => false,
    }
}

proptest! {
    #[test]
    fn random_garbage_is_never_a_panic(garbage in vec(any::<u8>(), 0..256)) {
        let _ = codec::decode::<SupervisorMessage>(&garbage);
        let _ = codec::decode::<WorkerMessage>(&garbage);
        let result = read_frame::<_, SupervisorMessage>(&mut Cursor::new(garbage.clone()));
        prop_assert!(is_typed_frame_result(&result));
        let result = read_worker_frame(&garbage);
        prop_assert!(is_typed_frame_result(&result));
    }

    #[test]
    fn random_garbage_inside_a_well_formed_frame_is_a_typed_error_or_a_message(
        garbage in vec(any::<u8>(), 0..256),
    ) {
        let framed = frame(&garbage);
        let result = read_frame::<_, SupervisorMessage>(&mut Cursor::new(framed.clone()));
        prop_assert!(matches!(result, Ok(Some(_)) | Err(FrameError::Codec(_))));
        let result = read_worker_frame(&framed);
        prop_assert!(matches!(result, Ok(Some(_)) | Err(FrameError::Codec(_))));
    }

    #[test]
    fn flipping_one_byte_of_a_valid_frame_is_never_a_panic(
        index in 0_usize..10_000,
        value in any::<u8>(),
    ) {
        for message in common::sample_worker_messages() {
            let mut bytes = encode_frame(&message).unwrap();
            let at = index % bytes.len();
            bytes[at] = value;
            let result = read_worker_frame(&bytes);
            prop_assert!(is_typed_frame_result(&result));
        }
    }
}
