//! The configuration as written: serde types, checked field by field while
//! they are read, so a malformed value fails with its path (and, in TOML, its
//! line).

use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use http::{HeaderName, Method};
use ratelimit_core::Rate;
use ratelimit_core::algorithm::MAX_HORIZON_MICROS;
use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::keys::{Cidr, ForwardingHeader};
use crate::options::MissingKey;

/// The whole document.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ConfigSpec {
    #[serde(default, deserialize_with = "unique_policies")]
    pub(super) policies: Vec<(String, PolicySpec)>,
    #[serde(default)]
    pub(super) rules: Vec<RuleSpec>,
    #[serde(default)]
    pub(super) client_ip: Option<ClientIpSpec>,
}

/// `[policies.<name>]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PolicySpec {
    pub(super) algorithm: AlgorithmKind,
    pub(super) limit: u64,
    pub(super) rate: Option<Parsed<Rate>>,
    pub(super) window: Option<Parsed<Duration>>,
    pub(super) lease: Option<Parsed<Duration>>,
    #[serde(default)]
    pub(super) shadow: bool,
}

/// The algorithm names of [`Algorithm::kind`](ratelimit_core::Algorithm::kind).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum AlgorithmKind {
    FixedWindow,
    SlidingLog,
    SlidingWindow,
    TokenBucket,
    Gcra,
    LeakyBucket,
    Concurrency,
}

/// Which of `rate`, `window` and `lease` an algorithm takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Period {
    Rate,
    Window,
    Lease,
}

impl Period {
    pub(super) fn field(self) -> &'static str {
        match self {
            Period::Rate => "rate",
            Period::Window => "window",
            Period::Lease => "lease",
        }
    }

    pub(super) fn example(self) -> &'static str {
        match self {
            Period::Rate => "rate = \"10/s\"",
            Period::Window => "window = \"1m\"",
            Period::Lease => "lease = \"30s\"",
        }
    }
}

impl AlgorithmKind {
    pub(super) fn name(self) -> &'static str {
        match self {
            AlgorithmKind::FixedWindow => "fixed-window",
            AlgorithmKind::SlidingLog => "sliding-log",
            AlgorithmKind::SlidingWindow => "sliding-window",
            AlgorithmKind::TokenBucket => "token-bucket",
            AlgorithmKind::Gcra => "gcra",
            AlgorithmKind::LeakyBucket => "leaky-bucket",
            AlgorithmKind::Concurrency => "concurrency",
        }
    }

    pub(super) fn period(self) -> Period {
        match self {
            AlgorithmKind::FixedWindow
            | AlgorithmKind::SlidingLog
            | AlgorithmKind::SlidingWindow => Period::Window,
            AlgorithmKind::TokenBucket | AlgorithmKind::Gcra | AlgorithmKind::LeakyBucket => {
                Period::Rate
            }
            AlgorithmKind::Concurrency => Period::Lease,
        }
    }
}

/// `[[rules]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RuleSpec {
    pub(super) policy: String,
    pub(super) key: KeySpec,
    #[serde(default = "one")]
    pub(super) cost: u64,
    pub(super) routes: Option<Vec<Parsed<Route>>>,
    pub(super) methods: Option<Vec<Parsed<Method>>>,
    #[serde(default)]
    pub(super) missing_key: Option<MissingKeySpec>,
}

fn one() -> u64 {
    1
}

/// `missing_key = "allow" | "reject"`.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum MissingKeySpec {
    Allow,
    Reject,
}

impl From<MissingKeySpec> for MissingKey {
    fn from(spec: MissingKeySpec) -> Self {
        match spec {
            MissingKeySpec::Allow => MissingKey::Allow,
            MissingKeySpec::Reject => MissingKey::Reject,
        }
    }
}

/// `[client_ip]`: how the `client-ip` key finds the client behind proxies.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ClientIpSpec {
    #[serde(default)]
    pub(super) trusted_proxies: Vec<Parsed<Cidr>>,
    #[serde(default)]
    pub(super) header: HeaderSpec,
    pub(super) ipv6_prefix: Option<u8>,
    pub(super) max_hops: Option<usize>,
}

/// `header = "auto" | "forwarded" | "x-forwarded-for"`.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum HeaderSpec {
    #[default]
    Auto,
    Forwarded,
    XForwardedFor,
}

impl From<HeaderSpec> for ForwardingHeader {
    fn from(spec: HeaderSpec) -> Self {
        match spec {
            HeaderSpec::Auto => ForwardingHeader::Auto,
            HeaderSpec::Forwarded => ForwardingHeader::Forwarded,
            HeaderSpec::XForwardedFor => ForwardingHeader::XForwardedFor,
        }
    }
}

/// A rule's key: one part, or several joined (`["route", "ip"]`).
#[derive(Debug, Clone)]
pub(super) struct KeySpec(pub(super) Vec<KeyPart>);

/// One part of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum KeyPart {
    Global,
    PeerIp,
    ClientIp,
    Route,
    Header(HeaderName),
}

const KEY_KINDS: &str = "\"global\", \"ip\", \"client-ip\", \"route\" or \"header:<name>\"";

impl std::str::FromStr for KeyPart {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "global" => Ok(KeyPart::Global),
            "ip" => Ok(KeyPart::PeerIp),
            "client-ip" => Ok(KeyPart::ClientIp),
            "route" => Ok(KeyPart::Route),
            _ => match s.strip_prefix("header:") {
                Some(name) => HeaderName::from_bytes(name.trim().as_bytes())
                    .map(KeyPart::Header)
                    .map_err(|_| format!("invalid header name {name:?}")),
                None => Err(format!("unknown key {s:?}: use {KEY_KINDS}")),
            },
        }
    }
}

impl<'de> Deserialize<'de> for KeySpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;

        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = KeySpec;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "a key ({KEY_KINDS}) or a list of them")
            }

            fn visit_str<E: de::Error>(self, s: &str) -> Result<KeySpec, E> {
                s.parse().map(|part| KeySpec(vec![part])).map_err(E::custom)
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<KeySpec, A::Error> {
                let mut parts = Vec::new();
                while let Some(Parsed(part)) = seq.next_element::<Parsed<KeyPart>>()? {
                    parts.push(part);
                }
                if parts.is_empty() {
                    return Err(de::Error::custom("a key list must not be empty"));
                }
                Ok(KeySpec(parts))
            }
        }

        deserializer.deserialize_any(KeyVisitor)
    }
}

/// A route prefix: starts with `/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Route(pub(super) String);

impl std::str::FromStr for Route {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if !s.starts_with('/') {
            return Err(format!("a route prefix starts with '/', not {s:?}"));
        }
        if s.contains(['?', '#']) {
            return Err(format!(
                "a route prefix is a path, without query or fragment: {s:?}"
            ));
        }
        Ok(Route(s.to_owned()))
    }
}

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

/// The policies map, in document order, refusing a name defined twice (JSON
/// allows it; TOML already refuses it).
fn unique_policies<'de, D>(deserializer: D) -> Result<Vec<(String, PolicySpec)>, D::Error>
where
    D: Deserializer<'de>,
{
    struct PoliciesVisitor;

    impl<'de> Visitor<'de> for PoliciesVisitor {
        type Value = Vec<(String, PolicySpec)>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a table of named policies")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut policies: Vec<(String, PolicySpec)> = Vec::new();
            while let Some(name) = map.next_key::<String>()? {
                if policies.iter().any(|(n, _)| *n == name) {
                    return Err(de::Error::custom(format!(
                        "policy {name:?} is defined twice"
                    )));
                }
                let spec = map.next_value::<PolicySpec>()?;
                policies.push((name, spec));
            }
            Ok(policies)
        }
    }

    deserializer.deserialize_map(PoliciesVisitor)
}

const UNITS: &str = "us, ms, s, m, h or d";

fn unit_micros(unit: &str) -> Option<u64> {
    Some(match unit {
        "us" => 1,
        "ms" => 1_000,
        "s" => 1_000_000,
        "m" => 60_000_000,
        "h" => 3_600_000_000,
        "d" => 86_400_000_000,
        _ => return None,
    })
}

/// `500ms`, `10s`, `1m`, `1h30m`: whole numbers, each with a unit.
pub(super) fn parse_duration(text: &str) -> Result<Duration, String> {
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(String::from(
            "empty duration: write a number and a unit, such as \"1m\"",
        ));
    }
    let mut total: u64 = 0;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(format!(
                "invalid duration {text:?}: expected a number and a unit ({UNITS}), such as \"1m\""
            ));
        }
        let (number, after) = rest.split_at(digits);
        let unit_len = after
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        if unit.is_empty() && after.starts_with(char::is_whitespace) {
            return Err(format!(
                "invalid duration {text:?}: write the unit right after the number, such as \"1m\""
            ));
        }
        if unit.is_empty() {
            return Err(format!(
                "invalid duration {text:?}: {number} needs a unit ({UNITS})"
            ));
        }
        let per_unit = unit_micros(unit).ok_or_else(|| {
            format!("invalid duration {text:?}: unknown unit {unit:?} (use {UNITS})")
        })?;
        total = number
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(per_unit))
            .and_then(|n| n.checked_add(total))
            .filter(|&n| n <= MAX_HORIZON_MICROS)
            .ok_or_else(|| format!("duration {text:?} is too long (at most about 35 years)"))?;
        rest = after;
    }
    Ok(Duration::from_micros(total))
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
    let period = match unit_micros(period) {
        Some(micros) => Duration::from_micros(micros),
        None if !period.is_empty() && period.bytes().all(|b| b.is_ascii_alphabetic()) => {
            return Err(format!(
                "invalid rate {text:?}: unknown unit {period:?} (use {UNITS})"
            ));
        }
        None => parse_duration(period).map_err(|e| format!("invalid rate {text:?}: {e}"))?,
    };
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
        for bad in ["", "10", "s", "1x", "1.5s", "1 s", "-1s", "99999999999d"] {
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
        for bad in ["10", "x/s", "10/", "10/x", "-1/s", "10/1.5s"] {
            assert!(parse_rate(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn keys() {
        assert_eq!("ip".parse::<KeyPart>(), Ok(KeyPart::PeerIp));
        assert_eq!(
            "header:X-Api-Key".parse::<KeyPart>(),
            Ok(KeyPart::Header(HeaderName::from_static("x-api-key")))
        );
        assert!("header:".parse::<KeyPart>().is_err());
        assert!("header:bad name".parse::<KeyPart>().is_err());
        assert!("user".parse::<KeyPart>().is_err());
    }
}
