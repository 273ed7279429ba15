//! [`MultiRegionStore`]: one limit across regions that each keep their own
//! Redis, without a cross-region round trip per request.
//!
//! Every decision is one Lua call in the region's own Redis, against the
//! global count: this region's exact count plus what each peer region's
//! pushes added. The same call writes the admission to the
//! region's *outbox* in Redis, and every `sync` (default 100 ms) each
//! instance pushes the region's outbox to every peer's Redis in one round
//! trip, whatever the number of keys. The receiver adds what it had not
//! heard, in the window of its own clock in which it arrives, so replays,
//! duplicates, reordering and a peer's clock never hide or erase a count. A
//! round that delivered everything *marks* the peer heard; a peer whose
//! freshest mark is older than `staleness`, or whose clock is off by more
//! than `max_skew`, counts at its conservative share,
//! `ceil(limit / regions)`, until it is heard again.
//!
//! **The bound.** Let `D` be the lag: the time from an admission in one
//! region until it has landed in a peer's Redis. A round starts every
//! `sync` (or as soon as a longer one ended) and takes its reads, one round
//! trip and the time the peer's Redis runs its merges (a few tens of µs per
//! key admitted since the last round), so `D <= max(sync, round) + round`:
//! with a `sync` longer than a round, about `sync`, half a round trip and
//! the merges. Any instance of the region that reaches the peer delivers
//! the whole region's counts. For every region
//! and every window of its clock, up to its last admission in the window,
//! the regions together admit at most `limit` plus what the other regions
//! admitted during the `D` before that admission (every admission keeps
//! `own + heard <= limit`, and everything admitted more than `D` ago has
//! been heard). Requests further apart than `D` therefore admit `limit`
//! exactly. Regions' clocks apart by up to `max_skew` start their windows
//! that far apart, so in the windows of any one clock the bound holds away
//! from the edges by that much. While a peer cannot be reached but is not
//! yet stale, `D` stretches to the staleness; beyond it, the shares apply.
//! The lag is reported per peer ([`PeerStatus::last_heard`], an upper bound
//! of `D`), and the extra term per policy
//! ([`MultiRegionStore::overshoot_estimate`]).
//!
//! Algorithms: fixed window and sliding window counter, whose state is a
//! count per window of a fixed length; other policies, calendar periods
//! included, are [`StoreError::Unsupported`].
//! Concurrency and the sliding window log need every unit, not a count, and
//! a token bucket or GCRA would need their units consumed per period (see
//! `ARCHITECTURE.md`). Each region's Redis is one node (not a cluster).
//! Its user may run scripts and `INFO`: a round reads the Redis's run and
//! replication ids, and a Redis that restarted, was promoted or resynced
//! (perhaps to data older than what its peers were sent) starts a new
//! outbox, which its peers count afresh (what it kept, twice, until its
//! windows end). Rounds that cannot read the ids fail,
//! and the peers count the region at its share.
//! Refunds and settlements ([`Store::settle`]) are
//! [`StoreError::Unsupported`]: the counts only ever grow (a G-counter), so
//! nothing can be given back ([`Store::supports_settlement`] is `false`, so
//! the Tower layer refuses rules that would settle here).
//!
//! ```no_run
//! use std::time::Duration;
//! use ratelimit_core::multi_region::MultiRegionStore;
//! use ratelimit_core::{Policy, Store};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = MultiRegionStore::builder("eu", "redis://127.0.0.1:6379")
//!     .peer("us", "redis://us.example:6379")
//!     .peer("ap", "redis://ap.example:6379")
//!     .sync(Duration::from_millis(100))
//!     .build()
//!     .await?;
//! let policy = Policy::fixed_window(1000, Duration::from_secs(60))?.with_name("api")?;
//! let decision = store.check(b"tenant-42", &policy, 1).await?;
//! println!("{decision:?}");
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::{Script, Value};
use tokio::task::JoinHandle;

use crate::clock::Clock;
use crate::redis::backend_error;
use crate::store::{BoxFuture, Check, Merged, Store, spread};
use crate::{Decision, PermitId, Policy, StoreError, key};

mod builder;
// Not API: `ratelimit-tests` replays the Lua script's reads of a live Redis
// against this model (a unit test has no Redis to run the script on), so
// this workspace's test builds export it (see `build.rs`); a published
// build keeps it inside, with only what the store decides by.
#[cfg(ratelimit_test_hooks)]
#[doc(hidden)]
pub mod counts;
#[cfg(not(ratelimit_test_hooks))]
#[allow(unreachable_pub)]
mod counts;
mod peer;
mod round;
#[cfg(test)]
mod simulation;
mod sync;

pub use builder::MultiRegionStoreBuilder;
use counts::Component;
pub use sync::PeerStatus;

/// The most regions one store knows (itself and its peers).
pub(crate) const MAX_REGIONS: usize = 16;

/// A store whose decisions are made in the region's own Redis against a
/// G-counter shared with peer regions (see the [module docs](self)).
///
/// Cloning shares the connections and the sync tasks, which stop when the
/// last clone drops.
#[derive(Clone)]
pub struct MultiRegionStore {
    inner: Arc<Inner>,
}

struct Inner {
    region: String,
    prefix: String,
    local: ConnectionManager,
    call_timeout: Duration,
    fixed_clock: Option<Arc<dyn Clock>>,
    shared: Arc<sync::Shared>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl fmt::Debug for MultiRegionStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiRegionStore")
            .field("region", &self.inner.region)
            .field("prefix", &self.inner.prefix)
            .field("peers", &self.inner.shared.peers.len())
            .finish_non_exhaustive()
    }
}

fn decide_script() -> &'static Script {
    static SCRIPT: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
    SCRIPT.get_or_init(|| peer::script(include_str!("lua/decide.lua")))
}

/// One check's part of the script's reply.
struct Seen {
    passes: bool,
    start: u64,
    global: Component,
}

impl MultiRegionStore {
    /// This region's name.
    pub fn region(&self) -> &str {
        &self.inner.region
    }

    /// The Redis hash that holds the G-counter of `key` under `policy`:
    /// `<prefix>:<policy>:{<key>}:mr`, one field `<region>:<window start>`
    /// per region and window.
    pub fn state_key(&self, key: &[u8], policy: &Policy) -> String {
        format!(
            "{}:mr",
            key::storage_key(&self.inner.prefix, policy.name(), key)
        )
    }

    /// What this instance knows of each peer, as of its last status read
    /// (every sync interval).
    pub fn peers(&self) -> Vec<PeerStatus> {
        self.inner.shared.status()
    }

    /// Per policy name, the units the other regions admitted that this
    /// region had not heard of yet, as of the last status read: each peer's
    /// recent rate under the policy times its observed lag, summed over
    /// peers and keys. The over-admission of one key is at most its own
    /// part of this; the `metrics` feature reports it as
    /// `ratelimit_region_overshoot_estimate`.
    pub fn overshoot_estimate(&self) -> std::collections::BTreeMap<String, f64> {
        self.inner.shared.overshoot()
    }

    /// Pushes everything queued to every peer and reads their staleness now,
    /// rather than at the next tick. The first error, if any, is returned
    /// after every peer was tried.
    pub async fn sync_now(&self) -> Result<(), StoreError> {
        let shared = &self.inner.shared;
        let mut first = None;
        for index in 0..shared.peers.len() {
            if let Err(e) = shared.push(index).await {
                first.get_or_insert(e);
            }
        }
        if let Err(e) = shared.refresh().await {
            first.get_or_insert(e);
        }
        first.map_or(Ok(()), Err)
    }

    async fn decide(self, checks: Vec<(String, Policy, u64)>) -> Result<Vec<Decision>, StoreError> {
        let inner = &self.inner;
        let shared = &inner.shared;
        let timing = shared.timing;
        let mut invocation = decide_script().prepare_invoke();
        for key in peer::outbox_keys(&inner.prefix) {
            invocation.key(key);
        }
        for peer in &shared.peers {
            invocation.key(peer::heard_key(&inner.prefix, &peer.name));
        }
        invocation
            .arg(inner.fixed_clock.as_ref().map_or(0, |c| c.now()))
            .arg(&inner.region)
            .arg(shared.peers.len() + 1)
            .arg(peer::micros(timing.staleness))
            .arg(peer::micros(timing.max_skew))
            .arg(shared.peers.len());
        for peer in &shared.peers {
            invocation.arg(&peer.name);
        }
        for (hash, policy, cost) in &checks {
            let kind = match policy.algorithm() {
                crate::Algorithm::FixedWindow(_) => 1,
                _ => 2,
            };
            invocation
                .key(hash)
                .arg(kind)
                .arg(policy.limit())
                .arg(policy.algorithm().window_micros())
                .arg(*cost);
        }
        let mut connection = inner.local.clone();
        let reply = tokio::time::timeout(
            inner.call_timeout,
            invocation.invoke_async::<Value>(&mut connection),
        )
        .await
        .map_err(|_| StoreError::Timeout(inner.call_timeout))?
        .map_err(backend_error)?;
        let (now, seen) = parse_reply(&reply, checks.len())?;
        let all = seen.iter().all(|s| s.passes);
        let mut decisions = Vec::with_capacity(checks.len());
        for ((hash, policy, cost), seen) in checks.iter().zip(&seen) {
            // When another check denied, one that would pass reports a peek.
            let asked = if all || !seen.passes { *cost } else { 0 };
            let decision = counts::decide(policy, seen.start, now, asked, seen.global)?;
            if decision.is_allowed() != seen.passes {
                return Err(StoreError::Backend(
                    format!("decide.lua and the algorithm disagree on {hash}").into(),
                ));
            }
            decisions.push(decision);
        }
        Ok(decisions)
    }
}

fn parse_reply(reply: &Value, checks: usize) -> Result<(u64, Vec<Seen>), StoreError> {
    let bad = || StoreError::Backend(format!("unexpected reply to decide.lua: {reply:?}").into());
    let Value::Array(items) = reply else {
        return Err(bad());
    };
    let numbers: Vec<u64> = items
        .iter()
        .map(peer::number)
        .collect::<Option<_>>()
        .ok_or_else(bad)?;
    let Some((&now, rest)) = numbers.split_first() else {
        return Err(bad());
    };
    if rest.len() != checks * 4 {
        return Err(bad());
    }
    let seen = rest
        .chunks_exact(4)
        .map(|c| Seen {
            passes: c[0] == 1,
            start: c[1],
            global: Component::new(c[2], c[3]),
        })
        .collect();
    Ok((now, seen))
}

impl Store for MultiRegionStore {
    type CheckFuture = BoxFuture<Decision>;
    type CheckAllFuture = BoxFuture<Vec<Decision>>;
    type ReleaseFuture = BoxFuture<()>;
    type RenewFuture = BoxFuture<bool>;

    fn check(&self, key: &[u8], policy: &Policy, cost: u64) -> Self::CheckFuture {
        let checks = [Check::new(key, policy, cost)];
        let all = self.check_all(&checks);
        Box::pin(async move {
            all.await?
                .pop()
                .ok_or_else(|| StoreError::Backend("no decision for one check".into()))
        })
    }

    fn check_all(&self, checks: &[Check<'_>]) -> Self::CheckAllFuture {
        let prepared = prepare(self, checks);
        let store = self.clone();
        Box::pin(async move {
            let (checks, of) = prepared?;
            if checks.is_empty() {
                return Ok(Vec::new());
            }
            let decisions = store.decide(checks).await?;
            spread(&of, &decisions)
        })
    }

    fn release(&self, _key: &[u8], policy: &Policy, _permit: PermitId) -> Self::ReleaseFuture {
        let error = StoreError::unsupported(policy, "release");
        Box::pin(async move { Err(error) })
    }

    fn renew(&self, _key: &[u8], policy: &Policy, _permit: PermitId) -> Self::RenewFuture {
        let error = StoreError::unsupported(policy, "renew");
        Box::pin(async move { Err(error) })
    }
}

/// The checks merged by state key, each checked for its cost and algorithm.
#[allow(clippy::type_complexity)]
fn prepare(
    store: &MultiRegionStore,
    checks: &[Check<'_>],
) -> Result<(Vec<(String, Policy, u64)>, Vec<usize>), StoreError> {
    for check in checks {
        if !counts::supports(check.policy) {
            return Err(StoreError::unsupported(check.policy, "multi-region"));
        }
    }
    let merged = Merged::checks(checks, |c| store.state_key(c.key, c.policy))?;
    let owned = merged
        .items
        .iter()
        .map(|c| (store.state_key(c.key, c.policy), c.policy.clone(), c.cost))
        .collect();
    Ok((owned, merged.of))
}
