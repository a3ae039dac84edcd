//! airlock-protocol: the messages the supervisor and a worker exchange, and their framing.
//!
//! `spec` is the compiled sandbox a worker builds, `message` the conversation (its messages,
//! their order and the version handshake), `frame` the length-prefixed framing, and `codec`
//! the only module that touches bincode (so switching codecs touches one file).
#![forbid(unsafe_code)]

pub mod codec;
pub mod frame;
pub mod message;
pub mod spec;

pub use codec::{CodecError, MAX_FRAME_BYTES};
pub use frame::{FrameDecoder, FrameError, read_frame, write_frame};
pub use message::*;
pub use spec::*;
