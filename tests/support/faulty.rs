//! A store that fails on purpose: a `MemoryStore` (or any store) whose
//! calls fail with the error a test chooses, or answer only after the time
//! it chooses, to test what the layer, the wrappers and the `Limiter` do
//! with store errors and slow stores.

use std::future::{Future, ready};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ratelimit_core::{Check, Decision, MemoryStore, PermitId, Policy, Store, StoreError};

/// A call a [`Faulty`] store is asked to make.
#[derive(Debug, Clone, Copy)]
pub enum Call<'a> {
    /// `check` under this policy.
    Check(&'a Policy),
    /// `check_all` of these checks.
    CheckAll(&'a [Check<'a>]),
    /// `release` under this policy.
    Release(&'a Policy),
    /// `renew` under this policy.
    Renew(&'a Policy),
}

impl Call<'_> {
    /// Whether this call decides (`check`, `check_all`), not releases or
    /// renews a permit.
    pub fn decides(&self) -> bool {
        matches!(self, Call::Check(_) | Call::CheckAll(_))
    }

    /// Whether a policy of this call is named `name`.
    pub fn names(&self, name: &str) -> bool {
        match self {
            Call::Check(policy) | Call::Release(policy) | Call::Renew(policy) => {
                policy.name() == name
            }
            Call::CheckAll(checks) => checks.iter().any(|c| c.policy.name() == name),
        }
    }
}

/// What a [`Faulty`] store answers a call with instead of its inner
/// store's answer, if anything.
type Fault = dyn Fn(&Call<'_>) -> Option<StoreError> + Send + Sync;

/// How long a [`Faulty`] store holds a call before it answers, if at all.
type Delay = dyn Fn(&Call<'_>) -> Option<Duration> + Send + Sync;

/// A future of a [`Faulty`] store.
type Answer<T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send>>;

/// The error of a store that cannot be reached.
pub fn refused() -> StoreError {
    StoreError::Unavailable("connection refused".into())
}

/// A copy of `e`, same variant and text (`StoreError` is not `Clone`).
///
/// # Panics
///
/// On a variant this function does not know.
pub fn copy_error(e: &StoreError) -> StoreError {
    match e {
        StoreError::CostExceedsLimit { policy, cost, max } => StoreError::CostExceedsLimit {
            policy: policy.clone(),
            cost: *cost,
            max: *max,
        },
        StoreError::Full { max_keys } => StoreError::Full {
            max_keys: *max_keys,
        },
        StoreError::PolicyConflict { policy } => StoreError::PolicyConflict {
            policy: policy.clone(),
        },
        StoreError::Unsupported {
            policy,
            algorithm,
            operation,
        } => StoreError::Unsupported {
            policy: policy.clone(),
            algorithm,
            operation,
        },
        StoreError::Timeout(t) => StoreError::Timeout(*t),
        StoreError::Unavailable(e) => StoreError::Unavailable(e.to_string().into()),
        StoreError::Backend(e) => StoreError::Backend(e.to_string().into()),
        other => panic!("a variant this test does not know: {other:?}"),
    }
}

/// `inner`, except that the calls its fault names fail with that error,
/// and those its delay names answer only after that time.
#[derive(Clone)]
pub struct Faulty<St> {
    inner: St,
    fault: Arc<Fault>,
    delay: Arc<Delay>,
}

impl<St: std::fmt::Debug> std::fmt::Debug for Faulty<St> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Faulty")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<St> Faulty<St> {
    /// `inner`, failing each call for which `fault` returns an error.
    pub fn new(
        inner: St,
        fault: impl Fn(&Call<'_>) -> Option<StoreError> + Send + Sync + 'static,
    ) -> Self {
        Faulty {
            inner,
            fault: Arc::new(fault),
            delay: Arc::new(|_| None),
        }
    }

    /// `inner`, answering each call for which `delay` returns a time only
    /// once that time has passed (a slow store: a call still in flight).
    /// The call is made at once; its answer waits.
    pub fn slow(
        inner: St,
        delay: impl Fn(&Call<'_>) -> Option<Duration> + Send + Sync + 'static,
    ) -> Self {
        Faulty {
            inner,
            fault: Arc::new(|_| None),
            delay: Arc::new(delay),
        }
    }
}

impl Faulty<MemoryStore> {
    /// A store whose every call fails with a copy of `error`.
    pub fn always(error: &StoreError) -> Self {
        let error = copy_error(error);
        Faulty::new(MemoryStore::new(), move |_| Some(copy_error(&error)))
    }

    /// A store that is always down: every call is [`refused`].
    pub fn down() -> Self {
        Faulty::new(MemoryStore::new(), |_| Some(refused()))
    }

    /// A store that never answers: every call stays in flight (its answer
    /// waits longer than any test).
    pub fn hanging() -> Self {
        Faulty::slow(MemoryStore::new(), |_| Some(Duration::MAX))
    }

    /// A `MemoryStore` whose every call is [`refused`] while `down` is set.
    pub fn refused_while(down: Arc<AtomicBool>) -> Self {
        Faulty::new(MemoryStore::new(), move |_| {
            down.load(Ordering::Relaxed).then(refused)
        })
    }

    /// A `MemoryStore` whose decisions are [`refused`] while `down` is set;
    /// releases and renewals always reach it.
    pub fn decisions_refused_while(down: Arc<AtomicBool>) -> Self {
        Faulty::new(MemoryStore::new(), move |call| {
            (call.decides() && down.load(Ordering::Relaxed)).then(refused)
        })
    }
}

impl<St: Store + Clone> Faulty<St> {
    /// The fault's answer to `call`, or `inner`'s (from `answer`), after
    /// the delay's time if it names one.
    fn answer<T, F>(&self, call: Call<'_>, answer: impl FnOnce(&St) -> F) -> Answer<T>
    where
        F: Future<Output = Result<T, StoreError>> + Send + 'static,
        T: Send + 'static,
    {
        if let Some(error) = (self.fault)(&call) {
            return Box::pin(ready(Err(error)));
        }
        let answer = answer(&self.inner);
        match (self.delay)(&call) {
            Some(delay) => Box::pin(async move {
                tokio::time::sleep(delay).await;
                answer.await
            }),
            None => Box::pin(answer),
        }
    }
}

impl<St: Store + Clone> Store for Faulty<St> {
    type CheckFuture = Answer<Decision>;
    type CheckAllFuture = Answer<Vec<Decision>>;
    type ReleaseFuture = Answer<()>;
    type RenewFuture = Answer<bool>;

    fn check(&self, key: &[u8], policy: &Policy, cost: u64) -> Self::CheckFuture {
        self.answer(Call::Check(policy), |inner| inner.check(key, policy, cost))
    }

    fn check_all(&self, checks: &[Check<'_>]) -> Self::CheckAllFuture {
        self.answer(Call::CheckAll(checks), |inner| inner.check_all(checks))
    }

    fn release(&self, key: &[u8], policy: &Policy, permit: PermitId) -> Self::ReleaseFuture {
        self.answer(Call::Release(policy), |inner| {
            inner.release(key, policy, permit)
        })
    }

    fn renew(&self, key: &[u8], policy: &Policy, permit: PermitId) -> Self::RenewFuture {
        self.answer(Call::Renew(policy), |inner| {
            inner.renew(key, policy, permit)
        })
    }
}
