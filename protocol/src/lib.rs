//! airlock-protocol: the messages the supervisor and a worker exchange, and their framing.
#![forbid(unsafe_code)]
