//! Costs known only once the work is done: a [`Reservation`] of an
//! estimate, settled to the actual cost.

use std::fmt;

use axum_core::response::{IntoResponseParts, ResponseParts};
use ratelimit_core::{Decision, Policy, Settle, SettlementId, Store, StoreError};
use ratelimit_tower::PermitGuard;
use ratelimit_tower::headers::RateLimitHeaders;
use tokio::time::Instant;

use crate::limiter::{Granted, decisions_of};

/// An estimate reserved by [`Limiter::reserve`](crate::Limiter::reserve),
/// consumed already, to be settled once the work's actual cost is known.
///
/// - [`settle`](Self::settle) brings the key to the actual cost: one above
///   the estimate is charged even past the limit (a debt, which the key's
///   next requests wait out), one below gives the difference back, never
///   beyond a full budget nor beyond what the reservation still holds
///   (nothing once the window it was counted in ended; see
///   [`Settle`](ratelimit_core::Settle)).
/// - [`refund`](Self::refund) gives the whole estimate back (the work did
///   not happen).
/// - Dropping it keeps the estimate as the cost: nothing more to do, no
///   call to the store (with an estimate of 0, nothing is charged: settle
///   it once the cost is known).
///
/// Each reservation carries its own [`SettlementId`]: the store applies its
/// settlement once however often it is sent while it remembers the id (the
/// newest settlements of a key, see
/// [`Store::settle`](ratelimit_core::Store::settle)), so a settlement that
/// failed (see [`SettleFailed`]) can be sent again, soon.
///
/// Added to a response, it sends the reservation's rate-limit headers (a
/// settled one's are in the [`Granted`] that [`settle`](Self::settle)
/// returns).
pub struct Reservation<St> {
    store: St,
    policy: Policy,
    key: Vec<u8>,
    estimate: u64,
    /// The reservation's decision; `None` when the store failed and the
    /// limiter's failure policy let the request through (nothing consumed).
    decision: Option<Decision>,
    /// When the reservation was asked of the store (no later): what a
    /// settlement below it gives back depends on how long it was held.
    asked: Instant,
    headers: RateLimitHeaders,
    id: SettlementId,
}

impl<St> fmt::Debug for Reservation<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The key is left out: it may be a secret (an API key).
        f.debug_struct("Reservation")
            .field("policy", &self.policy.name())
            .field("estimate", &self.estimate)
            .field("decision", &self.decision)
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl<St: Store> Reservation<St> {
    pub(crate) fn new(
        store: St,
        policy: Policy,
        key: Vec<u8>,
        estimate: u64,
        (decision, asked): (Option<Decision>, Instant),
        headers: RateLimitHeaders,
    ) -> Self {
        Reservation {
            store,
            policy,
            key,
            estimate,
            decision,
            asked,
            headers,
            id: SettlementId::random(),
        }
    }

    /// The estimate reserved.
    pub fn estimate(&self) -> u64 {
        self.estimate
    }

    /// The reservation's decision, unless the store failed and the
    /// limiter failed open.
    pub fn decision(&self) -> Option<&Decision> {
        self.decision.as_ref()
    }

    /// The id its settlement carries.
    pub fn id(&self) -> SettlementId {
        self.id
    }

    /// Settles the reservation to `actual`, the work's actual cost, and
    /// answers the key's state afterwards as a [`Granted`], whose headers
    /// a response sends (a key left in debt reports nothing remaining).
    ///
    /// Nothing is asked of the store when there is nothing to settle: a
    /// cost equal to the estimate, a reservation the limiter let through
    /// while the store was down (nothing was consumed), or a shadow
    /// policy's denial (nothing was consumed either). Those answer the
    /// reservation's own headers.
    ///
    /// When the store fails, the reservation stays consumed at the
    /// estimate and comes back in the error, to be settled again at once
    /// (with the same `actual`: whatever part of it the store had made is
    /// not made twice, while the store remembers it) or sent as it stands. A failure that is not an outage is a
    /// mistake to fix, and is logged.
    pub async fn settle(self, actual: u64) -> Result<Granted, SettleFailed<St>> {
        let Some(decision) = self.decision.as_ref() else {
            return Ok(self.into_granted());
        };
        if actual == self.estimate || !decision.is_allowed() {
            return Ok(self.into_granted());
        }
        let settles = [
            Settle::new(&self.key, &self.policy, self.estimate, actual, decision)
                .held_for(self.asked.elapsed()),
        ];
        match self.store.settle(self.id, &settles).await {
            Ok(mut decisions) => {
                let settled = decisions
                    .pop()
                    .ok_or_else(|| StoreError::Backend("a settlement answered no decision".into()));
                match settled {
                    Ok(settled) => {
                        tracing::debug!(
                            policy = self.policy.name(),
                            reserved = self.estimate,
                            actual,
                            remaining = settled.remaining(),
                            allowed = settled.is_allowed(),
                            "rate-limit settlement"
                        );
                        Ok(Granted {
                            decisions: Some(decisions_of(&self.policy, settled)),
                            headers: self.headers,
                            _permit: PermitGuard::default(),
                        })
                    }
                    Err(error) => Err(self.failed(error)),
                }
            }
            Err(error) => Err(self.failed(error)),
        }
    }

    /// Gives the whole estimate back: the work did not happen. A
    /// settlement to 0, with what [`settle`](Self::settle) says of
    /// failures.
    pub async fn refund(self) -> Result<(), SettleFailed<St>> {
        self.settle(0).await.map(drop)
    }

    /// The headers of the reservation as it was decided.
    fn into_granted(self) -> Granted {
        Granted {
            decisions: self.decision.map(|d| decisions_of(&self.policy, d)),
            headers: self.headers,
            _permit: PermitGuard::default(),
        }
    }

    fn failed(self, error: StoreError) -> SettleFailed<St> {
        if error.is_outage() {
            tracing::warn!(
                policy = self.policy.name(),
                error = %error,
                "rate-limit store could not settle; the reservation stays at its estimate"
            );
        } else {
            tracing::error!(
                policy = self.policy.name(),
                error = %error,
                kind = error.kind(),
                "rate-limit store refused a settlement; the reservation stays at its estimate"
            );
        }
        SettleFailed {
            error,
            reservation: self,
        }
    }
}

impl<St: Store> IntoResponseParts for Reservation<St> {
    type Error = std::convert::Infallible;

    fn into_response_parts(self, res: ResponseParts) -> Result<ResponseParts, Self::Error> {
        self.into_granted().into_response_parts(res)
    }
}

/// A settlement the store did not make ([`Reservation::settle`]): why, and
/// the reservation, still consumed at its estimate, to settle again or to
/// send as it stands.
pub struct SettleFailed<St> {
    error: StoreError,
    reservation: Reservation<St>,
}

impl<St> SettleFailed<St> {
    /// Why the store did not settle.
    pub fn error(&self) -> &StoreError {
        &self.error
    }

    /// The reservation, to [`settle`](Reservation::settle) again or to add
    /// to the response as it stands.
    pub fn into_reservation(self) -> Reservation<St> {
        self.reservation
    }
}

impl<St> fmt::Debug for SettleFailed<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SettleFailed")
            .field("error", &self.error)
            .field("reservation", &self.reservation)
            .finish()
    }
}

impl<St> fmt::Display for SettleFailed<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the reservation could not be settled: {}", self.error)
    }
}

impl<St> std::error::Error for SettleFailed<St> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ratelimit_core::clock::ManualClock;
    use ratelimit_core::{MemoryStore, Policy};

    use crate::Limiter;

    /// Moves the store's clock and tokio's (which times how long a
    /// reservation was held) on by `micros`.
    async fn advance(clock: &ManualClock, micros: u64) {
        clock.advance(Duration::from_micros(micros));
        tokio::time::advance(Duration::from_micros(micros)).await;
    }

    /// Admits requests of 1 on `key` until the first denial (at most 100).
    async fn fill(limiter: &Limiter<MemoryStore<ManualClock>>, key: &[u8]) -> u64 {
        let mut n = 0;
        while n < 100 && limiter.check(key, 1).await.is_ok() {
            n += 1;
        }
        n
    }

    /// A sliding window counter (10 a second): a reservation of 5 made at
    /// 0.9 s and refunded at 1.000002 s, after 5 more requests of its key
    /// in the new window, gives nothing back (its units are in the previous
    /// window's count, and a refund from the current one would free the
    /// later requests' units in the window after): at 2 s the key admits
    /// 5, as a key that never reserved does, not 9.
    #[tokio::test(start_paused = true)]
    async fn a_counter_reservation_refunded_after_its_window_frees_no_later_units() {
        // A whole second of Unix time, where the store's windows start.
        const T0: u64 = 1_763_000_000_000_000;
        let clock = ManualClock::new(T0 + 900_000);
        let policy = Policy::sliding_window_counter(10, Duration::from_secs(1))
            .and_then(|policy| policy.with_name("counter"))
            .expect("policy");
        let store = MemoryStore::builder().clock(clock.clone()).build();
        let limiter = Limiter::new(store, policy);
        let reservation = limiter
            .reserve(&b"refunder"[..], 5)
            .await
            .expect("reserved");
        advance(&clock, 100_001).await;
        for _ in 0..5 {
            assert!(limiter.check(&b"refunder"[..], 1).await.is_ok());
            assert!(limiter.check(&b"honest"[..], 1).await.is_ok());
        }
        advance(&clock, 1).await;
        reservation.refund().await.expect("refunded");
        advance(&clock, 999_998).await;
        let admitted = (
            fill(&limiter, b"refunder").await,
            fill(&limiter, b"honest").await,
        );
        assert_eq!(admitted, (5, 5), "admitted in the window after the refund");
    }
}
