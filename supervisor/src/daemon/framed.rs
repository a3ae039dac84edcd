//! Answers to a bincode-framed connection, as the frames written to it.

use airlock_protocol::codec::MAX_FRAME_BYTES;
use airlock_protocol::frame::{FrameError, encode_frame_with_max};

use super::wire::{FrameResponse, error_body};

/// `response` as one frame. An answer too large for a frame is answered by a refusal
/// instead: dropped, it would leave the client waiting for it for ever.
pub(super) fn answer_frame(response: &FrameResponse) -> Vec<u8> {
    answer_frame_with_max(response, MAX_FRAME_BYTES)
}

fn answer_frame_with_max(response: &FrameResponse, max: usize) -> Vec<u8> {
    let error = match encode_frame_with_max(response, max) {
        Ok(frame) => return frame,
        Err(error) => error,
    };
    let message = match error {
        FrameError::TooLarge { len, max } => format!(
            "the answer takes {len} bytes, more than a frame carries ({max} bytes); \
             ask for less, or over the JSON-lines protocol, which has no such bound"
        ),
        other => format!("the answer could not be framed: {other}"),
    };
    tracing::warn!(id = response.id, %message, "answer to a framed client refused");
    let refusal = FrameResponse {
        id: response.id,
        body_json: error_body("answer_too_large", message).to_string(),
    };
    // A few hundred bytes: only a maximum smaller than any answer could refuse it.
    encode_frame_with_max(&refusal, max).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_protocol::frame::FrameDecoder;
    use serde_json::{Value, json};

    fn response(id: u64, body: &Value) -> FrameResponse {
        FrameResponse {
            id,
            body_json: body.to_string(),
        }
    }

    fn decoded(frame: &[u8], max: usize) -> (u64, Value) {
        let mut decoder = FrameDecoder::with_max_frame_bytes(max);
        let mut input = frame;
        let response: FrameResponse = decoder
            .decode_message(&mut input)
            .unwrap()
            .unwrap_or_else(|| panic!("no whole frame in {} bytes", frame.len()));
        (
            response.id,
            serde_json::from_str(&response.body_json).unwrap(),
        )
    }

    #[test]
    fn an_answer_that_fits_is_framed_as_it_is() {
        let body = json!({"result": {"ok": true}});
        assert_eq!(
            decoded(&answer_frame(&response(7, &body)), MAX_FRAME_BYTES),
            (7, body)
        );
    }

    #[test]
    fn an_answer_too_large_for_a_frame_is_answered_by_a_refusal_that_fits() {
        let max = 4096;
        let body = json!({"result": {"stdout": "x".repeat(max * 2)}});
        let (id, answer) = decoded(&answer_frame_with_max(&response(9, &body), max), max);
        assert_eq!(id, 9);
        assert_eq!(answer["error"]["kind"], "answer_too_large", "{answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains("4096"), "{message}");
    }

    #[test]
    fn an_answer_over_the_real_frame_limit_still_gets_a_frame() {
        let body = json!({"result": {"stdout": "x".repeat(MAX_FRAME_BYTES + 1)}});
        let (id, answer) = decoded(&answer_frame(&response(3, &body)), MAX_FRAME_BYTES);
        assert_eq!(id, 3);
        assert_eq!(answer["error"]["kind"], "answer_too_large", "{answer}");
    }
}
