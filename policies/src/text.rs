//! Text that callers chose, shortened before it is repeated back to them or logged.

/// `text` cut to at most `max` bytes at a character boundary, ending in `…` if it was cut.
pub fn clipped(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_kept_and_long_text_is_cut_at_a_character_boundary() {
        assert_eq!(clipped("abc", 3), "abc");
        assert_eq!(clipped("abcd", 3), "…");
        assert_eq!(clipped("abcdef", 5), "ab…");
        let cut = clipped(&"é".repeat(100), 10);
        assert!(cut.len() <= 10, "{cut}");
        assert_eq!(cut, "ééé…");
    }
}
