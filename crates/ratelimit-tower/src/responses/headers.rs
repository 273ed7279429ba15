//! Rate-limit response headers: the IETF draft fields and the legacy
//! `X-RateLimit-*` trio.
//!
//! - `RateLimit-Policy: "<name>";q=<quota>;w=<window seconds>`
//! - `RateLimit: "<name>";r=<remaining>;t=<seconds>`
//!
//! are structured-field lists (RFC 9651) with one member per policy, as
//! described by draft-ietf-httpapi-ratelimit-headers. Names are policy names,
//! which are always valid sf-strings (`[A-Za-z0-9._-]`); every parameter is an
//! sf-integer. For a policy that denied the request, `t` is its retry delay
//! (rounded up, at least 1), so `Retry-After` equals the largest `t` of the
//! denying policies and is never earlier; for a policy that allowed it, `t` is
//! the time until its quota is fully restored (rounded up; 0 when it is full).
//! `w` is the policy's window: the window of the window algorithms, the time to
//! refill an empty bucket, the lease of a concurrency permit (rounded up to a
//! whole second). For calendar periods
//! ([`Policy::calendar`](ratelimit_core::Policy::calendar)) it is the real
//! length of the period in progress by this machine's clock (a month: 28 to
//! 31 days), and `t` counts to that period's real end.
//!
//! The legacy fields describe the most restrictive policy:
//! `X-RateLimit-Limit`, `X-RateLimit-Remaining`, and `X-RateLimit-Reset` in
//! delay-seconds by default, or in Unix epoch seconds as GitHub sends it.
//!
//! # A response that already carries rate-limit fields
//!
//! A response may come with fields of its own: a handler's `Limiter`
//! (`ratelimit-axum`) refusing a login, an inner layer, an upstream a
//! handler proxies. The layer, and [`RateLimitHeaders::apply`], then merge
//! theirs in rather than replace what is there, so the client sees every
//! limit it is under:
//!
//! - `RateLimit-Policy` and `RateLimit`: each stays one list, the response's
//!   members first, then the layer's. A policy named in both keeps the
//!   members of the more restrictive side: the one whose `RateLimit` member
//!   has less remaining (`r`), or as much and a longer `t`; the response's
//!   on a tie, the layer's when the response's has no integer `r` (the
//!   other side's `RateLimit-Policy` member stands in where the kept side
//!   has none). So a member the response carries can make a policy look
//!   tighter than the layer found it, never looser. A name the response lists twice keeps
//!   its first member; members that are not policies (neither a string nor
//!   a token) are kept as they are. Fields sent on several lines are read as
//!   one list (RFC 9651) and written on one line. When either of the
//!   response's fields is not a valid structured-field list, both are
//!   dropped and the layer's stand alone: the layer never sends an invalid
//!   field.
//! - `X-RateLimit-Limit`, `-Remaining` and `-Reset` describe one policy, so
//!   they are kept or replaced together: the response's stay when each is
//!   sent once as a whole number and they leave no more remaining than the
//!   layer's (the response's on a tie); else the layer's replace them.
//! - `Retry-After`: the layer writes it only on its own refusals. On a
//!   response it let through, the response's `Retry-After` (a `Limiter`'s
//!   refusal) is left as it is: the layer allowed the request, so its own
//!   wait is none and the response's is the larger.

use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderValue};
use ratelimit_core::algorithm::FixedWindow;
use ratelimit_core::{Algorithm, Policy};

use crate::decisions::{Decisions, PolicyDecision};
use crate::responses::fields::Fields;

/// How `X-RateLimit-Reset` is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ResetFormat {
    /// Seconds from now, rounded up (the default).
    #[default]
    DelaySeconds,
    /// A Unix time in seconds, rounded up, as GitHub sends it.
    EpochSeconds,
}

/// Which rate-limit headers to send, on allowed and denied responses alike.
/// `Retry-After` is always sent on a denial, whatever this says.
///
/// The default, the IETF fields, writes two fields into every allowed
/// response: on a server whose responses are tiny, a cost of the same order
/// as the limiter's own (BENCHMARKS.md in the repository). A service whose
/// clients never read them can send none ([`RateLimitHeaders::none`]).
///
/// ```
/// use ratelimit_tower::headers::{RateLimitHeaders, ResetFormat};
///
/// let github_like = RateLimitHeaders::none().with_legacy(ResetFormat::EpochSeconds);
/// let both = RateLimitHeaders::ietf().with_legacy(ResetFormat::DelaySeconds);
/// # let _ = (github_like, both);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimitHeaders {
    ietf: bool,
    legacy: Option<ResetFormat>,
}

impl Default for RateLimitHeaders {
    /// The IETF fields.
    fn default() -> Self {
        RateLimitHeaders::ietf()
    }
}

impl RateLimitHeaders {
    /// No rate-limit header (only `Retry-After` on denials).
    pub const fn none() -> Self {
        RateLimitHeaders {
            ietf: false,
            legacy: None,
        }
    }

    /// `RateLimit-Policy` and `RateLimit`.
    pub const fn ietf() -> Self {
        RateLimitHeaders {
            ietf: true,
            legacy: None,
        }
    }

    /// `X-RateLimit-Limit`, `-Remaining` and `-Reset` (delay-seconds).
    pub const fn legacy() -> Self {
        RateLimitHeaders {
            ietf: false,
            legacy: Some(ResetFormat::DelaySeconds),
        }
    }

    /// Adds the legacy fields, with `X-RateLimit-Reset` written as `format`.
    #[must_use]
    pub const fn with_legacy(mut self, format: ResetFormat) -> Self {
        self.legacy = Some(format);
        self
    }

    /// Adds the IETF fields.
    #[must_use]
    pub const fn with_ietf(mut self) -> Self {
        self.ietf = true;
        self
    }

    /// Writes the selected headers for `decisions` into `headers`, merged
    /// with the rate-limit fields `headers` already holds (see
    /// [the module docs](self#a-response-that-already-carries-rate-limit-fields)).
    ///
    /// ```
    /// use ratelimit_tower::headers::RateLimitHeaders;
    /// use ratelimit_tower::{Decisions, PolicyDecision, Policy};
    /// use ratelimit_core::Decision;
    /// use std::time::Duration;
    ///
    /// # fn main() -> Result<(), ratelimit_core::PolicyError> {
    /// let exports = Policy::fixed_window(10, Duration::from_secs(60))?.with_name("exports")?;
    /// let decisions = Decisions::new(vec![PolicyDecision::new(
    ///     exports,
    ///     Decision::allow(10, 9, 60_000_000),
    /// )]);
    /// let mut headers = http::HeaderMap::new();
    /// headers.insert("ratelimit", http::HeaderValue::from_static(r#""login";r=2;t=900"#));
    /// RateLimitHeaders::ietf().apply(&decisions, &mut headers);
    /// assert_eq!(headers["ratelimit"], r#""login";r=2;t=900, "exports";r=9;t=60"#);
    /// # Ok(())
    /// # }
    /// ```
    pub fn apply(&self, decisions: &Decisions, headers: &mut HeaderMap) {
        self.fields(decisions, None).insert_into(headers);
    }

    /// The selected fields for `decisions`, with `RateLimit-Policy` from
    /// `cache` when it holds their one policy's.
    pub(crate) fn fields(&self, decisions: &Decisions, cache: Option<&PolicyFieldCache>) -> Fields {
        let mut fields = Fields::default();
        if decisions.is_empty() {
            return fields;
        }
        if self.ietf {
            fields.policy = match cache {
                Some(cache) => cache.field(decisions),
                None => policy_field(decisions),
            };
            fields.state = match decisions.as_slice() {
                [only] => state_member(only),
                _ => sf_list(decisions.iter(), |_, entry| {
                    [("r", entry.decision().remaining()), ("t", t_seconds(entry))]
                })
                .ok(),
            };
        }
        // The tightest decision is looked for only when the legacy fields
        // are sent.
        if let Some(format) = self.legacy
            && let Some(tightest) = decisions.tightest()
        {
            let d = tightest.decision();
            let reset = match format {
                ResetFormat::DelaySeconds => t_seconds(tightest),
                ResetFormat::EpochSeconds => epoch_seconds_after(t_micros(tightest)),
            };
            fields.legacy = Some(Box::new([
                HeaderValue::from(d.limit()),
                HeaderValue::from(d.remaining()),
                HeaderValue::from(reset),
            ]));
        }
        fields
    }
}

/// The `RateLimit-Policy` field of `decisions`.
fn policy_field(decisions: &Decisions) -> Option<HeaderValue> {
    sf_list(decisions.iter(), |p, _| {
        [("q", p.limit()), ("w", window_seconds(p))]
    })
    .ok()
}

/// The `RateLimit-Policy` field of the first request a layer answered with
/// one policy. The field depends on the policy alone, so every later
/// response of that policy (a static rule's every response) shares the one
/// written then instead of writing, checking and allocating it again.
/// Responses of other policies, or of several, are written as before.
///
/// Sharing it writes its reference count from every core, as every request
/// already writes its rule's policy's; a copy per response would cost an
/// allocation and a byte-by-byte check of the value, on every response.
#[derive(Debug, Default)]
pub(crate) struct PolicyFieldCache(OnceLock<(Policy, HeaderValue)>);

impl PolicyFieldCache {
    /// The `RateLimit-Policy` field of `decisions`, from the cache when it
    /// holds their one policy's.
    fn field(&self, decisions: &Decisions) -> Option<HeaderValue> {
        let [only] = decisions.as_slice() else {
            return policy_field(decisions);
        };
        // A calendar period's `w` changes with the period.
        if calendar_window(only.policy()).is_some() {
            return policy_field(decisions);
        }
        // `Policy` equality compares the shared pointer first: one test when
        // it is the rule's own policy.
        match self.0.get() {
            Some((policy, value)) if policy == only.policy() => Some(value.clone()),
            Some(_) => policy_field(decisions),
            None => {
                let value = policy_field(decisions)?;
                let _ = self.0.set((only.policy().clone(), value.clone()));
                Some(value)
            }
        }
    }
}

/// A structured-field list with one member per policy, `"<name>"` with the
/// two integer parameters `params` gives, written without `fmt` (a header on
/// every response) into one allocation of the exact size, which the value
/// then owns (no copy, and none of `Bytes`' shared headers).
fn sf_list<'a>(
    entries: impl Iterator<Item = &'a PolicyDecision> + Clone,
    params: impl Fn(&Policy, &PolicyDecision) -> [(&'static str, u64); 2],
) -> Result<HeaderValue, http::header::InvalidHeaderValue> {
    let len = entries
        .clone()
        .enumerate()
        .map(|(i, entry)| {
            let separator = if i > 0 { 2 } else { 0 };
            let params = params(entry.policy(), entry)
                .iter()
                .map(|(key, n)| 2 + key.len() + decimal_digits(*n))
                .sum::<usize>();
            separator + 2 + entry.policy().name().len() + params
        })
        .sum();
    let mut out = Vec::with_capacity(len);
    write_members(&mut out, entries, &params);
    debug_assert_eq!(out.len(), len);
    HeaderValue::from_maybe_shared(bytes::Bytes::from(out))
}

/// The longest `RateLimit` member [`state_member`] writes: the quotes and
/// a name of 64 characters, `;r=`, `;t=` and two numbers of 20 digits.
const MEMBER_LEN: usize = 2 + 64 + 2 * (3 + 20);

/// The `RateLimit` field of one policy's decision (the common case: one
/// rule), written on the stack and copied into the value's one allocation:
/// no count of its length first, as [`sf_list`] makes for any number of
/// members. A name too long for the buffer (none that a policy accepts) is
/// written by [`sf_list`].
fn state_member(entry: &PolicyDecision) -> Option<HeaderValue> {
    let name = entry.policy().name().as_bytes();
    if name.len() > 64 {
        return sf_list(std::iter::once(entry), |_, entry| {
            [("r", entry.decision().remaining()), ("t", t_seconds(entry))]
        })
        .ok();
    }
    let mut out = [0u8; MEMBER_LEN];
    let mut len = 0;
    let mut digits = itoa::Buffer::new();
    for part in [
        &b"\""[..],
        name,
        b"\";r=",
        digits.format(entry.decision().remaining()).as_bytes(),
    ] {
        out[len..len + part.len()].copy_from_slice(part);
        len += part.len();
    }
    for part in [&b";t="[..], digits.format(t_seconds(entry)).as_bytes()] {
        out[len..len + part.len()].copy_from_slice(part);
        len += part.len();
    }
    HeaderValue::from_bytes(&out[..len]).ok()
}

/// How many decimal digits `n` is written with.
fn decimal_digits(n: u64) -> usize {
    n.checked_ilog10().map_or(1, |log| log as usize + 1)
}

/// The members of [`sf_list`] written into `out`.
fn write_members<'a>(
    out: &mut Vec<u8>,
    entries: impl Iterator<Item = &'a PolicyDecision>,
    params: &impl Fn(&Policy, &PolicyDecision) -> [(&'static str, u64); 2],
) {
    let mut digits = itoa::Buffer::new();
    for (i, entry) in entries.enumerate() {
        if i > 0 {
            out.extend_from_slice(b", ");
        }
        let policy = entry.policy();
        out.push(b'"');
        out.extend_from_slice(policy.name().as_bytes());
        out.push(b'"');
        for (key, n) in params(policy, entry) {
            out.push(b';');
            out.extend_from_slice(key.as_bytes());
            out.push(b'=');
            out.extend_from_slice(digits.format(n).as_bytes());
        }
    }
}

/// The `t` of one policy: its retry delay when it denied, else the time until
/// its quota is fully restored, in seconds rounded up.
pub(crate) fn t_seconds(entry: &PolicyDecision) -> u64 {
    let d = entry.decision();
    if d.is_allowed() {
        seconds(d.reset_after_micros())
    } else {
        crate::responses::rejection::retry_after_seconds(d.retry_after_micros())
    }
}

fn seconds(micros: u64) -> u64 {
    micros.div_ceil(1_000_000)
}

/// A policy's window (see [`Policy::window`]) in whole seconds, rounded up:
/// the `w` of `RateLimit-Policy` and the window a problem+json detail names.
/// For calendar periods, the length of the period in progress now.
pub(crate) fn window_seconds(policy: &Policy) -> u64 {
    window_seconds_at(policy, unix_micros())
}

/// [`window_seconds`] at `now` (µs of Unix time).
fn window_seconds_at(policy: &Policy, now: u64) -> u64 {
    match calendar_window(policy) {
        Some(window) => {
            let (start, end) = window.bounds(now);
            seconds(end - start)
        }
        None => seconds(u64::try_from(policy.window().as_micros()).unwrap_or(u64::MAX)),
    }
}

/// The fixed window of `policy` when it counts in calendar periods.
fn calendar_window(policy: &Policy) -> Option<&FixedWindow> {
    match policy.algorithm() {
        Algorithm::FixedWindow(window) if window.calendar_periods().is_some() => Some(window),
        _ => None,
    }
}

/// This machine's Unix time in µs.
fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The Unix time, in seconds rounded up, `micros` from now.
fn epoch_seconds_after(micros: u64) -> u64 {
    unix_micros().saturating_add(micros).div_ceil(1_000_000)
}

/// The `t` of one policy in microseconds (see [`t_seconds`]).
fn t_micros(entry: &PolicyDecision) -> u64 {
    let d = entry.decision();
    if d.is_allowed() {
        d.reset_after_micros()
    } else {
        d.retry_after_micros().max(1)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ratelimit_core::Decision;

    use super::*;
    use crate::responses::fields::{RATELIMIT, RATELIMIT_POLICY};

    fn allowed(policies: &[&Policy]) -> Decisions {
        Decisions::new(
            policies
                .iter()
                .map(|&p| PolicyDecision::new(p.clone(), Decision::allow(p.limit(), 1, 2_500_000)))
                .collect(),
        )
    }

    fn fields(decisions: &Decisions, cache: Option<&PolicyFieldCache>) -> (String, String) {
        let mut headers = HeaderMap::new();
        RateLimitHeaders::ietf()
            .fields(decisions, cache)
            .insert_into(&mut headers);
        let text = |name: &http::HeaderName| headers[name].to_str().unwrap().to_owned();
        (text(&RATELIMIT_POLICY), text(&RATELIMIT))
    }

    /// The cached `RateLimit-Policy` is only ever the field of the policy the
    /// response is for: another policy, several policies, or the same
    /// parameters under another name are written afresh.
    #[test]
    fn cached_policy_field_follows_the_policy() {
        let window = Duration::from_secs(10);
        let a = Policy::fixed_window(5, window)
            .unwrap()
            .with_name("a")
            .unwrap();
        let b = Policy::fixed_window(7, Duration::from_secs(60))
            .unwrap()
            .with_name("b")
            .unwrap();
        let a_again = Policy::fixed_window(5, window)
            .unwrap()
            .with_name("a")
            .unwrap();
        let renamed = Policy::fixed_window(5, window)
            .unwrap()
            .with_name("c")
            .unwrap();
        let cache = PolicyFieldCache::default();
        let cases: [(&[&Policy], &str, &str); 6] = [
            (&[&a], r#""a";q=5;w=10"#, r#""a";r=1;t=3"#),
            (&[&b], r#""b";q=7;w=60"#, r#""b";r=1;t=3"#),
            (&[&a], r#""a";q=5;w=10"#, r#""a";r=1;t=3"#),
            (
                &[&a, &b],
                r#""a";q=5;w=10, "b";q=7;w=60"#,
                r#""a";r=1;t=3, "b";r=1;t=3"#,
            ),
            (&[&a_again], r#""a";q=5;w=10"#, r#""a";r=1;t=3"#),
            (&[&renamed], r#""c";q=5;w=10"#, r#""c";r=1;t=3"#),
        ];
        for (policies, policy, state) in cases {
            let decisions = allowed(policies);
            let want = (policy.to_owned(), state.to_owned());
            assert_eq!(fields(&decisions, Some(&cache)), want);
            assert_eq!(fields(&decisions, None), want);
        }
    }

    /// A cached field is shared by the responses of its policy: the bytes
    /// written for the first one, not written again.
    #[test]
    fn cached_policy_field_is_shared_by_the_responses() {
        let policy = Policy::fixed_window(5, Duration::from_secs(10))
            .unwrap()
            .with_name("shared")
            .unwrap();
        let decisions = allowed(&[&policy]);
        let cache = PolicyFieldCache::default();
        let first = cache.field(&decisions).unwrap();
        let (second, third) = (
            cache.field(&decisions).unwrap(),
            cache.field(&decisions).unwrap(),
        );
        let (cached, _) = fields(&decisions, Some(&cache));
        assert_eq!(first, r#""shared";q=5;w=10"#);
        assert_eq!((&second, &third), (&first, &first));
        assert_eq!(cached, r#""shared";q=5;w=10"#);
        let stored = cache.0.get().unwrap().1.as_bytes().as_ptr();
        assert_eq!(second.as_bytes().as_ptr(), stored);
        assert_eq!(third.as_bytes().as_ptr(), stored);
        // Another policy's field is its own.
        let other = Policy::fixed_window(5, Duration::from_secs(10))
            .unwrap()
            .with_name("other")
            .unwrap();
        let elsewhere = cache.field(&allowed(&[&other])).unwrap();
        assert_eq!(elsewhere, r#""other";q=5;w=10"#);
        assert_ne!(elsewhere.as_bytes().as_ptr(), stored);
    }

    /// A calendar period's `w` is the real length of the period in
    /// progress, and its field is written afresh for every response.
    #[test]
    fn a_calendar_period_has_the_window_of_the_period_in_progress() {
        use ratelimit_core::Period;
        const DAY: u64 = 86_400;
        const MICROS: u64 = 1_000_000;
        let monthly = Policy::calendar(5, Period::Month)
            .unwrap()
            .with_name("m")
            .unwrap();
        // 2024-02-10 and 2024-03-10 (a leap year), 2023-02-10, 2024-12-31.
        let cases = [(19_763, 29), (19_792, 31), (19_398, 28), (20_088, 31)];
        for (day, length) in cases {
            assert_eq!(
                window_seconds_at(&monthly, day * DAY * MICROS),
                length * DAY
            );
        }
        let yearly = Policy::calendar(5, Period::Year).unwrap();
        assert_eq!(window_seconds_at(&yearly, 19_763 * DAY * MICROS), 366 * DAY);
        // The cache never holds it: its field follows the clock.
        let cache = PolicyFieldCache::default();
        let decisions = allowed(&[&monthly]);
        let (field, _) = fields(&decisions, Some(&cache));
        assert_eq!(field, format!("\"m\";q=5;w={}", window_seconds(&monthly)));
        assert!(cache.0.get().is_none());
        assert!(
            [28, 29, 30, 31]
                .map(|d| d * DAY)
                .contains(&window_seconds(&monthly))
        );
    }

    /// A field's length is counted before it is written: every number's
    /// digits, at each power of ten.
    #[test]
    fn decimal_digits_match_the_written_numbers() {
        let mut n = 1u64;
        for _ in 0..20 {
            for m in [n - 1, n, n.saturating_add(n / 2), n.saturating_mul(10) - 1] {
                assert_eq!(decimal_digits(m), m.to_string().len(), "{m}");
            }
            n = n.saturating_mul(10);
        }
        assert_eq!(decimal_digits(u64::MAX), 20);
    }

    /// Long fields (two policies with 64-character names and 13-digit
    /// numbers) are written in full.
    #[test]
    fn long_fields_are_written_whole() {
        let long = |c: char| {
            Policy::fixed_window(1_000_000_000_000, Duration::from_secs(31_536_000))
                .unwrap()
                .with_name(c.to_string().repeat(64))
                .unwrap()
        };
        let (x, y) = (long('x'), long('y'));
        let decisions = allowed(&[&x, &y]);
        let (policy, state) = fields(&decisions, Some(&PolicyFieldCache::default()));
        let member = |name: &Policy| {
            format!(
                "\"{}\";q={};w={}",
                name.name(),
                name.limit(),
                window_seconds(name)
            )
        };
        assert!(policy.len() > 128, "{policy}");
        assert_eq!(policy, format!("{}, {}", member(&x), member(&y)));
        assert_eq!(
            state,
            format!("\"{}\";r=1;t=3, \"{}\";r=1;t=3", x.name(), y.name())
        );
        // One member, as long as it gets: written on the stack.
        let one = Decisions::new(vec![PolicyDecision::new(
            x.clone(),
            Decision::allow(u64::MAX, u64::MAX, u64::MAX),
        )]);
        let (_, state) = fields(&one, None);
        let t = u64::MAX.div_ceil(1_000_000);
        assert_eq!(state, format!("\"{}\";r={};t={t}", x.name(), u64::MAX));
        assert_eq!(state.len(), MEMBER_LEN - 6);
    }
}
