//! Concurrency permits held for the life of a response.

use std::fmt;
use std::future::Future;
use std::task::{Context, Waker};
use std::time::Duration;

use ratelimit_core::{Algorithm, PermitId, Policy, Store};
use tokio::task::AbortHandle;
use tokio::time::MissedTickBehavior;

use crate::keys::Key;

type Release = Box<dyn FnOnce() + Send + Sync>;

/// Releases a request's concurrency permits when dropped: when the response
/// body has been sent or dropped, or when the request was cancelled before.
///
/// While it lives, it renews each permit's lease every third of the lease
/// (one small tokio task per permit, asleep between renewals), so a permit
/// lasts as long as its holder: a response body streaming for longer than
/// the lease (server-sent events, a download, a gRPC stream) still holds its
/// slot. Dropping the guard stops the renewals and releases. A process that
/// dies renews no more: its permits end with their leases. Outside a tokio
/// runtime there is no renewal (nor asynchronous release): the permit ends
/// with its lease, or with its release if the store releases at once.
// Not API: `ratelimit-axum`'s `Limiter` holds a handler's permits in one.
#[derive(Default)]
#[doc(hidden)]
pub struct PermitGuard {
    // Boxed, and absent while there is none: most requests hold no permit,
    // and the guard travels in every response future and body, where one
    // word (not a `Vec`'s three) is what it costs them.
    #[allow(clippy::box_collection)]
    releases: Option<Box<Vec<Release>>>,
}

impl fmt::Debug for PermitGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PermitGuard")
            .field("permits", &self.releases.as_ref().map_or(0, |r| r.len()))
            .finish()
    }
}

impl PermitGuard {
    /// Adds the permit `permit` of `key` under `policy` in `store`, renewed
    /// while this guard lives and released when it is dropped.
    pub fn hold<St: Store + Clone>(
        &mut self,
        store: &St,
        key: &Key,
        policy: &Policy,
        permit: PermitId,
    ) {
        let (store, key, policy) = (store.clone(), key.clone(), policy.clone());
        let renewals = renew_while_held(&store, &key, &policy, permit);
        let releases = self.releases.get_or_insert_with(Box::default);
        releases.push(Box::new(move || {
            // Stopped first: a renewal still in flight finds the permit
            // released and brings nothing back.
            drop(renewals);
            drive(store.release(key.as_bytes(), &policy, permit));
        }));
    }

    /// Takes over the permits of `other`.
    pub(crate) fn absorb(&mut self, mut other: PermitGuard) {
        match (&mut self.releases, other.releases.take()) {
            (Some(mine), Some(mut theirs)) => mine.append(&mut theirs),
            (mine @ None, theirs) => *mine = theirs,
            (Some(_), None) => {}
        }
    }

    /// Whether it holds no permit.
    pub fn is_empty(&self) -> bool {
        self.releases.as_ref().is_none_or(|r| r.is_empty())
    }
}

impl Drop for PermitGuard {
    // Inlined where a guard is dropped: most guards hold nothing, and their
    // drop is one test of the word, without a call.
    #[inline]
    fn drop(&mut self) {
        if let Some(releases) = self.releases.take() {
            release_all(*releases);
        }
    }
}

/// Releases each permit of a guard that held some.
#[inline(never)]
fn release_all(releases: Vec<Release>) {
    for release in releases {
        release();
    }
}

/// How often a permit leased for `lease_micros` is renewed: every third of
/// its lease, so that two renewals can fail (a slow or unreachable store)
/// before it lapses; at least every millisecond.
fn renewal_period(lease_micros: u64) -> Duration {
    Duration::from_micros(lease_micros / 3).max(Duration::from_millis(1))
}

/// The renewals of one permit, stopped when dropped.
struct Renewals(AbortHandle);

impl Drop for Renewals {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Starts renewing `permit` (a concurrency policy's) on the current tokio
/// runtime, every [`renewal_period`], until the returned handle is dropped
/// or the store answers that the permit is gone (released elsewhere, or
/// lapsed while the store could not be reached: it is never taken back).
/// `None` without a runtime, or for a policy that holds no permits.
fn renew_while_held<St: Store + Clone>(
    store: &St,
    key: &Key,
    policy: &Policy,
    permit: PermitId,
) -> Option<Renewals> {
    let Algorithm::Concurrency(concurrency) = policy.algorithm() else {
        return None;
    };
    let runtime = tokio::runtime::Handle::try_current().ok()?;
    let period = renewal_period(concurrency.lease_micros());
    let (store, key, policy) = (store.clone(), key.clone(), policy.clone());
    let task = runtime.spawn(async move {
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            match store.renew(key.as_bytes(), &policy, permit).await {
                Ok(true) => {}
                Ok(false) => {
                    tracing::warn!(
                        policy = policy.name(),
                        "a concurrency permit still in use was gone when renewed (its lease \
                         lapsed while the store could not be reached, or it was released \
                         elsewhere); its slot is no longer held"
                    );
                    return;
                }
                Err(error) => {
                    // Tried again next period; a permit lost meanwhile is
                    // reported (above) by the first renewal that gets through.
                    tracing::debug!(
                        policy = policy.name(),
                        error = %error,
                        "a concurrency permit's lease could not be renewed; retrying"
                    );
                }
            }
        }
    });
    Some(Renewals(task.abort_handle()))
}

/// Runs a release: at once if it completes without waiting (the in-memory
/// store), else on the current tokio runtime. Without a runtime the permit
/// is reclaimed when its lease expires.
pub(crate) fn drive<F>(future: F)
where
    F: Future + Send + 'static,
{
    let mut future = Box::pin(future);
    let mut cx = Context::from_waker(Waker::noop());
    if future.as_mut().poll(&mut cx).is_ready() {
        return;
    }
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        handle.spawn(async move {
            future.await;
        });
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ratelimit_core::{MemoryStore, Policy};

    use super::*;

    /// Guards built up by `hold` and `absorb` (into an empty guard and into
    /// one that holds some) release every permit once, when the last one is
    /// dropped; an empty guard holds none.
    #[test]
    fn absorbed_permits_are_released_with_the_guard() {
        let store = MemoryStore::new();
        let policy = Policy::concurrency(4, Duration::from_secs(60)).unwrap();
        let key = Key::from(b"k".to_vec());
        let take = |guard: &mut PermitGuard| {
            let decision = store.check_now(key.as_bytes(), &policy, 1).unwrap();
            guard.hold(&store, &key, &policy, decision.permit().unwrap());
        };
        let remaining = || {
            store
                .check_now(key.as_bytes(), &policy, 0)
                .unwrap()
                .remaining()
        };
        let empty = PermitGuard::default();
        assert!(empty.is_empty());
        let (mut a, mut b, mut c) = (PermitGuard::default(), empty, PermitGuard::default());
        take(&mut a);
        take(&mut b);
        take(&mut b);
        take(&mut c);
        assert!(!a.is_empty());
        assert_eq!(remaining(), 0);
        let mut all = PermitGuard::default();
        all.absorb(a);
        all.absorb(PermitGuard::default());
        all.absorb(b);
        assert_eq!(remaining(), 0, "absorbing releases nothing");
        drop(c);
        assert_eq!(remaining(), 1);
        assert_eq!(format!("{all:?}"), "PermitGuard { permits: 3 }");
        drop(all);
        assert_eq!(remaining(), 4);
    }
}
