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
        Algorithm::FixedWindow(a) => (a.limit(), a.window_micros()),
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

/// The decision of one check from the reply of `single.lua`: one record
/// of [`BATCH_RECORD`] bytes (`{allowed, remaining, reset, wait}`), the
/// limit being the policy's first parameter (`limit`), which the reply
/// leaves out.
pub(super) fn single_from(
    value: &Value,
    limit: u64,
    permit: PermitId,
    cost: u64,
) -> Result<Decision, StoreError> {
    let four = match value {
        Value::BulkString(record) => batch_record(record).ok().flatten(),
        _ => None,
    };
    let Some(four) = four else {
        return Err(protocol_error("a decision", value));
    };
    Ok(decision_of_four(four, limit, permit, cost))
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

/// The bytes of one record in a batch's reply (`batch.lua`): allowed (one
/// byte), then remaining, reset and wait, each a little-endian double
/// (Lua's `struct.pack('<Bddd', ...)`).
///
/// Read by hand rather than as an array of integers: redis-rs makes a
/// `Value` per number, about 900 client instructions each. Measured with
/// callgrind (`bench --store redis --algorithm gcra --concurrency 64`, 60,000
/// minus 20,000 decisions): 8,930 instead of 12,600 client instructions per
/// decision; Redis's per batched decision unchanged (46,350 against 46,320
/// in batches of 16 GCRA requests, 43,750 against 43,930 in batches of 64).
pub(super) const BATCH_RECORD: usize = 25;

/// What one record of a batch's reply says: a check's `[allowed,
/// remaining, reset, wait]` (allowed 1 or 0), or `None` for a request that
/// failed (its message follows the records). An error names what is wrong.
pub(super) fn batch_record(record: &[u8]) -> Result<Option<[u64; 4]>, String> {
    let Some((&allowed, numbers)) = record.split_first() else {
        return Err("an empty record".to_owned());
    };
    if numbers.len() != 3 * 8 {
        return Err(format!(
            "a record of {} bytes, not {BATCH_RECORD}",
            record.len()
        ));
    }
    if allowed == 2 {
        return Ok(None);
    }
    if allowed > 1 {
        return Err(format!("allowed is {allowed}, not 0, 1 or 2"));
    }
    let mut fields = [u64::from(allowed), 0, 0, 0];
    for (field, bytes) in fields[1..].iter_mut().zip(numbers.chunks_exact(8)) {
        let mut double = [0; 8];
        double.copy_from_slice(bytes);
        let value = f64::from_le_bytes(double);
        // 2^64: the first double above u64::MAX.
        if !(0.0..18_446_744_073_709_551_616.0).contains(&value) || value.fract() != 0.0 {
            return Err(format!("{value} is not a count or a duration"));
        }
        // A whole number in range, checked above: exact.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        {
            *field = value as u64;
        }
    }
    Ok(Some(fields))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A record as `batch.lua` packs it.
    pub(in crate::redis) fn record(allowed: u8, remaining: f64, reset: f64, wait: f64) -> Vec<u8> {
        let mut bytes = vec![allowed];
        for value in [remaining, reset, wait] {
            bytes.extend_from_slice(&value.to_le_bytes());
        }
        bytes
    }

    #[test]
    fn a_record_reads_as_its_fields() {
        assert_eq!(
            batch_record(&record(1, 99.0, 36e8, 0.0)),
            Ok(Some([1, 99, 3_600_000_000, 0]))
        );
        assert_eq!(
            batch_record(&record(0, 0.0, 5.0, 2e15)),
            Ok(Some([0, 0, 5, 2_000_000_000_000_000]))
        );
        assert_eq!(batch_record(&record(2, 0.0, 0.0, 0.0)), Ok(None));
    }

    /// A single decision's reply is one record: it reads as the decision;
    /// anything else (the array of four integers replies used to be, a
    /// failed request's record, garbled bytes) is a protocol error.
    #[test]
    fn a_single_reply_is_one_record() {
        let reply = Value::BulkString(record(0, 0.0, 1_500_000.0, 250_000.0));
        let denied = single_from(&reply, 10, PermitId(0), 1).unwrap();
        assert!(!denied.is_allowed());
        assert_eq!(denied.limit(), 10);
        assert_eq!(denied.reset_after_micros(), 1_500_000);
        assert_eq!(denied.retry_after_micros(), 250_000);
        let reply = Value::BulkString(record(1, 7.0, 3.0, 0.0));
        let allowed = single_from(&reply, 10, PermitId(0), 1).unwrap();
        assert!(allowed.is_allowed());
        assert_eq!(allowed.remaining(), 7);
        let four = Value::Array(vec![Value::Int(1); 4]);
        for wrong in [
            four,
            Value::BulkString(record(2, 0.0, 0.0, 0.0)),
            Value::BulkString(vec![1; 24]),
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

    /// Garbled bytes are an error naming what is wrong, never a panic.
    #[test]
    fn garbled_records_are_errors_that_say_why() {
        let good = record(1, 1.0, 2.0, 3.0);
        for (bytes, says) in [
            (Vec::new(), "empty"),
            (good[..1].to_vec(), "1 bytes"),
            (good[..24].to_vec(), "24 bytes"),
            ([good.as_slice(), &[0]].concat(), "26 bytes"),
            (record(7, 1.0, 2.0, 3.0), "allowed is 7"),
            (record(1, -1.0, 2.0, 3.0), "-1 is not"),
            (record(1, 1.5, 2.0, 3.0), "1.5 is not"),
            (record(0, 1.0, f64::NAN, 3.0), "NaN is not"),
            (record(0, 1.0, 2.0, f64::INFINITY), "inf is not"),
            (record(0, 1.0, 2.0, 1.9e19), "19000000000000000000 is not"),
        ] {
            match batch_record(&bytes) {
                Err(e) => assert!(e.contains(says), "{e:?} should say {says:?}"),
                Ok(fields) => panic!("{bytes:?} read as {fields:?}"),
            }
        }
    }
}
