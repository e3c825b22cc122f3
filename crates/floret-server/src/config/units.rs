//! Sizes and durations in human units: a setting ending in `_bytes` takes
//! `64MiB` (B, KiB, MiB, GiB, TiB) as well as a plain number of bytes, and
//! one ending in `_ms` takes `30s` (ms, s, min, h) as well as a plain
//! number of milliseconds, in the file and in variables alike.
//!
//! IMPLEMENTATION CAVEATS
//! - Decimal units (KB, MB) are refused rather than guessed at.

use std::fmt;

use serde::Deserializer;
use serde::de::{self, Visitor};

/// Bytes in `text`: a number, then optionally a binary unit.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    parse_with_units(
        text,
        &[
            ("", 1),
            ("B", 1),
            ("KiB", 1 << 10),
            ("MiB", 1 << 20),
            ("GiB", 1 << 30),
            ("TiB", 1 << 40),
        ],
        "a size: a number of bytes, or with B, KiB, MiB, GiB or TiB (`64MiB`)",
    )
}

/// Milliseconds in `text`: a number, then optionally a unit of time.
pub fn parse_millis(text: &str) -> Result<u64, String> {
    parse_with_units(
        text,
        &[
            ("", 1),
            ("ms", 1),
            ("s", 1_000),
            ("min", 60_000),
            ("h", 3_600_000),
        ],
        "a duration: a number of milliseconds, or with ms, s, min or h (`30s`)",
    )
}

fn parse_with_units(text: &str, units: &[(&str, u64)], expected: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let unit = unit.trim();
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not {expected}"))?;
    let (_, scale) = units
        .iter()
        .find(|(name, _)| *name == unit)
        .ok_or_else(|| format!("{text:?} is not {expected}"))?;
    number
        .checked_mul(*scale)
        .ok_or_else(|| format!("{text:?} is too large"))
}

/// Deserializes a size: a number of bytes or text with a unit.
pub fn bytes<'de, D: Deserializer<'de>, T: TryFrom<u64>>(deserializer: D) -> Result<T, D::Error> {
    deserializer.deserialize_any(WithUnits {
        parse: parse_bytes,
        marker: std::marker::PhantomData,
    })
}

/// Deserializes a duration: a number of milliseconds or text with a unit.
pub fn millis<'de, D: Deserializer<'de>, T: TryFrom<u64>>(deserializer: D) -> Result<T, D::Error> {
    deserializer.deserialize_any(WithUnits {
        parse: parse_millis,
        marker: std::marker::PhantomData,
    })
}

struct WithUnits<T> {
    parse: fn(&str) -> Result<u64, String>,
    marker: std::marker::PhantomData<T>,
}

impl<T: TryFrom<u64>> Visitor<'_> for WithUnits<T> {
    type Value = T;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a number, or a number with a unit such as `64MiB` or `30s`")
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<T, E> {
        T::try_from(value).map_err(|_| E::custom(format!("{value} is too large")))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<T, E> {
        let value = u64::try_from(value).map_err(|_| E::custom("must not be negative"))?;
        self.visit_u64(value)
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<T, E> {
        let value = (self.parse)(text).map_err(E::custom)?;
        self.visit_u64(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_size_or_duration_had_to_be_counted_out_in_bytes_or_milliseconds() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("64MiB"), Ok(64 << 20));
        assert_eq!(parse_bytes("8 GiB"), Ok(8 << 30));
        assert!(parse_bytes("64MB").unwrap_err().contains("KiB, MiB"));
        assert!(parse_bytes("lots").is_err());
        assert_eq!(parse_millis("250"), Ok(250));
        assert_eq!(parse_millis("30s"), Ok(30_000));
        assert_eq!(parse_millis("2min"), Ok(120_000));
        assert_eq!(parse_millis("1h"), Ok(3_600_000));
        assert!(parse_millis("1.5s").is_err(), "whole numbers only");
        assert!(
            parse_bytes("99999999999TiB")
                .unwrap_err()
                .contains("too large")
        );
    }
}
