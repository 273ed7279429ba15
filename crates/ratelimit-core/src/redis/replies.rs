//! The arguments sent to the scripts and the replies read back: one
//! decision, a multi-limit group, what a cross-slot denial reports.

use super::*;

pub(super) enum Arg<'a> {
    Int(u64),
    Str(&'a str),
    Owned(String),
}

/// The two numeric parameters each algorithm's script takes.
pub(super) fn parameters(algorithm: &Algorithm) -> (u64, u64) {
    match algorithm {
        Algorithm::FixedWindow(a) => (a.limit(), a.script_window()),
        Algorithm::SlidingWindowLog(a) => (a.limit(), a.window_micros()),
        Algorithm::SlidingWindowCounter(a) => (a.limit(), a.window_micros()),
        Algorithm::TokenBucket(a) => (a.capacity(), a.interval_micros()),
        Algorithm::Gcra(a) => (a.burst(), a.interval_micros()),
        Algorithm::LeakyBucket(a) => (a.capacity(), a.interval_micros()),
        Algorithm::Concurrency(a) => (a.max(), a.lease_micros()),
    }
}

pub(super) fn protocol_error(what: &str, value: &Value) -> StoreError {
    StoreError::Backend(format!("unexpected reply to {what}: {value:?}").into())
}

pub(super) fn text(value: Option<&Value>) -> String {
    match value {
        Some(Value::BulkString(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
        Some(Value::SimpleString(s)) => s.clone(),
        Some(Value::Int(n)) => n.to_string(),
        _ => String::new(),
    }
}

pub(super) fn int(value: &Value) -> Option<u64> {
    match value {
        Value::Int(n) => u64::try_from(*n).ok(),
        _ => None,
    }
}

/// `{allowed, limit, remaining, reset, retry, delay}` as a decision.
pub(super) fn decision_from(
    value: &Value,
    permit: PermitId,
    cost: u64,
) -> Result<Decision, StoreError> {
    let Value::Array(items) = value else {
        return Err(protocol_error("a decision", value));
    };
    // Multi-limit replies carry two strings more (the state after and before).
    let fields: Option<Vec<u64>> = items.iter().take(6).map(int).collect();
    let Some([allowed, limit, remaining, reset, retry, delay]) =
        fields.as_deref().and_then(|f| <[u64; 6]>::try_from(f).ok())
    else {
        return Err(protocol_error("a decision", value));
    };
    let wait = if allowed == 1 { delay } else { retry };
    Ok(decision_of_four(
        [allowed, remaining, reset, wait],
        limit,
        permit,
        cost,
    ))
}

/// The decision of one check from the reply of `single.lua`: four
/// integers, `{allowed, remaining, reset, wait}`, the limit being the
/// policy's first parameter (`limit`), which the reply leaves out.
pub(super) fn single_from(
    value: &Value,
    limit: u64,
    permit: PermitId,
    cost: u64,
) -> Result<Decision, StoreError> {
    let four = match value {
        Value::Array(fields) => check_fields(fields).ok(),
        _ => None,
    };
    let Some(four) = four else {
        return Err(protocol_error("a decision", value));
    };
    Ok(decision_of_four(four, limit, permit, cost))
}

/// One check's `{allowed, remaining, reset, wait}` from its four values of
/// a reply (`single.lua`, `batch.lua`): integers, allowed 1 or 0, none
/// negative. What is wrong when they are not.
pub(super) fn check_fields(values: &[Value]) -> Result<[u64; 4], String> {
    let [allowed, remaining, reset, wait] = values else {
        return Err(format!("{} values for a check, not 4", values.len()));
    };
    let mut fields = [0; 4];
    for (field, value) in fields.iter_mut().zip([allowed, remaining, reset, wait]) {
        *field = int(value).ok_or_else(|| format!("{value:?} is not a count or a duration"))?;
    }
    if fields[0] > 1 {
        return Err(format!("allowed is {}, not 1 or 0", fields[0]));
    }
    Ok(fields)
}

/// One check's `{allowed, remaining, reset, wait}` from the text reply of
/// `single.lua` (four decimal integers separated by single spaces), held to
/// the rules of [`check_fields`]. What is wrong when it is not one.
#[cfg(feature = "redis-cluster")]
pub(super) fn text_fields(bytes: &[u8]) -> Result<[u64; 4], String> {
    let text = std::str::from_utf8(bytes).map_err(|_| format!("{bytes:?} is not text"))?;
    let mut parts = text.split(' ');
    let mut fields = [0; 4];
    for field in &mut fields {
        let part = parts
            .next()
            .ok_or_else(|| format!("{text:?} has fewer than four fields"))?;
        *field = part
            .parse()
            .map_err(|_| format!("{part:?} is not a count or a duration"))?;
    }
    if parts.next().is_some() {
        return Err(format!("{text:?} has more than four fields"));
    }
    if fields[0] > 1 {
        return Err(format!("allowed is {}, not 1 or 0", fields[0]));
    }
    Ok(fields)
}

/// A decision from `{allowed, remaining, reset, wait}` and the limit.
fn decision_of_four(fields: [u64; 4], limit: u64, permit: PermitId, cost: u64) -> Decision {
    let [allowed, remaining, reset, wait] = fields;
    decision_of(allowed == 1, limit, remaining, reset, wait, permit, cost)
}

/// A decision from its fields: admitted when `allowed` (after `wait` µs,
/// holding `permit` when it took something), or denied (retried after
/// `wait` µs).
pub(super) fn decision_of(
    allowed: bool,
    limit: u64,
    remaining: u64,
    reset: u64,
    wait: u64,
    permit: PermitId,
    cost: u64,
) -> Decision {
    if allowed {
        let decision = Decision::allow(limit, remaining, reset).with_delay_us(wait);
        if permit.0 != 0 && cost > 0 {
            decision.with_permit(permit)
        } else {
            decision
        }
    } else {
        Decision::deny(limit, remaining, reset, wait)
    }
}

/// What a cross-slot denial reports for a limit whose peek failed: its own
/// decision when its slot was decided (it allowed, and was refunded), without
/// its permit; for a slot never reached, nothing known left (remaining 0,
/// restored within the policy's window).
#[cfg(feature = "redis-cluster")]
pub(super) fn unpeeked(policy: &Policy, decided: Option<&Decision>) -> Decision {
    match decided {
        Some(d) => Decision::allow(d.limit(), d.remaining(), d.reset_after_micros()),
        None => Decision::allow(
            parameters(policy.algorithm()).0,
            0,
            policy.algorithm().window_micros(),
        ),
    }
}

/// The decisions of a multi-limit check from its reply (`multi.lua`, or its
/// entry in a batch's reply) and, per check, the state after and before its
/// write when the reply has them (for refunds).
pub(super) fn group_from(
    reply: &Value,
    requests: &[(Policy, u64, PermitId)],
) -> Result<(Vec<Decision>, Vec<StateChange>), StoreError> {
    let Value::Array(items) = reply else {
        return Err(protocol_error("several decisions", reply));
    };
    if items.len() != requests.len() {
        return Err(protocol_error("several decisions", reply));
    }
    let decisions: Vec<Decision> = items
        .iter()
        .zip(requests)
        .map(|(item, (_, cost, permit))| decision_from(item, *permit, *cost))
        .collect::<Result<_, _>>()?;
    if !crate::store::all_allowed(&decisions) {
        // Nothing was taken: the limits that would have allowed report a
        // peek, which holds no permit.
        let peeks = items
            .iter()
            .map(|item| decision_from(item, PermitId(0), 0))
            .collect::<Result<_, _>>()?;
        return Ok((peeks, Vec::new()));
    }
    let states = items
        .iter()
        .map(|item| match item {
            Value::Array(fields) => (text(fields.get(6)), text(fields.get(7))),
            _ => (String::new(), String::new()),
        })
        .collect();
    Ok((decisions, states))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ints(values: &[i64]) -> Value {
        Value::Array(values.iter().map(|&n| Value::Int(n)).collect())
    }

    /// A single decision's reply is four integers: it reads as the
    /// decision; anything else (too few or too many, a negative number, a
    /// string, allowed above 1) is a protocol error, never a panic.
    #[test]
    fn a_single_reply_is_four_integers() {
        let denied = single_from(&ints(&[0, 0, 1_500_000, 250_000]), 10, PermitId(0), 1).unwrap();
        assert!(!denied.is_allowed());
        assert_eq!(denied.limit(), 10);
        assert_eq!(denied.reset_after_micros(), 1_500_000);
        assert_eq!(denied.retry_after_micros(), 250_000);
        let allowed = single_from(&ints(&[1, 7, 3, 0]), 10, PermitId(0), 1).unwrap();
        assert!(allowed.is_allowed());
        assert_eq!(allowed.remaining(), 7);
        for wrong in [
            ints(&[1, 7, 3]),
            ints(&[1, 7, 3, 0, 0]),
            ints(&[1, -7, 3, 0]),
            ints(&[2, 7, 3, 0]),
            Value::Array(vec![
                Value::Int(1),
                Value::Int(7),
                Value::Int(3),
                Value::Nil,
            ]),
            Value::BulkString(b"\x01".to_vec()),
            Value::Nil,
        ] {
            assert!(
                matches!(
                    single_from(&wrong, 10, PermitId(0), 1),
                    Err(StoreError::Backend(_))
                ),
                "{wrong:?}"
            );
        }
    }

    /// A text reply reads as its four fields; one with fewer or more
    /// fields, a negative or non-decimal field, or an `allowed` that is not
    /// 1 or 0 is an error that says so, never a decision.
    #[cfg(feature = "redis-cluster")]
    #[test]
    fn a_text_reply_reads_as_its_four_fields() {
        assert_eq!(text_fields(b"1 999 1000000 0"), Ok([1, 999, 1_000_000, 0]));
        assert_eq!(
            text_fields(format!("0 0 {} {}", 1u64 << 40, i64::MAX).as_bytes()),
            Ok([0, 0, 1 << 40, i64::MAX as u64])
        );
        for (bytes, says) in [
            (&b"1 9 1"[..], "fewer than four"),
            (b"1 9 1 0 0", "more than four"),
            (b"1 -1 1 0", "\"-1\" is not a count"),
            (b"1 9 1e+15 0", "\"1e+15\" is not a count"),
            (b"1 9  0", "\"\" is not a count"),
            (b"2 9 1 0", "allowed is 2"),
            (b"1 9 \xff 0", "is not text"),
        ] {
            match text_fields(bytes) {
                Err(e) => assert!(e.contains(says), "{e:?} should say {says:?}"),
                Ok(fields) => panic!("{bytes:?} read as {fields:?}"),
            }
        }
    }
}
