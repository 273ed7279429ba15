//! The decision for one request: rules, store, waiting, permits.

use std::future::{Future, ready};
use std::hash::{BuildHasher, RandomState};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use ratelimit_core::{
    Algorithm, Check, Decision, Policy, RefundFuture, Settle, SettlementId, Store, StoreError,
};
use tokio::time::Instant;

use crate::decisions::{Decisions, PolicyDecision};
use crate::keys::Key;
use crate::metrics::{self, Recorder};
use crate::options::{FailurePolicy, Mode, Stats};
use crate::permit::PermitGuard;
use crate::responses::rejection::Rejection;
use crate::rules::rule::{Limit, Limits};
use crate::settlement::SettleError;
use crate::settlement::reservation::{Reservation, Reserved};

/// What the layer does with a request.
pub(crate) enum Outcome {
    /// No limit applies.
    Unlimited,
    /// Every enforced limit allowed; the permits are held (shadow policies'
    /// too), and what limits that settle after the response reserved.
    Allowed(Decisions, PermitGuard, Option<Box<Reservation>>),
    /// The store failed for the enforced limits and the failure policy lets
    /// the request through; the decisions, permits and reservations of the
    /// shadow policies, if the store could decide those (and the cost
    /// headers of the enforced ones, to remove).
    FailedOpen(Decisions, PermitGuard, Option<Box<Reservation>>),
    /// Refused.
    Rejected(Rejection),
}

pub(crate) type OutcomeFuture = Pin<Box<dyn Future<Output = Outcome> + Send>>;

/// A layer's settings but its rules and refusals: what every decision of
/// the layer is made with.
#[derive(Clone)]
pub(crate) struct Settings<St> {
    pub(crate) stats: Arc<Stats>,
    pub(crate) store: St,
    pub(crate) mode: Mode,
    pub(crate) failure: FailurePolicy,
    pub(crate) timeout: Option<Duration>,
    pub(crate) near_limit: f64,
    /// The seed of the key hashes in the layer's logs, drawn when the
    /// layer is made.
    pub(crate) recorder: Recorder,
}

/// Decides `limits`, known at once, in place when they are one enforced
/// limit, the layer's mode refuses without waiting, and its store decides
/// without waiting (the common case: no future, no heap allocation but the
/// decisions'); else gives the future [`decide`] makes, with a clone of
/// `settings`, made only then.
pub(crate) fn decide_at_once<St>(
    settings: &Settings<St>,
    limits: &mut Limits,
) -> Result<Outcome, OutcomeFuture>
where
    St: Store + Clone,
{
    let Settings {
        ref store,
        mode,
        near_limit,
        ref recorder,
        ..
    } = *settings;
    if !matches!(mode, Mode::Reject) {
        return Err(decide(settings.clone(), ready(std::mem::take(limits))));
    }
    let limit = match limits.take_single() {
        Some(limit) if !limit.policy().is_shadow() => limit,
        Some(limit) => return Err(decide(settings.clone(), ready(Limits::from(limit)))),
        None => return Err(decide(settings.clone(), ready(std::mem::take(limits)))),
    };
    if let Some(error) = unsettleable(store, std::slice::from_ref(&limit)) {
        return Ok(refuse_unsettleable(&settings.stats, error));
    }
    // How long a reservation is held counts from before the store's answer.
    let asked = limit.settlement().map(|_| Instant::now());
    let timer = metrics::StoreCall::start();
    let Some(answer) = store.check_at_once(Check::new(
        limit.key().as_bytes(),
        limit.policy(),
        limit.cost(),
    )) else {
        return Err(decide(settings.clone(), ready(Limits::from(limit))));
    };
    timer.finish(answer.is_ok());
    let decision = match answer {
        Ok(decision) => decision,
        Err(error) => {
            return Ok(failed(
                settings,
                Instant::now(),
                &[limit],
                error,
                (&[], Vec::new()),
                PermitGuard::default(),
            ));
        }
    };
    if let Some(asked) = asked {
        // Settled after the response: the request holds a reservation,
        // which takes the layer's settings.
        return Ok(allowed_or_refused(settings, asked, &[limit], &[decision]));
    }
    // No settlement: the limit's decision has no estimate.
    let (policy, key, _) = limit.into_parts();
    if !decision.is_allowed() {
        metrics::record_decision(
            recorder,
            &policy,
            key.as_bytes(),
            &decision,
            false,
            near_limit,
        );
        let decisions = Decisions::one(PolicyDecision::new(policy, decision));
        return Ok(Outcome::Rejected(Rejection::Limited(decisions)));
    }
    let mut permits = PermitGuard::default();
    if let Some(permit) = decision.permit() {
        permits.hold(store, &key, &policy, permit);
    }
    metrics::record_decision(
        recorder,
        &policy,
        key.as_bytes(),
        &decision,
        true,
        near_limit,
    );
    Ok(Outcome::Allowed(
        Decisions::one(PolicyDecision::new(policy, decision)),
        permits,
        None,
    ))
}

/// The outcome of `decisions`, of the enforced `limits` of a request
/// without shadow policies, decided in reject mode (asked of the store at
/// `asked`): allowed, with its permits and its reservation, or refused; the
/// decisions recorded.
fn allowed_or_refused<St: Store + Clone>(
    settings: &Settings<St>,
    asked: Instant,
    limits: &[Limit],
    decisions: &[Decision],
) -> Outcome {
    let allowed = decisions.iter().all(Decision::is_allowed);
    record_decisions(settings, limits, decisions, allowed);
    let merged = Decisions::new(decided(limits, decisions.iter().cloned()));
    if !allowed {
        return Outcome::Rejected(Rejection::Limited(merged));
    }
    let permits = hold_permits(&settings.store, limits, decisions);
    let reservation = reserve(settings, asked, &[], limits, decisions, (&[], &[]), &merged);
    Outcome::Allowed(merged, permits, reservation)
}

/// Records the decisions of `limits`, of a request `allowed` or not.
#[inline]
fn record_decisions<St>(
    settings: &Settings<St>,
    limits: &[Limit],
    decisions: &[Decision],
    allowed: bool,
) {
    for (limit, decision) in limits.iter().zip(decisions) {
        metrics::record_decision(
            &settings.recorder,
            limit.policy(),
            limit.key().as_bytes(),
            decision,
            allowed,
            settings.near_limit,
        );
    }
}

/// Records `error`, the store's answer for `limits`.
#[inline]
fn record_errors<St>(settings: &Settings<St>, limits: &[Limit], error: &StoreError) {
    for limit in limits {
        metrics::record_error(
            &settings.recorder,
            limit.policy(),
            limit.key().as_bytes(),
            error,
        );
    }
}

/// The decisions of `limits`, each with its policy (and its estimate when
/// it settles after the response).
#[inline]
fn decided(limits: &[Limit], decisions: impl IntoIterator<Item = Decision>) -> Vec<PolicyDecision> {
    limits
        .iter()
        .zip(decisions)
        .map(|(limit, decision)| limit.decided(decision))
        .collect()
}

/// The permits of `decisions`, which allowed `limits`, held.
#[inline]
fn hold_permits<St: Store + Clone>(
    store: &St,
    limits: &[Limit],
    decisions: &[Decision],
) -> PermitGuard {
    let mut permits = PermitGuard::default();
    for (limit, decision) in limits.iter().zip(decisions) {
        if let Some(permit) = decision.permit() {
            permits.hold(store, limit.key(), limit.policy(), permit);
        }
    }
    permits
}

/// The error of a limit among `limits` that settles after the response
/// under a policy that cannot (a concurrency limit from a rule provider:
/// static rules refuse it when built), or that `store` cannot settle.
fn unsettleable<St: Store>(store: &St, limits: &[Limit]) -> Option<SettleError> {
    limits
        .iter()
        .filter(|l| l.settlement().is_some())
        .find_map(|l| SettleError::check_in(store, l.policy()).err())
}

/// The refusal of a request with a limit that cannot settle: a
/// configuration mistake, refused whatever the failure policy (`500`),
/// logged and counted.
fn refuse_unsettleable(stats: &Stats, error: SettleError) -> Outcome {
    stats.record_refused_on_error();
    tracing::error!(
        error = %error,
        "a limit settles after the response where it cannot be settled; the request \
         is refused"
    );
    let (SettleError::Unsupported { policy, algorithm }
    | SettleError::StoreUnsupported { policy, algorithm }) = error;
    Outcome::Rejected(Rejection::Internal(Arc::new(StoreError::Unsupported {
        policy,
        algorithm,
        operation: "settle",
    })))
}

/// The reservation of a request allowed with `decisions` (the merged ones,
/// see [`merge`]): the enforced `limits` that settle, as `limit_decisions`
/// decided them, and the shadow ones when `shadow_decisions` allowed them
/// all (a group denied as a whole consumed nothing), all asked of the store
/// no later than `asked`. `None` when no limit settles, the common case.
fn reserve<St: Store + Clone>(
    settings: &Settings<St>,
    asked: Instant,
    order: &[bool],
    limits: &[Limit],
    limit_decisions: &[Decision],
    (shadow, shadow_decisions): (&[Limit], &[PolicyDecision]),
    decisions: &Decisions,
) -> Option<Box<Reservation>> {
    if limits
        .iter()
        .chain(shadow)
        .all(|l| l.settlement().is_none())
    {
        return None;
    }
    let shadow_allowed =
        !shadow_decisions.is_empty() && shadow_decisions.iter().all(|d| d.decision().is_allowed());
    let shadow_present = if shadow_allowed {
        shadow_decisions.len()
    } else {
        0
    };
    let (enforced_at, shadow_at) = positions(order, limit_decisions.len(), shadow_decisions.len());
    let enforced = limits
        .iter()
        .zip(limit_decisions)
        .zip(enforced_at)
        .map(|((limit, decision), at)| (limit, decision.clone(), at));
    let shadows = shadow
        .iter()
        .zip(shadow_decisions.iter().take(shadow_present))
        .zip(shadow_at)
        .map(|((limit, entry), at)| (limit, entry.decision().clone(), at));
    let reserved = enforced
        .chain(shadows)
        .filter_map(|(limit, decision, position)| {
            let settlement = limit.settlement()?.clone();
            Some(Reserved {
                position,
                policy: limit.policy().clone(),
                key: limit.key().clone(),
                estimate: limit.cost(),
                decision,
                settlement,
            })
        })
        .collect();
    let settlements: Vec<_> = limits
        .iter()
        .chain(shadow)
        .filter_map(Limit::settlement)
        .collect();
    Reservation::new(settings, asked, decisions.clone(), reserved, &settlements)
}

/// Where the decisions of the enforced and of the shadow limits are among
/// the merged ones (see [`merge`]), for `enforced` and `shadow` decisions
/// (0 for a group the store could not decide).
fn positions(order: &[bool], enforced: usize, shadow: usize) -> (Vec<usize>, Vec<usize>) {
    if shadow == 0 {
        return ((0..enforced).collect(), Vec::new());
    }
    if enforced == 0 {
        return (Vec::new(), (0..shadow).collect());
    }
    let mut at = (Vec::new(), Vec::new());
    for (i, &is_shadow) in order.iter().enumerate() {
        if is_shadow {
            at.1.push(i);
        } else {
            at.0.push(i);
        }
    }
    at
}

pub(crate) fn decide<St, F>(settings: Settings<St>, limits: F) -> OutcomeFuture
where
    St: Store + Clone,
    F: Future<Output = Limits> + Send + 'static,
{
    Box::pin(async move {
        let limits = limits.await;
        if limits.is_no_peer_address() {
            metrics::record_missed(limits.missed_rules());
            if settings.stats.record_no_peer() {
                tracing::error!(
                    "rate limiting needs the client's address, and the server gives none: \
                     requests are refused with 500 until it does (axum: serve \
                     `app.into_make_service_with_connect_info::<SocketAddr>()`; \
                     hyper: insert a `PeerAddr` extension); logged once per layer"
                );
            }
            return Outcome::Rejected(Rejection::NoPeerAddress);
        }
        if limits.is_reject() {
            metrics::record_missed(limits.missed_rules());
            settings.stats.record_missing_rejected();
            return Outcome::Rejected(Rejection::MissingKey);
        }
        if !limits.missed_rules().is_empty() {
            metrics::record_missed(limits.missed_rules());
            if settings.stats.record_missing_allowed() {
                tracing::warn!(
                    policy = limits.missed_rules()[0].policy.name(),
                    "a request had no rate-limit key and passed that rule unlimited \
                     (MissingKey::Allow); such requests are counted in Stats and metrics \
                     and logged at debug; logged once per layer"
                );
            }
        }
        if limits.is_empty() {
            return Outcome::Unlimited;
        }
        let limits = limits.into_vec();
        if let Some(error) = unsettleable(&settings.store, &limits) {
            return refuse_unsettleable(&settings.stats, error);
        }
        decide_limits(settings, limits).await
    })
}

/// Decides the enforced limits (all or nothing, with waiting in wait mode)
/// and, at the same time, the shadow ones (all or nothing among themselves,
/// once, never refusing).
async fn decide_limits<St: Store + Clone>(settings: Settings<St>, limits: Vec<Limit>) -> Outcome {
    let started = tokio::time::Instant::now();
    // Which limits were shadow, in order, to give the decisions back in the
    // order of the limits (empty, and no allocation, without shadow limits).
    let (order, shadow, enforced): (Vec<bool>, Vec<Limit>, Vec<Limit>) =
        if limits.iter().any(|l| l.policy().is_shadow()) {
            let order = limits.iter().map(|l| l.policy().is_shadow()).collect();
            let (shadow, enforced) = limits.into_iter().partition(|l| l.policy().is_shadow());
            (order, shadow, enforced)
        } else {
            (Vec::new(), Vec::new(), limits)
        };
    // Two groups, asked together: in one all-or-nothing check a shadow
    // denial would stop the enforced limits from consuming, and an enforced
    // denial would hide what the shadow policies decide.
    let (first, (shadow_decisions, shadow_permits)) = tokio::join!(
        ask_holding(&settings, &enforced),
        decide_shadow(&settings, &shadow)
    );
    let mut first = Some(first);
    let mut attempts: u32 = 0;
    // When the enforced limits were last asked of the store (no later).
    let mut asked = started;
    loop {
        let (answer, permits) = match first.take() {
            Some(answer) => answer,
            None => {
                asked = Instant::now();
                ask_holding(&settings, &enforced).await
            }
        };
        let decisions = match answer {
            Ok(decisions) => decisions,
            Err(error) => {
                return failed(
                    &settings,
                    started,
                    &enforced,
                    error,
                    (&shadow, shadow_decisions),
                    shadow_permits,
                );
            }
        };
        let allowed = decisions.iter().all(Decision::is_allowed);
        record_decisions(&settings, &enforced, &decisions, allowed);
        let mut permits = permits;
        // Only enforced policies make a request wait: a shadow leaky bucket's
        // slot or a shadow denial never delays it.
        let delay = decisions
            .iter()
            .map(Decision::delay)
            .max()
            .unwrap_or_default();
        let retry = retry_wait(&enforced, &decisions, attempts);
        attempts = attempts.saturating_add(1);
        let merged = || {
            let enforced = decided(&enforced, decisions.iter().cloned());
            merge(&order, enforced, shadow_decisions.clone())
        };
        // Allowed: the request holds `permits` and what settles after the
        // response reserved.
        let allow = |permits| {
            let merged = merged();
            let reservation = reserve(
                &settings,
                started,
                &order,
                &enforced,
                &decisions,
                (&shadow, &shadow_decisions),
                &merged,
            );
            Outcome::Allowed(merged, permits, reservation)
        };
        match settings.mode {
            Mode::Reject if allowed => {
                permits.absorb(shadow_permits);
                return allow(permits);
            }
            Mode::Reject => return Outcome::Rejected(Rejection::Limited(merged())),
            Mode::Wait { max_delay } if allowed => {
                // A leaky bucket reserved a slot for this request: wait for it,
                // unless it lies beyond the wait allowed. Refused then, or
                // dropped while it waits, the request gives back every limit
                // it took (see `Taken`); its concurrency permits are released
                // as `permits` drops.
                if started.elapsed() + delay > max_delay {
                    Taken::new(&settings.store, asked, &enforced, &decisions)
                        .give_back()
                        .await;
                    return Outcome::Rejected(Rejection::Limited(merged()));
                }
                permits.absorb(shadow_permits);
                if !delay.is_zero() {
                    let taken = Taken::new(&settings.store, asked, &enforced, &decisions);
                    tokio::time::sleep(delay).await;
                    taken.keep();
                }
                return allow(permits);
            }
            Mode::Wait { max_delay } => {
                let (retry, firm) = retry;
                let left = max_delay.saturating_sub(started.elapsed());
                // A window or a bucket that frees the cost only after the
                // wait allowed: refused now. A semaphore may free a slot at
                // any moment: looked at until the wait ends.
                if firm > left || left.is_zero() {
                    return Outcome::Rejected(Rejection::Limited(merged()));
                }
                let wait = (retry + jitter(retry)).min(left);
                // Shadow policies were decided once, on the first attempt;
                // asking them again would count one request twice.
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// What a request allowed in wait mode took, to give back if it is refused
/// after all (its leaky bucket slot lies beyond the wait allowed) or dropped
/// while it waits: denied requests consume nothing, in wait mode too.
///
/// Each limit is given back as a settlement to nothing that says how long
/// it was held ([`Settle::held_for`]), so the store gives back only what
/// the limit still holds: a window that ended, or a refill that paid the
/// units back, leaves the units of later requests alone (a sliding window
/// counter's next window holds only theirs). A store that cannot settle
/// the policy is refunded ([`Store::refund`]) as many units
/// ([`Policy::refundable`]). A give-back the store cannot make is logged
/// and the consumption stays, which errs towards denying.
struct Taken<St: Store> {
    store: St,
    /// When the limits were asked of the store (no later: a longer hold
    /// gives back less).
    asked: Instant,
    /// Each limit taken and its decision.
    limits: Vec<(Policy, Key, u64, Decision)>,
}

impl<St: Store + Clone> Taken<St> {
    fn new(store: &St, asked: Instant, enforced: &[Limit], decisions: &[Decision]) -> Self {
        let limits = enforced
            .iter()
            .zip(decisions)
            .filter(|(limit, _)| limit.cost() > 0)
            .map(|(limit, decision)| {
                let (policy, key) = (limit.policy().clone(), limit.key().clone());
                (policy, key, limit.cost(), decision.clone())
            })
            .collect();
        Taken {
            store: store.clone(),
            asked,
            limits,
        }
    }

    /// The request keeps what it took.
    fn keep(mut self) {
        self.limits.clear();
    }

    /// Gives back every limit taken, and waits for the store.
    async fn give_back(mut self) {
        let refunds = self.refunds();
        for (policy, refund) in refunds {
            log_refund(&policy, refund.await);
        }
    }
}

impl<St: Store> Taken<St> {
    /// The give-backs still worth making (none once called).
    fn refunds(&mut self) -> Vec<(Policy, RefundFuture)> {
        let held = self.asked.elapsed();
        std::mem::take(&mut self.limits)
            .into_iter()
            .filter_map(|(policy, key, cost, decision)| {
                let give_back: RefundFuture = if self.store.supports_settlement(&policy) {
                    let settle = Settle::new(key.as_bytes(), &policy, cost, 0, &decision);
                    let settled = self
                        .store
                        .settle(SettlementId::random(), &[settle.held_for(held)]);
                    Box::pin(async move { settled.await.map(drop) })
                } else {
                    match policy.refundable(cost, &decision, held) {
                        0 => return None,
                        units => self.store.refund(key.as_bytes(), &policy, units, &decision),
                    }
                };
                Some((policy, give_back))
            })
            .collect()
    }
}

impl<St: Store> Drop for Taken<St> {
    /// Dropped while still holding limits: the request future was dropped
    /// mid-wait. The give-backs run at once when the store answers without
    /// waiting (in memory), else on the current tokio runtime; without one
    /// the consumption stays.
    fn drop(&mut self) {
        for (policy, mut refund) in self.refunds() {
            let mut cx = Context::from_waker(Waker::noop());
            if let Poll::Ready(result) = refund.as_mut().poll(&mut cx) {
                log_refund(&policy, result);
            } else if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(async move { log_refund(&policy, refund.await) });
            }
        }
    }
}

fn log_refund(policy: &Policy, result: Result<(), StoreError>) {
    if let Err(error) = result {
        tracing::debug!(
            error = %error,
            policy = policy.name(),
            "rate-limit store did not give back what a request refused in wait mode \
             took; the consumption stays, which errs towards denying"
        );
    }
}

/// The outcome of a store error for the enforced limits: a cost that can
/// never pass, an error that is not an outage (refused whatever the failure
/// policy), or an outage (the failure policy decides; failing open, the
/// shadow policies' decisions, permits and reservations, asked no later
/// than `started`, go with the request).
fn failed<St: Store + Clone>(
    settings: &Settings<St>,
    started: Instant,
    enforced: &[Limit],
    error: StoreError,
    (shadow, shadow_decisions): (&[Limit], Vec<PolicyDecision>),
    shadow_permits: PermitGuard,
) -> Outcome {
    if let StoreError::CostExceedsLimit { policy, cost, max } = error {
        return Outcome::Rejected(Rejection::CostTooHigh { policy, cost, max });
    }
    record_errors(settings, enforced, &error);
    if !error.is_outage() {
        // Not an outage: a configuration mistake, a bug, or a store that
        // refuses (full). No failure policy lifts the limit.
        settings.stats.record_refused_on_error();
        tracing::error!(
            error = %error,
            kind = error.kind(),
            "rate-limit store answered with an error that is not an outage; \
             the request is refused whatever the failure policy"
        );
        let error = Arc::new(error);
        return Outcome::Rejected(if matches!(*error, StoreError::Full { .. }) {
            Rejection::Unavailable(error)
        } else {
            Rejection::Internal(error)
        });
    }
    let allowed = settings.failure.allows(&error);
    settings.stats.record(allowed);
    tracing::warn!(
        error = %error,
        allowed,
        "rate-limit store could not decide; the failure policy {}",
        if allowed { "lets the request through" } else { "refuses it" }
    );
    if allowed {
        let decisions = Decisions::new(shadow_decisions);
        let reservation = reserve(
            settings,
            started,
            &[],
            enforced,
            &[],
            (shadow, decisions.as_slice()),
            &decisions,
        );
        Outcome::FailedOpen(decisions, shadow_permits, reservation)
    } else {
        Outcome::Rejected(Rejection::Unavailable(Arc::new(error)))
    }
}

/// Decides the shadow policies of a request (all or nothing among
/// themselves) and holds their permits; a failure is logged and counted,
/// and leaves the request alone.
async fn decide_shadow<St: Store + Clone>(
    settings: &Settings<St>,
    limits: &[Limit],
) -> (Vec<PolicyDecision>, PermitGuard) {
    if limits.is_empty() {
        return (Vec::new(), PermitGuard::default());
    }
    match ask(settings, limits).await {
        Ok(decisions) => {
            let allowed = decisions.iter().all(Decision::is_allowed);
            record_decisions(settings, limits, &decisions, allowed);
            let permits = if allowed {
                hold_permits(&settings.store, limits, &decisions)
            } else {
                PermitGuard::default()
            };
            (decided(limits, decisions), permits)
        }
        Err(error) => {
            record_errors(settings, limits, &error);
            if error.is_outage() {
                tracing::warn!(
                    error = %error,
                    "rate-limit store could not decide the shadow policies; the request is not affected"
                );
            } else {
                tracing::error!(
                    error = %error,
                    kind = error.kind(),
                    "rate-limit store answered the shadow policies with an error that is not an \
                     outage; the request is not affected"
                );
            }
            (Vec::new(), PermitGuard::default())
        }
    }
}

/// The decisions of both groups in the order of the request's limits
/// (`order` says which were shadow). A group the store could not decide is
/// empty and left out.
fn merge(order: &[bool], enforced: Vec<PolicyDecision>, shadow: Vec<PolicyDecision>) -> Decisions {
    if shadow.is_empty() {
        return Decisions::new(enforced);
    }
    if enforced.is_empty() {
        return Decisions::new(shadow);
    }
    let (mut enforced, mut shadow) = (enforced.into_iter(), shadow.into_iter());
    Decisions::new(
        order
            .iter()
            .filter_map(|&is_shadow| {
                if is_shadow {
                    shadow.next()
                } else {
                    enforced.next()
                }
            })
            .collect(),
    )
}

/// One store call for `limits` (none when there are none), timed.
/// [`ask`], with the permits of an allowed answer held as soon as it
/// arrives: a request dropped while something else it waits for is still
/// running (its shadow policies) releases them, never leaks them.
async fn ask_holding<St: Store + Clone>(
    settings: &Settings<St>,
    limits: &[Limit],
) -> (Result<Vec<Decision>, StoreError>, PermitGuard) {
    let answer = ask(settings, limits).await;
    let permits = match &answer {
        Ok(decisions) if decisions.iter().all(Decision::is_allowed) => {
            hold_permits(&settings.store, limits, decisions)
        }
        _ => PermitGuard::default(),
    };
    (answer, permits)
}

async fn ask<St: Store>(
    settings: &Settings<St>,
    limits: &[Limit],
) -> Result<Vec<Decision>, StoreError> {
    if limits.is_empty() {
        return Ok(Vec::new());
    }
    let timer = metrics::StoreCall::start();
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
    let answer = match settings.timeout {
        Some(timeout) => tokio::time::timeout(timeout, call)
            .await
            .unwrap_or(Err(StoreError::Timeout(timeout))),
        None => call.await,
    };
    timer.finish(answer.is_ok());
    answer
}

/// The first look again at a full semaphore in wait mode.
const FIRST_SEMAPHORE_LOOK: Duration = Duration::from_millis(10);

/// The longest pause between two looks at a full semaphore in wait mode.
const LONGEST_SEMAPHORE_LOOK: Duration = Duration::from_millis(250);

/// How long a request denied with `decisions` (of `limits`, on its
/// `attempts`-th denial, from 0) waits before it asks again, and the least
/// it must wait whatever happens meanwhile (the longest `retry_after` of a
/// limit other than a semaphore).
///
/// A window or a bucket frees capacity at a time the store knows: its
/// `retry_after`. A semaphore frees a slot when a lease ends, or sooner,
/// when a holder releases its permit, which no store announces (across
/// instances it would take a notification channel in Redis): a request
/// denied by a concurrency limit looks again after 10 ms, then twice as
/// long each time, up to 250 ms, but never later than the lease's end. So
/// it passes soon after a release, and a full semaphore costs a waiting
/// request at most four store calls a second once it has waited a while.
fn retry_wait(limits: &[Limit], decisions: &[Decision], attempts: u32) -> (Duration, Duration) {
    let look = FIRST_SEMAPHORE_LOOK
        .saturating_mul(1 << attempts.min(5))
        .min(LONGEST_SEMAPHORE_LOOK);
    let (mut wait, mut firm) = (Duration::ZERO, Duration::ZERO);
    for (limit, decision) in limits.iter().zip(decisions) {
        let Some(retry) = decision.retry_after() else {
            continue;
        };
        if let Algorithm::Concurrency(_) = limit.policy().algorithm() {
            wait = wait.max(retry.min(look));
        } else {
            wait = wait.max(retry);
            firm = firm.max(retry);
        }
    }
    (wait, firm)
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
