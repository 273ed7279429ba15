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

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bb8_redis::RedisConnectionManager;

use super::backend_error;
use super::scripts::AclProbe;
use crate::StoreError;

/// A connection taken from the pool, back in it when dropped.
pub(super) type Pooled = bb8::PooledConnection<'static, RedisConnectionManager>;

/// The pool, and how far the ACL probe has followed its new connections.
pub(super) struct Bb8 {
    pool: bb8::Pool<RedisConnectionManager>,
    probe: AclProbe,
    /// The pool's `connections_created` when the probe last passed (0 after
    /// a replacement, so the next call probes).
    probed: Arc<AtomicU64>,
    /// The pool's `max_size`.
    size: usize,
}

impl Bb8 {
    pub(super) fn new(pool: bb8::Pool<RedisConnectionManager>, probe: AclProbe) -> Self {
        let size = usize::try_from(pool.config().max_size.max(1)).unwrap_or(1);
        Bb8 {
            pool,
            probe,
            probed: Arc::default(),
            size,
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
        let mut pooled = self.pool.get_owned().await.map_err(|e| match e {
            bb8::RunError::User(e) => backend_error(e),
            bb8::RunError::TimedOut => StoreError::Unavailable(
                "the bb8 pool gave no Redis connection within its connection_timeout".into(),
            ),
        })?;
        let created = self.pool.state().statistics.connections_created;
        if created > self.probed.load(Ordering::Acquire) {
            self.probe.run(&mut *pooled).await.map_err(backend_error)?;
            self.probed.fetch_max(created, Ordering::AcqRel);
        }
        Ok(pooled)
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
                *pooled = fresh;
                probed.store(0, Ordering::Release);
            }
            drop(pooled);
        });
    }
}
