//! The sync of one instance: a task per peer running a round of pushes
//! every `sync` (`round.rs`), and a task reading back what its region's
//! Redis holds of each peer, for the status, logs and metrics.
//!
//! A peer is heard, and counted at what it sent, only while its freshest
//! mark is within the staleness; a round that fails, or that cannot finish
//! within the staleness (a backlog too long for the link), marks nothing,
//! and the peer's decisions count this region at its conservative share.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::{Script, Value};
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};

use super::peer::{
    Peer, Seen, Timing, arrived_key, bad_reply, heard_key, micros, number, outbox_keys, text,
};
use super::round::Pusher;
use crate::StoreError;
use crate::clock::Clock;

/// The time constant of the rates behind the overshoot estimate.
const RATE_SMOOTHING: Duration = Duration::from_secs(1);

/// What a [`MultiRegionStore`](super::MultiRegionStore) reports of one peer.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PeerStatus {
    /// The peer region's name.
    pub region: String,
    /// Whether decisions count the peer at its conservative share: never
    /// marked, marked longer than the staleness ago, or its clock off by
    /// more than the skew allowed.
    pub stale: bool,
    /// The observed lag: how long before the last status read the peer's
    /// freshest mark was taken (everything the peer admitted before then
    /// had landed here); `None` when never.
    pub last_heard: Option<Duration>,
    /// Whether the peer's clock is off by more than the skew allowed.
    pub skewed: bool,
    /// Bounds of the peer's clock minus this region's, in µs, from the
    /// peer's last mark; `None` before the first.
    pub skew: Option<(i64, i64)>,
    /// Entries of this region's outbox not yet delivered to the peer.
    pub backlog: u64,
    /// Whether this instance's last round of pushes to the peer succeeded.
    pub reachable: bool,
}

/// The state the store and its sync tasks share.
pub(super) struct Shared {
    region: String,
    prefix: String,
    local: ConnectionManager,
    pub(super) peers: Vec<Peer>,
    pub(super) timing: Timing,
    pusher: Pusher,
    heard: Script,
}

impl Shared {
    pub(super) fn new(
        region: String,
        prefix: String,
        local: ConnectionManager,
        peers: Vec<Peer>,
        timing: Timing,
        fixed_clock: Option<Arc<dyn Clock>>,
        round: usize,
    ) -> Self {
        Shared {
            pusher: Pusher::new(
                region.clone(),
                prefix.clone(),
                local.clone(),
                timing,
                fixed_clock,
                round,
            ),
            region,
            prefix,
            local,
            peers,
            timing,
            heard: Script::new(include_str!("lua/heard.lua")),
        }
    }

    /// Starts one push task per peer and the status task, on the current
    /// runtime. They hold the shared state, not the store: the store aborts
    /// them when its last clone drops.
    pub(super) fn start(self: &Arc<Self>) -> Vec<JoinHandle<()>> {
        let mut tasks = Vec::with_capacity(self.peers.len() + 1);
        for index in 0..self.peers.len() {
            tasks.push(self.every_sync(move |shared| async move {
                let _ = shared.push(index).await;
            }));
        }
        tasks.push(self.every_sync(|shared| async move {
            let _ = shared.refresh().await;
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
            let mut interval = tokio::time::interval(shared.timing.sync);
            interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
            loop {
                interval.tick().await;
                tick(Arc::clone(&shared)).await;
            }
        })
    }

    /// Per policy, the units the peers admitted that this region had not
    /// heard of yet, as of the last status read: each peer's rate under the
    /// policy (over the last sync interval) times its lag, capped at the
    /// staleness (beyond it the peer is counted at its share instead).
    pub(super) fn overshoot(&self) -> std::collections::BTreeMap<String, f64> {
        let cap = self.timing.staleness.as_secs_f64();
        let mut estimate = std::collections::BTreeMap::new();
        for peer in &self.peers {
            let seen = peer.seen.lock();
            let lag = seen.lag.map_or(cap, |lag| lag.as_secs_f64().min(cap));
            for (policy, rate) in &seen.rates {
                *estimate.entry(policy.clone()).or_insert(0.0) += rate * lag;
            }
        }
        estimate
    }

    pub(super) fn status(&self) -> Vec<PeerStatus> {
        self.peers
            .iter()
            .map(|p| {
                let seen = p.seen.lock();
                PeerStatus {
                    region: p.name.clone(),
                    stale: seen.conservative,
                    last_heard: seen.lag,
                    skewed: seen.skewed,
                    skew: seen.skew,
                    backlog: seen.backlog,
                    reachable: p.reachable.load(Ordering::Relaxed),
                }
            })
            .collect()
    }

    /// One round of pushes to peer `index`, with its logs and metrics.
    pub(super) async fn push(self: &Arc<Self>, index: usize) -> Result<(), StoreError> {
        let peer = &self.peers[index];
        let result = self.pusher.round(peer).await;
        let reachable = result.is_ok();
        if peer.reachable.swap(reachable, Ordering::Relaxed) != reachable {
            if reachable {
                tracing::info!(region = %self.region, peer = %peer.name, "multi-region: peer reachable again");
            } else if let Err(e) = &result {
                tracing::warn!(region = %self.region, peer = %peer.name, error = %e, "multi-region: cannot push to peer");
            }
        }
        #[cfg(feature = "metrics")]
        if !reachable {
            ::metrics::counter!(
                crate::metrics::REGION_PUSH_FAILURES,
                "region" => self.region.clone(),
                "peer" => peer.name.clone()
            )
            .increment(1);
        }
        result
    }

    /// Reads what this region's Redis holds of each peer (`heard.lua`):
    /// updates the status, logs changes, and records the lag, skew and
    /// overshoot estimate.
    pub(super) async fn refresh(&self) -> Result<(), StoreError> {
        let keys = outbox_keys(&self.prefix);
        let mut invocation = self.heard.prepare_invoke();
        invocation.key(&keys[0]).key(&keys[3]);
        for peer in &self.peers {
            invocation.key(heard_key(&self.prefix, &peer.name));
        }
        for peer in &self.peers {
            invocation.key(arrived_key(&self.prefix, &peer.name));
            invocation.arg(&peer.name);
        }
        let reply =
            super::peer::invoke_local(&self.local, &invocation, self.timing.push_timeout).await?;
        let bad = || bad_reply("heard.lua", &reply);
        let Value::Array(items) = &reply else {
            return Err(bad());
        };
        let Some((now, rest)) = items.split_first() else {
            return Err(bad());
        };
        let now = number(now).ok_or_else(bad)?;
        if rest.len() != self.peers.len() * 6 {
            return Err(bad());
        }
        let read_at = Instant::now();
        let staleness = micros(self.timing.staleness);
        for (peer, fields) in self.peers.iter().zip(rest.chunks_exact(6)) {
            let at = text(&fields[0]).and_then(|t| t.parse::<i64>().ok());
            let lag = at
                .and_then(|at| u64::try_from(at).ok())
                .map(|at| Duration::from_micros(now.saturating_sub(at)));
            let skewed = number(&fields[1]) == Some(1);
            let skew = match (
                text(&fields[2]).and_then(|t| t.parse::<i64>().ok()),
                text(&fields[3]).and_then(|t| t.parse::<i64>().ok()),
            ) {
                (Some(lo), Some(hi)) => Some((lo, hi)),
                _ => None,
            };
            let backlog = number(&fields[4]).unwrap_or(0);
            let arrived: HashMap<String, u64> = match &fields[5] {
                Value::Array(pairs) => pairs
                    .chunks_exact(2)
                    .filter_map(|pair| Some((text(&pair[0])?, number(&pair[1])?)))
                    .collect(),
                _ => HashMap::new(),
            };
            let conservative = lag.is_none_or(|lag| micros(lag) > staleness) || skewed;
            let mut seen = peer.seen.lock();
            if seen.conservative != conservative {
                if conservative {
                    tracing::warn!(region = %self.region, peer = %peer.name, lag = ?lag, skewed, "multi-region: peer counted at its conservative share");
                } else {
                    tracing::info!(region = %self.region, peer = %peer.name, lag = ?lag, "multi-region: peer heard again");
                }
                #[cfg(feature = "metrics")]
                if conservative {
                    ::metrics::counter!(
                        crate::metrics::REGION_STALE_TRANSITIONS,
                        "region" => self.region.clone(),
                        "peer" => peer.name.clone()
                    )
                    .increment(1);
                }
            }
            if skewed && !seen.skewed {
                tracing::warn!(region = %self.region, peer = %peer.name, skew_micros = ?skew, max_skew = ?self.timing.max_skew, "multi-region: peer's clock is off by more than allowed");
            }
            let rates: HashMap<String, f64> = match seen.read_at {
                Some(before) if read_at > before => {
                    let seconds = (read_at - before).as_secs_f64();
                    // Smoothed over about a second: a sync interval is too
                    // short to tell a rate.
                    let keep = (-seconds / RATE_SMOOTHING.as_secs_f64()).exp();
                    let mut rates: HashMap<String, f64> = seen
                        .rates
                        .iter()
                        .map(|(policy, rate)| (policy.clone(), rate * keep))
                        .collect();
                    for (policy, &units) in &arrived {
                        let was = seen.arrived.get(policy).copied().unwrap_or(0);
                        // A counter that went back expired: count from 0.
                        let new = if units >= was { units - was } else { units };
                        *rates.entry(policy.clone()).or_default() +=
                            (1.0 - keep) * new as f64 / seconds;
                    }
                    rates.retain(|_, rate| *rate > 1e-9);
                    rates
                }
                _ => HashMap::new(),
            };
            #[cfg(feature = "metrics")]
            {
                let lag_seconds = lag.map_or(f64::INFINITY, |lag| lag.as_secs_f64());
                ::metrics::gauge!(
                    crate::metrics::REGION_PEER_LAG,
                    "region" => self.region.clone(),
                    "peer" => peer.name.clone()
                )
                .set(lag_seconds);
                if let Some((lo, hi)) = skew {
                    ::metrics::gauge!(
                        crate::metrics::REGION_PEER_SKEW,
                        "region" => self.region.clone(),
                        "peer" => peer.name.clone()
                    )
                    .set((lo as f64 + hi as f64) / 2e6);
                }
            }
            *seen = Seen {
                conservative,
                lag,
                skewed,
                skew,
                backlog,
                arrived,
                read_at: Some(read_at),
                rates,
            };
        }
        #[cfg(feature = "metrics")]
        for (policy, units) in self.overshoot() {
            ::metrics::gauge!(
                crate::metrics::REGION_OVERSHOOT,
                "region" => self.region.clone(),
                "policy" => policy
            )
            .set(units);
        }
        Ok(())
    }
}
