//! airlock-protocol: the messages the supervisor and a worker exchange, and their framing.
//!
//! `spec` is the compiled sandbox a worker builds, `message` the conversation, and `codec`
//! the only module that touches bincode (so switching codecs touches one file).
#![forbid(unsafe_code)]

pub mod message;
pub mod spec;

pub use message::*;
pub use spec::*;
