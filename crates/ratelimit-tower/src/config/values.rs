//! Values written as strings in a configuration (durations, rates, networks,
//! methods, routes, keys), read with [`Parse`] into [`Parsed`] fields.

use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use http::{HeaderName, Method};
use ratelimit_core::Rate;
use ratelimit_core::algorithm::MAX_HORIZON_MICROS;
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
