//! Concurrency permits held for the life of a response.

use std::fmt;
use std::future::Future;
use std::task::{Context, Waker};

use ratelimit_core::{PermitId, Policy, Store};

use crate::key::Key;

/// Prepares the release of a permit once its id is known.
pub(crate) type Releaser = Box<dyn FnOnce(PermitId) -> PermitGuard + Send + Sync>;

/// A releaser for `policy` if it is a concurrency policy.
pub(crate) fn releaser<St: Store + Clone>(
    store: &St,
    key: &Key,
    policy: &Policy,
) -> Option<Releaser> {
    if !matches!(
        policy.algorithm(),
        ratelimit_core::Algorithm::Concurrency(_)
    ) {
        return None;
    }
    let (store, key, policy) = (store.clone(), key.clone(), policy.clone());
    Some(Box::new(move |permit| PermitGuard {
        release: Some(Box::new(move || {
            drive(store.release(key.as_bytes(), &policy, permit));
        })),
    }))
}

/// Releases a concurrency permit when dropped: when the response body has been
/// sent or dropped, or when the request was cancelled before that.
pub struct PermitGuard {
    release: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl fmt::Debug for PermitGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PermitGuard")
            .field("held", &self.release.is_some())
            .finish()
    }
}

impl Drop for PermitGuard {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            release();
        }
    }
}

/// Runs a release: at once if it completes without waiting (the in-memory
/// store), else on the current tokio runtime. Without a runtime the permit
/// is reclaimed when its lease expires.
fn drive<F>(future: F)
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
