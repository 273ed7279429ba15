//! The sync of one instance: its region's components pushed to every peer
//! every `sync`, and its peers' staleness read from its own Redis.
//!
//! One task per peer pushes what this instance incremented since its last
//! successful push to that peer (a failed push keeps its entries for the
//! next), so a slow or partitioned peer never delays the others. One more
//! task reads, every `sync`, when each peer last pushed into this region's
//! Redis (`heard.lua`): a peer unheard for longer than `staleness` is stale,
//! and decisions count it at its conservative share until it is heard again.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use redis::aio::ConnectionManager;
use redis::{Script, Value};
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};

use crate::StoreError;
use crate::clock::Clock;
use crate::redis::backend_error;

/// The most (key, window) entries one peer's queue holds while it cannot be
/// reached; entries whose window ended leave first, and beyond this new
/// ones are dropped (logged, and the peer counts this region as stale).
pub const MAX_PENDING: usize = 100_000;

/// The most hashes one push carries; a longer queue goes in several pushes.
const PUSH_BATCH: usize = 256;

/// `u64::MAX` in [`Peer::heard_age`]: never heard.
const NEVER: u64 = u64::MAX;

/// What this instance last saw of its own component of one key in one
/// window, to push.
#[derive(Debug, Clone, Copy)]
pub(super) struct Entry {
    window: u64,
    value: u64,
    /// When the window after the entry's ends: the entry no longer matters.
    until: Instant,
}

/// One peer region: its connection, what to push to it, and whether it is stale.
pub(super) struct Peer {
    pub(super) name: String,
    connection: ConnectionManager,
    pending: Mutex<HashMap<(String, u64), Entry>>,
    pub(super) stale: AtomicBool,
    /// Microseconds since this region's Redis last heard from the peer.
    heard_age: AtomicU64,
    reachable: AtomicBool,
    dropped: AtomicU64,
}

impl Peer {
    pub(super) fn new(name: String, connection: ConnectionManager) -> Self {
        Peer {
            name,
            connection,
            pending: Mutex::new(HashMap::new()),
            // Never heard yet: stale until the first push arrives.
            stale: AtomicBool::new(true),
            heard_age: AtomicU64::new(NEVER),
            reachable: AtomicBool::new(true),
            dropped: AtomicU64::new(0),
        }
    }

    fn queue(&self, hash: &str, start: u64, entry: Entry) {
        let mut pending = self.pending.lock();
        if let Some(known) = pending.get_mut(&(hash.to_owned(), start)) {
            known.value = known.value.max(entry.value);
            return;
        }
        if pending.len() >= MAX_PENDING {
            let now = Instant::now();
            pending.retain(|_, e| e.until > now);
            if pending.len() >= MAX_PENDING {
                if self.dropped.fetch_add(1, Ordering::Relaxed) == 0 {
                    tracing::warn!(peer = %self.name, "multi-region: push queue full, dropping counts");
                }
                return;
            }
        }
        pending.insert((hash.to_owned(), start), entry);
    }
}

/// What a [`MultiRegionStore`](super::MultiRegionStore) reports of one peer.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PeerStatus {
    /// The peer region's name.
    pub region: String,
    /// Whether decisions count the peer at its conservative share.
    pub stale: bool,
    /// How long ago this region's Redis last heard from the peer, as of the
    /// last staleness read; `None` when never.
    pub last_heard: Option<Duration>,
    /// Entries waiting to be pushed to the peer.
    pub pending: usize,
    /// Whether the last push to the peer succeeded.
    pub reachable: bool,
}

/// The state the store and its sync tasks share.
pub(super) struct Shared {
    region: String,
    prefix: String,
    local: ConnectionManager,
    pub(super) peers: Vec<Peer>,
    sync: Duration,
    staleness: Duration,
    push_timeout: Duration,
    fixed_clock: Option<Arc<dyn Clock>>,
    merge: Script,
    heard: Script,
}

impl Shared {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        region: String,
        prefix: String,
        local: ConnectionManager,
        peers: Vec<Peer>,
        sync: Duration,
        staleness: Duration,
        push_timeout: Duration,
        fixed_clock: Option<Arc<dyn Clock>>,
    ) -> Self {
        Shared {
            region,
            prefix,
            local,
            peers,
            sync,
            staleness,
            push_timeout,
            fixed_clock,
            merge: Script::new(concat!(
                include_str!("../redis/lua/numbers.lua"),
                "\n",
                include_str!("lua/merge.lua")
            )),
            heard: Script::new(include_str!("lua/heard.lua")),
        }
    }

    /// Starts one push task per peer and the staleness task, on the
    /// current runtime. They hold the shared state, not the store: the
    /// store aborts them when its last clone drops.
    pub(super) fn start(self: &Arc<Self>) -> Vec<JoinHandle<()>> {
        let mut tasks = Vec::with_capacity(self.peers.len() + 1);
        for index in 0..self.peers.len() {
            tasks.push(self.every_sync(move |shared| async move {
                let _ = shared.push(index).await;
            }));
        }
        tasks.push(self.every_sync(|shared| async move {
            let _ = shared.refresh_staleness().await;
        }));
        tasks
    }

    /// A task that runs `tick` on the shared state every sync interval
    /// (a tick that overruns delays the next one).
    fn every_sync<F, Fut>(self: &Arc<Self>, tick: F) -> JoinHandle<()>
    where
        F: Fn(Arc<Self>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send,
    {
        let shared = Arc::clone(self);
        tokio::spawn(async move {
            let mut interval = tokio::time::interval(shared.sync);
            interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
            loop {
                interval.tick().await;
                tick(Arc::clone(&shared)).await;
            }
        })
    }

    /// Remembers this region's component `value` of `hash` in the window
    /// starting at `start`, seen at `now` (µs), for every peer.
    pub(super) fn record(&self, hash: &str, start: u64, window: u64, value: u64, now: u64) {
        let left = (start + 2 * window).saturating_sub(now);
        let entry = Entry {
            window,
            value,
            until: Instant::now() + Duration::from_micros(left),
        };
        for peer in &self.peers {
            peer.queue(hash, start, entry);
        }
    }

    /// The names of the peers that are stale now.
    pub(super) fn stale_peers(&self) -> impl Iterator<Item = &str> {
        self.peers
            .iter()
            .filter(|p| p.stale.load(Ordering::Relaxed))
            .map(|p| p.name.as_str())
    }

    pub(super) fn status(&self) -> Vec<PeerStatus> {
        self.peers
            .iter()
            .map(|p| {
                let age = p.heard_age.load(Ordering::Relaxed);
                PeerStatus {
                    region: p.name.clone(),
                    stale: p.stale.load(Ordering::Relaxed),
                    last_heard: (age != NEVER).then(|| Duration::from_micros(age)),
                    pending: p.pending.lock().len(),
                    reachable: p.reachable.load(Ordering::Relaxed),
                }
            })
            .collect()
    }

    /// Pushes what is queued for peer `index` (and a heartbeat, even when
    /// nothing is). On failure the entries stay queued, merged with newer ones.
    pub(super) async fn push(&self, index: usize) -> Result<(), StoreError> {
        let peer = &self.peers[index];
        let now = Instant::now();
        let taken: Vec<((String, u64), Entry)> = {
            let mut pending = peer.pending.lock();
            pending.retain(|_, e| e.until > now);
            pending.drain().collect()
        };
        let result = self.push_entries(peer, &taken).await;
        let reachable = result.is_ok();
        if peer.reachable.swap(reachable, Ordering::Relaxed) != reachable {
            if reachable {
                tracing::info!(region = %self.region, peer = %peer.name, "multi-region: peer reachable again");
            } else if let Err(e) = &result {
                tracing::warn!(region = %self.region, peer = %peer.name, error = %e, "multi-region: cannot push to peer");
            }
        }
        if let Err(e) = result {
            #[cfg(feature = "metrics")]
            ::metrics::counter!(
                crate::metrics::REGION_PUSH_FAILURES,
                "region" => self.region.clone(),
                "peer" => peer.name.clone()
            )
            .increment(1);
            for ((hash, start), entry) in taken {
                peer.queue(&hash, start, entry);
            }
            return Err(e);
        }
        Ok(())
    }

    async fn push_entries(
        &self,
        peer: &Peer,
        entries: &[((String, u64), Entry)],
    ) -> Result<(), StoreError> {
        let heard_key = heard_key(&self.prefix, &self.region);
        // The heard key outlives staleness by far, and expires after a day
        // of silence at most.
        let heard_ttl = self
            .staleness
            .saturating_mul(10)
            .max(Duration::from_secs(60));
        let heard_ttl = heard_ttl.min(Duration::from_secs(86_400)).as_millis();
        let fixed_now = self.fixed_clock.as_ref().map_or(0, |c| c.now());
        let mut batches = entries.chunks(PUSH_BATCH).peekable();
        let empty: &[((String, u64), Entry)] = &[];
        let mut first = true;
        while let Some(batch) = batches.next().or(if first { Some(empty) } else { None }) {
            first = false;
            let mut invocation = self.merge.key(&heard_key);
            invocation
                .arg(&self.region)
                .arg(u64::try_from(heard_ttl).unwrap_or(u64::MAX))
                .arg(fixed_now);
            for ((hash, start), entry) in batch {
                invocation
                    .key(hash)
                    .arg(*start)
                    .arg(entry.window)
                    .arg(entry.value);
            }
            let mut connection = peer.connection.clone();
            tokio::time::timeout(
                self.push_timeout,
                invocation.invoke_async::<Value>(&mut connection),
            )
            .await
            .map_err(|_| StoreError::Timeout(self.push_timeout))?
            .map_err(backend_error)?;
        }
        Ok(())
    }

    /// Reads when each peer was last heard from, and marks stale the peers
    /// unheard for longer than the staleness (logging and counting changes).
    pub(super) async fn refresh_staleness(&self) -> Result<(), StoreError> {
        let mut invocation = self.heard.prepare_invoke();
        for peer in &self.peers {
            invocation.key(heard_key(&self.prefix, &peer.name));
        }
        let mut connection = self.local.clone();
        let reply = tokio::time::timeout(
            self.push_timeout,
            invocation.invoke_async::<Vec<i64>>(&mut connection),
        )
        .await
        .map_err(|_| StoreError::Timeout(self.push_timeout))?
        .map_err(backend_error)?;
        let Some((&now, heard)) = reply.split_first() else {
            return Err(StoreError::Backend("empty reply to heard.lua".into()));
        };
        let staleness = u64::try_from(self.staleness.as_micros()).unwrap_or(u64::MAX);
        for (peer, &at) in self.peers.iter().zip(heard) {
            let age = if at < 0 {
                NEVER
            } else {
                u64::try_from(now.saturating_sub(at)).unwrap_or(0)
            };
            peer.heard_age.store(age, Ordering::Relaxed);
            let stale = age > staleness;
            if peer.stale.swap(stale, Ordering::Relaxed) != stale {
                if stale {
                    tracing::warn!(region = %self.region, peer = %peer.name, "multi-region: peer stale, counted at its conservative share");
                } else {
                    tracing::info!(region = %self.region, peer = %peer.name, "multi-region: peer heard again");
                }
                #[cfg(feature = "metrics")]
                if stale {
                    ::metrics::counter!(
                        crate::metrics::REGION_STALE_TRANSITIONS,
                        "region" => self.region.clone(),
                        "peer" => peer.name.clone()
                    )
                    .increment(1);
                }
            }
            #[cfg(feature = "metrics")]
            {
                let seconds = if age == NEVER {
                    f64::INFINITY
                } else {
                    Duration::from_micros(age).as_secs_f64()
                };
                ::metrics::gauge!(
                    crate::metrics::REGION_PEER_STALENESS,
                    "region" => self.region.clone(),
                    "peer" => peer.name.clone()
                )
                .set(seconds);
            }
        }
        Ok(())
    }
}

/// `<prefix>:mr:heard:<region>`: when a Redis last heard from `region`.
pub(super) fn heard_key(prefix: &str, region: &str) -> String {
    format!("{prefix}:mr:heard:{region}")
}
