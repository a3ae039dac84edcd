//! `--input`: a tool call's arguments as JSON text on the command line, `@-` to read them
//! from standard input (a pipe from another program, no shell quoting), `@FILE` from a file.

use std::io::Read;

use airlock_policy::schema::DEFAULT_MAX_INPUT_BYTES;

/// The most bytes read: the gate refuses larger arguments anyway, and a bound keeps a
/// mistaken `--input @/dev/zero` from filling memory first.
pub(crate) const MAX_INPUT_BYTES: usize = DEFAULT_MAX_INPUT_BYTES;

/// Why `--input` could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum InputError {
    /// `@` with nothing after it.
    #[error("--input @: name a file after @, or @- for standard input")]
    NoFileName,
    /// The file or stdin could not be read.
    #[error("--input @{source_name}: cannot read: {error}")]
    Read {
        source_name: String,
        error: std::io::Error,
    },
    /// More than [`MAX_INPUT_BYTES`].
    #[error(
        "--input @{source_name}: more than {limit} bytes (1 MiB, the gate's limit on a call's arguments)"
    )]
    TooLarge { source_name: String, limit: usize },
    /// Not UTF-8, so not JSON text.
    #[error("--input @{source_name}: not UTF-8 text, so not JSON")]
    NotUtf8 { source_name: String },
}

/// The arguments `--input` gives: the text itself, or what `@-` or `@FILE` holds.
pub(crate) fn arguments(input: &str) -> Result<String, InputError> {
    let Some(name) = input.strip_prefix('@') else {
        return Ok(input.to_string());
    };
    let read_error = |error| InputError::Read {
        source_name: name.to_string(),
        error,
    };
    let bytes = match name {
        "" => return Err(InputError::NoFileName),
        "-" => read_bounded(std::io::stdin().lock()).map_err(read_error)?,
        path => read_bounded(std::fs::File::open(path).map_err(read_error)?).map_err(read_error)?,
    };
    if bytes.len() > MAX_INPUT_BYTES {
        return Err(InputError::TooLarge {
            source_name: name.to_string(),
            limit: MAX_INPUT_BYTES,
        });
    }
    String::from_utf8(bytes).map_err(|_| InputError::NotUtf8 {
        source_name: name.to_string(),
    })
}

/// Up to one byte more than the limit: enough to tell that it was passed.
fn read_bounded(reader: impl Read) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    reader
        .take(
            u64::try_from(MAX_INPUT_BYTES)
                .unwrap_or(u64::MAX)
                .saturating_add(1),
        )
        .read_to_end(&mut bytes)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn literal_json_is_taken_as_it_is() {
        assert_eq!(arguments(r#"{"a": 1}"#).unwrap(), r#"{"a": 1}"#);
    }

    #[test]
    fn a_file_is_read_whole() {
        let path = std::env::temp_dir().join(format!("airlock-input-{}", std::process::id()));
        std::fs::write(&path, r#"{"text": "a b"}"#).unwrap();
        let read = arguments(&format!("@{}", path.display()));
        let _ = std::fs::remove_file(&path);
        assert_eq!(read.unwrap(), r#"{"text": "a b"}"#);
    }

    #[test]
    fn a_missing_file_names_itself() {
        let error = arguments("@/nonexistent/airlock-input").unwrap_err();
        assert!(
            error.to_string().contains("/nonexistent/airlock-input"),
            "{error}"
        );
    }

    #[test]
    fn more_than_the_limit_is_refused() {
        let error = arguments("@/dev/zero").unwrap_err();
        assert!(matches!(error, InputError::TooLarge { .. }), "{error}");
    }

    #[test]
    fn a_bare_at_sign_is_refused() {
        assert!(matches!(arguments("@"), Err(InputError::NoFileName)));
    }
}
