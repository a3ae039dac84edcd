//! Length-prefixed framing of codec messages over a byte stream (the supervisor↔worker socket).
//!
//! A frame is a 4-byte **big-endian** (network order) `u32` body length followed by exactly
//! that many bytes of [`codec`] output. The length is checked against the
//! maximum *before* any memory is reserved for the body, and the body buffer then grows only
//! as bytes actually arrive, never past the announced length — so a hostile peer can make
//! the reader hold at most `max + 4` bytes, and only by sending them.
//!
//! Two front ends share these rules:
//!
//! - blocking [`read_frame`] / [`write_frame`] over any [`Read`] / [`Write`], for the
//!   single-threaded worker; `read_frame` never reads past the end of the frame;
//! - the pure, IO-free [`FrameDecoder`], which you push arbitrary chunks into and which yields
//!   complete frames, for the async supervisor.
//!
//! The maximum is a parameter (`*_with_max`), defaulting to [`MAX_FRAME_BYTES`]; values above
//! it are clamped, because the codec refuses larger messages anyway.

use std::io::{ErrorKind, Read, Write};

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::codec::{self, CodecError, MAX_FRAME_BYTES};

/// Size of the length prefix in front of every frame body.
pub const LENGTH_PREFIX_BYTES: usize = 4;

/// How much the body buffer of a blocking read grows per step while bytes arrive.
const READ_CHUNK_BYTES: usize = 64 * 1024;

/// Why a frame could not be written, read or decoded.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The underlying stream failed.
    #[error("failed to {operation} a frame")]
    Io {
        /// `read`, `write` or `flush`.
        operation: &'static str,
        /// The stream's error.
        #[source]
        source: std::io::Error,
    },
    /// The frame body (announced by a peer, or produced by our encoder) exceeds the maximum.
    #[error("frame body of {len} bytes exceeds the {max}-byte maximum")]
    TooLarge {
        /// Body length, in bytes.
        len: usize,
        /// The maximum in force, in bytes.
        max: usize,
    },
    /// The stream ended inside a frame.
    #[error("stream ended mid-frame after {received} of {expected} bytes")]
    Truncated {
        /// Bytes the frame needed, prefix included (4 while the prefix itself is incomplete).
        expected: usize,
        /// Bytes of it that arrived.
        received: usize,
    },
    /// The frame was complete but its body is not a valid message.
    #[error("invalid frame body")]
    Codec(#[from] CodecError),
    /// A [`FrameDecoder`] was used again after it reported an oversized frame; the stream has
    /// no recoverable frame boundary any more and must be dropped.
    #[error("frame decoder used after an oversized frame desynchronized the stream")]
    Desynchronized,
}

/// Encodes `message` as one complete frame (prefix and body), with the default maximum.
pub fn encode_frame<T: Serialize + ?Sized>(message: &T) -> Result<Vec<u8>, FrameError> {
    encode_frame_with_max(message, MAX_FRAME_BYTES)
}

/// Encodes `message` as one complete frame, refusing a body larger than `max_frame_bytes`.
pub fn encode_frame_with_max<T: Serialize + ?Sized>(
    message: &T,
    max_frame_bytes: usize,
) -> Result<Vec<u8>, FrameError> {
    let body = encode_body(message, max_frame_bytes)?;
    let prefix = length_prefix(body.len(), max_frame_bytes)?;
    let mut frame = Vec::with_capacity(LENGTH_PREFIX_BYTES + body.len());
    frame.extend_from_slice(&prefix);
    frame.extend_from_slice(&body);
    Ok(frame)
}

/// Writes `message` as one frame to `writer` and flushes it, with the default maximum.
pub fn write_frame<W: Write + ?Sized, T: Serialize + ?Sized>(
    writer: &mut W,
    message: &T,
) -> Result<(), FrameError> {
    write_frame_with_max(writer, message, MAX_FRAME_BYTES)
}

/// Writes `message` as one frame to `writer` and flushes it, refusing a body larger than
/// `max_frame_bytes` (nothing is written then).
pub fn write_frame_with_max<W: Write + ?Sized, T: Serialize + ?Sized>(
    writer: &mut W,
    message: &T,
    max_frame_bytes: usize,
) -> Result<(), FrameError> {
    let body = encode_body(message, max_frame_bytes)?;
    let prefix = length_prefix(body.len(), max_frame_bytes)?;
    writer.write_all(&prefix).map_err(io_error("write"))?;
    writer.write_all(&body).map_err(io_error("write"))?;
    writer.flush().map_err(io_error("flush"))
}

/// Reads and decodes one frame, with the default maximum.
///
/// Returns `Ok(None)` on a clean end of stream at a frame boundary; an end of stream inside
/// a frame is [`FrameError::Truncated`].
pub fn read_frame<R: Read + ?Sized, T: DeserializeOwned>(
    reader: &mut R,
) -> Result<Option<T>, FrameError> {
    read_frame_with_max(reader, MAX_FRAME_BYTES)
}

/// Reads and decodes one frame whose body may be at most `max_frame_bytes`.
pub fn read_frame_with_max<R: Read + ?Sized, T: DeserializeOwned>(
    reader: &mut R,
    max_frame_bytes: usize,
) -> Result<Option<T>, FrameError> {
    match read_frame_bytes(reader, max_frame_bytes)? {
        None => Ok(None),
        Some(body) => Ok(Some(codec::decode(&body)?)),
    }
}

/// Reads one frame and returns its undecoded body; reads exactly the frame's bytes, no more.
///
/// Returns `Ok(None)` on a clean end of stream at a frame boundary.
pub fn read_frame_bytes<R: Read + ?Sized>(
    reader: &mut R,
    max_frame_bytes: usize,
) -> Result<Option<Vec<u8>>, FrameError> {
    let max = clamp_max(max_frame_bytes);

    let mut prefix = [0_u8; LENGTH_PREFIX_BYTES];
    let mut filled = 0;
    while filled < LENGTH_PREFIX_BYTES {
        match reader.read(&mut prefix[filled..]) {
            Ok(0) if filled == 0 => return Ok(None),
            Ok(0) => {
                return Err(FrameError::Truncated {
                    expected: LENGTH_PREFIX_BYTES,
                    received: filled,
                });
            }
            Ok(n) => filled += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(source) => {
                return Err(FrameError::Io {
                    operation: "read",
                    source,
                });
            }
        }
    }
    let len = check_body_len(u32::from_be_bytes(prefix), max)?;

    let mut body = Vec::new();
    while body.len() < len {
        let start = body.len();
        let want = (len - start).min(READ_CHUNK_BYTES);
        reserve_within(&mut body, want, len);
        body.resize(start + want, 0);
        match reader.read(&mut body[start..]) {
            Ok(0) => {
                return Err(FrameError::Truncated {
                    expected: LENGTH_PREFIX_BYTES + len,
                    received: LENGTH_PREFIX_BYTES + start,
                });
            }
            Ok(n) => body.truncate(start + n),
            Err(e) if e.kind() == ErrorKind::Interrupted => body.truncate(start),
            Err(source) => {
                return Err(FrameError::Io {
                    operation: "read",
                    source,
                });
            }
        }
    }
    Ok(Some(body))
}

/// Incremental, IO-free frame decoder: push any chunks of a stream in, get whole frames out.
///
/// It holds at most one partial frame: a 4-byte prefix array plus a body buffer that never
/// exceeds the announced length, which is checked against the maximum before the buffer
/// exists. After [`FrameError::TooLarge`] the decoder is desynchronized and every further call
/// fails with [`FrameError::Desynchronized`]; codec errors leave it usable (the frame boundary
/// is intact), although the protocol treats them as violations anyway.
///
/// ```
/// use airlock_protocol::frame::{encode_frame, FrameDecoder};
///
/// let bytes = encode_frame(&42_u32)?;
/// let mut decoder = FrameDecoder::new();
/// let (first, second) = bytes.split_at(3);
/// let mut input = first;
/// assert_eq!(decoder.decode_message::<u32>(&mut input)?, None);
/// let mut input = second;
/// assert_eq!(decoder.decode_message::<u32>(&mut input)?, Some(42));
/// decoder.end_of_stream()?;
/// # Ok::<(), airlock_protocol::frame::FrameError>(())
/// ```
#[derive(Debug)]
pub struct FrameDecoder {
    max: usize,
    state: DecoderState,
}

#[derive(Debug)]
enum DecoderState {
    /// Collecting the length prefix.
    Prefix {
        bytes: [u8; LENGTH_PREFIX_BYTES],
        filled: usize,
    },
    /// Collecting a body of `len` bytes.
    Body { len: usize, buf: Vec<u8> },
    /// An oversized frame was announced; there is no frame boundary to resume at.
    Desynchronized,
}

impl DecoderState {
    const START: Self = Self::Prefix {
        bytes: [0; LENGTH_PREFIX_BYTES],
        filled: 0,
    };
}

impl Default for FrameDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl FrameDecoder {
    /// A decoder with the default maximum, [`MAX_FRAME_BYTES`].
    pub fn new() -> Self {
        Self::with_max_frame_bytes(MAX_FRAME_BYTES)
    }

    /// A decoder refusing bodies above `max_frame_bytes` (clamped to [`MAX_FRAME_BYTES`]).
    pub fn with_max_frame_bytes(max_frame_bytes: usize) -> Self {
        Self {
            max: clamp_max(max_frame_bytes),
            state: DecoderState::START,
        }
    }

    /// The maximum body length this decoder accepts.
    pub fn max_frame_bytes(&self) -> usize {
        self.max
    }

    /// Consumes bytes from the front of `input` until one frame is complete and returns its
    /// body, or consumes all of `input` and returns `Ok(None)` when the frame is still
    /// partial. Call it again while `input` is non-empty: bytes after a complete frame are
    /// left in `input`.
    pub fn decode_frame(&mut self, input: &mut &[u8]) -> Result<Option<Vec<u8>>, FrameError> {
        loop {
            match &mut self.state {
                DecoderState::Desynchronized => return Err(FrameError::Desynchronized),
                DecoderState::Prefix { bytes, filled } => {
                    if input.is_empty() {
                        return Ok(None);
                    }
                    let take = (LENGTH_PREFIX_BYTES - *filled).min(input.len());
                    let (head, rest) = input.split_at(take);
                    bytes[*filled..*filled + take].copy_from_slice(head);
                    *filled += take;
                    *input = rest;
                    if *filled == LENGTH_PREFIX_BYTES {
                        let announced = u32::from_be_bytes(*bytes);
                        match check_body_len(announced, self.max) {
                            Ok(len) => {
                                self.state = DecoderState::Body {
                                    len,
                                    buf: Vec::new(),
                                };
                            }
                            Err(error) => {
                                self.state = DecoderState::Desynchronized;
                                return Err(error);
                            }
                        }
                    }
                }
                DecoderState::Body { len, buf } => {
                    let take = (*len - buf.len()).min(input.len());
                    let (head, rest) = input.split_at(take);
                    reserve_within(buf, take, *len);
                    buf.extend_from_slice(head);
                    *input = rest;
                    if buf.len() < *len {
                        return Ok(None);
                    }
                    let body = std::mem::take(buf);
                    self.state = DecoderState::START;
                    return Ok(Some(body));
                }
            }
        }
    }

    /// Like [`decode_frame`](Self::decode_frame), then decodes the body as a `T`.
    pub fn decode_message<T: DeserializeOwned>(
        &mut self,
        input: &mut &[u8],
    ) -> Result<Option<T>, FrameError> {
        match self.decode_frame(input)? {
            None => Ok(None),
            Some(body) => Ok(Some(codec::decode(&body)?)),
        }
    }

    /// Whether no partial frame is buffered (a clean place for the stream to end).
    pub fn is_at_frame_boundary(&self) -> bool {
        matches!(self.state, DecoderState::Prefix { filled: 0, .. })
    }

    /// Heap bytes currently reserved for the partial frame (never more than the maximum).
    pub fn buffer_capacity(&self) -> usize {
        match &self.state {
            DecoderState::Body { buf, .. } => buf.capacity(),
            DecoderState::Prefix { .. } | DecoderState::Desynchronized => 0,
        }
    }

    /// Call when the stream ends: fails with [`FrameError::Truncated`] if a frame was cut off.
    pub fn end_of_stream(&self) -> Result<(), FrameError> {
        match &self.state {
            DecoderState::Prefix { filled: 0, .. } => Ok(()),
            DecoderState::Prefix { filled, .. } => Err(FrameError::Truncated {
                expected: LENGTH_PREFIX_BYTES,
                received: *filled,
            }),
            DecoderState::Body { len, buf } => Err(FrameError::Truncated {
                expected: LENGTH_PREFIX_BYTES + len,
                received: LENGTH_PREFIX_BYTES + buf.len(),
            }),
            DecoderState::Desynchronized => Err(FrameError::Desynchronized),
        }
    }
}

fn clamp_max(max_frame_bytes: usize) -> usize {
    max_frame_bytes.min(MAX_FRAME_BYTES)
}

fn encode_body<T: Serialize + ?Sized>(
    message: &T,
    max_frame_bytes: usize,
) -> Result<Vec<u8>, FrameError> {
    codec::encode_with_max(message, clamp_max(max_frame_bytes)).map_err(|error| match error {
        CodecError::TooLarge { len, max } => FrameError::TooLarge { len, max },
        other => FrameError::Codec(other),
    })
}

fn length_prefix(
    len: usize,
    max_frame_bytes: usize,
) -> Result<[u8; LENGTH_PREFIX_BYTES], FrameError> {
    // Cannot fail while MAX_FRAME_BYTES < 4 GiB and the codec enforces it; checked anyway.
    u32::try_from(len)
        .map(u32::to_be_bytes)
        .map_err(|_| FrameError::TooLarge {
            len,
            max: clamp_max(max_frame_bytes),
        })
}

/// Checks an announced body length before anything is allocated for it.
fn check_body_len(announced: u32, max: usize) -> Result<usize, FrameError> {
    let len = usize::try_from(announced).unwrap_or(usize::MAX);
    if len > max {
        return Err(FrameError::TooLarge { len, max });
    }
    Ok(len)
}

/// Makes room for `additional` more bytes in `buf`, growing geometrically (so a frame
/// arriving in small chunks is not copied quadratically) but never past `frame_len`.
fn reserve_within(buf: &mut Vec<u8>, additional: usize, frame_len: usize) {
    let needed = buf.len() + additional;
    if needed > buf.capacity() {
        let target = buf
            .capacity()
            .saturating_mul(2)
            .clamp(needed, frame_len.max(needed));
        buf.reserve_exact(target - buf.len());
    }
}

fn io_error(operation: &'static str) -> impl FnOnce(std::io::Error) -> FrameError {
    move |source| FrameError::Io { operation, source }
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::*;

    fn frame_of(body: &[u8]) -> Vec<u8> {
        let mut frame = u32::try_from(body.len()).unwrap().to_be_bytes().to_vec();
        frame.extend_from_slice(body);
        frame
    }

    #[test]
    fn length_prefix_is_big_endian() {
        let frame = encode_frame(&String::from("ab")).unwrap();
        assert_eq!(frame, [0, 0, 0, 3, 2, b'a', b'b']);
    }

    #[test]
    fn read_frame_returns_none_on_clean_eof() {
        let mut reader = Cursor::new(Vec::new());
        assert!(read_frame::<_, u32>(&mut reader).unwrap().is_none());
    }

    #[test]
    fn read_frame_reads_consecutive_frames_without_over_reading() {
        let mut bytes = encode_frame(&1_u32).unwrap();
        bytes.extend(encode_frame(&2_u32).unwrap());
        let mut reader = Cursor::new(bytes);
        assert_eq!(read_frame::<_, u32>(&mut reader).unwrap(), Some(1));
        assert_eq!(reader.position(), 5);
        assert_eq!(read_frame::<_, u32>(&mut reader).unwrap(), Some(2));
        assert_eq!(read_frame::<_, u32>(&mut reader).unwrap(), None);
    }

    #[test]
    fn huge_length_prefix_is_too_large_before_reading_the_body() {
        let mut reader = Cursor::new(vec![0xFF, 0xFF, 0xFF, 0xFF, 1, 2, 3]);
        let err = read_frame::<_, u32>(&mut reader).unwrap_err();
        assert!(matches!(
            err,
            FrameError::TooLarge {
                len: 0xFFFF_FFFF,
                max: MAX_FRAME_BYTES
            }
        ));
        assert_eq!(reader.position(), 4, "the body must not be read");
    }

    #[test]
    fn custom_max_is_enforced_on_read_and_write() {
        let mut reader = Cursor::new(frame_of(&[0; 11]));
        assert!(matches!(
            read_frame_bytes(&mut reader, 10),
            Err(FrameError::TooLarge { len: 11, max: 10 })
        ));
        let mut out = Vec::new();
        assert!(matches!(
            write_frame_with_max(&mut out, &vec![0_u8; 10], 10),
            Err(FrameError::TooLarge { len: 11, max: 10 })
        ));
        assert!(
            out.is_empty(),
            "nothing is written for an oversized message"
        );
    }

    #[test]
    fn max_above_the_codec_limit_is_clamped() {
        assert_eq!(
            FrameDecoder::with_max_frame_bytes(usize::MAX).max_frame_bytes(),
            MAX_FRAME_BYTES
        );
    }

    #[test]
    fn partial_prefix_is_truncated() {
        let mut reader = Cursor::new(vec![0, 0]);
        assert!(matches!(
            read_frame::<_, u32>(&mut reader),
            Err(FrameError::Truncated {
                expected: 4,
                received: 2
            })
        ));
    }

    #[test]
    fn half_body_is_truncated() {
        let mut bytes = frame_of(&[1, 2, 3, 4]);
        bytes.truncate(6);
        let mut reader = Cursor::new(bytes);
        assert!(matches!(
            read_frame_bytes(&mut reader, 100),
            Err(FrameError::Truncated {
                expected: 8,
                received: 6
            })
        ));
    }

    /// A reader that returns one byte per call and an `Interrupted` error between bytes.
    struct Trickle {
        bytes: Vec<u8>,
        pos: usize,
        interrupt_next: bool,
    }

    impl Read for Trickle {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            self.interrupt_next = !self.interrupt_next;
            if self.interrupt_next {
                return Err(ErrorKind::Interrupted.into());
            }
            match (self.bytes.get(self.pos), buf.first_mut()) {
                (Some(byte), Some(slot)) => {
                    *slot = *byte;
                    self.pos += 1;
                    Ok(1)
                }
                _ => Ok(0),
            }
        }
    }

    #[test]
    fn read_frame_survives_short_reads_and_interrupts() {
        let value = String::from("trickled");
        let mut reader = Trickle {
            bytes: encode_frame(&value).unwrap(),
            pos: 0,
            interrupt_next: false,
        };
        assert_eq!(read_frame::<_, String>(&mut reader).unwrap(), Some(value));
        assert_eq!(read_frame::<_, String>(&mut reader).unwrap(), None);
    }

    struct FailingIo;

    impl Read for FailingIo {
        fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
            Err(ErrorKind::ConnectionReset.into())
        }
    }

    impl Write for FailingIo {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(ErrorKind::BrokenPipe.into())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn io_errors_name_the_operation_and_keep_the_source() {
        let err = read_frame::<_, u32>(&mut FailingIo).unwrap_err();
        assert_eq!(err.to_string(), "failed to read a frame");
        assert!(matches!(
            &err,
            FrameError::Io { operation: "read", source } if source.kind() == ErrorKind::ConnectionReset
        ));
        let err = write_frame(&mut FailingIo, &1_u32).unwrap_err();
        assert!(matches!(
            err,
            FrameError::Io {
                operation: "write",
                ..
            }
        ));
    }

    #[test]
    fn decoder_yields_frames_across_chunk_boundaries() {
        let mut stream = encode_frame(&1_u32).unwrap();
        stream.extend(encode_frame(&String::from("two")).unwrap());
        let mut decoder = FrameDecoder::new();
        let mut frames = Vec::new();
        for byte in &stream {
            let mut input: &[u8] = std::slice::from_ref(byte);
            while let Some(frame) = decoder.decode_frame(&mut input).unwrap() {
                frames.push(frame);
            }
            assert!(input.is_empty());
        }
        assert_eq!(frames, [vec![1], vec![3, b't', b'w', b'o']]);
        assert!(decoder.is_at_frame_boundary());
        decoder.end_of_stream().unwrap();
    }

    #[test]
    fn decoder_leaves_bytes_after_a_complete_frame_in_the_input() {
        let mut stream = encode_frame(&1_u32).unwrap();
        stream.extend(encode_frame(&2_u32).unwrap());
        let mut decoder = FrameDecoder::new();
        let mut input = stream.as_slice();
        assert_eq!(decoder.decode_message::<u32>(&mut input).unwrap(), Some(1));
        assert_eq!(input.len(), 5);
        assert_eq!(decoder.decode_message::<u32>(&mut input).unwrap(), Some(2));
        assert!(input.is_empty());
    }

    #[test]
    fn decoder_rejects_huge_prefix_without_allocating_and_stays_failed() {
        let mut decoder = FrameDecoder::new();
        let mut input: &[u8] = &[0xFF, 0xFF, 0xFF, 0xFF, 0, 0];
        assert!(matches!(
            decoder.decode_frame(&mut input),
            Err(FrameError::TooLarge {
                len: 0xFFFF_FFFF,
                max: MAX_FRAME_BYTES
            })
        ));
        assert_eq!(decoder.buffer_capacity(), 0);
        let mut more: &[u8] = &[0, 0, 0, 1, 0];
        assert!(matches!(
            decoder.decode_frame(&mut more),
            Err(FrameError::Desynchronized)
        ));
        assert!(matches!(
            decoder.end_of_stream(),
            Err(FrameError::Desynchronized)
        ));
    }

    #[test]
    fn decoder_buffer_grows_only_with_received_bytes() {
        let max = 1 << 20;
        let mut decoder = FrameDecoder::with_max_frame_bytes(max);
        let mut input: &[u8] = &(u32::try_from(max).unwrap()).to_be_bytes();
        assert_eq!(decoder.decode_frame(&mut input).unwrap(), None);
        assert_eq!(
            decoder.buffer_capacity(),
            0,
            "announcing a length reserves nothing"
        );
        let chunk = vec![7_u8; 1000];
        let mut total = 0;
        while total < max {
            let n = chunk.len().min(max - total);
            let mut input = &chunk[..n];
            let frame = decoder.decode_frame(&mut input).unwrap();
            total += n;
            assert!(decoder.buffer_capacity() <= max);
            if total < max {
                assert!(frame.is_none());
                assert!(decoder.buffer_capacity() <= 2 * total);
            } else {
                assert_eq!(frame.map(|f| f.len()), Some(max));
            }
        }
    }

    #[test]
    fn decoder_reports_truncation_at_end_of_stream() {
        let mut decoder = FrameDecoder::new();
        let mut input: &[u8] = &[0, 0];
        assert_eq!(decoder.decode_frame(&mut input).unwrap(), None);
        assert!(matches!(
            decoder.end_of_stream(),
            Err(FrameError::Truncated {
                expected: 4,
                received: 2
            })
        ));
        let mut input: &[u8] = &[0, 5, 1, 2];
        assert_eq!(decoder.decode_frame(&mut input).unwrap(), None);
        assert!(matches!(
            decoder.end_of_stream(),
            Err(FrameError::Truncated {
                expected: 9,
                received: 6
            })
        ));
    }

    #[test]
    fn empty_frame_is_yielded_as_an_empty_body() {
        let mut decoder = FrameDecoder::new();
        let mut input: &[u8] = &[0, 0, 0, 0];
        assert_eq!(decoder.decode_frame(&mut input).unwrap(), Some(Vec::new()));
        let mut reader = Cursor::new(vec![0, 0, 0, 0]);
        assert_eq!(read_frame_bytes(&mut reader, 10).unwrap(), Some(Vec::new()));
    }

    #[test]
    fn error_messages_are_lower_case() {
        let errors = [
            FrameError::Io {
                operation: "read",
                source: ErrorKind::Other.into(),
            },
            FrameError::TooLarge { len: 2, max: 1 },
            FrameError::Truncated {
                expected: 4,
                received: 1,
            },
            FrameError::Codec(CodecError::UnexpectedEnd),
            FrameError::Desynchronized,
        ];
        for error in errors {
            let text = error.to_string();
            assert!(text.starts_with(|c: char| c.is_lowercase()), "{text}");
        }
    }
}
