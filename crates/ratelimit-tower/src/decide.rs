//! The decision for one request: rules, store, waiting, permits.

use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use ratelimit_core::{Check, Decision, Store, StoreError};

use crate::decisions::{Decisions, PolicyDecision};
use crate::layer::{FailurePolicy, Mode};
use crate::permit::PermitGuard;
use crate::reject::Rejection;
use crate::rule::{Limit, Limits};

/// What the layer does with a request.
pub(crate) enum Outcome {
    /// No limit applies.
    Unlimited,
    /// Every limit allowed; the permits are held.
    Allowed(Decisions, PermitGuard),
    /// The store failed and the failure policy lets the request through.
    FailedOpen,
    /// Refused.
    Rejected(Rejection),
}

pub(crate) type OutcomeFuture = Pin<Box<dyn Future<Output = Outcome> + Send>>;

pub(crate) struct Settings<St> {
    pub(crate) stats: Arc<crate::layer::Stats>,
    pub(crate) store: St,
    pub(crate) mode: Mode,
    pub(crate) failure: FailurePolicy,
    pub(crate) timeout: Option<Duration>,
}

pub(crate) fn decide<St, F>(settings: Settings<St>, limits: F) -> OutcomeFuture
where
    St: Store + Clone,
    F: Future<Output = Limits> + Send + 'static,
{
    Box::pin(async move {
        let limits = limits.await;
        if limits.is_reject() {
            return Outcome::Rejected(Rejection::MissingKey);
        }
        if limits.is_empty() {
            return Outcome::Unlimited;
        }
        decide_limits(settings, limits.into_vec()).await
    })
}

async fn decide_limits<St: Store + Clone>(settings: Settings<St>, limits: Vec<Limit>) -> Outcome {
    let started = tokio::time::Instant::now();
    loop {
        let decisions = match ask(&settings, &limits).await {
            Ok(decisions) => decisions,
            Err(StoreError::CostExceedsLimit { policy, cost, max }) => {
                return Outcome::Rejected(Rejection::CostTooHigh { policy, cost, max });
            }
            Err(error) => {
                let allowed = settings.failure.allows(&error);
                settings.stats.record(allowed);
                tracing::warn!(
                    error = %error,
                    allowed,
                    "rate-limit store could not decide; the failure policy {}",
                    if allowed { "lets the request through" } else { "refuses it" }
                );
                return if allowed {
                    Outcome::FailedOpen
                } else {
                    Outcome::Rejected(Rejection::Unavailable(Arc::new(error)))
                };
            }
        };
        let allowed = decisions.iter().all(Decision::is_allowed);
        let mut permits = PermitGuard::default();
        if allowed {
            for (limit, decision) in limits.iter().zip(&decisions) {
                if let Some(permit) = decision.permit() {
                    permits.hold(&settings.store, limit.key(), limit.policy(), permit);
                }
            }
        }
        let delay = decisions
            .iter()
            .map(Decision::delay)
            .max()
            .unwrap_or_default();
        let retry = decisions
            .iter()
            .filter_map(Decision::retry_after)
            .max()
            .unwrap_or_default();
        let decisions = Decisions::new(
            limits
                .iter()
                .zip(decisions)
                .map(|(limit, decision)| PolicyDecision::new(limit.policy().clone(), decision))
                .collect(),
        );
        match settings.mode {
            Mode::Reject if allowed => return Outcome::Allowed(decisions, permits),
            Mode::Reject => return Outcome::Rejected(Rejection::Limited(decisions)),
            Mode::Wait { max_delay } if allowed => {
                // A leaky bucket reserved a slot for this request: wait for it,
                // unless it lies beyond the wait allowed. The slot stays
                // reserved either way (a store cannot give a slot back), which
                // errs towards fewer calls, never more. Concurrency permits
                // are dropped, and released, if the wait is cancelled.
                if started.elapsed() + delay > max_delay {
                    return Outcome::Rejected(Rejection::Limited(decisions));
                }
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                return Outcome::Allowed(decisions, permits);
            }
            Mode::Wait { max_delay } => {
                let wait = retry + jitter(retry);
                if started.elapsed() + wait > max_delay {
                    return Outcome::Rejected(Rejection::Limited(decisions));
                }
                tokio::time::sleep(wait).await;
            }
        }
    }
}

async fn ask<St: Store>(
    settings: &Settings<St>,
    limits: &[Limit],
) -> Result<Vec<Decision>, StoreError> {
    let call = async {
        if let [limit] = limits {
            let decision = settings
                .store
                .check(limit.key().as_bytes(), limit.policy(), limit.cost())
                .await?;
            Ok(vec![decision])
        } else {
            let checks: Vec<Check<'_>> = limits
                .iter()
                .map(|l| Check::new(l.key().as_bytes(), l.policy(), l.cost()))
                .collect();
            settings.store.check_all(&checks).await
        }
    };
    match settings.timeout {
        Some(timeout) => tokio::time::timeout(timeout, call)
            .await
            .unwrap_or(Err(StoreError::Timeout(timeout))),
        None => call.await,
    }
}

/// Up to a tenth of the wait (at most 50 ms), so workers that were denied
/// together do not all come back in the same instant.
fn jitter(wait: Duration) -> Duration {
    let cap = u64::try_from((wait / 10).min(Duration::from_millis(50)).as_micros()).unwrap_or(0);
    if cap == 0 {
        return Duration::ZERO;
    }
    let random = RandomState::new().hash_one(std::time::Instant::now());
    Duration::from_micros(random % (cap + 1))
}
