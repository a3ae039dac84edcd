//! What travels on the daemon's socket: requests and responses of both wire formats.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// Largest request line or frame, bytes.
pub const MAX_REQUEST_BYTES: usize = 2 << 20;
/// A request, as both wire formats carry it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// List active tools with their input schemas.
    Tools,
    /// Call a tool.
    Call(CallRequest),
    /// Cancel an in-flight request of this connection.
    Cancel {
        /// The id of the request to cancel.
        target: Value,
    },
    /// Phase one of an approval.
    Propose(CallRequest),
    /// Phase two of an approval.
    Execute {
        /// The approval.
        approval_id: String,
        /// Session.
        #[serde(default)]
        session: Option<String>,
    },
    /// Delete a pending approval.
    Reject {
        /// The approval.
        approval_id: String,
    },
    /// Change a tool's availability.
    SetState {
        /// Tool.
        tool: String,
        /// `active`, `deferred` or `suspended`.
        state: String,
    },
    /// Liveness.
    Health,
    /// Counters.
    Stats,
}

/// The fields of `call` and `propose`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CallRequest {
    /// Tool name.
    pub tool: String,
    /// Arguments as a JSON value (JSON clients).
    #[serde(default)]
    pub arguments: Option<Value>,
    /// Arguments as JSON text (bincode clients, or JSON clients that prefer text).
    #[serde(default)]
    pub arguments_json: Option<String>,
    /// Call id (default: the request id).
    #[serde(default)]
    pub call_id: Option<String>,
    /// Session id.
    #[serde(default)]
    pub session: Option<String>,
    /// Plan mode.
    #[serde(default)]
    pub plan_mode: bool,
}

/// A bincode-framed request: the op travels as JSON text (bincode cannot carry a dynamic
/// JSON value), so both formats share one parser.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FrameRequest {
    /// Request id, echoed.
    pub id: u64,
    /// The [`Op`] as JSON text.
    pub op_json: String,
}

/// A bincode-framed response.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FrameResponse {
    /// The request id.
    pub id: u64,
    /// `{"result": ...}` or `{"error": {...}}` as JSON text.
    pub body_json: String,
}

pub(super) fn error_body(kind: &str, message: impl Into<String>) -> Value {
    json!({"error": {"kind": kind, "message": message.into()}})
}
