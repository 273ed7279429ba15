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
//! whole second).
//!
//! The legacy fields describe the most restrictive policy:
//! `X-RateLimit-Limit`, `X-RateLimit-Remaining`, and `X-RateLimit-Reset` in
//! delay-seconds by default, or in Unix epoch seconds as GitHub sends it.

use std::time::{SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderName, HeaderValue};
use ratelimit_core::Policy;

use crate::decisions::{Decisions, PolicyDecision};

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

    /// Writes the selected headers for `decisions` into `headers`.
    pub fn apply(&self, decisions: &Decisions, headers: &mut HeaderMap) {
        if decisions.is_empty() {
            return;
        }
        if self.ietf {
            let entries = decisions.iter();
            let policy = sf_list(entries.clone(), |p, _| {
                [("q", p.limit()), ("w", window_seconds(p))]
            });
            let state = sf_list(entries, |_, entry| {
                [("r", entry.decision().remaining()), ("t", t_seconds(entry))]
            });
            if let Ok(v) = policy {
                headers.insert(RATELIMIT_POLICY.clone(), v);
            }
            if let Ok(v) = state {
                headers.insert(RATELIMIT.clone(), v);
            }
        }
        if let (Some(format), Some(tightest)) = (self.legacy, decisions.tightest()) {
            let d = tightest.decision();
            headers.insert(X_RATELIMIT_LIMIT.clone(), HeaderValue::from(d.limit()));
            headers.insert(
                X_RATELIMIT_REMAINING.clone(),
                HeaderValue::from(d.remaining()),
            );
            let delay = t_seconds(tightest);
            let reset = match format {
                ResetFormat::DelaySeconds => delay,
                ResetFormat::EpochSeconds => epoch_seconds_after(t_micros(tightest)),
            };
            headers.insert(X_RATELIMIT_RESET.clone(), HeaderValue::from(reset));
        }
    }
}

/// A structured-field list with one member per policy, `"<name>"` with the
/// two integer parameters `params` gives: written in one allocation of the
/// right size, without `fmt` (a header on every response).
fn sf_list<'a>(
    entries: impl Iterator<Item = &'a PolicyDecision> + Clone,
    params: impl Fn(&Policy, &PolicyDecision) -> [(&'static str, u64); 2],
) -> Result<HeaderValue, http::header::InvalidHeaderValue> {
    // Per member: `, "` `";` and `k=` `;` `k=` with two integers of at most 20 digits.
    let len = entries
        .clone()
        .map(|e| e.policy().name().len() + 2 + 3 + 2 * (2 + 20) + 1)
        .sum();
    let mut value = Vec::with_capacity(len);
    let mut digits = itoa::Buffer::new();
    for (i, entry) in entries.enumerate() {
        if i > 0 {
            value.extend_from_slice(b", ");
        }
        let policy = entry.policy();
        value.push(b'"');
        value.extend_from_slice(policy.name().as_bytes());
        value.push(b'"');
        for (key, n) in params(policy, entry) {
            value.push(b';');
            value.extend_from_slice(key.as_bytes());
            value.push(b'=');
            value.extend_from_slice(digits.format(n).as_bytes());
        }
    }
    HeaderValue::from_maybe_shared(bytes::Bytes::from(value))
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
pub(crate) fn window_seconds(policy: &Policy) -> u64 {
    seconds(u64::try_from(policy.window().as_micros()).unwrap_or(u64::MAX))
}

/// The Unix time, in seconds rounded up, `micros` from now.
fn epoch_seconds_after(micros: u64) -> u64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0);
    now.saturating_add(micros).div_ceil(1_000_000)
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
