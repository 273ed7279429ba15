//! The configuration as written: serde types, checked field by field while
//! they are read, so a malformed value fails with its path (and, in TOML, its
//! line).

use std::fmt;
use std::time::Duration;

use http::{HeaderName, Method};
use ratelimit_core::{AlgorithmKind, Period as CalendarPeriod, Rate};
use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};

use super::values::{Parsed, UtcOffset};
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
    #[serde(default)]
    pub(super) ip: Option<IpSpec>,
}

/// `[policies.<name>]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PolicySpec {
    #[serde(deserialize_with = "algorithm_kind")]
    pub(super) algorithm: AlgorithmKind,
    pub(super) limit: u64,
    pub(super) rate: Option<Parsed<Rate>>,
    pub(super) window: Option<Parsed<Duration>>,
    pub(super) lease: Option<Parsed<Duration>>,
    /// A fixed window of calendar periods, instead of `window`.
    pub(super) period: Option<Parsed<CalendarPeriod>>,
    /// With `period`: its offset from UTC.
    pub(super) utc_offset: Option<Parsed<UtcOffset>>,
    #[serde(default)]
    pub(super) shadow: bool,
}

/// Every algorithm's name, for serde's "expected one of" message.
const ALGORITHM_NAMES: [&str; AlgorithmKind::ALL.len()] = {
    let mut names = [""; AlgorithmKind::ALL.len()];
    let mut i = 0;
    while i < names.len() {
        names[i] = AlgorithmKind::ALL[i].name();
        i += 1;
    }
    names
};

/// `algorithm = "<name>"`: one of [`AlgorithmKind`]'s names.
fn algorithm_kind<'de, D: Deserializer<'de>>(deserializer: D) -> Result<AlgorithmKind, D::Error> {
    let name = String::deserialize(deserializer)?;
    name.parse()
        .map_err(|_| de::Error::unknown_variant(&name, &ALGORITHM_NAMES))
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

/// Which period field `kind` takes.
pub(super) fn period(kind: AlgorithmKind) -> Period {
    match kind {
        AlgorithmKind::FixedWindow | AlgorithmKind::SlidingLog | AlgorithmKind::SlidingWindow => {
            Period::Window
        }
        AlgorithmKind::TokenBucket | AlgorithmKind::Gcra | AlgorithmKind::LeakyBucket => {
            Period::Rate
        }
        AlgorithmKind::Concurrency => Period::Lease,
    }
}

/// `[[rules]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RuleSpec {
    pub(super) policy: String,
    pub(super) key: KeySpec,
    /// Default 1; with `settle`, the estimate is `settle.estimate` instead.
    pub(super) cost: Option<u64>,
    pub(super) routes: Option<Vec<Parsed<Route>>>,
    pub(super) methods: Option<Vec<Parsed<Method>>>,
    #[serde(default)]
    pub(super) missing_key: Option<MissingKeySpec>,
    #[serde(default)]
    pub(super) settle: Option<SettleSpec>,
}

fn one() -> u64 {
    1
}

fn yes() -> bool {
    true
}

/// `settle = { header = "x-tokens-used", estimate = 1, refund_on = "5xx" }`:
/// the rule's cost is read from a response header, after a reservation of
/// `estimate`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SettleSpec {
    pub(super) header: Parsed<HeaderName>,
    #[serde(default = "one")]
    pub(super) estimate: u64,
    #[serde(default)]
    pub(super) refund_on: RefundOnSpec,
    #[serde(default = "yes")]
    pub(super) refund_cancelled: bool,
    #[serde(default)]
    pub(super) keep_header: bool,
}

/// `refund_on`: which responses give their reservation back.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
pub(super) enum RefundOnSpec {
    /// Server errors (the default).
    #[default]
    #[serde(rename = "5xx")]
    ServerErrors,
    /// Client and server errors.
    #[serde(rename = "4xx-5xx")]
    Errors,
    /// None.
    #[serde(rename = "never")]
    Never,
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
    /// Required with trusted proxies (checked when compiled).
    pub(super) header: Option<HeaderSpec>,
    pub(super) ipv6_prefix: Option<u8>,
    pub(super) max_hops: Option<usize>,
}

/// `[ip]`: how the `ip` key keys IPv6 peers.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct IpSpec {
    pub(super) ipv6_prefix: Option<u8>,
}

/// `header = "forwarded" | "x-forwarded-for"`: the header the trusted
/// proxies write. There is no `"auto"` (see [`ForwardingHeader`]).
#[derive(Debug, Clone, Copy)]
pub(super) enum HeaderSpec {
    Forwarded,
    XForwardedFor,
}

/// The names `header` takes.
const HEADER_NAMES: &[&str] = &["x-forwarded-for", "forwarded"];

impl<'de> Deserialize<'de> for HeaderSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        match name.as_str() {
            "forwarded" => Ok(HeaderSpec::Forwarded),
            "x-forwarded-for" => Ok(HeaderSpec::XForwardedFor),
            "auto" => Err(de::Error::custom(
                "\"auto\" is not accepted: it reads `Forwarded` when a request has one, \
                 and proxies that append to X-Forwarded-For (nginx, AWS ALB) pass a \
                 client's own `Forwarded` through; name the header your trusted proxies \
                 write: \"x-forwarded-for\" or \"forwarded\"",
            )),
            _ => Err(de::Error::unknown_variant(&name, HEADER_NAMES)),
        }
    }
}

impl From<HeaderSpec> for ForwardingHeader {
    fn from(spec: HeaderSpec) -> Self {
        match spec {
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

/// A route prefix: starts with `/`; a segment may be a parameter as axum
/// writes it (`{id}`, or a last `{*rest}`).
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
        if s.parse::<http::uri::PathAndQuery>().is_err() {
            return Err(format!(
                "a route prefix holds only what a request's path can (no spaces, \
                 control characters or '<', '>', '`'): {s:?}"
            ));
        }
        // Requests are matched with slashes merged, dot segments resolved and
        // unreserved bytes decoded: a prefix written otherwise would match
        // only the spellings a router never runs, so it is a mistake.
        if s.contains("//") {
            return Err(format!("a route prefix has no empty segment ('//'): {s:?}"));
        }
        if s.split('/')
            .any(|segment| segment == "." || segment == "..")
        {
            return Err(format!("a route prefix has no '.' or '..' segment: {s:?}"));
        }
        if let Some(escape) = unreserved_escape(s) {
            return Err(format!(
                "a route prefix writes {escape:?} as the character it encodes: {s:?}"
            ));
        }
        if s.split('/').filter(|segment| !segment.is_empty()).count() > crate::path::MAX_ROUTE_DEPTH
        {
            return Err(format!(
                "a route prefix has at most {} segments: {s:?}",
                crate::path::MAX_ROUTE_DEPTH
            ));
        }
        // A parameter, as axum writes routes, matches any segment (see
        // `routes::Prefix`); a brace anywhere else would match no
        // request's path.
        let segments: Vec<&str> = s.split('/').collect();
        for (i, segment) in segments.iter().enumerate() {
            if !segment.contains(['{', '}']) {
                continue;
            }
            let name = segment
                .strip_prefix('{')
                .and_then(|rest| rest.strip_suffix('}'))
                .map(|name| name.strip_prefix('*').unwrap_or(name));
            let whole = name.is_some_and(|name| !name.is_empty() && !name.contains(['{', '}']));
            let wildcard_not_last = segment.starts_with("{*") && i + 1 != segments.len();
            if !whole || wildcard_not_last {
                return Err(format!(
                    "a route prefix writes a parameter as a whole segment, `{{name}}`, or \
                     a last `{{*name}}`, as axum does: {s:?}"
                ));
            }
        }
        Ok(Route(s.to_owned()))
    }
}

/// The first `%XX` in `s` that encodes a byte RFC 3986 calls unreserved
/// (letters, digits, `-`, `.`, `_`, `~`).
fn unreserved_escape(s: &str) -> Option<&str> {
    s.match_indices('%').find_map(|(at, _)| {
        let escape = s.get(at..at + 3)?;
        let byte = u8::from_str_radix(&escape[1..], 16).ok()?;
        crate::path::unreserved(byte).then_some(escape)
    })
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

#[cfg(test)]
mod tests {
    use super::*;

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
