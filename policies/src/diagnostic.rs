//! Diagnostics: `FILE:LINE:COL: error: MESSAGE`, computed from byte spans in the policy text.

use std::fmt;
use std::ops::Range;

use serde::Serialize;

/// How serious a diagnostic is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The policy is accepted, but grants something risky.
    Warning,
    /// The policy is refused.
    Error,
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Severity::Warning => "warning",
            Severity::Error => "error",
        })
    }
}

/// One finding about a policy file, located at a line and column (both 1-based).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Diagnostic {
    /// Error or warning.
    pub severity: Severity,
    /// File name as given by the caller.
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column, in characters.
    pub column: usize,
    /// What is wrong, in lower case, without echoing secrets.
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}: {}",
            self.file, self.line, self.column, self.severity, self.message
        )
    }
}

/// The text of a policy file and its name, used to turn byte spans into lines and columns.
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    /// Name shown in diagnostics.
    pub name: &'a str,
    /// The whole text.
    pub text: &'a str,
}

impl<'a> Source<'a> {
    /// Wraps a file's name and text.
    pub fn new(name: &'a str, text: &'a str) -> Self {
        Self { name, text }
    }

    /// 1-based (line, column) of a byte offset; offsets past the end point at the end.
    pub fn line_column(&self, offset: usize) -> (usize, usize) {
        let mut offset = offset.min(self.text.len());
        while !self.text.is_char_boundary(offset) {
            offset -= 1;
        }
        let before = &self.text[..offset];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let column = before[line_start..].chars().count() + 1;
        (line, column)
    }

    /// A diagnostic at the start of `span`.
    pub fn diagnostic(
        &self,
        severity: Severity,
        span: Range<usize>,
        message: impl Into<String>,
    ) -> Diagnostic {
        let (line, column) = self.line_column(span.start);
        Diagnostic {
            severity,
            file: self.name.to_string(),
            line,
            column,
            message: message.into(),
        }
    }

    /// An error at the start of `span`.
    pub fn error(&self, span: Range<usize>, message: impl Into<String>) -> Diagnostic {
        self.diagnostic(Severity::Error, span, message)
    }

    /// A warning at the start of `span`.
    pub fn warning(&self, span: Range<usize>, message: impl Into<String>) -> Diagnostic {
        self.diagnostic(Severity::Warning, span, message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_map_to_one_based_lines_and_character_columns() {
        let source = Source::new("p.toml", "a = 1\nbé = 2\n");
        assert_eq!(source.line_column(0), (1, 1));
        assert_eq!(source.line_column(4), (1, 5));
        assert_eq!(source.line_column(6), (2, 1));
        // 'é' is two bytes but one column.
        assert_eq!(source.line_column(9), (2, 3));
        assert_eq!(source.line_column(10_000), (3, 1));
    }

    #[test]
    fn diagnostics_render_as_file_line_column_severity_message() {
        let source = Source::new("p.toml", "x\ny = 2\n");
        let d = source.error(2..3, "bad thing");
        assert_eq!(d.to_string(), "p.toml:2:1: error: bad thing");
        let w = source.warning(4..5, "risky");
        assert_eq!(w.to_string(), "p.toml:2:3: warning: risky");
    }
}
