//! JSON-RPC 2.0 as MCP uses it: one message per line, classified strictly into a request,
//! a notification or a response, and the error answers the specification names.

use serde_json::{Map, Value, json};

use crate::daemon::MAX_ID_BYTES;

/// Invalid JSON was received.
pub const PARSE_ERROR: i64 = -32700;
/// The JSON sent is not a valid request object.
pub const INVALID_REQUEST: i64 = -32600;
/// The method does not exist or is not available.
pub const METHOD_NOT_FOUND: i64 = -32601;
/// Invalid method parameters.
pub const INVALID_PARAMS: i64 = -32602;

/// One message from the client.
#[derive(Debug, Clone, PartialEq)]
pub enum Incoming {
    /// A request: it gets exactly one answer with its id.
    Request {
        /// Its id (a string or a number).
        id: Value,
        /// The method.
        method: String,
        /// Its params (an object or an array), if any.
        params: Option<Value>,
    },
    /// A notification: never answered.
    Notification {
        /// The method.
        method: String,
        /// Its params, if any.
        params: Option<Value>,
    },
    /// The answer to a request this server sent the client.
    Response {
        /// The id of the server's request.
        id: Value,
        /// `Ok(result)` or `Err(error object)`.
        outcome: Result<Value, Value>,
    },
}

/// Why a line is not a message this server can take; answered with `id` (null when the
/// line had none worth echoing).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    /// Not JSON (or not UTF-8).
    #[error("parse error: {0}")]
    NotJson(String),
    /// JSON, but not a JSON-RPC 2.0 message.
    #[error("invalid request: {0}")]
    Invalid(String),
}

impl MessageError {
    /// The JSON-RPC error code of this refusal.
    pub fn code(&self) -> i64 {
        match self {
            Self::NotJson(_) => PARSE_ERROR,
            Self::Invalid(_) => INVALID_REQUEST,
        }
    }
}

/// Whether `id` may identify a request: a string or a number, short, as MCP requires
/// (never null).
fn valid_id(id: &Value) -> bool {
    (id.is_string() || id.is_number()) && id.to_string().len() <= MAX_ID_BYTES
}

/// Classifies one line (without its newline). On failure also returns the id to answer
/// with: the line's own when it had a usable one, so the client can match the refusal.
pub fn parse_message(line: &[u8]) -> Result<Incoming, (Value, MessageError)> {
    let text = std::str::from_utf8(line).map_err(|e| {
        let at = e.valid_up_to();
        (
            Value::Null,
            MessageError::NotJson(format!("not UTF-8 after byte {at}")),
        )
    })?;
    let value: Value = serde_json::from_str(text).map_err(|e| {
        let message = if e.is_syntax() || e.is_eof() {
            format!("line {}, column {}", e.line(), e.column())
        } else {
            e.to_string()
        };
        (Value::Null, MessageError::NotJson(message))
    })?;
    let mut object = match value {
        Value::Object(object) => object,
        Value::Array(_) => {
            return Err((
                Value::Null,
                MessageError::Invalid("batches are not supported: send one message a line".into()),
            ));
        }
        _ => {
            return Err((
                Value::Null,
                MessageError::Invalid("a message is a JSON object".into()),
            ));
        }
    };
    let id = object.remove("id");
    // An id is echoed only when it is one a client could match.
    let echo = id.clone().filter(valid_id).unwrap_or(Value::Null);
    let invalid = |message: &str| (echo.clone(), MessageError::Invalid(message.into()));
    if object.get("jsonrpc") != Some(&Value::from("2.0")) {
        return Err(invalid("\"jsonrpc\" must be \"2.0\""));
    }
    if let Some(id) = &id
        && !valid_id(id)
    {
        return Err(invalid(&format!(
            "\"id\" must be a string or a number of at most {MAX_ID_BYTES} bytes"
        )));
    }
    match object.remove("method") {
        Some(Value::String(method)) => {
            let params = object.remove("params");
            if params
                .as_ref()
                .is_some_and(|p| !p.is_object() && !p.is_array())
            {
                return Err(invalid("\"params\" must be an object or an array"));
            }
            Ok(match id {
                Some(id) => Incoming::Request { id, method, params },
                None => Incoming::Notification { method, params },
            })
        }
        Some(_) => Err(invalid("\"method\" must be a string")),
        None => {
            let Some(id) = id else {
                return Err(invalid("a message has a \"method\" or answers an \"id\""));
            };
            match (object.remove("result"), object.remove("error")) {
                (Some(result), None) => Ok(Incoming::Response {
                    id,
                    outcome: Ok(result),
                }),
                (None, Some(error)) => Ok(Incoming::Response {
                    id,
                    outcome: Err(error),
                }),
                _ => Err(invalid(
                    "a response has exactly one of \"result\" and \"error\"",
                )),
            }
        }
    }
}

/// A success answer, as one line.
pub fn result_line(id: &Value, result: Value) -> Vec<u8> {
    line(&json!({"jsonrpc": "2.0", "id": id, "result": result}))
}

/// An error answer, as one line.
pub fn error_line(id: &Value, code: i64, message: &str) -> Vec<u8> {
    line(&json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}))
}

/// A notification to the client, as one line.
pub fn notification_line(method: &str, params: Option<Value>) -> Vec<u8> {
    let mut message = Map::new();
    message.insert("jsonrpc".into(), "2.0".into());
    message.insert("method".into(), method.into());
    if let Some(params) = params {
        message.insert("params".into(), params);
    }
    line(&Value::Object(message))
}

/// A request to the client, as one line.
pub fn request_line(id: &Value, method: &str, params: Value) -> Vec<u8> {
    line(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
}

/// `value` and a newline. serde_json escapes control characters inside strings, so the
/// only newline is the last byte: one message is one line.
fn line(value: &Value) -> Vec<u8> {
    let mut bytes = value.to_string().into_bytes();
    bytes.push(b'\n');
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(line: &str) -> (Value, i64) {
        match parse_message(line.as_bytes()) {
            Ok(message) => panic!("accepted {line}: {message:?}"),
            Err((id, e)) => (id, e.code()),
        }
    }

    #[test]
    fn requests_notifications_and_responses_are_told_apart() {
        assert_eq!(
            parse_message(br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#).unwrap(),
            Incoming::Request {
                id: json!(1),
                method: "ping".into(),
                params: None
            }
        );
        assert_eq!(
            parse_message(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).unwrap(),
            Incoming::Notification {
                method: "notifications/initialized".into(),
                params: None
            }
        );
        assert_eq!(
            parse_message(br#"{"jsonrpc":"2.0","id":"s-1","result":{"action":"accept"}}"#).unwrap(),
            Incoming::Response {
                id: json!("s-1"),
                outcome: Ok(json!({"action": "accept"}))
            }
        );
    }

    #[test]
    fn malformed_messages_get_the_specified_codes_and_keep_a_usable_id() {
        assert_eq!(refusal("{"), (Value::Null, PARSE_ERROR));
        assert_eq!(refusal("[]"), (Value::Null, INVALID_REQUEST));
        assert_eq!(refusal("3"), (Value::Null, INVALID_REQUEST));
        assert_eq!(
            refusal(r#"{"jsonrpc":"1.0","id":7,"method":"ping"}"#),
            (json!(7), INVALID_REQUEST)
        );
        assert_eq!(
            refusal(r#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#),
            (Value::Null, INVALID_REQUEST)
        );
        assert_eq!(
            refusal(r#"{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}"#),
            (Value::Null, INVALID_REQUEST)
        );
        assert_eq!(
            refusal(r#"{"jsonrpc":"2.0","id":2,"method":"ping","params":"x"}"#),
            (json!(2), INVALID_REQUEST)
        );
        assert_eq!(
            refusal(r#"{"jsonrpc":"2.0","id":3,"method":4}"#),
            (json!(3), INVALID_REQUEST)
        );
        assert_eq!(
            refusal(r#"{"jsonrpc":"2.0","id":4,"result":1,"error":{}}"#),
            (json!(4), INVALID_REQUEST)
        );
        let long = "x".repeat(MAX_ID_BYTES + 1);
        assert_eq!(
            refusal(&format!(
                r#"{{"jsonrpc":"2.0","id":"{long}","method":"ping"}}"#
            )),
            (Value::Null, INVALID_REQUEST)
        );
        assert!(matches!(
            parse_message(b"{\"a\":\"\xff\"}"),
            Err((Value::Null, MessageError::NotJson(_)))
        ));
    }

    #[test]
    fn every_answer_is_exactly_one_line() {
        let bytes = result_line(&json!(1), json!({"text": "a\nb\r\n"}));
        assert_eq!(bytes.iter().filter(|b| **b == b'\n').count(), 1);
        assert_eq!(bytes.last(), Some(&b'\n'));
        let bytes = error_line(&Value::Null, PARSE_ERROR, "bad\nline");
        assert_eq!(bytes.iter().filter(|b| **b == b'\n').count(), 1);
    }
}
