//! Compiling: the parsed [schema](super::schema) checked field by field into
//! policies and rules ready to apply.

use std::sync::Arc;

use ratelimit_core::{AlgorithmKind, Policy, PolicyError};

use super::values::{Parsed, UtcOffset};

use super::load::Inner;
use super::matching::{ConfiguredRule, KeySource};
use super::routes::{Prefix, Routes};
use super::schema::{
    ClientIpSpec, ConfigSpec, IpSpec, KeyPart, Period, PolicySpec, RefundOnSpec, RuleSpec,
    SettleSpec, period,
};
use super::{Config, ConfigError, ConfigErrorKind};
use crate::keys::{Cidr, CidrError, ClientIp, ForwardingHeader, HeaderKey, PeerIp, TrustedProxies};
use crate::options::MissingKey;
use crate::settlement::{SettleError, Settlement};

/// The configuration `spec` describes, or the first field at fault.
pub(super) fn compile(spec: ConfigSpec) -> Result<Config, ConfigError> {
    let mut policies = Vec::with_capacity(spec.policies.len());
    for (name, policy) in spec.policies {
        policies.push(build_policy(&name, policy)?);
    }
    policies.sort_by(|a: &Policy, b: &Policy| a.name().cmp(b.name()));
    let client_ip = spec.client_ip.map(build_client_ip).transpose()?;
    let peer_ip = spec.ip.map(build_peer_ip).transpose()?.flatten();
    let mut rules = Vec::with_capacity(spec.rules.len());
    let mut routes = Vec::new();
    let mut keyed: Vec<(String, Vec<KeyPart>)> = Vec::with_capacity(spec.rules.len());
    for (index, rule) in spec.rules.into_iter().enumerate() {
        if let Some((earlier, (_, parts))) =
            keyed.iter().enumerate().find(|(_, (policy, parts))| {
                *policy == rule.policy && headers_apart(parts, &rule.key.0)
            })
        {
            return Err(ConfigError::new(
                ConfigErrorKind::Rule,
                format!("rules[{index}].key"),
                format!(
                    "policy {:?} is keyed by {} in rules[{earlier}] and by {} here: a header's \
                     value is one budget whichever header brings it, so a client could spend \
                     another's budget by sending its value in the other header; give each \
                     header its own policy",
                    rule.policy,
                    describe(parts),
                    describe(&rule.key.0),
                ),
            ));
        }
        keyed.push((rule.policy.clone(), rule.key.0.clone()));
        let keys = Keys {
            client_ip: client_ip.as_ref(),
            peer_ip: peer_ip.as_ref(),
        };
        rules.push(build_rule(index, rule, &policies, keys, &mut routes)?);
    }
    only_peeked(&rules)?;
    Ok(Config {
        inner: Arc::new(Inner {
            policies,
            rules,
            routes: Routes::join(routes),
        }),
    })
}

/// Refuses a configuration that asks a policy only at cost 0: a cost of 0
/// reports and never spends, so no rule would limit it (a `cost = 0`
/// written for 10, or copied from a peek rule).
fn only_peeked(rules: &[ConfiguredRule]) -> Result<(), ConfigError> {
    let peeks = |rule: &ConfiguredRule| rule.cost == 0 && rule.settlement.is_none();
    let Some((index, rule)) = rules.iter().enumerate().find(|(_, rule)| {
        peeks(rule)
            && rules
                .iter()
                .filter(|other| other.policy.name() == rule.policy.name())
                .all(peeks)
    }) else {
        return Ok(());
    };
    Err(ConfigError::new(
        ConfigErrorKind::Rule,
        format!("rules[{index}].cost"),
        format!(
            "policy {:?} is asked only at cost 0, which reports without spending: no rule \
             would limit it; give a rule a cost of 1 or more (leave cost out for 1)",
            rule.policy.name()
        ),
    ))
}

/// Whether two keys differ only in the headers they read: their values
/// would then meet in one budget (a value is keyed alike from any header),
/// while keys of other shapes never meet (an address is text, a value a
/// hash, a join length-prefixed).
pub(super) fn headers_apart(a: &[KeyPart], b: &[KeyPart]) -> bool {
    a.len() == b.len()
        && a != b
        && a.iter().zip(b).all(|pair| match pair {
            (KeyPart::Header(_), KeyPart::Header(_)) => true,
            (x, y) => x == y,
        })
}

/// A key as the configuration writes it: `header:x-api-key`, `["route", "ip"]`.
pub(super) fn describe(parts: &[KeyPart]) -> String {
    let part = |part: &KeyPart| match part {
        KeyPart::Global => String::from("global"),
        KeyPart::PeerIp => String::from("ip"),
        KeyPart::ClientIp => String::from("client-ip"),
        KeyPart::Route => String::from("route"),
        KeyPart::Header(name) => format!("header:{name}"),
    };
    match parts {
        [one] => part(one),
        _ => format!(
            "[{}]",
            parts.iter().map(part).collect::<Vec<_>>().join(", ")
        ),
    }
}

fn build_policy(name: &str, spec: PolicySpec) -> Result<Policy, ConfigError> {
    let base = format!("policies.{name}");
    let algorithm = spec.algorithm;
    let period = period(algorithm);
    let given = [
        (Period::Rate, spec.rate.is_some()),
        (Period::Window, spec.window.is_some()),
        (Period::Lease, spec.lease.is_some()),
    ];
    for (field, present) in given {
        if present && field != period {
            return Err(ConfigError::new(
                ConfigErrorKind::Policy,
                format!("{base}.{}", field.field()),
                format!(
                    "{} takes no {}: write {}",
                    algorithm.name(),
                    field.field(),
                    period.example()
                ),
            ));
        }
    }
    let missing = || {
        ConfigError::new(
            ConfigErrorKind::Policy,
            format!("{base}.{}", period.field()),
            format!(
                "missing: {} needs a {}, such as {}",
                algorithm.name(),
                period.field(),
                period.example()
            ),
        )
    };
    let calendar = calendar_fields(&base, &spec)?;
    let limit = spec.limit;
    let built = match algorithm {
        AlgorithmKind::FixedWindow => match calendar {
            Some((period, offset)) => Policy::calendar(limit, period.utc_offset(offset)),
            None => {
                let window = spec.window.ok_or_else(|| {
                    ConfigError::new(
                        ConfigErrorKind::Policy,
                        format!("{base}.window"),
                        "missing: fixed-window needs a window, such as window = \"1m\", \
                         or a calendar period, such as period = \"month\"",
                    )
                })?;
                Policy::fixed_window(limit, window.0)
            }
        },
        AlgorithmKind::SlidingLog => {
            Policy::sliding_window_log(limit, spec.window.ok_or_else(missing)?.0)
        }
        AlgorithmKind::SlidingWindow => {
            Policy::sliding_window_counter(limit, spec.window.ok_or_else(missing)?.0)
        }
        AlgorithmKind::TokenBucket => Policy::token_bucket(limit, spec.rate.ok_or_else(missing)?.0),
        AlgorithmKind::Gcra => Policy::gcra(limit, spec.rate.ok_or_else(missing)?.0),
        AlgorithmKind::LeakyBucket => Policy::leaky_bucket(limit, spec.rate.ok_or_else(missing)?.0),
        AlgorithmKind::Concurrency => Policy::concurrency(limit, spec.lease.ok_or_else(missing)?.0),
    };
    let policy = built.map_err(|e| policy_error(&base, period, e))?;
    let policy = policy
        .with_name(name)
        .map_err(|e| policy_error(&base, period, e))?;
    Ok(policy.with_shadow(spec.shadow))
}

/// `period` and `utc_offset`: a calendar period and its offset (seconds
/// east) for a fixed window given no `window`; `None` without `period`. A
/// `period` on another algorithm, beside a `window`, or a `utc_offset`
/// without a `period` is refused: each would otherwise be ignored.
fn calendar_fields(
    base: &str,
    spec: &PolicySpec,
) -> Result<Option<(ratelimit_core::Period, i32)>, ConfigError> {
    let refuse = |field: &str, message: String| {
        Err(ConfigError::new(
            ConfigErrorKind::Policy,
            format!("{base}.{field}"),
            message,
        ))
    };
    let Some(Parsed(period)) = spec.period.as_ref() else {
        if spec.utc_offset.is_some() {
            return refuse(
                "utc_offset",
                String::from(
                    "a UTC offset applies to calendar periods: write it with \
                     period = \"day\", \"week\", \"month\" or \"year\"",
                ),
            );
        }
        return Ok(None);
    };
    if spec.algorithm != AlgorithmKind::FixedWindow {
        return refuse(
            "period",
            format!(
                "{} takes no period: calendar periods are fixed windows, \
                 write algorithm = \"fixed-window\"",
                spec.algorithm.name()
            ),
        );
    }
    if spec.window.is_some() {
        return refuse(
            "period",
            String::from(
                "a fixed window counts per window or per calendar period, not both: \
                 remove window or period",
            ),
        );
    }
    let offset = spec
        .utc_offset
        .as_ref()
        .map_or(0, |Parsed(UtcOffset(seconds))| *seconds);
    Ok(Some((*period, offset)))
}

/// A [`PolicyError`] as an error on the field it is about.
fn policy_error(base: &str, period: Period, error: PolicyError) -> ConfigError {
    let period_field = period.field();
    let (field, message) = match &error {
        PolicyError::ZeroLimit { what: "rate" } => {
            ("rate", String::from("the amount must be at least 1"))
        }
        PolicyError::ZeroLimit { .. } => ("limit", String::from("must be at least 1")),
        PolicyError::ZeroWindow { what: "period" } => (
            "rate",
            String::from("the period must be at least one microsecond"),
        ),
        PolicyError::ZeroWindow { .. } => (
            period_field,
            String::from("must be at least one microsecond"),
        ),
        PolicyError::RateTooHigh { .. } => ("rate", error.to_string()),
        PolicyError::Unrepresentable { what, max }
            if matches!(*what, "limit" | "burst" | "capacity" | "max") =>
        {
            ("limit", format!("is too large (at most {max})"))
        }
        PolicyError::Unrepresentable { what: "period", .. } => ("rate", error.to_string()),
        PolicyError::UtcOffsetOutOfRange { .. } => ("utc_offset", error.to_string()),
        PolicyError::Unrepresentable { what, .. } if *what == period_field => {
            (period_field, error.to_string())
        }
        _ => ("", error.to_string()),
    };
    let path = if field.is_empty() {
        base.to_owned()
    } else {
        format!("{base}.{field}")
    };
    ConfigError::new(ConfigErrorKind::Policy, path, message).with_source(error)
}

fn build_client_ip(spec: ClientIpSpec) -> Result<ClientIp, ConfigError> {
    let trusted: Vec<Cidr> = spec.trusted_proxies.iter().map(|c| c.0).collect();
    super::trusted::check(&trusted)?;
    let proxies: TrustedProxies = spec.trusted_proxies.into_iter().map(|c| c.0).collect();
    let header = match spec.header {
        Some(header) => header.into(),
        // Without trusted proxies no header is read.
        None if proxies.is_empty() => ForwardingHeader::XForwardedFor,
        None => {
            return Err(ConfigError::new(
                ConfigErrorKind::Parse,
                "client_ip.header",
                "missing: name the header your trusted proxies write, \"x-forwarded-for\" \
                 (nginx's proxy_add_x_forwarded_for, AWS ALB) or \"forwarded\" (RFC 7239); \
                 the other one is never read, as a client can write it",
            ));
        }
    };
    let mut client_ip = ClientIp::trusting(proxies, header);
    if let Some(len) = spec.ipv6_prefix {
        client_ip = client_ip
            .ipv6_prefix(len)
            .map_err(|e| prefix_error("client_ip.ipv6_prefix", e))?;
    }
    if let Some(max_hops) = spec.max_hops {
        client_ip = client_ip.max_hops(max_hops);
    }
    Ok(client_ip)
}

/// `[ip]`: the `ip` key with another IPv6 prefix than [`PeerIp`](struct@PeerIp)'s default,
/// as a [`ClientIp`] that trusts nobody (the TCP peer, keyed as [`PeerIp`](struct@PeerIp)
/// keys it); `None` for the default.
fn build_peer_ip(spec: IpSpec) -> Result<Option<ClientIp>, ConfigError> {
    match spec.ipv6_prefix {
        None | Some(PeerIp::DEFAULT_IPV6_PREFIX) => Ok(None),
        Some(len) => ClientIp::peer()
            .ipv6_prefix(len)
            .map(Some)
            .map_err(|e| prefix_error("ip.ipv6_prefix", e)),
    }
}

fn prefix_error(path: &str, error: CidrError) -> ConfigError {
    ConfigError::new(
        ConfigErrorKind::Parse,
        path,
        format!("{error} (an IPv6 prefix length is 0 to 128; 64 keys each /64)"),
    )
    .with_source(error)
}

/// The settings of the keys that have some.
#[derive(Clone, Copy)]
struct Keys<'a> {
    /// `[client_ip]`.
    client_ip: Option<&'a ClientIp>,
    /// `[ip]`, when not the default.
    peer_ip: Option<&'a ClientIp>,
}

fn build_rule(
    index: usize,
    spec: RuleSpec,
    policies: &[Policy],
    keys: Keys<'_>,
    routes: &mut Vec<Vec<Prefix>>,
) -> Result<ConfiguredRule, ConfigError> {
    let base = format!("rules[{index}]");
    let rule_error = |field: &str, message: String| {
        ConfigError::new(ConfigErrorKind::Rule, format!("{base}.{field}"), message)
    };
    let policy = policies
        .iter()
        .find(|p| p.name() == spec.policy)
        .cloned()
        .ok_or_else(|| {
            let defined: Vec<&str> = policies.iter().map(Policy::name).collect();
            let defined = if defined.is_empty() {
                String::from("no policy is defined")
            } else {
                format!("defined: {}", defined.join(", "))
            };
            rule_error(
                "policy",
                format!("unknown policy {:?} ({defined})", spec.policy),
            )
        })?;
    let (cost, settlement) = match spec.settle {
        None => (spec.cost.unwrap_or(1), None),
        Some(_) if spec.cost.is_some() => {
            return Err(rule_error(
                "cost",
                String::from(
                    "a rule that settles reserves settle.estimate before the call: \
                     leave cost out",
                ),
            ));
        }
        Some(settle) if settle.estimate == 0 => {
            return Err(rule_error(
                "settle.estimate",
                String::from(
                    "an estimate of 0 reserves nothing, so every request in flight at once \
                     passes before any is charged: give the cost of a typical request, at \
                     least 1",
                ),
            ));
        }
        Some(settle) => {
            if let Err(error) = SettleError::check(&policy) {
                return Err(rule_error("settle", error.to_string()).with_source(error));
            }
            (settle.estimate, Some(build_settlement(settle)))
        }
    };
    let cost_field = if settlement.is_some() {
        "settle.estimate"
    } else {
        "cost"
    };
    if cost > policy.max_cost() {
        return Err(rule_error(
            cost_field,
            format!(
                "{} is more than policy {:?} can ever admit ({})",
                cost,
                policy.name(),
                policy.max_cost()
            ),
        ));
    }
    // An empty list would match nothing, which is never what a rule means.
    let non_empty = |field: &str, what: &str, list_len: Option<usize>| match list_len {
        Some(0) => Err(rule_error(
            field,
            format!("must not be empty: leave it out to match every {what}"),
        )),
        _ => Ok(()),
    };
    non_empty("routes", "path", spec.routes.as_ref().map(Vec::len))?;
    non_empty("methods", "method", spec.methods.as_ref().map(Vec::len))?;
    // The rule's prefixes go in the configuration's table, as its rule
    // number `routes.len()`.
    let routes = spec.routes.map(|written| {
        routes.push(Routes::of(written.iter().map(|route| route.0.0.as_str())));
        routes.len() - 1
    });
    let methods = spec
        .methods
        .map(|methods| methods.into_iter().map(|m| m.0).collect());
    let written_key = spec.key.0.clone().into_boxed_slice();
    let key = spec
        .key
        .0
        .into_iter()
        .map(|part| {
            Ok(match part {
                KeyPart::Global => KeySource::Global,
                KeyPart::PeerIp => match keys.peer_ip {
                    Some(peer) => KeySource::Client(peer.clone()),
                    None => KeySource::Peer,
                },
                KeyPart::Route => KeySource::Route,
                KeyPart::Header(name) => KeySource::Header(HeaderKey::new(name)),
                KeyPart::ClientIp => match keys.client_ip {
                    Some(c) if !c.trusted_proxies().is_empty() => KeySource::Client(c.clone()),
                    _ => {
                        return Err(rule_error(
                            "key",
                            String::from(
                                "\"client-ip\" needs trusted proxies in [client_ip] trusted_proxies \
                                 (without them the client is the TCP peer: use \"ip\")",
                            ),
                        ));
                    }
                },
            })
        })
        .collect::<Result<Box<[KeySource]>, ConfigError>>()?;
    Ok(ConfiguredRule {
        policy,
        key,
        written_key,
        cost,
        settlement,
        routes,
        methods,
        missing_key: spec.missing_key.map(MissingKey::from),
    })
}

/// `settle = { .. }`, as a [`Settlement`].
fn build_settlement(spec: SettleSpec) -> Settlement {
    let settlement = Settlement::from_header(spec.header.0)
        .keep_header(spec.keep_header)
        .refund_on_cancel(spec.refund_cancelled);
    match spec.refund_on {
        RefundOnSpec::ServerErrors => settlement,
        RefundOnSpec::Errors => settlement
            .refund_if(|head| head.status.is_client_error() || head.status.is_server_error()),
        RefundOnSpec::Never => settlement.refund_if(|_| false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(parts: &[&str]) -> Vec<KeyPart> {
        parts.iter().map(|p| p.parse().unwrap()).collect()
    }

    #[test]
    fn only_keys_that_differ_in_their_headers_alone_are_apart() {
        let apart = |a: &[&str], b: &[&str]| headers_apart(&key(a), &key(b));
        assert!(apart(&["header:x-tenant"], &["header:x-api-key"]));
        assert!(apart(&["route", "header:a"], &["route", "header:b"]));
        // The same key, or keys of other shapes, never meet in one budget
        // by a value sent in another header.
        assert!(!apart(&["header:x-api-key"], &["header:x-api-key"]));
        assert!(!apart(&["header:x-api-key"], &["ip"]));
        assert!(!apart(&["ip"], &["client-ip"]));
        assert!(!apart(&["route", "header:a"], &["header:b"]));
        assert!(!apart(&["ip", "header:a"], &["route", "header:b"]));
        assert_eq!(
            describe(&key(&["route", "header:x-a"])),
            "[route, header:x-a]"
        );
        assert_eq!(describe(&key(&["ip"])), "ip");
    }
}
