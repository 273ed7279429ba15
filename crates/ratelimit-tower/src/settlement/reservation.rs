//! [`Reservation`]: what a request reserved under rules that settle after
//! the response, and its settlement: read when the response head arrives,
//! sent to the store in one call for every limit, or given back when the
//! request ends without a head.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::HeaderName;
use http::response::Parts;
use ratelimit_core::{Decision, Policy, Settle, SettleFuture, SettlementId, Store, StoreError};
use tokio::time::Instant;

use super::reading::Reading;
use super::spec::Settlement;
use crate::decide::Settings;
use crate::decisions::{Decisions, PolicyDecision};
use crate::keys::Key;
use crate::metrics::{self, Recorder};
use crate::options::Stats;
use crate::permit::drive;

/// A store, as a reservation needs it: to settle.
trait Settler: Send + Sync + 'static {
    fn settle(&self, id: SettlementId, settles: &[Settle<'_>]) -> SettleFuture;
}

impl<St: Store> Settler for St {
    fn settle(&self, id: SettlementId, settles: &[Settle<'_>]) -> SettleFuture {
        Store::settle(self, id, settles)
    }
}

/// One limit a request reserved an estimate of, to settle.
#[derive(Debug)]
pub(crate) struct Reserved {
    /// Its place among the request's decisions.
    pub(crate) position: usize,
    pub(crate) policy: Policy,
    pub(crate) key: Key,
    /// What it reserved (the rule's cost).
    pub(crate) estimate: u64,
    /// The reservation's decision (allowed).
    pub(crate) decision: Decision,
    pub(crate) settlement: Settlement,
}

/// The settlement future: the store's decisions, or `None` when it failed
/// (logged and counted there).
type Settling = Pin<Box<dyn Future<Output = Option<Vec<Decision>>> + Send>>;

enum Phase {
    /// Reserved; the response head has not arrived.
    Reserved,
    /// The store is settling.
    Settling(Settling),
    /// Nothing left to do.
    Done,
}

/// What an allowed request reserved under rules that settle after the
/// response, held by its response future. Dropped before the response head
/// arrived (the request was cancelled, or its service failed), it gives the
/// reservation back as its rules say; dropped while the store settles, the
/// settlement goes on without it.
pub(crate) struct Reservation {
    store: Box<dyn Settler>,
    stats: Arc<Stats>,
    recorder: Recorder,
    timeout: Option<Duration>,
    /// When the reservation was asked of the store (no later): what a
    /// settlement below it gives back depends on how long it was held.
    asked: Instant,
    decisions: Decisions,
    reserved: Vec<Reserved>,
    /// The cost headers to remove from the response.
    strip: Vec<HeaderName>,
    /// Which of `reserved` the store is settling, in the order it answers.
    sent: Vec<usize>,
    phase: Phase,
}

impl std::fmt::Debug for Reservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservation")
            .field("reserved", &self.reserved)
            .field("strip", &self.strip)
            .finish_non_exhaustive()
    }
}

impl Reservation {
    /// The reservation of `reserved` (limits among `decisions`, the
    /// request's), asked of the layer's store at `asked`; `settlements`: every settlement of the
    /// request's limits, reserved or not (a limit the store could not
    /// decide), whose cost headers leave with no response. `None` when there
    /// is nothing to do.
    pub(crate) fn new<St: Store + Clone>(
        settings: &Settings<St>,
        asked: Instant,
        decisions: Decisions,
        reserved: Vec<Reserved>,
        settlements: &[&Settlement],
    ) -> Option<Box<Reservation>> {
        let mut strip: Vec<HeaderName> = Vec::new();
        for name in settlements.iter().filter_map(|s| s.strips()) {
            if !strip.contains(name) {
                strip.push(name.clone());
            }
        }
        if reserved.is_empty() && strip.is_empty() {
            return None;
        }
        Some(Box::new(Reservation {
            store: Box::new(settings.store.clone()),
            stats: settings.stats.clone(),
            recorder: settings.recorder.clone(),
            timeout: settings.timeout,
            asked,
            decisions,
            reserved,
            strip,
            sent: Vec::new(),
            phase: Phase::Reserved,
        }))
    }

    /// The response head arrived (`None`: one the layer cannot read, not an
    /// HTTP response): reads each limit's cost from it, removes the cost
    /// headers, and starts the settlement.
    pub(crate) fn inspect(&mut self, parts: Option<&mut Parts>) {
        let readings: Vec<Reading> = match parts {
            Some(parts) => {
                let readings = self.reserved.iter().map(|r| read(r, parts)).collect();
                for name in &self.strip {
                    parts.headers.remove(name);
                }
                readings
            }
            None => vec![Reading::Missing; self.reserved.len()],
        };
        for (reserved, reading) in self.reserved.iter().zip(&readings) {
            self.report(reserved, *reading);
        }
        self.start(&readings);
    }

    /// Logs a cost the response did not name, named wrongly or too large:
    /// the first of each kind of a layer at `warn`, then at `debug`.
    fn report(&self, reserved: &Reserved, reading: Reading) {
        let (first, what) = match reading {
            Reading::Missing => (
                self.stats.record_cost_missing(),
                "named no cost; the estimate stays (1 for an estimate of 0)",
            ),
            Reading::Invalid => (
                self.stats.record_cost_invalid(),
                "named a cost that is not a whole number (or sent its header twice); \
                 the estimate stays (1 for an estimate of 0)",
            ),
            Reading::Clamped(_) => (
                self.stats.record_cost_clamped(),
                "named a cost above twice the policy's limit; charged as twice the limit",
            ),
            Reading::Cost(_) | Reading::Refunded | Reading::Cancelled { .. } => return,
        };
        let header = reserved.settlement.header().map(HeaderName::as_str);
        if first {
            tracing::warn!(
                policy = reserved.policy.name(),
                header,
                estimate = reserved.estimate,
                "a response to a request reserved under a settling rule {what}; \
                 such responses are counted in Stats and metrics and logged at debug; \
                 logged once per layer"
            );
        } else {
            tracing::debug!(
                policy = reserved.policy.name(),
                header,
                estimate = reserved.estimate,
                "a response to a request reserved under a settling rule {what}"
            );
        }
    }

    /// Settles each limit as `readings` say, in one store call for those
    /// whose cost differs from their estimate; the others are recorded now.
    fn start(&mut self, readings: &[Reading]) {
        let mut settles = Vec::new();
        let mut labels = Vec::new();
        let held = self.asked.elapsed();
        self.sent.clear();
        for (i, (reserved, reading)) in self.reserved.iter().zip(readings).enumerate() {
            let actual = reading.actual(reserved.estimate);
            if actual == reserved.estimate {
                metrics::record_settlement(
                    &self.recorder,
                    &reserved.policy,
                    reserved.key.as_bytes(),
                    reading.outcome(),
                );
                continue;
            }
            self.sent.push(i);
            settles.push(
                Settle::new(
                    reserved.key.as_bytes(),
                    &reserved.policy,
                    reserved.estimate,
                    actual,
                    &reserved.decision,
                )
                .held_for(held),
            );
            labels.push((
                reserved.policy.clone(),
                reserved.key.clone(),
                reading.outcome(),
            ));
        }
        if settles.is_empty() {
            self.phase = Phase::Done;
            return;
        }
        let future = self.store.settle(SettlementId::random(), &settles);
        self.phase = Phase::Settling(Box::pin(finish(
            future,
            self.timeout,
            self.stats.clone(),
            self.recorder.clone(),
            labels,
        )));
    }

    /// The request's decisions once settled: what each settled limit
    /// reports after its settlement (the others as they were decided, and
    /// all as they were decided when the store failed).
    pub(crate) fn poll_settled(&mut self, cx: &mut Context<'_>) -> Poll<Decisions> {
        let Phase::Settling(future) = &mut self.phase else {
            return Poll::Ready(self.decisions.clone());
        };
        let settled = ready!(future.as_mut().poll(cx));
        self.phase = Phase::Done;
        let Some(settled) = settled else {
            return Poll::Ready(self.decisions.clone());
        };
        let mut entries: Vec<PolicyDecision> = self.decisions.iter().cloned().collect();
        for (&i, decision) in self.sent.iter().zip(settled) {
            if let Some(entry) = entries.get_mut(self.reserved[i].position) {
                *entry = entry.clone().with_decision(decision);
            }
        }
        Poll::Ready(Decisions::new(entries))
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        match std::mem::replace(&mut self.phase, Phase::Done) {
            Phase::Done => {}
            // The response future was dropped while the store settled: the
            // response head had arrived, so the settlement stands.
            Phase::Settling(future) => drive(future),
            // No response head: cancelled, or the service failed.
            Phase::Reserved => {
                let readings: Vec<Reading> = self
                    .reserved
                    .iter()
                    .map(|r| Reading::Cancelled {
                        refund: r.settlement.refunds_on_cancel(),
                    })
                    .collect();
                self.start(&readings);
                if let Phase::Settling(future) = std::mem::replace(&mut self.phase, Phase::Done) {
                    drive(future);
                }
            }
        }
    }
}

/// What `reserved` is settled to, for the response whose head is `parts`.
fn read(reserved: &Reserved, parts: &Parts) -> Reading {
    if reserved.settlement.is_failure(parts) {
        return Reading::Refunded;
    }
    match reserved.settlement.cost_in(parts) {
        Some(Ok(cost)) => Reading::of(cost, &reserved.policy),
        Some(Err(())) => Reading::Invalid,
        None => Reading::Missing,
    }
}

/// Waits for the store's settlement (within `timeout`), and records it:
/// each limit under its outcome, or, when the store failed, logged (an
/// outage at `warn`, any other error at `error`) and counted.
async fn finish(
    future: SettleFuture,
    timeout: Option<Duration>,
    stats: Arc<Stats>,
    recorder: Recorder,
    labels: Vec<(Policy, Key, &'static str)>,
) -> Option<Vec<Decision>> {
    let timer = metrics::StoreCall::start();
    // Without a runtime (a reservation dropped outside one) there is no
    // timer to wait on; the store's own timeout still applies.
    let answer = match timeout {
        Some(timeout) if tokio::runtime::Handle::try_current().is_ok() => {
            tokio::time::timeout(timeout, future)
                .await
                .unwrap_or(Err(StoreError::Timeout(timeout)))
        }
        _ => future.await,
    };
    let answer = answer.and_then(|decisions| {
        if decisions.len() == labels.len() {
            Ok(decisions)
        } else {
            Err(StoreError::Backend(
                "the store settled another number of limits than it was given".into(),
            ))
        }
    });
    timer.finish(answer.is_ok());
    match answer {
        Ok(decisions) => {
            for (policy, key, outcome) in &labels {
                metrics::record_settlement(&recorder, policy, key.as_bytes(), outcome);
            }
            Some(decisions)
        }
        Err(error) => {
            stats.record_settle_failed();
            let outcome = if error.is_outage() {
                "error"
            } else {
                "invalid"
            };
            for (policy, key, _) in &labels {
                metrics::record_settlement(&recorder, policy, key.as_bytes(), outcome);
            }
            if error.is_outage() {
                tracing::warn!(
                    error = %error,
                    "rate-limit store could not settle a request that already ran; \
                     its reservations stay as they were taken"
                );
            } else {
                tracing::error!(
                    error = %error,
                    kind = error.kind(),
                    "rate-limit store answered a settlement with an error that is not an \
                     outage; the request already ran, and its reservations stay as they \
                     were taken"
                );
            }
            None
        }
    }
}
