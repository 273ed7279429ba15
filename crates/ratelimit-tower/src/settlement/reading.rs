//! What a response says a request cost: a header's value read as a whole
//! number, and the most a settlement charges.

use http::HeaderValue;
use http::header::GetAll;
use ratelimit_core::Policy;

/// What one limit of a request is settled to, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reading {
    /// The cost the response named.
    Cost(u64),
    /// The response named more than a settlement can charge: charged as
    /// that most ([`most_charged`]).
    Clamped(u64),
    /// The response was a failure: the reservation is given back.
    Refunded,
    /// The response named no cost: the estimate stays (1 for an estimate
    /// of 0: a cost unknown is never free).
    Missing,
    /// The response named something that is not a cost: as [`Reading::Missing`].
    Invalid,
    /// No response head came (the request was cancelled, or its service
    /// failed): the reservation is given back when `refund`, else kept.
    Cancelled {
        /// Whether the rule gives it back.
        refund: bool,
    },
}

impl Reading {
    /// The cost the limit is settled to, for a reservation of `estimate`.
    /// A response that names no cost, or no valid one, is charged at least
    /// 1: with an estimate of 0 (a peek), a service that never names its
    /// costs (a misspelt header) would otherwise lift the limit.
    pub(crate) fn actual(self, estimate: u64) -> u64 {
        match self {
            Reading::Cost(cost) | Reading::Clamped(cost) => cost,
            Reading::Refunded | Reading::Cancelled { refund: true } => 0,
            Reading::Missing | Reading::Invalid => estimate.max(1),
            Reading::Cancelled { refund: false } => estimate,
        }
    }

    /// The `outcome` label of `ratelimit_settlements_total` once settled.
    pub(crate) fn outcome(self) -> &'static str {
        match self {
            Reading::Cost(_) => "settled",
            Reading::Clamped(_) => "clamped",
            Reading::Refunded => "refunded",
            Reading::Missing => "missing_cost",
            Reading::Invalid => "invalid_cost",
            Reading::Cancelled { refund: true } => "cancelled",
            Reading::Cancelled { refund: false } => "cancelled_kept",
        }
    }

    /// `cost`, read for `policy`: itself, or the most a settlement charges.
    pub(crate) fn of(cost: u64, policy: &Policy) -> Reading {
        let most = most_charged(policy);
        if cost > most {
            Reading::Clamped(most)
        } else {
            Reading::Cost(cost)
        }
    }
}

/// The most a settlement charges under `policy`: twice its limit. A
/// settlement takes a budget at most one full budget into debt, and from any
/// reservation (which left at most a full budget) twice the limit gets there,
/// so a larger cost would change nothing.
pub(crate) fn most_charged(policy: &Policy) -> u64 {
    policy.limit().saturating_mul(2)
}

/// The cost a header names: `None` without the header, `Err` when it is sent
/// more than once or its value is not a whole number in ASCII digits (spaces
/// and tabs around it allowed). A number too large for a `u64` is
/// `u64::MAX`: huge, not invalid.
pub(crate) fn header_cost(values: GetAll<'_, HeaderValue>) -> Option<Result<u64, ()>> {
    let mut values = values.into_iter();
    let first = values.next()?;
    if values.next().is_some() {
        return Some(Err(()));
    }
    Some(whole_number(first.as_bytes()).ok_or(()))
}

/// `bytes` as a whole number of ASCII digits between optional spaces and
/// tabs, saturating at `u64::MAX`; `None` for anything else.
fn whole_number(bytes: &[u8]) -> Option<u64> {
    let is_space = |b: &u8| *b == b' ' || *b == b'\t';
    let start = bytes.iter().position(|b| !is_space(b))?;
    let end = bytes.iter().rposition(|b| !is_space(b))?;
    let digits = &bytes[start..=end];
    if !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(digits.iter().fold(0_u64, |n, d| {
        n.saturating_mul(10).saturating_add(u64::from(d - b'0'))
    }))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::HeaderMap;

    use super::*;

    fn read(values: &[&[u8]]) -> Option<Result<u64, ()>> {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append("x-cost", HeaderValue::from_bytes(value).unwrap());
        }
        header_cost(headers.get_all("x-cost"))
    }

    #[test]
    fn header_values() {
        assert_eq!(read(&[]), None);
        assert_eq!(read(&[b"417"]), Some(Ok(417)));
        assert_eq!(read(&[b" 0417\t"]), Some(Ok(417)));
        assert_eq!(read(&[b"0"]), Some(Ok(0)));
        assert_eq!(read(&[b"18446744073709551615"]), Some(Ok(u64::MAX)));
        assert_eq!(read(&[b"18446744073709551616"]), Some(Ok(u64::MAX)));
        assert_eq!(read(&[&[b'9'; 4096]]), Some(Ok(u64::MAX)));
        for bad in [
            &b""[..],
            b"  ",
            b"-1",
            b"+1",
            b"1.5",
            b"1e3",
            b"0x10",
            b"1 2",
            b"12a",
            b"\xff",
            "\u{661}".as_bytes(),
        ] {
            assert_eq!(read(&[bad]), Some(Err(())), "{bad:?}");
        }
        assert_eq!(read(&[b"1", b"2"]), Some(Err(())));
    }

    #[test]
    fn huge_costs_are_charged_as_twice_the_limit() {
        let policy = Policy::fixed_window(1_000, Duration::from_secs(60)).unwrap();
        assert_eq!(Reading::of(2_000, &policy), Reading::Cost(2_000));
        assert_eq!(Reading::of(2_001, &policy), Reading::Clamped(2_000));
        assert_eq!(Reading::of(u64::MAX, &policy), Reading::Clamped(2_000));
        assert_eq!(Reading::Clamped(2_000).actual(1), 2_000);
        assert_eq!(Reading::Refunded.actual(7), 0);
        assert_eq!(Reading::Missing.actual(7), 7);
        assert_eq!(Reading::Invalid.actual(7), 7);
        assert_eq!(Reading::Missing.actual(0), 1);
        assert_eq!(Reading::Invalid.actual(0), 1);
        assert_eq!(Reading::Cancelled { refund: false }.actual(0), 0);
    }
}
