//! [`RedisStore`]: one limit shared by every instance of a service, in one
//! Redis node, the master Redis Sentinel names (feature `sentinel`, see
//! `RedisStore::sentinel_builder`), or a Redis Cluster (feature
//! `redis-cluster`).
//!
//! Every decision is one Lua call, run atomically by Redis: on Redis 7 and
//! later a single check is an `FCALL` of the store's function library
//! (loaded by `FUNCTION LOAD` when missing, see `functions.rs`); everything
//! else, and every check where functions cannot be used, is a script run by
//! `EVALSHA` (and reloaded by `EVAL` after a restart or failover empties the
//! script cache). Each new connection first checks the Redis user's write
//! permissions once (`acl_probe.lua`), so no script has to. Scripts read the time from Redis `TIME`, never from the client, so
//! instances with skewed clocks still agree. State keys are
//! `<prefix>:<policy>:{<key>}`, the user key inside a Redis Cluster hash tag,
//! and every key is written with a TTL no longer than its state matters.
//!
//! The scripts live next to this file as `.lua` files: a shared prelude, one
//! file per algorithm, and the entry points for one decision, several limits
//! at once, releasing a concurrency permit, and settling a request's
//! reservations to their actual cost (`settle.lua`).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "redis-cluster")]
use redis::cluster_routing::Slot;
use redis::{ErrorKind, RedisError, ServerErrorKind, Value};
use tokio::time::Instant as Deadline;

use crate::clock::Clock;
use crate::policy::{Algorithm, AlgorithmKind};
use crate::settle::{Settle, SettleFuture, SettlementId};
use crate::store::{BoxFuture, Check, Store};
use crate::{Decision, PermitId, Policy, StoreError, key};

mod admin;
mod builder;
#[cfg(feature = "redis-cluster")]
mod cluster;
mod coalesce;
mod connections;
mod errors;
mod functions;
#[cfg(test)]
mod lua_scope;
#[cfg(feature = "redis-cluster")]
mod masters;
#[cfg(feature = "bb8")]
mod pool;
mod replies;
mod scripts;
#[cfg(feature = "sentinel")]
mod sentinel;
mod settle;
mod unclaimed;

/// The bb8 pool (feature `bb8`), of the version [`RedisStore::bb8_builder`] takes.
#[cfg(feature = "bb8")]
pub use bb8;
/// bb8's Redis connection manager (feature `bb8`), of the version
/// [`RedisStore::bb8_builder`] takes.
#[cfg(feature = "bb8")]
pub use bb8_redis;
pub use builder::RedisStoreBuilder;
pub(crate) use errors::backend_error;
use errors::*;
use replies::*;

pub use coalesce::CoalescingStats;
use coalesce::DEFAULT_MAX_BATCH;
use coalesce::{Coalescer, Decided, Item, LaneId};
use connections::{Connections, Link, Node};
use scripts::{AclProbe, CallKeys, Command, Invocation, Named, Scripts, StateKeys};
use smallvec::{SmallVec, smallvec};
use unclaimed::{SentOn, Unclaimed, Via};

/// The default prefix of every key the store writes.
pub(crate) const DEFAULT_PREFIX: &str = "ratelimit";
/// The default number of multiplexed connections to one node, each shared by
/// every concurrent call.
pub(crate) const DEFAULT_POOL_SIZE: u32 = 4;
/// The default time allowed to open a connection.
pub(crate) const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// The default time allowed for one decision, connection checkout included.
pub(crate) const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_millis(100);

/// A store in Redis (one node, the master Redis Sentinel names with the
/// `sentinel` feature, or a Redis Cluster with the `redis-cluster` feature),
/// shared by every instance that points at it.
///
/// A concurrency permit that a check took in Redis but could not hand to its
/// caller (the reply timed out, the connection dropped, the caller dropped
/// the call in flight, or the check was denied after all when sent again) is
/// released in the background on the current tokio runtime, rather than
/// held for its whole lease. A check sent again after its reply was lost
/// finds the permit its first run took and is allowed, holding that one
/// permit.
///
/// ```no_run
/// use ratelimit_core::redis::RedisStore;
/// use ratelimit_core::{Policy, Rate, Store};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = RedisStore::builder("redis://127.0.0.1:6379/0").build().await?;
/// let policy = Policy::gcra(20, Rate::per_second(10))?.with_name("api")?;
/// let decision = store.check(b"tenant-42", &policy, 1).await?;
/// println!("{decision:?}");
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    backend: Backend,
    prefix: String,
    call_timeout: Duration,
    scripts: Scripts,
    functions: functions::Mode,
    fixed_clock: Option<Arc<dyn Clock>>,
    permit_ids: crate::decision::PermitIds,
    /// Releases of unclaimed permits under way (see `unclaimed`).
    pending_releases: std::sync::atomic::AtomicUsize,
    /// Coalescing (see `coalesce`); `None` with a `max_batch` of 1.
    coalescer: Option<Coalescer>,
}

enum Backend {
    Node(Node),
    #[cfg(feature = "redis-cluster")]
    Cluster(Box<cluster::Cluster>),
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let backend = match &self.inner.backend {
            Backend::Node(node) => match node {
                #[cfg(feature = "sentinel")]
                Node::Own(connections) if connections.master().is_some() => "sentinel",
                Node::Own(_) => "single node",
                #[cfg(feature = "bb8")]
                Node::Pool(_) => "single node, bb8 pool",
            },
            #[cfg(feature = "redis-cluster")]
            Backend::Cluster(_) => "cluster",
        };
        f.debug_struct("RedisStore")
            .field("backend", &backend)
            .field("prefix", &self.inner.prefix)
            .field("call_timeout", &self.inner.call_timeout)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Configures a store on the Redis at `url`: `redis://[user:password@]host[:port][/db]`
    /// (`user:password@` for Redis ACL users), or `rediss://...` for TLS
    /// (feature `tls`).
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder {
            urls: vec![url.into()],
            cluster: false,
            prefix: DEFAULT_PREFIX.to_owned(),
            pool_size: DEFAULT_POOL_SIZE,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            call_timeout: DEFAULT_CALL_TIMEOUT,
            max_batch: DEFAULT_MAX_BATCH,
            fixed_clock: None,
            allow_unresolved_hosts: false,
            allow_eviction: false,
            #[cfg(feature = "sentinel")]
            sentinel: None,
            #[cfg(feature = "sentinel")]
            master: sentinel::MasterOptions::default(),
            #[cfg(feature = "tls")]
            root_cert: None,
            #[cfg(feature = "bb8")]
            pool: None,
        }
    }

    /// Configures a store that decides on the connections of `pool`, an
    /// application's own bb8 pool of one Redis node, instead of opening its
    /// own (feature `bb8`). The pool's `max_size` takes the place of
    /// [`pool_size`](RedisStoreBuilder::pool_size), and its manager's URL and
    /// bb8's `connection_timeout` the places of the URL and of
    /// [`connect_timeout`](RedisStoreBuilder::connect_timeout); the call
    /// timeout still bounds every call, the wait for a pooled connection
    /// included, so a pool that gives none in time is an outage (the failure
    /// policy applies). At most `max_size` of the store's calls ask the pool
    /// at once; the others queue in the store, first come first served
    /// (bb8's own queue is not fair). Connections the application itself
    /// holds are outside that queue: the store's calls then wait inside bb8
    /// for the rest.
    ///
    /// The store's own multiplexed connections are the default, and faster
    /// (see `BENCHMARKS.md`); keep coalescing on with a pool. Keep bb8's `test_on_check_out` on (its
    /// default): `RedisConnectionManager` never reports a broken connection
    /// otherwise, and a pool keeps handing out a connection that died with a
    /// Redis restart.
    ///
    /// Unlike [`builder`](RedisStore::builder), `build()` cannot check that
    /// the host resolves: the manager does not show its URL. A mistyped host
    /// there is an outage, which the failure policy decides; check the URL
    /// when the application builds the manager (with `pool.get()`, say).
    ///
    /// ```no_run
    /// use ratelimit_core::redis::{RedisStore, bb8, bb8_redis::RedisConnectionManager};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let manager = RedisConnectionManager::new("redis://127.0.0.1:6379/0")?;
    /// let pool = bb8::Pool::builder().max_size(16).build(manager).await?;
    /// let store = RedisStore::bb8_builder(pool.clone()).build().await?;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "bb8")]
    pub fn bb8_builder(pool: bb8::Pool<bb8_redis::RedisConnectionManager>) -> RedisStoreBuilder {
        let mut builder = RedisStore::builder(String::new());
        builder.urls = Vec::new();
        builder.pool = Some(pool);
        builder
    }

    /// Configures a store on a Redis Cluster reached through `urls` (any of its nodes).
    #[cfg(feature = "redis-cluster")]
    pub fn cluster_builder<I, S>(urls: I) -> RedisStoreBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut builder = RedisStore::builder(String::new());
        builder.urls = urls.into_iter().map(Into::into).collect();
        builder.cluster = true;
        builder
    }

    /// Configures a store behind Redis Sentinel (feature `sentinel`): it
    /// decides on the multiplexed connections of the master that the
    /// sentinels at `sentinels` name under `master_name` (the name of
    /// `sentinel monitor <name> ...`), and follows a failover.
    ///
    /// Each sentinel is `host:port`, `host` (port 26379)
    /// or a `redis://[user:password@]host[:port]` URL (`rediss://` for TLS,
    /// feature `tls`); the user and password of a URL are the sentinels'
    /// own, the same for every sentinel. The master's credentials, database
    /// and TLS are the builder's [`master_credentials`](RedisStoreBuilder::master_credentials),
    /// [`master_db`](RedisStoreBuilder::master_db) and `master_tls`.
    ///
    /// How the store follows a failover: after a connection error, a timeout
    /// or a write refused by a read-only replica (`READONLY`, a master
    /// demoted under the store), the next call asks the sentinels for the
    /// master before it decides (every sentinel at once, each through
    /// redis-rs's `SentinelClient`, which checks with `ROLE` that the node it
    /// names is a master), and every connection
    /// to a master they no longer name is dropped unused. Until the
    /// sentinels name a master that answers, calls fail as an outage
    /// ([`StoreError::Unavailable`] or [`StoreError::Timeout`]) and the
    /// failure policy decides. Redis replicates asynchronously: what the old
    /// master admitted but had not yet sent to the promoted replica is lost
    /// with it, and may be admitted again (see `RELIABILITY.md`).
    ///
    /// [`build`](RedisStoreBuilder::build) asks the sentinels now: it fails
    /// when none answers, when none monitors `master_name`, or when the
    /// sentinels or the master refuse the credentials (a master they name
    /// that is down still builds, as an outage).
    ///
    /// ```no_run
    /// use ratelimit_core::redis::RedisStore;
    /// use ratelimit_core::{Policy, Rate, Store};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let sentinels = ["10.0.0.1:26379", "10.0.0.2:26379", "10.0.0.3:26379"];
    /// let store = RedisStore::sentinel_builder(sentinels, "mymaster")
    ///     .master_credentials("ratelimiter", "secret")
    ///     .build()
    ///     .await?;
    /// let policy = Policy::gcra(20, Rate::per_second(10))?.with_name("api")?;
    /// let decision = store.check(b"tenant-42", &policy, 1).await?;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "sentinel")]
    pub fn sentinel_builder<I, S>(sentinels: I, master_name: impl Into<String>) -> RedisStoreBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut builder = RedisStore::builder(String::new());
        builder.urls = Vec::new();
        builder.sentinel = Some(sentinel::Settings {
            sentinels: sentinels.into_iter().map(Into::into).collect(),
            master_name: master_name.into(),
        });
        builder
    }

    /// Behind Redis Sentinel, the address (`host:port`) of the master the
    /// store decides on now: the one the sentinels named when it last asked
    /// them (`None` before they named one, and on other stores).
    #[cfg(feature = "sentinel")]
    pub fn sentinel_master(&self) -> Option<String> {
        match &self.inner.backend {
            Backend::Node(node) => node.master()?.address(),
            #[cfg(feature = "redis-cluster")]
            Backend::Cluster(_) => None,
        }
    }

    /// The Redis key that holds the state of `key` under `policy`.
    pub fn state_key(&self, key: &[u8], policy: &Policy) -> String {
        key::storage_key(&self.inner.prefix, policy.name(), key)
    }

    /// Sends `PING` (within the call timeout): whether Redis answers.
    pub async fn ping(&self) -> Result<(), StoreError> {
        let mut cmd = redis::cmd("PING");
        cmd.arg("ratelimit");
        self.inner.run(&cmd).await.map(|_| ())
    }

    /// What coalescing did so far: calls sent and requests they decided
    /// (all zero with a `max_batch` of 1). See [`RedisStoreBuilder::max_batch`].
    pub fn coalescing(&self) -> CoalescingStats {
        self.inner
            .coalescer
            .as_ref()
            .map_or_else(CoalescingStats::default, Coalescer::stats)
    }

    fn permit_for(&self, policy: &Policy) -> PermitId {
        self.inner.permit_ids.next_for(policy)
    }

    fn fixed_now(&self) -> u64 {
        self.inner.fixed_clock.as_ref().map_or(0, |c| c.now())
    }
}

/// The Lua source of the script that decides one request under `algorithm`,
/// as the store sends it with `EVALSHA` where it cannot use Redis Functions
/// (see [`function_library`]).
///
/// `KEYS[1]` is the state key ([`RedisStore::state_key`]), which also holds
/// an admin block, in front of the state; `ARGV` is the cost and the algorithm's two
/// parameters (limit or burst, then window or interval in µs), then, only
/// when needed, a fixed time in µs (absent or `0`: the server's `TIME`) and
/// a permit id (concurrency only, which always sends both). The reply is
/// four integers: `allowed` (1 or 0), `remaining`, `reset_after` and `wait`
/// in µs (`wait`: the retry of a denial, the delay of an admission). Use it
/// to preload the scripts with `SCRIPT LOAD` or to measure Redis alone (see
/// `BENCHMARKS.md`).
pub fn script_source(algorithm: &Algorithm) -> &'static str {
    Scripts::single_source(algorithm)
}

/// The Redis Functions library (Redis 7 and later) by which the store decides
/// one request, for `FUNCTION LOAD` by an admin user when the store's own
/// user may not load it (see `SECURITY.md`). Its name and its functions'
/// names carry its SHA-1: libraries of different versions coexist.
pub fn function_library() -> &'static str {
    scripts::Library::get().source()
}

/// The function of [`function_library`] that decides one request under
/// `algorithm`, with the keys and arguments of [`script_source`]'s script
/// (`FCALL <name> 1 <state key> <args...>`): to call it by hand, after
/// loading the library, or to measure Redis alone.
pub fn function_name(algorithm: &Algorithm) -> &'static str {
    scripts::Library::get().function(algorithm)
}

/// The sources of the scripts by which a Redis Cluster store decides several
/// limits of one slot (`multi.lua`) and refunds them when a later slot denies
/// (`refund.lua`), so a test can send a refund again as a resend would. Only
/// in this workspace's test builds (see `build.rs`), never published.
#[cfg(ratelimit_test_hooks)]
// Hidden: `ratelimit-tests` sends refunds with it; test builds only.
#[doc(hidden)]
pub fn cross_slot_sources_for_tests() -> (&'static str, &'static str) {
    let scripts = Scripts::new();
    (scripts.get(Named::Multi).1, scripts.get(Named::Refund).1)
}

/// **For tests only.** A script that answers, for a fixed-window `policy`,
/// the window that holds each time (µs) in `ARGV`, as the scripts compute
/// it: a flat array of its first µs and the first µs after it per time.
/// So a test can compare the Lua calendar arithmetic with
/// [`FixedWindow::bounds`](crate::algorithm::FixedWindow::bounds) on many
/// times in one `EVAL` (no keys). Only in this workspace's test builds (see
/// `build.rs`), never published.
#[cfg(ratelimit_test_hooks)]
// Hidden: `ratelimit-tests` checks the Lua windows with it; test builds only.
#[doc(hidden)]
pub fn window_bounds_script_for_tests(policy: &Policy) -> String {
    let (_, window) = parameters(policy.algorithm());
    format!(
        "{}\nlocal window = {window}\n{}",
        scripts::CALENDAR,
        r"local out = {}
for i = 1, #ARGV do
  out[2 * i - 1], out[2 * i] = fixed_window_bounds(tonumber(ARGV[i]), window)
end
return out"
    )
}

impl Inner {
    /// Runs `cmd` within the call timeout, on any connection.
    async fn run(&self, cmd: &redis::Cmd) -> Result<Value, StoreError> {
        self.run_until(cmd, Via::Pool, self.deadline()).await
    }

    /// The deadline of a call that starts now.
    fn deadline(&self) -> Deadline {
        Deadline::now() + self.call_timeout
    }

    /// Whether a command sent at `sent` and still unanswered at `deadline`
    /// shows its connection stalled: it had (nearly) a whole call timeout to
    /// itself. One sent late in its call (after waiting for a connection to
    /// open, or after a first attempt) shows nothing: on a slow network,
    /// replacing its connection would throw away one just opened, and the
    /// next calls would wait for another, and so on.
    fn stalled(&self, sent: Deadline, deadline: Deadline) -> bool {
        deadline.saturating_duration_since(sent) >= self.call_timeout - self.call_timeout / 10
    }

    /// Runs `cmd` before `deadline` (the end of the call timeout of the
    /// call it is part of), on the connection `via` says; on a cluster,
    /// following the redirections of a script call (see `cluster`).
    async fn run_until(
        &self,
        cmd: &dyn Command,
        via: Via<'_>,
        deadline: Deadline,
    ) -> Result<Value, StoreError> {
        match &self.backend {
            // One timer per call, here, rather than one around the call and
            // one more per command inside redis-rs.
            Backend::Node(connections) => {
                let cmd = cmd.cmd();
                match via {
                    Via::Pool => self.run_on_node(connections, &cmd, None, deadline).await,
                    Via::Record(sent_on) => {
                        self.run_on_node(connections, &cmd, Some(sent_on), deadline)
                            .await
                    }
                    Via::On(connection) => self.run_on(connection, &cmd, deadline).await,
                }
            }
            // Redis keeps the order of one node's commands on the
            // connection that carries them: a release goes after its check
            // on `first` without being told (see `cluster`). Boxed: the
            // cluster client's futures, inline, made every decision's future
            // larger on a single node too.
            #[cfg(feature = "redis-cluster")]
            Backend::Cluster(cluster) => {
                Box::pin(self.run_on_cluster(cluster, cmd, deadline)).await
            }
        }
    }

    /// Runs `cmd` on one of the node's connections; `sent_on`, when given,
    /// records the connection it was sent on.
    async fn run_on_node(
        &self,
        node: &Node,
        cmd: &redis::Cmd,
        sent_on: Option<&SentOn>,
        deadline: Deadline,
    ) -> Result<Value, StoreError> {
        let timeout = StoreError::Timeout(self.call_timeout);
        // A connection may have died with a Redis restart or failover: each
        // one that fails is dropped and the call is retried, at once up to
        // once per connection plus a fresh one, then (a node that closes
        // connections again and again) after a pause that doubles, within
        // the same timeout.
        let attempts = node.size() + 1;
        let mut attempt = 0;
        // After a break, the connection that broke, opened again: when a
        // node closes every connection at once, the next ones in turn are
        // likely broken too, and would take up the call's attempts.
        let mut again = None;
        // The pause before the next attempt.
        let mut wait = Duration::ZERO;
        loop {
            attempt += 1;
            // The pause this attempt asks for is taken by the next one's
            // checkout (boxed there: see `Node::checkout`).
            let pause = {
                let Ok(checkout) =
                    tokio::time::timeout_at(deadline, node.checkout(again, wait)).await
                else {
                    node.suspect();
                    return Err(timeout);
                };
                let mut checkout = match checkout {
                    Ok(checkout) => checkout,
                    // The node closed the new connection (twice: see
                    // `Connections::open`), as one that closes every connection
                    // again and again does: nothing was sent, and the call goes
                    // on with the attempts it has left, on the same slot. Not
                    // past them: a proxy whose Redis is gone closes every
                    // connection it accepts, an outage to answer at once.
                    Err(e) if opening_closed(&e) && attempt < attempts => continue,
                    Err(e) => return Err(e),
                };
                if let Some(sent_on) = sent_on {
                    sent_on.record(&checkout.connection);
                }
                let sent = Deadline::now();
                let Ok(result) =
                    tokio::time::timeout_at(deadline, cmd.query_async(&mut checkout.connection))
                        .await
                else {
                    // A stalled connection is replaced; the command may have run,
                    // so it is never resent. Behind Sentinel, any timeout has the
                    // next call ask the sentinels for the master first.
                    if self.stalled(sent, deadline) {
                        node.discard(checkout, connections::Gone::Stalled);
                    } else {
                        node.suspect();
                    }
                    return Err(timeout);
                };
                if let Err(e) = &result
                    && breaks_connection(e)
                {
                    again = checkout.slot();
                    node.discard(checkout, connections::Gone::of(e));
                } else if result.as_ref().is_err_and(is_outage) {
                    node.suspect();
                }
                match result {
                    // A timed-out command may have run: never resend it.
                    Err(e) if e.is_timeout() => return Err(timeout),
                    // A dead connection at worst ran the command once more, which
                    // errs towards denying, never towards admitting.
                    Err(e) if breaks_connection(&e) && !e.is_connection_refusal() => {
                        match pause_within(attempt, attempts, deadline) {
                            Some(pause) => pause,
                            None => return Err(backend_error(e)),
                        }
                    }
                    other => return other.map_err(backend_error),
                }
            };
            wait = pause;
        }
    }

    /// Runs `cmd` on `connection` (not one of the pool's: see `unclaimed`),
    /// before `deadline`.
    async fn run_on(
        &self,
        connection: &Link,
        cmd: &redis::Cmd,
        deadline: Deadline,
    ) -> Result<Value, StoreError> {
        let mut connection = connection.clone();
        match tokio::time::timeout_at(deadline, cmd.query_async(&mut connection)).await {
            Err(_) => Err(StoreError::Timeout(self.call_timeout)),
            Ok(Err(e)) if e.is_timeout() => Err(StoreError::Timeout(self.call_timeout)),
            Ok(result) => result.map_err(backend_error),
        }
    }

    /// Runs a script by `EVALSHA`; if Redis lost it (restart, failover,
    /// `SCRIPT FLUSH`), by `EVAL`, which also puts it back in the cache; on
    /// the connection `via` says.
    ///
    /// Not `redis::Script::invoke_async` (which still gives the SHA-1 here):
    /// after `NOSCRIPT`, redis-rs 1.8 sends `SCRIPT LOAD` and then `EVALSHA`
    /// again, one round trip more than `EVAL`, and `SCRIPT LOAD` is not in the
    /// least-privileged ACL of `SECURITY.md`, so that user would fail every call
    /// after a restart (seen: with `invoke_async` in the ACL probe,
    /// `redis_acl::the_documented_acl_runs_every_operation_and_the_noscript_reload`
    /// fails with `NoPerm ... 'script|load'`). And `invoke_async` runs both
    /// attempts on one given connection, where a call here takes one
    /// deadline over both, a connection per attempt (retried when one
    /// breaks) and records it for permit releases (`run_until`). The hit path
    /// is the same single `EVALSHA` either way: no speed is claimed. Both
    /// attempts end by `deadline`.
    async fn eval<K: CallKeys + ?Sized>(
        &self,
        script: &redis::Script,
        source: &str,
        keys: &K,
        args: &[Arg<'_>],
        via: Via<'_>,
        deadline: Deadline,
    ) -> Result<Value, StoreError> {
        let evalsha = Invocation::new("EVALSHA", script.get_hash(), keys, args);
        match self.run_until(&evalsha, via, deadline).await {
            Err(StoreError::Backend(e))
                if e.downcast_ref::<RedisError>().is_some_and(is_noscript) =>
            {
                let eval = Invocation::new("EVAL", source, keys, args);
                self.run_until(&eval, via, deadline).await
            }
            other => other,
        }
    }
}

impl RedisStore {
    async fn check_one(
        self,
        key: String,
        policy: Policy,
        cost: u64,
        permit: PermitId,
        via: Via<'_>,
    ) -> Result<Decision, StoreError> {
        let p1 = parameters(policy.algorithm()).0;
        let (all, sent) = single_args(policy.algorithm(), cost, permit, self.fixed_now());
        let args = &all[..sent];
        let reply = self
            .inner
            .decide(policy.algorithm(), std::slice::from_ref(&key), args, via)
            .await
            .map_err(|e| policy_conflict(e, [(&key, &policy)]))?;
        single_from(&reply, p1, permit, cost)
    }

    async fn check_many(
        self,
        keys: Vec<String>,
        requests: Vec<(Policy, u64, PermitId)>,
        via: Via<'_>,
    ) -> Result<Vec<Decision>, StoreError> {
        self.check_group(&keys, &requests, via)
            .await
            .map(|(decisions, _)| decisions)
    }

    /// One multi-limit script. Returns the decisions and, per check, the
    /// state after and before its write (for refunds).
    async fn check_group(
        &self,
        keys: &[String],
        requests: &[(Policy, u64, PermitId)],
        via: Via<'_>,
    ) -> Result<(Vec<Decision>, Vec<StateChange>), StoreError> {
        let mut args = Vec::with_capacity(1 + requests.len() * 5);
        args.push(Arg::Int(self.fixed_now()));
        for (policy, cost, permit) in requests {
            let (p1, p2) = parameters(policy.algorithm());
            args.push(Arg::Str(policy.algorithm().kind()));
            args.push(Arg::Int(*cost));
            args.push(Arg::Int(p1));
            args.push(Arg::Int(p2));
            args.push(Arg::Owned(permit.to_string()));
        }
        let (script, source) = self.inner.scripts.get(Named::Multi);
        let reply = self
            .inner
            .eval(script, source, keys, &args, via, self.inner.deadline())
            .await
            .map_err(|e| policy_conflict(e, keys.iter().zip(requests.iter().map(|r| &r.0))))?;
        group_from(&reply, requests)
    }

    /// Several limits whose keys live in different Redis Cluster slots: one
    /// script per slot, in slot order; if a slot denies, what the earlier
    /// slots consumed is refunded (see `refund.lua`).
    ///
    /// The guarantee is weaker than one script: between a consumption and its
    /// refund, other requests see the consumption (and may be denied); a
    /// refund is skipped when another request changed the state meanwhile,
    /// and is lost if the process dies before sending it. Each of these errs
    /// towards denying: nothing is ever admitted beyond a limit.
    #[cfg(feature = "redis-cluster")]
    async fn check_across_slots(
        self,
        keys: Vec<String>,
        requests: Vec<(Policy, u64, PermitId)>,
    ) -> Result<Vec<Decision>, StoreError> {
        // Grouped by slot, in slot order, so that two requests over the same
        // slots take them in the same order (taken in opposite orders, each
        // could consume in one slot, be denied by the other's consumption in
        // the next, and both be refunded and denied where one would pass).
        let mut groups: Vec<(u16, Slot, Vec<usize>)> = Vec::new();
        for (i, k) in keys.iter().enumerate() {
            let slot = Slot::for_key(k);
            match groups.iter_mut().find(|(_, s, _)| *s == slot) {
                Some((_, _, indexes)) => indexes.push(i),
                None => groups.push((slot_number(slot).unwrap_or(u16::MAX), slot, vec![i])),
            }
        }
        groups.sort_by_key(|(number, _, _)| *number);
        let mut decisions: Vec<Option<Decision>> = vec![None; keys.len()];
        let mut committed: Vec<Committed> = Vec::new();
        let mut denied = false;
        for (_, _, indexes) in &groups {
            let group_keys: Vec<String> = indexes.iter().map(|&i| keys[i].clone()).collect();
            let group_requests: Vec<_> = indexes.iter().map(|&i| requests[i].clone()).collect();
            let result = self
                .check_group(&group_keys, &group_requests, Via::Pool)
                .await;
            let (group_decisions, states) = match result {
                Ok(answer) => answer,
                Err(error) => {
                    self.refund(&keys, &requests, &committed).await;
                    return Err(error);
                }
            };
            let allowed = crate::store::all_allowed(&group_decisions);
            for (&i, d) in indexes.iter().zip(group_decisions) {
                decisions[i] = Some(d);
            }
            if !allowed {
                denied = true;
                break;
            }
            committed.push((indexes.clone(), states));
        }
        if !denied {
            return Ok(decisions.into_iter().flatten().collect());
        }
        self.refund(&keys, &requests, &committed).await;
        // Report the other limits as peeks of their current state. The
        // request is denied whatever happens to the peeks: once one fails,
        // the others report what is known (see `unpeeked`), never an error
        // that a failure policy could turn into an admission.
        let mut peeking = true;
        for (i, slot) in decisions.iter_mut().enumerate() {
            if slot.as_ref().is_none_or(Decision::is_allowed) {
                let (policy, _, _) = &requests[i];
                let peek = if peeking {
                    self.clone()
                        .check_one(keys[i].clone(), policy.clone(), 0, PermitId(0), Via::Pool)
                        .await
                        .ok()
                } else {
                    None
                };
                peeking = peek.is_some();
                *slot = Some(peek.unwrap_or_else(|| unpeeked(policy, slot.as_ref())));
            }
        }
        Ok(decisions.into_iter().flatten().collect())
    }

    #[cfg(feature = "redis-cluster")]
    async fn refund(
        &self,
        keys: &[String],
        requests: &[(Policy, u64, PermitId)],
        committed: &[Committed],
    ) {
        let (script, source) = self.inner.scripts.get(Named::Refund);
        // One id for the refund, in every slot and every resend: applied once.
        let id = self.inner.permit_ids.fresh().to_string();
        for (indexes, states) in committed {
            let mut group_keys: Vec<String> = indexes.iter().map(|&i| keys[i].clone()).collect();
            if let Some(first) = group_keys.first() {
                group_keys.push(admin::applied_key(first));
            }
            let mut args = vec![Arg::Int(self.fixed_now()), Arg::Str(&id)];
            for (&i, (after, before)) in indexes.iter().zip(states) {
                let (policy, cost, permit) = &requests[i];
                args.push(Arg::Str(policy.algorithm().kind()));
                args.push(Arg::Int(*cost));
                args.push(Arg::Owned(permit.to_string()));
                args.push(Arg::Owned(after.clone()));
                args.push(Arg::Owned(before.clone()));
            }
            // A lost refund errs towards denying; nothing more can be done here.
            let _ = self
                .inner
                .eval(
                    script,
                    source,
                    group_keys.as_slice(),
                    &args,
                    Via::Pool,
                    self.inner.deadline(),
                )
                .await;
        }
    }

    /// One request (`keys`: its checks' state keys, all in one slot) through
    /// the coalescer (see `coalesce`); `unclaimed` guards its permits.
    async fn coalesced(
        self,
        keys: SmallVec<[String; 1]>,
        requests: SmallVec<[(Policy, u64, PermitId); 1]>,
        mut unclaimed: Option<Box<Unclaimed>>,
    ) -> Result<Decided, StoreError> {
        let Some(coalescer) = self.inner.coalescer.as_ref() else {
            return Err(StoreError::Backend("coalescing is off".into()));
        };
        let (lane, slot) = match &self.inner.backend {
            Backend::Node(_) => (Some(LaneId::Node), 0),
            // A lane per master, whose requests go as one pipeline (see
            // `masters`), but for those that hold permits: their releases
            // follow them on the cluster client's connection. A request of
            // a slot no master is known for goes as a call of its own.
            #[cfg(feature = "redis-cluster")]
            Backend::Cluster(cluster) => match unclaimed {
                Some(_) => (None, 0),
                None => match cluster.lane_of(keys.first().map_or("", String::as_str)) {
                    Some((master, slot)) => (Some(LaneId::Master(master)), slot),
                    None => (None, 0),
                },
            },
        };
        // On a cluster a request never goes alone through the cluster
        // client: a pipeline of one on the master's own connection costs
        // less, the client and Redis alike.
        let alone = match lane {
            Some(LaneId::Node) => self.go_alone(coalescer, LaneId::Node),
            _ => None,
        };
        let Some(lane) = lane.filter(|_| alone.is_none()) else {
            // Boxed: a call's state is large, and a request that waits for a
            // batch never needs it; unboxed, every request's future would be
            // that large, allocated and copied.
            let result = Box::pin(
                self.clone()
                    .decide_alone(keys, &requests, unclaimed.as_deref()),
            )
            .await;
            drop(alone);
            if let (Ok(decisions), Some(u)) = (&result, unclaimed.as_mut()) {
                u.hand_over(decisions);
            }
            return result;
        };
        let (reply, answer) = tokio::sync::oneshot::channel();
        // Kept to send the request again should its batch be dropped in
        // flight with the runtime that ran it (see below).
        let again = (keys.clone(), requests.clone());
        let weight = requests
            .iter()
            .map(|(policy, _, _)| coalesce::weight(policy))
            .fold(0, usize::saturating_add);
        let item = Item {
            keys,
            slot,
            requests,
            unclaimed,
            reply,
            weight,
        };
        self.submit(coalescer, lane, item);
        // The call timeout bounds the whole decision, its wait for a batch
        // included, as it bounds a wait for a pooled connection: a request
        // queued behind a call to a Redis that hangs is an outage when its
        // own call timeout ends, not after the call ahead's and then its
        // own (nor a third on a cluster that redirected its batch). Its
        // caller gone, the request is left out of a batch not sent yet, and
        // a permit it received is released. Before it goes, the caller
        // makes sure a call will take what still waits (see `kick`).
        let call_timeout = self.inner.call_timeout;
        let deadline = Deadline::now() + call_timeout;
        match tokio::time::timeout_at(deadline, answer).await {
            Err(_) => {
                self.kick(lane);
                Err(StoreError::Timeout(call_timeout))
            }
            // Its batch was dropped in flight with the runtime that ran its
            // task, another runtime than this caller's, which still runs
            // (or before it was sent, with no call left on its lane to send
            // it, see `Driver`): Redis may well be up, and no failure policy
            // may answer for it. Sent again on its own from here, within the
            // same timeout: if the batch ran, it counts twice, which errs
            // towards denying.
            Ok(Err(_)) => {
                let (keys, requests) = again;
                // Boxed: rare, and large; inline, every request's future
                // would be that large, allocated and copied.
                let decided = Box::pin(self.decide_again(keys, requests));
                match tokio::time::timeout_at(deadline, decided).await {
                    Ok(result) => result,
                    Err(_) => Err(StoreError::Timeout(call_timeout)),
                }
            }
            Ok(Ok((result, mut unclaimed))) => {
                if let (Ok(decisions), Some(u)) = (&result, unclaimed.as_mut()) {
                    u.hand_over(decisions);
                }
                result
            }
        }
    }

    /// A request decided by a call of its own (not in a batch), its permits
    /// sent on the connection `unclaimed` records.
    async fn decide_alone(
        self,
        keys: SmallVec<[String; 1]>,
        requests: &[(Policy, u64, PermitId)],
        unclaimed: Option<&Unclaimed>,
    ) -> Result<Decided, StoreError> {
        let via = unclaimed.map_or(Via::Pool, |u| Via::Record(u.sent_on()));
        if let [(policy, cost, permit)] = requests {
            let key = keys.into_iter().next().unwrap_or_default();
            self.check_one(key, policy.clone(), *cost, *permit, via)
                .await
                .map(|d| smallvec![d])
        } else {
            self.check_group(&keys, requests, via)
                .await
                .map(|(decisions, _)| SmallVec::from_vec(decisions))
        }
    }

    /// A request whose batch was dropped in flight, sent again on its own.
    /// Its permits get fresh ids, guarded anew: the guard dropped with the
    /// batch may still release the old ones, and must not release these.
    async fn decide_again(
        self,
        keys: SmallVec<[String; 1]>,
        mut requests: SmallVec<[(Policy, u64, PermitId); 1]>,
    ) -> Result<Decided, StoreError> {
        let mut permits = Vec::new();
        let mut longest: Option<&Policy> = None;
        for (key, (policy, cost, permit)) in keys.iter().zip(requests.iter_mut()) {
            if permit.0 == 0 {
                continue;
            }
            *permit = self.permit_for(policy);
            if *cost > 0 {
                permits.push((key.clone(), *permit));
            }
            if longest.is_none_or(|l| l.window() < policy.window()) {
                longest = Some(policy);
            }
        }
        let mut unclaimed = longest.map(|policy| Unclaimed::new(self.clone(), permits, policy));
        let result = self
            .clone()
            .decide_alone(keys, &requests, unclaimed.as_ref())
            .await;
        if let (Ok(decisions), Some(u)) = (&result, unclaimed.as_mut()) {
            u.hand_over(decisions);
        }
        result
    }

    async fn release_via(
        &self,
        key: &str,
        permit: PermitId,
        via: Via<'_>,
    ) -> Result<(), StoreError> {
        let (script, source) = self.inner.scripts.get(Named::Release);
        let permit_text = permit.to_string();
        let args = [Arg::Int(self.fixed_now()), Arg::Str(&permit_text)];
        self.inner
            .eval(
                script,
                source,
                &[key.to_owned()][..],
                &args,
                via,
                self.inner.deadline(),
            )
            .await
            .map(|_| ())
    }
}

impl RedisStore {
    /// Renews the lease of `permit` at `key` for `lease` µs (`renew.lua`):
    /// whether it was still held.
    async fn renew_one(
        self,
        key: String,
        permit: PermitId,
        lease: u64,
    ) -> Result<bool, StoreError> {
        let (script, source) = self.inner.scripts.get(Named::Renew);
        let permit_text = permit.to_string();
        let args = [
            Arg::Int(self.fixed_now()),
            Arg::Str(&permit_text),
            Arg::Int(lease),
        ];
        let reply = self
            .inner
            .eval(
                script,
                source,
                &[key][..],
                &args,
                Via::Pool,
                self.inner.deadline(),
            )
            .await?;
        match reply {
            Value::Int(held) => Ok(held == 1),
            other => Err(StoreError::Backend(
                format!("a renewal answered {other:?}, not 0 or 1").into(),
            )),
        }
    }
}

/// The arguments of one decision (`single.lua`), and how many of them are
/// sent: the cost and the algorithm's two parameters, then the fixed time
/// and the permit only when they say something (every argument costs Redis
/// work on every call).
fn single_args(
    algorithm: &Algorithm,
    cost: u64,
    permit: PermitId,
    fixed_now: u64,
) -> ([Arg<'static>; 5], usize) {
    let (p1, p2) = parameters(algorithm);
    let permit_arg = if permit.0 == 0 {
        Arg::Int(0)
    } else {
        Arg::Owned(permit.to_string())
    };
    let sent = if algorithm.algorithm_kind() == AlgorithmKind::Concurrency {
        5
    } else if fixed_now != 0 {
        4
    } else {
        3
    };
    let all = [
        Arg::Int(cost),
        Arg::Int(p1),
        Arg::Int(p2),
        Arg::Int(fixed_now),
        permit_arg,
    ];
    (all, sent)
}

/// The number of redis-rs's `slot` (0 to 16,383), which redis-rs 1.8 does
/// not give but feeds to a hasher, as its one `u16`; checked against
/// `Slot::new`, and `None` if redis-rs ever hashes it otherwise (then the
/// slots keep the order the checks name them in, and a cluster's requests
/// go without coalescing). Read so, not from its `Debug` text: every
/// request of a cluster asks it.
#[cfg(feature = "redis-cluster")]
fn slot_number(slot: Slot) -> Option<u16> {
    use std::hash::{Hash, Hasher};

    /// Keeps the one `u16` it is given; anything else spoils it.
    struct Number(Option<u16>, bool);

    impl Hasher for Number {
        fn write(&mut self, _: &[u8]) {
            self.1 = true;
        }

        fn write_u16(&mut self, n: u16) {
            self.1 |= self.0.replace(n).is_some();
        }

        fn finish(&self) -> u64 {
            0
        }
    }

    let mut number = Number(None, false);
    slot.hash(&mut number);
    match number {
        Number(Some(n), false) if Slot::new(n) == Some(slot) => Some(n),
        _ => None,
    }
}

/// The pause before the `n`th attempt past the ones made at once: 1 ms,
/// doubling up to 32 ms.
pub(super) fn pause_before(n: usize) -> Duration {
    Duration::from_millis(1 << n.min(5))
}

/// The pause before a call whose `attempt`th attempt met a broken
/// connection goes again: none for its first `attempts`, then
/// [`pause_before`]; `None` when `deadline` comes first.
fn pause_within(attempt: usize, attempts: usize, deadline: Deadline) -> Option<Duration> {
    if attempt < attempts {
        return Some(Duration::ZERO);
    }
    let pause = pause_before(attempt - attempts);
    (Deadline::now() + pause < deadline).then_some(pause)
}

/// The state of a key after and before a write (for refunds).
type StateChange = (String, String);

/// The checks of one slot that consumed, and their state changes.
#[cfg(feature = "redis-cluster")]
type Committed = (Vec<usize>, Vec<StateChange>);

impl Store for RedisStore {
    type CheckFuture = BoxFuture<Decision>;
    type CheckAllFuture = BoxFuture<Vec<Decision>>;
    type ReleaseFuture = BoxFuture<()>;
    type RenewFuture = BoxFuture<bool>;

    fn check(&self, key: &[u8], policy: &Policy, cost: u64) -> Self::CheckFuture {
        if let Err(e) = policy.check_cost(cost) {
            return Box::pin(std::future::ready(Err(e)));
        }
        let permit = self.permit_for(policy);
        let key = self.state_key(key, policy);
        let store = self.clone();
        let policy = policy.clone();
        if self.inner.coalescer.is_some() {
            // A permit the caller does not receive is released (see `unclaimed`).
            let unclaimed = (permit.0 != 0 && cost > 0).then(|| {
                Box::new(Unclaimed::new(
                    self.clone(),
                    vec![(key.clone(), permit)],
                    &policy,
                ))
            });
            return Box::pin(async move {
                let mut decisions = store
                    .coalesced(smallvec![key], smallvec![(policy, cost, permit)], unclaimed)
                    .await?;
                decisions
                    .pop()
                    .ok_or_else(|| StoreError::Backend("a batch answered no decision".into()))
            });
        }
        if permit.0 == 0 || cost == 0 {
            return Box::pin(store.check_one(key, policy, cost, permit, Via::Pool));
        }
        // A permit the caller does not receive is released (see `unclaimed`).
        let mut unclaimed = Unclaimed::new(self.clone(), vec![(key.clone(), permit)], &policy);
        Box::pin(async move {
            let result = store
                .check_one(key, policy, cost, permit, Via::Record(unclaimed.sent_on()))
                .await;
            if let Ok(decision) = &result {
                unclaimed.hand_over(std::slice::from_ref(decision));
            }
            result
        })
    }

    /// On a single node, every limit is decided in one script: all or nothing.
    ///
    /// On a Redis Cluster, one script can only touch keys of one hash slot.
    /// Checks whose keys share a slot (the same user key under several
    /// policies, such as per-second and per-day) are still all or nothing in
    /// one script. Checks spanning several slots are decided slot by slot, in
    /// slot order, and refunded when a later slot denies: a weaker guarantee
    /// (another request may see, and be denied by, a consumption that is
    /// about to be refunded), which still never admits beyond a limit.
    ///
    /// Two checks of one key under one policy (two rules of overlapping
    /// routes) are one check of their summed cost, and each gets its
    /// decision, as on [`MemoryStore`](crate::MemoryStore).
    fn check_all(&self, checks: &[Check<'_>]) -> Self::CheckAllFuture {
        let merged = match crate::store::Merged::checks(checks, |c| self.state_key(c.key, c.policy))
        {
            Ok(merged) => merged,
            Err(e) => return Box::pin(std::future::ready(Err(e))),
        };
        if !merged.is_distinct() {
            let call = self.check_all(&merged.items);
            let of = merged.of;
            return Box::pin(async move { crate::store::spread(&of, &call.await?) });
        }
        let mut keys = Vec::with_capacity(checks.len());
        let mut requests = Vec::with_capacity(checks.len());
        for check in checks {
            keys.push(self.state_key(check.key, check.policy));
            requests.push((
                check.policy.clone(),
                check.cost,
                self.permit_for(check.policy),
            ));
        }
        if keys.is_empty() {
            return Box::pin(std::future::ready(Ok(Vec::new())));
        }
        // The permits the caller does not receive are released (see `unclaimed`).
        let permits: Vec<(String, PermitId)> = keys
            .iter()
            .zip(&requests)
            .filter(|(_, (_, cost, permit))| permit.0 != 0 && *cost > 0)
            .map(|(key, (_, _, permit))| (key.clone(), *permit))
            .collect();
        let longest = requests
            .iter()
            .filter(|(_, _, permit)| permit.0 != 0)
            .map(|(policy, _, _)| policy)
            .max_by_key(|policy| policy.window());
        let mut unclaimed = longest.map(|policy| Unclaimed::new(self.clone(), permits, policy));
        let store = self.clone();
        #[cfg(feature = "redis-cluster")]
        if matches!(self.inner.backend, Backend::Cluster(_)) {
            let slot = |k: &String| Slot::for_key(k);
            if let Some(first) = keys.first().map(slot)
                && keys.iter().any(|k| slot(k) != first)
            {
                return Box::pin(async move {
                    let result = store.check_across_slots(keys, requests).await;
                    if let (Ok(decisions), Some(u)) = (&result, unclaimed.as_mut()) {
                        u.hand_over(decisions);
                    }
                    result
                });
            }
        }
        if self.inner.coalescer.is_some() {
            return Box::pin(async move {
                let (keys, requests) = (SmallVec::from_vec(keys), SmallVec::from_vec(requests));
                let decisions = store
                    .coalesced(keys, requests, unclaimed.map(Box::new))
                    .await?;
                Ok(decisions.into_vec())
            });
        }
        Box::pin(async move {
            let via = unclaimed
                .as_ref()
                .map_or(Via::Pool, |u| Via::Record(u.sent_on()));
            let result = store.check_many(keys, requests, via).await;
            if let (Ok(decisions), Some(u)) = (&result, unclaimed.as_mut()) {
                u.hand_over(decisions);
            }
            result
        })
    }

    /// Releases `permit` (`release.lua`, by its id: sent twice, it frees
    /// nothing more). One that fails as an outage returns the error, and is
    /// sent again in the background while the store is unreachable and the
    /// lease lasts (backing off up to a second), so that a permit released
    /// during a failover or a restart does not hold its slot for its whole
    /// lease once Redis is back.
    fn release(&self, key: &[u8], policy: &Policy, permit: PermitId) -> Self::ReleaseFuture {
        if !matches!(policy.algorithm(), Algorithm::Concurrency(_)) {
            return Box::pin(std::future::ready(Ok(())));
        }
        let key = self.state_key(key, policy);
        let (store, policy) = (self.clone(), policy.clone());
        Box::pin(async move {
            let released = store.release_via(&key, permit, Via::Pool).await;
            if released.as_ref().is_err_and(StoreError::is_outage) {
                // Left to its lease, the permit would hold its slot long
                // after the store is back (a failover, a restart): released
                // again in the background while the store is unreachable and
                // the lease lasts, as a permit no caller claimed. A release
                // that ran after all is found again harmlessly.
                drop(Unclaimed::new(store, vec![(key, permit)], &policy));
            }
            released
        })
    }

    /// An admin [`reward`](crate::AdminStore::reward) of `cost`, but the
    /// oldest units of a sliding log first: one script (nothing for a
    /// concurrency policy, whose permits are released). The call carries an
    /// id that Redis remembers beside the state (`<state key>:applied`, as
    /// long as the state lives), so the store's resend after a broken
    /// connection gives nothing more back; so do penalties and rewards.
    fn refund(&self, key: &[u8], policy: &Policy, cost: u64, _: &Decision) -> crate::RefundFuture {
        if cost == 0 || matches!(policy.algorithm(), Algorithm::Concurrency(_)) {
            return Box::pin(std::future::ready(Ok(())));
        }
        let refund = self.adjust_boxed(key, policy, crate::admin::Adjustment::Refund, cost);
        Box::pin(async move { refund.await.map(drop) })
    }

    /// One script (`settle.lua`) for every limit, on server time like every
    /// decision, all or nothing: every state is read before any is
    /// written. The settlement's id is remembered beside each state it
    /// changed (`<state key>:applied`, the newest 128 of the key, as long
    /// as the state lives, as refunds' are), so a resend, the store's after
    /// a broken connection or the caller's, changes nothing more while the
    /// id is among them. Every key written keeps a TTL.
    ///
    /// On a Redis Cluster one script touches one hash slot: limits on one
    /// user key (its hash tag) settle in one script, all or nothing; limits
    /// in several slots settle slot by slot in slot order, as
    /// [`check_all`](Store::check_all) decides them, each slot all or
    /// nothing and whatever the others answered. A call that failed in one
    /// slot returns that error and may have settled the others: send the
    /// same settlement again (the same id) to settle what failed, which
    /// changes nothing in the slots that had settled.
    fn settle(&self, id: SettlementId, settles: &[Settle<'_>]) -> SettleFuture {
        self.settle_boxed(id, settles)
    }

    fn supports_settlement(&self, policy: &Policy) -> bool {
        policy.supports_settlement()
    }

    /// One script (`renew.lua`), on server time like every decision: the
    /// entry of `permit` moves to its new expiry, its units kept, and the
    /// key keeps the TTL of its longest lease. On a cluster it goes to the
    /// master of the key's slot, as its check and release do.
    fn renew(&self, key: &[u8], policy: &Policy, permit: PermitId) -> Self::RenewFuture {
        let Algorithm::Concurrency(concurrency) = policy.algorithm() else {
            return Box::pin(std::future::ready(Ok(false)));
        };
        let key = self.state_key(key, policy);
        Box::pin(
            self.clone()
                .renew_one(key, permit, concurrency.lease_micros()),
        )
    }
}

#[cfg(all(test, feature = "redis-cluster"))]
mod slots {
    use super::*;

    /// The slot numbers redis-rs gives are Redis's (`CLUSTER KEYSLOT`).
    #[test]
    fn a_slot_reads_as_its_number() {
        assert_eq!(slot_number(Slot::for_key("123456789")), Some(12_739));
        assert_eq!(slot_number(Slot::for_key("rl:a:{user}")), Some(5_474));
        for n in [0, 1, 9_999, 16_383] {
            assert_eq!(slot_number(Slot::new(n).unwrap()), Some(n));
        }
    }
}

#[cfg(test)]
mod future_size {
    use super::*;

    /// The size of the future `f` returns, without calling it.
    fn future_size<A, B, C, D, E, G, Fut, F: FnOnce(A, B, C, D, E, G) -> Fut>(_: F) -> usize {
        std::mem::size_of::<Fut>()
    }

    /// Opening a connection (connect, handshake, ACL probe: a large state)
    /// is boxed apart, and so are loading the function library, the script
    /// path (`EVALSHA`, then `EVAL`) and a retry's pause: inline, each would
    /// make every decision's future that much larger (the pause's timer
    /// alone by about 300 bytes), though few decisions run them.
    #[test]
    fn a_decision_future_leaves_opening_a_connection_out() {
        let size = future_size(RedisStore::check_one);
        assert!(size <= 2_112, "check_one's future is {size} bytes");
    }
}
