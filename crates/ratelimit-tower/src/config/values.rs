//! Values written as strings in a configuration (durations, rates, networks,
//! methods, routes, keys), read with [`Parse`] into [`Parsed`] fields.

use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use http::{HeaderName, Method};
use ratelimit_core::algorithm::MAX_HORIZON_MICROS;
use ratelimit_core::{Period, Rate};
use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

use super::schema::{KeyPart, Route};
use crate::keys::Cidr;

/// A value read from a string with [`Parse`].
#[derive(Debug, Clone)]
pub(super) struct Parsed<T>(pub(super) T);

/// How a value is read from its configuration string.
pub(super) trait Parse: Sized {
    /// What the value looks like, for error messages.
    const EXPECTING: &'static str;

    fn parse(s: &str) -> Result<Self, String>;
}

impl Parse for Duration {
    const EXPECTING: &'static str = "a duration such as \"500ms\", \"10s\", \"1m\" or \"1h30m\"";

    fn parse(s: &str) -> Result<Self, String> {
        parse_duration(s)
    }
}

impl Parse for Rate {
    const EXPECTING: &'static str = "a rate such as \"10/s\", \"100/m\" or \"5/10s\"";

    fn parse(s: &str) -> Result<Self, String> {
        parse_rate(s)
    }
}

impl Parse for Period {
    const EXPECTING: &'static str = "a calendar period: \"day\", \"week\", \"month\" or \"year\"";

    fn parse(s: &str) -> Result<Self, String> {
        s.parse()
            .map_err(|e: ratelimit_core::algorithm::calendar::UnknownPeriod| e.to_string())
    }
}

/// A fixed offset from UTC, in seconds east: `+02:00`, `-05:30`,
/// `+05:45:30`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct UtcOffset(pub(super) i32);

impl Parse for UtcOffset {
    const EXPECTING: &'static str = "an offset from UTC such as \"+02:00\" or \"-05:30\"";

    fn parse(s: &str) -> Result<Self, String> {
        parse_utc_offset(s).map(UtcOffset)
    }
}

impl Parse for Cidr {
    const EXPECTING: &'static str = "a network such as \"10.0.0.0/8\" or an address";

    fn parse(s: &str) -> Result<Self, String> {
        s.parse().map_err(|e: crate::CidrError| e.to_string())
    }
}

impl Parse for Method {
    const EXPECTING: &'static str = "an HTTP method such as \"GET\"";

    fn parse(s: &str) -> Result<Self, String> {
        if s.bytes().any(|b| b.is_ascii_lowercase()) {
            return Err(format!(
                "methods are case-sensitive: write {:?}, not {s:?}",
                s.to_ascii_uppercase()
            ));
        }
        Method::from_bytes(s.as_bytes()).map_err(|_| format!("invalid HTTP method {s:?}"))
    }
}

impl Parse for HeaderName {
    const EXPECTING: &'static str = "a header name such as \"x-tokens-used\"";

    fn parse(s: &str) -> Result<Self, String> {
        HeaderName::from_bytes(s.trim().as_bytes())
            .map_err(|_| format!("invalid header name {s:?}"))
    }
}

impl Parse for Route {
    const EXPECTING: &'static str = "a path prefix such as \"/api/\"";

    fn parse(s: &str) -> Result<Self, String> {
        s.parse()
    }
}

impl Parse for KeyPart {
    const EXPECTING: &'static str =
        "a key: \"global\", \"ip\", \"client-ip\", \"route\" or \"header:<name>\"";

    fn parse(s: &str) -> Result<Self, String> {
        s.parse()
    }
}

impl<'de, T: Parse> Deserialize<'de> for Parsed<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ParseVisitor<T>(PhantomData<T>);

        impl<T: Parse> Visitor<'_> for ParseVisitor<T> {
            type Value = Parsed<T>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(T::EXPECTING)
            }

            fn visit_str<E: de::Error>(self, s: &str) -> Result<Parsed<T>, E> {
                T::parse(s).map(Parsed).map_err(E::custom)
            }
        }

        deserializer.deserialize_str(ParseVisitor(PhantomData))
    }
}

/// The longest duration a policy can use, as a `Duration`.
const MAX_DURATION: Duration = Duration::from_micros(MAX_HORIZON_MICROS);

/// `500ms`, `10s`, `1m`, `1h 30m`, read by `humantime`: whole numbers, each
/// with a unit (`us`, `ms`, `s`, `m`, `h`, `d` and their long names).
pub(super) fn parse_duration(text: &str) -> Result<Duration, String> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(String::from(
            "empty duration: write a number and a unit, such as \"1m\"",
        ));
    }
    let duration = humantime::parse_duration(trimmed)
        .map_err(|e| format!("invalid duration {text:?}: {e}"))?;
    if duration > MAX_DURATION {
        return Err(format!(
            "duration {text:?} is too long (at most about 35 years)"
        ));
    }
    Ok(duration)
}

/// `+02:00`, `-05:30`, `+05:45:30`: a sign, two digits of hours (below 24),
/// two of minutes and optionally two of seconds (below 60), in seconds east
/// of UTC. The sign is required, so that a bare `02:00` is not read as
/// either side.
pub(super) fn parse_utc_offset(text: &str) -> Result<i32, String> {
    let invalid = |why: &str| {
        format!(
            "invalid UTC offset {text:?}: {why}; write a sign, hours and minutes, \
             such as \"+02:00\" or \"-05:30\""
        )
    };
    let (sign, rest) = match text.as_bytes().first() {
        Some(b'+') => (1, &text[1..]),
        Some(b'-') => (-1, &text[1..]),
        _ => return Err(invalid("it starts with '+' or '-'")),
    };
    let mut parts = [0i32; 3];
    let mut count = 0;
    for (i, part) in rest.split(':').enumerate() {
        if i >= 3 || part.len() != 2 || !part.bytes().all(|b| b.is_ascii_digit()) {
            return Err(invalid("expected HH:MM or HH:MM:SS"));
        }
        parts[i] = part
            .parse()
            .map_err(|_| invalid("expected HH:MM or HH:MM:SS"))?;
        count = i + 1;
    }
    if count < 2 {
        return Err(invalid("expected HH:MM or HH:MM:SS"));
    }
    let [hours, minutes, seconds] = parts;
    if hours > 23 || minutes > 59 || seconds > 59 {
        return Err(invalid(
            "an offset is less than 24 hours, minutes and seconds below 60",
        ));
    }
    Ok(sign * (hours * 3600 + minutes * 60 + seconds))
}

/// `10/s`, `100/m`, `5/10s`, `1/500ms`: an amount per period.
pub(super) fn parse_rate(text: &str) -> Result<Rate, String> {
    let Some((amount, period)) = text.split_once('/') else {
        return Err(format!(
            "invalid rate {text:?}: expected an amount per period, such as \"10/s\" or \"100/m\""
        ));
    };
    let amount: u64 = amount.trim().parse().map_err(|_| {
        format!("invalid rate {text:?}: the amount before '/' must be a whole number")
    })?;
    let period = period.trim();
    // A bare unit is one of it: `10/s` is `10/1s`.
    let period = if !period.is_empty() && period.bytes().all(|b| b.is_ascii_alphabetic()) {
        humantime::parse_duration(&format!("1{period}")).map_err(|e| e.to_string())
    } else {
        parse_duration(period)
    }
    .map_err(|e| format!("invalid rate {text:?}: {e}"))?;
    Ok(Rate::new(amount, period))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration(" 250us "), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        // humantime's forms: fractions, long unit names, spaces between spans.
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2 minutes"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
        for bad in ["", "10", "s", "1x", "-1s", "one minute", "99999999999d"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn utc_offsets() {
        assert_eq!(parse_utc_offset("+02:00"), Ok(7_200));
        assert_eq!(parse_utc_offset("-05:30"), Ok(-19_800));
        assert_eq!(parse_utc_offset("+00:00"), Ok(0));
        assert_eq!(parse_utc_offset("-00:00:01"), Ok(-1));
        assert_eq!(parse_utc_offset("+23:59:59"), Ok(86_399));
        for bad in [
            "",
            "02:00",
            "+2:00",
            "+02",
            "+0200",
            "+24:00",
            "-25:00",
            "+02:60",
            "+02:00:60",
            "+02:00:00:00",
            "+ 2:00",
            "+02:0a",
            "UTC",
            "+٠٢:00",
        ] {
            let error = parse_utc_offset(bad).unwrap_err();
            assert!(error.contains("\"+02:00\""), "{bad:?}: {error}");
        }
    }

    #[test]
    fn rates() {
        assert_eq!(parse_rate("10/s"), Ok(Rate::per_second(10)));
        assert_eq!(parse_rate("100 / m"), Ok(Rate::per_minute(100)));
        assert_eq!(
            parse_rate("5/10s"),
            Ok(Rate::new(5, Duration::from_secs(10)))
        );
        assert_eq!(
            parse_rate("3/1.5s"),
            Ok(Rate::new(3, Duration::from_millis(1500)))
        );
        assert_eq!(parse_rate("60/min"), Ok(Rate::per_minute(60)));
        for bad in ["10", "x/s", "10/", "10/x", "-1/s", "10/-1s"] {
            assert!(parse_rate(bad).is_err(), "{bad:?}");
        }
    }
}
