//! The one bincode codec: turns a message into frame-body bytes and back, with hard size limits.
//!
//! This is the only module that names `bincode` (pinned `=2.0.1`; unmaintained upstream,
//! RUSTSEC-2025-0141), so replacing the codec touches this file alone. No bincode type
//! appears in the public API: errors are mapped to [`CodecError`].
//!
//! Safety rules, from the crate research (reference/crates.md, Q1):
//!
//! - The config is `standard().with_limit::<MAX_FRAME_BYTES>()`. Without a limit, bincode 2
//!   preallocates whatever a length field claims *before* reading any data, and a 10-byte
//!   input claiming 2^40 elements aborts the process (bincode-org/bincode#764). With the
//!   limit, every container claims its size against the budget first and fails with a typed
//!   error instead.
//! - Decoding is from a complete slice only, never from a reader, and the slice must be
//!   consumed exactly: bincode itself ignores trailing bytes.
//! - The serde path is used throughout (the message types derive only serde traits), so
//!   bincode stays out of `message` and `spec`.
//!
//! The decode budget counts *in-memory* bytes, not wire bytes (bincode-org/bincode#735): a
//! `u64` costs 8 bytes of budget even when its varint is 1 byte on the wire. A message whose
//! encoding fits in [`MAX_FRAME_BYTES`] but sits right at the cap can therefore still be
//! refused on decode with [`CodecError::LimitExceeded`]. Keep bulk payloads (tool output)
//! well below the cap; ordinary messages are nowhere near it.

use bincode::config::{Configuration, Limit, LittleEndian, Varint};
use bincode::enc::write::Writer;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Largest encoded message, in bytes (16 MiB); also the bincode decode budget.
pub const MAX_FRAME_BYTES: usize = 16 * 1024 * 1024;

/// The wire configuration: bincode's standard (little-endian, varint) with the byte limit.
type WireConfig = Configuration<LittleEndian, Varint, Limit<MAX_FRAME_BYTES>>;

fn wire_config() -> WireConfig {
    bincode::config::standard().with_limit::<MAX_FRAME_BYTES>()
}

/// Why a message could not be encoded or decoded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CodecError {
    /// The encoding (or the input to decode) is larger than the limit.
    #[error("message is {len} bytes, more than the {max}-byte limit")]
    TooLarge {
        /// Length of the encoding or input, in bytes.
        len: usize,
        /// The limit, in bytes.
        max: usize,
    },
    /// The value could not be encoded (for example a serde attribute bincode cannot express).
    #[error("failed to encode message: {reason}")]
    Encode {
        /// What the encoder reported.
        reason: String,
    },
    /// The input ended in the middle of a value.
    #[error("message ended before it was complete")]
    UnexpectedEnd,
    /// A length field claimed more memory than the decode budget allows.
    #[error("message claims more than the {limit}-byte decode budget")]
    LimitExceeded {
        /// The decode budget, in bytes.
        limit: usize,
    },
    /// A valid message was followed by extra bytes.
    #[error("message has trailing bytes: decoded {consumed} of {len} bytes")]
    TrailingBytes {
        /// Bytes the message used.
        consumed: usize,
        /// Bytes in the input.
        len: usize,
    },
    /// The bytes are not a valid encoding of the expected type (unknown enum variant,
    /// invalid UTF-8, a boolean that is not 0 or 1, ...).
    #[error("malformed message: {reason}")]
    Malformed {
        /// What the decoder reported.
        reason: String,
    },
}

/// Encodes `value` into a fresh buffer, refusing encodings larger than [`MAX_FRAME_BYTES`].
///
/// Memory stays bounded even for a huge value: bytes past the limit are counted, not stored.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, CodecError> {
    encode_with_max(value, MAX_FRAME_BYTES)
}

/// Like [`encode`] with a smaller limit; `max` above [`MAX_FRAME_BYTES`] is clamped to it.
pub fn encode_with_max<T: Serialize + ?Sized>(
    value: &T,
    max: usize,
) -> Result<Vec<u8>, CodecError> {
    let max = max.min(MAX_FRAME_BYTES);
    let mut writer = BoundedVecWriter {
        buf: Vec::new(),
        len: 0,
        max,
    };
    bincode::serde::encode_into_writer(value, &mut writer, wire_config()).map_err(|e| {
        CodecError::Encode {
            reason: e.to_string(),
        }
    })?;
    if writer.len > max {
        return Err(CodecError::TooLarge {
            len: writer.len,
            max,
        });
    }
    Ok(writer.buf)
}

/// Decodes one `T` from `bytes`, which must hold exactly one encoding and nothing else.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    if bytes.len() > MAX_FRAME_BYTES {
        return Err(CodecError::TooLarge {
            len: bytes.len(),
            max: MAX_FRAME_BYTES,
        });
    }
    let (value, consumed) = bincode::serde::decode_from_slice::<T, _>(bytes, wire_config())
        .map_err(map_decode_error)?;
    if consumed != bytes.len() {
        return Err(CodecError::TrailingBytes {
            consumed,
            len: bytes.len(),
        });
    }
    Ok(value)
}

/// Maps bincode's error to ours, so no bincode type leaks out of this module.
fn map_decode_error(error: bincode::error::DecodeError) -> CodecError {
    use bincode::error::DecodeError as E;
    match error {
        E::UnexpectedEnd { .. } => CodecError::UnexpectedEnd,
        E::LimitExceeded => CodecError::LimitExceeded {
            limit: MAX_FRAME_BYTES,
        },
        // Serde reports an unknown variant index as a custom error string
        // ("invalid value: integer `9`, expected variant index 0 <= i < 4").
        E::OtherString(reason) => CodecError::Malformed { reason },
        E::Utf8 { .. } => CodecError::Malformed {
            reason: "string is not valid utf-8".to_owned(),
        },
        E::InvalidBooleanValue(byte) => CodecError::Malformed {
            reason: format!("invalid boolean byte {byte:#04x}"),
        },
        other => CodecError::Malformed {
            reason: other.to_string(),
        },
    }
}

/// A `Vec` writer that stores at most `max` bytes but keeps counting past it, so an
/// oversized value is measured (for the error) without being held in memory.
struct BoundedVecWriter {
    buf: Vec<u8>,
    len: usize,
    max: usize,
}

impl Writer for BoundedVecWriter {
    fn write(&mut self, bytes: &[u8]) -> Result<(), bincode::error::EncodeError> {
        self.len = self.len.saturating_add(bytes.len());
        if self.len <= self.max {
            // Grow geometrically but never past `max`, so the buffer stays within the limit.
            if self.len > self.buf.capacity() {
                let target = self
                    .buf
                    .capacity()
                    .saturating_mul(2)
                    .clamp(self.len, self.max);
                self.buf.reserve_exact(target - self.buf.len());
            }
            self.buf.extend_from_slice(bytes);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_round_trips() {
        let value = (7_u32, String::from("hello"), vec![1_u8, 2, 3]);
        let bytes = encode(&value).unwrap();
        assert_eq!(decode::<(u32, String, Vec<u8>)>(&bytes).unwrap(), value);
    }

    #[test]
    fn trailing_bytes_are_rejected() {
        let mut bytes = encode(&5_u32).unwrap();
        bytes.push(0);
        assert_eq!(
            decode::<u32>(&bytes),
            Err(CodecError::TrailingBytes {
                consumed: 1,
                len: 2
            })
        );
    }

    #[test]
    fn empty_input_is_unexpected_end() {
        assert_eq!(decode::<u32>(&[]), Err(CodecError::UnexpectedEnd));
    }

    #[test]
    fn encode_refuses_values_above_the_limit_without_storing_them() {
        let value = vec![0_u8; 100];
        let err = encode_with_max(&value, 10).unwrap_err();
        // 1 length byte + 100 data bytes.
        assert_eq!(err, CodecError::TooLarge { len: 101, max: 10 });
    }

    #[test]
    fn encode_accepts_a_value_exactly_at_the_limit() {
        let value = vec![0_u8; 9];
        assert_eq!(encode_with_max(&value, 10).unwrap().len(), 10);
    }

    #[test]
    fn encode_clamps_a_limit_above_max_frame_bytes() {
        let value = vec![0_u8; MAX_FRAME_BYTES];
        let err = encode_with_max(&value, usize::MAX).unwrap_err();
        assert!(matches!(
            err,
            CodecError::TooLarge { max: MAX_FRAME_BYTES, len } if len > MAX_FRAME_BYTES
        ));
    }

    #[test]
    fn decode_refuses_input_above_max_frame_bytes() {
        let bytes = vec![0_u8; MAX_FRAME_BYTES + 1];
        assert_eq!(
            decode::<u8>(&bytes),
            Err(CodecError::TooLarge {
                len: MAX_FRAME_BYTES + 1,
                max: MAX_FRAME_BYTES
            })
        );
    }

    #[test]
    fn string_length_of_two_to_the_sixty_is_limit_exceeded() {
        // Varint marker 0xFD: a u64 length follows, little-endian.
        let mut bytes = vec![0xFD];
        bytes.extend_from_slice(&(1_u64 << 60).to_le_bytes());
        bytes.extend_from_slice(b"abc");
        assert_eq!(
            decode::<String>(&bytes),
            Err(CodecError::LimitExceeded {
                limit: MAX_FRAME_BYTES
            })
        );
    }

    #[test]
    fn invalid_utf8_is_malformed() {
        let bytes = [2, 0xC3, 0x28];
        assert!(matches!(
            decode::<String>(&bytes),
            Err(CodecError::Malformed { .. })
        ));
    }

    #[test]
    fn invalid_boolean_is_malformed() {
        assert_eq!(
            decode::<bool>(&[2]),
            Err(CodecError::Malformed {
                reason: "invalid boolean byte 0x02".to_owned()
            })
        );
    }

    #[test]
    fn error_messages_are_lower_case() {
        let errors = [
            CodecError::TooLarge { len: 2, max: 1 },
            CodecError::Encode { reason: "x".into() },
            CodecError::UnexpectedEnd,
            CodecError::LimitExceeded { limit: 1 },
            CodecError::TrailingBytes {
                consumed: 1,
                len: 2,
            },
            CodecError::Malformed { reason: "x".into() },
        ];
        for error in errors {
            let text = error.to_string();
            assert!(text.starts_with(|c: char| c.is_lowercase()), "{text}");
        }
    }
}
