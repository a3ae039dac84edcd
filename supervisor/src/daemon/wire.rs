//! What travels on the daemon's socket: requests and responses of both wire formats.
//!
//! A request is parsed strictly: its top level once, into raw field texts (so a nested
//! argument value is never expanded into a tree here: an array of a million zeros stays
//! two megabytes of text instead of tens of megabytes of nodes), with a duplicated key
//! refused; then the op's own fields, where an unknown one is refused by name. A field the
//! daemon does not know is a request it cannot honour (a `dry_run` it would ignore runs
//! the call), so it never passes silently.

use std::fmt;

use serde::de::{DeserializeOwned, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;
use serde_json::{Value, json};

/// Largest request line or frame, bytes.
pub const MAX_REQUEST_BYTES: usize = 2 << 20;

/// Largest request `id`, `call_id`, `session` or `target`, bytes of JSON text.
pub const MAX_ID_BYTES: usize = 256;

/// A request, as both wire formats carry it.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// List every tool with its state and the schemas the gate enforces.
    Tools(ToolsRequest),
    /// Call a tool.
    Call(CallRequest),
    /// Cancel an in-flight request of this connection.
    Cancel(CancelRequest),
    /// Phase one of an approval.
    Propose(CallRequest),
    /// Phase two of an approval.
    Execute(ExecuteRequest),
    /// Delete a pending approval.
    Reject(RejectRequest),
    /// Change a tool's availability.
    SetState(SetStateRequest),
    /// Liveness.
    Health,
    /// Counters.
    Stats,
    /// Open a session workspace.
    SessionOpen(SessionOpenRequest),
    /// Write a file into a session's workspace.
    PutFile(PutFileRequest),
    /// Read a file of a session's workspace.
    GetFile(GetFileRequest),
    /// What a session's workspace changed against its base.
    Changes(SessionRequest),
    /// Close a session: everything of it removed.
    SessionClose(SessionRequest),
    /// Change an open session's settings: its plan mode.
    SessionSet(SessionSetRequest),
}

/// The fields of `tools`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolsRequest {
    /// List the states as calls in this open session see them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
}

/// The fields of `session_open`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionOpenRequest {
    /// A host directory under one of the policy's `[sessions] bases` to start from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    /// The workspace's size limit: bytes, or a size like `"64MiB"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<SizeField>,
    /// Every call in the session is in plan mode, whatever the call asks.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub plan_mode: bool,
}

/// The fields of `session_set`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionSetRequest {
    /// An open session.
    pub session: String,
    /// Put every call in it in plan mode (`true`), or lift that (`false`: an approver's op).
    pub plan_mode: bool,
}

/// A size: a number of bytes or a text like `"64MiB"`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SizeField {
    /// Bytes.
    Bytes(u64),
    /// A size with its unit.
    Text(String),
}

/// The fields of `put_file`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PutFileRequest {
    /// The session.
    pub session: String,
    /// Relative to the workspace.
    pub path: String,
    /// The file's bytes, base64 (standard alphabet, padded).
    pub content_base64: String,
}

/// The fields of `get_file`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GetFileRequest {
    /// The session.
    pub session: String,
    /// Relative to the workspace.
    pub path: String,
}

/// The fields of `changes` and `session_close`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionRequest {
    /// The session.
    pub session: String,
}

/// The fields of `call` and `propose`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallRequest {
    /// Tool name.
    pub tool: String,
    /// Arguments as a JSON value (JSON clients).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<Box<RawValue>>,
    /// Arguments as JSON text (bincode clients, or JSON clients that prefer text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments_json: Option<String>,
    /// Call id for the result and the audit log (default: a fresh random one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    /// Session id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// Plan mode.
    #[serde(default)]
    pub plan_mode: bool,
    /// `call` only: a deadline shorter than the tool's (a longer one is cut to the tool's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// `call` only: validate and decide, say what would run, run nothing.
    #[serde(default)]
    pub dry_run: bool,
}

/// The fields of `cancel`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelRequest {
    /// The id of the request to cancel.
    #[serde(deserialize_with = "bounded_id")]
    pub target: Value,
}

/// A request id as its JSON value, refused by the length of its text before it is parsed:
/// a 2 MiB array would otherwise become tens of megabytes of nodes first, on every request.
fn bounded_id<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Value, D::Error> {
    let raw = Box::<RawValue>::deserialize(deserializer)?;
    if raw.get().len() > MAX_ID_BYTES {
        return Err(serde::de::Error::custom(format_args!(
            "target must be at most {MAX_ID_BYTES} bytes of JSON text"
        )));
    }
    serde_json::from_str(raw.get()).map_err(serde::de::Error::custom)
}

/// The fields of `execute`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecuteRequest {
    /// The approval.
    pub approval_id: String,
    /// Session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
}

/// The fields of `reject`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RejectRequest {
    /// The approval.
    pub approval_id: String,
}

/// The fields of `set_state`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetStateRequest {
    /// Tool.
    pub tool: String,
    /// `active`, `deferred` or `suspended`.
    pub state: String,
    /// An open session: the state holds for calls in it only, until it closes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
}

/// Why a request could not be read; answered as `invalid_request` with this message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// The text is not JSON.
    #[error("not JSON: line {line}, column {column}")]
    NotJson {
        /// Line of the error.
        line: usize,
        /// Column of the error.
        column: usize,
    },
    /// JSON, but not an object of fields.
    #[error("a request is a JSON object with an \"op\" field: {0}")]
    NotObject(String),
    /// A key given twice.
    #[error("field {0:?} is given twice")]
    DuplicateField(String),
    /// No `op`, or not a string.
    #[error("the request has no \"op\" string")]
    MissingOp,
    /// An op the daemon does not have.
    #[error("unknown op {0:?}")]
    UnknownOp(String),
    /// The op's fields are wrong (serde's message names the field).
    #[error("op {op}: {message}")]
    Fields {
        /// The op.
        op: String,
        /// What is wrong.
        message: String,
    },
    /// An id-like field beyond [`MAX_ID_BYTES`] or holding control characters.
    #[error("{0} must be 1 to {MAX_ID_BYTES} bytes without control characters")]
    BadId(&'static str),
}

/// The top-level fields of a request object, in order, each as its raw JSON text.
struct Fields(Vec<(String, Box<RawValue>)>);

impl<'de> Deserialize<'de> for Fields {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct FieldsVisitor;
        impl<'de> Visitor<'de> for FieldsVisitor {
            type Value = Fields;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Fields, A::Error> {
                let mut fields = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    fields.push((key, map.next_value::<Box<RawValue>>()?));
                }
                Ok(Fields(fields))
            }
        }
        deserializer.deserialize_map(FieldsVisitor)
    }
}

fn parse_fields(text: &str) -> Result<Fields, RequestError> {
    let fields = serde_json::from_str::<Fields>(text).map_err(|e| {
        if e.is_syntax() || e.is_eof() {
            RequestError::NotJson {
                line: e.line(),
                column: e.column(),
            }
        } else {
            RequestError::NotObject(e.to_string())
        }
    })?;
    let mut seen = std::collections::HashSet::new();
    for (key, _) in &fields.0 {
        if !seen.insert(key.as_str()) {
            return Err(RequestError::DuplicateField(key.clone()));
        }
    }
    Ok(fields)
}

/// A JSON lines request: its `id` (null when absent) and its op. The id comes back even
/// when the op is refused, so the client can match the refusal to its request.
pub fn parse_line(text: &str) -> (Value, Result<Op, RequestError>) {
    let fields = match parse_fields(text) {
        Ok(fields) => fields,
        Err(e) => return (leading_id(text.as_bytes()), Err(e)),
    };
    let (id, rest): (Vec<_>, Vec<_>) = fields.0.into_iter().partition(|(key, _)| key == "id");
    let id = match id.first() {
        None => Value::Null,
        Some((_, raw)) if raw.get().len() > MAX_ID_BYTES => {
            return (Value::Null, Err(RequestError::BadId("id")));
        }
        Some((_, raw)) => serde_json::from_str(raw.get()).unwrap_or(Value::Null),
    };
    (id, op_from_fields(rest))
}

/// The id of a request that cannot be parsed whole (not JSON after its start, or too long
/// to be read at all), when the request begins with it: `{"id": 7, ...` or
/// `{"id": "r-1", ...`. Null otherwise, as for an id that is too long or not a number or
/// string. Clients that put `id` first can thus match even these refusals.
pub fn leading_id(request: &[u8]) -> Value {
    let text = match std::str::from_utf8(request) {
        Ok(text) => text,
        Err(e) => std::str::from_utf8(&request[..e.valid_up_to()]).unwrap_or_default(),
    };
    let Some(rest) = text
        .trim_start()
        .strip_prefix('{')
        .map(str::trim_start)
        .and_then(|r| r.strip_prefix("\"id\""))
        .map(str::trim_start)
        .and_then(|r| r.strip_prefix(':'))
        .map(str::trim_start)
    else {
        return Value::Null;
    };
    // One byte past the longest id, so that a longer one is seen to be cut off.
    let mut end = rest.len().min(MAX_ID_BYTES + 1);
    while !rest.is_char_boundary(end) {
        end -= 1;
    }
    let mut values = serde_json::Deserializer::from_str(&rest[..end]).into_iter::<Value>();
    match values.next() {
        Some(Ok(id @ (Value::Number(_) | Value::String(_))))
            if values.byte_offset() <= MAX_ID_BYTES =>
        {
            id
        }
        _ => Value::Null,
    }
}

/// A bincode frame's op text (its id travels in the frame).
pub fn parse_op(text: &str) -> Result<Op, RequestError> {
    op_from_fields(parse_fields(text)?.0)
}

fn op_from_fields(fields: Vec<(String, Box<RawValue>)>) -> Result<Op, RequestError> {
    let (op, rest): (Vec<_>, Vec<_>) = fields.into_iter().partition(|(key, _)| key == "op");
    let Some(name) = op
        .first()
        .and_then(|(_, raw)| serde_json::from_str::<String>(raw.get()).ok())
    else {
        return Err(RequestError::MissingOp);
    };
    // The op's own fields, put back together as one object for its strict struct.
    let mut object = String::from("{");
    for (i, (key, raw)) in rest.iter().enumerate() {
        if i > 0 {
            object.push(',');
        }
        object.push_str(&Value::from(key.as_str()).to_string());
        object.push(':');
        object.push_str(raw.get());
    }
    object.push('}');
    let unit = |op: Op| match rest.first() {
        None => Ok(op),
        Some((key, _)) => Err(RequestError::Fields {
            op: name.clone(),
            message: format!("unknown field `{key}`: this op takes no fields"),
        }),
    };
    let op = match name.as_str() {
        "tools" => Op::Tools(fields_of(&name, &object)?),
        "health" => unit(Op::Health)?,
        "stats" => unit(Op::Stats)?,
        "call" => Op::Call(fields_of(&name, &object)?),
        "propose" => Op::Propose(fields_of(&name, &object)?),
        "cancel" => Op::Cancel(fields_of(&name, &object)?),
        "execute" => Op::Execute(fields_of(&name, &object)?),
        "reject" => Op::Reject(fields_of(&name, &object)?),
        "set_state" => Op::SetState(fields_of(&name, &object)?),
        "session_open" => Op::SessionOpen(fields_of(&name, &object)?),
        "put_file" => Op::PutFile(fields_of(&name, &object)?),
        "get_file" => Op::GetFile(fields_of(&name, &object)?),
        "changes" => Op::Changes(fields_of(&name, &object)?),
        "session_close" => Op::SessionClose(fields_of(&name, &object)?),
        "session_set" => Op::SessionSet(fields_of(&name, &object)?),
        _ => return Err(RequestError::UnknownOp(name)),
    };
    check_ids(&op)?;
    Ok(op)
}

fn fields_of<T: DeserializeOwned>(op: &str, object: &str) -> Result<T, RequestError> {
    serde_json::from_str(object).map_err(|e| RequestError::Fields {
        op: op.to_string(),
        // serde_json's position is in the reassembled object, not the client's line.
        message: e
            .to_string()
            .rsplit_once(" at line ")
            .map_or_else(|| e.to_string(), |(m, _)| m.to_string()),
    })
}

/// Ids end up in results, logs and audit records: short, printable, and never empty.
fn check_id(name: &'static str, id: &str) -> Result<(), RequestError> {
    if id.is_empty() || id.len() > MAX_ID_BYTES || id.chars().any(char::is_control) {
        return Err(RequestError::BadId(name));
    }
    Ok(())
}

fn check_ids(op: &Op) -> Result<(), RequestError> {
    match op {
        Op::Call(request) | Op::Propose(request) => {
            // A tool name is checked like an id before the gate sees it: an unknown tool is
            // refused and audited by name, and the refusal repeats it.
            check_id("tool", &request.tool)?;
            if let Some(call_id) = &request.call_id {
                check_id("call_id", call_id)?;
            }
            if let Some(session) = &request.session {
                check_id("session", session)?;
            }
            Ok(())
        }
        Op::Execute(request) => {
            if let Some(session) = &request.session {
                check_id("session", session)?;
            }
            Ok(())
        }
        Op::SetState(request) => {
            check_id("tool", &request.tool)?;
            request
                .session
                .as_ref()
                .map_or(Ok(()), |session| check_id("session", session))
        }
        Op::Tools(ToolsRequest {
            session: Some(session),
        })
        | Op::PutFile(PutFileRequest { session, .. })
        | Op::GetFile(GetFileRequest { session, .. })
        | Op::Changes(SessionRequest { session })
        | Op::SessionClose(SessionRequest { session })
        | Op::SessionSet(SessionSetRequest { session, .. }) => check_id("session", session),
        Op::Cancel(request) if request.target.to_string().len() > MAX_ID_BYTES => {
            Err(RequestError::BadId("target"))
        }
        _ => Ok(()),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(line: &str) -> RequestError {
        match parse_line(line).1 {
            Ok(op) => panic!("accepted {line}: {op:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn an_unknown_field_is_refused_by_name_for_every_op() {
        for line in [
            r#"{"id":1,"op":"call","tool":"t","dry_runn":true}"#,
            r#"{"id":1,"op":"propose","tool":"t","dry_runn":true}"#,
            r#"{"id":1,"op":"cancel","target":1,"dry_runn":true}"#,
            r#"{"id":1,"op":"execute","approval_id":"a","dry_runn":true}"#,
            r#"{"id":1,"op":"reject","approval_id":"a","dry_runn":true}"#,
            r#"{"id":1,"op":"set_state","tool":"t","state":"active","dry_runn":true}"#,
            r#"{"id":1,"op":"tools","dry_runn":true}"#,
            r#"{"id":1,"op":"health","dry_runn":true}"#,
            r#"{"id":1,"op":"stats","dry_runn":true}"#,
        ] {
            let e = refusal(line);
            assert!(e.to_string().contains("dry_runn"), "{line}: {e}");
        }
    }

    #[test]
    fn a_duplicated_key_is_refused_even_when_both_values_agree() {
        assert_eq!(
            refusal(r#"{"id":1,"op":"call","tool":"t","dry_run":false,"dry_run":false}"#),
            RequestError::DuplicateField("dry_run".into())
        );
        assert_eq!(
            refusal(r#"{"id":1,"id":2,"op":"health"}"#),
            RequestError::DuplicateField("id".into())
        );
    }

    #[test]
    fn a_cancel_target_is_refused_by_its_text_before_it_is_parsed() {
        let zeros = vec!["0"; 1_000_000].join(",");
        let line = format!(r#"{{"id":1,"op":"cancel","target":[{zeros}]}}"#);
        assert!(line.len() < MAX_REQUEST_BYTES);
        // Refused while the op's fields are read, not by the id checks after a tree of a
        // million nodes is built from it.
        match refusal(&line) {
            RequestError::Fields { op, message } => {
                assert_eq!(op, "cancel");
                assert!(message.contains("target"), "{message}");
            }
            other => panic!("refused too late: {other:?}"),
        }
        let long = format!(
            r#"{{"op":"cancel","target":"{}"}}"#,
            "x".repeat(MAX_ID_BYTES)
        );
        assert!(matches!(parse_op(&long), Err(RequestError::Fields { .. })));
        let Ok(Op::Cancel(cancel)) = parse_op(r#"{"op":"cancel","target": "r-1"}"#) else {
            panic!("a short target is refused")
        };
        assert_eq!(cancel.target, json!("r-1"));
    }

    #[test]
    fn the_id_comes_back_with_a_refusal_and_nested_arguments_stay_text() {
        let (id, op) = parse_line(r#"{"id":"r-1","op":"nope"}"#);
        assert_eq!(id, json!("r-1"));
        assert_eq!(op.unwrap_err(), RequestError::UnknownOp("nope".into()));
        let (id, op) = parse_line(
            r#"{"op":"call","id":7,"tool":"t","arguments":{"a": [1, 2]},"dry_run":true}"#,
        );
        assert_eq!(id, json!(7));
        let Ok(Op::Call(call)) = op else {
            panic!("{op:?}")
        };
        assert_eq!(call.arguments.unwrap().get(), r#"{"a": [1, 2]}"#);
        assert!(call.dry_run);
    }

    #[test]
    fn a_request_that_cannot_be_read_whole_still_gets_its_leading_id_back() {
        assert_eq!(leading_id(br#"{"id": 7, "op": "call", "tool": "#), json!(7));
        assert_eq!(leading_id(br#" { "id" : "r-1","op":"#), json!("r-1"));
        assert_eq!(
            leading_id(b"{\"id\":\"caf\xc3\xa9\",\"op\":\xff"),
            json!("caf\u{e9}")
        );
        // Not first, not a number or string, cut off, or too long: no id to give back.
        assert_eq!(leading_id(br#"{"op":"call","id":7"#), Value::Null);
        assert_eq!(leading_id(br#"{"id":{"a":1},"op":"call""#), Value::Null);
        assert_eq!(leading_id(br#"{"id":"r-"#), Value::Null);
        assert_eq!(leading_id(b"not json"), Value::Null);
        let long = "x".repeat(MAX_ID_BYTES);
        assert_eq!(
            leading_id(format!(r#"{{"id":"{long}","op""#).as_bytes()),
            Value::Null
        );
        let fits = "x".repeat(MAX_ID_BYTES - 2);
        assert_eq!(
            leading_id(format!(r#"{{"id":"{fits}","op""#).as_bytes()),
            json!(fits)
        );
        // parse_line uses it for requests that are not JSON past their id.
        let (id, op) = parse_line(r#"{"id": 9, "op": "call", oops}"#);
        assert_eq!(id, json!(9));
        assert!(matches!(op, Err(RequestError::NotJson { .. })));
    }

    #[test]
    fn malformed_requests_get_typed_refusals() {
        assert!(matches!(refusal("{"), RequestError::NotJson { .. }));
        assert!(matches!(refusal("[1]"), RequestError::NotObject(_)));
        assert_eq!(refusal(r#"{"id":1}"#), RequestError::MissingOp);
        assert_eq!(refusal(r#"{"op":3}"#), RequestError::MissingOp);
        let long = "x".repeat(MAX_ID_BYTES + 1);
        assert_eq!(
            refusal(&format!(r#"{{"id":"{long}","op":"health"}}"#)),
            RequestError::BadId("id")
        );
        assert_eq!(
            refusal(r#"{"op":"call","tool":"t","call_id":"a\nb"}"#),
            RequestError::BadId("call_id")
        );
        assert_eq!(
            refusal(r#"{"op":"call","tool":"t","session":""}"#),
            RequestError::BadId("session")
        );
        assert!(matches!(
            refusal(r#"{"op":"call"}"#),
            RequestError::Fields { .. }
        ));
    }

    #[test]
    fn tool_names_are_bounded_like_ids_in_every_op_that_names_one() {
        let long = "x".repeat(MAX_ID_BYTES + 1);
        for op in ["call", "propose"] {
            assert_eq!(
                refusal(&format!(r#"{{"op":"{op}","tool":"{long}"}}"#)),
                RequestError::BadId("tool")
            );
            assert_eq!(
                refusal(&format!(r#"{{"op":"{op}","tool":"a\u0007b"}}"#)),
                RequestError::BadId("tool")
            );
        }
        assert_eq!(
            refusal(&format!(
                r#"{{"op":"set_state","tool":"{long}","state":"active"}}"#
            )),
            RequestError::BadId("tool")
        );
    }

    #[test]
    fn what_the_client_sends_parses_back_to_the_same_op() {
        let op = Op::Call(CallRequest {
            tool: "t".into(),
            arguments_json: Some("{}".into()),
            timeout_ms: Some(5),
            ..CallRequest::default()
        });
        let text = serde_json::to_string(&op).unwrap();
        let Ok(Op::Call(back)) = parse_op(&text) else {
            panic!("{text}")
        };
        assert_eq!(back.timeout_ms, Some(5));
        assert_eq!(back.arguments_json.as_deref(), Some("{}"));
        assert!(matches!(parse_op(r#"{"op":"health"}"#), Ok(Op::Health)));
    }
}
