//! The application's own `bb8` pool of Redis connections (feature `bb8`),
//! instead of the store's few multiplexed connections.
//!
//! `bb8_redis::RedisConnectionManager` hands out multiplexed connections,
//! so everything the store does on its own connections works the same on
//! the pool's: a command holds a pooled connection while it runs (the
//! pool's `max_size` bounds the calls in flight, as the application set
//! it), and records it for the release of an unclaimed permit (see
//! `unclaimed`), which then goes on that connection outside the pool.
//!
//! The store's calls take turns at the pool, first come first served: at
//! most `max_size` of them hold or wait for one of its connections at once,
//! the others wait in a fair queue of the store's own. bb8 gives a returned
//! connection to whichever `get` polls first, not to the one that waited
//! longest, so with more calls than connections (coalescing off, many
//! requests in flight) a few calls could wait past the call timeout while
//! the rest went through, and fail as outages.
//!
//! A connection that stalled or broke is replaced in the pool, as the store
//! replaces its own: bb8 has no way to drop one connection, so the store
//! keeps it checked out while it opens a fresh one by the pool's manager
//! (`Pool::dedicated_connection`), puts the fresh one in its place, and
//! gives it back. Otherwise the next call would wait behind a stalled reply,
//! and with `test_on_check_out` off a dead connection would stay in the pool.
//!
//! The ACL probe: the store does not open the pool's connections, so it
//! cannot probe each as it opens. Every connection of one pool logs in
//! through one manager, as one user; the store probes the connection it
//! takes whenever the pool has opened connections since the last probe
//! passed (bb8's `connections_created`), and fails the call as on its own
//! connections when the probe fails.
//!
//! A pool whose manager cannot log in (a wrong password, a TLS certificate
//! refused) gives no error, only no connection: bb8 keeps retrying and its
//! `get` ends at `connection_timeout`, or at the store's call timeout,
//! either way an outage that a fail-open policy would let through. So when
//! a call finds no idle connection and the pool has fewer open than its
//! `max_size` (it is trying to open one), the store opens one itself by the
//! pool's manager, as bb8 would, while it waits (at most one at a time, and
//! at most once a second): a mistake that opening gives (see
//! `errors::is_outage`) fails that call, the calls that came while it
//! opened (they wait for what it finds, not only for a connection, and
//! open one themselves if that call is dropped before it finds out), and
//! every call that would wait for a connection in the next few seconds,
//! with that error; the next attempt that opens a connection, or meets an
//! outage, forgets it.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

use bb8_redis::RedisConnectionManager;
use parking_lot::Mutex;
use redis::RedisError;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use super::backend_error;
use super::errors::is_outage;
use super::scripts::AclProbe;
use crate::StoreError;

/// A connection taken from the pool, back in it when dropped, with the
/// call's place in the store's queue for the pool.
pub(super) struct Pooled {
    connection: bb8::PooledConnection<'static, RedisConnectionManager>,
    /// Given to the next call in the queue. After `connection`: fields drop
    /// in order, so the connection is idle in the pool before that call asks.
    _place: OwnedSemaphorePermit,
}

impl Pooled {
    /// The connection, to send a command on.
    pub(super) fn connection(&self) -> &redis::aio::MultiplexedConnection {
        &self.connection
    }
}

/// The pool, and how far the ACL probe has followed its new connections.
pub(super) struct Bb8 {
    pool: bb8::Pool<RedisConnectionManager>,
    probe: AclProbe,
    /// The pool's `connections_created` when the probe last passed (0 after
    /// a replacement, so the next call probes).
    probed: Arc<AtomicU64>,
    /// The pool's `max_size`.
    size: usize,
    /// The store's queue for the pool: `size` places, handed out in the
    /// order asked (see the module's documentation).
    queue: Arc<Semaphore>,
    /// The pool's `connection_timeout`.
    connect_timeout: Duration,
    /// What opening a connection by the pool's manager last said.
    diagnosis: Arc<Mutex<Diagnosis>>,
    /// Woken when a connection opened to learn it ends, for the calls that
    /// wait for what it says.
    learned: Arc<Notify>,
}

/// How long a mistake found opening a connection is believed without
/// opening another.
const MISTAKE_KEPT: Duration = Duration::from_secs(5);

/// The least time between two connections the store opens to learn why
/// the pool opens none.
const DIAGNOSIS_EVERY: Duration = Duration::from_secs(1);

#[derive(Default)]
struct Diagnosis {
    /// The mistake the last connection opened gave, and when.
    mistake: Option<(Instant, RedisError)>,
    /// When the last connection was opened to learn it, and whether that
    /// is still under way.
    started: Option<Instant>,
    underway: bool,
}

impl Diagnosis {
    /// Takes the turn to open a connection, if no other is under way and
    /// the last began long enough ago.
    fn begin(&mut self, now: Instant) -> bool {
        let due = self
            .started
            .is_none_or(|at| now.saturating_duration_since(at) >= DIAGNOSIS_EVERY);
        if self.underway || !due {
            return false;
        }
        self.underway = true;
        self.started = Some(now);
        true
    }

    /// The mistake found, if recent.
    fn mistake(&self, now: Instant) -> Option<RedisError> {
        self.mistake
            .as_ref()
            .filter(|(at, _)| now.saturating_duration_since(*at) < MISTAKE_KEPT)
            .map(|(_, e)| e.clone())
    }
}

/// Ends a turn at opening a connection, finished or dropped, and wakes
/// the calls waiting for what it says.
struct Turn {
    diagnosis: Arc<Mutex<Diagnosis>>,
    learned: Arc<Notify>,
    finished: bool,
}

impl Turn {
    /// Records what opening said: `Some` mistake, or `None` (it opened, or
    /// met an outage).
    fn finish(mut self, mistake: Option<RedisError>) {
        self.diagnosis.lock().mistake = mistake.map(|e| (Instant::now(), e));
        self.finished = true;
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut diagnosis = self.diagnosis.lock();
        diagnosis.underway = false;
        if !self.finished {
            // Dropped before it learned anything (its call's future was
            // dropped): the next call may open one at once.
            diagnosis.started = None;
        }
        drop(diagnosis);
        self.learned.notify_waiters();
    }
}

/// Opens a connection by `pool`'s manager within `limit`: the mistake it
/// gives, if any.
async fn diagnose(
    pool: bb8::Pool<RedisConnectionManager>,
    limit: Duration,
    turn: Turn,
) -> Option<RedisError> {
    let mistake = match tokio::time::timeout(limit, pool.dedicated_connection()).await {
        Ok(Err(e)) if !is_outage(&e) => Some(e),
        _ => None,
    };
    turn.finish(mistake.clone());
    mistake
}

impl Bb8 {
    pub(super) fn new(pool: bb8::Pool<RedisConnectionManager>, probe: AclProbe) -> Self {
        let config = pool.config();
        let size = usize::try_from(config.max_size.max(1)).unwrap_or(1);
        Bb8 {
            pool,
            probe,
            probed: Arc::default(),
            size,
            queue: Arc::new(Semaphore::new(size)),
            connect_timeout: config.connection_timeout,
            diagnosis: Arc::default(),
            learned: Arc::default(),
        }
    }

    /// The pool's `max_size`.
    pub(super) fn size(&self) -> usize {
        self.size
    }

    /// A connection of the pool, probed first if the pool opened any since
    /// the probe last passed. A pool that gives no connection is an outage
    /// (bb8's own `connection_timeout`, or the store's call timeout around
    /// this call, whichever ends first).
    pub(super) async fn checkout(&self) -> Result<Pooled, StoreError> {
        // Never closed, so never an error.
        let place = Arc::clone(&self.queue).acquire_owned().await.map_err(|_| {
            StoreError::Unavailable("the store's queue for the bb8 pool closed".into())
        })?;
        let mut get = std::pin::pin!(self.pool.get_owned());
        let got = match std::future::poll_fn(|cx| Poll::Ready(get.as_mut().poll(cx))).await {
            Poll::Ready(got) => got,
            // Boxed: waiting (and opening a connection to learn why none
            // comes) is rare, and inline it made every call's future larger.
            Poll::Pending => Box::pin(self.wait(get)).await.map_err(backend_error)?,
        };
        let mut connection = got.map_err(|e| match e {
            bb8::RunError::User(e) => backend_error(e),
            bb8::RunError::TimedOut => StoreError::Unavailable(
                "the bb8 pool gave no Redis connection within its connection_timeout".into(),
            ),
        })?;
        let created = self.pool.state().statistics.connections_created;
        if created > self.probed.load(Ordering::Acquire) {
            // Boxed, as the wait above: a probe runs once per new connection.
            Box::pin(self.probe.run(&mut *connection))
                .await
                .map_err(backend_error)?;
            self.probed.fetch_max(created, Ordering::AcqRel);
        }
        Ok(Pooled {
            connection,
            _place: place,
        })
    }

    /// Waits for `get`, which found no idle connection. When the pool is
    /// opening one, learns meanwhile whether opening fails by a mistake
    /// (see the module's documentation), and fails with it.
    async fn wait<F: Future>(&self, get: std::pin::Pin<&mut F>) -> Result<F::Output, RedisError> {
        let opening = self.pool.state().connections < u32::try_from(self.size).unwrap_or(u32::MAX);
        if !opening {
            return Ok(get.await);
        }
        let mut get = get;
        loop {
            // Listening before looking, so the end of a connection opened
            // meanwhile is not missed.
            let mut learned = std::pin::pin!(self.learned.notified());
            learned.as_mut().enable();
            let now = Instant::now();
            let (mistake, turn, underway) = {
                let mut diagnosis = self.diagnosis.lock();
                let underway = diagnosis.underway;
                let turn = diagnosis.begin(now).then(|| Turn {
                    diagnosis: Arc::clone(&self.diagnosis),
                    learned: Arc::clone(&self.learned),
                    finished: false,
                });
                (diagnosis.mistake(now), turn, underway)
            };
            return match (mistake, turn) {
                (Some(mistake), turn) => {
                    // Known: fail now, and look again in the background.
                    if let (Some(turn), Ok(runtime)) = (turn, tokio::runtime::Handle::try_current())
                    {
                        runtime.spawn(diagnose(self.pool.clone(), self.connect_timeout, turn));
                    }
                    Err(mistake)
                }
                (None, Some(turn)) => {
                    let mut learning =
                        std::pin::pin!(diagnose(self.pool.clone(), self.connect_timeout, turn));
                    let first = std::future::poll_fn(|cx| {
                        if let Poll::Ready(got) = get.as_mut().poll(cx) {
                            return Poll::Ready(Ok(got));
                        }
                        learning.as_mut().poll(cx).map(Err)
                    })
                    .await;
                    match first {
                        Ok(got) => Ok(got),
                        Err(Some(mistake)) => Err(mistake),
                        Err(None) => Ok(get.await),
                    }
                }
                // Another call is learning why: wait for what it finds, as
                // that call does, rather than for a connection that may
                // never come (and an outage a fail-open policy would let
                // through); then look again (it may have been dropped
                // before it learned anything).
                (None, None) if underway => {
                    let got = std::future::poll_fn(|cx| {
                        if let Poll::Ready(got) = get.as_mut().poll(cx) {
                            return Poll::Ready(Some(got));
                        }
                        learned.as_mut().poll(cx).map(|()| None)
                    })
                    .await;
                    match got {
                        Some(got) => Ok(got),
                        None => continue,
                    }
                }
                (None, None) => Ok(get.await),
            };
        }
    }

    /// Replaces the connection of `pooled` in the pool by a fresh one, in
    /// the background (see the module's documentation). Outside a tokio
    /// runtime, or when no fresh connection opens within bb8's
    /// `connection_timeout`, `pooled` goes back as it is.
    pub(super) fn replace(&self, mut pooled: Pooled) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let pool = self.pool.clone();
        let probed = Arc::clone(&self.probed);
        runtime.spawn(async move {
            let connect = pool.dedicated_connection();
            let limit = pool.config().connection_timeout;
            if let Ok(Ok(fresh)) = tokio::time::timeout(limit, connect).await {
                *pooled.connection = fresh;
                probed.store(0, Ordering::Release);
            }
            drop(pooled);
        });
    }
}
