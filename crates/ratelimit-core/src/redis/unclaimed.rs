//! Concurrency permits a check took in Redis but never handed to its caller.
//!
//! A check's script may run although its caller never sees the reply: the
//! reply timed out, the connection dropped after the command was sent, or
//! the caller dropped the future while the call was in flight (a client that
//! went away). Its permit would then stay held for its whole lease. So every
//! check that generates permits holds an [`Unclaimed`] guard until its
//! decision reaches the caller; a guard dropped before that releases the
//! permits in a task spawned on the current tokio runtime, and so does a
//! guard whose decision was a denial (see [`Unclaimed::hand_over`]). Releasing
//! an id that was never taken is harmless (`release.lua` finds nothing).
//!
//! The release must not run before the check it undoes, or it would find
//! nothing and the permit would be taken after it. Redis runs the commands
//! of one connection in order, so on a single node the release is sent on
//! the connection the check was sent on ([`SentOn`]); only once that
//! connection is broken (so the check either ran or never will) does it go
//! through the pool. A cluster routes each key to its node's connection.
//!
//! Bounded: a release is retried (backing off from the call timeout up to
//! one second) only while the store is unreachable and the lease has not
//! ended (after it, the permit expired anyway), and at most
//! [`MAX_PENDING_RELEASES`] releases are under way per store; past that,
//! permits are left to their lease, as is a guard dropped outside a tokio
//! runtime.

use std::sync::atomic::Ordering;
use std::time::Duration;

use parking_lot::Mutex;
use redis::RedisError;

use super::connections::Link;
use super::{RedisStore, breaks_connection};
use crate::{Decision, PermitId, Policy, StoreError};

/// The most releases of unclaimed permits under way at once, per store.
pub(super) const MAX_PENDING_RELEASES: usize = 1024;

/// The longest pause between two attempts of one release.
const MAX_PAUSE: Duration = Duration::from_secs(1);

/// Which connection a command goes on (single node; a cluster routes itself).
#[derive(Clone, Copy)]
pub(super) enum Via<'a> {
    /// Any pooled connection.
    Pool,
    /// A pooled connection, recorded in the [`SentOn`].
    Record(&'a SentOn),
    /// This connection, so the command runs after those sent on it before.
    On(&'a Link),
}

/// The connection a check was last sent on.
#[derive(Default)]
pub(super) struct SentOn(Mutex<Option<Link>>);

impl SentOn {
    pub(super) fn record(&self, connection: &Link) {
        *self.0.lock() = Some(connection.clone());
    }

    /// Records in `other` the connection recorded here, if any.
    pub(super) fn copy_to(&self, other: &SentOn) {
        if let Some(connection) = self.0.lock().clone() {
            other.record(&connection);
        }
    }

    fn take(&self) -> Option<Link> {
        self.0.lock().take()
    }
}

/// The permits of a check in flight; released when dropped unclaimed.
pub(super) struct Unclaimed {
    store: RedisStore,
    permits: Vec<(String, PermitId)>,
    lease: Duration,
    sent_on: SentOn,
    claimed: bool,
}

impl Unclaimed {
    /// Guards `permits` (state key, id) of policies whose longest lease is
    /// `policy`'s.
    pub(super) fn new(
        store: RedisStore,
        permits: Vec<(String, PermitId)>,
        policy: &Policy,
    ) -> Self {
        Unclaimed {
            store,
            permits,
            lease: policy.window(),
            sent_on: SentOn::default(),
            claimed: false,
        }
    }

    /// Where the check records the connection it was sent on.
    pub(super) fn sent_on(&self) -> &SentOn {
        &self.sent_on
    }

    /// Nothing to release: the caller has the permits, or the check was
    /// never sent.
    pub(super) fn claim(&mut self) {
        self.claimed = true;
    }

    /// The caller has the `decisions`: when all allow, the permits are its
    /// own to release. A denial hands over none, yet a permit may be held:
    /// the check's first run took it and its reply was lost, and the run
    /// sent again was denied (another limit of the request denies now, or
    /// an admin block). Those ids are released when the guard drops
    /// (harmlessly, when nothing holds them).
    pub(super) fn hand_over(&mut self, decisions: &[Decision]) {
        if crate::store::all_allowed(decisions) {
            self.claim();
        }
    }
}

impl Drop for Unclaimed {
    fn drop(&mut self) {
        if self.claimed || self.permits.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let pending = &self.store.inner.pending_releases;
        if pending.fetch_add(1, Ordering::AcqRel) >= MAX_PENDING_RELEASES {
            pending.fetch_sub(1, Ordering::AcqRel);
            return;
        }
        let pending = Pending(self.store.clone());
        let permits = std::mem::take(&mut self.permits);
        let connection = self.sent_on.take();
        let lease = self.lease;
        runtime.spawn(async move {
            release(&pending.0, permits, connection, lease).await;
            drop(pending);
        });
    }
}

/// One release under way, counted until it ends (or its task is dropped).
struct Pending(RedisStore);

impl Drop for Pending {
    fn drop(&mut self) {
        self.0.inner.pending_releases.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Releases `permits`, on `connection` while it works, retrying while the
/// store is unreachable and `lease` has not passed.
async fn release(
    store: &RedisStore,
    mut permits: Vec<(String, PermitId)>,
    mut connection: Option<Link>,
    lease: Duration,
) {
    let deadline = tokio::time::Instant::now() + lease;
    let mut pause = store
        .inner
        .call_timeout
        .clamp(Duration::from_millis(10), MAX_PAUSE);
    loop {
        let mut failed = Vec::new();
        for (key, permit) in permits {
            let via = connection.as_ref().map_or(Via::Pool, Via::On);
            let mut result = store.release_via(&key, permit, via).await;
            if connection.is_some() && result.as_ref().is_err_and(broken) {
                // The check ran before the connection broke, or never will:
                // through the pool from now on, and at once (a connection
                // that broke says nothing of the store; in a storm of
                // closed connections, releases that waited out a pause
                // each filled the store's quota of releases under way,
                // and the permits of checks cancelled meanwhile were left
                // to their lease).
                connection = None;
                result = store.release_via(&key, permit, Via::Pool).await;
            }
            match result {
                Err(e) if e.is_outage() => {
                    if broken(&e) {
                        connection = None;
                    }
                    failed.push((key, permit));
                }
                // Released, or an error no retry mends: the lease ends it.
                _ => {}
            }
        }
        if failed.is_empty() || tokio::time::Instant::now() + pause >= deadline {
            return;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_PAUSE);
        permits = failed;
    }
}

/// Whether `e` says the connection it was sent on is gone.
fn broken(e: &StoreError) -> bool {
    match e {
        StoreError::Unavailable(source) => source
            .downcast_ref::<RedisError>()
            .is_some_and(|e| breaks_connection(e) && !e.is_timeout()),
        _ => false,
    }
}
