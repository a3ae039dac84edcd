//! How much memory parsed arguments hold.

use serde_json::Value;

/// An estimate of the heap memory `value` holds: each node's own slot, strings' bytes and
/// each map entry's key and bookkeeping (serde_json's map is a B-tree: a few words per entry).
pub(crate) fn json_heap_bytes(value: &Value) -> usize {
    const SLOT: usize = std::mem::size_of::<Value>();
    match value {
        Value::Null | Value::Bool(_) | Value::Number(_) => 0,
        Value::String(text) => text.capacity(),
        Value::Array(items) => items.iter().map(|item| SLOT + json_heap_bytes(item)).sum(),
        Value::Object(map) => map
            .iter()
            .map(|(key, item)| key.capacity() + SLOT + 3 * SLOT + json_heap_bytes(item))
            .sum(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsed_arguments_count_far_more_than_their_text_where_they_are_many_small_values() {
        let text = format!("[{}0]", "0,".repeat(10_000));
        let value: Value = serde_json::from_str(&text).unwrap_or_default();
        assert!(json_heap_bytes(&value) >= 10 * text.len());
        let long = Value::String("x".repeat(1000));
        assert!(json_heap_bytes(&long) >= 1000);
        let object: Value = serde_json::json!({"key": "value"});
        assert!(json_heap_bytes(&object) > "keyvalue".len());
    }
}
