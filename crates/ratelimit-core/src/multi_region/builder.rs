//! [`MultiRegionStoreBuilder`]: a region, its Redis, its peers, and how
//! often and how long to wait for them.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::peer::{Peer, Timing};
use super::round::ROUND_ENTRIES;
use super::sync::Shared;
use super::{Inner, MAX_REGIONS, MultiRegionStore};
use crate::StoreError;
use crate::clock::Clock;
use crate::redis::backend_error;

/// The default interval at which an instance pushes its region's counts to
/// every peer.
pub(crate) const DEFAULT_SYNC: Duration = Duration::from_millis(100);
/// The default time after which a peer not heard from is stale.
pub(crate) const DEFAULT_STALENESS: Duration = Duration::from_secs(2);
/// The default time allowed for one decision in the region's own Redis.
pub(crate) const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_millis(100);
/// The default time allowed for one push to a peer's Redis.
pub(crate) const DEFAULT_PUSH_TIMEOUT: Duration = Duration::from_secs(1);
/// The default largest difference between two regions' clocks that changes
/// nothing; beyond it a peer is counted at its conservative share.
pub(crate) const DEFAULT_MAX_SKEW: Duration = Duration::from_secs(1);

/// The longest staleness or skew allowed: a day.
const MAX_DURATION: Duration = Duration::from_secs(86_400);

/// Configures a [`MultiRegionStore`].
#[must_use]
pub struct MultiRegionStoreBuilder {
    region: String,
    url: String,
    peers: Vec<(String, String)>,
    prefix: String,
    timing: Timing,
    call_timeout: Duration,
    fixed_clock: Option<Arc<dyn Clock>>,
    peer_clocks: Vec<(String, Arc<dyn Clock>)>,
    round: usize,
}

impl fmt::Debug for MultiRegionStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // URLs may carry passwords: only the names are shown.
        let peers: Vec<&str> = self.peers.iter().map(|(name, _)| name.as_str()).collect();
        f.debug_struct("MultiRegionStoreBuilder")
            .field("region", &self.region)
            .field("peers", &peers)
            .field("prefix", &self.prefix)
            .field("sync", &self.timing.sync)
            .field("staleness", &self.timing.staleness)
            .field("max_skew", &self.timing.max_skew)
            .finish_non_exhaustive()
    }
}

impl MultiRegionStore {
    /// Configures the store of region `region`, deciding in the Redis at
    /// `url` (a single node: `redis://[user:password@]host[:port][/db]`).
    pub fn builder(region: impl Into<String>, url: impl Into<String>) -> MultiRegionStoreBuilder {
        MultiRegionStoreBuilder {
            region: region.into(),
            url: url.into(),
            peers: Vec::new(),
            prefix: crate::redis::DEFAULT_PREFIX.to_owned(),
            timing: Timing {
                sync: DEFAULT_SYNC,
                staleness: DEFAULT_STALENESS,
                max_skew: DEFAULT_MAX_SKEW,
                push_timeout: DEFAULT_PUSH_TIMEOUT,
            },
            round: ROUND_ENTRIES,
            call_timeout: DEFAULT_CALL_TIMEOUT,
            fixed_clock: None,
            peer_clocks: Vec::new(),
        }
    }
}

impl MultiRegionStoreBuilder {
    /// Adds the peer region `name`, whose Redis is at `url`. Every region
    /// lists every other one, each under the name it gives itself; at most
    /// 16 regions in all.
    pub fn peer(mut self, name: impl Into<String>, url: impl Into<String>) -> Self {
        self.peers.push((name.into(), url.into()));
        self
    }

    /// The prefix of every key (default `ratelimit`), the same in every region.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How often this instance pushes its region's counts to every peer
    /// (default 100 ms). The over-admission bound grows with it.
    pub fn sync(mut self, interval: Duration) -> Self {
        self.timing.sync = interval;
        self
    }

    /// How old a peer's freshest complete push may be before this region
    /// counts the peer at its conservative share (default
    /// 2 s); more than twice `sync`, since a push is marked
    /// with a time taken before the round that carries it, and at most a day.
    pub fn staleness(mut self, staleness: Duration) -> Self {
        self.timing.staleness = staleness;
        self
    }

    /// The largest difference between this region's clock (its Redis's
    /// `TIME`) and a peer's that changes nothing (default
    /// 1 s, at most a day). Regions decide by their own clocks, so a skew
    /// shifts where their windows start; beyond this, once a push shows it,
    /// the peer is counted at its conservative share, logged and reported.
    pub fn max_skew(mut self, max_skew: Duration) -> Self {
        self.timing.max_skew = max_skew;
        self
    }

    /// The time allowed for one decision in the region's Redis (default
    /// 100 ms); beyond it the check fails with
    /// [`StoreError::Timeout`], an outage for the failure policy.
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// The time allowed for one push to a peer (default 1 s).
    pub fn push_timeout(mut self, timeout: Duration) -> Self {
        self.timing.push_timeout = timeout;
        self
    }

    /// This region's windows follow `clock` instead of its Redis server's
    /// `TIME` (staleness still follows the servers' real time); so do the
    /// peers', unless [`peer_script_clock_for_tests`](Self::peer_script_clock_for_tests)
    /// says otherwise. Only in this workspace's test builds (see
    /// `build.rs`), never published.
    #[cfg(ratelimit_test_hooks)]
    // Hidden: `ratelimit-tests` replays timelines with it; test builds only.
    #[doc(hidden)]
    pub fn script_clock_for_tests(mut self, clock: impl Clock) -> Self {
        self.fixed_clock = Some(Arc::new(clock));
        self
    }

    /// The windows of peer `name`'s Redis follow `clock` (as that region's
    /// own store was told), so the counts pushed there are placed by its
    /// clock. Only in this workspace's test builds (see `build.rs`).
    #[cfg(ratelimit_test_hooks)]
    // Hidden: `ratelimit-tests` replays timelines with it; test builds only.
    #[doc(hidden)]
    pub fn peer_script_clock_for_tests(
        mut self,
        name: impl Into<String>,
        clock: impl Clock,
    ) -> Self {
        self.peer_clocks.push((name.into(), Arc::new(clock)));
        self
    }

    /// Rounds read at most `entries` outbox entries (at least one read's
    /// worth, 1,024) instead of 65,536, so that a test delivers a backlog
    /// longer than a round without writing 65,536 keys. Only in this
    /// workspace's test builds (see `build.rs`).
    #[cfg(ratelimit_test_hooks)]
    // Hidden: `ratelimit-tests` tests a backlog over several rounds with it.
    #[doc(hidden)]
    pub fn round_entries_for_tests(mut self, entries: usize) -> Self {
        self.round = entries;
        self
    }

    fn validate(&self) -> Result<(), StoreError> {
        let invalid = |what: &str, value: &str| {
            StoreError::Backend(
                format!("invalid {what} {value:?}: use 1 to 32 characters from [A-Za-z0-9._-]")
                    .into(),
            )
        };
        if !valid_name(&self.prefix, 64) {
            return Err(invalid("key prefix", &self.prefix));
        }
        if !valid_name(&self.region, 32) {
            return Err(invalid("region name", &self.region));
        }
        for (i, (name, _)) in self.peers.iter().enumerate() {
            if !valid_name(name, 32) {
                return Err(invalid("peer region name", name));
            }
            if *name == self.region || self.peers[..i].iter().any(|(other, _)| other == name) {
                return Err(StoreError::Backend(
                    format!("region {name:?} is named twice: every region needs its own name")
                        .into(),
                ));
            }
        }
        if self.peers.len() + 1 > MAX_REGIONS {
            return Err(StoreError::Backend(
                format!(
                    "at most {MAX_REGIONS} regions, not {}",
                    self.peers.len() + 1
                )
                .into(),
            ));
        }
        let timing = self.timing;
        if timing.sync.is_zero() || timing.staleness <= timing.sync.saturating_mul(2) {
            return Err(StoreError::Backend(
                format!(
                    "sync ({:?}) must be positive and staleness ({:?}) more than twice as long",
                    timing.sync, timing.staleness
                )
                .into(),
            ));
        }
        // The scripts compute with these in µs, exactly below 2^53.
        for (what, value) in [
            ("staleness", timing.staleness),
            ("max_skew", timing.max_skew),
        ] {
            if value > MAX_DURATION {
                return Err(StoreError::Backend(
                    format!("{what} ({value:?}) must be at most {MAX_DURATION:?}").into(),
                ));
            }
        }
        Ok(())
    }

    /// Connects to the region's Redis (an error if it cannot be reached
    /// within the call timeout, retried three times), prepares lazy
    /// connections to the peers (a peer that is down does not stop this
    /// region), and starts the sync tasks on the current tokio runtime.
    pub async fn build(self) -> Result<MultiRegionStore, StoreError> {
        self.validate()?;
        let config = |timeout: Duration| {
            ConnectionManagerConfig::new()
                .set_connection_timeout(Some(timeout))
                .set_response_timeout(Some(timeout))
                .set_number_of_retries(1)
                .set_max_delay(Duration::from_secs(1))
        };
        let client = redis::Client::open(self.url.as_str()).map_err(backend_error)?;
        let connect = config(self.call_timeout.max(Duration::from_millis(500)));
        let local = tokio::time::timeout(
            self.call_timeout
                .max(Duration::from_millis(500))
                .saturating_mul(3),
            ConnectionManager::new_with_config(client, connect),
        )
        .await
        .map_err(|_| StoreError::Timeout(self.call_timeout))?
        .map_err(backend_error)?;
        let mut peers = Vec::with_capacity(self.peers.len());
        for (name, url) in &self.peers {
            let client = redis::Client::open(url.as_str()).map_err(backend_error)?;
            let connection =
                ConnectionManager::new_lazy_with_config(client, config(self.timing.push_timeout))
                    .map_err(backend_error)?;
            let clock = self
                .peer_clocks
                .iter()
                .find(|(peer, _)| peer == name)
                .map(|(_, clock)| Arc::clone(clock))
                .or_else(|| self.fixed_clock.clone());
            peers.push(Peer::new(name.clone(), connection, clock));
        }
        let shared = Arc::new(Shared::new(
            self.region.clone(),
            self.prefix.clone(),
            local.clone(),
            peers,
            self.timing,
            self.fixed_clock.clone(),
            self.round,
        ));
        let tasks = shared.start();
        Ok(MultiRegionStore {
            inner: Arc::new(Inner {
                region: self.region,
                prefix: self.prefix,
                local,
                call_timeout: self.call_timeout,
                fixed_clock: self.fixed_clock,
                shared,
                tasks,
            }),
        })
    }
}

/// 1 to `max` characters from `[A-Za-z0-9._-]`.
fn valid_name(name: &str, max: usize) -> bool {
    (1..=max).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn refused(builder: MultiRegionStoreBuilder) -> String {
        match builder.build().await {
            Err(StoreError::Backend(e)) => e.to_string(),
            other => panic!("not refused: {other:?}"),
        }
    }

    #[tokio::test]
    async fn bad_settings_are_refused_before_connecting() {
        // Port 1: nothing listens, and nothing is tried.
        let base = || {
            MultiRegionStore::builder("eu", "redis://127.0.0.1:1").peer("us", "redis://127.0.0.1:1")
        };
        let e = refused(
            base()
                .sync(Duration::from_secs(1))
                .staleness(Duration::from_secs(2)),
        )
        .await;
        assert!(e.contains("more than twice"), "{e}");
        let e = refused(base().max_skew(Duration::from_secs(86_401))).await;
        assert!(e.contains("max_skew"), "{e}");
        let e = refused(base().peer("eu", "redis://127.0.0.1:1")).await;
        assert!(e.contains("named twice"), "{e}");
        let e = refused(MultiRegionStore::builder("e:u", "redis://127.0.0.1:1")).await;
        assert!(e.contains("region name"), "{e}");
    }

    /// The timing's checks, in order: `sync` and `staleness` together, then
    /// `staleness` and `max_skew` against a day; each message names the
    /// values it refused.
    #[tokio::test]
    async fn timing_is_checked_sync_first_then_staleness_then_skew() {
        let base = || MultiRegionStore::builder("eu", "redis://127.0.0.1:1");
        let day = Duration::from_secs(86_400);
        let past_day = day + Duration::from_nanos(1);
        let twice = "must be positive and staleness";
        for (builder, expected) in [
            (
                base().sync(Duration::ZERO),
                format!("sync (0ns) {twice} (2s) more than twice as long"),
            ),
            (
                base()
                    .sync(Duration::ZERO)
                    .staleness(past_day)
                    .max_skew(past_day),
                format!("sync (0ns) {twice} ({past_day:?}) more than twice as long"),
            ),
            (
                base().staleness(Duration::from_millis(200)),
                format!("sync (100ms) {twice} (200ms) more than twice as long"),
            ),
            (
                base().sync(day).staleness(Duration::MAX),
                format!("staleness ({:?}) must be at most {day:?}", Duration::MAX),
            ),
            (
                base().staleness(past_day).max_skew(past_day),
                format!("staleness ({past_day:?}) must be at most {day:?}"),
            ),
            (
                base().max_skew(past_day),
                format!("max_skew ({past_day:?}) must be at most {day:?}"),
            ),
        ] {
            assert_eq!(refused(builder).await, expected);
        }
    }

    /// The builder's `Debug` shows the region, the peers' names (never
    /// their URLs, which may carry passwords), the prefix and the timing:
    /// the defaults, then what the setters set.
    #[test]
    fn debug_shows_the_defaults_and_the_settings_but_no_url() {
        let builder = MultiRegionStore::builder("eu", "redis://:secret@127.0.0.1:1")
            .peer("us", "redis://:hidden@127.0.0.1:2");
        assert_eq!(
            format!("{builder:?}"),
            "MultiRegionStoreBuilder { region: \"eu\", peers: [\"us\"], prefix: \"ratelimit\", \
             sync: 100ms, staleness: 2s, max_skew: 1s, .. }"
        );
        let builder = builder
            .prefix("rl")
            .sync(Duration::from_millis(250))
            .staleness(Duration::from_secs(3))
            .max_skew(Duration::from_millis(40))
            .push_timeout(Duration::from_millis(70))
            .call_timeout(Duration::from_millis(80));
        assert_eq!(
            format!("{builder:?}"),
            "MultiRegionStoreBuilder { region: \"eu\", peers: [\"us\"], prefix: \"rl\", \
             sync: 250ms, staleness: 3s, max_skew: 40ms, .. }"
        );
        assert_eq!(builder.timing.push_timeout, Duration::from_millis(70));
        assert_eq!(builder.call_timeout, Duration::from_millis(80));
    }
}
