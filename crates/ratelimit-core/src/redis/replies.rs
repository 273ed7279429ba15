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

/// The decision of one check from the reply of `single.lua`:
/// `{allowed, remaining, reset, wait}`, the limit being the policy's first
/// parameter (`limit`), which the reply leaves out.
pub(super) fn single_from(
    value: &Value,
    limit: u64,
    permit: PermitId,
    cost: u64,
) -> Result<Decision, StoreError> {
    let fields = match value {
        Value::Array(items) if items.len() == 4 => {
            items.iter().map(int).collect::<Option<Vec<u64>>>()
        }
        _ => None,
    };
    let Some(four) = fields.as_deref().and_then(|f| <[u64; 4]>::try_from(f).ok()) else {
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
