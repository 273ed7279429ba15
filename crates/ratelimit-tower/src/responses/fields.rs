//! The rate-limit fields of one response and how they are written into it:
//! as they are when the response has none, else merged with those it
//! already carries (a handler's `Limiter`, an inner layer, a proxied
//! upstream). A leaf module: `headers` builds [`Fields`], `reject` writes
//! them; this imports neither.
//!
//! The merge rules are documented on the `headers` module.

use std::collections::HashSet;

use http::header::GetAll;
use http::{HeaderMap, HeaderName, HeaderValue};

/// `RateLimit-Policy`.
pub static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit`.
pub static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// `X-RateLimit-Limit`.
pub static X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining`.
pub static X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset`.
pub static X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// The rate-limit fields of one response, written when its request is
/// decided (the decisions then go to the request's extensions, not along
/// with the response future). `pub` only as the layer's unexported
/// `Reject` names it; not reachable outside the crate.
#[derive(Debug, Default)]
pub struct Fields {
    pub(crate) policy: Option<HeaderValue>,
    pub(crate) state: Option<HeaderValue>,
    // `X-RateLimit-Limit`, `-Remaining` and `-Reset`: boxed, so the IETF
    // fields alone (the default) keep the future small.
    pub(crate) legacy: Option<Box<[HeaderValue; 3]>>,
}

impl Fields {
    /// Writes the fields into `headers`: inserted where `headers` has none
    /// of them (the common case, a lookup per field), merged with those it
    /// has otherwise.
    pub(crate) fn insert_into(self, headers: &mut HeaderMap) {
        if self.policy.is_some() || self.state.is_some() {
            if headers.contains_key(&RATELIMIT_POLICY) || headers.contains_key(&RATELIMIT) {
                merge_ietf(headers, self.policy, self.state);
            } else {
                if let Some(v) = self.policy {
                    headers.insert(RATELIMIT_POLICY.clone(), v);
                }
                if let Some(v) = self.state {
                    headers.insert(RATELIMIT.clone(), v);
                }
            }
        }
        if let Some(legacy) = self.legacy {
            merge_legacy(headers, *legacy);
        }
    }
}

/// A structured-field list, parsed.
type List = sfv::List;

/// Merges the layer's `RateLimit-Policy` and `RateLimit` into those
/// `headers` already has. Each field is one list: the inner response's
/// members first, then the layer's. Where both name a policy, the more
/// restrictive member (see [`tighter`]) stays, in both fields, and the
/// other goes; a name the inner fields list twice keeps its first member.
/// Inner fields that are not valid lists (or not visible ASCII) are
/// dropped, both of them, and the layer's stand alone.
fn merge_ietf(headers: &mut HeaderMap, policy: Option<HeaderValue>, state: Option<HeaderValue>) {
    let inner = match (
        parse_field(headers.get_all(&RATELIMIT_POLICY)),
        parse_field(headers.get_all(&RATELIMIT)),
    ) {
        (Ok(policy), Ok(state)) => Some((policy, state)),
        _ => {
            tracing::debug!(
                "the response's own RateLimit-Policy or RateLimit field is not a valid \
                 structured-field list; the layer's replace both"
            );
            None
        }
    };
    let (inner_policy, inner_state) = inner.unwrap_or_default();
    let ours = |value: &Option<HeaderValue>| -> List {
        value
            .as_ref()
            .and_then(|v| sfv::Parser::new(v.as_bytes()).parse().ok())
            .unwrap_or_default()
    };
    let (our_policy, our_state) = (ours(&policy), ours(&state));
    // For each name the layer writes, whether its inner member stays
    // instead (a few names: the layer's policies). Looked up once each, so
    // the work grows with the inner fields' length, not its square.
    let mut contested: Vec<(&str, bool)> = Vec::new();
    for name in our_policy.iter().chain(&our_state).filter_map(name) {
        if contested.iter().any(|(seen, _)| *seen == name) {
            continue;
        }
        let inner_stays = match first_named(&inner_state, name) {
            Some(inner) => first_named(&our_state, name).is_none_or(|ours| tighter(inner, ours)),
            None => {
                first_named(&our_state, name).is_none()
                    && first_named(&inner_policy, name).is_some()
            }
        };
        contested.push((name, inner_stays));
    }
    let inner_wins = |name: &str| {
        contested
            .iter()
            .find(|(contested, _)| *contested == name)
            .is_none_or(|(_, inner_stays)| *inner_stays)
    };
    let merged_policy = merge_lists(&inner_policy, &our_policy, &inner_wins);
    let merged_state = merge_lists(&inner_state, &our_state, &inner_wins);
    for (name, merged, fallback) in [
        (&RATELIMIT_POLICY, merged_policy, policy),
        (&RATELIMIT, merged_state, state),
    ] {
        match merged
            .and_then(|text| HeaderValue::from_str(&text).ok())
            .or(fallback)
        {
            Some(value) => {
                headers.insert(name.clone(), value);
            }
            None => {
                headers.remove(name);
            }
        }
    }
}

/// The field `values`, joined as RFC 9651 combines field lines (`, `),
/// parsed as one list: empty when there is none.
fn parse_field(values: GetAll<'_, HeaderValue>) -> Result<List, sfv::Error> {
    let mut joined = Vec::new();
    for (i, value) in values.into_iter().enumerate() {
        if i > 0 {
            joined.extend_from_slice(b", ");
        }
        joined.extend_from_slice(value.as_bytes());
    }
    if joined.is_empty() {
        return Ok(List::new());
    }
    sfv::Parser::new(&joined).parse()
}

/// `inner`'s members, then `ours`: a named member of `inner` stays when
/// `inner_wins` says so for its name (its first only), one of `ours` when it
/// does not. Unnamed members of `inner` (not a string or a token) stay. The
/// list written, `None` when it is empty.
fn merge_lists(inner: &List, ours: &List, inner_wins: &impl Fn(&str) -> bool) -> Option<String> {
    let mut seen = HashSet::new();
    let inner = inner.iter().filter(|entry| match name(entry) {
        None => true,
        Some(name) => seen.insert(name) && inner_wins(name),
    });
    let ours = ours
        .iter()
        .filter(|entry| name(entry).is_none_or(|name| !inner_wins(name)));
    let mut out = sfv::ListSerializer::new();
    out.members(inner.chain(ours));
    out.finish()
}

/// A list member's policy name: its bare item when that is a string (as
/// the layer writes it) or a token (as earlier drafts did).
fn name(entry: &sfv::ListEntry) -> Option<&str> {
    let sfv::ListEntry::Item(item) = entry else {
        return None;
    };
    let bare = &item.bare_item;
    bare.as_string()
        .map(sfv::StringRef::as_str)
        .or_else(|| bare.as_token().map(sfv::TokenRef::as_str))
}

/// The first member of `list` named `name`.
fn first_named<'a>(list: &'a List, name: &str) -> Option<&'a sfv::ListEntry> {
    list.iter().find(|entry| self::name(entry) == Some(name))
}

/// Whether the `RateLimit` member `inner` is at least as restrictive as
/// `ours`: less remaining (`r`), or as much and as long to wait (`t`) or
/// longer. A member without an integer `r` is never.
fn tighter(inner: &sfv::ListEntry, ours: &sfv::ListEntry) -> bool {
    let numbers = |entry: &sfv::ListEntry| {
        let sfv::ListEntry::Item(item) = entry else {
            return None;
        };
        let param = |key: &str| {
            item.params
                .get(key)
                .and_then(sfv::BareItem::as_integer)
                .map(i64::from)
        };
        Some((param("r")?, param("t").unwrap_or(0)))
    };
    match (numbers(inner), numbers(ours)) {
        (Some((r, t)), Some((our_r, our_t))) => r < our_r || (r == our_r && t >= our_t),
        (Some(_), None) => true,
        (None, _) => false,
    }
}

/// Writes the layer's `X-RateLimit-Limit`, `-Remaining` and `-Reset`
/// unless `headers` carries a valid trio (each field once, a whole number)
/// leaving no more remaining: the three fields describe one policy, so they
/// are kept or replaced together.
fn merge_legacy(headers: &mut HeaderMap, ours: [HeaderValue; 3]) {
    let names = [
        &X_RATELIMIT_LIMIT,
        &X_RATELIMIT_REMAINING,
        &X_RATELIMIT_RESET,
    ];
    if names.iter().any(|name| headers.contains_key(*name)) {
        let inner = names.map(|name| single_number(headers.get_all(name)));
        if let ([Some(_), Some(inner_remaining), Some(_)], Some(our_remaining)) =
            (inner, number(&ours[1]))
            && inner_remaining <= our_remaining
        {
            return;
        }
    }
    for (name, value) in names.into_iter().zip(ours) {
        headers.insert(name.clone(), value);
    }
}

/// The value of a field sent once, when it is a whole number.
fn single_number(values: GetAll<'_, HeaderValue>) -> Option<u64> {
    let mut values = values.iter();
    let value = values.next()?;
    values.next().is_none().then(|| number(value))?
}

/// A field value that is a whole number (digits only).
fn number(value: &HeaderValue) -> Option<u64> {
    let bytes = value.as_bytes();
    if bytes.is_empty() || !bytes.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(bytes).ok()?.parse().ok()
}
