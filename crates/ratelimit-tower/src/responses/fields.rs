//! The rate-limit fields of one response and how they are written into it:
//! as they are when the response has none, else merged with those it
//! already carries (a handler's `Limiter`, an inner layer, a proxied
//! upstream). A leaf module: `headers` builds [`Fields`], `reject` writes
//! them; this imports neither.
//!
//! The merge rules are documented on the `headers` module.

use std::collections::HashSet;

use http::header::{Entry, GetAll};
use http::{HeaderMap, HeaderName, HeaderValue};

/// `RateLimit-Policy`.
pub(crate) static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit`.
pub(crate) static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// `X-RateLimit-Limit`.
pub(crate) static X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining`.
pub(crate) static X_RATELIMIT_REMAINING: HeaderName =
    HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset`.
pub(crate) static X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// The rate-limit fields of one response, written when its request is
/// decided (the decisions then go to the request's extensions, not along
/// with the response future). `pub` only because `HttpRejections`'s hidden
/// `Reject::Allowed` names it (`Reject` is exported, sealed); it cannot be
/// named outside the crate, and `Reject::allowing`, which makes it, cannot
/// be called there.
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
            insert_ietf(headers, self.policy, self.state);
        }
        if let Some(legacy) = self.legacy {
            merge_legacy(headers, *legacy);
        }
    }
}

/// Inserts the layer's `RateLimit-Policy` and `RateLimit` where `headers`
/// has neither, else merges them with those it has ([`merge_ietf`]).
///
/// Each field is looked up once, through its entry, rather than tested and
/// then inserted (two hashes of its name): this runs on every allowed
/// response. The policy field goes into its vacant entry before the other
/// field is looked at; if `headers` turns out to carry a `RateLimit` field,
/// it is taken out again (the last entry, so the others keep their order)
/// and the two are merged as if it had never been written. The names the
/// entries take are made in place from constants: a clone of the statics
/// would call `Bytes`' clone function for each.
fn insert_ietf(headers: &mut HeaderMap, policy: Option<HeaderValue>, state: Option<HeaderValue>) {
    let wrote_policy = match policy {
        Some(value) => match headers.entry(const { HeaderName::from_static("ratelimit-policy") }) {
            Entry::Vacant(entry) => {
                entry.insert(value);
                true
            }
            Entry::Occupied(_) => return merge_ietf(headers, Some(value), state),
        },
        None if headers.contains_key(&RATELIMIT_POLICY) => {
            return merge_ietf(headers, None, state);
        }
        None => false,
    };
    let state = match state {
        Some(value) => match headers.entry(const { HeaderName::from_static("ratelimit") }) {
            Entry::Vacant(entry) => {
                entry.insert(value);
                return;
            }
            Entry::Occupied(_) => Some(value),
        },
        None if headers.contains_key(&RATELIMIT) => None,
        None => return,
    };
    let policy = if wrote_policy {
        headers.remove(&RATELIMIT_POLICY)
    } else {
        None
    };
    merge_ietf(headers, policy, state);
}

/// A structured-field list, parsed.
type List = sfv::List;

/// Merges the layer's `RateLimit-Policy` and `RateLimit` into those
/// `headers` already has. Each field is one list: the inner response's
/// members first, then the layer's. Where both name a policy, the more
/// restrictive `RateLimit` member (see [`tighter`]) stays, with its
/// `RateLimit-Policy` member (the other's where it has none), and the
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
    let inner_stays = |name: &str| {
        contested
            .iter()
            .find(|(contested, _)| *contested == name)
            .is_none_or(|(_, inner_stays)| *inner_stays)
    };
    let merged_policy = merge_lists(&inner_policy, &our_policy, &inner_stays);
    let merged_state = merge_lists(&inner_state, &our_state, &inner_stays);
    for (name, merged, ours) in [
        (&RATELIMIT_POLICY, merged_policy, policy),
        (&RATELIMIT, merged_state, state),
    ] {
        // The writer escapes what it writes, so a merged list is always a
        // valid value; were it not, the layer's own field is sent.
        match merged.map(|text| HeaderValue::from_str(&text).ok().or(ours)) {
            Some(Some(value)) => {
                headers.insert(name.clone(), value);
            }
            _ => {
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

/// `inner`'s members, then `ours`. A policy's member of `inner` (its first
/// only) stays when `inner_stays` says so for its name or `ours` has none,
/// one of `ours` when it does not or `inner` has none. Members that are not
/// policies (neither a string nor a token) stay. The list written, `None`
/// when it is empty.
fn merge_lists(inner: &List, ours: &List, inner_stays: &impl Fn(&str) -> bool) -> Option<String> {
    let mut seen = HashSet::new();
    let inner: Vec<&sfv::ListEntry> = inner
        .iter()
        .filter(|entry| match name(entry) {
            None => true,
            Some(name) => {
                seen.insert(name) && (inner_stays(name) || first_named(ours, name).is_none())
            }
        })
        .collect();
    let ours = ours
        .iter()
        .filter(|entry| name(entry).is_none_or(|name| !inner_stays(name) || !seen.contains(name)));
    let mut out = sfv::ListSerializer::new();
    out.members(inner.into_iter().chain(ours));
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
        let inner = names.map(|name| single_number(headers, name));
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

/// The value of the field `name` in `headers`, when it is sent once and is
/// a whole number.
fn single_number(headers: &HeaderMap, name: &HeaderName) -> Option<u64> {
    let mut values = headers.get_all(name).iter();
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The layer's fields for one policy `per-client`: 100 a minute, `r`
    /// left, `t` seconds to wait.
    fn ours(r: u64, t: u64) -> Fields {
        let value = |text: String| Some(HeaderValue::try_from(text).unwrap());
        Fields {
            policy: value(String::from(r#""per-client";q=100;w=60"#)),
            state: value(format!(r#""per-client";r={r};t={t}"#)),
            legacy: Some(Box::new([
                HeaderValue::from(100u64),
                HeaderValue::from(r),
                HeaderValue::from(t),
            ])),
        }
    }

    /// A response with these fields (a name twice: two lines).
    fn response(fields: &[(&HeaderName, &[u8])]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in fields {
            headers.append((*name).clone(), HeaderValue::from_bytes(value).unwrap());
        }
        headers
    }

    /// The response's fields once `fields` are written into it: each field
    /// sent on one line, the IETF ones valid lists.
    fn merged(mut headers: HeaderMap, fields: Fields) -> [Option<String>; 5] {
        fields.insert_into(&mut headers);
        [
            &RATELIMIT_POLICY,
            &RATELIMIT,
            &X_RATELIMIT_LIMIT,
            &X_RATELIMIT_REMAINING,
            &X_RATELIMIT_RESET,
        ]
        .map(|name| {
            let mut values = headers.get_all(name).iter();
            let value = values.next()?.to_str().unwrap().to_owned();
            assert!(values.next().is_none(), "{name} on two lines");
            if *name == RATELIMIT_POLICY || *name == RATELIMIT {
                let list: Result<List, _> = sfv::Parser::new(&value).parse();
                assert!(list.is_ok(), "{name}: {value:?} is not a list");
            }
            Some(value)
        })
    }

    fn ietf(merged: &[Option<String>; 5]) -> (&str, &str) {
        (
            merged[0].as_deref().unwrap_or(""),
            merged[1].as_deref().unwrap_or(""),
        )
    }

    const LAYER_POLICY: &str = r#""per-client";q=100;w=60"#;

    /// With nothing to merge with, the layer's fields go in as they are.
    #[test]
    fn a_response_without_fields_gets_the_layers() {
        let out = merged(HeaderMap::new(), ours(98, 60));
        assert_eq!(ietf(&out), (LAYER_POLICY, r#""per-client";r=98;t=60"#));
        assert_eq!(
            out[2..],
            [Some("100".into()), Some("98".into()), Some("60".into())]
        );
    }

    /// The response's own policies come first, then the layer's.
    #[test]
    fn the_responses_policies_are_kept_before_the_layers() {
        let inner = response(&[
            (&RATELIMIT_POLICY, br#""login";q=3;w=900"#),
            (&RATELIMIT, br#""login";r=0;t=870"#),
        ]);
        let out = merged(inner, ours(98, 60));
        assert_eq!(
            ietf(&out),
            (
                r#""login";q=3;w=900, "per-client";q=100;w=60"#,
                r#""login";r=0;t=870, "per-client";r=98;t=60"#
            )
        );
    }

    /// A response carrying only one of the two fields is merged as one
    /// carrying both (the other empty), and its other fields keep their
    /// order.
    #[test]
    fn a_response_with_one_of_the_fields_is_merged() {
        let content_type = HeaderName::from_static("content-type");
        let only = |name: &HeaderName, value: &[u8]| {
            response(&[
                (&content_type, b"text/plain"),
                (name, value),
                (&X_RATELIMIT_LIMIT, b"7"),
            ])
        };
        let order = |headers: &HeaderMap| {
            headers
                .keys()
                .filter(|name| **name != RATELIMIT_POLICY && **name != RATELIMIT)
                .cloned()
                .collect::<Vec<_>>()
        };
        let cases: [(&HeaderName, &[u8], (&str, &str)); 2] = [
            (
                &RATELIMIT,
                br#""login";r=0;t=870"#,
                (LAYER_POLICY, r#""login";r=0;t=870, "per-client";r=98;t=60"#),
            ),
            (
                &RATELIMIT_POLICY,
                br#""login";q=3;w=900"#,
                (
                    r#""login";q=3;w=900, "per-client";q=100;w=60"#,
                    r#""per-client";r=98;t=60"#,
                ),
            ),
        ];
        for (name, value, want) in cases {
            let mut headers = only(name, value);
            let before = order(&headers);
            Fields {
                legacy: None,
                ..ours(98, 60)
            }
            .insert_into(&mut headers);
            assert_eq!(order(&headers), before, "{name}");
            let out = merged(headers, Fields::default());
            assert_eq!(ietf(&out), want, "{name}");
        }
    }

    /// A member under the layer's policy name that claims more quota than
    /// the layer found cannot hide the layer's; one that claims less stays,
    /// with its own `RateLimit-Policy` member.
    #[test]
    fn a_policy_in_both_keeps_the_more_restrictive_member() {
        let claims = |r: u64, t: u64| {
            response(&[
                (&RATELIMIT_POLICY, br#""per-client";q=1000;w=1"#),
                (
                    &RATELIMIT,
                    format!(r#""per-client";r={r};t={t}"#).as_bytes(),
                ),
            ])
        };
        let looser = merged(claims(999, 0), ours(5, 60));
        assert_eq!(ietf(&looser), (LAYER_POLICY, r#""per-client";r=5;t=60"#));
        let same_r_shorter_t = merged(claims(5, 59), ours(5, 60));
        assert_eq!(
            ietf(&same_r_shorter_t),
            (LAYER_POLICY, r#""per-client";r=5;t=60"#)
        );
        let tie = merged(claims(5, 60), ours(5, 60));
        assert_eq!(
            ietf(&tie),
            (r#""per-client";q=1000;w=1"#, r#""per-client";r=5;t=60"#)
        );
        let tighter = merged(claims(0, 900), ours(5, 60));
        assert_eq!(
            ietf(&tighter),
            (r#""per-client";q=1000;w=1"#, r#""per-client";r=0;t=900"#)
        );
        // A token name is the same policy; the layer's RateLimit-Policy
        // member stands in for the one the response lacks. Without an
        // integer `r` the response's member gives way.
        let token = response(&[(&RATELIMIT, b"per-client;r=0;t=9")]);
        assert_eq!(
            ietf(&merged(token, ours(5, 60))),
            (LAYER_POLICY, "per-client;r=0;t=9")
        );
        for state in [
            &b"\"per-client\";r=\"0\";t=9"[..],
            b"\"per-client\";t=9",
            b"\"per-client\";r=0.5",
        ] {
            let out = merged(response(&[(&RATELIMIT, state)]), ours(5, 60));
            assert_eq!(
                ietf(&out),
                (LAYER_POLICY, r#""per-client";r=5;t=60"#),
                "{state:?}"
            );
        }
        // Named only in the response's RateLimit-Policy: nothing to compare,
        // the layer's pair replaces it.
        let policy_only = response(&[(&RATELIMIT_POLICY, br#""per-client";q=1;w=1"#)]);
        assert_eq!(
            ietf(&merged(policy_only, ours(5, 60))),
            (LAYER_POLICY, r#""per-client";r=5;t=60"#)
        );
    }

    /// A name the response lists twice keeps its first member, whatever it
    /// says; members that are not policies stay; lines are joined.
    #[test]
    fn duplicates_and_lines_are_written_once() {
        let inner = response(&[
            (&RATELIMIT_POLICY, br#""login";q=3;w=900"#),
            (&RATELIMIT_POLICY, br#""login";q=1;w=1, 7, ("a" "b");x"#),
            (&RATELIMIT, br#""login";r=2;t=900"#),
            (&RATELIMIT, br#""login";r=0;t=1"#),
        ]);
        let out = merged(inner, ours(98, 60));
        assert_eq!(
            ietf(&out),
            (
                r#""login";q=3;w=900, 7, ("a" "b");x, "per-client";q=100;w=60"#,
                r#""login";r=2;t=900, "per-client";r=98;t=60"#
            )
        );
    }

    /// A response field that is not a valid list, or not ASCII, is dropped
    /// with its pair: the layer never sends an invalid field, nor lets one
    /// hide its own.
    #[test]
    fn invalid_fields_give_way_to_the_layers() {
        let bad: [&[u8]; 8] = [
            b"\"unterminated",
            b"\"a\";r=1,",
            b",",
            b"\"a\";r=99999999999999999999",
            b"\"caf\xc3\xa9\";r=1",
            b"\"a\" \"b\"",
            b"\"a\";R=1",
            b"(\"a\"",
        ];
        for value in bad {
            for name in [&RATELIMIT_POLICY, &RATELIMIT] {
                let inner = response(&[
                    (&RATELIMIT_POLICY, br#""login";q=3;w=900"#),
                    (&RATELIMIT, br#""login";r=2;t=900"#),
                    (name, value),
                ]);
                let out = merged(inner, ours(98, 60));
                assert_eq!(
                    ietf(&out),
                    (LAYER_POLICY, r#""per-client";r=98;t=60"#),
                    "{name}: {value:?}"
                );
            }
        }
        // An empty field is an empty list.
        let empty = response(&[(&RATELIMIT, b""), (&RATELIMIT_POLICY, b"")]);
        assert_eq!(
            ietf(&merged(empty, ours(98, 60))),
            (LAYER_POLICY, r#""per-client";r=98;t=60"#)
        );
    }

    /// A field of thousands of members is merged whole, in one pass.
    #[test]
    fn huge_fields_are_merged_whole() {
        let members = |params: &str| {
            (0..20_000)
                .map(|i| format!("\"p{i}\";{params}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let (policy, state) = (members("q=1;w=1"), members("r=1;t=1"));
        let inner = response(&[
            (&RATELIMIT_POLICY, policy.as_bytes()),
            (&RATELIMIT, state.as_bytes()),
        ]);
        let out = merged(inner, ours(98, 60));
        let (merged_policy, merged_state) = ietf(&out);
        assert_eq!(merged_policy, format!("{policy}, {LAYER_POLICY}"),);
        assert_eq!(merged_state, format!(r#"{state}, "per-client";r=98;t=60"#),);
    }

    /// The legacy trio is kept or replaced whole: the response's when it is
    /// valid and leaves no more remaining (a tie included), else the
    /// layer's.
    #[test]
    fn the_legacy_trio_is_kept_or_replaced_whole() {
        let trio = |limit: &'static [u8], remaining: &'static [u8], reset: &'static [u8]| {
            response(&[
                (&X_RATELIMIT_LIMIT, limit),
                (&X_RATELIMIT_REMAINING, remaining),
                (&X_RATELIMIT_RESET, reset),
            ])
        };
        let legacy = |out: [Option<String>; 5]| out[2..].to_vec();
        let theirs =
            |l: &str, r: &str, t: &str| vec![Some(l.into()), Some(r.into()), Some(t.into())];
        let layers = theirs("100", "5", "60");
        assert_eq!(
            legacy(merged(trio(b"3", b"0", b"900"), ours(5, 60))),
            theirs("3", "0", "900")
        );
        assert_eq!(
            legacy(merged(trio(b"3", b"5", b"9"), ours(5, 60))),
            theirs("3", "5", "9")
        );
        assert_eq!(legacy(merged(trio(b"3", b"6", b"9"), ours(5, 60))), layers);
        for (limit, remaining, reset) in [
            (&b"3"[..], &b"-1"[..], &b"9"[..]),
            (b"3", b"0x0", b"9"),
            (b"3", b"", b"9"),
            (b"", b"0", b"9"),
            (b"3", b"0", b"soon"),
            (b"3", b"99999999999999999999999", b"9"),
        ] {
            assert_eq!(
                legacy(merged(trio(limit, remaining, reset), ours(5, 60))),
                layers
            );
        }
        // Partial, or sent twice.
        let partial = response(&[(&X_RATELIMIT_REMAINING, b"0")]);
        assert_eq!(legacy(merged(partial, ours(5, 60))), layers);
        let mut twice = trio(b"3", b"0", b"9");
        twice.append(&X_RATELIMIT_REMAINING, HeaderValue::from_static("0"));
        assert_eq!(legacy(merged(twice, ours(5, 60))), layers);
    }
}
