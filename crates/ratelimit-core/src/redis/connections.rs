//! A few multiplexed connections to one Redis node, shared by every call.
//!
//! A multiplexed connection pipelines the commands of concurrent callers on
//! one socket: 64 decisions in flight are 64 commands written back to back,
//! not 64 round trips waiting for a free connection. Calls are spread over
//! the connections in turn. A connection that fails with an I/O error is
//! dropped and the next call on its slot opens a new one, so a restarted or
//! failed-over Redis is used again without a health-check on every call.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisError};

use super::scripts::AclProbe;

/// A connection and the id that tells it apart from its replacements.
pub(super) type Shared = (u64, MultiplexedConnection);

pub(super) struct Connections {
    client: redis::Client,
    config: AsyncConnectionConfig,
    probe: AclProbe,
    slots: Box<[Slot]>,
    turn: AtomicUsize,
    ids: AtomicU64,
}

#[derive(Default)]
struct Slot {
    current: Mutex<Option<Shared>>,
    /// Held while connecting, so one slot opens one connection at a time.
    connecting: tokio::sync::Mutex<()>,
}

impl Connections {
    /// `size` connections (at least 1), each checked by `probe` when it opens.
    pub(super) fn new(
        client: redis::Client,
        config: AsyncConnectionConfig,
        size: u32,
        probe: AclProbe,
    ) -> Self {
        let size = usize::try_from(size.max(1)).unwrap_or(1);
        Connections {
            client,
            config,
            probe,
            slots: (0..size).map(|_| Slot::default()).collect(),
            turn: AtomicUsize::new(0),
            ids: AtomicU64::new(1),
        }
    }

    /// The number of connections kept.
    pub(super) fn size(&self) -> usize {
        self.slots.len()
    }

    /// The next slot in turn.
    pub(super) fn next_slot(&self) -> usize {
        self.turn.fetch_add(1, Ordering::Relaxed) % self.slots.len()
    }

    /// The connection of `slot`, opened now if it has none, and kept only
    /// once the ACL probe passed on it (a missing write permission fails the
    /// call, and the next call probes again). A refused connection fails at
    /// once.
    pub(super) async fn get(&self, slot: usize) -> Result<Shared, RedisError> {
        if let Some(shared) = self.current(slot) {
            return Ok(shared);
        }
        let slot = &self.slots[slot];
        // Boxed: opening a connection is a large future (about 2 KB), and
        // rare; kept inline, it made every call's future that much larger.
        Box::pin(self.open(slot)).await
    }

    /// The connection of `slot`, if it has one open.
    pub(super) fn current(&self, slot: usize) -> Option<Shared> {
        self.slots[slot].current.lock().clone()
    }

    /// Opens the connection of `slot`, unless another call did meanwhile.
    async fn open(&self, slot: &Slot) -> Result<Shared, RedisError> {
        let _connecting = slot.connecting.lock().await;
        if let Some(shared) = slot.current.lock().clone() {
            return Ok(shared);
        }
        let mut connection = self
            .client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await?;
        self.probe.run(&mut connection).await?;
        let shared = (self.ids.fetch_add(1, Ordering::Relaxed), connection);
        *slot.current.lock() = Some(shared.clone());
        Ok(shared)
    }

    /// Forgets the connection `id` of `slot` (it failed), unless it was
    /// already replaced. Calls still using it finish or fail on their own.
    pub(super) fn discard(&self, slot: usize, id: u64) {
        let mut current = self.slots[slot].current.lock();
        if current.as_ref().is_some_and(|(current, _)| *current == id) {
            *current = None;
        }
    }
}

/// Where a single-node store takes its connections: its own few multiplexed
/// connections (the default), or the application's `bb8` pool (feature
/// `bb8`, see `pool`).
pub(super) enum Node {
    Own(Box<Connections>),
    #[cfg(feature = "bb8")]
    Pool(super::pool::Bb8),
}

/// A connection taken for one command, and how to give it back.
pub(super) struct Checkout {
    /// The connection to send the command on.
    pub(super) connection: MultiplexedConnection,
    lease: Lease,
}

enum Lease {
    /// The connection of `slot`, whose id is `id`.
    Own { slot: usize, id: u64 },
    /// A connection of the pool, in use until dropped (then back in the pool).
    #[cfg(feature = "bb8")]
    Pool(super::pool::Pooled),
}

impl Node {
    /// How many connections the store uses at once: a call tries that many
    /// (plus one), and the coalescer keeps at most that many calls in flight.
    pub(super) fn size(&self) -> usize {
        match self {
            Node::Own(connections) => connections.size(),
            #[cfg(feature = "bb8")]
            Node::Pool(pool) => pool.size(),
        }
    }

    /// A connection for one command, probed if it is new (see [`AclProbe`]).
    pub(super) async fn checkout(&self) -> Result<Checkout, crate::StoreError> {
        match self {
            Node::Own(connections) => {
                let slot = connections.next_slot();
                let (id, connection) = connections.get(slot).await.map_err(super::backend_error)?;
                Ok(Checkout {
                    connection,
                    lease: Lease::Own { slot, id },
                })
            }
            #[cfg(feature = "bb8")]
            Node::Pool(pool) => {
                let pooled = pool.checkout().await?;
                Ok(Checkout {
                    connection: (*pooled).clone(),
                    lease: Lease::Pool(pooled),
                })
            }
        }
    }

    /// Gives up `checkout`, whose connection failed or stalled: the store's
    /// own connection is dropped, and replaced by the next call on its slot;
    /// a pooled one is replaced in the pool (see `pool`).
    pub(super) fn discard(&self, checkout: Checkout) {
        match (self, checkout.lease) {
            (Node::Own(connections), Lease::Own { slot, id }) => connections.discard(slot, id),
            #[cfg(feature = "bb8")]
            (Node::Pool(pool), Lease::Pool(pooled)) => pool.replace(pooled),
            #[cfg(feature = "bb8")]
            _ => {}
        }
    }
}
