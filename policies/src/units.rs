//! Human-readable sizes (`"256MiB"`) and durations (`"30s"`) used in policy files.

use std::time::Duration;

/// Why a size or duration string was refused. Messages name the expected form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitError {
    /// The text has no number in front.
    #[error("expected a number followed by a unit, like {example:?}")]
    NoNumber {
        /// An example of the accepted form.
        example: &'static str,
    },
    /// The unit is not one we know.
    #[error("unknown unit {unit:?}; use one of {accepted}")]
    UnknownUnit {
        /// The unit as written.
        unit: String,
        /// The accepted units.
        accepted: &'static str,
    },
    /// The value does not fit.
    #[error("value is too large")]
    Overflow,
    /// The value is zero or negative where a positive one is needed.
    #[error("value must be greater than zero")]
    NotPositive,
}

const SIZE_UNITS: &str = "B, KiB, MiB, GiB, TiB, kB, MB, GB, TB";
const DURATION_UNITS: &str = "ms, s, m, h";

/// Splits `"1.5MiB"` into `("1.5", "MiB")`.
fn split_number(text: &str) -> (&str, &str) {
    let text = text.trim();
    let end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(text.len());
    (&text[..end], text[end..].trim())
}

/// Parses a decimal number with an optional fraction into (integer part, fraction digits).
fn parse_decimal(number: &str, example: &'static str) -> Result<f64, UnitError> {
    let cleaned: String = number.chars().filter(|c| *c != '_').collect();
    if cleaned.is_empty() || cleaned.starts_with('.') || cleaned.ends_with('.') {
        return Err(UnitError::NoNumber { example });
    }
    if cleaned.matches('.').count() > 1 {
        return Err(UnitError::NoNumber { example });
    }
    cleaned
        .parse::<f64>()
        .map_err(|_| UnitError::NoNumber { example })
}

/// Parses a byte size: `"256MiB"`, `"64KiB"`, `"1GB"`, `"4096"` (bytes), `"1.5GiB"`.
pub fn parse_size(text: &str) -> Result<u64, UnitError> {
    const EXAMPLE: &str = "256MiB";
    let (number, unit) = split_number(text);
    let value = parse_decimal(number, EXAMPLE)?;
    let multiplier: f64 = match unit {
        "" | "B" => 1.0,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        "TiB" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        "kB" | "KB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        other => {
            return Err(UnitError::UnknownUnit {
                unit: other.to_string(),
                accepted: SIZE_UNITS,
            });
        }
    };
    let bytes = (value * multiplier).round();
    // 2^63 keeps every later conversion to i64 (cgroup files, rlimits) exact.
    if !bytes.is_finite() || bytes >= 9.2e18 {
        return Err(UnitError::Overflow);
    }
    Ok(bytes as u64)
}

/// Parses a strictly positive duration: `"30s"`, `"500ms"`, `"2m"`, `"1h"`, `"1.5s"`.
pub fn parse_duration(text: &str) -> Result<Duration, UnitError> {
    const EXAMPLE: &str = "30s";
    let (number, unit) = split_number(text);
    let value = parse_decimal(number, EXAMPLE)?;
    let seconds_per_unit: f64 = match unit {
        "ms" => 1e-3,
        "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        "" => return Err(UnitError::NoNumber { example: EXAMPLE }),
        other => {
            return Err(UnitError::UnknownUnit {
                unit: other.to_string(),
                accepted: DURATION_UNITS,
            });
        }
    };
    let seconds = value * seconds_per_unit;
    if !seconds.is_finite() || seconds > 1e9 {
        return Err(UnitError::Overflow);
    }
    let duration = Duration::from_secs_f64(seconds);
    if duration.is_zero() {
        return Err(UnitError::NotPositive);
    }
    Ok(duration)
}

/// Formats a byte count the way a policy author would write it.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    for (name, size) in UNITS {
        if bytes >= size && bytes.is_multiple_of(size) {
            return format!("{}{name}", bytes / size);
        }
    }
    format!("{bytes}B")
}

/// Formats a duration the way a policy author would write it.
pub fn format_duration(duration: Duration) -> String {
    let ms = duration.as_millis();
    if ms.is_multiple_of(3_600_000) && ms > 0 {
        format!("{}h", ms / 3_600_000)
    } else if ms.is_multiple_of(60_000) && ms > 0 {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_binary_decimal_and_bare_byte_units() {
        assert_eq!(parse_size("256MiB"), Ok(256 << 20));
        assert_eq!(parse_size("64KiB"), Ok(64 << 10));
        assert_eq!(parse_size("1GB"), Ok(1_000_000_000));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size(" 16 MiB "), Ok(16 << 20));
        assert_eq!(parse_size("1_024B"), Ok(1024));
    }

    #[test]
    fn sizes_with_unknown_units_or_no_number_are_refused() {
        assert!(matches!(
            parse_size("256mb"),
            Err(UnitError::UnknownUnit { .. })
        ));
        assert!(matches!(
            parse_size("lots"),
            Err(UnitError::NoNumber { .. })
        ));
        assert!(matches!(
            parse_size("-1MiB"),
            Err(UnitError::NoNumber { .. })
        ));
        assert!(matches!(
            parse_size("1.2.3B"),
            Err(UnitError::NoNumber { .. })
        ));
        assert_eq!(parse_size("99999999TiB"), Err(UnitError::Overflow));
    }

    #[test]
    fn durations_must_be_positive_and_finite() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("0s"), Err(UnitError::NotPositive));
        assert!(matches!(
            parse_duration("30"),
            Err(UnitError::NoNumber { .. })
        ));
        assert!(matches!(
            parse_duration("inf"),
            Err(UnitError::NoNumber { .. })
        ));
        assert!(matches!(
            parse_duration("1e99h"),
            Err(UnitError::UnknownUnit { .. })
        ));
        assert_eq!(parse_duration("99999999999h"), Err(UnitError::Overflow));
    }

    #[test]
    fn formatting_round_trips_through_parsing() {
        for bytes in [1u64, 4096, 64 << 10, 256 << 20, 3 << 30] {
            assert_eq!(parse_size(&format_size(bytes)), Ok(bytes));
        }
        for ms in [1u64, 500, 30_000, 120_000, 7_200_000] {
            let d = Duration::from_millis(ms);
            assert_eq!(parse_duration(&format_duration(d)), Ok(d));
        }
    }
}
