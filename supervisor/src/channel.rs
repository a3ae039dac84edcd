//! The supervisor's end of one worker's protocol socket: bounded frames in, frames out.
//!
//! Everything a worker sends is untrusted. Frames above the per-call maximum, malformed
//! bodies, trailing bytes and log floods end the conversation as a protocol violation; the
//! buffer never grows beyond one maximum-size frame.

use std::os::fd::OwnedFd;

use airlock_protocol::frame::encode_frame;
use airlock_protocol::{FrameDecoder, SupervisorMessage, WorkerMessage};
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::UnixStream;

use crate::sys;

/// Why the conversation with a worker broke down.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    /// The worker sent something malformed, oversized or out of place.
    #[error("protocol violation: {0}")]
    Violation(String),
    /// The worker closed the socket (it exited or was killed).
    #[error("worker closed the connection")]
    Closed,
    /// The supervisor had no descriptor to spare for what the worker sent (EMFILE or
    /// ENFILE): its own shortage, not the worker's doing.
    #[error("the supervisor is out of descriptors: {0}")]
    OutOfDescriptors(std::io::Error),
    /// Socket I/O failed.
    #[error("socket i/o: {0}")]
    Io(std::io::Error),
}

impl From<std::io::Error> for ChannelError {
    fn from(error: std::io::Error) -> Self {
        if sys::out_of_descriptors(&error) {
            Self::OutOfDescriptors(error)
        } else {
            Self::Io(error)
        }
    }
}

/// Most log records a worker may send in one conversation.
const MAX_LOG_RECORDS: usize = 256;

/// Most descriptors a worker may pass in one conversation: its seccomp listener and its
/// egress listener.
const MAX_PASSED_DESCRIPTORS: usize = 2;

/// One worker's protocol socket.
#[derive(Debug)]
pub struct WorkerChannel {
    stream: UnixStream,
    decoder: FrameDecoder,
    pending: Vec<u8>,
    logs: usize,
    /// Descriptors the worker passed (`SCM_RIGHTS`), oldest first.
    passed: Vec<OwnedFd>,
}

impl WorkerChannel {
    /// Wraps the supervisor's end; frames from the worker above `max_frame_bytes` are refused.
    pub fn new(stream: UnixStream, max_frame_bytes: usize) -> Self {
        Self {
            stream,
            decoder: FrameDecoder::with_max_frame_bytes(max_frame_bytes),
            pending: Vec::new(),
            logs: 0,
            passed: Vec::new(),
        }
    }

    /// Sends one message.
    pub async fn send(&mut self, message: &SupervisorMessage) -> Result<(), ChannelError> {
        let frame = encode_frame(message).map_err(|e| {
            ChannelError::Violation(format!("cannot encode {}: {e}", message.name()))
        })?;
        self.stream.write_all(&frame).await?;
        Ok(())
    }

    /// Sends frames encoded before (whole frames, as [`encode_frame`] makes
    /// them), in one write.
    pub async fn send_encoded(&mut self, frames: &[u8]) -> Result<(), ChannelError> {
        self.stream.write_all(frames).await?;
        Ok(())
    }

    /// Receives the next message that is not a log record (logs go to tracing, bounded).
    pub async fn receive(&mut self) -> Result<WorkerMessage, ChannelError> {
        loop {
            let message = self.receive_any().await?;
            if let WorkerMessage::Log(record) = &message {
                self.logs += 1;
                if self.logs > MAX_LOG_RECORDS {
                    return Err(ChannelError::Violation("too many log records".into()));
                }
                // Debug formatting escapes control characters: worker text cannot forge
                // log lines or terminal sequences (RUSTSEC-2025-0055 class).
                tracing::debug!(level = ?record.level, message = ?record.message, "worker log");
                continue;
            }
            return Ok(message);
        }
    }

    /// The oldest descriptor the worker passed and nobody took yet.
    pub fn take_passed_descriptor(&mut self) -> Option<OwnedFd> {
        (!self.passed.is_empty()).then(|| self.passed.remove(0))
    }

    async fn receive_any(&mut self) -> Result<WorkerMessage, ChannelError> {
        loop {
            if !self.pending.is_empty() {
                let mut input: &[u8] = &self.pending;
                let decoded = self.decoder.decode_message::<WorkerMessage>(&mut input);
                let consumed = self.pending.len() - input.len();
                self.pending.drain(..consumed);
                match decoded {
                    Ok(Some(message)) => return Ok(message),
                    Ok(None) => {}
                    Err(e) => return Err(ChannelError::Violation(e.to_string())),
                }
            }
            // recvmsg rather than read: a descriptor the worker passes arrives with the
            // bytes it was sent with, and a plain read would drop it on the floor.
            let received = loop {
                self.stream.readable().await?;
                // Made after the wait, never alive across it: a buffer alive across an
                // await lives in the call's future, 64 KiB of heap per call in flight.
                let mut buffer = [0u8; 64 * 1024];
                match self.stream.try_io(Interest::READABLE, || {
                    sys::receive_with_descriptors(&self.stream, &mut buffer)
                }) {
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                    other => {
                        let received = other?;
                        self.pending
                            .extend_from_slice(&buffer[..received.bytes.min(buffer.len())]);
                        break received;
                    }
                }
            };
            if received.truncated {
                // The kernel also truncates when it cannot install a descriptor in a full
                // table: say which, so a shortage is not reported as the worker's doing.
                // (Checked after the fact, so a shortage that just passed reads as a
                // violation, as every truncation did before; either way the call ends.)
                return Err(match sys::descriptor_to_spare() {
                    Err(error) if sys::out_of_descriptors(&error) => {
                        ChannelError::OutOfDescriptors(error)
                    }
                    _ => ChannelError::Violation(
                        "the worker passed more descriptors than one message may carry".into(),
                    ),
                });
            }
            self.passed.extend(received.descriptors);
            if self.passed.len() > MAX_PASSED_DESCRIPTORS {
                return Err(ChannelError::Violation(
                    "the worker passed more descriptors than it may".into(),
                ));
            }
            let n = received.bytes;
            if n == 0 {
                return match self.decoder.end_of_stream() {
                    Ok(()) => Err(ChannelError::Closed),
                    Err(e) => Err(ChannelError::Violation(e.to_string())),
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// Every call in flight holds its wait for the worker's report as a future on the heap;
    /// a receive buffer alive across that wait made each one 64 KiB.
    #[tokio::test]
    async fn waiting_for_a_message_holds_no_receive_buffer() {
        let (ours, _theirs) = UnixStream::pair().unwrap();
        let mut channel = WorkerChannel::new(ours, 1 << 20);
        let waiting = channel.receive();
        let size = std::mem::size_of_val(&waiting);
        assert!(size < 4096, "a receive waits in {size} bytes");
    }
}
