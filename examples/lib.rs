//! Helpers shared by the examples (see the `[[example]]` targets of this package).

use std::time::Duration;

/// Parses a duration such as `500ms`, `10s`, `2m`, `1h` or `1d`.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(ratelimit_examples::parse_duration("500ms"), Ok(Duration::from_millis(500)));
/// assert!(ratelimit_examples::parse_duration("10 parsecs").is_err());
/// ```
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{text:?}: missing unit (use us, ms, s, m, h or d)"))?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?}: expected a whole number before the unit"))?;
    let micros_per_unit: u64 = match unit {
        "us" => 1,
        "ms" => 1_000,
        "s" => 1_000_000,
        "m" => 60_000_000,
        "h" => 3_600_000_000,
        "d" => 86_400_000_000,
        _ => {
            return Err(format!(
                "{text:?}: unknown unit {unit:?} (use us, ms, s, m, h or d)"
            ));
        }
    };
    n.checked_mul(micros_per_unit)
        .map(Duration::from_micros)
        .ok_or_else(|| format!("{text:?}: too long"))
}
