//! A Rust client of the daemon's bincode protocol.

use std::path::Path;

use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;

use super::wire::{CallRequest, FrameRequest, FrameResponse, Op};

/// A blocking-free Rust client for the daemon's bincode protocol.
#[derive(Debug)]
pub struct DaemonClient {
    stream: UnixStream,
    next_id: u64,
    decoder: airlock_protocol::FrameDecoder,
    pending: Vec<u8>,
}

impl DaemonClient {
    /// Connects to a daemon socket.
    pub async fn connect(path: &Path) -> std::io::Result<Self> {
        Ok(Self {
            stream: UnixStream::connect(path).await?,
            next_id: 1,
            decoder: airlock_protocol::FrameDecoder::with_max_frame_bytes(
                airlock_protocol::MAX_FRAME_BYTES,
            ),
            pending: Vec::new(),
        })
    }

    /// Sends one op and waits for its response body (`{"result": ...}` or `{"error": ...}`).
    pub async fn request(&mut self, op: &Op) -> std::io::Result<Value> {
        let id = self.next_id;
        self.next_id += 1;
        let op_json = serde_json::to_string(op).map_err(std::io::Error::other)?;
        let frame = airlock_protocol::frame::encode_frame(&FrameRequest { id, op_json })
            .map_err(std::io::Error::other)?;
        self.stream.write_all(&frame).await?;
        loop {
            let mut input: &[u8] = &self.pending;
            let decoded = self.decoder.decode_message::<FrameResponse>(&mut input);
            let consumed = self.pending.len() - input.len();
            self.pending.drain(..consumed);
            match decoded {
                Ok(Some(response)) if response.id == id => {
                    return serde_json::from_str(&response.body_json)
                        .map_err(std::io::Error::other);
                }
                Ok(Some(_)) => continue,
                Ok(None) => {}
                Err(e) => return Err(std::io::Error::other(e)),
            }
            self.stream.readable().await?;
            // Made after the wait, never alive across it: a buffer alive across an await
            // lives in the future, 64 KiB of heap per call waiting for its answer.
            let mut chunk = [0u8; 64 * 1024];
            let n = match self.stream.try_read(&mut chunk) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            };
            if n == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "daemon closed the connection",
                ));
            }
            self.pending.extend_from_slice(&chunk[..n]);
        }
    }

    /// Calls a tool and returns its result record.
    pub async fn call(
        &mut self,
        tool: &str,
        arguments_json: &str,
    ) -> std::io::Result<ToolResultJson> {
        let body = self
            .request(&Op::Call(CallRequest {
                tool: tool.into(),
                arguments_json: Some(arguments_json.into()),
                ..CallRequest::default()
            }))
            .await?;
        Ok(ToolResultJson(body.get("result").cloned().unwrap_or(body)))
    }
}

/// A result record as JSON (the daemon's wire form).
#[derive(Debug, Clone)]
pub struct ToolResultJson(pub Value);
